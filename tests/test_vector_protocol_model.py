"""The model's price of Adam's FC vector protocol, by hand on the tiny workload (tests/tiny.py):
per-shard traffic and PS work from the flat layout, the capacities, and the search's bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.model import predict_config
from dnnscale.model.compose import StepContext, bound, objective
from dnnscale.model.predict import plan_stage_costs
from dnnscale.model.vectors import Region, flat_layout, vector_traffic
from dnnscale.plan import Config
from dnnscale.workload import load_workload
from tests.tiny import tiny_cluster, tiny_workload

# Tiny: conv (20 parameters) then fc 32 -> 3 (96 weights + 3 biases): W = 119, n = 2, b = 4.


def _context(config: Config) -> StepContext:
    workload, cluster = tiny_workload(), tiny_cluster()
    plan = config.to_plan()
    return StepContext(workload, cluster, plan, plan_stage_costs(workload, cluster, plan))


def test_layout_of_the_tiny_workload() -> None:
    assert flat_layout(tiny_workload(), 1) == (
        Region(0, 20, 0), Region(20, 99, 0, "fc", 3, 32, True))


def test_one_shard_costs_n_times_inputs_plus_outputs() -> None:
    """S = 1: push 20·4 (conv gradients) + 2·(32 + 3)·4 (vectors) = 360 B, pull 119·4 = 476 B;
    PS CPU 119 µs of updates + a 3x32 block over 2 samples, 2·2·3·32 = 384 FLOP at 1 GFLOP/s."""
    terms = _context(Config(ps_shards=1, minibatch=2, fc_protocol="vectors")).per_shards(1)
    assert (terms.push_bytes, terms.pull_bytes, terms.serve_bytes) == (360.0, 476.0, 836.0)
    assert terms.apply_s == pytest.approx(119e-6 + 384e-9)
    assert terms.x_net == pytest.approx(2 * 1e6 / 836)


def test_two_shards_by_hand() -> None:
    """S = 2 slices [0, 59) and [59, 119). Shard 0: the conv's 20 and fc elements 0-38 (rows
    0-1: all 32 inputs) -> push 20·4 + 2·(2 + 32)·4 = 352 B, pull 59·4 = 236 B. Shard 1: fc
    elements 39-95 (rows 1-2) and the 3 biases (errors of rows 0-2) -> push 2·(3 + 32)·4 =
    280 B, pull 60·4 = 240 B. Busiest: shard 0 for the network (588 B), shard 1 for the CPU
    (60 µs + a 2x32 block, 2·2·2·32 = 256 FLOP)."""
    ctx = _context(Config(ps_shards=2, minibatch=2, fc_protocol="vectors"))
    loads = vector_traffic(ctx.regions, 2, 1).shards
    assert [(l.params, l.dense_params, l.vector_values_per_sample, l.blocks) for l in loads] == \
        [(59, 20, 34, [(2, 32)]), (60, 0, 35, [(2, 32)])]
    terms = ctx.per_shards(2)
    assert (terms.push_bytes, terms.pull_bytes, terms.serve_bytes) == (352.0, 240.0, 588.0)
    assert terms.x_net == pytest.approx(2 * 1e6 / 588)          # 3401 samples/s
    assert terms.apply_s == pytest.approx(60e-6 + 256e-9)
    assert terms.x_cpu == pytest.approx(2 / (60e-6 + 256e-9))  # 33192 samples/s
    # the worker pushes to both: 352 + 280 = 632 B and 2 messages of 100 µs at 1 MB/s
    assert terms.push_w_s == pytest.approx(632 / 1e6 + 2 * 1e-4)
    prediction = predict_config(tiny_workload(), tiny_cluster(),
                                Config(ps_shards=2, minibatch=2, fc_protocol="vectors"))
    assert prediction.capacities_samples_per_s["ps_network"] == pytest.approx(2e6 / 588)
    assert prediction.part("weight_grad") == pytest.approx(2 * 576 / 1e9)  # conv only


def test_weight_protocol_is_unchanged() -> None:
    """Weights: the busiest shard's share ceil(119/2)/119 of push 476 B and pull 476 B."""
    terms = _context(Config(ps_shards=2, minibatch=2)).per_shards(2)
    share = 60 / 119
    assert terms.serve_bytes == pytest.approx(share * 952)
    assert terms.apply_s == pytest.approx(share * 119e-6)


@settings(max_examples=40, deadline=None)
@given(partitions=st.integers(1, 3), minibatch=st.sampled_from([4, 16, 64]),
       lo=st.integers(1, 40), width=st.integers(0, 40), replicas=st.integers(1, 6),
       sync=st.sampled_from(["ps-async", "ps-sync"]), push_every=st.integers(1, 3))
def test_vector_bound_bounds_every_shard_count(partitions: int, minibatch: int, lo: int,
                                               width: int, replicas: int, sync: str,
                                               push_every: int) -> None:
    """bound(lo, hi) >= the objective at every S in [lo, hi] (the exact search relies on it),
    and equals it on a single point."""
    workload = load_workload("mlp:64-48-10")
    cluster = tiny_cluster()
    config = Config(partitions=partitions, ps_shards=lo, minibatch=minibatch, sync=sync,
                    push_every=push_every, fc_protocol="vectors")
    plan = config.to_plan()
    ctx = StepContext(workload, cluster, plan, plan_stage_costs(workload, cluster, plan))
    hi = lo + width
    top = bound(ctx, lo, hi, replicas)
    assert bound(ctx, lo, lo, replicas) == objective(ctx, replicas, lo)
    for shards in range(lo, hi + 1):
        assert objective(ctx, replicas, shards) <= top * (1 + 1e-12)
