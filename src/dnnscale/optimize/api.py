"""`optimize`: the fastest configuration within a machine budget, and the scalability curve."""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dnnscale.boundary import check_prediction, finite_answers
from dnnscale.config.config import Config, max_partitions
from dnnscale.errors import InputError, require_int
from dnnscale.model.predict import predict_config
from dnnscale.model.prediction import Prediction
from dnnscale.model.replica import ReplicaCosts, replica_costs
from dnnscale.optimize.evaluator import GroupEvaluator
from dnnscale.optimize.feasibility import (Infeasible, min_ps_shards, ranges, too_small_error,
                                           worker_fits)
from dnnscale.optimize.result import CurvePoint, OptimizeResult, explain
from dnnscale.optimize.search import BudgetSearch, Found, leftmost_reaching
from dnnscale.optimize.space import Group, SearchSpace, curve_budgets, make_space
from dnnscale.units import format_si

if TYPE_CHECKING:
    from dnnscale.cluster.spec import Cluster
    from dnnscale.workload.workload import Workload

SCAN_BEYOND = 4096
"""When no P within the budget fits in memory, how many more to try for the error message."""
CHECK_TOLERANCE = 1e-9
"""The search's throughput must match predict_config's to this relative tolerance."""


@dataclass
class Problem:
    """A workload, a cluster sized to the budget, the search space, and what fits in memory."""

    workload: "Workload"
    cluster: "Cluster"
    machines: int
    space: SearchSpace
    replicas: dict[tuple[int, int], ReplicaCosts]
    """Replica costs per (P, n), computed once."""
    fitting: dict[tuple[int, int], bool]
    shards_needed: dict[tuple[int, int], int | None]
    """Fewest PS shards that fit in memory per (P, n) (the shards store W + (P−1)·W_rep)."""
    infeasible: list[Infeasible]
    max_partitions: int

    def groups(self) -> list[Group]:
        return [g for g in self.space.groups(self.max_partitions)
                if self.fitting[(g.partitions, g.minibatch)]
                and (not g.uses_ps or self.min_shards(g) is not None)]

    def min_shards(self, group: Group) -> int | None:
        return self.shards_needed.get((group.partitions, group.minibatch))

    def min_machines(self) -> int | None:
        """The smallest budget with a feasible configuration (None: none at any budget)."""
        needs = [g.partitions + ((self.min_shards(g) or 0) if g.uses_ps else 0)
                 for g in self.groups()]
        return min(needs) if needs else None

    def predict(self, config: Config) -> Prediction:
        replica = self.replicas[(config.partitions, config.minibatch)]
        return predict_config(self.workload, self.cluster, config, replica=replica)


