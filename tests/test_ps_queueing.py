"""Asynchronous replicas queueing at the busiest shard (model/ps.ps_queueing_cycle_s, issue 22):
Bard-Schweitzer mean value analysis by hand, its invariants, and what it does to a ps-async prediction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnscale.model import predict_config, stage_costs
from dnnscale.model.compose import StepContext, compose
from dnnscale.model.ps import ps_queueing_cycle_s
from dnnscale.plan import Config
from dnnscale.system import load_system
from dnnscale.workload import load_workload


def test_one_replica_never_queues() -> None:
    assert ps_queueing_cycle_s(1, 3.0, 1.0) == pytest.approx(4.0)
    assert ps_queueing_cycle_s(5, 3.0, 0.0) == 3.0


def test_two_replicas_by_hand() -> None:
    # Z = 3, D = 1, R = 2: R·D − Z = −1, r = (−1 + sqrt(1 + 4·1·3)) / 2 = (−1 + 3.60555) / 2
    # = 1.30278: step 4.30278, 0.3 of a service more than the bound max(Z + D, 2·D) = 4.
    assert ps_queueing_cycle_s(2, 3.0, 1.0) == pytest.approx(4.30278, abs=1e-5)


def test_three_replicas_at_the_knee_by_hand() -> None:
    # The 100mbit corpus rows mnist-m3a/b (P=1 R=3 S=3 ps-async n=8): worker step 2.257 s,
    # the busiest shard 0.727 s of it, Z = 1.53 s. R·D − Z = 0.651, sqrt(0.651² + 4·0.727·1.53)
    # = sqrt(0.42380 + 4.44924) = 2.20750, r = (0.651 + 2.20750) / 2 = 1.42925: step 2.95925 s
    # (the bound: 2.257 s; measured: 3.27 and 3.44 s).
    assert ps_queueing_cycle_s(3, 1.53, 0.727) == pytest.approx(2.95925, abs=1e-5)


def test_a_saturated_shard_is_busy_all_the_time() -> None:
    # Z = 0: every replica is always at the shard, so R requests take R·D.
    assert ps_queueing_cycle_s(4, 0.0, 1.0) == pytest.approx(4.0)
    # Far past the knee r ≈ R·D − Z + D·Z/(R·D − Z): 199 + 1/199 -> step 200.005.
    assert ps_queueing_cycle_s(200, 1.0, 1.0) == pytest.approx(200.005, abs=1e-4)


def test_refuses_no_replicas() -> None:
    with pytest.raises(ValueError, match="replicas"):
        ps_queueing_cycle_s(0, 1.0, 1.0)


_seconds = st.floats(min_value=1e-4, max_value=10.0, allow_nan=False)


@given(st.integers(min_value=1, max_value=64), _seconds, _seconds)
def test_between_the_asymptotes(replicas: int, own_s: float, service_s: float) -> None:
    step = ps_queueing_cycle_s(replicas, own_s, service_s)
    assert max(own_s + service_s, replicas * service_s) * (1 - 1e-12) <= step
    assert step <= (own_s + replicas * service_s) * (1 + 1e-12)


@given(st.integers(min_value=1, max_value=63), _seconds, _seconds)
def test_throughput_grows_with_replicas(replicas: int, own_s: float, service_s: float) -> None:
    now = replicas / ps_queueing_cycle_s(replicas, own_s, service_s)
    more = (replicas + 1) / ps_queueing_cycle_s(replicas + 1, own_s, service_s)
    assert more >= now * (1 - 1e-12)


@given(st.integers(min_value=1, max_value=64), _seconds,
       st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=0.0, max_value=1.0))
def test_step_grows_with_the_shards_part(replicas: int, worker_step_s: float, a: float,
                                         b: float) -> None:
    """At a fixed worker step T_w = Z + D, a larger shard part D never shortens the step (what
    compose.bound relies on when it relaxes T_w and D together)."""
    low, high = sorted((a, b))
    short = ps_queueing_cycle_s(replicas, worker_step_s * (1 - low), worker_step_s * low)
    long = ps_queueing_cycle_s(replicas, worker_step_s * (1 - high), worker_step_s * high)
    assert long >= short * (1 - 1e-12)
    # and a longer worker step at the same D never shortens it either
    assert ps_queueing_cycle_s(replicas, worker_step_s * 1.5 - worker_step_s * low,
                               worker_step_s * low) >= short * (1 - 1e-12)


def test_a_ps_async_step_queues_at_the_shard() -> None:
    """adam-mnist on the `local` preset, P=1 R=3 S=3 ps-async: the step is the queue's, above
    the old bound max(T_w, R·D), and the difference from the worker step is the prediction's
    ps_wait."""
    workload, system = load_workload("adam-mnist"), load_system("local")
    config = Config(partitions=1, replicas=3, ps_shards=3, minibatch=8, sync="ps-async")
    stage = stage_costs(workload, system, 1, 8, config.fc_protocol)
    ctx = StepContext(workload, system, config.to_plan(), (stage,))
    terms = ctx.per_shards(3)
    service_s = 8 / min(terms.x_net, terms.x_cpu)
    composition = compose(ctx, 3, 3)
    parts = {part.name.value: part.seconds for part in composition.parts}
    worker_step_s = composition.step_s - parts["ps_wait"]
    assert composition.step_s == pytest.approx(
        ps_queueing_cycle_s(3, worker_step_s - service_s, service_s), rel=1e-12)
    assert composition.step_s > max(worker_step_s, 3 * service_s) * (1 + 1e-6)
    prediction = predict_config(workload, system, config)
    assert prediction.step_time_s == pytest.approx(composition.step_s, rel=1e-12)


@pytest.mark.timeout(120)
def test_the_microbenchmark_runs_the_runtimes_shards_over_loopback() -> None:
    """calibrate/psqueue.py: 2 workers against 1 ps-async shard of runtime/ps.py, 64 KiB pushed
    and pulled per step, 1 s window: one point per size, the slowest worker's step at least the
    mean, and a 2 ms-CPU chunk measured alone below the step it is part of."""
    from dnnscale.calibrate.network import run_ranks
    from dnnscale.runtime.placement import local_placements

    points = run_ranks(local_placements(3), "1", [65_536], 1, timeout_s=100, extra=0.002,
                       module="dnnscale.calibrate.psqueue")
    assert len(points) == 1
    size, mean_s, slowest_s, chunk_s = points[0]
    assert size == 65_536
    assert 0 < mean_s <= slowest_s < 1.0
    assert 0 < chunk_s < mean_s
