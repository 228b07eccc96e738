"""What a testbed is asked to be: its hosts, each with a link rate, added latency and CPU share.

Built from the `up` flags (human units) into SI values; validation errors name the flag.
Addresses come from a /24 inside the benchmarking block 198.18.0.0/15 (RFC 2544), one /24 per
testbed, hosts numbered .1, .2, … workers first, then PS hosts.
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass

from dnnscale.errors import InputError, require_int
from dnnscale.testbed.names import MAX_HOSTS_PER_ROLE, TestbedNames, check_name
from dnnscale.units import parse_quantity

TESTBED_BLOCK = ipaddress.ip_network("198.18.0.0/15")
SUBNETS = tuple(TESTBED_BLOCK.subnets(new_prefix=24))
ROLES = ("worker", "ps")
# Keep the hosts' quotas below this share of the machine's cores (shared/design/testbed.md):
# above it, hosts steal CPU from each other and from the kernel's network processing.
CPU_BUDGET_SHARE = 0.8
DEFAULT_CFS_PERIOD_S = 0.01
"""The CFS period of each host's quota unless `--cpu-period` says otherwise. A long period
makes the quota a burst allowance: a host that idled (waiting on the network) runs at full core
speed until the period's quota is spent, a compute-bound one at the quota's pace. Measured:
a 47 ms compute chunk after idle gaps of 0-500 ms in a 0.35-core cgroup ran at 0.74-0.98x the
quota's pace (a burst) with a 100 ms period and 0.97-1.08x with 10 ms (shared/design/
testbed.md); on the loaded development machine (results/testbed_check.md, 'Compute after idle
gaps', preliminary) 0.75-1.06x against 0.89-1.02x at 0.25 core, and 5 ms was no steadier."""
MIN_CFS_QUOTA_S = 0.001
"""The kernel refuses a quota under 1 ms (cpu.cfs_quota_us >= 1000)."""
MAX_CFS_PERIOD_S = 1.0
"""The kernel's longest period (cpu.cfs_period_us <= 1 s)."""


@dataclass(frozen=True)
class HostSpec:
    """One emulated machine as asked."""

    name: str
    role: str
    rate_bytes_per_s: float
    latency_s: float
    cpu_cores: float
    cpu_period_s: float = DEFAULT_CFS_PERIOD_S


@dataclass(frozen=True)
class TestbedSpec:
    """A whole testbed as asked."""

    __test__ = False

    name: str
    hosts: tuple[HostSpec, ...]

    @property
    def names(self) -> TestbedNames:
        return TestbedNames(self.name)

    @property
    def cpu_cores_total(self) -> float:
        return sum(host.cpu_cores for host in self.hosts)


def parse_rate(value: str, field: str) -> float:
    """'200mbit' -> 25e6 bytes/s (tc's spelling and dnnscale's units both work)."""
    rate = parse_quantity(value, "bandwidth", field)
    if not (rate > 0 and math.isfinite(rate)):
        raise InputError(field, f"must be > 0, got {value!r}")
    if rate < 1e3:
        raise InputError(field, f"{value!r} is below 8 kbit/s; write a unit, e.g. 200mbit")
    return rate


def parse_latency(value: str, field: str) -> float:
    """'100us' -> 1e-4 s; must be >= 0 and below one second."""
    latency = parse_quantity(value, "time", field)
    if not (0 <= latency < 1):
        raise InputError(field, f"must be >= 0 and < 1s, got {value!r}")
    return latency


def parse_cpu(value: float, field: str) -> float:
    """A CPU share in cores (0.3 = 30 % of one core); at most the machine's cores."""
    cores = os.cpu_count() or 1
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= cores):
        raise InputError(field, f"must be a number of cores in (0, {cores}], got {value!r}")
    if value < 0.01:
        raise InputError(field, f"must be at least 0.01 core, got {value!r}")
    return float(value)


