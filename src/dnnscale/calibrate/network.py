"""Network calibration: point-to-point and all-reduce between rank processes, fitted α-β.

Ranks are started as ``placement.prefix + [python, -m, dnnscale.calibrate.netbench, ...]`` (the
runtime's RankPlacement contract: empty prefix and loopback locally, the testbed's namespace and
cgroup otherwise) and talk over torch.distributed gloo. Every child is waited for with a hard
timeout and killed (by its own pid) on any failure.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence

import numpy as np

from dnnscale.system.profile import PS_PUSH_PULL, LinkFit
from dnnscale.runtime.placement import RankPlacement


def free_port(address: str = "127.0.0.1") -> int:
    """A port that was free on `address` a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address if address != "localhost" else "127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_ranks(placements: Sequence[RankPlacement], mode: str, sizes: Sequence[int],
              repeats: int, timeout_s: float = 120.0, extra: float | None = None,
              module: str = "dnnscale.calibrate.netbench") -> list[list[float]]:
    """Run a benchmark `module` (netbench: ``MODE SIZES REPEATS [EXTRA]``) on one process per
    placement; rank 0's points ([[bytes, seconds, ...], ...] for netbench). `extra`: the mode's
    fourth argument (coupled: CPU seconds of the chunk; pspull: the number of shards, the last
    ranks)."""
    master = placements[0].address
    if placements[0].prefix:  # a testbed host: find the port inside its namespace
        from dnnscale.testbed.describe import free_port as free_port_on  # type: ignore

        port = free_port_on(placements[0])
    else:
        port = free_port(master)
    processes: list[subprocess.Popen[str]] = []
    try:
        for rank, placement in enumerate(placements):
            env = {**os.environ, **placement.env, "MASTER_ADDR": master,
                   "MASTER_PORT": str(port), "RANK": str(rank),
                   "WORLD_SIZE": str(len(placements)), "GLOO_SOCKET_IFNAME": placement.ifname,
                   "OMP_NUM_THREADS": "1"}
            command = [*placement.prefix, sys.executable, "-m", module,
                       mode, ",".join(str(s) for s in sizes), str(repeats),
                       *([f"{extra:g}"] if extra is not None else [])]
            processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
        outputs = [process.communicate(timeout=timeout_s) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
    failed = [(rank, p.returncode, out[1]) for rank, (p, out) in
              enumerate(zip(processes, outputs)) if p.returncode != 0]
    if failed:
        rank, code, stderr = failed[0]
        tail = stderr.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{module.rsplit('.', 1)[-1]} benchmark rank {rank} failed (exit "
                           f"{code}): {tail[0]}")
    line = outputs[0][0].strip().splitlines()[-1]
    return [[float(value) for value in point] for point in json.loads(line)["points"]]


def fit_alpha_beta(points: Sequence[Sequence[float]],
                   large_bytes: float = 256 * 1024) -> tuple[float, float]:
    """Fit t = a + bytes · b to measured (bytes, seconds); returns (a ≥ 0, b > 0).

    The two regimes are fitted where each dominates: a is the median time of the small
    messages (≤ 1 KiB), b the least-squares slope of t − a over the large ones (≥ `large_bytes`),
    in absolute seconds so that the biggest transfers, which show the sustained bandwidth, weigh
    most. Small messages ride in socket buffers and say little about bandwidth, large ones
    nothing about latency. Without both kinds of sizes: least squares on relative error.
    """
    sizes = np.asarray([p[0] for p in points], dtype=float)
    times = np.asarray([p[1] for p in points], dtype=float)
    small, large = sizes <= 1024, sizes >= large_bytes
    if small.any() and large.any():
        a = float(np.median(times[small]))
        b = float(np.sum(sizes[large] * (times[large] - a)) / np.sum(sizes[large] ** 2))
        if b > 0:
            return a, b
    design = np.stack([np.ones_like(times), sizes], axis=1) / times[:, None]
    (a, b), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if a < 0:  # latency below resolution: fit the slope alone
        a, b = 0.0, float(np.sum(sizes / times) / np.sum((sizes / times) ** 2))
    return float(a), max(float(b), 1e-15)


def measure_p2p(placements: Sequence[RankPlacement], sizes: Sequence[int],
                quick: bool = False) -> LinkFit:
    """One-way transfer time between two ranks at each size, fitted to latency + bytes / B."""
    points = run_ranks(placements[:2], "p2p", sizes, 3 if quick else 5)
    latency_s, s_per_byte = fit_alpha_beta(points)
    return LinkFit(bandwidth_bytes_per_s=1.0 / s_per_byte, latency_s=latency_s,
                   points=tuple((p[0], p[1]) for p in points), peers=2)


def measure_allreduce(placements: Sequence[RankPlacement], sizes: Sequence[int],
                      quick: bool = False) -> LinkFit:
    """All-reduce time among N ranks at each size, as the ring model's B and α.

    Formula: with t = a + bytes · b fitted, the ring model T = 2(N−1)/N · bytes / B + 2(N−1)·α
    gives B = 2(N−1)/N / b and α = a / (2(N−1)) (model/collectives.py ring_allreduce).
    """
    peers = len(placements)
    points = run_ranks(placements, "allreduce", sizes, 3 if quick else 5)
    a, b = fit_alpha_beta(points)
    return LinkFit(bandwidth_bytes_per_s=2 * (peers - 1) / peers / b,
                   latency_s=a / (2 * (peers - 1)),
                   points=tuple((p[0], p[1]) for p in points), peers=peers)


EXCHANGE_SIZES = (1024, 262_144, 1_048_576, 4_194_304)
"""Activation bytes of the exchange measurement: a small one for the latency, and the
partition activations of the testbed's workloads (64 KB to 3.7 MB per layer and step)."""


def measure_partition_exchange(placements: Sequence[RankPlacement],
                               sizes: Sequence[int] = EXCHANGE_SIZES,
                               quick: bool = False) -> tuple[LinkFit, LinkFit]:
    """A feature-split layer's exchanges among the placements as the runtime makes them
    (netbench `exchange`: runtime/network.GatherSplit's forward all-gather and backward
    reduce-scatter, padding and concatenation included), each fitted to t = a + x·b over the
    activation's x bytes and written as the registry's (B, α) of its operation.

    Formula: the registry prices an operation on x bytes among N as c_b·x / B + c_m·α
    (collectives.collective_transfer: all-gather (N−1)/N·x in N−1 messages; gloo's
    reduce-scatter, an all-reduce, 2(N−1)/N·x in 2(N−1)), so B = c_b / b and α = a / c_m.
    Measured on a 1 Gbit/s testbed at 0.25 core (benchmarks/coupling_bench.py): 17-27 ms per
    layer at N = 2, 32-56 ms at 3 and 71-80 ms at 4 for 64 KB and 1 MB alike, where the link
    would move 1 MB in 8 ms.
    """
    from dnnscale.model.collectives import collective_transfer

    members = len(placements)
    points = run_ranks(placements, "exchange", sizes, 2 if quick else 4, timeout_s=600)
    fits = []
    for column, operation in ((1, "allgather"), (2, "reduce_scatter")):
        series = [(p[0], p[column]) for p in points]
        a, b = fit_alpha_beta(series)
        unit = collective_transfer(operation, "gloo", 1.0, members)
        fits.append(LinkFit(bandwidth_bytes_per_s=unit.bytes / b,
                            latency_s=a / max(unit.messages, 1), points=tuple(series),
                            peers=members, operation=operation))
    return fits[0], fits[1]


HALO_GROUPS = (2, 3)
"""Group sizes of the halo measurement: a stripe's member has min(2, P − 1) neighbours, so P = 2
(one) and P = 3 (two, the middle member) cover every group size."""


def measure_halo_exchange(placements: Sequence[RankPlacement],
                          sizes: Sequence[int] = EXCHANGE_SIZES, quick: bool = False) -> LinkFit:
    """A stripe-split conv's halo exchanges among the placements as the runtime makes them
    (netbench `halo`: runtime/network.HaloExchange forward and backward, the slowest rank's
    times), fitted to t = a + x·b over the x bytes sent to each neighbour and written as the
    registry's (B, α) of 'halo' for m = min(2, N − 1) neighbours.

    Formula: the registry prices a halo as m·x / B + m·α (collectives.halo_exchange), so with
    the forward and backward points fitted together B = m / b and α = a / m.
    """
    from dnnscale.model.collectives import collective_transfer

    neighbours = min(2, len(placements) - 1)
    points = run_ranks(placements, "halo", sizes, 2 if quick else 4, timeout_s=600)
    series = [(p[0], p[1]) for p in points] + [(p[0], p[2]) for p in points]
    a, b = fit_alpha_beta(series)
    unit = collective_transfer("halo", "gloo", 1.0, neighbours)
    return LinkFit(bandwidth_bytes_per_s=unit.bytes / b, latency_s=a / unit.messages,
                   points=tuple(sorted(series)), peers=neighbours, operation="halo")


CPU_COLUMNS = (("allgather", (1,)), ("reduce_scatter", (2,)), ("halo", (3, 4)),
               ("allreduce", (5,)), (PS_PUSH_PULL, (6,)))
"""netbench `cpu` columns of each registry operation (a halo's forward and backward together),
and of a worker's PS push and pull (system/profile.PS_PUSH_PULL)."""


def measure_collective_cpu(placements: Sequence[RankPlacement],
                           sizes: Sequence[int] = EXCHANGE_SIZES, quick: bool = False,
                           runs: int = 1
                           ) -> tuple[tuple[str, float, float, tuple[tuple[float, float], ...]], ...]:
    """One rank's CPU seconds per call of the runtime's partition collectives (netbench
    `cpu`), each operation fitted to c = a + x·b over its payload x by least squares (a, b ≥ 0):
    (operation, a, b, points). With `runs` > 1 the microbenchmark runs that often, each in its
    own processes, and every point is the median of the runs' (two quiet runs disagreed 2-4x
    on a call's fixed CPU, docs/accuracy.md)."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    batches = [run_ranks(placements, "cpu", sizes, 2 if quick else 4, timeout_s=600)
               for _ in range(runs)]
    points = [[float(np.median([batch[i][c] for batch in batches]))
               for c in range(len(batches[0][i]))] for i in range(len(batches[0]))]
    fits = []
    for operation, columns in CPU_COLUMNS:
        series = [(float(p[0]), float(p[c])) for p in points for c in columns]
        xs = np.asarray([x for x, _ in series])
        cs = np.asarray([c for _, c in series])
        slope, intercept = np.polyfit(xs, cs, 1) if len(set(xs)) > 1 else (0.0, float(cs.mean()))
        slope = max(float(slope), 0.0)
        intercept = max(float(cs.mean() - slope * xs.mean()), 0.0)
        fits.append((operation, intercept, slope, tuple(sorted(series))))
    return tuple(fits)


COUPLED_CHUNK_CPU_S = 0.01
"""CPU seconds each member computes before the coupled collective: a few periods of a small
quota (40 ms of wall time at 0.25 core), like a layer's compute between two partition
collectives."""


def measure_call_wait(placements: Sequence[RankPlacement], sizes: Sequence[int] = (4096, 65_536),
                      chunk_cpu_s: float = COUPLED_CHUNK_CPU_S, quick: bool = False) -> float:
    """Seconds a collective among the placements costs beyond its own time when every member
    computes right before it (netbench `coupled`), the mean over `sizes`, at least 0.

    Under a CPU quota the members finish their compute at different points of their periods
    and a member that spent its quota answers only in the next period; the group waits for the
    last. Without a quota (or with a short period) this is about 0.
    """
    points = run_ranks(placements, "coupled", sizes, 2 if quick else 4, timeout_s=300,
                       extra=chunk_cpu_s)
    return max(0.0, float(np.mean([p[1] for p in points])))


def measure_ps_sync_pull(placements: Sequence[RankPlacement], shards: int, sizes: Sequence[int],
                         quick: bool = False) -> LinkFit:
    """A synchronous PS's held pulls answered in turn (netbench `pspull`: the last `shards`
    placements are shards, the others workers, each pulling SIZE bytes), fitted as the
    registry's ps_sync_pull: t = g·x / B + g·α for g workers of x bytes each.

    Formula: with t = a + x · b fitted, B = g / b and α = a / g
    (model/collectives.held_pull_convoy).
    """
    workers = len(placements) - shards
    points = run_ranks(placements, "pspull", sizes, 2 if quick else 4, timeout_s=600,
                       extra=shards)
    a, b = fit_alpha_beta(points)
    return LinkFit(bandwidth_bytes_per_s=workers / b, latency_s=a / workers,
                   points=tuple((p[0], p[1]) for p in points), peers=workers, shards=shards)
