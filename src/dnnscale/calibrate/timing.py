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

import time
from collections.abc import Callable


def call_time_s(fn: Callable[[], object], samples: int = 5, sample_s: float = 0.02,
                warmup: int = 1, clock: Callable[[], float] = time.thread_time) -> float:
    """Seconds per call of `fn`: the fastest of `samples` samples of ≥ `sample_s` seconds each."""
    for _ in range(warmup):
        fn()
    start = clock()
    fn()
    single_s = max(clock() - start, 1e-7)
    calls = max(1, int(sample_s / single_s))
    per_call = []
    for _ in range(samples):
        start = clock()
        for _ in range(calls):
            fn()
        per_call.append((clock() - start) / calls)
    return min(per_call)
