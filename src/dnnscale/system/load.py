"""Cluster YAML (human units) -> `System` (SI), with errors that name the field.

Format (see docs/formats.md)::

    name: adam-2014
    machines: 120
    calibrated: false
    machine:
      cores: 16
      memory: 96GB
      memory_bandwidth: 40GB/s
      flops_per_core: 8GFLOP/s        # or {default: ..., linear: ..., conv2d.forward: [[size, rate], ...]}
      update_time_per_param: 0.5ns
    ps_machine: {...}                 # optional; missing fields come from `machine`
    network: {bandwidth: 10Gbit/s, latency: 50us}
    ps_network: {...}                 # optional
    ps_machines: 2                    # optional: hosts dedicated to PS shards (default 0: shared)
    overlap_gamma: inf                # optional (a profile's measured overlap replaces it)
    straggler_spread: 0               # optional: std dev of ln(step time) across replicas
    profile: my-machine.yaml          # optional: a `dnnscale calibrate` hardware profile
    host_cores: 2                     # optional: the machines are processes sharing a host of 2 cores

A `profile` (a path, relative to the cluster file) replaces the machines' compute rates, memory
bandwidth and update cost, and the network's bandwidth and latency when it measured one, by the
calibrated values; those fields may then be left out, and its measured overlap γ and straggler
spread (when it has them) replace `overlap_gamma` and `straggler_spread`. The cluster is marked
calibrated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dnnscale.boundary import require_bool
from dnnscale.errors import (InputError, require_int, require_nonnegative, require_positive,
                             short_repr)
from dnnscale.system.curve import RateCurve
from dnnscale.system.device import PHASES, Device
from dnnscale.system.gpu import gpu_system, node_preset_names, parse_gpu_cluster
from dnnscale.system.gpu_cluster import (INTER_NODE_FLAGS, gpu_cluster_from_dict,
                                         inter_node_options, is_gpu_cluster_data)
from dnnscale.system.profile import (HardwareProfile, load_profile, machine_overrides,
                                     network_overrides, with_profile_curves)
from dnnscale.system.system import ProfileInfo, System
from dnnscale.system.topology import LinkTier
from dnnscale.units import parse_quantity
from dnnscale.yamlio import is_yaml_source, load_yaml_file, path_beside

_MACHINE_FIELDS = {"cores", "memory", "memory_bandwidth", "flops_per_core", "update_time_per_param"}
_NETWORK_FIELDS = {"bandwidth", "latency"}
_TOP_FIELDS = {"name", "machines", "calibrated", "machine", "ps_machine", "network", "ps_network",
               "ps_machines", "overlap_gamma", "straggler_spread", "description", "profile",
               "host_cores"}
_RATE_KINDS = {"default", "conv2d", "linear", "generic"}
MAX_STRAGGLER_SPREAD = 0.5
"""The largest straggler spread a cluster may state (replicas a factor e^0.5 ≈ 1.6 apart per
standard deviation): up to it an extra replica never lengthens the predicted epoch, which the
exact search relies on (model/compose.py); a measured spread above it is capped."""
MAX_MACHINES = 1_000_000
"""The largest cluster (and optimizer budget): ten times the largest training clusters built so
far; the optimizer answers within seconds there."""


PRESET_FOLDERS = ("cpu",)
"""Folders of dnnscale/system/presets/ that hold cluster presets, one YAML file each."""


def _preset_files() -> dict[str, Any]:
    root = resources.files("dnnscale.system") / "presets"
    files = {}
    for folder in PRESET_FOLDERS:
        for item in (root / folder).iterdir():
            if item.name.endswith(".yaml"):
                files[item.name[:-5]] = item
    return files


def preset_names() -> list[str]:
    return sorted(_preset_files())


def _check_fields(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(allowed))})")


def _positive(data: dict[str, Any], key: str, dimension: str, where: str) -> float:
    if key not in data:
        raise InputError(f"{where}.{key}", "missing")
    value = parse_quantity(data[key], dimension, f"{where}.{key}")
    return require_positive(f"{where}.{key}", value)


def _rate_curve(value: Any, where: str) -> RateCurve:
    if isinstance(value, list):
        points = []
        for i, point in enumerate(value):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise InputError(f"{where}[{i}]", "each curve point is [size, rate], e.g. "
                                 "[1MFLOP, 5GFLOP/s]")
            size = require_positive(f"{where}[{i}]", parse_quantity(point[0], "flop", f"{where}[{i}]"))
            rate = require_positive(f"{where}[{i}]", parse_quantity(point[1], "flops", f"{where}[{i}]"))
            points.append((size, rate))
        if not points:
            raise InputError(where, "a curve needs at least one [size, rate] point")
        points.sort()
        if any(b[0] == a[0] for a, b in zip(points, points[1:])):
            raise InputError(where, "curve sizes must be distinct")
        return RateCurve(tuple(p[0] for p in points), tuple(p[1] for p in points))
    return RateCurve.constant(require_positive(where, parse_quantity(value, "flops", where)))


def _rates(value: Any, where: str) -> dict[str, RateCurve]:
    if not isinstance(value, dict):
        return {"default": _rate_curve(value, where)}
    curves: dict[str, RateCurve] = {}
    for key, item in value.items():
        kind, _, phase = str(key).partition(".")
        if kind not in _RATE_KINDS or (phase and phase not in PHASES):
            raise InputError(f"{where}.{key}", f"unknown rate key (use default, conv2d, linear or "
                             f"generic, optionally .{'/.'.join(PHASES)})")
        curves[str(key)] = _rate_curve(item, f"{where}.{key}")
    if "default" not in curves:
        raise InputError(f"{where}.default", "missing (the rate for kinds not listed)")
    return curves


def machine_from_dict(data: Any, where: str, base: dict[str, Any] | None = None) -> Device:
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping, got {short_repr(data)}")
    _check_fields(data, _MACHINE_FIELDS, where)
    merged = {**(base or {}), **data}
    return Device(
        cores=_cores(merged, where),
        memory_bytes=_positive(merged, "memory", "bytes", where),
        memory_bandwidth_bytes_per_s=_positive(merged, "memory_bandwidth", "bandwidth", where),
        flops_per_s_per_core=_rates(_required(merged, "flops_per_core", where),
                                    f"{where}.flops_per_core"),
        update_s_per_param=_positive(merged, "update_time_per_param", "time", where),
    )


def _cores(merged: dict[str, Any], where: str) -> float:
    if "cores" not in merged:
        raise InputError(f"{where}.cores", "missing")
    value = merged["cores"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}.cores", f"must be a number of cores (e.g. 16 or 0.5), got {short_repr(value)}")
    return float(require_positive(f"{where}.cores", value))


def _required(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise InputError(f"{where}.{key}", "missing")
    return data[key]


def network_from_dict(data: Any, where: str, base: dict[str, Any] | None = None) -> LinkTier:
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping, got {short_repr(data)}")
    _check_fields(data, _NETWORK_FIELDS, where)
    merged = {**(base or {}), **data}
    latency = parse_quantity(merged.get("latency", 0), "time", f"{where}.latency")
    if latency < 0 or not math.isfinite(latency):
        raise InputError(f"{where}.latency", f"must be >= 0, got {short_repr(merged.get('latency'))}")
    return LinkTier(bandwidth_bytes_per_s=_positive(merged, "bandwidth", "bandwidth", where),
                    latency_s=latency)


def _profiled(data: dict[str, Any], source: str) -> tuple[dict[str, Any], HardwareProfile | None]:
    """`data` with the referenced profile's measurements merged in (profile wins), and the
    profile (None without a `profile` field)."""
    if not data.get("profile"):
        return data, None
    path = path_beside(data["profile"], source)
    if not path.is_file():
        raise InputError("cluster.profile", f"no profile file {short_repr(str(path))} (make one with "
                         f"`dnnscale calibrate --local -o {path.name}`)")
    profile = load_profile(path)
    merged = dict(data)
    for key in ("machine", "ps_machine"):
        part = data.get(key)
        if isinstance(part, dict):
            cores = part.get("cores", data["machine"].get("cores") if isinstance(
                data.get("machine"), dict) else None)
            if isinstance(cores, (int, float)) and not isinstance(cores, bool) and cores > 0:
                merged[key] = {**part, **machine_overrides(profile, float(cores))}
    if isinstance(data.get("network"), dict):
        merged["network"] = {**data["network"], **network_overrides(profile)}
    if profile.overlap is not None:
        merged["overlap_gamma"] = profile.overlap.gamma
    if profile.stragglers is not None:
        merged["straggler_spread"] = min(profile.stragglers.spread, MAX_STRAGGLER_SPREAD)
    merged["calibrated"] = True
    return merged, profile


def system_from_dict(data: dict[str, Any], source: str = "") -> System:
    """A cluster mapping -> System: a GPU cluster (`node:` a node preset, system/gpu_cluster.py)
    or a CPU cluster (the module docstring)."""
    if is_gpu_cluster_data(data):
        return gpu_cluster_from_dict(data, source)
    _check_fields(data, _TOP_FIELDS, "cluster")
    for key in ("machines", "machine", "network"):
        if key not in data:
            raise InputError(f"cluster.{key}", "missing")
    data, profile = _profiled(data, source)
    machine_data = data["machine"]
    machine = machine_from_dict(machine_data, "cluster.machine")
    ps_machine = (machine_from_dict(data["ps_machine"], "cluster.ps_machine", machine_data)
                  if data.get("ps_machine") else None)
    if profile is not None:
        machine = with_profile_curves(machine, profile)
        ps_machine = with_profile_curves(ps_machine, profile) if ps_machine else None
    network = network_from_dict(data["network"], "cluster.network")
    if profile is not None and profile.allreduce:
        # Measured all-reduce per group size, as α-β fits the collective registry reads.
        network = replace(network, allreduce_fits=tuple(
            (link.peers, link.bandwidth_bytes_per_s, link.latency_s) for link in profile.allreduce))
    ps_network = (network_from_dict(data["ps_network"], "cluster.ps_network", data["network"])
                  if data.get("ps_network") else None)
    gamma = data.get("overlap_gamma", "inf")
    try:
        gamma = float(gamma)
    except (TypeError, ValueError, OverflowError):
        raise InputError("cluster.overlap_gamma", f"must be a number >= 1 or inf, got "
                         f"{short_repr(gamma)}") from None
    if not gamma >= 1:
        raise InputError("cluster.overlap_gamma", f"must be >= 1 (1 = no overlap), got "
                         f"{short_repr(gamma)}")
    spread = _straggler_spread(data.get("straggler_spread", 0.0))
    machines = require_int("cluster.machines", data["machines"], maximum=MAX_MACHINES)
    ps_machines = require_int("cluster.ps_machines", data.get("ps_machines", 0), minimum=0)
    if ps_machines >= machines:
        raise InputError("cluster.ps_machines", f"must leave machines for workers: {ps_machines} "
                         f"of {machines} machines")
    info = (ProfileInfo(str(data["profile"]), profile.date, dict(profile.machine))
            if profile is not None else None)
    return System(name=_text(data, "name", "cluster"), machines=machines, machine=machine,
                  network=network, ps_machine=ps_machine, ps_network=ps_network,
                  ps_machines=ps_machines, overlap_gamma=gamma, straggler_spread=spread,
                  calibrated=require_bool("cluster.calibrated", data.get("calibrated", False)),
                  description=_text(data, "description"), profile_source=source,
                  profile=info, host_cores=_host_cores(data.get("host_cores")))


def _host_cores(value: Any) -> float | None:
    """cluster.host_cores: None, or a number of cores > 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError("cluster.host_cores", f"must be a number of cores (e.g. 2), got "
                         f"{short_repr(value)}")
    return float(require_positive("cluster.host_cores", value))


