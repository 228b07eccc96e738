"""What a stage's costs read of the plan's mesh beyond the tensor split: the expert split (ep,
with its load imbalance) and the sequence split (cp, with its attention algorithm).

The tensor group is the mesh's innermost dimension, then cp, then ep (plan/mesh.py), so one
stage's groups of all three are placed by `DeviceMesh.of(tp=..., cp=..., ep=...)` alone: the
dimensions outside them (dp, pp) do not change their strides.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.plan.mesh import DeviceMesh
from dnnscale.plan.plan import ParallelPlan


@dataclass(frozen=True)
class MeshSplit:
    """ep experts split (and the busiest member's token load over the mean), cp sequence
    split and its algorithm ('ring' or 'alltoall', plan.CP_ALGORITHMS)."""

    ep: int = 1
    cp: int = 1
    cp_algorithm: str = "ring"
    imbalance: float = 1.0
    etp: int | None = None
    """The routed experts' tensor split where it is not the stage's tp (None: tp)."""

    @classmethod
    def of(cls, plan: ParallelPlan) -> MeshSplit:
        return cls(plan.expert.degree, plan.context.degree, plan.context.algorithm,
                   plan.expert.imbalance, plan.expert.tensor)

    def mesh(self, tp: int) -> DeviceMesh:
        """The stage's inner mesh: tp × cp × ep (dp = pp = 1)."""
        return DeviceMesh.of(tp=tp, cp=self.cp, ep=self.ep)

    @property
    def token_fraction(self) -> float:
        """The share of each sample's tokens a member holds: 1 / cp."""
        return 1.0 / self.cp

    def expert_tensor(self, tp: int) -> int:
        """etp: the routed experts' tensor split at the stage's `tp`."""
        return self.etp or tp

    def expert_token_fraction(self, tp: int) -> float:
        """The share of each sample's token copies a member's expert layers compute on: 1 / cp
        times etp / tp — with etp < tp the tp / etp expert groups of a tensor group take
        different tokens (each member's own s / (cp · tp) under sequence parallelism, gathered
        over its etp group), each expert split etp ways."""
        return self.token_fraction * self.expert_tensor(tp) / tp


NO_SPLIT = MeshSplit()
