"""The GPU-plan search (issue 14): the fast search equals the exhaustive reference on small
spaces, memory pruning, objectives, the Pareto front, families, warnings, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.model.memory import device_reserve_bytes
from dnnscale.optimize.modern import (exhaustive_modern, groups_of, make_modern_space,
                                      optimize_modern, replica_choices)
from dnnscale.plan.engines import plan_facts, search_violation
from dnnscale.system import load_system
from dnnscale.workload import load_workload

SMALL = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512"


def _system(nodes: int, memory_bytes: float | None = None):  # type: ignore[no-untyped-def]
    """`nodes` DGX A100 nodes; with `memory_bytes`, that much memory for the model's tensors
    beside the reserve (model/memory.device_reserve_bytes) of a plan in three parallel groups."""
    system = load_system(f"dgx-a100-80g:{nodes}")
    if memory_bytes is not None:
        system = dataclasses.replace(system, machine=dataclasses.replace(
            system.machine, memory_bytes=memory_bytes + device_reserve_bytes(3)))
    return system


@settings(max_examples=8, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), global_batch=st.sampled_from([8, 16, 32, 64]),
       memory_mb=st.sampled_from([None, 40, 60, 120]), objective=st.sampled_from(["time", "cost"]),
       engine=st.sampled_from([None, "megatron", "deepspeed", "torchtitan"]))
def test_fast_equals_exhaustive(nodes: int, global_batch: int, memory_mb: int | None,
                                objective: str, engine: str | None) -> None:
    """Every family of the space (TP, PP incl. interleaved, ZeRO 0-3 also with a pipeline,
    recompute, sequence parallel, overlap on and off, micro-batches) on up to 64 GPUs, for any
    engine or one: the search's top 3 are the reference's."""
    w = load_workload(SMALL)
    system = _system(nodes, memory_mb * 1e6 if memory_mb else None)
    space = make_modern_space(w, system, global_batch, tensor=(1, 2, 4), pipeline=(1, 2, 4),
                              micro_batch=(1, 2, 4), engine=engine)
    reference = exhaustive_modern(w, system, space, system.machines, objective)
    if engine is not None:  # the engine's plans are exactly the ones it runs as priced
        anywhere = exhaustive_modern(w, system, dataclasses.replace(space, engine=None),
                                     system.machines, objective, distinct_plans=False)
        kept = [p.label() for p in anywhere
                if search_violation(engine, plan_facts(p.plan)) is None]
        every = exhaustive_modern(w, system, space, system.machines, objective,
                                  distinct_plans=False)
        assert sorted(kept) == sorted(p.label() for p in every)
    if not reference:
        with pytest.raises(InputError, match="no plan"):
            optimize_modern(w, system, space, top=3, objective=objective, curve=False)
        return
    fast = optimize_modern(w, system, space, top=3, objective=objective, curve=False)

    def value(p):  # type: ignore[no-untyped-def]
        return p.step_time_s if objective == "time" else p.step_time_s * p.plan.workers

    expected = [value(p) for p in reference[:3]]
    got = [value(p) for p in fast.top]
    assert got == pytest.approx(expected, rel=1e-9)
    assert all(p.fits for p in fast.top)


def test_memory_prunes_and_the_error_says_why() -> None:
    w = load_workload("gpt3-175b")
    system = load_system("dgx-a100-80g:1")
    space = make_modern_space(w, system, 64)
    with pytest.raises(InputError, match="no plan of gpt3-175b fits in 8 GPUs"):
        optimize_modern(w, system, space, curve=False)


def test_replica_choices_follow_the_batch() -> None:
    w = load_workload(SMALL)
    system = _system(8)
    space = make_modern_space(w, system, 48, tensor=(2,), pipeline=(2,), micro_batch=(2,))
    group = next(g for g in groups_of(space, w) if g.schedule == "1f1b")
    # d divides 48 / 2 = 24 and 2·2·d ≤ 64 (d ≤ 16): 1, 2, 3, 4, 6, 8, 12
    assert replica_choices(group, space, 64) == [1, 2, 3, 4, 6, 8, 12]
    # interleaved (v = 2 needs 4 layers % (2·2) = 0): m = 24 / d must be a multiple of pp = 2
    interleaved = next(g for g in groups_of(space, w) if g.schedule == "interleaved")
    assert replica_choices(interleaved, space, 64) == [1, 2, 3, 4, 6, 12]  # m: 24 12 8 6 4 2


def test_families_pareto_and_warnings() -> None:
    w = load_workload("gpt3-1.3b")
    system = load_system("dgx-a100-80g:4")
    space = make_modern_space(w, system, 2048 * 8)
    result = optimize_modern(w, system, space, top=3, pareto=True)
    assert set(result.families) <= {"no pipeline (pp = 1)", "no tensor parallelism (tp = 1)",
                                    "ZeRO-3 / FSDP"} and result.families
    for other in result.families.values():
        assert other.step_time_s >= result.best.step_time_s * (1 - 1e-12)
    gpus = [p.plan.workers for p in result.pareto]
    times = [p.step_time_s for p in result.pareto]
    assert gpus == sorted(gpus) and times == sorted(times, reverse=True)
    assert any("beyond what trains well" in line for line in result.warnings)
    assert [point.gpus for point in result.curve] == [1, 2, 4, 8, 16, 32]
    data = result.to_dict()
    assert data["best"]["plan_fields"]["tp"] == result.best.plan.tensor.degree


def test_cost_objective_needs_a_price_and_prefers_fewer_gpus() -> None:
    w = load_workload(SMALL)
    system = dataclasses.replace(_system(2), price_per_device_hour=None)
    space = make_modern_space(w, system, 16)
    with pytest.raises(InputError, match="needs a price per device-hour"):
        optimize_modern(w, system, space, objective="cost", curve=False)
    priced = _system(2)
    fastest = optimize_modern(w, priced, space, curve=False).best
    cheapest = optimize_modern(w, priced, space, objective="cost", curve=False).best
    assert cheapest.plan.workers <= fastest.plan.workers
    assert cheapest.step_time_s * cheapest.plan.workers <= \
        fastest.step_time_s * fastest.plan.workers * (1 + 1e-12)


def test_cli_optimize_gpu_json_and_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["optimize", "-w", SMALL, "-c", "dgx-a100-80g:1",
                                 "--global-batch", "16", "--json", "--tokens", "1e9"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["best"]["plan_fields"]["global_batch"] == 16 and data["time_to_train_s"] > 0
    missing = runner.invoke(app, ["optimize", "-w", SMALL, "-c", "dgx-a100-80g:1"])
    assert missing.exit_code == 2 and "--global-batch: required" in missing.output
    bad = runner.invoke(app, ["optimize", "-w", SMALL, "-c", "dgx-a100-80g:1",
                              "--global-batch", "16", "--tp", "3"])
    assert bad.exit_code == 2 and "tp: 3 does not divide" in bad.output


@settings(max_examples=6, deadline=None)
@given(layers=st.sampled_from([4, 6, 12]), nodes=st.sampled_from([1, 4]),
       global_batch=st.sampled_from([8, 24, 64]), objective=st.sampled_from(["time", "cost"]))
def test_quick_bound_never_exceeds_the_exact_bound(layers: int, nodes: int, global_batch: int,
                                                   objective: str) -> None:
    """The search enters each group with a bound from the whole model on one stage and
    tightens it lazily; exactness needs quick ≤ exact for every group, also when the blocks do
    not split evenly over the stages (6 and 12 blocks on 4 stages) and at every d; with the
    tensor-parallel overlap in the space, a class's bound (the overlap where any member may
    take it) is at most each member's exact one."""
    from dnnscale.optimize.modern import _Search

    w = load_workload(f"gpt:layers={layers},hidden=128,heads=4,seq=64,vocab=512")
    system = _system(nodes)
    space = make_modern_space(w, system, global_batch, tensor=(1, 2, 4), micro_batch=(1, 2, 4),
                              overlap_tp=(False, True))
    search = _Search(w, system, space, objective)
    checked = 0
    for group in groups_of(space, w):
        choices = replica_choices(group, space, system.machines)
        if choices:
            quick = search.quick_bound(group, choices, group.overlap_tp)
            exact = search.bound(group, choices, search.stages(group))
            assert 0 < quick <= exact
            assert search.quick_bound(group, choices, group.may_overlap_tp(space)) <= exact
            checked += 1
    assert checked > 0


