"""One rank of the network microbenchmark (run as ``python -m dnnscale.calibrate.netbench``).

Environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and GLOO_SOCKET_IFNAME); arguments:
``p2p|allreduce SIZE,SIZE,... REPEATS``. Rank 0 prints one JSON line {"points": [[bytes, s]]}:
for p2p the one-way time of a message (half a ping-pong round trip), for allreduce the time of
one all-reduce of SIZE bytes of float32; each the median over REPEATS batches of individually
timed calls (the median shrugs off the calls another process delayed).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import timedelta


def _batch_calls(size: int) -> int:
    return max(3, min(100, int(1e7 / max(size, 1))))


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    mode, sizes_text, repeats_text = argv
    sizes = [int(s) for s in sizes_text.split(",")]
    repeats = int(repeats_text)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    points = []
    try:
        for size in sizes:
            if mode == "p2p":
                buffer = torch.zeros(size, dtype=torch.uint8)
            else:
                buffer = torch.ones(max(1, size // 4), dtype=torch.float32)
            calls = _batch_calls(size)
            timed: list[float] = []
            for attempt in range(repeats + 1):
                dist.barrier()
                for _ in range(calls):
                    start = time.perf_counter()
                    if mode == "allreduce":
                        dist.all_reduce(buffer)
                    elif rank == 0:
                        dist.send(buffer, 1)
                        dist.recv(buffer, 1)
                    elif rank == 1:
                        dist.recv(buffer, 0)
                        dist.send(buffer, 0)
                    elapsed = time.perf_counter() - start
                    if attempt:  # the first batch warms up connections and buffers
                        timed.append(elapsed / 2 if mode == "p2p" else elapsed)
            points.append([buffer.numel() * buffer.element_size(), statistics.median(timed)])
        if rank == 0:
            print(json.dumps({"points": points, "world": world}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
