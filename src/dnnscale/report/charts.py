"""The report's charts as inline SVG: the step's parts, the timeline, memory, the scalability
curve and predicted vs measured. Each chart is a pure function from the model's records to an
SVG string; elements carry classes (`seg`, `mem-part`, `curve-line`, ...) a test can look for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from dnnscale.model.prediction import Prediction
from dnnscale.model.records import Part
from dnnscale.report.explain import activities, human, memory_rows, memory_text, part_text
from dnnscale.report.svg import (LinearScale, LogScale, attrs, duration_label, duration_ticks,
                                 line, number_label, rect, seconds_ticks, svg, text)
from dnnscale.report.timeline import Timeline
from dnnscale.units import format_seconds, format_si

COLORS: dict[str, str] = {
    Part.FORWARD: "#4c78a8", "backward": "#3f8f8a", Part.INPUT_GRAD: "#72b7b2",
    Part.WEIGHT_GRAD: "#54a24b", Part.RECOMPUTE: "#9d755d", Part.GRAD_ACCUMULATION: "#8cd17d",
    Part.PARTITION_COMM: "#f58518", Part.TP_COMM: "#f58518", Part.PP_COMM: "#e45756",
    Part.EP_COMM: "#17becf", Part.CP_COMM: "#bcbd22",
    Part.PS_PUSH: "#f58518", Part.PS_PULL: "#ff9d4d", Part.ALLREDUCE: "#e45756",
    Part.DP_COMM: "#b279a2", Part.PS_SERVE_WAIT: "#bab0ac", Part.PS_WAIT: "#8c8c8c",
    Part.LAUNCH_WAIT: "#d0d0d0", Part.SLOWEST_DEVICE: "#c7c7c7", Part.BUBBLE: "#e8e8e8",
    Part.PS_APPLY: "#eeca3b", Part.UPDATE: "#eeca3b", Part.OPTIMIZER_STEP: "#eeca3b",
    Part.EXCHANGE_CPU: "#d8b32a",
    "weights": "#4c78a8", "gradients": "#72b7b2", "optimizer_state": "#f58518",
    "activations": "#54a24b", "loss": "#9d755d", "reserve": "#bab0ac",
    "ps_weights": "#4c78a8", "ps_optimizer_state": "#f58518",
}
CHAR_W = 7.0
"""Pixels a character of the charts' 12 px labels takes at most (digits and lower case), for
keeping labels apart."""
SERIES_COLORS = ("#1f4e79", "#f58518", "#54a24b", "#e45756", "#b279a2", "#9d755d")


def color(name: str) -> str:
    return COLORS.get(name, "#999999")


def _legend(names: Sequence[str], y: float, width: float) -> tuple[list[str], float]:
    """Swatches with names, wrapped to `width`; returns the elements and the height used."""
    body, x, row = [], 10.0, 0
    for name in names:
        label = human(name)
        span = 30 + 7.5 * len(label)
        if x + span > width and x > 10:
            x, row = 10.0, row + 1
        top = y + row * 18
        body.append(rect(x, top, 12, 12, color(name), part_text(name) if name in COLORS else "",
                         class_="legend-swatch"))
        body.append(text(x + 16, top + 10, label, class_="legend-label"))
        x += span
    return body, (row + 1) * 18


def step_bar_svg(prediction: Prediction, width: int = 1000) -> str:
    """The step as one bar divided into its activities, each as wide as its seconds."""
    parts = [part for part in activities(prediction) if part.seconds > 0]
    total = sum(part.seconds for part in parts) or 1.0
    scale = LinearScale(0.0, total, 10, width - 10)
    body = []
    for part in parts:
        x0 = scale(sum(p.seconds for p in parts[:parts.index(part)]))
        share = part.seconds / prediction.step_time_s
        body.append(rect(x0, 10, scale(part.seconds) - 10, 34, color(part.name),
                         f"{human(part.name)}: {format_seconds(part.seconds)} "
                         f"({100 * share:.1f} % of the step) — {part_text(part.name)}",
                         class_="step-part", data_part=part.name))
        if scale(part.seconds) - 10 > 60:
            body.append(text(x0 + 4, 31, f"{human(part.name)} {100 * share:.0f} %",
                             fill="#fff" if part.name not in (
                                 Part.BUBBLE, Part.LAUNCH_WAIT, Part.SLOWEST_DEVICE) else "#333",
                             class_="bar-label"))
    legend, used = _legend([part.name for part in parts], 54, width)
    return svg(width, 60 + used, body + legend, class_="chart step-bar", **_font())


def _font() -> dict[str, str]:
    return {"font_family": "system-ui, sans-serif", "font_size": "12"}


def _time_axis(scale: LinearScale, y: float, height: float) -> list[str]:
    body = []
    for tick, label in seconds_ticks(scale.lo, scale.hi, 8):
        x = scale(tick)
        body.append(line(x, y, x, y + height, stroke="#ddd"))
        body.append(text(x, y + height + 14, label, text_anchor="middle", class_="tick"))
    return body


LANE_LABEL_W = 400
"""Pixels a timeline's lane labels take at most; a longer label is set on two lines."""


