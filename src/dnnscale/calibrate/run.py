"""Calibration end to end: measure compute, memory and network, fit, return a HardwareProfile.

`calibrate(...)` is what `dnnscale calibrate` calls; `steps` are reported to a callback so the
CLI can drive a progress bar. Everything compute-side runs on one thread
(torch.set_num_threads(1)), like one rank of the runtime.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from dnnscale.system.profile import HardwareProfile, OverlapFit, StragglerSpread

Advance = Callable[[str], None]
Placements = Callable[[Sequence[str]], list[Any]]
"""Where benchmark ranks run, given each rank's role ('worker' | 'ps')."""


@dataclass(frozen=True)
class Plan:
    """How much to measure: timing samples, the grid, message sizes, group sizes."""

    quick: bool
    samples: int
    sample_s: float
    grid_kinds: tuple[str, ...] | None
    message_sizes: tuple[int, ...]
    allreduce_peers: tuple[int, ...]
    allreduce_sizes: tuple[int, ...]
    network: bool
    overlap_sizes: tuple[int, ...] = (2**20,)
    straggler_steps: int = 10

    @property
    def straggler_processes(self) -> int:
        """Replicas of the straggler benchmark: the largest all-reduce group (at least 2)."""
        return max((2, *self.allreduce_peers))

    @classmethod
    def make(cls, quick: bool, network: bool = True, grid_kinds: tuple[str, ...] | None = None,
             allreduce_peers: tuple[int, ...] | None = None) -> "Plan":
        """`allreduce_peers`: the group sizes asked (a testbed asks every size it has, quick
        or not: a fit for 2 peers says nothing about 4); by default (2, 4), or (2,) quick."""
        if quick:
            return cls(True, 3, 0.005, grid_kinds, (8, 4096, 262_144, 4 * 2**20),
                       allreduce_peers or (2,), (4096, 2**20), network)
        return cls(False, 7, 0.03, grid_kinds,
                   (1, 64, 1024, 16_384, 131_072, 2**20, 4 * 2**20, 16 * 2**20, 64 * 2**20),
                   allreduce_peers or (2, 4), (1024, 65_536, 2**20, 8 * 2**20, 32 * 2**20),
                   network, (2**16, 2**19, 2**22), 60)

    def steps(self) -> int:
        from dnnscale.calibrate.compute import calibration_grid

        # p2p, each all-reduce group, the overlap and the straggler benchmarks
        network_steps = (3 + len(self.allreduce_peers)) if self.network else 0
        return len(calibration_grid(self.quick, self.grid_kinds)) + 3 + network_steps


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as stream:
            for line in stream:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_facts() -> dict[str, Any]:
    return {"hostname": platform.node(), "cpu_model": cpu_model(), "cores": os.cpu_count() or 1}


NetworkRunner = Callable[[Plan, Advance], dict[str, Any]]
"""Measures the network for `plan`; returns HardwareProfile fields (network, allreduce, ...)."""


def calibrate(plan: Plan, advance: Advance = lambda _: None,
              network_runner: NetworkRunner | None = None,
              compute: HardwareProfile | None = None,
              placements: Placements | None = None) -> HardwareProfile:
    """Measure and fit everything in `plan`; `network_runner(plan, advance)` measures the
    network (default: local processes over loopback), and with it the overlap and straggler
    benchmarks run on `placements` (default: local processes). `compute`: a profile whose
    compute and memory were measured already (inside a testbed host, calibrate/quota.py); then
    only the network and the mechanisms are measured here."""
    profile = compute if compute is not None else measure_compute(plan, advance)
    if plan.network:
        runner = network_runner or local_network
        profile = replace(profile, **runner(plan, advance))
        # Testbed links are rate-limited (Mbit/s): overlap messages up to 1 MiB there.
        overlap, stragglers = measure_mechanisms(plan, advance, placements or _local,
                                                 2**20 if placements is not None else None)
        profile = replace(profile, overlap=overlap, stragglers=stragglers)
    return profile


