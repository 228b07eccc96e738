"""Adam's sub-space of the search: the fastest CPU configuration (sync mode, P, R, S, n,
intervals) within a machine budget, and the scalability curve. Reached through the one entry
point, `dnnscale.optimize.optimize` (optimize/entry.py)."""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dnnscale.boundary import check_prediction
from dnnscale.errors import InputError, require_int
from dnnscale.model.compose import StepContext
from dnnscale.model.prediction import Prediction
from dnnscale.optimize.exhaustive import EXHAUSTIVE_MAX_MACHINES, exhaustive_result
from dnnscale.optimize.group import GroupSearch
from dnnscale.optimize.problem import Problem, prepare
from dnnscale.optimize.result import (CurvePoint, OptimizeResult, explain, explain_protocols,
                                      rank_key)
from dnnscale.optimize.search import BudgetSearch, Found, leftmost_reaching
from dnnscale.optimize.space import Group, curve_budgets
from dnnscale.plan.config import Config
from dnnscale.system import System
from dnnscale.workload import Workload

CHECK_TOLERANCE = 1e-9
"""The search's throughput must match predict_config's to this relative tolerance."""


def _searches(problem: Problem, groups: list[Group]) -> list[GroupSearch]:
    """One GroupSearch per group, each on a StepContext priced once (the model's own)."""
    searches = []
    for group in groups:
        min_shards = problem.min_shards(group) or 1
        plan = group.config(problem.space.base, 1, min_shards).to_plan()
        stage = problem.stage(group.partitions, group.minibatch, group.fc_protocol)
        context = StepContext(problem.workload, problem.cluster, plan, (stage,))
        searches.append(GroupSearch(group, context, min_shards))
    return searches


def _fewest_replicas(evaluator: GroupSearch, found: Found) -> int:
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


def _fewest_machines(evaluator: GroupSearch, found: Found, machines: int) -> Found:
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


def _checked(problem: Problem, evaluator: GroupSearch, found: Found,
             machines: int | None = None) -> Prediction:
    """predict_config's prediction of a found configuration (tied toward fewer machines),
    checked against the search."""
    found = _fewest_machines(evaluator, found, machines or problem.machines)
    replicas = found.replicas
    config = evaluator.group.config(problem.space.base, replicas, found.ps_shards)
    prediction = problem.predict(config)
    if not prediction.fits or config.machines > problem.cluster.machines:
        raise RuntimeError(f"optimizer bug: {config.label()} is infeasible")
    epoch_throughput = prediction.epoch_throughput_samples_per_s  # = X without stragglers
    if abs(epoch_throughput - found.throughput) > CHECK_TOLERANCE * found.throughput:
        raise RuntimeError(f"optimizer bug: {config.label()}: search throughput "
                           f"{found.throughput!r} != predict_config's {epoch_throughput!r}")
    return prediction


def _top(problem: Problem, evaluators: list[GroupSearch], machines: int,
         top: int) -> tuple[list[Prediction], BudgetSearch]:
    search = BudgetSearch(evaluators, machines)
    for index in range(len(evaluators)):
        search.add_root(index)
    found = search.run(top)
    ranked = [_checked(problem, evaluators[f.group_index], f) for f in found]
    return sorted(ranked, key=rank_key), search


