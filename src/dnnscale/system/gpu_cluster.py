"""GPU cluster YAML and the command line's inter-node flags: a node preset, a node count and,
optionally, the network between nodes (docs/formats.md, "GPU cluster")::

    name: my-a100s              # optional (default NODE:NODES)
    node: dgx-a100-80g          # a GPU node preset (docs/gpu-systems.md)
    nodes: 16
    inter_node:                 # optional: the network between nodes, replacing the preset's
      interconnect: roce-200    # optional: a link of presets/interconnects.yaml
      bandwidth: 100Gbit/s      # optional: one NIC port's line rate, per direction
      latency: 5us              # optional: per hop (one step of a ring), as NCCL sees it
      nics_per_node: 4          # optional: NIC ports per node
    profile: a100.yaml          # optional: a `dnnscale calibrate --gpu` profile

Human units here, SI inside: `gpu_system` gets bytes/s and seconds. Each GPU's share of the
node's ports, at the profile's inter-node efficiency, is the model's inter-node tier, as for
the presets' own links (system/gpu.py `_tier`, the one place).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dnnscale.boundary import require_mapping
from dnnscale.errors import InputError, require_int, require_nonnegative, require_positive, \
    short_repr
from dnnscale.system.gpu import gpu_system, inter_node_link_names, node_preset_names, \
    parse_gpu_cluster
from dnnscale.system.gpu_profile import load_gpu_profile
from dnnscale.system.system import System
from dnnscale.units import parse_quantity
from dnnscale.yamlio import path_beside

GPU_CLUSTER_FIELDS = ("name", "node", "nodes", "inter_node", "profile")
INTER_NODE_FIELDS = ("interconnect", "bandwidth", "latency", "nics_per_node")
MAX_NICS_PER_NODE = 64
"""The most NIC ports a node may state (today's 8-GPU nodes have 8 to 16)."""
INTER_NODE_FLAGS = {"interconnect": "--interconnect", "bandwidth": "--inter-node-bandwidth",
                    "latency": "--inter-node-latency", "nics_per_node": "--nics-per-node"}
"""predict's and optimize's flags for the network between GPU nodes, by inter_node field."""


def is_gpu_cluster_data(data: Mapping[str, Any]) -> bool:
    """Whether a cluster mapping is a GPU cluster (names a node preset) rather than a CPU one."""
    return "node" in data


def inter_node_options(values: Mapping[str, Any], name: Callable[[str], str]) -> dict[str, Any]:
    """Validated inter_node fields (as typed, human units) -> gpu_system's arguments (SI);
    `name(field)` is what an error names (a YAML path or the flag typed)."""
    unknown = sorted(set(values) - set(INTER_NODE_FIELDS))
    if unknown:
        raise InputError(name(unknown[0]), f"unknown field (known: {', '.join(INTER_NODE_FIELDS)})")
    out: dict[str, Any] = {}
    if values.get("interconnect") is not None:
        key, links = values["interconnect"], inter_node_link_names()
        if not isinstance(key, str) or key not in links:
            raise InputError(name("interconnect"), f"must be one of {', '.join(links)}, got "
                             f"{short_repr(key)}")
        out["inter_node"] = key
    if values.get("bandwidth") is not None:
        field = name("bandwidth")
        out["inter_node_bandwidth_bytes_per_s"] = require_positive(
            field, parse_quantity(values["bandwidth"], "bandwidth", field))
    if values.get("latency") is not None:
        field = name("latency")
        out["inter_node_latency_s"] = require_nonnegative(
            field, parse_quantity(values["latency"], "time", field))
    if values.get("nics_per_node") is not None:
        out["nics_per_node"] = require_int(name("nics_per_node"), values["nics_per_node"],
                                           maximum=MAX_NICS_PER_NODE)
    return out


def gpu_cluster_from_dict(data: dict[str, Any], source: str = "",
                          overrides: Mapping[str, Any] | None = None) -> System:
    """A GPU cluster mapping (the module docstring) -> System; `overrides` (gpu_system's
    arguments, from the flags) replace the file's inter_node fields."""
    require_mapping(data, "cluster")
    unknown = sorted(set(data) - set(GPU_CLUSTER_FIELDS))
    if unknown:
        raise InputError(f"cluster.{unknown[0]}", f"unknown field of a GPU cluster (known: "
                         f"{', '.join(GPU_CLUSTER_FIELDS)})")
    node = data.get("node")
    if not isinstance(node, str) or node not in node_preset_names():
        raise InputError("cluster.node", f"must be a GPU node preset ({', '.join(node_preset_names())}), "
                         f"got {short_repr(node)}")
    if "nodes" not in data:
        raise InputError("cluster.nodes", "missing (how many nodes)")
    nodes = require_int("cluster.nodes", data["nodes"])
    inter = data.get("inter_node") or {}
    options = inter_node_options(require_mapping(inter, "cluster.inter_node"),
                                 lambda key: f"cluster.inter_node.{key}")
    options.update(overrides or {})
    name = data.get("name")
    if name is not None and (isinstance(name, bool) or not isinstance(name, (str, int, float))):
        raise InputError("cluster.name", f"must be text, got {short_repr(name)}")
    profile = None
    if data.get("profile") is not None:
        if not isinstance(data["profile"], str):
            raise InputError("cluster.profile", f"must be a path, got {short_repr(data['profile'])}")
        path = path_beside(data["profile"], source)
        if not path.is_file():
            raise InputError("cluster.profile", f"no GPU profile file {short_repr(str(path))} "
                             "(make one with `dnnscale calibrate --gpu -o FILE`)")
        profile = load_gpu_profile(path)
    return gpu_system(node, nodes, profile=profile,
                      name=None if name is None else str(name), **options)
