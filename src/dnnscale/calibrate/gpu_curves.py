"""Fit a size-dependent efficiency curve to measured (size, efficiency) points (no torch).

The curve is a `RateCurve` (system/curve.py): piecewise linear in (log size, log efficiency)
between knots, held constant outside them. The fit chooses the knots' values by least squares
on log efficiency — every point counts by its relative error — with a small penalty on the
curve's second differences, which joins knots that no point falls near by a straight line and
evens out shape-to-shape scatter at one size. Knots are spaced evenly in log size,
`knots_per_decade` per decade, from the smallest measured size to the largest.

Exact for data on one log-log line (the penalty is 0 there); for a smooth curve the error is
that of linear interpolation between knots, h²·max|y''|/8 in log units for knot spacing h
(a saturating η = η_max·x/(x + x½) has |y''| ≤ 1/4, so 4 knots per decade, h = ln 10 / 4,
stay within 1 %).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dnnscale.system.curve import RateCurve

KNOTS_PER_DECADE = 4
SMOOTHING = 1e-3
"""Weight of the squared second differences relative to the mean squared residual."""


def fit_rate_curve(sizes: Sequence[float], values: Sequence[float],
                   knots_per_decade: int = KNOTS_PER_DECADE,
                   smoothing: float = SMOOTHING) -> RateCurve:
    """The RateCurve that fits `values` (> 0) at `sizes` (> 0) best in log-log least squares."""
    raw_x, raw_y = np.asarray(sizes, dtype=float), np.asarray(values, dtype=float)
    if raw_x.size == 0 or raw_x.size != raw_y.size:
        raise ValueError("need as many sizes as values, at least one")
    if not (np.all(np.isfinite(raw_x)) and np.all(np.isfinite(raw_y))
            and np.all(raw_x > 0) and np.all(raw_y > 0)):
        raise ValueError("sizes and values must be finite and > 0")
    x, y = np.log(raw_x), np.log(raw_y)
    low, high = float(x.min()), float(x.max())
    if high - low < 1e-9:
        return RateCurve((math.exp(low),), (math.exp(float(np.median(y))),))
    intervals = max(1, math.ceil((high - low) / math.log(10) * knots_per_decade))
    knots = np.linspace(low, high, intervals + 1)
    basis = hat_basis(x, knots)
    rows, count = basis.shape
    blocks, targets = [basis], [y]
    if count >= 3 and smoothing > 0:
        second = np.zeros((count - 2, count))
        for i in range(count - 2):
            second[i, i:i + 3] = (1.0, -2.0, 1.0)
        blocks.append(math.sqrt(smoothing * rows / (count - 2)) * second)
        targets.append(np.zeros(count - 2))
    solution, *_ = np.linalg.lstsq(np.vstack(blocks), np.concatenate(targets), rcond=None)
    return RateCurve(tuple(float(v) for v in np.exp(knots)),
                     tuple(float(v) for v in np.exp(solution)))


def hat_basis(x: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """B[i, j]: weight of knot j in the linear interpolation at x[i] (clamped to the ends)."""
    clamped = np.clip(x, knots[0], knots[-1])
    index = np.clip(np.searchsorted(knots, clamped, side="right") - 1, 0, len(knots) - 2)
    left, right = knots[index], knots[index + 1]
    t = (clamped - left) / (right - left)
    basis = np.zeros((x.size, knots.size))
    rows = np.arange(x.size)
    basis[rows, index] = 1.0 - t
    basis[rows, index + 1] += t
    return basis


def curve_points(curve: RateCurve) -> list[list[float]]:
    """[[size, value], ...] as a profile writes them."""
    return [[float(s), float(v)] for s, v in zip(curve.sizes, curve.rates)]


def relative_misfit(curve: RateCurve, sizes: Sequence[float], values: Sequence[float]
                    ) -> dict[str, float]:
    """Median and max of |curve(size) / value − 1| over the points (how well it fits them)."""
    errors = [abs(curve.at(s) / v - 1.0) for s, v in zip(sizes, values)]
    if not errors:
        return {"median": math.nan, "max": math.nan, "points": 0}
    return {"median": float(np.median(errors)), "max": float(max(errors)), "points": len(errors)}
