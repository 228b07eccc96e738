"""Rich tables for the GPU-plan search (human units only here, at the boundary)."""

from __future__ import annotations

from rich.table import Table

from dnnscale.model.error_band import band_text
from dnnscale.optimize.result import OptimizeResult
from dnnscale.report.tables import add_breakdown_rows, add_value_column
from dnnscale.units import format_seconds


def modern_plan_table(result: OptimizeResult) -> Table:
    best = result.best
    what = "cheapest" if result.objective == "cost" else "fastest"
    table = Table(title=f"The {what} plan for {result.workload} on {result.cluster} within "
                  f"{result.gpus} GPUs, global batch {result.global_batch}",
                  title_justify="left", show_header=False)
    table.add_column("what")
    add_value_column(table)
    table.add_row("plan", best.label())
    table.add_row("GPUs used", f"{best.plan.workers}")
    table.add_row("time per step", format_seconds(best.step_time_s))
    if best.tokens_per_s is not None:
        table.add_row("tokens", f"{best.tokens_per_s:,.0f} tokens/s")
    if best.mfu is not None:
        table.add_row("MFU", f"{100 * best.mfu:.1f} %")
    cost = result.cost_per_step(best)
    if cost is not None:
        table.add_row("cost per step", f"{cost:,.3f} USD")
    table.add_row("bottleneck", best.bottleneck)
    table.add_row("error band", band_text(best.error_band))
    add_breakdown_rows(table, best)
    return table


def modern_top_table(result: OptimizeResult) -> Table:
    table = Table(title=f"Top {len(result.top)} plans", title_justify="left")
    for header in ("#", "plan", "GPUs", "step", "vs best", "MFU", "bottleneck", "error band"):
        table.add_column(header, justify="left" if header in ("plan", "bottleneck") else "right")
    best = result.best.step_time_s
    for rank, p in enumerate(result.top, start=1):
        table.add_row(str(rank), p.label(), str(p.plan.workers), format_seconds(p.step_time_s),
                      f"{p.step_time_s / best:.3f}x",
                      f"{100 * p.mfu:.1f} %" if p.mfu is not None else "-", p.bottleneck,
                      band_text(p.error_band, short=True))
    return table


def modern_curve_table(result: OptimizeResult, pareto: bool) -> Table:
    rows = result.pareto if pareto else [point.prediction for point in result.curve]
    title = ("Pareto front: no other plan is both faster and uses fewer GPUs" if pareto else
             "Scalability curve: the best plan per GPU count")
    table = Table(title=title, title_justify="left")
    for header in ("GPUs", "plan", "step", "speedup"):
        table.add_column(header, justify="left" if header == "plan" else "right")
    first = rows[0].step_time_s if rows else 1.0
    for p in rows:
        table.add_row(str(p.plan.workers), p.label(), format_seconds(p.step_time_s),
                      f"{first / p.step_time_s:.2f}x")
    return table


def engine_lines(result: OptimizeResult) -> list[str]:
    """Which engines run the best plan (plan/engines.py), why the others cannot, and how an
    engine that runs it otherwise than priced differs."""
    engines = result.engines()
    runs = [name for name, why in engines.items() if why is None]
    head = (f"engine: {result.engine} (the search kept to what it runs as priced)"
            if result.engine else
            f"engines that run this plan: {', '.join(runs) if runs else 'none'}")
    lines = [head]
    lines += [f"  - {name} cannot: {why}" for name, why in engines.items() if why is not None]
    for name, notes in result.engine_notes().items():
        if engines[name] is None and name != result.engine:
            lines += [f"  - {name} runs it differently: {note}" for note in notes]
    return lines
