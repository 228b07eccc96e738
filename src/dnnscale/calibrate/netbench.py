"""One rank of the network microbenchmark (run as ``python -m dnnscale.calibrate.netbench``).

Environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (and GLOO_SOCKET_IFNAME); arguments:
``p2p|allreduce|exchange|halo|cpu|coupled|coupled-allgather|coupled-layer|pspull SIZE,... REPEATS
[CHUNK_CPU_S | SHARDS]``. Rank 0 prints one JSON line {"points": [[bytes, s]]}:

- p2p: the one-way time of a message (half a ping-pong round trip);
- allreduce: the time of one all-reduce of SIZE bytes of float32;
- coupled: what an all-reduce of SIZE bytes costs beyond its own time when it follows
  CHUNK_CPU_S of one-thread matmul on every rank, as in a model-parallel step (each rank
  computes, then they meet): the mean iteration of (chunk, all-reduce) minus the mean
  iteration of the chunk alone (no meeting) minus the median all-reduce alone. Under a CPU
  quota a rank that spent its period's quota cannot answer until the next period, and the
  group waits for its slowest member; the points also carry the three raw times;
- coupled-allgather: the same with an all-gather that assembles SIZE bytes (SIZE / WORLD from
  each rank), the forward exchange of a model-parallel layer;
- exchange: a feature-split layer's exchanges as the runtime makes them
  (runtime/network.GatherSplit on a SIZE-byte activation, SIZE / WORLD from each rank): the
  forward all-gather and the backward reduce-scatter, each call timed alone; points
  [bytes, forward s, backward s];
- halo: a stripe-split conv's halo exchanges as the runtime makes them
  (runtime/network.HaloExchange: every rank holds HALO_ROWS_HELD rows of a row-split
  activation and needs one more row from each neighbour, SIZE bytes per neighbour): the
  forward exchange and the backward return of the borrowed rows' gradients, each call timed
  alone; points [bytes, forward s, backward s], the slowest rank's medians (a middle rank has
  two neighbours);
- cpu: the CPU seconds (all threads) one rank spends per call in the runtime's partition
  collectives on SIZE bytes: GatherSplit's all-gather and reduce-scatter, HaloExchange forward
  and backward, an all-reduce, and a parameter server's push and pull of SIZE bytes each
  (point-to-point with its pair rank, as runtime/ps.py sends them); points [bytes, gather,
  scatter, halo fwd, halo bwd, all-reduce, push + pull];
- coupled-layer: a feature-split layer's exchanges as the runtime makes them
  (runtime/network.GatherSplit on a SIZE-byte activation): chunk, forward all-gather, chunk,
  backward reduce-scatter, against the two chunks alone and the two exchanges alone;
- pspull: a synchronous parameter server's reply round: the last SHARDS ranks are shards, the
  others workers; every worker asks every shard (in rank order) for its SIZE/SHARDS bytes, and
  each shard answers the requests one after another in the order they arrived, as
  runtime/ps.py's ShardServer answers the pulls it held for a step; the time from the request
  to the last byte received, the slowest worker's, per round.

Each the median (mean for coupled, whose waits are the point) over REPEATS batches of
individually timed calls (the median shrugs off the calls another process delayed).

The process joins its testbed host's CPU cgroup after importing torch, if its placement
deferred the join (runtime/placement.join_cgroup).
"""

from __future__ import annotations

import json
import statistics
import sys
import time


def _batch_calls(size: int) -> int:
    return max(3, min(100, int(1e7 / max(size, 1))))


def _matmul_chunk(cpu_s: float):  # type: ignore[no-untyped-def]
    """A function that runs about `cpu_s` CPU seconds of one-thread 128x128 matmuls."""
    import torch

    a, b = torch.rand(128, 128), torch.rand(128, 128)
    start, calls = time.process_time(), 0
    while time.process_time() - start < 0.02:
        torch.mm(a, b)
        calls += 1
    per_call = (time.process_time() - start) / calls
    count = max(1, round(cpu_s / per_call))

    def run() -> None:
        for _ in range(count):
            torch.mm(a, b)

    return run


