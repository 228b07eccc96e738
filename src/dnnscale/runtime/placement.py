"""Where a rank process runs: the contract between the runtime's launcher and the testbed.

The launcher starts every rank as ``prefix + [python, -m, ...]`` with its environment, and the
rank binds and rendezvouses on `address` over interface `ifname` (GLOO_SOCKET_IFNAME). For a
plain local run the prefix is empty, the address 127.0.0.1 and the interface 'lo'; the testbed
gives each rank a prefix that enters its host's network namespace and CPU cgroup.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
