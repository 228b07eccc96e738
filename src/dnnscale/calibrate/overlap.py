"""The overlap microbenchmark: how much of a parameter-server exchange hides behind computation
when the runtime's background thread runs it — the γ of the model's γ-norm.

Two ranks (``python -m dnnscale.calibrate.overlap overlap SIZES REPEATS``, started by
calibrate/network.run_ranks on the same placements as the network benchmark): rank 1 is one
parameter-server shard (runtime.ps.ShardServer), rank 0 a worker (runtime.ps.PSClient). For each
message size m (bytes of the shard's slice) and each compute task c (forward, backward and SGD
update of a square linear layer on a minibatch of 64, one thread) rank 0 times, median of
REPEATS (the three interleaved):

- a: the compute task alone;
- b: one exchange alone — push m bytes, pull m bytes, exactly as a worker does;
- t: both at once — the exchange in a runtime.worker.BackgroundExchange while the task runs,
  until both are done (what an overlapped step costs).

Rank 0 prints {"points": [[a, b, t], ...]}. `fit_gamma` fits the model's combination
(a^γ + b^γ)^(1/γ) (model/network.overlapped_time_s) to the points:

    γ = argmin over γ ∈ [1, GAMMA_MAX] of Σ_i (ln (a_i^γ + b_i^γ)^(1/γ) − ln t_i)²

on a grid of 121 log-spaced γ, refined by golden-section search between the best point's
neighbours (each term is the squared log-error of a norm that falls monotonically from a + b to
max(a, b) as γ grows). GAMMA_MAX = 64 stands for perfect overlap (at γ = 64 the norm is within
1.1 % of the max) and is reported as inf.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Sequence

GAMMA_MAX = 64.0
COMPUTE_WIDTHS = (256, 768)
"""Square linear layers of the compute tasks (minibatch 64): ~25 and ~230 MFLOP per task."""
COMPUTE_BATCH = 64


def fit_gamma(points: Sequence[Sequence[float]]) -> float:
    """The γ that best fits t ≈ (a^γ + b^γ)^(1/γ) to the points (a, b, t) in log space; inf
    for GAMMA_MAX (the points show full overlap), 1 for none."""
    from dnnscale.model.network import overlapped_time_s

    usable = [(a, b, t) for a, b, t in points if a > 0 and b > 0 and t > 0]
    if not usable:
        raise ValueError("no usable overlap measurements")

    def loss(log_gamma: float) -> float:
        gamma = math.exp(log_gamma)
        return sum((math.log(overlapped_time_s(a, b, gamma)) - math.log(t)) ** 2
                   for a, b, t in usable)

    top = math.log(GAMMA_MAX)
    grid = [top * i / 120 for i in range(121)]
    index = min(range(len(grid)), key=lambda i: loss(grid[i]))
    lo, hi = grid[max(0, index - 1)], grid[min(len(grid) - 1, index + 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        left, right = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if loss(left) <= loss(right):
            hi = right
        else:
            lo = left
    best = min((grid[index], (lo + hi) / 2), key=loss)
    gamma = math.exp(best)
    return math.inf if gamma >= GAMMA_MAX * (1 - 1e-9) else max(1.0, gamma)


def _worker(sizes: list[int], repeats: int) -> list[list[float]]:
    import torch

    from dnnscale.calibrate.rank_setup import linear_sgd_step
    from dnnscale.runtime.layout import ShardMap
    from dnnscale.runtime.ps import PSClient
    from dnnscale.runtime.worker import BackgroundExchange, Exchange

    points = []
    for size in sizes:
        values = max(1, size // 4)
        client = PSClient(ShardMap([values], 1), 0, 1)
        client.init(torch.zeros(values))
        grad, pulled = torch.zeros(values), torch.empty(values)
        background = BackgroundExchange(client)

        def exchange() -> None:
            client.push(grad, 0)
            client.pull(pulled, 0)

        exchange()  # warm up the connection
        for width in COMPUTE_WIDTHS:
            compute = linear_sgd_step(width, COMPUTE_BATCH)

            def both() -> None:
                background.start(Exchange(0, grad, None, pulled, grad))
                compute()
                background.finish()

            compute()
            both()
            # Interleaved, so that a change of load shifts a, b and t alike.
            times: list[list[float]] = [[], [], []]
            for _ in range(repeats):
                for column, action in enumerate((compute, exchange, both)):
                    start = time.perf_counter()
                    action()
                    times[column].append(time.perf_counter() - start)
            points.append([statistics.median(column) for column in times])
        background.close()
        client.done()
    return points


def _server(sizes: list[int]) -> None:
    from dnnscale.runtime.layout import ShardMap
    from dnnscale.runtime.ps import ShardServer

    for size in sizes:
        server = ShardServer(ShardMap([max(1, size // 4)], 1), 0, 1, 1, 0.0, synchronous=False)
        server.receive_init()
        server.serve()


def main(argv: list[str]) -> int:
    from dnnscale.calibrate.rank_setup import start_rank

    _, sizes_text, repeats_text = argv
    sizes = [int(s) for s in sizes_text.split(",")]
    _, dist = start_rank(timeout_s=120.0)
    try:
        if dist.get_rank() == 0:
            points = _worker(sizes, int(repeats_text))
            print(json.dumps({"points": points}), flush=True)
        else:
            _server(sizes)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
