"""The scalability curve as a PNG: best predicted epoch time and speedup against machine budget.

matplotlib is imported only when a plot is drawn, with the non-interactive Agg backend, so the
CLI stays fast and works without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dnnscale.atomic import atomic_output
from dnnscale.errors import InputError


def plot_curve(machines: Sequence[int], epoch_time_s: Sequence[float], speedup: Sequence[float],
               path: str | Path, title: str = "Scalability curve") -> Path:
    """Write a two-panel PNG to `path`: epoch time (hours, log-log) and speedup (with the linear
    ideal from the first budget) over the machine budget. Returns the path written.

    Raises InputError (field 'plot') when the curve is empty or the file cannot be written.
    """
    if not machines or not (len(machines) == len(epoch_time_s) == len(speedup)):
        raise InputError("plot", "no scalability curve to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    figure, (time_axis, speedup_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    try:
        hours = [seconds / 3600 for seconds in epoch_time_s]
        time_axis.plot(machines, hours, marker="." if len(machines) < 60 else None,
                       color="tab:blue")
        time_axis.set_xscale("log")
        time_axis.set_yscale("log")
        time_axis.set_xlabel("machine budget M")
        time_axis.set_ylabel("best predicted epoch time (h)")
        time_axis.grid(True, which="both", alpha=0.3)
        first = machines[0]
        speedup_axis.plot(machines, speedup, color="tab:orange", label="best configuration")
        speedup_axis.plot(machines, [m / first for m in machines], color="grey", linestyle="--",
                          label=f"linear (from {first} machine{'s' if first > 1 else ''})")
        speedup_axis.set_xscale("log")
        speedup_axis.set_yscale("log")
        speedup_axis.set_xlabel("machine budget M")
        speedup_axis.set_ylabel(f"speedup over {first} machine{'s' if first > 1 else ''}")
        speedup_axis.grid(True, which="both", alpha=0.3)
        speedup_axis.legend(loc="upper left")
        figure.suptitle(title)
        figure.tight_layout()
        with atomic_output(out, "plot") as temporary:  # an existing plot stays until done
            try:
                figure.savefig(temporary, format="png", dpi=110)
            except OSError as exc:
                raise InputError("plot", f"cannot write {str(out)!r}: "
                                 f"{exc.strerror or exc}") from None
    finally:
        plt.close(figure)
    return out