def prepare(workload: "str | Path | Workload", cluster: "str | Path | Cluster",
            machines: int | None = None, modes: str | Sequence[str] | None = None,
            minibatch: int | Iterable[int] | None = None,
            push_every: int | Iterable[int] | None = None,
            pull_every: int | Iterable[int] | None = None,
            base: Config | None = None, check_budget: bool = True) -> Problem:
    """Load and validate the inputs; cost each replica once per (P, n); find what fits.

    Raises InputError when the budget admits no feasible configuration (unless check_budget is
    False: the exhaustive reference uses that to confirm there is none).
    """
    from dnnscale.cluster import load_cluster
    from dnnscale.workload import load_workload

    from dnnscale.cluster.load import MAX_MACHINES
    from dnnscale.config.config import validate_config

    w, c = load_workload(workload), load_cluster(cluster)
    budget = require_int("machines", c.machines if machines is None else machines,
                         maximum=MAX_MACHINES)
    if budget != c.machines:
        c = c.with_machines(budget)
    space = make_space(modes, minibatch, push_every, pull_every,
                       None if base is None else validate_config(base, "base"))
    infeasible: list[Infeasible] = []
    too_large = [n for n in space.minibatches if n > w.samples_per_epoch]
    if too_large:  # a global step may not train on more samples than the epoch has
        if len(too_large) == len(space.minibatches):
            raise InputError("minibatch", f"{too_large[0]} is more than the "
                             f"{w.samples_per_epoch} samples of one epoch")
        space = dataclasses.replace(space, minibatches=tuple(
            n for n in space.minibatches if n <= w.samples_per_epoch))
        infeasible.append(Infeasible(f"n={ranges(too_large)}", f"more than the "
                                     f"{w.samples_per_epoch} samples of one epoch"))
    p_max = min(max_partitions(w), budget)
    replicas: dict[tuple[int, int], ReplicaCosts] = {}
    fitting: dict[tuple[int, int], bool] = {}
    for n in space.minibatches:
        too_big: list[int] = []
        needs: list[float] = []
        for partitions in range(1, p_max + 1):
            replica = replica_costs(w, c.machine, c.network, partitions, n, space.base.fc_protocol)
            replicas[(partitions, n)] = replica
            fits, need = worker_fits(w, c, space.base, partitions, n, replica)
            fitting[(partitions, n)] = fits
            if not fits:
                too_big.append(partitions)
                needs.append(need)
        if too_big:
            infeasible.append(Infeasible(
                f"P={ranges(too_big)} at n={n}",
                f"a worker needs up to {format_si(max(needs), 'B')} > "
                f"{format_si(c.machine.memory_bytes, 'B')} of memory"))
    min_shards = None
    shards_needed: dict[tuple[int, int], int | None] = {}
    if any(mode != "allreduce" for mode in space.modes):
        by_stored: dict[int, int | None] = {}  # PS memory depends on the stored parameters only
        for key, replica in replicas.items():
            stored = replica.stored_params(w.params)
            if stored not in by_stored:
                by_stored[stored] = min_ps_shards(w, c, space.base, replica, max(1, stored))
            shards_needed[key] = by_stored[stored]
        min_shards = shards_needed[(1, space.minibatches[0])]
        if min_shards is None:
            infeasible.append(Infeasible("parameter server", "the weights do not fit in PS memory "
                                         "at any number of shards"))
        elif min_shards > 1:
            infeasible.append(Infeasible(f"S<{min_shards}", "the parameter-server shards do not "
                                         "fit in PS memory"))
    problem = Problem(w, c, budget, space, replicas, fitting, shards_needed, infeasible, p_max)
    needed = problem.min_machines()
    if check_budget and (needed is None or needed > budget):
        fitting_p = [p for (p, _), fits in fitting.items() if fits]
        n_min = space.minibatches[0]
        _, need = worker_fits(w, c, space.base, p_max, n_min, replicas[(p_max, n_min)])
        widest = (p_max, n_min, need)
        if not fitting_p:  # beyond the budget, how many partitions would fit?
            for partitions in range(p_max + 1, min(max_partitions(w), p_max + SCAN_BEYOND) + 1):
                replica = replica_costs(w, c.machine, c.network, partitions, n_min,
                                        space.base.fc_protocol)
                fits, need = worker_fits(w, c, space.base, partitions, n_min, replica)
                widest = (partitions, n_min, need)
                if fits:
                    fitting_p = [partitions]
                    break
        if fitting_p and (min(fitting_p), n_min) in shards_needed:
            min_shards = shards_needed[(min(fitting_p), n_min)]
        raise too_small_error(budget, min(fitting_p) if fitting_p else None, min_shards,
                              space.modes, w, c, widest)
    return problem


def _evaluators(problem: Problem, groups: list[Group]) -> list[GroupEvaluator]:
    return [GroupEvaluator(g, g.config(problem.space.base, 1, problem.min_shards(g) or 1),
                           problem.workload, problem.cluster,
                           problem.replicas[(g.partitions, g.minibatch)], problem.min_shards(g) or 1)
            for g in groups]