def measure_compute(plan: Plan, advance: Advance = lambda _: None) -> HardwareProfile:
    """Compute, memory and update rates of this process (one thread); no network."""
    import torch

    from dnnscale.calibrate.compute import calibration_grid, fit_compute, measure_grid
    from dnnscale.calibrate.memory import (allocation_curve, memory_bandwidth_bytes_per_s,
                                           update_cost)

    started = time.perf_counter()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    bandwidth = memory_bandwidth_bytes_per_s(samples=plan.samples)
    advance("memory bandwidth")
    sizes = ([2**18, 2**22, 24 * 2**20, 48 * 2**20, 128 * 2**20] if plan.quick else
             [2**k for k in range(16, 28)] + [24 * 2**20, 40 * 2**20, 160 * 2**20])
    allocation = allocation_curve(sizes, samples=plan.samples)
    advance("fresh-tensor cost")
    update = update_cost([1_000, 30_000, 1_000_000, 4_000_000], samples=plan.samples)
    advance("parameter update")
    shapes = calibration_grid(plan.quick, plan.grid_kinds)
    samples = list(measure_grid(shapes, plan.samples, plan.sample_s, advance))
    fit = fit_compute(samples, allocation)
    return HardwareProfile(
        machine=machine_facts(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch_version=str(torch.__version__), flops_per_s_per_core=fit.flops_per_s,
        intensity_factors=fit.intensity_factors, bytes_per_s_per_core=fit.bytes_per_s,
        allocation_bytes_per_s_per_core=allocation, memory_bandwidth_bytes_per_s=bandwidth,
        update_s_per_param=update.s_per_param, update_s_per_message=update.s_per_message,
        threads=1,
        calibration={"quick": plan.quick, "seconds": round(time.perf_counter() - started, 1),
                     "compute_shapes": len(shapes), "compute_samples": len(samples),
                     "timing": {"samples": plan.samples, "sample_s": plan.sample_s},
                     "grid": "dnnscale.calibrate.compute.GRID (synthetic shapes, not zoo layers)"})


def _local(roles: Sequence[str]) -> list[Any]:
    from dnnscale.runtime.placement import local_placements

    return list(local_placements(len(roles)))


def measure_mechanisms(plan: Plan, advance: Advance, placements: Placements,
                       size_cap: int | None = None) -> tuple[OverlapFit, StragglerSpread]:
    """The overlap benchmark (a worker and a shard: calibrate/overlap.py, γ fitted) and the
    straggler benchmark (identical worker processes: calibrate/stragglers.py)."""
    from dnnscale.calibrate.network import run_ranks
    from dnnscale.calibrate.overlap import fit_gamma
    from dnnscale.runtime.records import log_spread

    sizes = [s for s in plan.overlap_sizes if size_cap is None or s <= size_cap] \
        or [min(plan.overlap_sizes)]
    points = run_ranks(placements(["worker", "ps"]), "overlap", sizes, 3 if plan.quick else 5,
                       timeout_s=300.0, module="dnnscale.calibrate.overlap")
    overlap = OverlapFit(fit_gamma(points), tuple((a, b, t) for a, b, t in points))
    advance("overlap")
    processes = plan.straggler_processes
    means = [p[0] for p in run_ranks(placements(["worker"] * processes), "stragglers",
                                     [plan.straggler_steps], 1, timeout_s=300.0,
                                     module="dnnscale.calibrate.stragglers")]
    advance(f"stragglers x{processes}")
    return overlap, StragglerSpread(log_spread(means), processes, plan.straggler_steps,
                                    tuple(means))


def local_network(plan: Plan, advance: Advance) -> dict[str, Any]:
    """Point-to-point and all-reduce over loopback between local gloo processes."""
    from dnnscale.calibrate.network import measure_allreduce, measure_p2p
    from dnnscale.runtime.placement import local_placements

    p2p = measure_p2p(local_placements(2), plan.message_sizes, quick=plan.quick)
    advance("point-to-point")
    fits = []
    for peers in plan.allreduce_peers:
        fits.append(measure_allreduce(local_placements(peers), plan.allreduce_sizes,
                                      quick=plan.quick))
        advance(f"all-reduce x{peers}")
    return {"network": p2p, "allreduce": tuple(fits)}


TESTBED_MAX_MESSAGE_BYTES = 4 * 2**20
"""Testbed links are rate-limited (Mbit/s): messages up to 4 MiB keep calibration to minutes
(the default of `calibrate --max-message`; a validation asks at least its full gradient)."""

PULL_SIZES = (1024, 262_144, 2**20, 4 * 2**20)
"""Bytes per worker of the held-pull benchmark (sizes below the cap, then the cap)."""


def capped_sizes(sizes: Sequence[int], cap_bytes: int) -> list[int]:
    """The message sizes a testbed measures: `sizes` below the cap, then a quarter of the cap
    where that is larger than all of them, then the cap itself, so that the largest message
    a plan sends is measured, not extrapolated to.

    >>> capped_sizes([8, 4096, 262144, 4194304], 16 * 2**20)
    [8, 4096, 262144, 4194304, 16777216]
    >>> capped_sizes([4096, 1048576], 16 * 2**20)
    [4096, 1048576, 4194304, 16777216]
    """
    below = sorted(s for s in set(sizes) if s < cap_bytes)
    quarter = cap_bytes // 4
    extra = [quarter] if quarter > (below[-1] if below else 0) and quarter not in below else []
    return below + extra + [cap_bytes]


def pull_groups(workers: int, ps_hosts: int, hosts: int) -> list[tuple[int, int]]:
    """(workers, shards) of the ps_sync_pull measurements on a testbed: every worker count from
    2 that leaves a host for a shard, with the dedicated PS hosts as shards, else as many shards
    as workers where the hosts allow (the grids' S = R configurations), at least one."""
    if ps_hosts:
        return [(g, ps_hosts) for g in range(2, workers + 1)]
    return [(g, max(1, min(g, hosts - g))) for g in range(2, min(workers, hosts - 1) + 1)]


def testbed_steps(desc: Any, plan: Plan) -> int:
    """Network steps a testbed calibration reports: p2p, PS p2p, all-reduces, waits, pulls."""
    workers, ps_hosts = len(desc.hosts_with_role("worker")), len(desc.hosts_with_role("ps"))
    return (1 + bool(ps_hosts) + len(plan.allreduce_peers) + 2 * len(coupled_groups(workers))
            + len(halo_groups(workers)) + 1 + len(pull_groups(workers, ps_hosts, len(desc.hosts))))


def halo_groups(workers: int) -> list[int]:
    """Group sizes whose halo exchanges are measured (calibrate/network.HALO_GROUPS) that the
    testbed's workers can form."""
    from dnnscale.calibrate.network import HALO_GROUPS

    return [g for g in HALO_GROUPS if g <= workers]


def coupled_groups(workers: int) -> list[int]:
    """Group sizes whose collective wait under the quota is measured: 2 up to 4 workers (the
    model-parallel widths the grids use)."""
    return list(range(2, min(workers, 4) + 1))


def testbed_network(testbed_file: str,
                    max_message_bytes: int = TESTBED_MAX_MESSAGE_BYTES) -> NetworkRunner:
    """A network runner that measures between the testbed's hosts, every rank in its host's
    namespace and cgroup (joined after torch is imported): point-to-point between two workers
    (and between a worker and a PS host), all-reduce at each group size asked, the wait a
    collective costs after compute under the quota, the runtime's layer exchanges per group
    size, a stripe's halo exchanges with one and two neighbours, the CPU one rank spends per
    partition collective, and a synchronous PS's held pulls."""
    from dnnscale.errors import InputError

    try:
        from dnnscale.testbed.describe import load_description, rank_placements
    except ImportError:
        raise InputError("--testbed", "the testbed stage (dnnscale.testbed.describe."
                         "rank_placements) is not available in this installation yet") from None
    desc = load_description(testbed_file)
    rank_placements(desc, 2)  # a testbed with one worker host fails before measuring

    def run(plan: Plan, advance: Advance) -> dict[str, Any]:
        from dnnscale.calibrate.network import (measure_allreduce, measure_call_wait,
                                                measure_collective_cpu,
                                                measure_halo_exchange, measure_p2p,
                                                measure_partition_exchange,
                                                measure_ps_sync_pull)

        def place(count: int, roles: list[str] | None = None) -> list[Any]:
            return rank_placements(desc, count, roles=roles, join_late=True)

        sizes = capped_sizes(plan.message_sizes, max_message_bytes)
        reduce_sizes = capped_sizes(plan.allreduce_sizes, max_message_bytes)
        fields: dict[str, Any] = {"network": measure_p2p(place(2), sizes, quick=plan.quick)}
        advance("point-to-point")
        workers = len(desc.hosts_with_role("worker"))
        ps_hosts = len(desc.hosts_with_role("ps"))
        if ps_hosts:
            fields["ps_network"] = measure_p2p(place(2, ["worker", "ps"]), sizes,
                                               quick=plan.quick)
            advance("point-to-point to a PS host")
        fits = []
        for peers in plan.allreduce_peers:
            fits.append(measure_allreduce(place(peers), reduce_sizes, quick=plan.quick))
            advance(f"all-reduce x{peers}")
        fields["allreduce"] = tuple(fits)
        waits = []
        for peers in coupled_groups(workers):
            waits.append((peers, measure_call_wait(place(peers), quick=plan.quick)))
            advance(f"collective wait under the quota x{peers}")
        fields["collective_call_wait"] = tuple(waits)
        exchanges = []
        for peers in coupled_groups(workers):
            exchanges += measure_partition_exchange(place(peers), quick=plan.quick)
            advance(f"partition exchanges x{peers}")
        for peers in halo_groups(workers):
            exchanges.append(measure_halo_exchange(place(peers), quick=plan.quick))
            advance(f"halo exchanges x{peers}")
        fields["partition_exchange"] = tuple(exchanges)
        # on loopback at full speed, as the corpus's figure: the testbed's shaped links spread
        # more CPU over a collective than the quota's wait is about (docs/accuracy.md)
        from dnnscale.runtime.placement import local_placements

        fields["collective_cpu"] = tuple(
            (op, a, b) for op, a, b, _ in measure_collective_cpu(local_placements(2),
                                                                 quick=plan.quick, runs=3))
        advance("CPU per partition collective")
        pulls = []
        for count, shards in pull_groups(workers, ps_hosts, len(desc.hosts)):
            roles = ["worker"] * count + ["ps"] * shards
            pulls.append(measure_ps_sync_pull(place(count + shards, roles), shards,
                                              capped_sizes(PULL_SIZES, max_message_bytes),
                                              quick=plan.quick))
            advance(f"held pulls x{count} from {shards} shards")
        fields["ps_sync_pull"] = tuple(pulls)
        return fields

    return run


def testbed_placements(testbed_file: str) -> Placements:
    """Benchmark ranks on the testbed's hosts by role (dnnscale.testbed.describe)."""
    def placements(roles: Sequence[str]) -> list[Any]:
        from dnnscale.testbed.describe import rank_placements  # type: ignore[import-not-found]

        return list(rank_placements(testbed_file, len(roles), roles=list(roles),
                                    join_late=True))

    return placements


def without_network(profile: HardwareProfile) -> HardwareProfile:
    return replace(profile, network=None, allreduce=(), overlap=None, stragglers=None)
