"""Memory microbenchmarks: streaming bandwidth, the cost of a fresh tensor, and the
parameter-server update cost (w -= lr·g) per parameter and per message. One thread; torch."""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.calibrate.timing import call_time_s
from dnnscale.system.curve import RateCurve

NO_OVERHEAD_BYTES_PER_S = 1e13
"""Stand-in rate where allocating a fresh tensor costs nothing measurable."""


def memory_bandwidth_bytes_per_s(size_bytes: int = 64 * 2**20, samples: int = 5) -> float:
    """Copy bandwidth of one thread: 2 · size / t (read + write) for a `size_bytes` copy."""
    import torch

    source = torch.ones(size_bytes // 4)
    target = torch.empty_like(source)
    seconds = call_time_s(lambda: target.copy_(source), samples=samples, sample_s=0.05)
    return 2 * size_bytes / seconds


def allocation_curve(sizes_bytes: list[int], samples: int = 5) -> RateCurve:
    """Bytes/s of the overhead of writing a fresh tensor over writing an existing one.

    Formula: rate(Q) = Q / (t_fresh(Q) − t_existing(Q)), and NO_OVERHEAD_BYTES_PER_S where the
    difference is within noise (< 5 %). Large allocations come from mmap and pay a page fault per
    page on every call (glibc's mmap threshold tops out at 32 MiB), which a GEMM writing its
    output pays too.
    """
    import torch

    rates = []
    sizes_bytes = sorted(set(sizes_bytes))
    for size in sizes_bytes:
        values = size // 4
        existing = torch.empty(values)
        fresh_s = call_time_s(lambda: torch.empty(values).fill_(0.0), samples=samples,
                                     sample_s=0.03)
        existing_s = call_time_s(lambda: existing.fill_(0.0), samples=samples,
                                        sample_s=0.03)
        overhead_s = fresh_s - existing_s
        rates.append(size / overhead_s if overhead_s > 0.05 * existing_s
                     else NO_OVERHEAD_BYTES_PER_S)
    return RateCurve(tuple(float(s) for s in sizes_bytes), tuple(rates))


@dataclass(frozen=True)
class UpdateCost:
    """Parameter-server update cost of one thread: t(params) = s_per_message + params · s_per_param."""

    s_per_param: float
    s_per_message: float

    def seconds(self, params: float) -> float:
        return self.s_per_message + params * self.s_per_param


def update_cost(sizes_params: list[int], samples: int = 5) -> UpdateCost:
    """Fit t = a + b·params to timed SGD updates `w.add_(g, alpha=-lr)` at several sizes
    (least squares weighted by 1/t, i.e. on relative error)."""
    import numpy as np
    import torch

    times = []
    for params in sizes_params:
        weights, grads = torch.zeros(params), torch.ones(params)
        times.append(call_time_s(lambda: weights.add_(grads, alpha=-0.01),
                                        samples=samples, sample_s=0.02))
    t = np.asarray(times)
    design = np.stack([np.ones_like(t), np.asarray(sizes_params, dtype=float)], axis=1) / t[:, None]
    (per_message, per_param), *_ = np.linalg.lstsq(design, np.ones_like(t), rcond=None)
    return UpdateCost(s_per_param=max(float(per_param), 1e-13),
                      s_per_message=max(float(per_message), 0.0))