def _curve(problem: Problem, evaluators: list[GroupSearch], first: int,
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
        if previous is not None and rank_key(previous) < rank_key(prediction):
            prediction = previous  # equal up to rounding; keep the curve non-increasing
        base_time = points[0].epoch_time_s if points else prediction.epoch_time_s
        points.append(CurvePoint(machines, prediction.epoch_time_s,
                                 base_time / prediction.epoch_time_s, prediction))
        previous = prediction
    return points


def optimize_adam(workload: str | Path | Workload, cluster: str | Path | System,
             machines: int | None = None, modes: str | Sequence[str] | None = None,
             top: int = 5, minibatch: int | Iterable[int] | None = None,
             push_every: int | Iterable[int] | None = None,
             pull_every: int | Iterable[int] | None = None, base: Config | None = None,
             curve: bool = True, method: str = "fast",
             fc_protocols: str | Sequence[str] | None = None,
             choose_overlap: bool = False) -> OptimizeResult:
    """The configuration with the minimum predicted epoch time within `machines` (default: the
    cluster's), the best of the `top` best groups, and the scalability curve.

    workload, cluster: names, YAML paths or objects. modes: sync modes to consider ('ps-async',
    'ps-sync', 'allreduce'; default all the fixed fields allow). minibatch, push_every,
    pull_every: one value or several to choose from (default 32, 1, 1). base: the fixed fields
    (fc_protocol, overlap, optimizer, epoch_fraction). method: 'fast' (exact branch and bound) or
    'exhaustive' (every configuration through predict_config; the reference). fc_protocols
    ('weights,vectors') and choose_overlap let the PS configurations choose Adam's FC protocol
    and overlap; the result then names the best of each protocol and which wins, and why.
    Raises InputError (naming the field) for bad input or a budget too small for any feasible
    configuration.
    """
    require_int("top", top)
    if method not in ("fast", "exhaustive"):
        raise InputError("method", f"must be 'fast' or 'exhaustive', got {method!r}")
    start = time.perf_counter()
    problem = prepare(workload, cluster, machines, modes, minibatch, push_every, pull_every, base,
                      fc_protocols=fc_protocols, choose_overlap=choose_overlap)
    if method == "exhaustive":
        if problem.machines > EXHAUSTIVE_MAX_MACHINES:
            raise InputError("machines", f"the exhaustive reference enumerates O(M²) "
                             f"configurations: at most {EXHAUSTIVE_MAX_MACHINES:,} machines, got "
                             f"{problem.machines:,}")
        result = exhaustive_result(problem, top, curve, start)
        check_prediction(result.best, "optimize")
        return result
    groups = problem.groups()
    evaluators = _searches(problem, groups)
    ranked, search = _top(problem, evaluators, problem.machines, top)

    def best_where(in_group: Callable[[Group], bool],
                   in_config: Callable[[Config], bool]) -> Prediction | None:
        """The best configuration of the groups `in_group` selects (from the top if there)."""
        chosen = [p for p in ranked if p.config is not None and in_config(p.config)]
        if chosen:
            return chosen[0]
        indices = [i for i, g in enumerate(groups) if in_group(g)]
        if not indices:
            return None
        subset = BudgetSearch(evaluators, problem.machines)
        for index in indices:
            subset.add_root(index)
        found = subset.run(1)
        return _checked(problem, evaluators[found[0].group_index], found[0]) if found else None

    per_mode: dict[str, Prediction] = {}
    for mode in problem.space.modes:
        best_mode = best_where(lambda g, m=mode: g.sync == m, lambda c, m=mode: c.sync == m)
        if best_mode is not None:
            per_mode[mode] = best_mode
    per_protocol: dict[str, Prediction] = {}
    for protocol in problem.space.fc_protocols:
        best_protocol = best_where(lambda g, p=protocol: g.fc_protocol == p,
                                   lambda c, p=protocol: c.uses_ps and c.fc_protocol == p)
        if best_protocol is not None:
            per_protocol[protocol] = best_protocol
    first = problem.min_machines()
    assert first is not None  # prepare() raised otherwise
    points = _curve(problem, evaluators, first, search.root_bound) if curve else []
    elapsed = time.perf_counter() - start
    best = check_prediction(ranked[0], "optimize")
    return OptimizeResult(
        workload=problem.workload.name, cluster=problem.cluster.name, machines=problem.machines,
        method="fast", best=best, top=ranked, curve=points, families=per_mode,
        infeasible=problem.infeasible, evaluated=sum(e.evaluations for e in evaluators),
        bounds_evaluated=sum(e.bounds for e in evaluators), search_time_s=elapsed,
        explanation=explain(best, ranked, per_mode, problem.machines)
        + explain_protocols(per_protocol), best_per_protocol=per_protocol)
