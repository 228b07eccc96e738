"""`dnnscale optimize` for a transformer on a GPU cluster: how the GPU space's answer prints
(the search itself is the one entry point, optimize/entry.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dnnscale.optimize.result import OptimizeResult


def strings(text: str | None, field: str) -> tuple[str, ...] | None:
    """'none,full' -> ('none', 'full'); None stays None; an empty list is an InputError."""
    if text is None:
        return None
    items = tuple(part.strip() for part in text.split(",") if part.strip())
    if not items:
        from dnnscale.errors import InputError

        raise InputError(field, f"must be a comma-separated list, got {text!r}")
    return items


SWITCHES = {"on": True, "off": False}


def switches(text: str | None, field: str) -> tuple[bool, ...] | None:
    """'on,off' -> (True, False); 'on' -> (True,); None stays None; anything but on and off
    is an InputError naming `field`."""
    items = strings(text, field)
    if items is None:
        return None
    for item in items:
        if item not in SWITCHES:
            from dnnscale.errors import InputError, short_repr

            raise InputError(field, f"must be on, off or on,off, got {short_repr(item)}")
    return tuple(SWITCHES[item] for item in dict.fromkeys(items))


def print_gpu_result(result: OptimizeResult, workload: Any, tokens: float | None,
                     plot: Path | None, as_json: bool, quiet: bool = False) -> dict[str, Any]:
    """Plot (with `plot`), print (unless `quiet`) and return the JSON of a GPU-space result;
    with `tokens`, also the time to train that many tokens at the best plan's step time."""
    from dnnscale.errors import require_positive

    data: dict[str, Any] = result.to_dict()
    if tokens is not None and workload.transformer is not None and result.global_batch:
        steps = require_positive("--tokens", tokens) / (result.global_batch
                                                        * workload.transformer.seq)
        data["time_to_train_s"] = steps * result.best.step_time_s
        from dnnscale.boundary import MAX_SECONDS
        from dnnscale.errors import InputError

        if data["time_to_train_s"] > MAX_SECONDS:
            raise InputError("--tokens", f"{tokens:.3g} tokens would take "
                             f"{data['time_to_train_s']:.3g} s at the best plan, more than "
                             f"{MAX_SECONDS:.0e} s (some 31,700 years)")
        data["tokens"] = tokens
    if plot is not None:
        from dnnscale.report.curve_plot import plot_curve

        plot_curve([p.gpus for p in result.curve], [p.step_time_s for p in result.curve],
                   [p.speedup for p in result.curve], plot,
                   title=f"{result.workload} on {result.cluster.split(':')[0]}: best plan per "
                         f"GPU count", x_label="GPUs", time_label="best predicted step time")
    if quiet:
        return data
    if as_json:
        from dnnscale.jsonout import print_json

        print_json(data)
        return data
    from dnnscale.optimize.modern_tables import (engine_lines, modern_curve_table,
                                                 modern_plan_table, modern_top_table)
    from dnnscale.report.console import console as make_console
    from dnnscale.units import format_seconds

    console = make_console()
    console.print(modern_plan_table(result))
    console.print("[bold]Why it wins[/bold]")
    for line in result.explanation:
        console.print(f"  - {line}")
    for line in engine_lines(result):
        console.print(line, markup=False, highlight=False)
    console.print(modern_top_table(result))
    console.print(modern_curve_table(result, bool(result.pareto)))
    if "time_to_train_s" in data:
        console.print(f"time to train {tokens:,.0f} tokens: "
                      f"{format_seconds(data['time_to_train_s'])}")
    for line in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {line}")
    console.print(f"search: {result.evaluated:,} plans priced, {result.bounds_evaluated:,} group "
                  f"bounds, in {result.search_time_s * 1000:.0f} ms")
    return data