def _text(data: dict[str, Any], key: str, default: str = "") -> str:
    """cluster.<key>: text (a YAML number is taken as its digits; a list or mapping is not)."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InputError(f"cluster.{key}", f"must be text, got {short_repr(value)}")
    return str(value)


def _straggler_spread(value: Any) -> float:
    """cluster.straggler_spread: a number in [0, MAX_STRAGGLER_SPREAD]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError("cluster.straggler_spread", f"must be a number, got {short_repr(value)}")
    if not 0 <= value <= MAX_STRAGGLER_SPREAD:
        raise InputError("cluster.straggler_spread", f"must be in [0, {MAX_STRAGGLER_SPREAD}] "
                         f"(the std dev of ln step time across replicas), got {short_repr(value)}")
    return float(value)


def profile_machine(profile: HardwareProfile, cores: float = 1.0,
                    memory_bytes: float = 2**34) -> Device:
    """A Device of `cores` cores whose rates are all the profile's."""
    data = {"cores": cores, "memory": memory_bytes, **machine_overrides(profile, cores)}
    return with_profile_curves(machine_from_dict(data, "profile"), profile)


def check_system(system: System) -> System:
    """Re-validate a System object (e.g. one a Python caller built) by the YAML rules:
    InputError names the field. Returns the system."""
    machines = require_int("cluster.machines", system.machines, maximum=MAX_MACHINES)
    ps_machines = require_int("cluster.ps_machines", system.ps_machines, minimum=0)
    if ps_machines >= machines:
        raise InputError("cluster.ps_machines", f"must leave machines for workers: {ps_machines} "
                         f"of {machines} machines")
    for where, machine in (("cluster.machine", system.machine),
                           ("cluster.ps_machine", system.ps_machine)):
        if machine is None and where == "cluster.ps_machine":
            continue
        if not isinstance(machine, Device):
            raise InputError(where, f"must be a Device, got {type(machine).__name__}")
        for name in ("cores", "memory_bytes", "memory_bandwidth_bytes_per_s"):
            require_positive(f"{where}.{name}", getattr(machine, name))
        if machine.is_accelerator:  # the optimizer step is priced from HBM traffic instead
            require_nonnegative(f"{where}.update_time_per_param", machine.update_s_per_param)
        else:
            require_positive(f"{where}.update_time_per_param", machine.update_s_per_param)
        if "default" not in machine.flops_per_s_per_core:
            raise InputError(f"{where}.flops_per_core.default", "missing")
        _check_curves(machine.flops_per_s_per_core, f"{where}.flops_per_core")
        if machine.is_accelerator:
            _check_accelerator(machine, where)
    for where, network in (("cluster.network", system.network),
                           ("cluster.ps_network", system.ps_network),
                           ("cluster.intra_node", system.intra_node)):
        if network is None and where != "cluster.network":
            continue
        if not isinstance(network, LinkTier):
            raise InputError(where, f"must be a LinkTier, got {type(network).__name__}")
        require_positive(f"{where}.bandwidth", network.bandwidth_bytes_per_s)
        require_nonnegative(f"{where}.latency", network.latency_s)
    require_int("cluster.devices_per_node", system.devices_per_node)
    require_nonnegative("cluster.collective_call_s", system.collective_call_s)
    if system.price_per_device_hour is not None:
        require_positive("cluster.price_per_device_hour", system.price_per_device_hour)
    if system.host_cores is not None:
        _host_cores(system.host_cores)
    for name in ("calibrated", "ps_pull_convoy"):
        require_bool(f"cluster.{name}", getattr(system, name))
    for name in ("name", "description", "collective_library"):
        if not isinstance(getattr(system, name), str):
            raise InputError(f"cluster.{name}", f"must be text, got "
                             f"{short_repr(getattr(system, name))}")
    gamma = system.overlap_gamma
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not gamma >= 1:
        raise InputError("cluster.overlap_gamma", f"must be a number >= 1 or inf, got "
                         f"{short_repr(gamma)}")
    _straggler_spread(system.straggler_spread)
    return system


