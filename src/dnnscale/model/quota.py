"""What a CPU quota costs a collective that follows computation (issue 22).

A testbed host runs under a CFS bandwidth quota: q cores, that is Q = q·T of CPU per period T,
no burst. A rank that computes up to a collective has spent part of its period's budget; the
collective needs c seconds of CPU (gloo, the copies, the autograd Function), and when less than
c is left the rank is throttled until the next period before it can go on. The group waits for
its last member.
"""

from __future__ import annotations

from dnnscale.model.collectives import DEFAULT_ALGORITHM, group_collective_time_s
from dnnscale.system import System
from dnnscale.system.profile import PS_PUSH_PULL
from dnnscale.system.topology import GroupSpan, Topology


def quota_stall_s(period_s: float, quota_cores: float, cpu_s: float, members: int) -> float:
    """The expected wait of a group of `members` for the quota's next period at a collective
    that follows computation.

    Formula: Q = q·T; a member arrives with a budget left uniform on (0, Q) and stalls when its
    collective CPU c exceeds it, p = min(1, c/Q), for the rest of the period, T − Q (a
    CPU-bound rank spends its budget at the period's start); the group waits when any member
    does: (T − Q)·(1 − (1 − p)^m). 0 without a quota (q ≥ 1) or without CPU.
    Units: s, cores, s, count -> s.
    Source: Linux Documentation/scheduler/sched-bwc.rst (quota per period, throttled until the
    period refreshes); measured on the testbed (issue 22, docs/accuracy.md): a traced adam-mnist
    P=2 run at 0.25 core and T = 10 ms spent 7.1 ms in a 64-200 KiB all-gather that took
    0.8 ms at 0.9 core and 1.6-2.3 ms alone at 0.25 core, and each rank waited 2.4-5.5 ms per
    call for the other; a partition collective used 0.5-2 ms of CPU (collective_cpu_bench.py).
    """
    if quota_cores >= 1 or cpu_s <= 0 or members <= 1 or period_s <= 0:
        return 0.0
    budget_s = quota_cores * period_s
    p = min(1.0, cpu_s / budget_s)
    return (period_s - budget_s) * (1.0 - (1.0 - p) ** members)


def background_exchange_s(system: System, push_bytes: float, pull_bytes: float) -> float:
    """Wall seconds a worker's background PS exchange (a plan that overlaps it with the next
    step) takes from the worker's own compute under a CPU quota.

    Formula: c / q, c = the measured CPU of a push and a pull of (push + pull) / 2 bytes each
    (System.collective_cpu_s, PS_PUSH_PULL), q the quota's cores; 0 where q ≥ 1 (the exchange's
    threads run on another core) or c was not measured. The exchange's network time still
    overlaps the compute (StepContext.combine); its CPU cannot, since both draw on one budget.
    Units: bytes, bytes -> s.
    Source: measured on the testbed (issue 22, docs/accuracy.md): with overlap on, the
    corpus's dev rows measured 0.2-1.3x the gradient's CPU cost / q more compute than with it
    off, and every setting's overlap speed-up was below the model's (4h2g: 1.24 against 1.66).
    """
    cpu_s = system.collective_cpu_s(PS_PUSH_PULL, (push_bytes + pull_bytes) / 2)
    if cpu_s is None or system.machine.cores >= 1:
        return 0.0
    return cpu_s / system.machine.cores


def call_wait_s(system: System, operation: str, payload_bytes: float, members: int,
                own_s: float = 0.0) -> float:
    """The fixed cost of a collective among `members` that follows computation (a partition
    collective, the data-parallel gradient exchange): under a CPU quota whose period is known
    and whose collective CPU was measured, the wait for the next period (quota_stall_s) for
    the CPU it needs within one period (a collective of `own_s` > T spreads its CPU over its
    time: c·T/own_s of it at once); else the system's calibrated per-call cost
    (System.call_s)."""
    cpu_s = system.collective_cpu_s(operation, payload_bytes)
    if cpu_s is None or system.cpu_period_s is None or system.machine.cores >= 1:
        return system.call_s(members)
    if own_s > system.cpu_period_s:  # spread over the collective: one period's share at once
        cpu_s *= system.cpu_period_s / own_s
    return quota_stall_s(system.cpu_period_s, system.machine.cores, cpu_s, members)


def collective_after_compute_s(system: System, operation: str, payload_bytes: float,
                               span: GroupSpan, topology: Topology,
                               algorithm: str = DEFAULT_ALGORITHM) -> float:
    """A collective that follows computation: its own time on the tiers its span crosses
    (collectives.group_collective_time_s) plus its fixed cost (call_wait_s)."""
    own_s = group_collective_time_s(operation, system.collective_library, payload_bytes, span,
                                    topology, 0.0, algorithm)
    return own_s + call_wait_s(system, operation, payload_bytes, span.size, own_s)