def _pspull(size: int, shards: int, calls: int) -> list[float]:
    """Rounds of a synchronous PS's held pulls (see the module docstring); the slowest worker's
    seconds per round, on rank 0 (every rank returns its own)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    workers = world - shards
    piece = torch.zeros(max(1, size // 4 // shards), dtype=torch.float32)
    timed = []
    for _ in range(calls):
        dist.barrier()
        start = time.perf_counter()
        if rank < workers:
            asks = [dist.isend(torch.tensor([rank]), workers + s) for s in range(shards)]
            replies = [dist.irecv(torch.empty_like(piece), workers + s) for s in range(shards)]
            for work in asks + replies:
                work.wait()
        else:
            order = []  # the requests in their order of arrival, then the replies in it
            for _ in range(workers):
                who = torch.zeros(1, dtype=torch.int64)
                order.append(int(dist.recv(who)))
            for worker in order:
                dist.send(piece, worker)
        elapsed = torch.tensor([time.perf_counter() - start])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        timed.append(float(elapsed))
    return timed


def _layer_tensors(size: int):  # type: ignore[no-untyped-def]
    """This rank's part of a feature-split activation of `size` bytes and a function that runs
    the runtime's forward exchange of it (runtime/network.GatherSplit), returning the whole."""
    import torch
    import torch.distributed as dist

    from dnnscale.runtime.network import GatherSplit, PartitionComm

    rank, world = dist.get_rank(), dist.get_world_size()
    width = max(1, size // 4 // world)
    comm = PartitionComm(group=None, index=rank, parts=world, ranks=list(range(world)))
    local = torch.ones(1, width, requires_grad=True)
    return local, lambda: GatherSplit.apply(local, [width] * world, 1, comm)


def _layer_exchange(size: int):  # type: ignore[no-untyped-def]
    """The runtime's own exchanges of a feature-split layer on an activation of `size` bytes:
    its forward all-gather, `between()`, its backward reduce-scatter."""
    import torch

    _, forward = _layer_tensors(size)

    def exchange(between=lambda: None) -> None:  # type: ignore[no-untyped-def]
        full = forward()
        between()
        full.backward(torch.ones_like(full))

    return exchange


def _forward_backward_medians(forward, calls: int,  # type: ignore[no-untyped-def]
                              clock=time.perf_counter) -> tuple[float, float]:
    """The medians of `calls` forward exchanges (`forward()` returns the output) and of the
    backward passes through them, each call timed alone on `clock`, after a warm-up batch."""
    import torch
    import torch.distributed as dist

    ahead, back = [], []
    for attempt in range(2):
        dist.barrier()
        for _ in range(calls):
            start = clock()
            out = forward()
            middle = clock()
            out.backward(torch.ones_like(out))
            end = clock()
            if attempt:
                ahead.append(middle - start)
                back.append(end - middle)
    return statistics.median(ahead), statistics.median(back)


def _exchange(size: int, calls: int) -> list[float]:
    """[bytes, forward s, backward s]: a feature-split layer's exchanges as the runtime makes
    them (runtime/network.GatherSplit on a SIZE-byte activation), each call timed alone, the
    median of `calls` after a warm-up batch."""
    _, forward = _layer_tensors(size)
    return [size, *_forward_backward_medians(forward, calls)]


HALO_ROWS_HELD = 4
"""Rows of the stripe-split activation each rank of the halo microbenchmark holds."""


def _halo_forward(size: int):  # type: ignore[no-untyped-def]
    """The runtime's halo exchange of a stripe-split activation that sends `size` bytes to each
    neighbour (see the module docstring), as a function; and those bytes."""
    import torch
    import torch.distributed as dist

    from dnnscale.runtime.network import HaloExchange, PartitionComm

    rank, world = dist.get_rank(), dist.get_world_size()
    width = 64
    channels = max(1, size // 4 // width)
    rows = HALO_ROWS_HELD
    held = [(q * rows, (q + 1) * rows) for q in range(world)]
    needed = [(max(0, lo - 1), min(world * rows, hi + 1)) for lo, hi in held]
    comm = PartitionComm(group=None, index=rank, parts=world, ranks=list(range(world)))
    local = torch.ones(1, channels, rows, width, requires_grad=True)
    return (lambda: HaloExchange.apply(local, held, needed, comm)), channels * width * 4


def _cpu(size: int, calls: int) -> list[float]:
    """[bytes, all-gather, reduce-scatter, halo forward, halo backward, all-reduce]: this rank's
    CPU seconds (process_time: every thread, user and system) per call of the runtime's
    partition collectives on `size` bytes, the median of `calls` after a warm-up batch."""
    import torch
    import torch.distributed as dist

    _, forward = _layer_tensors(size)
    gather, scatter = _forward_backward_medians(forward, calls, time.process_time)
    halo, _ = _halo_forward(size)
    halo_forward, halo_backward = _forward_backward_medians(halo, calls, time.process_time)
    buffer = torch.ones(max(1, size // 4), dtype=torch.float32)
    return [size, gather, scatter, halo_forward, halo_backward,
            _median_cpu_s(lambda: dist.all_reduce(buffer), calls),
            _median_cpu_s(_push_pull(buffer), calls)]


def _median_cpu_s(call, calls: int) -> float:  # type: ignore[no-untyped-def]
    """This rank's median CPU seconds (process_time) per `call()`, over `calls` calls after a
    warm-up batch, every batch started together (a barrier)."""
    import torch.distributed as dist

    timed = []
    for attempt in range(2):
        dist.barrier()
        for _ in range(calls):
            start = time.process_time()
            call()
            if attempt:
                timed.append(time.process_time() - start)
    return statistics.median(timed)


def _push_pull(buffer):  # type: ignore[no-untyped-def]
    """A call that sends `buffer` to this rank's pair rank (0-1, 2-3, ...) and receives one as
    large back, a worker's push and pull of runtime/ps.py (isend, irecv, wait); nothing for an
    unpaired last rank."""
    import torch
    import torch.distributed as dist

    peer = dist.get_rank() ^ 1
    back = torch.empty_like(buffer)

    def call() -> None:
        if peer < dist.get_world_size():
            for work in [dist.isend(buffer, peer), dist.irecv(back, peer)]:
                work.wait()

    return call


def _halo(size: int, calls: int) -> list[float]:
    """[bytes, forward s, backward s]: a stripe-split conv's halo exchanges as the runtime
    makes them (runtime/network.HaloExchange; see the module docstring), the slowest rank's
    median of `calls` after a warm-up batch."""
    import torch
    import torch.distributed as dist

    halo, sent = _halo_forward(size)
    mine = torch.tensor(_forward_backward_medians(halo, calls))
    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    return [sent, float(mine[0]), float(mine[1])]


def _coupled(size: int, chunk, calls: int, repeats: int,  # type: ignore[no-untyped-def]
             kind: str = "allreduce") -> list[float]:
    """[bytes, extra s, iteration s, chunk-alone s, collective-alone s] (see the docstring)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    if kind == "layer":
        exchange = _layer_exchange(size)
        collective = exchange
        body = lambda: (chunk(), exchange(chunk))  # noqa: E731
        own = lambda: (chunk(), chunk())  # noqa: E731
    elif kind == "allgather":
        mine = torch.ones(max(1, size // 4 // world), dtype=torch.float32)
        parts = [torch.empty_like(mine) for _ in range(world)]

        def collective() -> None:
            dist.all_gather(parts, mine)
    else:
        buffer = torch.ones(max(1, size // 4), dtype=torch.float32)

        def collective() -> None:
            dist.all_reduce(buffer)
    if kind != "layer":
        body = lambda: (chunk(), collective())  # noqa: E731
        own = chunk
    together, alone, bare = [], [], []
    for attempt in range(repeats + 1):
        for target, run in ((together, body), (alone, own), (bare, collective)):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            if attempt:  # the first round warms up
                target.append((time.perf_counter() - start) / calls)
    iteration, own, alone_s = (statistics.fmean(together), statistics.fmean(alone),
                               statistics.median(bare))
    return [size, iteration - own - alone_s, iteration, own, alone_s]


def main(argv: list[str]) -> int:
    from dnnscale.calibrate.rank_setup import start_rank

    mode, sizes_text, repeats_text = argv[:3]
    extra = float(argv[3]) if len(argv) > 3 else 0.0
    sizes = [int(s) for s in sizes_text.split(",")]
    repeats = int(repeats_text)
    torch, dist = start_rank(timeout_s=60.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    chunk = _matmul_chunk(extra) if mode.startswith("coupled") else None
    points = []
    try:
        for size in sizes:
            if mode == "pspull":
                timed = _pspull(size, int(extra), repeats * _batch_calls(size))
                points.append([size, statistics.median(timed)])
                continue
            if mode == "exchange":
                points.append(_exchange(size, repeats * _batch_calls(size)))
                continue
            if mode == "halo":
                points.append(_halo(size, repeats * _batch_calls(size)))
                continue
            if mode == "cpu":
                points.append(_cpu(size, repeats * _batch_calls(size)))
                continue
            if mode.startswith("coupled"):
                points.append(_coupled(size, chunk, 10, repeats, mode.partition("-")[2]
                                       or "allreduce"))
                continue
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
