"""Systems: where training runs — devices, nodes, link tiers, presets, YAML, calibrated profiles."""

from dnnscale.system.curve import RateCurve
from dnnscale.system.device import Device
from dnnscale.system.load import load_system, preset_names, system_from_dict
from dnnscale.system.system import System
from dnnscale.system.topology import GroupSpan, LinkTier, Topology, group_span

__all__ = ["Device", "GroupSpan", "LinkTier", "RateCurve", "System", "Topology", "group_span",
           "load_system", "preset_names", "system_from_dict"]
