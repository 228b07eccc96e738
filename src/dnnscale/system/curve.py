"""Size-dependent achieved rates: a piecewise log-log linear curve, clamped at both ends.

Small matrices run far below peak, so a compute rate is a curve of (work size, achieved rate)
points rather than one scalar. `RateCurve.at(size)` interpolates linearly in (log size, log rate)
between points and holds the end values outside them. A single point is a constant rate.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass


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