def _lane_label(x: float, y: float, lane_h: float, label: str, fits: int) -> str:
    """A lane's label right-aligned at x, on one line when it has at most `fits` characters,
    else on two, split at the space nearest its middle (the text content stays the label)."""
    if len(label) <= fits or " " not in label:
        return text(x, y + lane_h / 2 + 4, label, text_anchor="end", class_="lane-label")
    spaces = [i for i, char in enumerate(label) if char == " "]
    cut = min(spaces, key=lambda i: abs(i - len(label) / 2)) + 1
    lines = (label[:cut], label[cut:])
    where = attrs(x=x, y=y + lane_h / 2 - 2, text_anchor="end", class_="lane-label",
                  font_size="11")
    return (f"<text{where}>"
            + "".join(f'<tspan{attrs(x=x, dy="0" if i == 0 else "12")}>{escape(part)}</tspan>'
                      for i, part in enumerate(lines)) + "</text>")


def timeline_svg(timeline: Timeline, width: int = 1100,
                 window: tuple[float, float] | None = None) -> str:
    """Lanes of segments over one step (or the `window` of it); marks as dashed lines; a
    legend of the part names. Gaps in a lane are idle time."""
    longest = max((len(lane) for lane in timeline.lanes), default=10)
    label_w = min(LANE_LABEL_W, max(150, round(CHAR_W * longest) + 12))
    fits = int((label_w - 12) / CHAR_W)
    lane_h, gap, top = 26, 6, 10
    height = top + len(timeline.lanes) * (lane_h + gap)
    t0, t1 = window if window is not None else (0.0, max(timeline.end_s, 1e-12))
    scale = LinearScale(t0, t1, label_w, width - 20)
    body = _time_axis(scale, top, height - top)
    for index, lane in enumerate(timeline.lanes):
        y = top + index * (lane_h + gap)
        body.append(rect(label_w, y, width - 20 - label_w, lane_h, "#f3f3f3", "idle",
                         class_="lane"))
        body.append(_lane_label(label_w - 6, y, lane_h, lane, fits))
    names: list[str] = []
    for segment in timeline.segments:
        start, end = max(segment.start_s, t0), min(segment.start_s + segment.seconds, t1)
        if end <= start:
            continue
        y = top + segment.lane * (lane_h + gap)
        x0, x1 = scale(start), scale(end)
        if segment.pieces and x1 - x0 >= 4 * len(segment.pieces):
            x = scale(segment.start_s)
            for name, seconds in segment.pieces:
                piece_w = seconds / (t1 - t0) * (width - 20 - label_w)
                left, right = max(x, x0), min(x + piece_w, x1)
                if right > left:
                    body.append(rect(left, y, right - left, lane_h, color(name), segment.label,
                                     class_="seg", data_part=name))
                    names.append(name)
                x += piece_w
        else:
            body.append(rect(x0, y, x1 - x0, lane_h, color(segment.name), segment.label,
                             class_="seg", data_part=segment.name))
            names.append(segment.name)
    for seconds, label in timeline.marks:
        if t0 <= seconds <= t1:
            x = scale(seconds)
            body.append(line(x, top - 4, x, height, stroke="#333", stroke_dasharray="4 3",
                             class_="mark"))
            body.append(text(x - 3, height + 28, label, text_anchor="end",
                             class_="mark-label"))
    if t0 <= timeline.step_s <= t1 * (1 + 1e-9):
        step_x = scale(timeline.step_s)
        body.append(line(step_x, top - 4, step_x, height, stroke="#c00", stroke_width=1.5,
                         class_="step-end"))
        body.append(text(step_x, height + 42, f"step ends: {format_seconds(timeline.step_s)}",
                         text_anchor="end", fill="#c00", class_="mark-label"))
    unique = list(dict.fromkeys(names))
    legend, used = _legend(unique, height + 52, width)
    return svg(width, height + 58 + used, body + legend, class_="chart timeline", **_font())


