"""The reference: every configuration with R·P + S ≤ M through predict_config, nothing skipped.

O(modes · P_max · M² / P) predictions, so only for checking the fast search (tests, the speed
benchmark, `dnnscale optimize --exhaustive`) on modest budgets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from dnnscale.plan.config import Config
from dnnscale.plan.rules import max_replicas
from dnnscale.model.prediction import Prediction
from dnnscale.optimize.problem import Problem
from dnnscale.optimize.result import (CurvePoint, OptimizeResult, explain, explain_protocols,
                                      rank_key)
from dnnscale.optimize.space import Group, curve_budgets

EXHAUSTIVE_MAX_MACHINES = 2_000
"""The largest budget the reference enumerates (about 3 minutes at 1,000 machines)."""
OPTIMUM_TOLERANCE = 1e-9
"""Configurations within this relative epoch time of the best all count as optima."""


@dataclass
class Enumeration:
    """What enumerating every configuration found.

    best_per_group: the best feasible configuration of each group; best_by_machines: the best
    feasible configuration that occupies exactly m machines, per m; optima: every feasible
    configuration within OPTIMUM_TOLERANCE of the best; evaluated / infeasible: configurations
    predicted / found not to fit in memory.
    """

    best_per_group: dict[Group, Prediction] = field(default_factory=dict)
    best_by_machines: dict[int, Prediction] = field(default_factory=dict)
    optima: list[tuple[float, Config]] = field(default_factory=list)
    evaluated: int = 0
    infeasible: int = 0

    @property
    def best(self) -> Prediction:
        return min(self.best_per_group.values(), key=rank_key)

    def best_within(self, machines: int) -> Prediction | None:
        """The best feasible configuration using at most `machines` machines."""
        within = [p for m, p in self.best_by_machines.items() if m <= machines]
        return min(within, key=rank_key) if within else None


def _configs(group: Group, base: Config, machines: int, most_replicas: int) -> Iterator[Config]:
    """Every configuration of the group within the budget, with R·n at most one epoch."""
    P = group.partitions
    if not group.uses_ps:
        for replicas in range(1, min(machines // P, most_replicas) + 1):
            yield group.config(base, replicas, 0)
        return
    for shards in range(1, machines - P + 1):
        for replicas in range(1, min((machines - shards) // P, most_replicas) + 1):
            yield group.config(base, replicas, shards)


def enumerate_all(problem: Problem) -> Enumeration:
    """Predict every configuration of the space under the problem's budget."""
    result = Enumeration()
    best_time = float("inf")
    for group in problem.space.groups(problem.max_partitions):
        most = max_replicas(problem.workload, group.minibatch)
        for config in _configs(group, problem.space.base, problem.machines, most):
            prediction = problem.predict(config)
            result.evaluated += 1
            if not prediction.fits:
                result.infeasible += 1
                continue
            key = rank_key(prediction)
            current = result.best_per_group.get(group)
            if current is None or key < rank_key(current):
                result.best_per_group[group] = prediction
            used = config.machines
            current = result.best_by_machines.get(used)
            if current is None or key < rank_key(current):
                result.best_by_machines[used] = prediction
            seconds = prediction.epoch_time_s
            if seconds <= best_time * (1 + OPTIMUM_TOLERANCE):
                result.optima.append((seconds, config))
                if seconds < best_time:
                    best_time = seconds
                    result.optima = [(s, c) for s, c in result.optima
                                     if s <= best_time * (1 + OPTIMUM_TOLERANCE)]
    return result


def exhaustive_result(problem: Problem, top: int, curve: bool, start: float) -> OptimizeResult:
    """The same answer as the fast search, by enumeration."""
    found = enumerate_all(problem)
    ranked = sorted(found.best_per_group.values(), key=rank_key)[:top]
    per_mode: dict[str, Prediction] = {}
    per_protocol: dict[str, Prediction] = {}
    for prediction in sorted(found.best_per_group.values(), key=rank_key):
        per_mode.setdefault(prediction.config.sync, prediction)
        if problem.space.fc_protocols and prediction.config.uses_ps:
            per_protocol.setdefault(prediction.config.fc_protocol, prediction)
    points: list[CurvePoint] = []
    if curve:
        first = min(found.best_by_machines)
        for machines in curve_budgets(first, problem.machines):
            prediction = found.best_within(machines)
            assert prediction is not None
            base_time = points[0].epoch_time_s if points else prediction.epoch_time_s
            points.append(CurvePoint(machines, prediction.epoch_time_s,
                                     base_time / prediction.epoch_time_s, prediction))
    best = ranked[0]
    return OptimizeResult(
        workload=problem.workload.name, cluster=problem.cluster.name, machines=problem.machines,
        method="exhaustive", best=best, top=ranked, curve=points,
        families={m: per_mode[m] for m in problem.space.modes if m in per_mode},
        infeasible=problem.infeasible, evaluated=found.evaluated, bounds_evaluated=0,
        search_time_s=time.perf_counter() - start,
        explanation=explain(best, ranked, per_mode, problem.machines)
        + explain_protocols(per_protocol), best_per_protocol=per_protocol)
