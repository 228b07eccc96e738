"""The scalability curve as a PNG: best predicted epoch time and speedup against machine budget.

matplotlib is imported only when a plot is drawn, with the non-interactive Agg backend, so the
CLI stays fast and works without a display. Both axes are labelled at 1, 2 and 5 × 10^k (not
only the decades); `plot_result_curve` also marks the chosen plan and the budgets where the best
plan changes family.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dnnscale.atomic import atomic_output
from dnnscale.errors import InputError


def _label_125(axis: Any) -> None:
    """Ticks at 1, 2, 5 × 10^k, labelled as plain numbers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_curve(machines: Sequence[int], epoch_time_s: Sequence[float], speedup: Sequence[float],
               path: str | Path, title: str = "Scalability curve",
               changes: Sequence[tuple[int, str]] = (),
               chosen: tuple[int, float, str] | None = None,
               x_label: str = "machine budget M",
               time_label: str = "best predicted epoch time") -> Path:
    """Write a two-panel PNG to `path`: the time (`epoch_time_s`, or any time per budget with
    `time_label`; log-log, in h, min or s as its size asks) and speedup (with the linear ideal
    from the first budget) over the budget. `changes`: (budget, new best plan family) drawn as
    dashed lines, numbered, with a key below; `chosen`: (budget used, seconds, label) of the
    chosen plan, ringed. Returns the path written.

    Raises InputError (field 'plot') when the curve is empty or the file cannot be written.
    """
    if not machines or not (len(machines) == len(epoch_time_s) == len(speedup)):
        raise InputError("plot", "no scalability curve to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    key = ""
    if changes:
        key = "best plan changes — " + "; ".join(
            f"{i}: from {b}, {f}" for i, (b, f) in enumerate(changes[:24], 1))
        if len(changes) > 24:
            key += f"; … {len(changes) - 24} more"
    key_lines = -(-len(key) // 190)  # about 190 characters of 7-point text per 11-inch line
    key_in = 0.12 + 0.13 * key_lines if key else 0.0
    figure, (time_axis, speedup_axis) = plt.subplots(1, 2, figsize=(11, 4.2 + key_in))
    try:
        longest = max(epoch_time_s)
        unit, factor = next((u, f) for u, f in (("d", 86400.0), ("h", 3600.0), ("min", 60.0),
                                                ("s", 1.0)) if longest >= 2 * f or f == 1.0)
        scaled = [seconds / factor for seconds in epoch_time_s]
        time_axis.plot(machines, scaled, marker="." if len(machines) < 60 else None,
                       color="tab:blue")
        time_axis.set_xscale("log")
        time_axis.set_yscale("log")
        time_axis.set_xlabel(x_label)
        time_axis.set_ylabel(f"{time_label} ({unit})")
        time_axis.grid(True, which="both", alpha=0.3)
        first = machines[0]
        speedup_axis.plot(machines, speedup, color="tab:orange", label="best configuration")
        speedup_axis.plot(machines, [m / first for m in machines], color="grey", linestyle="--",
                          label=f"linear (from {first})")
        speedup_axis.set_xscale("log")
        speedup_axis.set_yscale("log")
        speedup_axis.set_xlabel(x_label)
        speedup_axis.set_ylabel(f"speedup over {first}")
        speedup_axis.grid(True, which="both", alpha=0.3)
        for axis in (time_axis, speedup_axis):
            _label_125(axis.xaxis)
            _label_125(axis.yaxis)
        for index, (budget, _family) in enumerate(changes, start=1):
            for axis in (time_axis, speedup_axis):
                axis.axvline(budget, color="0.55", linestyle=":", linewidth=0.9)
            time_axis.annotate(str(index), (budget, 1.0), xycoords=("data", "axes fraction"),
                               xytext=(0, 3), textcoords="offset points", ha="center",
                               fontsize=7, color="0.35")
        if chosen is not None:
            budget, seconds, label = chosen
            time_axis.plot([budget], [seconds / factor], "o", markersize=11, markerfacecolor="none",
                           markeredgecolor="tab:red", markeredgewidth=2, label=f"chosen: {label}")
            time_axis.legend(loc="upper right", fontsize=8)
        speedup_axis.legend(loc="upper left")
        if key:
            figure.text(0.01, 0.04 / (4.2 + key_in), key, fontsize=7, wrap=True, va="bottom")
        figure.suptitle(title)
        figure.tight_layout(rect=(0, key_in / (4.2 + key_in), 1, 1))
        with atomic_output(out, "--plot") as temporary:  # an existing plot stays until done
            try:
                figure.savefig(temporary, format="png", dpi=110)
            except OSError as exc:
                raise InputError("--plot", f"cannot write {str(out)!r}: "
                                 f"{exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return out


def plot_result_curve(result: Any, path: str | Path) -> Path:
    """`plot_curve` of an OptimizeResult, with its change points and its chosen plan."""
    from dnnscale.report.pages import change_points

    best = result.best
    return plot_curve([p.machines for p in result.curve], [p.epoch_time_s for p in result.curve],
                      [p.speedup for p in result.curve], path,
                      title=f"{result.workload} on {result.cluster}: best predicted "
                      f"configuration per budget", changes=change_points([(p.machines, p.prediction) for p in result.curve]),
                      chosen=(best.plan.machines, best.epoch_time_s, best.label()))
