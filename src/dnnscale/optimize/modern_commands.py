"""`dnnscale optimize` for a transformer on a GPU cluster: the search over Megatron-style plans."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any


def _strings(text: str | None, field: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if not items:
        from dnnscale.errors import InputError

        raise InputError(field, f"must be a comma-separated list, got {text!r}")
    return items


def run_modern(workload: Any, cluster: Any, gpus: int | None, global_batch: int | None,
               top: int, tp: str | None, pp: str | None, micro_batch: str | None,
               zero: str | None, recompute: str | None, schedule: str | None, precision: str,
               objective: str, price: float | None, pareto: bool, tokens: float | None,
               plot: Path | None, as_json: bool, quiet: bool = False) -> Any:
    """Search, print (unless `quiet`) and return the ModernResult. workload, cluster: names,
    paths or objects."""
    from dnnscale.errors import InputError, require_positive
    from dnnscale.optimize.modern import make_modern_space, optimize_modern
    from dnnscale.optimize.space import parse_int_list
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    if global_batch is None:
        raise InputError("--global-batch", "required for GPU plans (samples per step)")
    w, c = load_workload(workload), load_system(cluster)
    if price is not None:
        c = replace(c, price_per_device_hour=require_positive("--price", price))
    space = make_modern_space(w, c, global_batch, tensor=parse_int_list(tp, "tp"),
                              pipeline=parse_int_list(pp, "pp"),
                              micro_batch=parse_int_list(micro_batch, "micro_batch"),
                              zero=parse_int_list(zero, "zero", minimum=0),
                              recompute=_strings(recompute, "recompute"),
                              schedules=_strings(schedule, "schedule"), precision=precision)
    result = optimize_modern(w, c, space, gpus=gpus, top=top, objective=objective,
                             pareto=pareto, curve=True)
    data: dict[str, Any] = result.to_dict()
    if tokens is not None and w.transformer is not None:
        steps = require_positive("--tokens", tokens) / (global_batch * w.transformer.seq)
        data["time_to_train_s"] = steps * result.best.step_time_s
        data["tokens"] = tokens
    if plot is not None:
        from dnnscale.report.curve_plot import plot_curve

        plot_curve([p.gpus for p in result.curve], [p.step_time_s for p in result.curve],
                   [p.speedup for p in result.curve], plot,
                   title=f"{result.workload} on {c.name.split(':')[0]}: best plan per GPU count",
                   x_label="GPUs", time_label="best predicted step time")
    if quiet:
        return result
    if as_json:
        from dnnscale.jsonout import print_json

        print_json(data)
        return result
    from dnnscale.optimize.modern_tables import (modern_curve_table, modern_plan_table,
                                                 modern_top_table)
    from dnnscale.report.console import console as make_console
    from dnnscale.units import format_seconds

    console = make_console()
    console.print(modern_plan_table(result))
    console.print("[bold]Why it wins[/bold]")
    for line in result.explanation:
        console.print(f"  - {line}")
    console.print(modern_top_table(result))
    console.print(modern_curve_table(result, pareto))
    if "time_to_train_s" in data:
        console.print(f"time to train {tokens:,.0f} tokens: {format_seconds(data['time_to_train_s'])}")
    for line in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    console.print(f"search: {result.evaluated:,} plans priced, {result.bounds_evaluated:,} group "
                  f"bounds, in {result.search_time_s * 1000:.0f} ms")
    return result
