"""The fast exact search: best-first branch and bound over each group's one search variable.

Every group (sync mode, P, n, k_push, k_pull) has one integer search variable x on an interval
(S for PS modes, with R = floor((M − S)/P); R for all-reduce; see group.py for why this loses
nothing) and an upper bound of its throughput over any sub-interval that is exact on a single
point. All groups' intervals share one max-heap keyed by that bound; a group is finished when
the best bound left for it is no better than the best throughput found in it (its incumbent),
and groups finish in order of their best throughput — so the first K to finish are the exact top
K, and the search touches only groups and intervals that could still win.

The scalability curve runs the same search for K = 1 at every budget, from the largest down:
a group's bound at a larger budget bounds it at every smaller one, so the groups wait in a
second heap under their last bound and are re-bounded only when that stale bound could still
beat everything fresh — most groups are never touched again.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from dnnscale.optimize.group import GroupSearch

RELATIVE_TOLERANCE = 1e-12
"""A bound within this factor of an incumbent cannot beat it by more than rounding noise."""

_INTERVAL, _INCUMBENT = 1, 2


@dataclass(frozen=True)
class Found:
    """The best (R, S) of one group under a budget and its throughput in samples/s."""

    group_index: int
    replicas: int
    ps_shards: int
    throughput: float


class BudgetSearch:
    """Top-K groups under one budget; `stale` seeds groups with bounds from a larger budget."""

    def __init__(self, evaluators: list[GroupSearch], machines: int,
                 stale: list[tuple[float, int]] | None = None) -> None:
        """`stale`: a heap of (−bound, group) of groups not yet bounded at this budget, each
        bound valid here (one from a larger budget); popped ones are listed in `refreshed`."""
        self.evaluators = evaluators
        self.machines = machines
        self.stale = stale if stale is not None else []
        self.refreshed: list[int] = []
        self.heap: list[tuple[float, bool, int, int, int, int, int]] = []
        self.incumbent: dict[int, tuple[float, int]] = {}
        self.root_bound: dict[int, float] = {}
        self.infeasible: set[int] = set()
        self._sequence = 0

    def _push(self, bound: float, kind: int, group: int, lo: int, hi: int) -> None:
        self._sequence += 1
        # Among equal bounds an incumbent pops first: it finishes its group without a split.
        heapq.heappush(self.heap, (-bound, kind == _INTERVAL, self._sequence, kind, group, lo, hi))

    def _offer(self, group: int, x: int) -> None:
        value = self.evaluators[group].value(x, self.machines)
        best = self.incumbent.get(group)
        if best is None or value > best[0]:
            self.incumbent[group] = (value, x)
            self._push(value, _INCUMBENT, group, x, x)

    def _add_interval(self, group: int, lo: int, hi: int, offer_lo: bool = True,
                      offer_hi: bool = True) -> float:
        bound = self.evaluators[group].bound(lo, hi, self.machines)
        if offer_lo:
            self._offer(group, lo)
        if offer_hi and (hi != lo or not offer_lo):
            self._offer(group, hi)
        if hi > lo and bound > self.incumbent[group][0] * (1 + RELATIVE_TOLERANCE):
            self._push(bound, _INTERVAL, group, lo, hi)
        return bound

    def add_root(self, group: int) -> None:
        domain = self.evaluators[group].domain(self.machines)
        if domain is None:
            self.infeasible.add(group)
            return
        self.root_bound[group] = self._add_interval(group, *domain)

    def run(self, top: int) -> list[Found]:
        """Pop until `top` groups are finished (or none is left); best first."""
        done: list[Found] = []
        finished: set[int] = set()
        heap, stale = self.heap, self.stale
        while (heap or stale) and len(done) < top:
            if stale and (not heap or stale[0][0] < heap[0][0]):
                _, group = heapq.heappop(stale)  # its stale bound beats every fresh one: bound it
                self.refreshed.append(group)
                self.add_root(group)
                continue
            neg_bound, _, _, kind, group, lo, hi = heapq.heappop(heap)
            if group in finished:
                continue
            best_value, best_x = self.incumbent[group]
            if kind == _INCUMBENT and -neg_bound != best_value:
                continue  # an incumbent since improved on
            if kind == _INTERVAL and -neg_bound > best_value * (1 + RELATIVE_TOLERANCE):
                mid = (lo + hi) // 2
                self._add_interval(group, lo, mid, offer_lo=False)
                self._add_interval(group, mid + 1, hi, offer_hi=False)
                continue
            finished.add(group)
            replicas, shards = self.evaluators[group].replicas_and_shards(best_x, self.machines)
            done.append(Found(group, replicas, shards, best_value))
        return done


def leftmost_reaching(evaluator: GroupSearch, machines: int, lo: int, hi: int,
                      target: float) -> int | None:
    """The smallest x in [lo, hi] whose throughput reaches `target` (None if none does): a
    depth-first, left-first walk that skips intervals whose bound falls short. Used to resolve
    ties toward fewer machines (the fewest shards, or replicas under all-reduce)."""
    stack = [(lo, hi)]
    while stack:
        a, b = stack.pop()
        if evaluator.bound(a, b, machines) < target:
            continue
        if a == b:
            if evaluator.value(a, machines) >= target:
                return a
            continue
        mid = (a + b) // 2
        stack.append((mid + 1, b))
        stack.append((a, mid))
    return None
