"""The straggler microbenchmark: how far apart identical replicas run on these hosts — the
spread the model's straggler term reads (model/stragglers.py).

K ranks (``python -m dnnscale.calibrate.stragglers stragglers STEPS REPEATS``, started by
calibrate/network.run_ranks on the worker hosts, one rank each), after one barrier, each run the
same step STEPS times: forward, backward and SGD update of a 512-wide linear layer on a
minibatch of 64, one thread, like one replica's compute. Rank 0 gathers every rank's mean step
time and prints {"points": [[mean_step_s], ...]}; the spread is the standard deviation of their
logarithms (runtime/records.log_spread, the same statistic a run's summary reports as
epoch.replica_spread). On identical idle hosts it is small (timer noise and shared caches); a
loaded or heterogeneous cluster shows its stragglers here. REPEATS is unused (the interface of
run_ranks).
"""

from __future__ import annotations

import json
import sys
import time

WIDTH, BATCH = 512, 64


def main(argv: list[str]) -> int:
    from dnnscale.calibrate.rank_setup import linear_sgd_step, start_rank

    _, steps_text, _ = argv
    steps = int(steps_text)
    _, dist = start_rank(timeout_s=120.0)
    try:
        step = linear_sgd_step(WIDTH, BATCH)
        step()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        mean = (time.perf_counter() - start) / steps
        gathered: list[float] = [0.0] * dist.get_world_size()
        dist.all_gather_object(gathered, mean)
        if dist.get_rank() == 0:
            print(json.dumps({"points": [[t] for t in gathered]}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
