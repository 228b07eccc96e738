"""Typed step records (issue 24): compose() returns per-stage times in one vocabulary of parts
and bottlenecks, Prediction carries them, and the report draws them without pricing anything.

The pipeline case is checked by hand: two equal stages of 1 + 2 + 1 ms per micro-batch, four
micro-batches, on one DGX A100 node (the stages' sends cross NVLink: 231 GB/s, 0.6 µs).
"""

from __future__ import annotations

import json

import pytest

import dnnscale
from dnnscale.model.compose import StepContext, compose
from dnnscale.model.error_band import BOTTLENECK_CLASSES
from dnnscale.model.prediction import Prediction
from dnnscale.model.records import Bottleneck, Part, PartKind
from dnnscale.plan.mesh import MeshDim
from dnnscale.model.stage import StageCosts, StageTotals
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.report import explain
from dnnscale.report.timeline import step_timeline
from dnnscale.system import load_system
from dnnscale.workload import load_workload

SMALL_GPT = "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000"


def _adam(sync: str, **flags) -> Prediction:
    config = dict(partitions=4, replicas=8, ps_shards=0 if sync == "allreduce" else 4,
                  minibatch=32, sync=sync)
    config.update(flags)
    return dnnscale.predict("adam-imagenet22k", "adam-2014", dnnscale.Config(**config))


def _gpu(**fields) -> Prediction:
    plan = dict(tp=2, pp=4, dp=1, micro_batch=1, global_batch=16)
    plan.update(fields)
    return dnnscale.predict(load_workload(SMALL_GPT), load_system("dgx-a100-80g:1"), plan)


def _overlapped_under_a_quota() -> Prediction:
    """ps-async with the exchange overlapped on workers of half a core whose push and pull CPU
    was measured: the exchange's CPU is a part of its own (model/quota.background_exchange_s)."""
    import dataclasses

    system = load_system("adam-2014")
    system = dataclasses.replace(
        system, machine=dataclasses.replace(system.machine, cores=0.5),
        collective_cpu=(("ps_push_pull", 1e-4, 5e-10),))
    return dnnscale.predict("adam-imagenet22k", system, dnnscale.Config(
        partitions=4, replicas=8, ps_shards=4, minibatch=32, sync="ps-async", overlap=True))


def _every_mode() -> dict[str, Prediction]:
    return {"ps-async": _adam("ps-async"), "ps-sync": _adam("ps-sync"),
            "ps-async overlapped under a quota": _overlapped_under_a_quota(),
            "allreduce": _adam("allreduce"), "gpu pipeline": _gpu(),
            "gpu zero-3": _gpu(tp=1, pp=1, dp=8, zero=3, recompute="selective",
                               global_batch=64),
            "gpu experts and context": dnnscale.predict(
                _small_moe(), load_system("dgx-a100-80g:1"),
                dict(tp=1, pp=2, dp=1, ep=2, cp=2, micro_batch=1, global_batch=8))}


def _small_moe():
    from dnnscale.workload.transformer import transformer_workload

    return transformer_workload("small-moe", 4, 256, 8, 128, 1000, flash_attention=True,
                                experts=4, top_k=2)


# ---------------------------------------------------------------- a pipeline by hand

