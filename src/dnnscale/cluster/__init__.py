"""Clusters: where training runs (machines, compute-rate curves, network), presets, YAML."""

from dnnscale.cluster.curve import RateCurve
from dnnscale.cluster.load import cluster_from_dict, load_cluster, preset_names
from dnnscale.cluster.spec import Cluster, MachineSpec, NetworkSpec

__all__ = ["Cluster", "MachineSpec", "NetworkSpec", "RateCurve", "cluster_from_dict",
           "load_cluster", "preset_names"]
