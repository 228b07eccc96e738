"""Rich tables for `dnnscale optimize` (human units only here, at the boundary)."""

from __future__ import annotations

from rich.table import Table

from dnnscale.model.error_band import band_text
from dnnscale.model.prediction import Prediction
from dnnscale.optimize.result import CurvePoint, OptimizeResult, describe_config
from dnnscale.report.tables import add_breakdown_rows, add_value_column
from dnnscale.units import format_seconds


def _config_cell(prediction: Prediction) -> str:
    return describe_config(prediction.config)


def plan_table(result: OptimizeResult) -> Table:
    """The best configuration: what it is, how fast, where the time goes, why it wins."""
    best = result.best
    cfg = best.config
    title = (f"Fastest plan for {result.workload} on {result.cluster} within "
             f"{result.machines} machines")
    table = Table(title=title, title_justify="left", show_header=False, min_width=len(title))
    table.add_column("what")
    add_value_column(table)
    table.add_row("configuration", _config_cell(best))
    table.add_row("machines used", f"{cfg.machines} ({cfg.workers} workers"
                  + (f" + {cfg.ps_shards} PS)" if cfg.uses_ps else ")"))
    table.add_row("time per step", format_seconds(best.step_time_s))
    table.add_row("time per epoch", format_seconds(best.epoch_time_s))
    table.add_row("throughput", f"{best.throughput_samples_per_s:,.1f} samples/s")
    table.add_row("bottleneck", best.bottleneck)
    table.add_row("error band", band_text(best.error_band))
    add_breakdown_rows(table, best)
    return table


def top_table(result: OptimizeResult) -> Table:
    """The best configuration of each of the K best groups (mode, P, n, intervals)."""
    title = (f"Top {len(result.top)} plans, best first (each the best R and S of its sync "
             f"mode, P, n and intervals)")
    table = Table(title=title, title_justify="left", min_width=len(title))
    for header in ("#", "configuration", "used", "step", "epoch", "vs best", "bottleneck",
                   "error band"):
        table.add_column(header, justify="left" if header in ("configuration", "bottleneck")
                         else "right")
    best = result.best.epoch_time_s
    for rank, prediction in enumerate(result.top, start=1):
        table.add_row(str(rank), _config_cell(prediction), str(prediction.config.machines),
                      format_seconds(prediction.step_time_s),
                      format_seconds(prediction.epoch_time_s),
                      f"{prediction.epoch_time_s / best:.3f}x", prediction.bottleneck,
                      band_text(prediction.error_band, short=True))
    return table


def _shown(points: list[CurvePoint], full: bool) -> list[CurvePoint]:
    """Every point when `full`, else budgets 1, 2, 5, 10, 20, 50, ... and powers of two, plus the
    first and the last."""
    if full or len(points) <= 24:
        return points
    marks = set()
    scale = 1
    while scale <= points[-1].machines:
        marks.update({scale, 2 * scale, 5 * scale})
        scale *= 10
    power = 1
    while power <= points[-1].machines:
        marks.add(power)
        power *= 2
    return [p for i, p in enumerate(points)
            if i == 0 or i == len(points) - 1 or p.machines in marks]


def curve_table(result: OptimizeResult, full: bool = False) -> Table:
    """The scalability curve: best predicted epoch time and speedup per machine budget."""
    points = _shown(result.curve, full)
    first = result.curve[0].machines if result.curve else 1
    title = (f"Scalability curve (speedup over {first} machine{'s' if first > 1 else ''}, "
             f"the smallest feasible budget)")
    table = Table(title=title, title_justify="left", min_width=len(title))
    for header in ("budget", "epoch", "speedup", "best configuration", "used"):
        table.add_column(header, justify="left" if header == "best configuration" else "right")
    for point in points:
        prediction = point.prediction
        table.add_row(str(point.machines), format_seconds(point.epoch_time_s),
                      f"{point.speedup:.2f}x", _config_cell(prediction),
                      str(prediction.config.machines))
    if len(points) < len(result.curve):
        table.caption = (f"{len(points)} of {len(result.curve)} budgets shown; --full-curve or "
                         f"--json for all")
    return table
