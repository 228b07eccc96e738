"""Size-dependent achieved rates: a piecewise log-log linear curve, clamped at both ends.

Small matrices run far below peak, so a compute rate is a curve of (work size, achieved rate)
points rather than one scalar. `RateCurve.at(size)` interpolates linearly in (log size, log rate)
between points and holds the end values outside them. A single point is a constant rate.
`RateCurve.saturating` samples the usual latency-bandwidth form of a kernel's efficiency.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass


POINTS_PER_DECADE = 4
"""Knots per decade of a sampled saturating curve (calibrate/gpu_curves.py bounds the log-log
interpolation error of 4 per decade)."""


def saturating(size: float, peak_fraction: float, half_size: float) -> float:
    """η(x) = η_max · x / (x + x_½): a kernel's achieved fraction of peak rises with its size x
    and saturates at η_max; at x = x_½ it is half of it. Equivalent to a fixed start-up cost of
    x_½ / (peak · η_max) seconds plus x / (peak · η_max) — small kernels cannot fill the device.
    Source: the usual latency-bandwidth form of kernel throughput (Hockney 1994), as Calculon
    and Paleo use it for per-size efficiency."""
    return peak_fraction * size / (size + half_size)


@dataclass(frozen=True)
class RateCurve:
    """Achieved rate (e.g. FLOP/s per core) as a function of work size (e.g. FLOP per call)."""

    sizes: tuple[float, ...]
    rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.rates):
            raise ValueError("a rate curve needs as many sizes as rates, at least one")
        if any(b <= a for a, b in zip(self.sizes, self.sizes[1:])):
            raise ValueError("rate-curve sizes must be strictly increasing")
        if any(not (r > 0 and math.isfinite(r)) for r in self.rates) or any(
                not (s > 0 and math.isfinite(s)) for s in self.sizes):
            raise ValueError("rate-curve sizes and rates must be finite and > 0")

    @classmethod
    def constant(cls, rate: float) -> "RateCurve":
        return cls((1.0,), (float(rate),))

    @classmethod
    def saturating(cls, peak_fraction: float, half_size: float, first: float,
                   last: float) -> "RateCurve":
        """`saturating` sampled from `first` to `last`, POINTS_PER_DECADE points per decade
        (held at its end values outside them)."""
        decades = math.log10(last / first)
        count = max(2, int(round(decades * POINTS_PER_DECADE)) + 1)
        sizes = tuple(first * 10 ** (decades * i / (count - 1)) for i in range(count))
        return cls(sizes, tuple(saturating(x, peak_fraction, half_size) for x in sizes))

    def at(self, size: float) -> float:
        """Rate at `size`, log-log interpolated, clamped outside the measured range."""
        sizes, rates = self.sizes, self.rates
        if size <= sizes[0]:
            return rates[0]
        if size >= sizes[-1]:
            return rates[-1]
        i = bisect_left(sizes, size)
        x0, x1 = math.log(sizes[i - 1]), math.log(sizes[i])
        y0, y1 = math.log(rates[i - 1]), math.log(rates[i])
        t = (math.log(size) - x0) / (x1 - x0)
        return math.exp(y0 + t * (y1 - y0))

    def scaled(self, factor: float) -> "RateCurve":
        return RateCurve(self.sizes, tuple(rate * factor for rate in self.rates))

    @property
    def peak(self) -> float:
        return max(self.rates)
