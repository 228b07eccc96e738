"""Published speed of fused attention kernels, per kernel and device (performance-model.md §9).

A FlashAttention kernel's achieved FLOP rate depends on the sequence length (how many key
blocks each query block loops over, against the fixed cost of loading Q and writing O), the
head dimension (the tile shape) and the causal mask (half the blocks skipped, the diagonal ones
partly wasted), not on the FLOPs of one call: a curve over FLOP per call, as the GEMM one is,
cannot tell a long sequence from a large batch. So the `flash_attention` kind is priced by the
kernels' own published benchmarks (presets/attention_kernels.yaml), interpolated:

    speed(s, d) = linear in log2(s) between the benchmark's lengths, held at the first and
                  last length outside them; linear in d between its head dimensions, held
                  outside them
    η = speed / peak(the benchmark's precision)

A device with a measured `flash` curve (`dnnscale calibrate --gpu`) keeps its own measurement;
the figures are for devices that have none. Forward and backward get the same η: the sources
publish their sum.

Where no benchmark of a kernel on a family exists but the kernel is known to run there as it
runs on a benchmarked family (the same instructions, no use of the newer die's own), its
figures are derived: the benchmarked family's, scaled point by point by another kernel's
measured speed ratio between the two families (`derived` in the YAML; `estimated` is set).

    speed_k(here) = speed_k(from) · speed_ref(here) / speed_ref(from)   at each (mask, d, s)
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Any

from dnnscale.system.device import device_family
from dnnscale.system.preset_files import preset_table

TFLOPS = 1e12


@dataclass(frozen=True)
class KernelFigures:
    """One kernel's published forward + backward speed on one device family."""

    kernel: str
    family: str
    measured_on: str
    precision: str
    seq: tuple[int, ...]
    flops_per_s: dict[tuple[bool, int], tuple[float | None, ...]]
    """(causal, head dimension) -> achieved FLOP/s at each of `seq` (None: not published)."""
    source: str
    estimated: bool = False
    """Derived from other families' measurements (module docstring), not measured."""

    def _at_head_dim(self, causal: bool, head_dim: int, seq: int) -> float:
        points = [(s, v) for s, v in zip(self.seq, self.flops_per_s[(causal, head_dim)])
                  if v is not None]
        lengths = [s for s, _ in points]
        if seq <= lengths[0]:
            return points[0][1]
        if seq >= lengths[-1]:
            return points[-1][1]
        i = bisect.bisect_right(lengths, seq)
        (s0, v0), (s1, v1) = points[i - 1], points[i]
        w = (math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
        return v0 + w * (v1 - v0)

    def achieved_flops_per_s(self, head_dim: int, causal: bool, seq: int) -> float:
        """Interpolated speed (module docstring) at `seq` keys per query and `head_dim`."""
        dims = sorted(d for c, d in self.flops_per_s if c == causal)
        if head_dim <= dims[0]:
            return self._at_head_dim(causal, dims[0], seq)
        if head_dim >= dims[-1]:
            return self._at_head_dim(causal, dims[-1], seq)
        i = bisect.bisect_right(dims, head_dim)
        d0, d1 = dims[i - 1], dims[i]
        w = (head_dim - d0) / (d1 - d0)
        return ((1 - w) * self._at_head_dim(causal, d0, seq)
                + w * self._at_head_dim(causal, d1, seq))


def _figures(kernel: str, family: str, data: dict[str, Any]) -> KernelFigures:
    where = f"attention_kernels.{kernel}.{family}"
    seq = tuple(int(s) for s in data["seq"])
    table: dict[tuple[bool, int], tuple[float | None, ...]] = {}
    for mask, causal in (("causal", True), ("full", False)):
        for head_dim, values in data[mask].items():
            if len(values) != len(seq):
                raise ValueError(f"{where}.{mask}.{head_dim}: {len(values)} values for "
                                 f"{len(seq)} lengths")
            table[(causal, int(head_dim))] = tuple(None if v is None else float(v) * TFLOPS
                                                   for v in values)
    return KernelFigures(kernel, family, str(data["measured_on"]), str(data["precision"]), seq,
                         table, str(data["source"]))


def _derived(kernel: str, family: str, data: dict[str, Any],
             measured: dict[tuple[str, str], KernelFigures]) -> KernelFigures:
    """`kernel`'s figures on `family` scaled from another family's (module docstring): every
    point where all three figures are published, None elsewhere; ValueError naming the entry
    where a figure it needs is missing or the benchmarks' lengths differ."""
    where = f"attention_kernels.{kernel}.{family}.derived"
    rule = data["derived"]
    if not isinstance(rule, dict) or set(rule) != {"from", "scaled_by"}:
        raise ValueError(f"{where}: expected a mapping of 'from' and 'scaled_by'")
    origin, reference = str(rule["from"]), str(rule["scaled_by"])
    base = measured.get((kernel, origin))
    ref_here, ref_there = measured.get((reference, family)), measured.get((reference, origin))
    if base is None or ref_here is None or ref_there is None:
        raise ValueError(f"{where}: needs measured {kernel} on {origin} and {reference} on both "
                         f"{origin} and {family}")
    if not base.seq == ref_here.seq == ref_there.seq:
        raise ValueError(f"{where}: the benchmarks' sequence lengths differ")
    if len({base.precision, ref_here.precision, ref_there.precision}) > 1:
        raise ValueError(f"{where}: the benchmarks' precisions differ")
    table: dict[tuple[bool, int], tuple[float | None, ...]] = {}
    for key, values in base.flops_per_s.items():
        if key not in ref_here.flops_per_s or key not in ref_there.flops_per_s:
            raise ValueError(f"{where}: {reference} has no figures at head dimension {key[1]}")
        table[key] = tuple(
            None if v is None or a is None or b is None else v * a / b
            for v, a, b in zip(values, ref_here.flops_per_s[key], ref_there.flops_per_s[key]))
    return KernelFigures(kernel, family, f"derived from {origin} by {reference}",
                         base.precision, base.seq, table, str(data["source"]), estimated=True)


@functools.cache
def _table() -> dict[tuple[str, str], KernelFigures]:
    entries = [(kernel, family, facts) for kernel, families in
               preset_table("attention_kernels").items() for family, facts in families.items()]
    measured = {(kernel, family): _figures(kernel, family, facts)
                for kernel, family, facts in entries if "derived" not in facts}
    applies_to = {(kernel, family): tuple(facts.get("applies_to", ()))
                  for kernel, family, facts in entries}
    table = {}
    for kernel, family, facts in entries:
        if "derived" in facts:  # it covers the devices its scaling reference covers there
            figures = _derived(kernel, family, facts, measured)
            others = applies_to[(str(facts["derived"]["scaled_by"]), family)]
        else:
            figures, others = measured[(kernel, family)], applies_to[(kernel, family)]
        for name in (family, *others):
            table[(kernel, name)] = figures
    return table


def published_kernels() -> tuple[str, ...]:
    """The kernels the table has figures for."""
    return tuple(sorted({kernel for kernel, _ in _table()}))


def kernel_figures(kernel: str, device_name: str) -> KernelFigures | None:
    """`kernel`'s figures for the family of `device_name`; where that kernel has none there,
    FlashAttention-2's (the kernel the others are measured against); else None."""
    family = device_family(device_name)
    table = _table()
    return table.get((kernel, family)) or table.get(("fa2", family))