def parse_cpu_period(value: str | None, shares: list[float], field: str = "--cpu-period") -> float:
    """The CFS period for hosts of CPU `shares`: `value` ('10ms', '0.1s') or the default.

    Every host's quota (share x period) must be at least 1 ms, which the kernel requires: the
    default period grows to 1 ms / the smallest share (whole milliseconds) when it has to; an
    explicit period that is too short for a share is an error.
    """
    smallest = min(shares)
    shortest = MIN_CFS_QUOTA_S / smallest
    if value is None:
        period = max(DEFAULT_CFS_PERIOD_S, math.ceil(shortest * 1000 - 1e-9) / 1000)
        return min(period, MAX_CFS_PERIOD_S)
    period = parse_quantity(value, "time", field)
    if not (MIN_CFS_QUOTA_S <= period <= MAX_CFS_PERIOD_S):
        raise InputError(field, f"must be between 1ms and 1s (the kernel's range), got {value!r}")
    if period < shortest - 1e-12:
        raise InputError(field, f"{value!r} gives a host of {smallest:g} core a quota of "
                         f"{1000 * smallest * period:.2g} ms; the kernel needs >= 1 ms, so use "
                         f"at least {1000 * shortest:.3g}ms")
    return period


def default_cpu_share(total_hosts: int) -> float:
    """Default per-host CPU share: the budget split evenly, at most one core, two decimals."""
    budget = CPU_BUDGET_SHARE * (os.cpu_count() or 1)
    return max(0.01, min(1.0, math.floor(100 * budget / total_hosts) / 100))


def make_spec(name: str, hosts: int, rate: str, latency: str = "0", cpu: float | None = None,
              ps_hosts: int = 0, ps_rate: str | None = None, ps_latency: str | None = None,
              ps_cpu: float | None = None, cpu_period: str | None = None) -> TestbedSpec:
    """Validate the `up` flags and build the asked testbed."""
    check_name(name, "--name")
    require_int("--hosts", hosts, minimum=1)
    require_int("--ps-hosts", ps_hosts, minimum=0)
    for flag, count in (("--hosts", hosts), ("--ps-hosts", ps_hosts)):
        if count > MAX_HOSTS_PER_ROLE:
            raise InputError(flag, f"at most {MAX_HOSTS_PER_ROLE}, got {count}")
    total = hosts + ps_hosts
    if total > 250:
        raise InputError("--hosts", f"at most 250 hosts in all (one /24), got {total}")
    worker_rate = parse_rate(rate, "--rate")
    worker_latency = parse_latency(latency, "--latency")
    worker_cpu = parse_cpu(cpu, "--cpu") if cpu is not None else default_cpu_share(total)
    if ps_hosts == 0:
        for flag, value in (("--ps-rate", ps_rate), ("--ps-latency", ps_latency),
                            ("--ps-cpu", ps_cpu)):
            if value is not None:
                raise InputError(flag, "given without --ps-hosts")
    ps_rate_s = parse_rate(ps_rate, "--ps-rate") if ps_rate is not None else worker_rate
    ps_latency_s = (parse_latency(ps_latency, "--ps-latency") if ps_latency is not None
                    else worker_latency)
    ps_cpu_cores = parse_cpu(ps_cpu, "--ps-cpu") if ps_cpu is not None else worker_cpu
    period = parse_cpu_period(cpu_period, [worker_cpu] + ([ps_cpu_cores] if ps_hosts else []))
    names = TestbedNames(name)
    specs = [HostSpec(names.host("worker", i), "worker", worker_rate, worker_latency, worker_cpu,
                      period) for i in range(1, hosts + 1)]
    specs += [HostSpec(names.host("ps", i), "ps", ps_rate_s, ps_latency_s, ps_cpu_cores, period)
              for i in range(1, ps_hosts + 1)]
    return TestbedSpec(name, tuple(specs))


def cpu_budget_warning(spec: TestbedSpec) -> str | None:
    """A warning when the hosts' quotas add up to more than the machine should give them."""
    cores = os.cpu_count() or 1
    budget = CPU_BUDGET_SHARE * cores
    if spec.cpu_cores_total > budget + 1e-9:
        return (f"the hosts' CPU quotas add up to {spec.cpu_cores_total:g} cores, more than "
                f"{budget:g} of this machine's {cores}: hosts will steal from each other")
    return None


def cfs_quota_us(cpu_cores: float, period_s: float) -> tuple[int, int]:
    """(cpu.cfs_period_us, cpu.cfs_quota_us) of a host: quota = cores x period, >= 1 ms."""
    period_us = round(period_s * 1e6)
    return period_us, max(round(MIN_CFS_QUOTA_S * 1e6), round(cpu_cores * period_us))


def host_address(subnet: ipaddress.IPv4Network, index: int) -> str:
    """Address of the `index`-th host (0-based) in `subnet`: .1, .2, …"""
    return str(subnet.network_address + index + 1)