def test_two_equal_stages_by_hand() -> None:
    """p = 2 stages, each 1 ms forward + 2 ms input gradient + 1 ms weight gradient per
    micro-batch, no launches, m = 4. Each stage sends one activation (or input gradient) of
    s·h·b = 128·256·1 values × 2 bytes = 65,536 B per micro-batch: 65,536 / 231e9 + 0.6e-6 =
    0.8837 µs. The two devices wait for the slower: g = e^(0.014826 · Φ⁻¹(1.625 / 2.25)) =
    e^(0.014826 · 0.58946) = 1.008777, so the kernels take 4 ms · g = 4.035110 ms, 35.110 µs of
    it the wait. t = 4.035110 ms + 0.8837 µs; bubble = (p − 1)·t = t; the pipeline
    (m + p − 1)·t = 5·t; the step's forward m·1 ms = 4 ms, input_grad 8 ms, slowest_device
    4·35.110 µs, pp_comm 4·0.8837 µs.
    """
    workload, system = load_workload(SMALL_GPT), load_system("dgx-a100-80g:1")
    plan = modern_plan_from_dict({"tp": 1, "pp": 2, "dp": 1, "micro_batch": 1,
                                  "global_batch": 4})
    stage = StageCosts(1, 1, (), 1000, StageTotals(forward_s=1e-3, input_grad_s=2e-3,
                                                   weight_grad_s=1e-3), 0)
    step = compose(StepContext(workload, system, plan, (stage, stage)), 1, 0)
    record = step.record
    p2p = 65_536 / 231e9 + 0.6e-6
    wait = 4e-3 * 0.008777449803131
    t = 4e-3 + wait + p2p
    assert record.by_stage and record.micro_batches == 4 and len(record.stages) == 2
    for stage_record in record.stages:
        assert stage_record.device_s == pytest.approx(4e-3 + wait, rel=1e-12)
        assert stage_record.slowest_device_s == pytest.approx(wait, rel=1e-12)
        assert stage_record.p2p_s == pytest.approx(p2p, rel=1e-12)
        assert stage_record.micro_batch_s == pytest.approx(t, rel=1e-12)
        assert stage_record.launch_wait_s == 0.0
    assert record.slowest == 0  # equal stages: the first
    assert record.bubble_s == pytest.approx((2 - 1) * t, rel=1e-12)
    assert record.pipeline_s == pytest.approx((4 + 2 - 1) * t, rel=1e-12)
    parts = {part.name: part.seconds for part in step.parts}
    assert parts[Part.FORWARD] == pytest.approx(4e-3)
    assert parts[Part.INPUT_GRAD] == pytest.approx(8e-3)
    assert parts[Part.BUBBLE] == record.bubble_s
    assert parts[Part.SLOWEST_DEVICE] == pytest.approx(4 * wait, rel=1e-12)
    assert parts[Part.PP_COMM] == pytest.approx(4 * p2p, rel=1e-12)
    # no overlap: the step is the pipeline, then dp (one replica: none), then the optimizer
    assert parts[Part.STEP] == pytest.approx(record.pipeline_s + parts[Part.OPTIMIZER_STEP])
    assert record.collective_s(MeshDim.PP) == parts[Part.PP_COMM]
    assert record.collective_s(MeshDim.DP) == 0.0


# ---------------------------------------------------------------- the timeline reads the records

@pytest.mark.parametrize("fields", [{}, {"pp": 2, "tp": 1, "global_batch": 4},
                                    {"recompute": "full", "pp": 2, "global_batch": 8}])
def test_pipeline_timeline_is_the_predictions_stage_records(fields: dict) -> None:
    """Each lane is one stage record: a micro-batch's forward and backward pass (v = 1) add up
    to its micro_batch_s = max(device, host) + p2p; the model's pipeline mark is the record's
    pipeline_s; and the drawing needs neither the workload nor the system (nothing priced)."""
    prediction = _gpu(**fields)
    record = prediction.step_record
    timeline = step_timeline(prediction)
    assert timeline == step_timeline(prediction, load_workload(SMALL_GPT),
                                     load_system("dgx-a100-80g:1"))
    assert len(timeline.lanes) == len(record.stages)
    assert timeline.marks[0][0] == record.pipeline_s
    for stage in record.stages:
        passes = [s for s in timeline.segments if s.lane == stage.index and s.pieces]
        forward = next(s for s in passes if s.name == "forward")
        backward = next(s for s in passes if s.name == "backward")
        assert forward.seconds + backward.seconds == pytest.approx(stage.micro_batch_s,
                                                                   rel=1e-9)
        pieces = dict(forward.pieces)
        assert pieces[Part.FORWARD] == stage.forward_s
        assert dict(backward.pieces).get(Part.RECOMPUTE, 0.0) == stage.recompute_s


