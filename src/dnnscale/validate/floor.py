"""The least error any predictor can reach on measured times, if it keeps orderings physics imposes.

A measured corpus can contradict itself. On vTrain's rows, one plan takes 4.97 s at micro-batch
32 and 9.84 s at micro-batch 64, with the same samples per step: per sample the larger
micro-batch is twice as slow. A predictor in which a larger micro-batch never makes a sample
slower must miss one of those two rows by at least (9.84 − 4.97) / (9.84 + 4.97) = 32.9 %, however
it is built or fitted. This module finds such floors for a whole corpus, so that an accuracy
target can be judged reachable or not before anyone chases it.

An `Ordering` states weight_a · T̂[a] ≤ weight_b · T̂[b] for every admissible predictor T̂.
`error_floor` finds:
- the least ε for which some T̂ keeps every ordering and lies within ε (relative) of every
  measured time: no admissible predictor has a smaller maximum error;
- the least ε for which some T̂ keeps every ordering and lies within ε of all but k rows, where k
  is how many rows a quantile (numpy's linear interpolation) leaves above it: no admissible
  predictor has a smaller error at that quantile.

Both by bisection on ε over a feasibility problem in log time: the orderings are difference
constraints x_a − x_b ≤ log(w_b / w_a), and each row either keeps its band
[log T(1 − ε), log T(1 + ε)] or is freed by a binary (big-M) switch; scipy's HiGHS solves it.

`pipeline_orderings` states three orderings for rows of 1F1B-pipelined, data- and
tensor-parallel training with a fixed global batch. A step runs m + p − 1 micro-batch slots of
the slowest stage (m = B / mb micro-batches per replica, B = global batch / DP), so
u = T / (B + (p − 1) · mb) is the time one sample takes through one stage, bubble included:
- "micro-batch": within one plan, u does not rise with the micro-batch (per-micro-batch fixed
  costs amortise; kernels are no less efficient on larger inputs). A fixed part of the step (the
  gradient all-reduce, the optimizer) keeps this true: (T − c) / g falling with g rising implies
  T / g falling for c ≥ 0.
- "tensor": at the same pipeline depth and micro-batch, the GPU-time per sample t · u does not
  fall as each layer is split over more GPUs t.
- "pipeline": at the same t and micro-batch, p · t · u does not fall with more stages p.
The last two neglect the fixed part c, which differs between the plans compared (a smaller
tensor group all-reduces more gradient bytes per GPU); their floors are reported beside the
micro-batch one, not as a proof.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dnnscale.errors import InputError

ORDERING_KINDS = ("micro-batch", "tensor", "pipeline")
MAX_RELATIVE_ERROR = 64.0
"""Beyond this relative error the orderings are taken to contradict each other."""


@dataclass(frozen=True)
class Ordering:
    """weight_lesser · T̂[lesser] ≤ weight_greater · T̂[greater] for every admissible predictor."""

    lesser: int
    weight_lesser: float
    greater: int
    weight_greater: float
    kind: str


@dataclass(frozen=True)
class Violation:
    """An ordering the measured times themselves break: `ratio` = w_l·T_l / (w_g·T_g) > 1. On
    these two rows alone no admissible predictor errs less than `pair_floor` = (r − 1)/(r + 1)."""

    lesser: int
    greater: int
    kind: str
    ratio: float

    @property
    def pair_floor(self) -> float:
        return (self.ratio - 1.0) / (self.ratio + 1.0)


@dataclass(frozen=True)
class ErrorFloor:
    """The least errors any predictor keeping `orderings` reaches on the measured rows."""

    rows: int
    orderings: int
    kinds: tuple[str, ...]
    max_relative_error: float
    quantile: float
    rows_above_quantile: int
    quantile_relative_error: float
    violations: tuple[Violation, ...]


class PipelineRow(Protocol):
    """What `pipeline_orderings` reads from a measured row (validate.vtrain.Row has it)."""

    @property
    def model(self) -> tuple[int, int, int, int]: ...
    gpus: int
    global_batch: int
    micro_batch: int
    tensor: int
    data: int
    pipeline: int


def _slots(row: PipelineRow) -> float:
    """Samples one stage passes per step, bubble included: (m + p − 1) · mb = B + (p − 1) · mb."""
    return row.global_batch / row.data + (row.pipeline - 1) * row.micro_batch


def pipeline_orderings(rows: Sequence[PipelineRow],
                       kinds: Iterable[str] = ORDERING_KINDS) -> list[Ordering]:
    """The orderings of the module docstring between every pair of rows they relate."""
    chosen = tuple(kinds)
    for kind in chosen:
        if kind not in ORDERING_KINDS:
            raise InputError("kinds", f"unknown ordering {kind!r}; one of "
                                      f"{', '.join(ORDERING_KINDS)}")
    out: list[Ordering] = []
    for a, ra in enumerate(rows):
        for b, rb in enumerate(rows):
            if a == b or (ra.model, ra.gpus, ra.global_batch) != (rb.model, rb.gpus,
                                                                  rb.global_batch):
                continue
            ga, gb = _slots(ra), _slots(rb)
            same_plan = (ra.tensor, ra.data, ra.pipeline) == (rb.tensor, rb.data, rb.pipeline)
            if "micro-batch" in chosen and same_plan and ra.micro_batch < rb.micro_batch:
                out.append(Ordering(b, 1.0 / gb, a, 1.0 / ga, "micro-batch"))
            if ("tensor" in chosen and (ra.pipeline, ra.micro_batch) == (rb.pipeline,
                                                                         rb.micro_batch)
                    and ra.tensor < rb.tensor):
                out.append(Ordering(a, ra.tensor / ga, b, rb.tensor / gb, "tensor"))
            if ("pipeline" in chosen and (ra.tensor, ra.micro_batch) == (rb.tensor,
                                                                         rb.micro_batch)
                    and ra.pipeline < rb.pipeline):
                out.append(Ordering(a, ra.pipeline / ga, b, rb.pipeline / gb, "pipeline"))
    return out


def rows_above(quantile: float, rows: int) -> int:
    """How many of `rows` errors may exceed ε while numpy's (linearly interpolated) quantile can
    still be ≤ ε: the quantile is at least the value at index ⌊q · (n − 1)⌋ of the sorted errors."""
    return rows - 1 - math.floor(quantile * (rows - 1))


def _validate(measured_s: Sequence[float], orderings: Sequence[Ordering],
              quantile: float) -> None:
    if not measured_s:
        raise InputError("measured_s", "needs at least one measured time")
    for i, t in enumerate(measured_s):
        if not (math.isfinite(t) and t > 0):
            raise InputError(f"measured_s[{i}]", f"must be a positive time in seconds, got {t!r}")
    for k, o in enumerate(orderings):
        for index in (o.lesser, o.greater):
            if not 0 <= index < len(measured_s):
                raise InputError(f"orderings[{k}]", f"row {index} is not among the "
                                                    f"{len(measured_s)} measured rows")
        for weight in (o.weight_lesser, o.weight_greater):
            if not (math.isfinite(weight) and weight > 0):
                raise InputError(f"orderings[{k}]", f"weights must be positive, got {weight!r}")
    if not 0.0 < quantile < 1.0:
        raise InputError("quantile", f"must lie strictly between 0 and 1, got {quantile!r}")


def violations(measured_s: Sequence[float], orderings: Sequence[Ordering]) -> list[Violation]:
    """The orderings the measured times break, the worst first."""
    out = [Violation(o.lesser, o.greater, o.kind,
                     o.weight_lesser * measured_s[o.lesser]
                     / (o.weight_greater * measured_s[o.greater]))
           for o in orderings]
    return sorted((v for v in out if v.ratio > 1.0), key=lambda v: -v.ratio)


def _feasibility(log_t: np.ndarray, orderings: Sequence[Ordering],
                 free_rows: int) -> Callable[[float], bool]:
    """A test of ε: is there a predictor keeping every ordering within ε of all but `free_rows`
    rows? The problem is built once; only the rows' bands move with ε."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    n, base = len(log_t), len(orderings)
    gaps = [math.log(o.weight_greater / o.weight_lesser) for o in orderings]
    # A freed row's value in the maximal solution of the difference constraints is a kept row's
    # band edge plus the gaps along a simple path, which crosses each ordering at most once.
    big_m = float(log_t.max() - log_t.min()) + sum(abs(g) for g in gaps) + 1.0
    matrix = lil_matrix((base + 2 * n + 1, 2 * n))
    lower = np.full(base + 2 * n + 1, -np.inf)
    upper = np.full(base + 2 * n + 1, np.inf)
    for k, (o, gap) in enumerate(zip(orderings, gaps)):
        matrix[k, o.lesser] += 1.0
        matrix[k, o.greater] -= 1.0
        upper[k] = gap
    below, above = base + 2 * np.arange(n), base + 2 * np.arange(n) + 1
    for i in range(n):  # x_i − M·z_i ≤ band top; x_i + M·z_i ≥ band bottom
        matrix[below[i], i], matrix[below[i], n + i] = 1.0, -big_m
        matrix[above[i], i], matrix[above[i], n + i] = 1.0, big_m
    matrix[base + 2 * n, n:] = 1.0
    lower[base + 2 * n], upper[base + 2 * n] = 0.0, float(free_rows)
    csr = matrix.tocsr()
    span = big_m + 1.0
    bounds = Bounds(np.r_[log_t - span, np.zeros(n)], np.r_[log_t + span, np.ones(n)])
    integrality = np.r_[np.zeros(n), np.ones(n)]

    def feasible(epsilon: float) -> bool:
        upper[below] = log_t + math.log1p(epsilon)
        lower[above] = log_t + math.log(max(1.0 - epsilon, 1e-9))
        result = milp(c=np.zeros(2 * n), constraints=LinearConstraint(csr, lower, upper),
                      integrality=integrality, bounds=bounds)
        return bool(result.status == 0)

    return feasible