def memory_svg(prediction: Prediction, width: int = 1000) -> str:
    """One bar per device shown (each stage's on an accelerator pipeline, else each role's),
    stacked by memory part, against the device's capacity: a red line over its role's bars,
    its label in the band above the first of them; each bar's total right of the bar, moved
    past the capacity line where it would cross it."""
    rows = memory_rows(prediction)
    capacity = prediction.memory_capacity_bytes
    top_bytes = max([row.bytes for row in rows] + [capacity.get(row.role, 0.0) for row in rows]
                    + [1.0])
    label_w, bar_h, band = 150, 26, 16
    room = 10 * CHAR_W  # right of the largest bar or line: a total label
    scale = LinearScale(0.0, top_bytes, label_w, width - 20 - room)
    pitch = band + bar_h + 4
    height = 6 + len(rows) * pitch
    body = []
    for tick in scale.ticks(6):
        x = scale(tick)
        body.append(line(x, 6, x, height, stroke="#e4e4e4"))
        body.append(text(x, height + 14, format_si(tick, "B") if tick else "0",
                         text_anchor="middle", class_="tick"))
    names = []
    first_of_role: dict[str, int] = {}
    last_of_role: dict[str, int] = {}
    for index, row in enumerate(rows):
        first_of_role.setdefault(row.role, index)
        last_of_role[row.role] = index
    for index, row in enumerate(rows):
        y = 6 + index * pitch + band
        body.append(text(label_w - 6, y + bar_h / 2 + 4, row.label, text_anchor="end",
                         class_="lane-label", font_weight="600" if row.fullest else None))
        x = float(label_w)
        for part in row.parts:
            w = scale(part.bytes) - label_w
            body.append(rect(x, y, w, bar_h, color(part.name),
                             f"{row.label}, {human(part.name)}: {format_si(part.bytes, 'B')} "
                             f"({100 * part.bytes / row.bytes if row.bytes else 0:.1f} %) — "
                             f"{memory_text(part.name)}", class_="mem-part",
                             data_part=part.name))
            x += w
            names.append(part.name)
        total = format_si(row.bytes, "B")
        tx = x + 4
        if row.role in capacity:
            cx = scale(capacity[row.role])
            if x < cx and tx + CHAR_W * len(total) > cx - 2:
                tx = cx + 4  # the label would cross the capacity line: put it past the line
        body.append(text(tx, y + bar_h / 2 + 4, total, class_="bar-total"))
    for role, index in first_of_role.items():
        if role not in capacity:
            continue
        cx = scale(capacity[role])
        top = 6 + index * pitch + band
        bottom = 6 + last_of_role[role] * pitch + band + bar_h
        body.append(line(cx, top - 3, cx, bottom + 3, stroke="#c00", stroke_width=2,
                         class_="capacity"))
        label = f"capacity {format_si(capacity[role], 'B')}"
        fits_left = cx - 4 - CHAR_W * len(label) >= 4
        body.append(text(cx - 4 if fits_left else cx + 4, top - 5, label,
                         text_anchor="end" if fits_left else "start", fill="#c00",
                         class_="tick capacity-label"))
    legend, used = _legend(list(dict.fromkeys(names)), height + 24, width)
    return svg(width, height + 30 + used, body + legend, class_="chart memory", **_font())


@dataclass(frozen=True)
class CurveSeries:
    """One line of the scalability chart: (budget, epoch seconds, plan label) per point."""

    name: str
    points: tuple[tuple[int, float, str], ...]


