"""One rank of the PS-queue microbenchmark (run as ``python -m dnnscale.calibrate.psqueue``,
started by calibrate/network.run_ranks; benchmarks/ps_queue_bench.py drives it).

Arguments: ``SHARDS SIZE,... WINDOW_S CHUNK_CPU_S`` (WINDOW_S whole seconds). The last SHARDS ranks are asynchronous
parameter-server shards (runtime/ps.ShardServer, one request at a time), the others workers
that loop as a ps-async worker does (runtime/worker.py): CHUNK_CPU_S of one-thread matmul (its
compute), push a SIZE-byte gradient to the shards (PSClient.push), pull the SIZE-byte weights
(PSClient.pull). Every worker steps for WINDOW_S seconds after two warm-up steps and reports its
mean step over the steps that ended inside the window; it keeps stepping until every worker's
window has closed, so every window sees all replicas contend. Rank 0 prints one JSON line
{"points": [[bytes, mean step s (over workers), slowest worker's step s, chunk alone s]]}.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from datetime import timedelta


def _worker_window(client, chunk, values: int, window_s: float, done) -> float:  # type: ignore[no-untyped-def]
    """Mean step of this worker over its window; steps on until `done()` says all closed."""
    import torch

    weights, gradient = torch.zeros(values), torch.full((values,), 1e-6)
    ends: list[float] = []
    step, start = 0, None
    while True:
        chunk()
        client.push(gradient, step)
        client.pull(weights, step)
        step += 1
        now = time.perf_counter()
        if step == 2:
            start = now
        elif start is not None and now - start <= window_s:
            ends.append(now)
        if start is not None and now - start > window_s and done():
            break
    if len(ends) < 2:
        return (ends[-1] - start) if ends else window_s  # type: ignore[operator]
    return (ends[-1] - start) / len(ends)  # type: ignore[operator]


def main(argv: list[str]) -> int:
    from dnnscale.calibrate.netbench import _matmul_chunk
    from dnnscale.calibrate.rank_setup import start_rank
    from dnnscale.runtime.layout import ShardMap
    from dnnscale.runtime.ps import PSClient, ShardServer

    shards, sizes = int(argv[0]), [int(s) for s in argv[1].split(",")]
    window_s, chunk_cpu_s = float(argv[2]), float(argv[3])
    torch, dist = start_rank(timeout_s=300.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    workers = world - shards
    if workers < 1 or shards < 1:
        raise SystemExit(f"error: needs >= 1 worker and >= 1 shard, got {world} ranks and "
                         f"{shards} shards")
    requests = dist.new_group(list(range(world)), timeout=timedelta(seconds=600))
    # How many workers' windows have closed: a counter in the rendezvous store (no collective,
    # so that no worker waits for another before its window closes).
    store = dist.distributed_c10d._get_default_store()
    chunk = _matmul_chunk(chunk_cpu_s)
    points = []
    try:
        for round_index, size in enumerate(sizes):
            values = max(shards, size // 4)
            shard_map = ShardMap([values], shards)
            key = f"psqueue-closed-{round_index}"
            if rank < workers:
                client = PSClient(shard_map, 0, workers, requests)
                if rank == 0:
                    client.init(torch.zeros(values))
                dist.barrier()
                closed = [False]

                def done() -> bool:
                    if not closed[0]:
                        store.add(key, 1)
                        closed[0] = True
                    return store.add(key, 0) >= workers

                step_s = _worker_window(client, chunk, values, window_s, done)
                client.done()
                alone = []
                for _ in range(5):
                    begin = time.perf_counter()
                    chunk()
                    alone.append(time.perf_counter() - begin)
                mine = torch.tensor([step_s, statistics.median(alone)])
            else:
                server = ShardServer(shard_map, rank - workers, 1, workers, lr=0.0,
                                     synchronous=False, requests=requests)
                server.receive_init()
                dist.barrier()
                server.serve()
                mine = torch.tensor([0.0, 0.0])
            gathered = [torch.zeros(2) for _ in range(world)]
            dist.all_gather(gathered, mine)
            steps = [float(t[0]) for t in gathered[:workers]]
            points.append([values * 4, statistics.fmean(steps), max(steps),
                           statistics.median(float(t[1]) for t in gathered[:workers])])
        if rank == 0:
            print(json.dumps({"points": points, "world": world}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