def _check_curves(curves: object, where: str) -> None:
    """A mapping of names to RateCurves whose rates are finite and > 0."""
    if not isinstance(curves, dict):
        raise InputError(where, f"must be a mapping of rate curves, got {short_repr(curves)}")
    for key, curve in curves.items():
        _check_curve(curve, f"{where}.{key}")


def _check_curve(curve: object, where: str) -> None:
    if not isinstance(curve, RateCurve):
        raise InputError(where, f"must be a RateCurve, got {short_repr(curve)}")
    for rate in curve.rates:
        require_positive(where, rate)


def _check_accelerator(machine: Device, where: str) -> None:
    """An accelerator's peaks (FLOP/s per precision, finite and > 0), achieved efficiencies
    (fractions of peak in (0, 1]) and launch costs (seconds >= 0)."""
    peaks = machine.peak_flops_per_s
    if not isinstance(peaks, dict) or not peaks:
        raise InputError(f"{where}.peak_flops", "an accelerator needs its peak FLOP/s per "
                         "precision")
    for precision, peak in peaks.items():
        require_positive(f"{where}.peak_flops.{precision}", peak)
    curves = dict(machine.efficiency)
    if machine.memory_efficiency is not None:
        curves["memory"] = machine.memory_efficiency
    _check_curves(curves, f"{where}.efficiency")
    for key, curve in curves.items():
        if any(rate > 1 for rate in curve.rates):
            raise InputError(f"{where}.efficiency.{key}", f"a fraction of peak is at most 1, "
                             f"got {max(curve.rates)!r}")
    for name in ("launch_s", "launch_contention", "pipeline_step_s"):
        require_nonnegative(f"{where}.{name}", getattr(machine, name))


