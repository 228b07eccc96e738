"""Fitting measured rates to the curves the model evaluates (`RateCurve`, log-log piecewise linear).

Compute kinds (conv2d, linear) are fitted as a separable rate surface

    log r(F, I) = log φ(F) + log η(I)

where F is the FLOPs of one call, I = F / Q its arithmetic intensity (FLOP per byte of the
tensors the call reads and writes, weights included), φ a RateCurve over F and η a RateCurve over
I normalised to 1 at its largest knot. Both are hat-function (piecewise-linear) bases in log
space, so the fit is one linear least-squares problem on log rates, i.e. it minimises relative
errors. FLOPs alone do not predict: on the development machine a 1-input-channel convolution ran
at a tenth of the FLOP/s of a 32-channel one of the same size, and a 9216x4096 linear layer on a
batch of 4 (weights streamed once per call) at a tenth of the same layer on a large batch.

Memory-bound kinds have only the size curve (F replaced by bytes per call).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dnnscale.system.curve import RateCurve

KNOTS_PER_DECADE = 1.5


def _knots(log_values: np.ndarray, per_decade: float) -> np.ndarray:
    """Knot positions (natural log) spanning the data, about `per_decade` per factor of 10."""
    low, high = float(log_values.min()), float(log_values.max())
    if high - low < 1e-9:
        return np.array([low])
    count = max(2, int(math.ceil((high - low) / math.log(10) * per_decade)) + 1)
    return np.linspace(low, high, count)


def _hat_basis(log_values: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Rows: points; columns: the piecewise-linear interpolation weight of each knot."""
    basis = np.zeros((len(log_values), len(knots)))
    if len(knots) == 1:
        basis[:, 0] = 1.0
        return basis
    clamped = np.clip(log_values, knots[0], knots[-1])
    index = np.clip(np.searchsorted(knots, clamped, side="right") - 1, 0, len(knots) - 2)
    t = (clamped - knots[index]) / (knots[index + 1] - knots[index])
    rows = np.arange(len(log_values))
    basis[rows, index] = 1.0 - t
    basis[rows, index + 1] = t
    return basis


def _curve(knots: np.ndarray, log_rates: np.ndarray) -> RateCurve:
    return RateCurve(tuple(float(math.exp(k)) for k in knots),
                     tuple(float(math.exp(v)) for v in log_rates))


def fit_separable(sizes: Sequence[float], rates: Sequence[float],
                  intensities: Sequence[float] | None = None,
                  per_decade: float = KNOTS_PER_DECADE,
                  smoothing: float = 0.05) -> tuple[RateCurve, RateCurve | None]:
    """Fit r ≈ φ(size) · η(intensity) to measured points; returns (φ, η) (η None without
    intensities or when they span less than 10 %).

    η is constrained non-decreasing (more FLOP per byte never hurts) and equal to 1 at its
    largest knot; a second-difference penalty (`smoothing`) on φ keeps knots with little data
    from running off. With distinct sizes a knot apart, φ passes through the points.
    """
    from scipy.optimize import lsq_linear

    size_log = np.log(np.asarray(sizes, dtype=float))
    rate_log = np.log(np.asarray(rates, dtype=float))
    if len(size_log) == 0 or len(size_log) != len(rate_log):
        raise ValueError("need as many sizes as rates, at least one")
    size_knots = _knots(size_log, per_decade)
    design = _hat_basis(size_log, size_knots)
    intensity_knots = None
    if intensities is not None:
        intensity_log = np.log(np.asarray(intensities, dtype=float))
        if intensity_log.max() - intensity_log.min() > math.log(1.1):
            intensity_knots = _knots(intensity_log, per_decade)
            # log η_k = −Σ_{j≥k} d_j with d_j ≥ 0: monotone, 0 at the last knot.
            hat = _hat_basis(intensity_log, intensity_knots)
            steps = -np.cumsum(hat, axis=1)[:, :-1]
            design = np.hstack([design, steps])
    width = design.shape[1]
    penalty = _second_difference(len(size_knots), 0, width)
    lhs = np.vstack([design, math.sqrt(smoothing) * penalty]) if len(penalty) else design
    rhs = np.concatenate([rate_log, np.zeros(len(penalty))])
    lower, upper = np.full(width, -np.inf), np.full(width, np.inf)
    lower[len(size_knots):] = 0.0
    # φ stays within the measured rates (±10 %): η cannot be traded for a fictitious peak, and
    # smoothing cannot dive below what was measured.
    upper[:len(size_knots)] = float(rate_log.max()) + math.log(1.1)
    lower[:len(size_knots)] = float(rate_log.min()) - math.log(1.1)
    solution = lsq_linear(lhs, rhs, bounds=(lower, upper)).x
    size_curve = _curve(size_knots, solution[:len(size_knots)])
    if intensity_knots is None:
        return size_curve, None
    steps = solution[len(size_knots):]
    log_factors = np.concatenate([-np.cumsum(steps[::-1])[::-1], [0.0]])
    return size_curve, _curve(intensity_knots, log_factors)


