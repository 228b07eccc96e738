"""Computation cost formulas (performance-model.md §1)."""

from __future__ import annotations

import math

from dnnscale.model.registry import cost_formula


@cost_formula
def phase_time_s(flops: float, bytes_moved: float, flops_per_s: float,
                 memory_bandwidth_bytes_per_s: float) -> float:
    """Time of one phase of one layer on one worker.

    Formula: t = max(F / φ, Q / β_mem)   (roofline: compute bound or memory bound)
    Units: F in FLOP, Q in bytes, φ in FLOP/s, β_mem in bytes/s -> seconds.
    Source: performance-model.md §1; Williams et al., "Roofline", CACM 2009.
    """
    compute_s = flops / flops_per_s if flops > 0 else 0.0
    memory_s = bytes_moved / memory_bandwidth_bytes_per_s if bytes_moved > 0 else 0.0
    return max(compute_s, memory_s)


@cost_formula
def imbalance_fraction(extent: int, partitions: int) -> float:
    """Share of a layer's work done by the most loaded of P workers.

    Formula: ceil(E / P) / E for E units (neurons, rows or channels) split over P workers
    (a 10-neuron layer on 4 workers: 3/10, not 1/4).
    Units: dimensionless.
    Source: performance-model.md §1 (vertical partitioning, Yan et al. KDD 2015).
    """
    if partitions <= 1 or extent <= 0:
        return 1.0
    return math.ceil(extent / partitions) / extent