def test_records_match_the_parts_of_the_slowest_stage() -> None:
    """The step's parts are m times the slowest stage's record, and its collectives by mesh
    dimension are the tp, pp and dp parts."""
    prediction = _gpu(recompute="selective")
    record = prediction.step_record
    slowest, m = record.slowest_stage, record.micro_batches
    assert slowest.micro_batch_s == max(stage.micro_batch_s for stage in record.stages)
    assert prediction.part(Part.FORWARD) == m * slowest.forward_s
    assert prediction.part(Part.RECOMPUTE) == m * slowest.recompute_s > 0
    assert prediction.part(Part.LAUNCH_WAIT) == m * slowest.launch_wait_s
    assert prediction.part(Part.BUBBLE) == record.bubble_s
    assert record.collective_s(MeshDim.TP) == prediction.part(Part.TP_COMM) > 0
    assert record.collective_s(MeshDim.PP) == prediction.part(Part.PP_COMM) > 0
    assert record.collective_s(MeshDim.DP) == prediction.part(Part.DP_COMM)


@pytest.mark.parametrize("sync", ["ps-async", "ps-sync", "allreduce"])
def test_adam_plans_have_one_stage_record(sync: str) -> None:
    """Project Adam's plans: one stage, one micro-batch, no bubble; the record's layer phases
    and partition traffic are the step's; the dp collectives are the push and pull (or the
    all-reduce)."""
    prediction = _adam(sync)
    record = prediction.step_record
    assert not record.by_stage and not prediction.by_stage
    assert len(record.stages) == 1 and record.micro_batches == 1 and record.bubble_s == 0.0
    stage = record.stages[0]
    assert prediction.part(Part.FORWARD) == stage.forward_s
    assert prediction.part(Part.PARTITION_COMM) == stage.tp_comm_s > 0
    assert record.collective_s(MeshDim.TP) == stage.tp_comm_s
    dp = (prediction.part(Part.ALLREDUCE) if sync == "allreduce"
          else prediction.part(Part.PS_PUSH) + prediction.part(Part.PS_PULL))
    assert record.collective_s(MeshDim.DP) == pytest.approx(dp, rel=1e-12)
    assert len(stage.layers) == len(prediction.layers)


# ---------------------------------------------------------------- one vocabulary

def test_the_vocabulary_is_what_compose_emits_in_every_mode() -> None:
    """Every part of every mode is a Part of a PartKind, every bottleneck a Bottleneck; and
    together the modes emit every Part (the vocabulary has no name nothing uses)."""
    emitted: set[Part] = set()
    for mode, prediction in _every_mode().items():
        for part in prediction.parts:
            assert isinstance(part.name, Part) and isinstance(part.kind, PartKind), mode
            assert all(isinstance(name, Part) for name in part.of), mode
            emitted.add(part.name)
        assert isinstance(prediction.bottleneck, Bottleneck), mode
    assert emitted == set(Part)


def test_every_part_is_explained_and_every_bottleneck_classified() -> None:
    assert set(explain.PART_TEXT) == set(Part)
    classified = [b for members in BOTTLENECK_CLASSES.values() for b in members]
    assert sorted(classified) == sorted(Bottleneck)


def test_json_keeps_plain_strings() -> None:
    """The JSON (and YAML) of a prediction holds plain strings, today's exact names: keys of
    breakdown_s, the parts' names, kinds and sums, the bottleneck."""
    for prediction in _every_mode().values():
        data = prediction.to_dict()
        assert all(type(key) is str for key in data["breakdown_s"])
        assert type(data["bottleneck"]) is str
        assert all(type(p["name"]) is str and type(p["kind"]) is str
                   and all(type(n) is str for n in p["of"]) for p in data["parts"])
        assert json.loads(json.dumps(data))["breakdown_s"] == data["breakdown_s"]
    assert list(_adam("ps-async").breakdown_s) == [
        "forward", "input_grad", "weight_grad", "compute", "partition_comm", "update",
        "ps_push", "ps_pull", "ps_serve_wait", "ps_wait", "step"]
