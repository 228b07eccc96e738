"""Fit a GPU efficiency profile to measured step times (no torch: the fitted model is dnnscale's
own prediction).

The unknowns are what a spec sheet cannot say (system/gpu_profile.py): the achieved fraction of
peak of GEMMs and attention matmuls at a few call sizes (log-log interpolated between them), of
HBM bandwidth for memory-bound kernels, the fixed cost per kernel and per collective call, and
the achieved fraction of the intra-node link. They are found by bounded least squares on
log(predicted / measured) step time (scipy.optimize.least_squares), so every row counts by its
relative error. The inter-node link's efficiency is not fitted here (single-node rows do not
exercise it); it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dnnscale.system.curve import RateCurve
from dnnscale.system.gpu_profile import GpuProfile


@dataclass(frozen=True)
class FitSpace:
    """The unknowns and their bounds. Each kernel class has a saturating efficiency
    (η_max, x_½; system/curve.saturating); then the fixed cost per kernel and per collective
    call, and the achieved fraction of the intra-node link. Times in µs and sizes as log10
    inside the vector."""

    names: tuple[str, ...] = ("gemm_max", "gemm_half_log10_flop", "attention_max",
                              "attention_half_log10_flop", "memory_max",
                              "memory_half_log10_bytes", "launch_us", "launch_contention",
                              "pipeline_step_us", "collective_call_us", "intra_node_efficiency")
    lower: tuple[float, ...] = (0.2, 5.0, 0.05, 5.0, 0.2, 3.0, 0.0, 0.0, 0.0, 0.0, 0.1)
    upper: tuple[float, ...] = (0.95, 12.0, 0.95, 12.0, 1.0, 9.0, 200.0, 1.0, 1e5, 3000.0, 1.0)
    start: tuple[float, ...] = (0.75, 9.0, 0.5, 9.0, 0.8, 6.0, 20.0, 0.05, 100.0, 20.0, 0.8)
    flop_range: tuple[float, float] = (1e6, 1e13)
    byte_range: tuple[float, float] = (1e3, 1e11)
    fixed: tuple[tuple[str, float], ...] = ()
    """Unknowns taken from published measurements instead of fitted: (name, value)."""

    @property
    def free(self) -> list[int]:
        held = {name for name, _ in self.fixed}
        return [i for i, name in enumerate(self.names) if name not in held]

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([self.lower[i] for i in self.free]),
                np.array([self.upper[i] for i in self.free]))

    def initial(self) -> np.ndarray:
        return np.array([self.start[i] for i in self.free])

    def full(self, x: Sequence[float]) -> list[float]:
        """The whole parameter list: the free values `x` and the fixed ones."""
        values = dict(self.fixed)
        for index, value in zip(self.free, x):
            values[self.names[index]] = float(value)
        return [values[name] for name in self.names]

    def profile(self, x: Sequence[float], base: GpuProfile) -> GpuProfile:
        """The profile of free parameter vector `x` (see `names`; fixed ones added)."""
        full = self.full(x)
        (gemm_max, gemm_half, att_max, att_half, mem_max, mem_half, launch_us, contention,
         pipeline_us, call_us, intra) = full
        gemm = RateCurve.saturating(gemm_max, 10 ** gemm_half, *self.flop_range)
        attention = RateCurve.saturating(att_max, 10 ** att_half, *self.flop_range)
        memory = RateCurve.saturating(mem_max, 10 ** mem_half, *self.byte_range)
        # No flash curve: the rows fitted run unfused attention; fused attention is priced by
        # its kernel's published speed (system/attention_kernels.py).
        return replace(base, efficiency={"gemm": gemm, "attention": attention},
                       memory_efficiency=memory, launch_s=launch_us * 1e-6,
                       launch_contention=contention, pipeline_step_s=pipeline_us * 1e-6,
                       collective_latency_s=call_us * 1e-6, intra_node_efficiency=intra,
                       extra={**base.extra,
                              "fitted": {n: v for n, v in zip(self.names, full)
                                         if n not in dict(self.fixed)},
                              "published": dict(self.fixed)})


@dataclass
class FitResult:
    profile: GpuProfile
    rows: int
    evaluations: int
    cost: float
    details: dict[str, Any] = field(default_factory=dict)


Predict = Callable[[Any, GpuProfile], float]


def _predict_chunk(args: tuple[Predict, list[Any], GpuProfile]) -> list[float]:
    predict, rows, profile = args
    return [predict(row, profile) for row in rows]


def predict_all(predict: Predict, rows: Sequence[Any], profile: GpuProfile,
                pool: ProcessPoolExecutor | None = None) -> list[float]:
    """Every row's prediction, split over the pool's processes when one is given."""
    if pool is None:
        return [predict(row, profile) for row in rows]
    workers = pool._max_workers  # noqa: SLF001 (the pool's own size)
    chunks = [list(rows[i::workers]) for i in range(workers)]
    parts = list(pool.map(_predict_chunk, [(predict, chunk, profile) for chunk in chunks]))
    out = [0.0] * len(rows)
    for i, part in enumerate(parts):
        out[i::workers] = part
    return out


def fit_gpu_profile(rows: Sequence[Any], measured_s: Sequence[float], predict: Predict,
                    base: GpuProfile, space: FitSpace | None = None, processes: int = 1,
                    max_evaluations: int = 400,
                    progress: Callable[[int, float], None] | None = None) -> FitResult:
    """The profile whose predictions of `rows` best match `measured_s` in log ratio."""
    from scipy.optimize import least_squares

    space = space or FitSpace()
    measured = np.log(np.asarray(measured_s, dtype=float))
    lower, upper = space.bounds()
    evaluations = 0
    pool = ProcessPoolExecutor(processes) if processes > 1 else None

    def residuals(x: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        predicted = np.log(np.asarray(predict_all(predict, rows, space.profile(x, base), pool)))
        residual = predicted - measured
        if progress is not None:
            progress(evaluations, float(np.median(np.abs(np.expm1(residual)))))
        return residual

    try:
        solution = least_squares(residuals, np.clip(space.initial(), lower, upper),
                                 bounds=(lower, upper), max_nfev=max_evaluations,
                                 diff_step=1e-3, x_scale="jac")
    finally:
        if pool is not None:
            pool.shutdown()
    return FitResult(space.profile(solution.x, base), len(rows), evaluations,
                     float(solution.cost), {"status": int(solution.status),
                                            "message": str(solution.message)})
