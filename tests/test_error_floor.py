"""The error floor: the least error any predictor keeping physical orderings reaches."""

from __future__ import annotations

import math
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.validate.floor import (Ordering, error_floor, pipeline_orderings, rows_above,
                                     violations)
from dnnscale.validate.vtrain import Row

TOL = 1e-4


def _close_below(value: float, exact: float) -> bool:
    """error_floor returns a bound within its tolerance below the exact floor."""
    return exact - TOL - 1e-9 <= value <= exact + 1e-9


def test_two_rows_that_contradict_a_micro_batch_ordering():
    # vTrain's h3072 TP8 DP8 PP1 rows: mb32 in 4.9723 s, mb64 in 9.8389 s, 64 samples per step
    # each; the mb64 row must not be slower: T1 / 64 <= T0 / 64.
    floor = error_floor([4.9723, 9.8389], [Ordering(1, 1 / 64, 0, 1 / 64, "micro-batch")],
                        quantile=0.5)
    r = 9.8389 / 4.9723  # 1.978742
    assert _close_below(floor.max_relative_error, (r - 1) / (r + 1))  # 0.328576
    assert floor.max_relative_error == pytest.approx(0.328576, abs=TOL)
    assert len(floor.violations) == 1
    assert floor.violations[0].ratio == pytest.approx(1.978742, rel=1e-6)
    assert floor.violations[0].pair_floor == pytest.approx(0.328576, abs=1e-6)
    # the median of two errors may leave one row above it: one row freed, nothing to miss
    assert floor.rows_above_quantile == 1
    assert floor.quantile_relative_error == 0.0


def test_weights_enter_the_floor():
    # u = T / g: 2 s over 10 slots against 3 s over 12 slots; u1 <= u0 is broken 0.25 / 0.2
    floor = error_floor([2.0, 3.0], [Ordering(1, 1 / 12, 0, 1 / 10, "micro-batch")])
    assert _close_below(floor.max_relative_error, (1.25 - 1) / (1.25 + 1))  # 1/9
    assert floor.max_relative_error == pytest.approx(1 / 9, abs=TOL)


def test_measured_times_that_keep_the_orderings_have_no_floor():
    floor = error_floor([3.0, 2.0, 1.5], [Ordering(1, 1.0, 0, 1.0, "micro-batch"),
                                          Ordering(2, 1.0, 1, 1.0, "micro-batch")])
    assert floor.max_relative_error == 0.0
    assert floor.violations == ()


def test_the_quantile_bound_frees_the_rows_the_quantile_may_leave_above():
    # a chain T2 <= T1 <= T0 broken by one outlier (row 2 at 4 s); the other two agree.
    times = [2.0, 1.8, 4.0, 1.7, 1.6]
    chain = [Ordering(i + 1, 1.0, i, 1.0, "micro-batch") for i in range(4)]
    # five errors: numpy's p70 sits at index floor(0.7 * 4) = 2, so 5 - 1 - 2 = 2 rows free
    assert rows_above(0.7, 5) == 2
    floor = error_floor(times, chain, quantile=0.7)
    assert floor.quantile_relative_error == 0.0
    # the maximum must bring 4.0 down and 1.8 (the tightest earlier row) up to meet:
    # x = 2 * 1.8 * 4 / 5.8, error (4 - 1.8) / (4 + 1.8) = 0.37931
    assert _close_below(floor.max_relative_error, 2.2 / 5.8)


def test_rows_above_matches_numpys_interpolated_quantile():
    assert rows_above(0.9, 109) == 11  # index 97.2: p90 >= the 98th smallest error
    assert rows_above(0.9, 10) == 1  # index 8.1
    assert rows_above(0.5, 3) == 1


def _row(micro_batch: int, tensor: int, data: int, pipeline: int, hidden: int = 4096) -> Row:
    return Row("multi", 64, 64, micro_batch, hidden, 32, 24, 2048, tensor, data, pipeline, 1.0)


def test_pipeline_orderings_by_hand():
    rows = [_row(2, 2, 8, 4),   # slots 64/8 + 3*2 = 14
            _row(4, 2, 8, 4),   # 8 + 3*4 = 20
            _row(2, 4, 4, 4),   # 16 + 6 = 22
            _row(2, 2, 16, 2),  # 4 + 2 = 6
            _row(4, 2, 8, 4, hidden=1024)]  # another model: never compared
    orderings = pipeline_orderings(rows)
    by_kind = {k: [o for o in orderings if o.kind == k] for k in ("micro-batch", "tensor",
                                                                   "pipeline")}
    (mb,) = by_kind["micro-batch"]
    assert (mb.lesser, mb.greater) == (1, 0)
    assert (mb.weight_lesser, mb.weight_greater) == (pytest.approx(1 / 20), pytest.approx(1 / 14))
    (tp,) = by_kind["tensor"]
    assert (tp.lesser, tp.greater) == (0, 2)
    assert (tp.weight_lesser, tp.weight_greater) == (pytest.approx(2 / 14), pytest.approx(4 / 22))
    (pp,) = by_kind["pipeline"]
    assert (pp.lesser, pp.greater) == (3, 0)
    assert (pp.weight_lesser, pp.weight_greater) == (pytest.approx(2 / 6), pytest.approx(4 / 14))
    assert len(pipeline_orderings(rows, ("micro-batch",))) == 1


@pytest.mark.parametrize("call, field", [
    (lambda: error_floor([], []), "measured_s"),
    (lambda: error_floor([1.0, -2.0], []), "measured_s[1]"),
    (lambda: error_floor([1.0, math.nan], []), "measured_s[1]"),
    (lambda: error_floor([1.0], [Ordering(0, 1.0, 3, 1.0, "x")]), "orderings[0]"),
    (lambda: error_floor([1.0, 2.0], [Ordering(0, 0.0, 1, 1.0, "x")]), "orderings[0]"),
    (lambda: error_floor([1.0], [], quantile=1.0), "quantile"),
    (lambda: error_floor([1.0], [], tolerance=0.0), "tolerance"),
    (lambda: pipeline_orderings([], ("data",)), "kinds"),
    # a ≤ b/4 and b ≤ a/4 together: no positive times keep both
    (lambda: error_floor([1.0, 1.0], [Ordering(0, 4.0, 1, 1.0, "x"),
                                      Ordering(1, 4.0, 0, 1.0, "x")]), "orderings"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(InputError) as caught:
        call()
    assert caught.value.field == field


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.5, 20.0), min_size=2, max_size=6))
def test_no_admissible_predictor_beats_the_floor(times):
    """Along a chain T̂[i+1] <= T̂[i], the running minimum of the measured times keeps every
    ordering; its maximum error can never be below the floor, and two rows give the pair floor."""
    chain = [Ordering(i + 1, 1.0, i, 1.0, "micro-batch") for i in range(len(times) - 1)]
    floor = error_floor(times, chain)
    running, admissible = math.inf, []
    for t in times:
        running = min(running, t)
        admissible.append(running)
    assert not violations(admissible, chain)
    worst = max(abs(p - t) / t for p, t in zip(admissible, times))
    assert floor.max_relative_error <= worst + 1e-9
    pair = max((v.pair_floor for v in violations(times, chain)), default=0.0)
    assert floor.max_relative_error >= pair - TOL - 1e-9
    if len(times) == 2:
        assert _close_below(floor.max_relative_error, pair)