def _fewest_replicas(evaluator: GroupEvaluator, found: Found) -> int:
    """The fewest replicas that reach the found throughput at the same S (PS modes, where X is
    nondecreasing in R): ties resolved toward idle machines rather than wasted ones."""
    if not evaluator.group.uses_ps:
        return found.replicas
    target = evaluator.throughput(found.replicas, found.ps_shards)
    lo, hi = 1, found.replicas
    while lo < hi:
        mid = (lo + hi) // 2
        if evaluator.throughput(mid, found.ps_shards) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo if evaluator.throughput(lo, found.ps_shards) >= target else found.replicas


def _fewest_machines(evaluator: GroupEvaluator, found: Found, machines: int) -> Found:
    """Among the group's configurations as fast as `found`, one with the fewest machines: the
    smallest search variable that reaches its throughput, then the fewest replicas."""
    x = found.ps_shards if evaluator.group.uses_ps else found.replicas
    candidates = [found]
    domain = evaluator.domain(machines)
    if domain is not None and x > domain[0]:
        left = leftmost_reaching(evaluator, machines, domain[0], x - 1, found.throughput)
        if left is not None:
            replicas, shards = evaluator.replicas_and_shards(left, machines)
            candidates.append(Found(found.group_index, replicas, shards,
                                    evaluator.value(left, machines)))
    trimmed = [dataclasses.replace(c, replicas=_fewest_replicas(evaluator, c)) for c in candidates]
    return min(trimmed, key=lambda c: (c.replicas * evaluator.P + c.ps_shards, -c.throughput))


def _checked(problem: Problem, evaluator: GroupEvaluator, found: Found,
             machines: int | None = None) -> Prediction:
    """predict_config's prediction of a found configuration (tied toward fewer machines),
    checked against the search."""
    found = _fewest_machines(evaluator, found, machines or problem.machines)
    replicas = found.replicas
    config = evaluator.group.config(problem.space.base, replicas, found.ps_shards)
    prediction = problem.predict(config)
    if not prediction.fits or config.machines > problem.cluster.machines:
        raise RuntimeError(f"optimizer bug: {config.label()} is infeasible")
    if abs(prediction.throughput_samples_per_s - found.throughput) > CHECK_TOLERANCE * found.throughput:
        raise RuntimeError(f"optimizer bug: {config.label()}: search throughput "
                           f"{found.throughput!r} != predict_config's "
                           f"{prediction.throughput_samples_per_s!r}")
    return prediction


def _rank_key(prediction: Prediction) -> tuple[float, int, str]:
    return prediction.epoch_time_s, prediction.config.machines, prediction.config.label()


def _top(problem: Problem, evaluators: list[GroupEvaluator], machines: int,
         top: int) -> tuple[list[Prediction], BudgetSearch]:
    search = BudgetSearch(evaluators, machines)
    for index in range(len(evaluators)):
        search.add_root(index)
    found = search.run(top)
    ranked = [_checked(problem, evaluators[f.group_index], f) for f in found]
    return sorted(ranked, key=_rank_key), search


def _curve(problem: Problem, evaluators: list[GroupEvaluator], first: int,
           root_bounds: dict[int, float]) -> list[CurvePoint]:
    """Best configuration at every curve budget, largest first, each group entering with the
    bound it had at the last larger budget (a valid bound at every smaller one)."""
    budgets = curve_budgets(first, problem.machines)
    stale = [(-bound, group) for group, bound in root_bounds.items()]
    heapq.heapify(stale)
    best: dict[int, Prediction] = {}
    for machines in reversed(budgets):
        search = BudgetSearch(evaluators, machines, stale)
        found = search.run(1)
        if not found:
            raise RuntimeError(f"optimizer bug: no configuration at {machines} machines")
        best[machines] = _checked(problem, evaluators[found[0].group_index], found[0], machines)
        for group in search.refreshed:  # infeasible groups stay so at every smaller budget
            if group in search.root_bound:
                heapq.heappush(stale, (-search.root_bound[group], group))
    points: list[CurvePoint] = []
    previous: Prediction | None = None
    for machines in budgets:
        prediction = best[machines]
        if previous is not None and _rank_key(previous) < _rank_key(prediction):
            prediction = previous  # equal up to rounding; keep the curve non-increasing
        base_time = points[0].epoch_time_s if points else prediction.epoch_time_s
        points.append(CurvePoint(machines, prediction.epoch_time_s,
                                 base_time / prediction.epoch_time_s, prediction))
        previous = prediction
    return points


