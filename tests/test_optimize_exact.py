"""The fast search is exact: over random workloads, clusters, spaces and budgets M ≤ 64 it finds
what enumerating every configuration through predict_config finds (to 1e-9 relative)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dnnscale.system import LinkTier
from dnnscale.plan import Config, max_partitions
from dnnscale.errors import InputError
from dnnscale.model import predict_config
from dnnscale.model.collectives import PULL_PIECE_CURVE
from dnnscale.optimize import optimize, prepare
from dnnscale.model.compose import StepContext
from dnnscale.model.stage import stage_costs
from dnnscale.optimize.group import GroupSearch
from dnnscale.optimize.exhaustive import enumerate_all
from dnnscale.optimize.space import Group
from tests.strategies import clusters, workloads

TOLERANCE = 1e-9
MODES = ("ps-async", "ps-sync", "allreduce")


@st.composite
def problems(draw: st.DrawFn):
    """A workload, a cluster whose memory may not fit it (worker and PS memory drawn relative to
    what P=1 / S=1 needs), a budget M ≤ 64 and a search space."""
    workload = draw(workloads())
    cluster = draw(clusters())
    chosen = draw(st.sets(st.sampled_from(MODES), min_size=1))
    modes = tuple(m for m in MODES if m in chosen)
    base = Config(fc_protocol="weights" if "allreduce" in modes else draw(
                      st.sampled_from(["weights", "vectors"])),
                  overlap=draw(st.booleans()),
                  optimizer=draw(st.sampled_from(["sgd", "momentum", "adam"])),
                  epoch_fraction=draw(st.sampled_from([1.0, 0.9])))
    # n at most one epoch (a larger n is an input error); small epochs also exercise the cap
    # R·n <= samples per epoch in both searches
    minibatch = draw(st.lists(st.integers(1, min(128, workload.samples_per_epoch)), min_size=1,
                              max_size=2, unique=True))
    push = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True))
    pull = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2, unique=True))
    probe = predict_config(workload, cluster, dataclasses.replace(base, minibatch=minibatch[0],
                                                                  sync="ps-async"))
    worker = dataclasses.replace(cluster.machine, memory_bytes=probe.memory_bytes["worker"]
                                 * draw(st.sampled_from([0.1, 0.3, 0.6, 1.0, 5.0])))
    ps = dataclasses.replace(cluster.ps, memory_bytes=probe.memory_bytes["ps"]
                             * draw(st.sampled_from([0.2, 0.45, 1.0, 5.0])))
    ps_network = draw(st.one_of(st.none(), st.builds(LinkTier, st.floats(1e6, 1e10),
                                                      st.floats(0, 1e-3))))
    cluster = dataclasses.replace(cluster, machine=worker, ps_machine=ps, ps_network=ps_network)
    if draw(st.booleans()):  # a testbed's held-pull convoy, measured per piece or not at all
        cluster = dataclasses.replace(cluster, ps_pull_convoy=True)
        pieces = draw(st.lists(st.floats(1e3, 1e8), min_size=1, max_size=4, unique=True))
        if draw(st.booleans()):
            times = draw(st.lists(st.floats(1e-4, 10.0), min_size=len(pieces),
                                  max_size=len(pieces)))
            curve = tuple(zip(sorted(pieces), times))  # noisy: need not grow with the piece
            cluster = dataclasses.replace(cluster, network=dataclasses.replace(
                cluster.network, curves=cluster.network.curves + tuple(
                    (PULL_PIECE_CURVE, members, curve) for members in range(1, 65))))
    machines = draw(st.integers(1, 64))
    return dict(workload=workload, cluster=cluster, machines=machines, modes=modes,
                minibatch=minibatch, push_every=push, pull_every=pull, base=base)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.integers(1, 4))
def test_fast_search_equals_exhaustive_enumeration(case, top) -> None:
    reference = enumerate_all(prepare(**case, check_budget=False))
    if not reference.best_per_group:
        with pytest.raises(InputError):
            optimize(**case, top=top)
        return
    fast = optimize(**case, top=top)
    best = reference.best
    assert _close(fast.best.epoch_time_s, best.epoch_time_s)
    assert fast.best.fits and fast.best.config.machines <= case["machines"]
    assert any(config == fast.best.config for _, config in reference.optima)
    # The top K groups: the same epoch times, rank by rank.
    expected = sorted(p.epoch_time_s for p in reference.best_per_group.values())[:top]
    assert len(fast.top) == len(expected)
    for got, want in zip(fast.top, expected):
        assert _close(got.epoch_time_s, want)
    # The curve: every budget from the smallest feasible one, each the exhaustive best within it.
    assert fast.curve[0].machines == min(reference.best_by_machines)
    assert fast.curve[-1].machines == case["machines"]
    for point in fast.curve:
        within = reference.best_within(point.machines)
        assert within is not None and _close(point.epoch_time_s, within.epoch_time_s)
        assert point.prediction.config.machines <= point.machines and point.prediction.fits


@settings(max_examples=100, deadline=None)
@given(problems(), st.integers(1, 64), st.integers(1, 64), st.sampled_from(MODES))
def test_group_search_throughput_is_predict_configs(case, replicas, shards, mode) -> None:
    """The search's throughput at (R, S) is predict_config's, bit for bit, on random
    configurations (both run compose on a StepContext; this checks the search's plan)."""
    workload, cluster, base = case["workload"], case["cluster"], case["base"]
    if mode == "allreduce" and base.fc_protocol == "vectors":
        mode = "ps-sync"
    # P is drawn from R; a workload too narrow for it (a 2-unit layer among 3 workers) is no
    # configuration to compare (predict_config refuses it).
    partitions = min(1 + replicas % 3, max_partitions(workload))
    group = Group(mode, partitions, case["minibatch"][0], case["push_every"][0],
                  case["pull_every"][0])
    config = group.config(base, replicas, shards)
    expected = predict_config(workload, cluster, config)
    stage = stage_costs(workload, cluster, group.partitions, group.minibatch, base.fc_protocol)
    search = GroupSearch(group, StepContext(workload, cluster, group.config(base, 1, 1).to_plan(),
                                            (stage,)), 1)
    assert search.throughput(config.replicas, config.ps_shards) == \
        expected.throughput_samples_per_s


@settings(max_examples=100, deadline=None)
@given(problems(), st.integers(1, 16), st.integers(1, 8), st.integers(0, 8))
def test_ps_sync_bound_holds_over_every_shard_count(case, replicas, lo, span) -> None:
    """compose.bound over S in [lo, hi] is at least the objective at every S there, the
    held-pull convoy's measured pieces included (which need not be monotone in S)."""
    from dnnscale.model.compose import bound, objective

    workload, cluster, base = case["workload"], case["cluster"], case["base"]
    partitions = min(1 + replicas % 3, max_partitions(workload))
    group = Group("ps-sync", partitions, case["minibatch"][0], case["push_every"][0],
                  case["pull_every"][0])
    stage = stage_costs(workload, cluster, group.partitions, group.minibatch, base.fc_protocol)
    ctx = StepContext(workload, cluster, group.config(base, 1, 1).to_plan(), (stage,))
    hi = lo + span
    top = bound(ctx, lo, hi, replicas)
    for shards in range(lo, hi + 1):
        assert objective(ctx, replicas, shards) <= top * (1 + TOLERANCE)


@pytest.mark.parametrize("engine", [None, "megatron", "deepspeed", "torchtitan"])
def test_gpu_search_per_engine_equals_exhaustive(engine) -> None:
    """The GPU-plan search kept to an engine (plan/engines.py) is exact too: a small GPT on
    16 GPUs of 20 MB, pipelined (pp 2 or 4: schedules and ZeRO with a pipeline are where the
    engines differ), every ZeRO stage, overlap and sequence parallelism on and off: the top 3
    step times are the exhaustive reference's, every plan of the top runs on the engine as
    priced, and DeepSpeed's and torchtitan's winners are not the unrestricted one (interleaved
    with ZeRO-1)."""
    from dnnscale.model.memory import device_reserve_bytes
    from dnnscale.optimize.modern import exhaustive_modern, make_modern_space, optimize_modern
    from dnnscale.plan.engines import plan_facts, search_violation
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    w = load_workload("gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512")
    system = load_system("dgx-a100-80g:2")
    # 20 MB for the model's tensors beside the reserve of a plan in three parallel groups
    system = dataclasses.replace(system, machine=dataclasses.replace(
        system.machine, memory_bytes=20e6 + device_reserve_bytes(3)))
    space = make_modern_space(w, system, 32, tensor=(1, 2, 4), pipeline=(2, 4),
                              micro_batch=(1, 2), engine=engine)
    reference = exhaustive_modern(w, system, space, system.machines)
    fast = optimize_modern(w, system, space, top=3, curve=False)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in reference[:3]], rel=TOLERANCE)
    if engine is not None:
        assert fast.engine == engine
        assert all(search_violation(engine, plan_facts(p.plan)) is None for p in fast.top)
    anywhere = optimize_modern(w, system, dataclasses.replace(space, engine=None,
                                                              grad_bytes=(None,) * 4), top=1,
                               curve=False).best
    assert (fast.best.label() == anywhere.label()) == (engine in (None, "megatron"))
