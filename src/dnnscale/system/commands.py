"""The command-line options of a cluster that predict and optimize share: -c's help and the
network between GPU nodes (their names: system/gpu_cluster.py INTER_NODE_FLAGS). A command
module (it ranks with the CLI), so that system/ and plan/ stay free of typer."""

from __future__ import annotations

from typing import Any

import typer

from dnnscale.system.gpu_cluster import INTER_NODE_FLAGS

CLUSTER_HELP = ("CPU preset (adam-2014, local), GPU node preset as NAME:NODES (dgx-a100-80g:64; "
                "a bare NAME is 1 node), or cluster YAML (CPU, or GPU with node: and nodes:)")
INTERCONNECT_OPTION: Any = typer.Option(
    None, INTER_NODE_FLAGS["interconnect"],
    help="GPU: the link between nodes, e.g. ib-ndr, roce-400 (docs/gpu-systems.md)")
INTER_NODE_BANDWIDTH_OPTION: Any = typer.Option(
    None, INTER_NODE_FLAGS["bandwidth"],
    help="GPU: line rate of one NIC port between nodes, per direction, e.g. 100Gbit/s "
         "(replaces the preset's)")
INTER_NODE_LATENCY_OPTION: Any = typer.Option(
    None, INTER_NODE_FLAGS["latency"],
    help="GPU: latency per hop between nodes, e.g. 5us (replaces the preset's)")
NICS_OPTION: Any = typer.Option(None, INTER_NODE_FLAGS["nics_per_node"],
                                help="GPU: NIC ports per node (default: the node preset's)")
