"""The hardware profile: what `dnnscale calibrate` measured, as a YAML file a cluster refers to.

Written by machines, so plain SI numbers (FLOP, FLOP/s, bytes, bytes/s, seconds)::

    format: dnnscale-profile/1
    machine: {hostname: ..., cpu_model: ..., cores: 2}
    date: 2026-11-30T05:00:00+00:00
    torch_version: 2.13.0
    threads: 1                        # every rate is per core: one compute thread
    compute:
      flops_per_s_per_core: {conv2d.forward: [[flop, flop/s], ...], linear.weight_grad: ...}
      intensity_factors: {conv2d.forward: [[flop/byte, factor], ...], ...}
      bytes_per_s_per_core: {relu.forward: [[bytes, bytes/s], ...], maxpool2d.input_grad: ...}
      allocation_bytes_per_s_per_core: [[bytes, bytes/s], ...]
    memory: {bandwidth_bytes_per_s: ..., update_s_per_param: ..., update_s_per_message: ...}
    network: {bandwidth_bytes_per_s: ..., latency_s: ..., points: [[bytes, s], ...]}   # optional
    allreduce: [{peers: 2, bandwidth_bytes_per_s: ..., latency_s: ..., points: [...]}]  # optional
    overlap: {gamma: ..., points: [[compute_s, exchange_s, both_s], ...]}              # optional
    stragglers: {spread: ..., processes: 4, steps: 40, mean_step_s: [...]}            # optional
    ps_network: {bandwidth_bytes_per_s: ..., latency_s: ..., points: [...]}  # optional: to a PS host
    ps_sync_pull: [{peers: 3, shards: 3, bandwidth_bytes_per_s: ..., latency_s: ..., points: [...]}]
                                      # optional: held pulls answered in turn (testbed)
    collective_call_wait: [[peers, seconds], ...]   # optional: a collective's wait under a quota
    partition_exchange: [{operation: allgather, peers: 3, bandwidth_bytes_per_s: ...,
                          latency_s: ..., points: [[bytes, s], ...]}, ...]
                                      # optional: the runtime's layer exchanges (testbed)
    collective_cpu: [{operation: allgather, cpu_s: ..., cpu_s_per_byte: ...}, ...]
                                      # optional: CPU per partition collective (testbed)
    calibration: {...}                # how it was measured (grid, timings); informative

No torch here: the predictor loads profiles. `load_profile` raises InputError naming the first
missing or malformed field (``profile.compute.flops_per_s_per_core.linear.forward: missing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dnnscale.system.curve import RateCurve
from dnnscale.errors import InputError
from dnnscale.system.device import Device

FORMAT = "dnnscale-profile/1"
REQUIRED_FLOP_CURVES = ("conv2d.forward", "conv2d.input_grad", "conv2d.weight_grad",
                        "linear.forward", "linear.input_grad", "linear.weight_grad")


@dataclass(frozen=True)
class LinkFit:
    """An α-β fit of measured transfers: t(bytes) = latency_s + bytes / bandwidth_bytes_per_s."""

    bandwidth_bytes_per_s: float
    latency_s: float
    points: tuple[tuple[float, float], ...] = ()
    peers: int = 2
    shards: int = 0
    """ps_sync_pull fits: the shards that served the `peers` workers."""
    operation: str = ""
    """partition_exchange fits: the registry operation (model/collectives.py) whose transfer
    the fit's (B, α) prices: 'allgather' (a layer's forward), 'reduce_scatter' (backward) or
    'halo' (a stripe's exchange with `peers` neighbours, forward and backward)."""


@dataclass(frozen=True)
class HardwareProfile:
    """Everything calibration measured on one machine (rates per core, one thread)."""

    machine: dict[str, Any]
    date: str
    torch_version: str
    flops_per_s_per_core: dict[str, RateCurve]
    intensity_factors: dict[str, RateCurve]
    bytes_per_s_per_core: dict[str, RateCurve]
    allocation_bytes_per_s_per_core: RateCurve | None
    memory_bandwidth_bytes_per_s: float
    update_s_per_param: float
    update_s_per_message: float
    network: LinkFit | None = None
    allreduce: tuple[LinkFit, ...] = ()
    threads: int = 1
    calibration: dict[str, Any] = field(default_factory=dict)
    overlap: OverlapFit | None = None
    stragglers: StragglerSpread | None = None
    ps_network: LinkFit | None = None
    """Point-to-point between a worker host and a PS host (a testbed with PS hosts)."""
    ps_sync_pull: tuple[LinkFit, ...] = ()
    """A synchronous PS's held pulls answered in turn, per number of workers (`peers`), as the
    registry's ps_sync_pull α-β (model/collectives.held_pull_convoy)."""
    collective_call_wait: tuple[tuple[int, float], ...] = ()
    """(group size, seconds): what a collective costs beyond its own time when the members
    compute under a CPU quota right before it (calibrate/netbench.py coupled)."""
    partition_exchange: tuple[LinkFit, ...] = ()
    """The exchanges of a feature-split layer as the runtime makes them (runtime/network.
    GatherSplit: padding, gloo's all-gather or reduce-scatter, concatenation), per operation
    and group size, as the registry's α-β of that operation (calibrate/network.
    measure_partition_exchange)."""
    collective_cpu: tuple[tuple[str, float, float], ...] = ()
    """(operation, CPU seconds, CPU seconds per byte) one rank spends per partition collective
    (calibrate/network.measure_collective_cpu): the model prices a quota's wait from it."""


@dataclass(frozen=True)
class OverlapFit:
    """The γ of the γ-norm fitted to measured overlaps (calibrate/overlap.py): each point is
    (compute alone, exchange alone, both with the exchange in the background), seconds."""

    gamma: float
    points: tuple[tuple[float, float, float], ...] = ()


@dataclass(frozen=True)
class StragglerSpread:
    """The spread of replica speeds (calibrate/stragglers.py): the standard deviation of
    ln(mean step time) over `processes` identical processes running `steps` steps together."""

    spread: float
    processes: int = 0
    steps: int = 0
    mean_step_s: tuple[float, ...] = ()


# ---------------------------------------------------------------- to and from plain data

def _curve_data(curve: RateCurve) -> list[list[float]]:
    return [[float(s), float(r)] for s, r in zip(curve.sizes, curve.rates)]


def _link_data(link: LinkFit) -> dict[str, Any]:
    data = {"peers": link.peers, "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
            "latency_s": link.latency_s, "points": [list(p) for p in link.points]}
    if link.shards:
        data["shards"] = link.shards
    if link.operation:
        data = {"operation": link.operation, **data}
    return data


def profile_to_dict(profile: HardwareProfile) -> dict[str, Any]:
    """Plain data (SI numbers) in the documented layout."""
    data: dict[str, Any] = {
        "format": FORMAT, "machine": dict(profile.machine), "date": profile.date,
        "torch_version": profile.torch_version, "threads": profile.threads,
        "compute": {
            "flops_per_s_per_core": {k: _curve_data(v) for k, v in
                                     sorted(profile.flops_per_s_per_core.items())},
            "intensity_factors": {k: _curve_data(v) for k, v in
                                  sorted(profile.intensity_factors.items())},
            "bytes_per_s_per_core": {k: _curve_data(v) for k, v in
                                     sorted(profile.bytes_per_s_per_core.items())},
        },
        "memory": {"bandwidth_bytes_per_s": profile.memory_bandwidth_bytes_per_s,
                   "update_s_per_param": profile.update_s_per_param,
                   "update_s_per_message": profile.update_s_per_message},
    }
    if profile.allocation_bytes_per_s_per_core is not None:
        data["compute"]["allocation_bytes_per_s_per_core"] = _curve_data(
            profile.allocation_bytes_per_s_per_core)
    if profile.network is not None:
        data["network"] = {k: v for k, v in _link_data(profile.network).items() if k != "peers"}
    if profile.allreduce:
        data["allreduce"] = [_link_data(link) for link in profile.allreduce]
    if profile.overlap is not None:
        data["overlap"] = {"gamma": _finite_or_inf(profile.overlap.gamma),
                           "points": [list(p) for p in profile.overlap.points]}
    if profile.stragglers is not None:
        data["stragglers"] = {"spread": profile.stragglers.spread,
                              "processes": profile.stragglers.processes,
                              "steps": profile.stragglers.steps,
                              "mean_step_s": list(profile.stragglers.mean_step_s)}
    if profile.ps_network is not None:
        data["ps_network"] = {k: v for k, v in _link_data(profile.ps_network).items()
                              if k != "peers"}
    if profile.ps_sync_pull:
        data["ps_sync_pull"] = [_link_data(link) for link in profile.ps_sync_pull]
    if profile.collective_call_wait:
        data["collective_call_wait"] = [[int(p), float(s)] for p, s in profile.collective_call_wait]
    if profile.partition_exchange:
        data["partition_exchange"] = [_link_data(link) for link in profile.partition_exchange]
    if profile.collective_cpu:
        data["collective_cpu"] = [{"operation": op, "cpu_s": float(a), "cpu_s_per_byte": float(b)}
                                  for op, a, b in profile.collective_cpu]
    if profile.calibration:
        data["calibration"] = profile.calibration
    return data


def _finite_or_inf(value: float) -> float | str:
    return "inf" if math.isinf(value) else float(value)


def _overlap(value: Any, where: str) -> OverlapFit:
    gamma = _get(value, "gamma", where)
    try:
        gamma = float(gamma)
    except (TypeError, ValueError):
        raise InputError(f"{where}.gamma", f"must be a number >= 1 or inf, got {gamma!r}") from None
    if not gamma >= 1:
        raise InputError(f"{where}.gamma", f"must be >= 1 (1 = no overlap), got {gamma!r}")
    points = value.get("points") or []
    if not isinstance(points, list) or any(not isinstance(p, list) or len(p) != 3 for p in points):
        raise InputError(f"{where}.points", "must be a list of [compute_s, exchange_s, both_s]")
    return OverlapFit(gamma, tuple((_number(a, f"{where}.points"), _number(b, f"{where}.points"),
                                    _number(c, f"{where}.points")) for a, b, c in points))


def _stragglers(value: Any, where: str) -> StragglerSpread:
    spread = _number(_get(value, "spread", where), f"{where}.spread", None)
    if spread < 0:
        raise InputError(f"{where}.spread", f"must be >= 0, got {spread!r}")
    times = value.get("mean_step_s") or []
    if not isinstance(times, list):
        raise InputError(f"{where}.mean_step_s", "must be a list of seconds")
    return StragglerSpread(spread, int(value.get("processes", 0)), int(value.get("steps", 0)),
                           tuple(_number(t, f"{where}.mean_step_s") for t in times))


def _get(data: Any, key: str, where: str) -> Any:
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping, got {type(data).__name__}")
    if key not in data or data[key] is None:
        raise InputError(f"{where}.{key}", "missing")
    return data[key]


def _number(value: Any, where: str, minimum_exclusive: float | None = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(where, f"must be a finite number, got {value!r}")
    if minimum_exclusive is not None and not value > minimum_exclusive:
        raise InputError(where, f"must be > {minimum_exclusive:g}, got {value!r}")
    return float(value)


def _curve(value: Any, where: str) -> RateCurve:
    if not isinstance(value, list) or not value:
        raise InputError(where, "must be a non-empty list of [size, rate] points")
    points = []
    for i, point in enumerate(value):
        if not isinstance(point, list) or len(point) != 2:
            raise InputError(f"{where}[{i}]", f"must be a [size, rate] pair, got {point!r}")
        points.append((_number(point[0], f"{where}[{i}]"), _number(point[1], f"{where}[{i}]")))
    if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
        raise InputError(where, "sizes must be strictly increasing")
    return RateCurve(tuple(p[0] for p in points), tuple(p[1] for p in points))


def _curves(value: Any, where: str) -> dict[str, RateCurve]:
    if not isinstance(value, dict):
        raise InputError(where, f"must be a mapping of kind.phase to curves, got {value!r}")
    return {str(k): _curve(v, f"{where}.{k}") for k, v in value.items()}


def _link(value: Any, where: str) -> LinkFit:
    points = value.get("points", []) if isinstance(value, dict) else []
    if not isinstance(points, list):
        raise InputError(f"{where}.points", "must be a list of [bytes, seconds]")
    return LinkFit(bandwidth_bytes_per_s=_number(_get(value, "bandwidth_bytes_per_s", where),
                                                 f"{where}.bandwidth_bytes_per_s"),
                   latency_s=_number(_get(value, "latency_s", where), f"{where}.latency_s", None),
                   points=tuple((float(p[0]), float(p[1])) for p in points),
                   peers=int(value.get("peers", 2)), shards=int(value.get("shards", 0)),
                   operation=str(value.get("operation", "")))


def _links(value: Any, where: str) -> tuple[LinkFit, ...]:
    items = value or []
    if not isinstance(items, list):
        raise InputError(where, "must be a list of fits")
    return tuple(_link(item, f"{where}[{i}]") for i, item in enumerate(items))


def _call_waits(value: Any, where: str) -> tuple[tuple[int, float], ...]:
    items = value or []
    if not isinstance(items, list):
        raise InputError(where, "must be a list of [peers, seconds]")
    waits = []
    for i, item in enumerate(items):
        if not isinstance(item, list) or len(item) != 2:
            raise InputError(f"{where}[{i}]", f"must be a [peers, seconds] pair, got {item!r}")
        waits.append((int(_number(item[0], f"{where}[{i}]")),
                       _number(item[1], f"{where}[{i}]", None)))
    return tuple(waits)


def profile_from_dict(data: Any, where: str = "profile") -> HardwareProfile:
    """Validate plain data into a HardwareProfile; errors name the missing or bad field."""
    if not isinstance(data, dict):
        raise InputError(where, f"must be a YAML mapping, got {type(data).__name__}")
    fmt = _get(data, "format", where)
    if fmt != FORMAT:
        raise InputError(f"{where}.format", f"unsupported profile format {fmt!r} (expected "
                         f"{FORMAT!r})")
    compute = _get(data, "compute", where)
    flops = _curves(_get(compute, "flops_per_s_per_core", f"{where}.compute"),
                    f"{where}.compute.flops_per_s_per_core")
    for key in REQUIRED_FLOP_CURVES:
        if key not in flops:
            raise InputError(f"{where}.compute.flops_per_s_per_core.{key}", "missing")
    memory = _get(data, "memory", where)
    allocation = compute.get("allocation_bytes_per_s_per_core")
    machine = _get(data, "machine", where)
    if not isinstance(machine, dict):
        raise InputError(f"{where}.machine", "must be a mapping (hostname, cpu_model, cores)")
    allreduce = data.get("allreduce") or []
    if not isinstance(allreduce, list):
        raise InputError(f"{where}.allreduce", "must be a list of all-reduce fits")
    return HardwareProfile(
        machine=machine, date=str(_get(data, "date", where)),
        torch_version=str(_get(data, "torch_version", where)),
        flops_per_s_per_core=flops,
        intensity_factors=_curves(compute.get("intensity_factors") or {},
                                  f"{where}.compute.intensity_factors"),
        bytes_per_s_per_core=_curves(compute.get("bytes_per_s_per_core") or {},
                                     f"{where}.compute.bytes_per_s_per_core"),
        allocation_bytes_per_s_per_core=(
            None if allocation is None
            else _curve(allocation, f"{where}.compute.allocation_bytes_per_s_per_core")),
        memory_bandwidth_bytes_per_s=_number(_get(memory, "bandwidth_bytes_per_s",
                                                  f"{where}.memory"),
                                             f"{where}.memory.bandwidth_bytes_per_s"),
        update_s_per_param=_number(_get(memory, "update_s_per_param", f"{where}.memory"),
                                   f"{where}.memory.update_s_per_param"),
        update_s_per_message=_number(memory.get("update_s_per_message", 0.0),
                                     f"{where}.memory.update_s_per_message", None),
        network=_link(data["network"], f"{where}.network") if data.get("network") else None,
        allreduce=tuple(_link(item, f"{where}.allreduce[{i}]") for i, item in enumerate(allreduce)),
        threads=int(data.get("threads", 1)),
        calibration=dict(data.get("calibration") or {}),
        overlap=_overlap(data["overlap"], f"{where}.overlap") if data.get("overlap") else None,
        stragglers=(_stragglers(data["stragglers"], f"{where}.stragglers")
                    if data.get("stragglers") else None),
        ps_network=(_link(data["ps_network"], f"{where}.ps_network")
                    if data.get("ps_network") else None),
        ps_sync_pull=_links(data.get("ps_sync_pull"), f"{where}.ps_sync_pull"),
        collective_call_wait=_call_waits(data.get("collective_call_wait"),
                                         f"{where}.collective_call_wait"),
        partition_exchange=_exchange_fits(data.get("partition_exchange"),
                                          f"{where}.partition_exchange"),
        collective_cpu=(_collective_cpu(data["collective_cpu"], f"{where}.collective_cpu")
                        if data.get("collective_cpu") is not None else ()))


EXCHANGE_OPERATIONS = ("allgather", "reduce_scatter", "halo")


def _exchange_fits(value: Any, where: str) -> tuple[LinkFit, ...]:
    fits = _links(value, where)
    for i, fit in enumerate(fits):
        if fit.operation not in EXCHANGE_OPERATIONS:
            raise InputError(f"{where}[{i}].operation", f"must be one of "
                             f"{', '.join(EXCHANGE_OPERATIONS)}, got {fit.operation!r}")
    return fits


SUPPLEMENT_FORMAT = "dnnscale-profile-supplement/1"


def supplement_to_dict(fits: tuple[LinkFit, ...], **info: Any) -> dict[str, Any]:
    """Plain data of a supplementary calibration: its format, `info` (date, setting, load),
    and the partition-exchange fits as a profile writes them."""
    return {"format": SUPPLEMENT_FORMAT, **info,
            "partition_exchange": [_link_data(link) for link in fits]}


def load_supplement(path: Path) -> tuple[LinkFit, ...]:
    """The partition-exchange fits of a supplementary calibration (a testbed setting's
    measurement taken after its sittings, benchmarks/corpus_supplement.py)::

        format: dnnscale-profile-supplement/1
        date: ...
        partition_exchange: [...]     # as in a profile
    """
    from dnnscale.yamlio import load_yaml_file

    data = load_yaml_file(Path(path), "supplement")
    if data.get("format") != SUPPLEMENT_FORMAT:
        raise InputError("supplement.format", f"must be {SUPPLEMENT_FORMAT!r}")
    return _exchange_fits(data.get("partition_exchange"), "supplement.partition_exchange")


# ---------------------------------------------------------------- files

def save_profile(profile: HardwareProfile, path: Path) -> None:
    """Write the profile as YAML atomically (a temporary file in the same folder, then
    os.replace), so a reader never sees half a profile."""
    from dnnscale.atomic import atomic_write_text

    path = Path(path)
    text = yaml.safe_dump(profile_to_dict(profile), sort_keys=False)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text, "--output")


def load_profile(path: "str | Path") -> HardwareProfile:
    """Read and validate a profile YAML; InputError names what is wrong."""
    from dnnscale.yamlio import load_yaml_file

    return profile_from_dict(load_yaml_file(Path(path), "profile"))


# ---------------------------------------------------------------- use by a cluster

def machine_overrides(profile: HardwareProfile, cores: float) -> dict[str, Any]:
    """Machine YAML fields (SI numbers) that the profile replaces, for a machine of `cores`.

    The PS update cost in the profile is one thread's; the machine's is that over its cores.
    Kinds without a curve of their own (generic) use the linear forward curve ('default').
    """
    rates: dict[str, Any] = {"default": _curve_data(profile.flops_per_s_per_core["linear.forward"])}
    rates.update({key: _curve_data(curve) for key, curve in profile.flops_per_s_per_core.items()})
    return {"memory_bandwidth": profile.memory_bandwidth_bytes_per_s, "flops_per_core": rates,
            "update_time_per_param": profile.update_s_per_param / cores}


def network_overrides(profile: HardwareProfile) -> dict[str, Any]:
    """Network YAML fields the profile replaces (none when it measured no network)."""
    if profile.network is None:
        return {}
    return {"bandwidth": profile.network.bandwidth_bytes_per_s,
            "latency": profile.network.latency_s}


def with_profile_curves(machine: Device, profile: HardwareProfile) -> Device:
    """A Device with the profile's memory-bound, intensity and allocation curves added."""
    return replace(machine, bytes_per_s_per_core=dict(profile.bytes_per_s_per_core),
                   intensity_factors=dict(profile.intensity_factors),
                   allocation_bytes_per_s_per_core=profile.allocation_bytes_per_s_per_core)


COLLECTIVE_CPU_FORMAT = "dnnscale-collective-cpu/1"
PS_PUSH_PULL = "ps_push_pull"
"""The collective-CPU name of a worker's push of x bytes and pull of x bytes (netbench `cpu`;
model/quota.background_exchange_s)."""
CPU_OPERATIONS = (*EXCHANGE_OPERATIONS, "allreduce", PS_PUSH_PULL)
"""Partition collectives whose CPU per call is measured (calibrate/network.CPU_COLUMNS)."""


def collective_cpu_to_dict(fits: tuple[tuple[str, float, float, tuple[tuple[float, float], ...]], ...],
                           **info: Any) -> dict[str, Any]:
    """Plain data of a collective-CPU measurement (benchmarks/collective_cpu_bench.py)."""
    return {"format": COLLECTIVE_CPU_FORMAT, **info,
            "collective_cpu": [{"operation": op, "cpu_s": float(a), "cpu_s_per_byte": float(b),
                                "points": [[float(x), float(c)] for x, c in points]}
                               for op, a, b, points in fits]}


def load_collective_cpu(path: Path) -> tuple[tuple[str, float, float], ...]:
    """(operation, CPU seconds, CPU seconds per byte) of each partition collective, from a
    collective-CPU file::

        format: dnnscale-collective-cpu/1
        collective_cpu: [{operation: allgather, cpu_s: 4.1e-4, cpu_s_per_byte: 5e-10,
                          points: [[bytes, s], ...]}, ...]
    """
    from dnnscale.yamlio import load_yaml_file

    data = load_yaml_file(Path(path), "collective CPU")
    if data.get("format") != COLLECTIVE_CPU_FORMAT:
        raise InputError("collective_cpu.format", f"must be {COLLECTIVE_CPU_FORMAT!r}")
    return _collective_cpu(data.get("collective_cpu"), "collective_cpu.collective_cpu")


def _collective_cpu(items: Any, where: str) -> tuple[tuple[str, float, float], ...]:
    if not isinstance(items, list) or not items:
        raise InputError(where, "must be a non-empty list")
    fits = []
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise InputError(at, "must be a mapping")
        operation = item.get("operation")
        if operation not in CPU_OPERATIONS:
            raise InputError(f"{at}.operation", f"must be one of {', '.join(CPU_OPERATIONS)},"
                             f" got {operation!r}")
        values = []
        for key in ("cpu_s", "cpu_s_per_byte"):
            value = item.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    0 <= value < float("inf")):
                raise InputError(f"{at}.{key}", f"must be a finite number >= 0, got {value!r}")
            values.append(float(value))
        fits.append((str(operation), values[0], values[1]))
    return tuple(fits)
