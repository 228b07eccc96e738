"""Where a rank process runs: the contract between the runtime's launcher and the testbed.

The launcher starts every rank as ``prefix + [python, -m, ...]`` with its environment, and the
rank binds and rendezvouses on `address` over interface `ifname` (GLOO_SOCKET_IFNAME). For a
plain local run the prefix is empty, the address 127.0.0.1 and the interface 'lo'; the testbed
gives each rank a prefix that enters its host's network namespace and CPU cgroup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

CGROUP_FD_ENV = "DNNSCALE_CGROUP_FD"
"""Set by a late-joining placement: the descriptor on which the host's cgroup.procs is open."""


@dataclass(frozen=True)
class RankPlacement:
    """One rank's host: its address, its network interface, and the command prefix to enter it."""

    address: str
    ifname: str = "lo"
    prefix: tuple[str, ...] = ()
    host: str = "localhost"
    env: dict[str, str] = field(default_factory=dict, compare=False)


def local_placements(count: int) -> list[RankPlacement]:
    """`count` ranks on this machine over loopback."""
    return [RankPlacement(address="127.0.0.1", ifname="lo", host="localhost") for _ in range(count)]


def join_cgroup() -> bool:
    """Join the host's CPU cgroup now, if the placement deferred it (late join); True if joined.

    A late-joining prefix (testbed/describe.enter_prefix) leaves the host's ``cgroup.procs``
    open on the descriptor named by DNNSCALE_CGROUP_FD; writing our pid there moves this
    process (all its threads) into the cgroup, and its later children inherit it. Called by a
    rank once torch and the runtime are imported, so start-up is not throttled by the quota.
    The variable is removed so that children do not try again.
    """
    text = os.environ.pop(CGROUP_FD_ENV, "")
    if not text:
        return False
    fd = int(text)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    return True