def _log_axes(x: LogScale, y: LogScale, x_label: str, y_label: str, y_format: object,
              plot: tuple[float, float, float, float],
              x_values: Sequence[float] = ()) -> list[str]:
    """Frame, grid and labels; `x_values`, when given, are the labelled x ticks (a curve's own
    budgets where they are few)."""
    left, top, right, bottom = plot
    body = [rect(left, top, right - left, bottom - top, "#fcfcfc", stroke="#bbb")]
    labelled, minor = (list(x_values), []) if x_values else x.ticks()
    for value in minor:
        body.append(line(x(value), top, x(value), bottom, stroke="#f0f0f0"))
    for value in labelled:
        body.append(line(x(value), top, x(value), bottom, stroke="#ddd"))
        at_corner = x(value) - left < 12  # centred, it would meet the lowest y label
        body.append(text(x(value) - 3 if at_corner else x(value), bottom + 15,
                         number_label(value), text_anchor="start" if at_corner else "middle",
                         class_="tick"))
    if y_format is format_seconds:
        labelled, minor = duration_ticks(y.lo, y.hi), []
        y_format = duration_label
    else:
        labelled, minor = y.ticks()
    for value in minor:
        body.append(line(left, y(value), right, y(value), stroke="#f0f0f0"))
    for value in labelled:
        body.append(line(left, y(value), right, y(value), stroke="#ddd"))
        label = y_format(value)  # type: ignore[operator]
        body.append(text(left - 6, y(value) + 4, label, text_anchor="end", class_="tick"))
    body.append(text((left + right) / 2, bottom + 34, x_label, text_anchor="middle",
                     class_="axis-label"))
    body.append(text(12, (top + bottom) / 2, y_label, text_anchor="middle",
                     transform=f"rotate(-90 12 {(top + bottom) / 2:.0f})", class_="axis-label"))
    return body


def curve_svg(series: Sequence[CurveSeries], chosen: tuple[int, float, str] | None,
              changes: Sequence[tuple[int, str]], width: int = 1000, height: int = 420,
              x_label: str = "machine budget", y_label: str = "best predicted epoch time") -> str:
    """Best predicted epoch time per machine budget (log-log), one line per series; the chosen
    plan as a ring with its label; each budget where the best plan's family changes as a
    dashed line labelled with the new family."""
    points = [pt for s in series for pt in s.points]
    if not points:
        return svg(width, 40, [text(10, 24, "no scalability curve")], class_="chart curve")
    plot = (84.0, 24.0, width - 20.0, height - 50.0)
    x = LogScale(min(p[0] for p in points), max(p[0] for p in points) * 1.02, plot[0], plot[2])
    y = LogScale(min(p[1] for p in points) / 1.15, max(p[1] for p in points) * 1.15, plot[3],
                 plot[1])
    budgets = sorted({p[0] for p in points})
    body = _log_axes(x, y, x_label, y_label, format_seconds, plot,
                     budgets if len(budgets) <= 12 else ())
    last_label_end = -1e9
    for index, (budget, family) in enumerate(changes):
        cx = x(budget)
        body.append(line(cx, plot[1], cx, plot[3], stroke="#888", stroke_dasharray="3 3",
                         class_="change-point"))
        body.append(text(cx, plot[1] - 4, str(index + 1), text_anchor="middle",
                         class_="change-index", fill="#555"))
        room = (x(changes[index + 1][0]) if index + 1 < len(changes) else plot[2]) - cx
        if cx > last_label_end and room > 6.5 * len(family):
            body.append(text(cx + 3, plot[1] + 14, family, class_="change-label", fill="#555"))
            last_label_end = cx + 6.5 * len(family)
    for index, item in enumerate(series):
        stroke = SERIES_COLORS[index % len(SERIES_COLORS)]
        overall = index == 0 and len(series) > 1
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(b):.1f},{y(t):.1f}"
                        for i, (b, t, _) in enumerate(item.points))
        body.append(f'<path d="{path}" fill="none" stroke="{stroke}" '
                    f'stroke-width="{7 if overall else 2}" '
                    f'stroke-opacity="{0.3 if overall else 1}" stroke-linejoin="round" '
                    f'class="curve-line" data-series="{item.name}"/>')
        if len(item.points) <= 150 and not overall:
            for budget, seconds, label in item.points:
                body.append(f'<circle cx="{x(budget):.1f}" cy="{y(seconds):.1f}" r="2.5" '
                            f'fill="{stroke}" class="curve-point"><title>{item.name}, '
                            f'{x_label} {budget}: {format_seconds(seconds)} with '
                            f'{label}</title></circle>')
        body.append(rect(plot[2] - 230, plot[1] + 24 + 18 * index, 14, 7 if overall else 3,
                         stroke, fill_opacity=0.3 if overall else None))
        body.append(text(plot[2] - 210, plot[1] + 31 + 18 * index, item.name,
                         class_="legend-label"))
    if chosen is not None:
        budget, seconds, label = chosen
        cx, cy = x(budget), y(seconds)
        body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="7" fill="none" stroke="#c00" '
                    f'stroke-width="2.5" class="chosen"><title>chosen: {label}</title></circle>')
        body.append(text(cx - 10, cy - 12, f"chosen: {label}", text_anchor="end", fill="#c00",
                         class_="chosen-label"))
    return svg(width, height, body, class_="chart curve", **_font())


