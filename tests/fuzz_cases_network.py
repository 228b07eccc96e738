"""Issue 27's bad-input cases for the network between GPU nodes; see tests/fuzz_cases.py for
`Case`.

gpu-network: a GPU cluster YAML (`node:`, `nodes:`, `inter_node:`) with one field broken at a
time, and predict's and optimize's inter-node flags (--interconnect, --inter-node-bandwidth,
--inter-node-latency, --nics-per-node) out of range, of the wrong unit, or on a CPU cluster.
Each names the field (`cluster.inter_node.bandwidth`) or the flag typed, exit 2, one line.

shared-host: a CPU cluster's `host_cores` (the cores its machines share as processes of one
host, as the `local` preset's ranks do) of the wrong type or out of range.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.fuzz_cases import Case, dump, nested

GPT = "gpt:layers=4,hidden=64,heads=4,seq=32,vocab=100"
GOOD: dict[str, Any] = {"name": "two-nodes", "node": "dgx-a100-80g", "nodes": 2,
                        "inter_node": {"bandwidth": "100Gbit/s", "latency": "5us"}}
"""A valid GPU cluster file that the cases break one field at a time."""

BAD_FIELDS: dict[str, tuple[str, Any, str]] = {
    # name: (dotted key, value, field named)
    "node-unknown": ("node", "dgx-a100-80q", "cluster.node"),
    "node-number": ("node", 8, "cluster.node"),
    "node-list": ("node", ["dgx-a100-80g"], "cluster.node"),
    "node-cpu-preset": ("node", "adam-2014", "cluster.node"),
    "nodes-zero": ("nodes", 0, "cluster.nodes"),
    "nodes-negative": ("nodes", -2, "cluster.nodes"),
    "nodes-float": ("nodes", 1.5, "cluster.nodes"),
    "nodes-text": ("nodes", "two", "cluster.nodes"),
    "nodes-bool": ("nodes", True, "cluster.nodes"),
    "nodes-huge": ("nodes", 10**30, "cluster.nodes"),
    "name-list": ("name", ["a"], "cluster.name"),
    "machines-field": ("machines", 16, "cluster.machines"),
    "network-field": ("network", {"bandwidth": "1Gbit/s"}, "cluster.network"),
    "inter-node-text": ("inter_node", "fast", "cluster.inter_node"),
    "inter-node-list": ("inter_node", [1], "cluster.inter_node"),
    "inter-node-unknown": ("inter_node.speed", 5, "cluster.inter_node.speed"),
    "bandwidth-zero": ("inter_node.bandwidth", "0Gbit/s", "cluster.inter_node.bandwidth"),
    "bandwidth-negative": ("inter_node.bandwidth", -5, "cluster.inter_node.bandwidth"),
    "bandwidth-unit": ("inter_node.bandwidth", "100us", "cluster.inter_node.bandwidth"),
    "bandwidth-text": ("inter_node.bandwidth", "fast", "cluster.inter_node.bandwidth"),
    "bandwidth-inf": ("inter_node.bandwidth", float("inf"), "cluster.inter_node.bandwidth"),
    "bandwidth-nan": ("inter_node.bandwidth", float("nan"), "cluster.inter_node.bandwidth"),
    "bandwidth-bool": ("inter_node.bandwidth", True, "cluster.inter_node.bandwidth"),
    "bandwidth-list": ("inter_node.bandwidth", [1], "cluster.inter_node.bandwidth"),
    "latency-negative": ("inter_node.latency", -1, "cluster.inter_node.latency"),
    "latency-unit": ("inter_node.latency", "5Gbit/s", "cluster.inter_node.latency"),
    "latency-inf": ("inter_node.latency", float("inf"), "cluster.inter_node.latency"),
    "latency-text": ("inter_node.latency", "soon", "cluster.inter_node.latency"),
    "nics-zero": ("inter_node.nics_per_node", 0, "cluster.inter_node.nics_per_node"),
    "nics-float": ("inter_node.nics_per_node", 2.5, "cluster.inter_node.nics_per_node"),
    "nics-huge": ("inter_node.nics_per_node", 65, "cluster.inter_node.nics_per_node"),
    "nics-text": ("inter_node.nics_per_node", "8", "cluster.inter_node.nics_per_node"),
    "interconnect-unknown": ("inter_node.interconnect", "ib-xdr",
                             "cluster.inter_node.interconnect"),
    "interconnect-intra": ("inter_node.interconnect", "nvlink3-nvswitch",
                           "cluster.inter_node.interconnect"),
    "interconnect-number": ("inter_node.interconnect", 400, "cluster.inter_node.interconnect"),
    "profile-missing": ("profile", "no-such-profile.yaml", "cluster.profile"),
    "profile-number": ("profile", 3, "cluster.profile"),
}

BAD_FLAGS: dict[str, tuple[str, str]] = {
    # name: (flag, value); the flag is named
    "bandwidth-zero": ("--inter-node-bandwidth", "0"),
    "bandwidth-negative": ("--inter-node-bandwidth", "-1Gbit/s"),
    "bandwidth-unit": ("--inter-node-bandwidth", "5us"),
    "bandwidth-text": ("--inter-node-bandwidth", "fast"),
    "bandwidth-empty": ("--inter-node-bandwidth", ""),
    "bandwidth-inf": ("--inter-node-bandwidth", "inf"),
    "latency-negative": ("--inter-node-latency", "-3us"),
    "latency-unit": ("--inter-node-latency", "3GB"),
    "latency-nan": ("--inter-node-latency", "nan"),
    "nics-zero": ("--nics-per-node", "0"),
    "nics-huge": ("--nics-per-node", "1000"),
    "nics-text": ("--nics-per-node", "eight"),
    "interconnect-unknown": ("--interconnect", "carrier-pigeon"),
    "interconnect-intra": ("--interconnect", "nvlink4-nvswitch"),
}

ON_CPU = {"--interconnect": "ib-ndr", "--inter-node-bandwidth": "100Gbit/s",
          "--inter-node-latency": "5us", "--nics-per-node": "4"}
"""Each flag, valid, on a CPU cluster: refused, naming the flag."""


def _commands(cluster: str) -> dict[str, tuple[str, ...]]:
    return {"predict": ("predict", "-w", GPT, "-c", cluster, "--json"),
            "optimize": ("optimize", "-w", GPT, "-c", cluster, "--global-batch", "8", "--json")}


def cluster_file_cases() -> Iterator[Case]:
    for name, (key, value, field) in BAD_FIELDS.items():
        files: dict[str, "str | bytes | None"] = {"c.yaml": dump(nested(key, value, GOOD))}
        for command, argv in _commands("{d}/c.yaml").items():
            yield Case(f"file-{name}-{command}", "gpu-network", argv, field, files)
    missing = {k: v for k, v in GOOD.items() if k != "nodes"}
    yield Case("file-nodes-missing", "gpu-network", _commands("{d}/c.yaml")["predict"],
               "cluster.nodes", {"c.yaml": dump(missing)})


def flag_cases() -> Iterator[Case]:
    for name, (flag, value) in BAD_FLAGS.items():
        for command, argv in _commands("dgx-a100-80g:2").items():
            yield Case(f"flag-{name}-{command}", "gpu-network", (*argv, flag, value), flag)
        yield Case(f"flag-{name}-over-file", "gpu-network",
                   (*_commands("{d}/c.yaml")["predict"], flag, value), flag,
                   {"c.yaml": dump(GOOD)})
    for flag, value in ON_CPU.items():
        for cluster in ("adam-2014", "local"):
            yield Case(f"cpu-{cluster}{flag}", "gpu-network",
                       ("predict", "-w", "adam-mnist", "-c", cluster, "-P", "1", "-R", "1",
                        "-S", "1", flag, value, "--json"), flag)
        yield Case(f"cpu-optimize{flag}", "gpu-network",
                   ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "4", flag, value,
                    "--json"), flag)
    yield Case("cpu-file-flag", "gpu-network",
               ("predict", "-w", "adam-mnist", "-c", "{d}/c.yaml", "-P", "1", "-R", "1", "-S",
                "1", "--inter-node-bandwidth", "1Gbit/s", "--json"), "--inter-node-bandwidth",
               {"c.yaml": dump({"machines": 4, "machine": {
                   "cores": 4, "memory": "8GB", "memory_bandwidth": "10GB/s",
                   "flops_per_core": "5GFLOP/s", "update_time_per_param": "1ns"},
                   "network": {"bandwidth": "1Gbit/s"}})})
    yield Case("unknown-cluster-with-flag", "gpu-network",
               ("predict", "-w", GPT, "-c", "no-such-cluster", "--inter-node-latency", "5us",
                "--json"), "cluster")
    yield Case("absurd-latency", "gpu-network",
               ("predict", "-w", GPT, "-c", "dgx-a100-80g:2", "--tp", "4", "--dp", "4",
                "--global-batch", "8", "--inter-node-latency", "1e300s", "--json"), "predict")


BAD_HOST_CORES: dict[str, Any] = {"zero": 0, "negative": -2, "text": "two", "bool": True,
                                  "list": [2], "inf": float("inf"), "nan": float("nan"),
                                  "mapping": {"cores": 2}}


def host_cores_cases() -> Iterator[Case]:
    from tests.fuzz_cases import CLUSTER

    for name, value in BAD_HOST_CORES.items():
        files: dict[str, "str | bytes | None"] = {"c.yaml": dump({**CLUSTER, "host_cores": value})}
        yield Case(f"host-cores-{name}", "shared-host",
                   ("predict", "-w", "adam-mnist", "-c", "{d}/c.yaml", "-P", "1", "-R", "1",
                    "-S", "1", "--json"), "cluster.host_cores", files)
        yield Case(f"host-cores-{name}-optimize", "shared-host",
                   ("optimize", "-w", "adam-mnist", "-c", "{d}/c.yaml", "--json"),
                   "cluster.host_cores", files)


def cases() -> Iterator[Case]:
    yield from cluster_file_cases()
    yield from flag_cases()
    yield from host_cores_cases()
