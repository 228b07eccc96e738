"""Does a host behave like a slower machine? Compute after idle gaps, alone and under contention.

A CFS quota caps CPU time per period, so a host that idled (waiting on the network) may spend
its whole period's quota at full core speed: it bursts, where a slower machine would not. The
probe (`probe burst`) sleeps an idle gap, then times a chunk of matmuls whose CPU time is
fixed; the chunk's **pace** is

    pace = wall seconds / (CPU seconds / share)

the chunk's wall time over what a machine of `share` cores' speed would take: 1.0 is a slower
machine, below 1 a burst (faster than the share), above 1 contention (slower than the share:
the machine's cores are oversubscribed). The spread of the pace over the gaps is what the
model cannot price. With the other hosts running CPU loops in their cgroups at the same time,
the probe also sees the contention a training run sees.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dnnscale.testbed.check import _env, _read_line, _stop, probe_command
from dnnscale.testbed.describe import HostDescription, TestbedDescription, enter_prefix

DEFAULT_GAPS_S = (0.0, 0.01, 0.05, 0.2, 0.5)


@dataclass(frozen=True)
class BurstResult:
    """Paces of one host's chunks, per idle gap."""

    host: str
    cpu_cores: float
    cpu_period_s: float
    busy_others: int
    chunk_cpu_s: float
    paces: dict[float, tuple[float, ...]]

    @property
    def all_paces(self) -> list[float]:
        return [p for values in self.paces.values() for p in values]

    @property
    def spread(self) -> tuple[float, float]:
        """(lowest, highest) pace over every gap and round."""
        values = self.all_paces
        return min(values), max(values)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.spread
        return {"host": self.host, "cpu_cores": self.cpu_cores,
                "cpu_period_s": self.cpu_period_s, "busy_others": self.busy_others,
                "chunk_cpu_s": self.chunk_cpu_s, "pace_min": low, "pace_max": high,
                "pace_median": statistics.median(self.all_paces),
                "paces_by_gap": {f"{gap:g}": list(values) for gap, values in self.paces.items()}}


def pace(wall_s: float, cpu_s: float, share: float) -> float:
    """How a chunk's wall time compares with a machine of `share` cores' speed.

    Formula: pace = wall / (cpu / share); 1 = the quota's pace, < 1 a burst, > 1 contention.
    Units: s, s, cores -> dimensionless.
    Source: CFS bandwidth control (Linux Documentation/scheduler/sched-bwc.rst): a group runs
    at most quota per period, so a compute-bound group takes cpu / share of wall time.
    """
    return wall_s / (cpu_s / share)


def _start(host: HostDescription, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(list(enter_prefix(host)) + probe_command(*args),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(host))


def measure_burst(desc: TestbedDescription, host_name: str | None = None,
                  gaps_s: Sequence[float] = DEFAULT_GAPS_S, chunk_s: float = 0.05,
                  rounds: int = 3, busy_others: bool = False) -> BurstResult:
    """Run the burst probe in one host (the first worker by default); with `busy_others`,
    every other host runs a CPU loop in its cgroup meanwhile. Every process started is
    stopped before returning, also on failure."""
    host = desc.host(host_name) if host_name else desc.hosts[0]
    others = [h for h in desc.hosts if h.name != host.name] if busy_others else []
    duration_s = rounds * (sum(gaps_s) + len(gaps_s) * chunk_s / host.cpu_cores) + 2
    procs: list[subprocess.Popen[str]] = []
    try:
        probe = _start(host, ["burst", "--gaps", ",".join(f"{g:g}" for g in gaps_s),
                              "--chunk-s", f"{chunk_s:g}", "--rounds", str(rounds)])
        procs.append(probe)
        busy = [_start(h, ["cpu", "--seconds", f"{duration_s + 10:g}"]) for h in others]
        procs += busy
        for h, proc in zip([host, *others], procs):
            _read_line(proc, 120, f"burst probe on {h.name}")
        for proc in busy + [probe]:  # the loops first, so the probe starts under contention
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        line = _read_line(probe, 60 + 4 * duration_s, f"burst probe on {host.name}")
    finally:
        _stop(procs)
    data = json.loads(line)
    paces: dict[float, list[float]] = {float(g): [] for g in gaps_s}
    cpu_times = []
    for sample in data["samples"]:
        paces[float(sample["gap_s"])].append(pace(sample["wall_s"], sample["cpu_s"],
                                                  host.cpu_cores))
        cpu_times.append(sample["cpu_s"])
    return BurstResult(host=host.name, cpu_cores=host.cpu_cores, cpu_period_s=host.cpu_period_s,
                       busy_others=len(others), chunk_cpu_s=statistics.median(cpu_times),
                       paces={g: tuple(v) for g, v in paces.items()})
