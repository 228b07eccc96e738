"""Timing a callable robustly on a shared, noisy machine: the fastest of several samples.

Each sample runs the callable enough times in a row to last at least `sample_s` (so clock
resolution and per-call jitter average out). Other processes can only slow a sample down, so the
fastest sample is the best estimate of the uncontended time (as `timeit` advises); calibration and
the accuracy benchmarks time the same way, so both estimate the same quantity.

The default clock is this thread's CPU time (`time.thread_time`: user + system time of the
calling thread, page faults included), which does not count the time the thread waits for a
core while other processes run. For one-thread compute on an idle core it equals wall time;
on a shared, loaded machine it is what the same work would take on a core of its own. Pass
`clock=time.perf_counter` for wall time (the network benchmarks do: waiting is their point).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class QuotaTiming:
    """How a process inside a CPU quota times calls (`use_quota_timing`): wall seconds × the
    quota's share, so that rates stay per core and the model's `share × per-core rate` is what
    the host delivers, throttling and contention included; the median sample (what a run
    sees, not the luckiest burst); samples of CPU work worth at least `min_sample_s` wall
    seconds at the quota's pace (whole periods, so that a sample cannot fit inside one
    period's burst)."""

    share: float
    min_sample_s: float


_QUOTA: QuotaTiming | None = None


def use_quota_timing(share: float, period_s: float, periods_per_sample: int = 10) -> None:
    """Time every later `call_time_s` of this process as inside a quota of `share` cores.

    Samples run back to back, so only the first can start with a whole period's quota banked;
    a sample of 10 periods is at most one quota (10 %) faster than the quota's pace."""
    global _QUOTA
    _QUOTA = QuotaTiming(share, periods_per_sample * period_s)


def call_time_s(fn: Callable[[], object], samples: int = 5, sample_s: float = 0.02,
                warmup: int = 1, clock: Callable[[], float] | None = None) -> float:
    """Seconds per call of `fn`: the fastest of `samples` samples of ≥ `sample_s` seconds each
    (CPU time of this thread); under `use_quota_timing`, the median sample's wall seconds ×
    share, each sample holding CPU work for at least the quota's `min_sample_s` of wall time."""
    quota = _QUOTA if clock is None else None
    if clock is None:
        clock = time.perf_counter if quota is not None else time.thread_time
    for _ in range(warmup):
        fn()
    # Size the samples by CPU time: a wall-clock call under a quota may or may not include a
    # throttled stretch. Under the quota a sample holds CPU work for `min_sample_s` of wall
    # time at the quota's pace.
    start = time.thread_time() if quota is not None else clock()
    fn()
    single_s = max((time.thread_time() if quota is not None else clock()) - start, 1e-7)
    if quota is not None:
        sample_s = max(sample_s, quota.min_sample_s) * quota.share
    calls = max(1, int(sample_s / single_s + 1e-9))
    per_call = []
    for _ in range(samples):
        start = clock()
        for _ in range(calls):
            fn()
        per_call.append((clock() - start) / calls)
    if quota is not None:
        return statistics.median(per_call) * quota.share
    return min(per_call)
