"""Assemble a search's report: what the page shows of an OptimizeResult of Adam's space (with
one curve per mode from the same search restricted to that mode) or of the GPU space.
Nothing here re-derives a number: every value is the search's own."""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from typing import Any

from dnnscale.optimize.result import SpaceKind
from dnnscale.report.charts import CurveSeries
from dnnscale.report.page import section, table
from dnnscale.report.pages import SearchView, change_points, search_page
from dnnscale.units import format_seconds


def optimize_report(result: Any, workload: Any, system: Any,
                    rerun: Callable[[str], Any] | None = None) -> str:
    """The HTML of a search's result. For Adam's search, `rerun(mode)` runs the same search for
    one mode, whose curve is drawn beside the overall best when several modes were compared."""
    if result.space is SpaceKind.GPU:
        view = gpu_view(result)
    else:
        curves: dict[str, Any] = {}
        if rerun is not None and len(result.families) > 1:
            curves = {mode: rerun(mode).curve for mode in result.families}
        view = adam_view(result, curves)
    return search_page(view, workload, system)


def _series(name: str, points: list[tuple[int, float, Any]]) -> CurveSeries:
    return CurveSeries(name, tuple((x, y, p.label()) for x, y, p in points))


def adam_view(result: Any, mode_curves: dict[str, Any]) -> SearchView:
    best = result.best
    along = [(p.machines, p.epoch_time_s, p.prediction) for p in result.curve]
    series = [_series("best of all modes", along)]
    series += [_series(f"best {mode}", [(p.machines, p.epoch_time_s, p.prediction)
                                        for p in points])
               for mode, points in mode_curves.items() if points]
    rows = [[rank, p.label(), p.plan.machines, format_seconds(p.step_time_s),
             format_seconds(p.epoch_time_s), f"{p.epoch_time_s / best.epoch_time_s:.3f}x",
             p.bottleneck] for rank, p in enumerate(result.top, start=1)]
    extra = []
    if result.infeasible:
        extra.append(section("infeasible", "Left out", table(
            ["what", "why"], [[item.what, item.reason] for item in result.infeasible])))
    return SearchView(
        title=f"{result.workload} on {result.cluster}: the fastest plan within "
              f"{result.machines} machines",
        best=best, explanation=result.explanation,
        search_note=f"{result.method} search over budgets up to {result.machines} machines: "
                    f"{result.evaluated:,} configurations evaluated in "
                    f"{result.search_time_s * 1000:.0f} ms.",
        series=series,
        chosen=(best.plan.machines, best.epoch_time_s, best.label()) if result.curve else None,
        changes=change_points([(p.machines, p.prediction) for p in result.curve]),
        x_label="machine budget", y_label="best predicted epoch time",
        curve_note="Each point is the fastest plan the optimizer finds within that many "
                   "machines (the model's prediction), overall and for each mode alone. The "
                   "ring marks the chosen plan at the machines it uses; dashed, numbered lines "
                   "mark the budgets where the best plan changes family (mode, P, n, "
                   "intervals).",
        top_headers=["#", "plan", "machines", "step", "epoch", "vs best", "bottleneck"],
        top_rows=rows,
        top_note="Each row is the best replica and shard count of its group (mode, P, n, "
                 "intervals); the groups are ranked by epoch time.",
        extra=extra)


def gpu_view(result: Any) -> SearchView:
    best = result.best
    what = "cheapest" if result.objective == "cost" else "fastest"
    along = [(p.gpus, p.step_time_s, p.prediction) for p in result.curve]
    rows = [[rank, p.label(), p.plan.workers, format_seconds(p.step_time_s),
             f"{p.step_time_s / best.step_time_s:.3f}x",
             "—" if p.mfu is None else f"{100 * p.mfu:.1f} %", p.bottleneck]
            for rank, p in enumerate(result.top, start=1)]
    extra = []
    if result.families:
        extra.append(section("families", "Best plan of each family", table(
            ["family", "plan", "GPUs", "step", "vs chosen"],
            [[name, p.label(), p.plan.workers, format_seconds(p.step_time_s),
              f"{p.step_time_s / best.step_time_s:.2f}x"]
             for name, p in result.families.items()], numeric=(2, 3, 4))))
    if result.pareto:
        extra.append(section("pareto", "Pareto front (no plan is faster with as few GPUs)",
                             table(["plan", "GPUs", "step"],
                                   [[p.label(), p.plan.workers, format_seconds(p.step_time_s)]
                                    for p in result.pareto], numeric=(1, 2))))
    if result.warnings:
        extra.append(section("warnings", "Warnings", "<ul>" + "".join(
            f"<li>{escape(line)}</li>" for line in result.warnings) + "</ul>"))
    return SearchView(
        title=f"{result.workload} on {result.cluster}: the {what} plan within {result.gpus} "
              f"GPUs, global batch {result.global_batch}",
        best=best, explanation=result.explanation,
        search_note=f"{result.method} search: {result.evaluated:,} plans priced, "
                    f"{result.bounds_evaluated:,} group bounds, in "
                    f"{result.search_time_s * 1000:.0f} ms.",
        series=[_series("best plan", along)],
        chosen=(best.plan.workers, best.step_time_s, best.label()) if result.curve else None,
        changes=change_points([(p.gpus, p.prediction) for p in result.curve]),
        x_label="GPUs", y_label="best predicted step time",
        curve_note="Each point is the best plan the search finds within that many GPUs at the "
                   "same global batch (the model's prediction). The ring marks the chosen plan; "
                   "dashed, numbered lines mark the GPU counts where the best plan changes "
                   "family (everything but the data-parallel degree). The best plan of each "
                   "family is listed below at the full budget only.",
        top_headers=["#", "plan", "GPUs", "step", "vs best", "MFU", "bottleneck"],
        top_rows=rows, top_note="Ranked by step time (or cost, with --objective cost).",
        extra=extra)