def _second_difference(count: int, offset: int, width: int) -> np.ndarray:
    rows = np.zeros((max(0, count - 2), width))
    for i in range(count - 2):
        rows[i, offset + i: offset + i + 3] = (1.0, -2.0, 1.0)
    return rows


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """|predicted − measured| / measured, element-wise."""
    return [abs(p - m) / m for p, m in zip(predicted, measured)]


def fit_compute_memory(flops: Sequence[float], bytes_moved: Sequence[float],
                       seconds: Sequence[float], per_decade: float = KNOTS_PER_DECADE,
                       smoothing: float = 0.05) -> tuple[RateCurve, RateCurve]:
    """Fit t ≈ F / φ(F) + Q / β(Q) to measured calls: FLOPs F, bytes Q (activations and
    weights), seconds t; returns (φ over F in FLOP/s, β over Q in bytes/s).

    A roofline whose two ceilings depend on size, with the two terms added rather than maxed
    (a one-thread GEMM overlaps little of its streaming with its arithmetic): φ(F) falls for
    small calls (per-call overhead), β(Q) falls when the working set leaves the caches. Both are
    piecewise linear in log-log; nonlinear least squares on log t (relative error), with a
    second-difference penalty on each curve.
    """
    from scipy.optimize import least_squares

    f_log = np.log(np.asarray(flops, dtype=float))
    q_log = np.log(np.asarray(bytes_moved, dtype=float))
    t = np.asarray(seconds, dtype=float)
    f_knots, q_knots = _knots(f_log, per_decade), _knots(q_log, per_decade)
    f_basis, q_basis = _hat_basis(f_log, f_knots), _hat_basis(q_log, q_knots)
    f_penalty = _second_difference(len(f_knots), 0, len(f_knots))
    q_penalty = _second_difference(len(q_knots), 0, len(q_knots))
    flops_rate = np.exp(f_log) / t
    bytes_rate = np.exp(q_log) / t
    nf = len(f_knots)

    def residuals(params: np.ndarray) -> np.ndarray:
        log_phi, log_beta = params[:nf], params[nf:]
        predicted = np.exp(f_log - f_basis @ log_phi) + np.exp(q_log - q_basis @ log_beta)
        return np.concatenate([np.log(predicted / t), math.sqrt(smoothing) * (f_penalty @ log_phi),
                               math.sqrt(smoothing) * (q_penalty @ log_beta)])

    start = np.concatenate([np.full(nf, math.log(flops_rate.max())),
                            np.full(len(q_knots), math.log(bytes_rate.max() * 4))])
    # φ at most 10 % above the best FLOP/s measured (it is a ceiling on what was seen); β at
    # least the lowest bytes/s seen, so that neither term alone runs away.
    lower = np.concatenate([np.full(nf, math.log(flops_rate.min() / 1.1)),
                            np.full(len(q_knots), math.log(bytes_rate.min() / 1.1))])
    upper = np.concatenate([np.full(nf, math.log(flops_rate.max() * 1.1)),
                            np.full(len(q_knots), math.log(bytes_rate.max() * 1e3))])
    solution = least_squares(residuals, np.clip(start, lower + 1e-9, upper - 1e-9),
                             bounds=(lower, upper)).x
    return _curve(f_knots, solution[:nf]), _curve(q_knots, solution[nf:])