@finite_answers("optimize")
def optimize(workload: "str | Path | Workload", cluster: "str | Path | Cluster",
             machines: int | None = None, modes: str | Sequence[str] | None = None,
             top: int = 5, minibatch: int | Iterable[int] | None = None,
             push_every: int | Iterable[int] | None = None,
             pull_every: int | Iterable[int] | None = None, base: Config | None = None,
             curve: bool = True, method: str = "fast") -> OptimizeResult:
    """The configuration with the minimum predicted epoch time within `machines` (default: the
    cluster's), the best of the `top` best groups, and the scalability curve.

    workload, cluster: names, YAML paths or objects. modes: sync modes to consider ('ps-async',
    'ps-sync', 'allreduce'; default all the fixed fields allow). minibatch, push_every,
    pull_every: one value or several to choose from (default 32, 1, 1). base: the fixed fields
    (fc_protocol, overlap, optimizer, epoch_fraction). method: 'fast' (exact branch and bound) or
    'exhaustive' (every configuration through predict_config; the reference).
    Raises InputError (naming the field) for bad input or a budget too small for any feasible
    configuration.
    """
    require_int("top", top)
    if method not in ("fast", "exhaustive"):
        raise InputError("method", f"must be 'fast' or 'exhaustive', got {method!r}")
    start = time.perf_counter()
    problem = prepare(workload, cluster, machines, modes, minibatch, push_every, pull_every, base)
    if method == "exhaustive":
        from dnnscale.optimize.exhaustive import EXHAUSTIVE_MAX_MACHINES, exhaustive_result

        if problem.machines > EXHAUSTIVE_MAX_MACHINES:
            raise InputError("machines", f"the exhaustive reference enumerates O(M²) "
                             f"configurations: at most {EXHAUSTIVE_MAX_MACHINES:,} machines, got "
                             f"{problem.machines:,}")

        result = exhaustive_result(problem, top, curve, start)
        check_prediction(result.best, "optimize")
        return result
    groups = problem.groups()
    evaluators = _evaluators(problem, groups)
    ranked, search = _top(problem, evaluators, problem.machines, top)
    per_mode: dict[str, Prediction] = {}
    for mode in problem.space.modes:
        indices = [i for i, g in enumerate(groups) if g.sync == mode]
        chosen = [p for p in ranked if p.config.sync == mode]
        if chosen:
            per_mode[mode] = chosen[0]
        elif indices:
            mode_search = BudgetSearch(evaluators, problem.machines)
            for index in indices:
                mode_search.add_root(index)
            found = mode_search.run(1)
            if found:
                per_mode[mode] = _checked(problem, evaluators[found[0].group_index], found[0])
    first = problem.min_machines()
    assert first is not None  # prepare() raised otherwise
    points = _curve(problem, evaluators, first, search.root_bound) if curve else []
    elapsed = time.perf_counter() - start
    best = check_prediction(ranked[0], "optimize")
    return OptimizeResult(
        workload=problem.workload.name, cluster=problem.cluster.name, machines=problem.machines,
        method="fast", best=best, top=ranked, curve=points, best_per_mode=per_mode,
        infeasible=problem.infeasible, evaluated=sum(e.evaluations for e in evaluators),
        bounds_evaluated=sum(e.bounds for e in evaluators), search_time_s=elapsed,
        explanation=explain(best, ranked, per_mode, problem.machines))
