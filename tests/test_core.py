"""The one model core (issue 12): plans, topology, sharding and collective registries, and one
composition that predict and optimize share."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnscale.model import predict_config, predict_plan
from dnnscale.model.collectives import (COLLECTIVE_COSTS, Transfer, collective_time_s,
                                        collective_transfer)
from dnnscale.model.sharding import SHARDING_RULES, member_params
from dnnscale.workload.splits import split_sizes
from dnnscale.optimize import optimize
from dnnscale.plan import Config, ParallelPlan, ParameterServer
from dnnscale.system import LinkTier, Topology, group_span
from dnnscale.workload.kind_record import LAYER_KINDS
from tests.tiny import LATENCY_S, tiny_cluster, tiny_machine, tiny_workload


def test_config_builds_the_plan_it_describes() -> None:
    plan = Config(partitions=3, replicas=4, ps_shards=2, sync="ps-sync", minibatch=16,
                  push_every=2, pull_every=3, fc_protocol="vectors").to_plan()
    assert (plan.tensor.degree, plan.tensor.rules, plan.data.replicas) == (3, "adam", 4)
    assert plan.data.aggregation == ParameterServer(2, False, 2, 3, "vectors")
    assert (plan.batch.micro_batch, plan.batch.accumulation, plan.pipeline.stages) == (16, 1, 1)
    assert (plan.workers, plan.machines, plan.samples_per_step) == (12, 14, 64)
    allreduce = Config(partitions=2, replicas=5, ps_shards=0, sync="allreduce").to_plan()
    assert not allreduce.data.uses_ps and allreduce.machines == 10
    assert plan.to_dict()["data"]["aggregation"]["kind"] == "ParameterServer"


def test_predict_plan_equals_predict_config() -> None:
    config = Config(partitions=2, replicas=3, ps_shards=2, sync="ps-async", minibatch=10)
    w, c = tiny_workload(), tiny_cluster()
    by_config = predict_config(w, c, config)
    by_plan = predict_plan(w, c, config.to_plan())
    assert by_plan.throughput_samples_per_s == by_config.throughput_samples_per_s
    assert by_plan.breakdown_s == by_config.breakdown_s and by_plan.config is None
    assert by_config.to_dict()["config"]["sync"] == "ps-async"


def test_typed_parts_carry_the_wave1_keys() -> None:
    p = predict_config(tiny_workload(), tiny_cluster(), Config(partitions=2, replicas=2,
                                                               ps_shards=1, minibatch=10))
    kinds = {part.name: part.kind for part in p.parts}
    assert kinds == {"forward": "compute", "input_grad": "compute", "weight_grad": "compute",
                     "compute": "sum", "partition_comm": "communication", "update": "update",
                     "ps_push": "communication", "ps_pull": "communication",
                     "ps_serve_wait": "wait", "ps_wait": "wait", "step": "total"}
    compute = next(part for part in p.parts if part.name == "compute")
    assert compute.seconds == pytest.approx(sum(p.breakdown_s[n] for n in compute.of))
    names = {part.name for part in p.memory}
    assert names == {"weights", "gradients", "optimizer_state", "activations", "ps_weights",
                     "ps_optimizer_state"}
    assert p.memory_bytes["worker"] == pytest.approx(sum(
        part.bytes for part in p.memory if part.role == "worker"))


def test_collective_registry_by_hand() -> None:
    # 8 MB among 4 members: all-gather 3/4·8 MB in 3 steps; all-reduce 2·3/4·8 MB in 6 steps.
    assert collective_transfer("allgather", "nccl", 8e6, 4) == Transfer(6e6, 3.0)
    assert collective_transfer("allreduce", "nccl", 8e6, 4) == Transfer(12e6, 6.0)
    assert collective_transfer("reduce_scatter", "nccl", 8e6, 4) == Transfer(6e6, 3.0)
    assert collective_transfer("reduce_scatter", "gloo", 8e6, 4) == Transfer(12e6, 6.0)
    assert collective_transfer("halo", "gloo", 1e3, 2) == Transfer(2e3, 2.0)
    assert collective_transfer("allreduce", "gloo", 8e6, 1) == Transfer(0.0, 0.0)
    tier = LinkTier(1e9, 1e-5)
    assert collective_time_s("allreduce", "gloo", 8e6, 4, tier) == pytest.approx(12e-3 + 6e-5)
    fitted = dataclasses.replace(tier, allreduce_fits=((4, 5e8, 2e-5),))
    assert collective_time_s("allreduce", "gloo", 8e6, 4, fitted) == pytest.approx(24e-3 + 12e-5)
    assert collective_time_s("allreduce", "gloo", 8e6, 2, fitted) == pytest.approx(8e-3 + 2e-5)
    with pytest.raises(KeyError, match="'allreduce' under 'mpi'"):
        collective_transfer("allreduce", "mpi", 1.0, 2)


def test_sharding_rules_are_one_registry() -> None:
    assert {("adam", "neurons", s) for s in ("features", "channels", "rows")} <= set(SHARDING_RULES)
    assert not any(split == "*" for _, split, _ in SHARDING_RULES)  # no catch-all rule
    # every split rule a kind's record names is registered under its rule set
    for record in LAYER_KINDS.values():
        for rules, split in record.splits.items():
            assert any(key[:2] == (rules, split) for key in SHARDING_RULES), (record.name, rules)
    w = tiny_workload()
    conv, _, fc = w.layers
    assert split_sizes(10, 3) == [4, 3, 3]
    assert member_params(fc, "features", 2) == 2 * 32 + 2          # 2 outputs of 32 inputs
    assert member_params(conv, "channels", 1) == 1 * 1 * 3 * 3 + 1
    assert member_params(conv, "rows", 1) == conv.params          # a stripe keeps the kernel


@given(st.integers(1, 64), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 4, 8]))
def test_tier_for_agrees_with_group_span(size: int, stride: int, per_node: int) -> None:
    topology = Topology(per_node, LinkTier(1e9, 1e-5, "inter"), LinkTier(1e11, 1e-6, "intra"))
    span = group_span(size, stride, per_node)
    assert topology.tier_for(size, stride) is topology.tier(span)
    assert span.per_node * span.nodes >= size


def test_group_span_by_hand() -> None:
    assert group_span(8, 1, 8).nodes == 1                 # TP 8 inside a DGX node
    assert group_span(16, 1, 8).nodes == 2                # TP 16 spans two nodes, 8 in each
    dp = group_span(4, 8, 8)                              # DP 4 over TP 8: one member per node
    assert (dp.per_node, dp.nodes, dp.crosses_nodes) == (1, 4, True)
    assert group_span(4, 2, 8).per_node == 4              # DP 4 over TP 2 fits in one node


def test_a_cost_term_added_in_one_place_changes_predict_and_optimize(monkeypatch) -> None:
    """Doubling the gloo all-reduce in the collective registry moves predict's all-reduce part
    and optimize's choice together (optimize re-checks every reported plan against predict).

    Tiny workload, n = 32: compute C = 32·1728 FLOP / 1.7334e8 FLOP/s = 319 µs, update
    U = 119 params · 4 B · 9 / 1 TB/s ≈ 4 ns (model/bookkeeping.py), a latency-bound ring A(R) ≈ 2·(R−1)·α with α = 100 µs on a
    1 GB/s NIC. X(R) = R·n / (C + U − 2α + 2α·R) grows with R while C + U = 319 µs > 2α and
    falls once the ring doubles (4α = 400 µs > C + U): the best R goes from 8 to 1.
    """
    w = tiny_workload()
    c = dataclasses.replace(tiny_cluster(machines=8, bandwidth_bytes_per_s=1e9),
                            machine=tiny_machine(flops_per_s=32 * 1728 / 319e-6))
    config = Config(partitions=1, replicas=8, ps_shards=0, sync="allreduce", minibatch=32)
    before = predict_config(w, c, config)
    best_before = optimize(w, c, modes="allreduce", curve=False).best
    ring_s = 2 * 7 / 8 * 119 * 4 / 1e9 + 2 * 7 * LATENCY_S     # W = 119 parameters, b = 4
    assert before.breakdown_s["allreduce"] == pytest.approx(ring_s)
    assert before.breakdown_s["compute"] == pytest.approx(319e-6)
    assert best_before.config.replicas == 8

    original = COLLECTIVE_COSTS[("allreduce", "gloo", "ring")]

    def doubled(payload_bytes: float, members: int) -> Transfer:
        """Twice the ring's traffic.

        Formula: 2 × ring all-reduce. Units: bytes, count. Source: this test.
        """
        t = original(payload_bytes, members)
        return Transfer(2 * t.bytes, 2 * t.messages)

    monkeypatch.setitem(COLLECTIVE_COSTS, ("allreduce", "gloo", "ring"), doubled)
    assert predict_config(w, c, config).breakdown_s["allreduce"] == pytest.approx(2 * ring_s)
    assert optimize(w, c, modes="allreduce", curve=False).best.config.replicas == 1


def test_dedicated_ps_hosts_bound_the_plan() -> None:
    from dnnscale.errors import InputError
    from dnnscale.plan import check_config

    system = dataclasses.replace(tiny_cluster(machines=6), ps_machines=2)
    assert system.worker_machines == 4
    check_config(Config(partitions=2, replicas=2, ps_shards=2), tiny_workload(), system)
    with pytest.raises(InputError, match="config.ps_shards: 3 shards"):
        check_config(Config(partitions=1, replicas=2, ps_shards=3), tiny_workload(), system)
    with pytest.raises(InputError, match="needs 6 worker machines"):
        check_config(Config(partitions=2, replicas=3, ps_shards=1), tiny_workload(), system)
    result = optimize(tiny_workload(), system, modes="ps-async", curve=False)
    assert result.best.config.workers <= 4 and result.best.config.ps_shards <= 2


def test_parallel_plan_defaults_are_one_cpu_worker() -> None:
    plan = ParallelPlan()
    assert (plan.workers, plan.ps_shards, plan.machines) == (1, 1, 2)