@dataclass(frozen=True)
class ScatterPoint:
    """One validated configuration: measured and predicted throughput, label, outlier or not."""

    label: str
    measured: float
    predicted: float
    group: str
    outlier: bool = False


def scatter_svg(points: Sequence[ScatterPoint], title_unit: str = "samples/s",
                width: int = 640, height: int = 560) -> str:
    """Predicted against measured (log-log) with the exact line and a ±10 % band; outliers
    labelled."""
    if not points:
        return svg(width, 40, [text(10, 24, "no validated configurations")], class_="chart scatter")
    values = [v for p in points for v in (p.measured, p.predicted)]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    plot = (84.0, 20.0, width - 20.0, height - 50.0)
    x, y = LogScale(lo, hi, plot[0], plot[2]), LogScale(lo, hi, plot[3], plot[1])
    body = _log_axes(x, y, f"measured {title_unit}", f"predicted {title_unit}", number_label, plot)
    band = (f"M{x(lo):.1f},{y(lo * 0.9):.1f} L{x(hi):.1f},{y(hi * 0.9):.1f} "
            f"L{x(hi):.1f},{y(hi * 1.1):.1f} L{x(lo):.1f},{y(lo * 1.1):.1f} Z")
    body.append(f'<path d="{band}" fill="#888" fill-opacity="0.12" class="band">'
                "<title>±10 %</title></path>")
    body.append(line(x(lo), y(lo), x(hi), y(hi), stroke="#333", stroke_dasharray="5 4",
                     class_="exact"))
    groups = list(dict.fromkeys(p.group for p in points))
    for point in points:
        stroke = SERIES_COLORS[groups.index(point.group) % len(SERIES_COLORS)]
        error = point.predicted / point.measured - 1
        cx, cy = x(point.measured), y(point.predicted)
        body.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{5 if point.outlier else 4}" '
                    f'fill="{stroke}" fill-opacity="0.8" stroke="{"#c00" if point.outlier else "none"}" '
                    f'class="scatter-point{" outlier" if point.outlier else ""}"><title>'
                    f'{point.label}: measured {point.measured:,.1f}, predicted '
                    f'{point.predicted:,.1f} ({100 * error:+.1f} %)</title></circle>')
        if point.outlier:
            body.append(text(cx + 7, cy - 6, f"{point.label} ({100 * error:+.0f} %)",
                             class_="outlier-label", fill="#c00"))
    for index, group in enumerate(groups):
        stroke = SERIES_COLORS[index % len(SERIES_COLORS)]
        body.append(f'<circle cx="{plot[0] + 16:.1f}" cy="{plot[1] + 14 + 18 * index:.1f}" r="4" '
                    f'fill="{stroke}"/>')
        body.append(text(plot[0] + 26, plot[1] + 18 + 18 * index, group, class_="legend-label"))
    return svg(width, height, body, class_="chart scatter", **_font())


def bars_svg(values: Sequence[tuple[str, float]], width: int = 1000) -> str:
    """Horizontal bars of fractions in [0, 1] (utilisation), one per name."""
    label_w, bar_h = 190, 16
    scale = LinearScale(0.0, 1.0, label_w, width - 80)
    body = []
    for index, (name, value) in enumerate(values):
        y = 6 + index * (bar_h + 6)
        body.append(text(label_w - 6, y + 12, human(name), text_anchor="end", class_="lane-label"))
        body.append(rect(label_w, y, scale(1.0) - label_w, bar_h, "#f0f0f0"))
        shown = min(max(value, 0.0), 1.0)
        body.append(rect(label_w, y, scale(shown) - label_w, bar_h,
                         "#c0392b" if value >= 0.99 else "#4c78a8", f"{100 * value:.1f} %",
                         class_="util-bar", data_part=name))
        body.append(text(scale(shown) + 4, y + 12, f"{100 * value:.1f} %", class_="tick"))
    return svg(width, 12 + len(values) * (bar_h + 6), body, class_="chart utilization", **_font())