def load_system(source: "str | Path | System") -> System:
    """A preset name, a YAML file, or a System (re-validated)."""
    if isinstance(source, System):
        return check_system(source)
    if not isinstance(source, (str, Path)):
        raise InputError("cluster", f"must be a preset name, a YAML path or a System, got "
                         f"{type(source).__name__}")
    path = Path(source)
    if is_yaml_source(source, "cluster"):
        return system_from_dict(load_yaml_file(path, "cluster"), str(path))
    name = str(source)
    gpu = parse_gpu_cluster(name)
    if gpu is not None:
        return gpu_system(*gpu)
    if name not in preset_names():
        raise InputError("cluster", f"unknown cluster {short_repr(name)}: not a preset "
                         f"({', '.join(preset_names())}), a GPU node preset as NAME:NODES "
                         f"({', '.join(node_preset_names())}) nor an existing YAML file")
    text = _preset_files()[name].read_text()
    return system_from_dict(yaml.safe_load(text), f"preset:{name}")


def load_cluster(source: str, inter_node: Mapping[str, Any]) -> System:
    """The cluster `-c` names, with the inter-node flags given (INTER_NODE_FLAGS' fields, as
    typed) replacing its network between nodes; they apply to GPU clusters only."""
    given = {key: value for key, value in inter_node.items() if value is not None}
    if not given:
        return load_system(source)
    options = inter_node_options(given, INTER_NODE_FLAGS.__getitem__)
    if is_yaml_source(source, "cluster"):
        data = load_yaml_file(Path(source), "cluster")
        if is_gpu_cluster_data(data):
            return gpu_cluster_from_dict(data, source, options)
    else:
        gpu = parse_gpu_cluster(source)
        if gpu is not None:
            return gpu_system(*gpu, **options)
    load_system(source)  # a name that is no cluster is named as such first
    raise InputError(INTER_NODE_FLAGS[next(iter(given))],
                     "applies to GPU clusters (NAME:NODES or a cluster YAML with node:); a CPU "
                     "cluster's network is its YAML's network:")
