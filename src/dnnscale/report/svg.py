"""A few SVG primitives and axis scales for the HTML report's charts (no dependencies).

Charts are inline SVG written by dnnscale itself: the page needs no script or network to show
them, a browser draws them crisply at any zoom, their text is searchable, and a test can find
each element by its class. Tooltips are SVG <title> elements, which every browser shows on
hover without JavaScript.
"""

from __future__ import annotations

import math
from html import escape


def attrs(**values: object) -> str:
    """' x="1" class="a"' from keyword arguments (class_ -> class, data_part -> data-part);
    None values are left out."""
    out = []
    for key, value in values.items():
        if value is None:
            continue
        name = key.rstrip("_").replace("_", "-")
        if isinstance(value, float):
            value = f"{value:.2f}".rstrip("0").rstrip(".")
        out.append(f' {name}="{escape(str(value), quote=True)}"')
    return "".join(out)


def rect(x: float, y: float, width: float, height: float, fill: str, title: str = "",
         **extra: object) -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    return (f"<rect{attrs(x=x, y=y, width=max(width, 0.0), height=height, fill=fill, **extra)}>"
            f"{tip}</rect>")


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = "#444", **extra: object) -> str:
    return f"<line{attrs(x1=x1, y1=y1, x2=x2, y2=y2, stroke=stroke, **extra)}/>"


def text(x: float, y: float, content: str, **extra: object) -> str:
    return f"<text{attrs(x=x, y=y, **extra)}>{escape(content)}</text>"


def svg(width: float, height: float, body: list[str], **extra: object) -> str:
    return (f"<svg xmlns=\"http://www.w3.org/2000/svg\"{attrs(width=width, height=height, **extra)}"
            f" viewBox=\"0 0 {width:.0f} {height:.0f}\" role=\"img\">" + "".join(body) + "</svg>")


class LinearScale:
    """Maps [lo, hi] to [a, b] pixels."""

    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi if hi > lo else lo + 1.0, a, b

    def __call__(self, value: float) -> float:
        return self.a + (value - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def ticks(self, count: int = 6) -> list[float]:
        """Round values (1, 2 or 5 × 10^k apart) covering [lo, hi]."""
        span = self.hi - self.lo
        raw = span / max(1, count)
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        first = math.ceil(self.lo / step) * step
        values = []
        value = first
        while value <= self.hi + 1e-9 * span:
            values.append(round(value, 12))
            value += step
        return values


class LogScale:
    """Maps [lo, hi] (both > 0) to [a, b] pixels on a log axis."""

    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        lo = max(lo, 1e-300)
        hi = max(hi, lo * 1.0001)
        self.lo, self.hi, self.a, self.b = lo, hi, a, b
        self._span = math.log10(hi) - math.log10(lo)

    def __call__(self, value: float) -> float:
        return self.a + (math.log10(max(value, 1e-300)) - math.log10(self.lo)) / self._span * (
            self.b - self.a)

    def ticks(self) -> tuple[list[float], list[float]]:
        """(labelled, unlabelled) ticks: 1, 2 and 5 × 10^k labelled when the axis spans at most
        three decades, else the decades labelled and 2, 5 × 10^k left as minor ticks."""
        labelled, minor = [], []
        dense = self._span <= 3.2
        for k in range(math.floor(math.log10(self.lo)) - 1, math.ceil(math.log10(self.hi)) + 1):
            for m in (1, 2, 5) if dense else (1, 2, 3, 4, 5, 6, 7, 8, 9):
                value = m * 10.0 ** k
                if self.lo * 0.999 <= value <= self.hi * 1.001:
                    (labelled if m == 1 or dense else minor).append(value)
        if len(labelled) < 2:  # a narrow axis: label its ends too
            labelled = sorted(set(labelled) | {self.lo, self.hi})
        return labelled, minor


NICE_DURATIONS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 3 * 3600,
                    6 * 3600, 12 * 3600, 86400, 2 * 86400, 5 * 86400, 10 * 86400, 20 * 86400,
                    50 * 86400, 100 * 86400, 200 * 86400, 365 * 86400, 730 * 86400,
                    1825 * 86400, 3650 * 86400)
"""Round durations for a log time axis: seconds, minutes, hours, days."""


def duration_ticks(lo: float, hi: float, most: int = 9) -> list[float]:
    """Round durations (1, 2, 5 × 10^k below a second; then 1 min, 1 h, 1 d, ...) within
    [lo, hi], thinned to at most `most` by keeping every other one."""
    below = [m * 10.0 ** k for k in range(-9, 0) for m in (1, 2, 5)]
    values = [v for v in below + list(NICE_DURATIONS_S) if lo * 0.999 <= v <= hi * 1.001]
    while len(values) > most:
        values = values[::2]
    if len(values) < 2:
        values = sorted(set(values) | {lo, hi})
    return [float(v) for v in values]


TIME_UNITS = ((2 * 86400.0, 86400.0, "d"), (2 * 3600.0, 3600.0, "h"), (300.0, 60.0, "min"),
              (1.0, 1.0, "s"), (1e-3, 1e-3, "ms"), (0.0, 1e-6, "µs"))
"""(from this many seconds, the unit's seconds, its name) for a linear time axis."""


def seconds_ticks(lo: float, hi: float, count: int = 8) -> list[tuple[float, str]]:
    """(seconds, label) of round ticks over [lo, hi] in one unit chosen by hi (s from 1 s,
    min from 5 min, h from 2 h, d from 2 d), with the decimals the spacing needs."""
    _, factor, unit = next(u for u in TIME_UNITS if max(abs(lo), abs(hi)) >= u[0])
    values = LinearScale(lo / factor, hi / factor, 0, 1).ticks(count)
    step = values[1] - values[0] if len(values) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    return [(v * factor, "0" if v == 0 else f"{v:.{decimals}f} {unit}") for v in values]


def duration_label(seconds: float) -> str:
    """A round duration as a tick label: '500 ms', '30 s', '5 min', '12 h', '2 d'."""
    for factor, unit in ((86400.0, "d"), (3600.0, "h"), (60.0, "min"), (1.0, "s"),
                         (1e-3, "ms"), (1e-6, "µs")):
        if seconds >= factor * 0.9999:
            return f"{round(seconds / factor, 3):g} {unit}"
    return f"{seconds:.3g} s"


def number_label(value: float) -> str:
    """A tick label: 1, 20, 500, 2k, 1.5M, 0.01."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= factor:
            return f"{value / factor:g}{suffix}"
    if magnitude >= 1:
        return f"{value:g}"
    return f"{value:.3g}"
