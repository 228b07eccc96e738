"""Published microbenchmark efficiencies of whole devices (presets/microbenchmarks.yaml).

A device without a GPU profile of its own is uncalibrated; rather than one round fraction of
peak for every precision, it takes what a published microbenchmark achieved on its family:

    η_gemm(p) = matmul speed in precision p / dense peak(p) of the device measured on
    η_mem     = elementwise-multiply bandwidth / HBM bandwidth of the device measured on

The fractions differ by precision because the units differ: V100's FP32 runs on CUDA cores at
89 % of their peak where its FP16 Tensor Cores reach 76 % of theirs, so one constant makes FP32
too slow or FP16 too fast. They are the rate of a large GEMM (each entry's `setting` says
which); a smaller GEMM runs below it by a fixed start-up time (system/gpu.GEMM_START_UP_S), and
a measured curve (`dnnscale calibrate --gpu`) replaces both.

An entry may also carry a *relative* figure (`matmul_relative`): two precisions' speeds measured
together, by one tool in one software setting, used only as a ratio. Where the absolute level of
a benchmark is not what long training runs sustain (a short run's clocks), the ratio of two
precisions measured side by side still says how much of its higher peak the lower precision
reaches:

    η_gemm(p) = η_gemm(base) · (speed_p / peak_p) / (speed_base / peak_base)

with η_gemm(base) the published absolute fraction or the round default (system/gpu.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from dnnscale.system.device import device_family
from dnnscale.system.preset_files import device_peaks, preset_table
from dnnscale.units import parse_quantity

TFLOPS, GB_PER_S = 1e12, 1e9


@dataclass(frozen=True)
class PublishedEfficiency:
    """A device family's achieved fractions in one published microbenchmark."""

    family: str
    measured_on: str
    gemm: dict[str, float]
    """precision -> achieved fraction of the dense peak in a large GEMM."""
    memory: float | None
    """Achieved fraction of HBM bandwidth in a large elementwise kernel (None: not published)."""
    source: str
    relative_base: str | None = None
    """The precision the relative figures are over (None: the entry has none)."""
    relative_gemm: dict[str, float] = field(default_factory=dict)
    """precision -> its large-GEMM fraction of peak over the base precision's, both measured
    together (`matmul_relative`); only precisions without an absolute figure use it."""


def _fraction(value: Any, reference: float, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{where}: must be a positive number, got {value!r}")
    fraction = float(value) / reference
    if fraction > 1:
        raise ValueError(f"{where}: {value} is above the device's peak")
    return fraction


def _measured_on(where: str, data: dict[str, Any], devices: dict[str, Any]) -> str:
    """The block's `measured_on`, a presets/devices.yaml key."""
    measured_on = str(data.get("measured_on"))
    if measured_on not in devices:
        raise ValueError(f"{where}.measured_on: unknown device {measured_on!r}")
    return measured_on


def _matmul_fractions(where: str, speeds: dict[Any, Any], measured_on: str) -> dict[str, float]:
    """precision -> matmul speed (TFLOP/s) over `measured_on`'s dense peak in that precision."""
    peaks = device_peaks(measured_on)
    fractions = {}
    for precision, speed in speeds.items():
        if str(precision) not in peaks:
            raise ValueError(f"{where}.matmul.{precision}: {measured_on} has no such unit")
        fractions[str(precision)] = _fraction(speed, peaks[str(precision)] / TFLOPS,
                                              f"{where}.matmul.{precision}")
    return fractions


def _entry(family: str, data: dict[str, Any]) -> PublishedEfficiency:
    where = f"microbenchmarks.{family}"
    devices = preset_table("devices")
    measured_on = _measured_on(where, data, devices)
    facts = devices[measured_on]
    gemm = _matmul_fractions(where, data.get("matmul") or {}, measured_on)
    bandwidth = parse_quantity(facts["memory_bandwidth"], "bandwidth",
                               f"devices.{measured_on}.memory_bandwidth")
    memory = (None if data.get("memory") is None else
              _fraction(data["memory"], bandwidth / GB_PER_S, f"{where}.memory"))
    base, relative = _relative(where, data.get("matmul_relative"), devices)
    return PublishedEfficiency(family, measured_on, gemm, memory, str(data["source"]),
                               base, relative)


def _relative(where: str, data: Any, devices: dict[str, Any]
              ) -> tuple[str | None, dict[str, float]]:
    """(base precision, precision -> fraction over the base's) of an entry's
    `matmul_relative` block; (None, {}) where it has none."""
    if data is None:
        return None, {}
    where = f"{where}.matmul_relative"
    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be a mapping")
    measured_on = _measured_on(where, data, devices)
    speeds = data.get("matmul")
    base = str(data.get("base"))
    if not isinstance(speeds, dict) or base not in speeds or len(speeds) < 2:
        raise ValueError(f"{where}.matmul: must give the base precision {base!r} and at "
                         "least one other")
    fractions = _matmul_fractions(where, speeds, measured_on)
    if not data.get("source"):
        raise ValueError(f"{where}.source: must say where the figures were published")
    return base, {precision: fraction / fractions[base]
                  for precision, fraction in fractions.items() if precision != base}


@functools.cache
def _table() -> dict[str, PublishedEfficiency]:
    table = {}
    for family, data in preset_table("microbenchmarks").items():
        entry = _entry(str(family), data)
        for name in (family, *data.get("applies_to", ())):
            table[str(name)] = entry
    return table


def published_efficiency(device_name: str) -> PublishedEfficiency | None:
    """The published fractions of `device_name`'s family, or None where there are none."""
    return _table().get(device_family(device_name))
