"""The GPU efficiency profile: what a device achieves, as opposed to what its spec sheet says.

Spec-sheet facts (peak FLOP/s, HBM bandwidth, link rates) live in presets/devices.yaml and
presets/interconnects.yaml. How much of them a training step gets is measured: fitted on
published runs (benchmarks/vtrain.py fits vTrain's single-node A100 rows) or by
`dnnscale calibrate --gpu`. Format (SI numbers, written by machines)::

    format: dnnscale-gpu-profile/1
    device: A100-SXM4-80GB
    date: 2026-12-01
    source: how it was measured or fitted
    efficiency:                      # achieved fraction of peak per kernel class, over FLOP/call
      gemm: [[1e8, 0.35], [1e10, 0.7], [1e12, 0.8]]
      attention: [[...]]
      gemm@fp32: [[...]]             # optional: a class's curve in one precision only
    memory_efficiency: [[1e5, 0.2], [1e8, 0.8]]   # fraction of HBM bandwidth, over bytes/call
    launch_s: 5e-6                   # host time per kernel launch
    launch_contention: 0.05          # extra launch time per other process on the node
    intra_node_efficiency: 0.8       # achieved fraction of the intra-node link in collectives
    inter_node_efficiency: 0.96      # ... of the inter-node link
    collective_latency_s: 1e-5       # fixed cost per collective call
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dnnscale.errors import InputError
from dnnscale.system.curve import RateCurve
from dnnscale.yamlio import load_yaml_file

FORMAT = "dnnscale-gpu-profile/1"
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")
"""The number formats a device's peak may be given in (presets/devices.yaml)."""
PRECISION_KEY = "@"
"""An efficiency key `class@precision` (gemm@fp32) is that class's curve in that precision
alone; the plain class key serves every precision without one (model/gpu_compute.efficiency)."""


def curve_key(kernel_class: str, precision: str) -> str:
    """The efficiency key of `kernel_class`'s curve in `precision` alone: gemm@fp32."""
    return f"{kernel_class}{PRECISION_KEY}{precision}"


def curve_class(key: str) -> str:
    """The kernel class an efficiency key prices: gemm for gemm and gemm@fp32."""
    return key.partition(PRECISION_KEY)[0]


def _efficiency_key(key: Any) -> str:
    """`key` as a curve name: a kernel class, or `class@precision` with a known precision."""
    name = str(key)
    cls, at, precision = name.partition(PRECISION_KEY)
    if not cls or (at and precision not in PRECISIONS):
        raise InputError(f"gpu_profile.efficiency.{name}", f"must be a kernel class or "
                         f"CLASS{PRECISION_KEY}PRECISION with PRECISION one of "
                         f"{', '.join(PRECISIONS)}")
    return name


@dataclass(frozen=True)
class GpuProfile:
    """Achieved efficiencies of one accelerator type and its links."""

    device: str
    efficiency: dict[str, RateCurve]
    memory_efficiency: RateCurve
    launch_s: float = 0.0
    launch_contention: float = 0.0
    pipeline_step_s: float = 0.0
    intra_node_efficiency: float = 1.0
    inter_node_efficiency: float = 1.0
    collective_latency_s: float = 0.0
    date: str = ""
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """Informative fields (fit quality, the split used) kept as written."""


def _curve(value: Any, where: str) -> RateCurve:
    if not isinstance(value, list) or not value:
        raise InputError(where, "must be a list of [size, value] points")
    points = []
    for i, point in enumerate(value):
        if (not isinstance(point, (list, tuple)) or len(point) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in point)):
            raise InputError(f"{where}[{i}]", "each point is [size, value] (numbers)")
        points.append((float(point[0]), float(point[1])))
    points.sort()
    try:
        return RateCurve(tuple(p[0] for p in points), tuple(p[1] for p in points))
    except ValueError as exc:
        raise InputError(where, str(exc)) from None


def _fraction(data: dict[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1.5:
        raise InputError(f"gpu_profile.{key}", f"must be a fraction in (0, 1.5], got {value!r}")
    return float(value)


def _seconds(data: dict[str, Any], key: str) -> float:
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise InputError(f"gpu_profile.{key}", f"must be seconds in [0, 1), got {value!r}")
    return float(value)


def gpu_profile_from_dict(data: Any) -> GpuProfile:
    if not isinstance(data, dict):
        raise InputError("gpu_profile", "must be a mapping")
    if data.get("format") != FORMAT:
        raise InputError("gpu_profile.format", f"must be {FORMAT!r}, got {data.get('format')!r}")
    curves = data.get("efficiency")
    if not isinstance(curves, dict) or "gemm" not in curves:
        raise InputError("gpu_profile.efficiency", "must map kernel classes to curves, gemm "
                         "included")
    known = {"format", "device", "date", "source", "efficiency", "memory_efficiency",
             "launch_s", "launch_contention", "pipeline_step_s", "intra_node_efficiency", "inter_node_efficiency",
             "collective_latency_s"}
    return GpuProfile(
        device=str(data.get("device", "")),
        efficiency={_efficiency_key(k): _curve(v, f"gpu_profile.efficiency.{k}")
                    for k, v in curves.items()},
        memory_efficiency=_curve(data.get("memory_efficiency"), "gpu_profile.memory_efficiency"),
        launch_s=_seconds(data, "launch_s"),
        launch_contention=_seconds(data, "launch_contention"),
        pipeline_step_s=_seconds(data, "pipeline_step_s"),
        intra_node_efficiency=_fraction(data, "intra_node_efficiency", 1.0),
        inter_node_efficiency=_fraction(data, "inter_node_efficiency", 1.0),
        collective_latency_s=_seconds(data, "collective_latency_s"),
        date=str(data.get("date", "")), source=str(data.get("source", "")),
        extra={k: v for k, v in data.items() if k not in known})


def gpu_profile_to_dict(profile: GpuProfile) -> dict[str, Any]:
    def points(curve: RateCurve) -> list[list[float]]:
        return [[float(s), float(r)] for s, r in zip(curve.sizes, curve.rates)]

    def plain(value: Any) -> Any:  # numpy scalars and nested mappings as YAML can write them
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value.item() if hasattr(value, "item") else value

    return {"format": FORMAT, "device": profile.device, "date": profile.date,
            "source": profile.source,
            "efficiency": {k: points(c) for k, c in profile.efficiency.items()},
            "memory_efficiency": points(profile.memory_efficiency),
            "launch_s": float(profile.launch_s),
            "launch_contention": float(profile.launch_contention),
            "pipeline_step_s": float(profile.pipeline_step_s),
            "intra_node_efficiency": float(profile.intra_node_efficiency),
            "inter_node_efficiency": float(profile.inter_node_efficiency),
            "collective_latency_s": float(profile.collective_latency_s),
            **plain(profile.extra)}


def load_gpu_profile(path: str | Path) -> GpuProfile:
    return gpu_profile_from_dict(load_yaml_file(Path(path), "gpu_profile"))


def save_gpu_profile(profile: GpuProfile, path: Path) -> None:
    """Write atomically (temp file in the same folder, then rename)."""
    from dnnscale.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(gpu_profile_to_dict(profile), sort_keys=False),
                      "gpu_profile")
