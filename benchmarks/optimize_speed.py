"""How fast the exact optimizer is: fast search vs exhaustive enumeration, and the fast search at
a large budget. adam-imagenet22k on the adam-2014 cluster (sized to the budget), all three sync
modes, minibatch 32, scalability curve included in both methods.

    .venv/bin/python benchmarks/optimize_speed.py   # writes results/optimize_speed.md

Targets (issue 3): the same answer as the exhaustive search at M = 1,000; M = 10,000 in under
1 s (median of 5 runs).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from dnnscale.system import load_system
from dnnscale.plan import max_partitions
from dnnscale.optimize import optimize
from dnnscale.optimize.result import describe_config
from dnnscale.units import format_seconds
from dnnscale.workload import load_workload

WORKLOAD, CLUSTER = "adam-imagenet22k", "adam-2014"
COMPARE_MACHINES = 1_000
LARGE_MACHINES = 10_000
RUNS = 5
TOLERANCE = 1e-9


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _timed(machines: int, method: str):  # noqa: ANN202
    workload = load_workload(WORKLOAD)
    cluster = load_system(CLUSTER).with_machines(machines)
    start = time.perf_counter()
    result = optimize(workload, cluster, machines=machines, method=method)
    return time.perf_counter() - start, result


def main() -> None:
    fast_s, fast = _timed(COMPARE_MACHINES, "fast")
    fast_runs = [fast_s] + [_timed(COMPARE_MACHINES, "fast")[0] for _ in range(RUNS - 1)]
    print(f"fast at M={COMPARE_MACHINES}: {statistics.median(fast_runs):.3f} s", flush=True)
    slow_s, slow = _timed(COMPARE_MACHINES, "exhaustive")
    print(f"exhaustive at M={COMPARE_MACHINES}: {slow_s:.1f} s", flush=True)
    same_best = abs(fast.best.epoch_time_s - slow.best.epoch_time_s) <= \
        TOLERANCE * slow.best.epoch_time_s
    same_config = fast.best.config == slow.best.config
    curve_diff = max(abs(a.epoch_time_s - b.epoch_time_s) / b.epoch_time_s
                     for a, b in zip(fast.curve, slow.curve))
    same_curve = [p.machines for p in fast.curve] == [p.machines for p in slow.curve] and \
        curve_diff <= TOLERANCE
    large_runs = []
    for _ in range(RUNS):
        seconds, large = _timed(LARGE_MACHINES, "fast")
        large_runs.append(seconds)
    large_median = statistics.median(large_runs)
    print(f"fast at M={LARGE_MACHINES}: median {large_median:.3f} s", flush=True)

    fast_median = statistics.median(fast_runs)
    p_max = max_partitions(load_workload(WORKLOAD))
    lines = [
        "# Optimizer speed: fast exact search vs exhaustive enumeration",
        "",
        f"Machine: {platform.node()} ({platform.machine()}, {_cpu()}, {os.cpu_count()} CPUs "
        f"shared with other jobs), Python {platform.python_version()}; date "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.",
        "",
        f"Problem: `{WORKLOAD}` on `{CLUSTER}` sized to the budget M (`cluster.with_machines(M)`); "
        f"sync modes ps-async, ps-sync and allreduce; minibatch 32; P = 1..{p_max} (the "
        f"workload's limit); every R and S with R·P + S ≤ M. Both methods compute the best plan, "
        f"the top 5 and the scalability curve ({len(fast.curve)} budgets at M = "
        f"{COMPARE_MACHINES:,}, {len(large.curve)} at M = {LARGE_MACHINES:,}). Times are wall "
        f"time of `optimize(...)`, replica costing and memory feasibility included.",
        "",
        f"## M = {COMPARE_MACHINES:,}: fast vs exhaustive",
        "",
        "| method | configurations evaluated | wall time |",
        "|---|---|---|",
        f"| fast (branch and bound) | {fast.evaluated:,} (+ {fast.bounds_evaluated:,} interval "
        f"bounds) | {fast_median:.3f} s (median of {RUNS}) |",
        f"| exhaustive (predict_config on every configuration) | {slow.evaluated:,} | "
        f"{slow_s:.1f} s (1 run) |",
        "",
        f"- Ratio exhaustive / fast: **{slow_s / fast_median:,.0f}x**.",
        f"- Best plan, fast: `{describe_config(fast.best.config)}`, "
        f"{format_seconds(fast.best.epoch_time_s)} per epoch ({fast.best.epoch_time_s!r} s).",
        f"- Best plan, exhaustive: `{describe_config(slow.best.config)}`, "
        f"{format_seconds(slow.best.epoch_time_s)} per epoch ({slow.best.epoch_time_s!r} s).",
        f"- Same best epoch time (1e-9 relative): **{'yes' if same_best else 'NO'}**; same "
        f"configuration: **{'yes' if same_config else 'no (an equally fast one)'}**; same curve "
        f"at every budget (largest relative difference {curve_diff:.1e}): "
        f"**{'yes' if same_curve else 'NO'}**.",
        "",
        f"## M = {LARGE_MACHINES:,}: fast search",
        "",
        "| runs | median | min | max | target |",
        "|---|---|---|---|---|",
        f"| {RUNS} | {large_median:.3f} s | {min(large_runs):.3f} s | {max(large_runs):.3f} s | "
        f"< 1 s: **{'met' if large_median < 1 else 'NOT met'}** |",
        "",
        f"Best plan: `{describe_config(large.best.config)}`, "
        f"{format_seconds(large.best.epoch_time_s)} per epoch, bottleneck "
        f"{large.best.bottleneck}; {large.evaluated:,} configurations and "
        f"{large.bounds_evaluated:,} interval bounds evaluated.",
        "",
        "The machine is shared with other jobs, so times are noisy; the exhaustive run is one "
        "run of several minutes.",
        "",
        "Produced by `.venv/bin/python benchmarks/optimize_speed.py`.",
    ]
    text = "\n".join(lines) + "\n"
    out = Path(__file__).resolve().parents[1] / "results" / "optimize_speed.md"
    out.write_text(text)
    print(text)
    if not (same_best and same_curve):
        sys.exit(1)


if __name__ == "__main__":
    main()