def _least_epsilon(log_t: np.ndarray, orderings: Sequence[Ordering], free_rows: int,
                   tolerance: float) -> float:
    """The largest ε found infeasible, within `tolerance` below the least feasible one: a bound
    no admissible predictor beats (0 when the measured times keep the orderings)."""
    feasible = _feasibility(log_t, orderings, free_rows)
    if feasible(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while not feasible(high):
        low, high = high, 2 * high
        if high > MAX_RELATIVE_ERROR:
            raise InputError("orderings", "no predictor keeps them within "
                                          f"{MAX_RELATIVE_ERROR:.0f}x of the measured times; "
                                          "they contradict each other")
    while high - low > tolerance:
        middle = (low + high) / 2
        if feasible(middle):
            high = middle
        else:
            low = middle
    return low


def error_floor(measured_s: Sequence[float], orderings: Sequence[Ordering],
                quantile: float = 0.9, tolerance: float = 1e-4) -> ErrorFloor:
    """The least maximum and quantile errors any predictor keeping `orderings` can reach, each
    within `tolerance` below the exact floor, so each is a bound no such predictor beats."""
    _validate(measured_s, orderings, quantile)
    if not 0.0 < tolerance < 0.1:
        raise InputError("tolerance", f"must lie between 0 and 0.1, got {tolerance!r}")
    log_t = np.log(np.asarray(measured_s, dtype=float))
    free = rows_above(quantile, len(measured_s))
    return ErrorFloor(rows=len(measured_s), orderings=len(orderings),
                      kinds=tuple(sorted({o.kind for o in orderings})),
                      max_relative_error=_least_epsilon(log_t, orderings, 0, tolerance),
                      quantile=quantile, rows_above_quantile=free,
                      quantile_relative_error=_least_epsilon(log_t, orderings, free, tolerance),
                      violations=tuple(violations(measured_s, orderings)))
