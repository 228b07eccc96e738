"""Assemble the optimizer's report: the search's own result plus one curve per mode, each from
the same search restricted to that mode (the model's answers, nothing re-derived here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dnnscale.report.pages import optimize_page


def optimize_report(result: Any, workload: Any, system: Any,
                    rerun: Callable[[str], Any] | None = None) -> str:
    """The HTML of `result`; `rerun(mode)` runs the same search for one mode (its curve is
    drawn beside the overall best) when the search compared several modes."""
    curves: dict[str, Any] = {}
    if rerun is not None and len(result.best_per_mode) > 1:
        for mode in result.best_per_mode:
            curves[mode] = rerun(mode).curve
    return optimize_page(result, workload, system, curves)
