"""Cluster description: machines, their compute rates, the network. SI units throughout.

Compute rates are per core and per (layer kind, phase), each a `RateCurve` over the FLOPs of one
call; lookup goes from the most specific key to the least: ``linear.weight_grad``, ``linear``,
``default``. Memory-bound layers (pooling, activations, loss) are costed by bytes over the
machine's memory bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from dnnscale.cluster.curve import RateCurve

PHASES = ("forward", "input_grad", "weight_grad")


@dataclass(frozen=True)
class MachineSpec:
    """One machine type (a worker or a parameter server)."""

    cores: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    flops_per_s_per_core: dict[str, RateCurve]
    update_s_per_param: float
    """Seconds for this machine to apply one parameter's update (w -= lr·g), all cores."""

    def flops_per_s(self, kind: str, phase: str, size_flop: float) -> float:
        """Achieved FLOP/s of the whole machine for a call of `size_flop` FLOPs."""
        curves = self.flops_per_s_per_core
        curve = curves.get(f"{kind}.{phase}") or curves.get(kind) or curves["default"]
        return curve.at(size_flop) * self.cores


@dataclass(frozen=True)
class NetworkSpec:
    """A NIC: bandwidth in each direction (full duplex) and per-message latency."""

    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class Cluster:
    """Where training runs: M machines of one type (PS machines may differ), one network."""

    name: str
    machines: int
    machine: MachineSpec
    network: NetworkSpec
    ps_machine: MachineSpec | None = None
    ps_network: NetworkSpec | None = None
    overlap_gamma: float = math.inf
    """γ of the γ-norm (a^γ + b^γ)^(1/γ) that combines overlapped phases; ∞ = perfect overlap."""
    calibrated: bool = False
    description: str = ""
    profile_source: str = ""
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def ps(self) -> MachineSpec:
        return self.ps_machine or self.machine

    @property
    def ps_net(self) -> NetworkSpec:
        return self.ps_network or self.network

    def with_machines(self, machines: int) -> "Cluster":
        return replace(self, machines=machines)
