"""The system: where training runs — devices, how many, the parameter-server hosts, the links.

One class for CPU clusters (Project Adam's machines: nodes of one device, one NIC tier, PS
machines that may differ from workers) and GPU clusters (nodes of several accelerators, a fast
tier inside the node and a slower one between nodes). SI units throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from dnnscale.system.device import Device
from dnnscale.system.topology import LinkTier, Topology

COLLECTIVE_LIBRARIES = ("gloo", "nccl")


@dataclass(frozen=True)
class ProfileInfo:
    """Where a calibrated profile came from: its path, when and on what machine it was made."""

    path: str
    date: str
    machine: dict[str, object]


@dataclass(frozen=True)
class System:
    """Devices (`machines` of type `machine`), links (`network` between nodes, `intra_node`
    inside one), and the parameter-server machines.

    ps_machines: hosts dedicated to parameter-server shards (a testbed with PS hosts); 0 means
    shards take machines from the same pool as workers (Project Adam's cluster, wave 1).
    collective_library: whose collectives the model prices ('gloo' on CPUs, 'nccl' on GPUs).
    """

    name: str
    machines: int
    machine: Device
    network: LinkTier
    ps_machine: Device | None = None
    ps_network: LinkTier | None = None
    ps_machines: int = 0
    devices_per_node: int = 1
    intra_node: LinkTier | None = None
    collective_library: str = "gloo"
    collective_call_s: float = 0.0
    """Fixed cost of one collective call (NCCL's launch and synchronisation), on top of its
    per-message latency."""
    collective_call_waits: tuple[tuple[int, float], ...] = ()
    """(members, seconds): what a collective of that many members costs beyond its own time
    when they meet after computing under a CPU quota (a testbed's calibration, netbench
    `coupled`); `call_s(members)` reads it, and without it every group pays collective_call_s."""
    cpu_period_s: float | None = None
    """The CFS period of the machines' CPU quota (a testbed's hosts), None without a quota."""
    collective_cpu: tuple[tuple[str, float, float], ...] = ()
    """(operation, seconds, seconds per byte): one member's CPU time in a partition collective
    of the runtime at full speed, s + bytes · s_per_byte (benchmarks/collective_cpu_bench.py);
    with `cpu_period_s` the model prices the wait for the quota's next period from it
    (model/quota.py)."""
    overlap_gamma: float = math.inf
    """γ of the γ-norm (a^γ + b^γ)^(1/γ) that combines overlapped phases; ∞ = perfect overlap."""
    straggler_spread: float = 0.0
    """Spread of replica speeds: the standard deviation of ln(mean step time) across replicas
    (model/stragglers.py); 0 = identical replicas, no straggler term."""
    ps_pull_convoy: bool = False
    """Synchronous PS: True when its shards answer the held pulls of a step one worker after
    another, as dnnscale's runtime does (runtime/ps.py; every testbed-derived system), so the
    model adds the convoy (collectives.held_pull_convoy); False: pulls proceed in parallel."""
    calibrated: bool = False
    description: str = ""
    profile_source: str = ""
    profile: ProfileInfo | None = None
    price_per_device_hour: float | None = None
    host_cores: float | None = None
    """When the machines are processes sharing one host (the `local` preset: the ranks of
    `run --local`): the host's cores. Each machine is still priced at `machine.cores`; more
    machines than the host holds at that (`machines_on_host`) are predicted optimistically,
    and the optimizer's default budget is what the host holds."""

    @property
    def machines_on_host(self) -> int | None:
        """How many machines of `machine.cores` the shared host holds (None: no shared host)."""
        if self.host_cores is None:
            return None
        return max(1, math.floor(self.host_cores / self.machine.cores + 1e-9))

    @property
    def default_budget(self) -> int:
        """The optimizer's machine budget when none is given: every machine, or on a shared
        host as many as it holds."""
        held = self.machines_on_host
        return self.machines if held is None else min(self.machines, held)

    def shared_host_note(self, machines: int) -> str | None:
        """A note when `machines` processes share this host's cores beyond what the prices
        assume, else None."""
        held = self.machines_on_host
        if held is None or machines <= held:
            return None
        return (f"{machines} ranks share {self.name}'s {self.host_cores:g} cores, but each is "
                f"priced at {self.machine.cores:g} core (as if {held} did): the prediction is "
                f"optimistic")

    def collective_cpu_s(self, operation: str, payload_bytes: float) -> float | None:
        """One member's CPU seconds in `operation` on `payload_bytes`, if measured."""
        for name, seconds, per_byte in self.collective_cpu:
            if name == operation:
                return seconds + payload_bytes * per_byte
        return None

    def call_s(self, members: int) -> float:
        """The fixed cost of one collective among `members`: collective_call_s, or where
        collective_call_waits were measured, those waits interpolated linearly in the group
        size (the nearest measured size below the smallest; beyond the largest, the line
        through the last two, never below the last: an extrapolation, docs/accuracy.md)."""
        waits = sorted(self.collective_call_waits)
        if not waits or members <= 1:
            return self.collective_call_s if members > 1 else 0.0
        if members <= waits[0][0]:
            return waits[0][1]
        for (m0, s0), (m1, s1) in zip(waits, waits[1:]):
            if members <= m1:
                return s0 + (s1 - s0) * (members - m0) / (m1 - m0)
        if len(waits) == 1:
            return waits[0][1]
        (m0, s0), (m1, s1) = waits[-2], waits[-1]
        return max(s1, s1 + (s1 - s0) * (members - m1) / (m1 - m0))

    @property
    def ps(self) -> Device:
        return self.ps_machine or self.machine

    @property
    def ps_net(self) -> LinkTier:
        return self.ps_network or self.network

    @property
    def worker_machines(self) -> int:
        """Machines that can hold workers: all of them, less dedicated PS hosts."""
        return self.machines - self.ps_machines

    @property
    def topology(self) -> Topology:
        return Topology(self.devices_per_node, self.network, self.intra_node)

    def with_machines(self, machines: int) -> "System":
        """The same system with a budget of `machines` (dedicated PS hosts kept)."""
        return replace(self, machines=machines)
