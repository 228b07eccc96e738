"""One group of the search (sync mode, P, n, k_push, k_pull) as a function of its one integer
search variable, on top of the model's own composition (model/compose.py).

For PS modes the variable is S, with R the most replicas the budget leaves, floor((M − S)/P)
(or floor(M_workers/P) on a system with dedicated PS hosts); for all-reduce it is R. Either way
R is at most one epoch's worth, floor(samples per epoch / n) (plan/rules.py: a global step may
not hold more samples than the epoch); X is nondecreasing in R for PS modes, so the capped R
still maximises it and `bound` still bounds. Why this
loses nothing, and why `bound` bounds, is in compose.py's docstring. No cost formula lives here:
throughput and bound are compose's, on a StepContext priced once per group.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.model.compose import StepContext, bound, objective
from dnnscale.optimize.space import Group
from dnnscale.plan.rules import max_replicas


@dataclass
class GroupSearch:
    """X(R, S) of one group. `min_shards`: fewest shards whose PS memory fits."""

    group: Group
    context: StepContext
    min_shards: int
    evaluations: int = 0
    bounds: int = 0

    @property
    def P(self) -> int:
        return self.group.partitions

    @property
    def most_replicas(self) -> int:
        """R·n within one epoch."""
        return max_replicas(self.context.workload, self.group.minibatch)

    def _replicas(self, shards: int, machines: int) -> int:
        system = self.context.system
        if system.ps_machines:
            return min((machines - system.ps_machines) // self.P, self.most_replicas)
        return min((machines - shards) // self.P, self.most_replicas)

    def domain(self, machines: int) -> tuple[int, int] | None:
        """The search variable's range under a budget of `machines`: S for PS modes (each with
        at least one replica), R for all-reduce; None when nothing fits."""
        system = self.context.system
        if self.group.uses_ps:
            if system.ps_machines:
                hi = system.ps_machines
                fits = self._replicas(0, machines) >= 1
            else:
                hi = machines - self.P
                fits = True
            return (self.min_shards, hi) if fits and hi >= self.min_shards else None
        hi = min((machines - system.ps_machines) // self.P, self.most_replicas)
        return (1, hi) if hi >= 1 else None

    def replicas_and_shards(self, x: int, machines: int) -> tuple[int, int]:
        if self.group.uses_ps:
            return self._replicas(x, machines), x
        return x, 0

    def value(self, x: int, machines: int) -> float:
        """Throughput (samples/s) at search variable x under the budget."""
        replicas, shards = self.replicas_and_shards(x, machines)
        return self.throughput(replicas, shards)

    def throughput(self, replicas: int, shards: int) -> float:
        """Epoch throughput of the configuration (R, S) of this group: compose.objective, the
        throughput itself unless a straggler spread lengthens asynchronous epochs."""
        self.evaluations += 1
        return objective(self.context, replicas, shards)

    def bound(self, lo: int, hi: int, machines: int) -> float:
        """An upper bound of value(x) over x in [lo, hi] (equal to it when lo == hi)."""
        self.bounds += 1
        return bound(self.context, lo, hi, self._replicas(lo, machines))