def test_plans_that_run_alike_are_listed_once() -> None:
    """With one replica (dp · ep · cp = 1) the ZeRO stage and the data-parallel overlap change
    nothing that runs: the key folds them (the gradients' width stays in it); with two
    replicas they differ. The top list of a search whose best plans have one replica holds no
    two plans of one key, and the exhaustive reference lists them once too."""
    from dnnscale.optimize.modern import Group, equivalence_key

    w = load_workload(SMALL)
    system = _system(1)
    space = make_modern_space(w, system, 8, tensor=(2,), pipeline=(4,), micro_batch=(1,))
    base = Group(2, 4, "1f1b", 1, 1, True, "none", 0)
    variants = [base._replace(zero=z, overlap_dp=o) for z in (0, 1) for o in (False, True)]
    assert len({equivalence_key(g, 1, space) for g in variants}) == 1
    assert len({equivalence_key(g, 2, space) for g in variants}) == 4
    fast = optimize_modern(w, system, space, top=5, curve=False)
    assert any(p.plan.dense_replicas == 1 for p in fast.top)
    labels = [p.label() for p in fast.top]
    assert len(labels) == len(set(labels))
    reference = exhaustive_modern(w, system, space, system.machines)
    every = exhaustive_modern(w, system, space, system.machines, distinct_plans=False)
    assert len(reference) < len(every)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in reference[:5]], rel=1e-9)
