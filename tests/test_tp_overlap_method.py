"""How the tensor-parallel overlap runs (issue 23): Transformer Engine's userbuffers hide every
exchange of the linear layers; torch's micro-pipelined async TP (torchtitan) leaves out the
backward reduce-scatter of a gradient summed over several Linear modules (torchtitan's separate
wq / wk / wv and w1 / w3). Priced by hand, checked as a plan rule, an engine difference, a CLI
flag and through the search."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dnnscale.errors import InputError
from dnnscale.export.plan_source import _from_plan_dict
from dnnscale.model.predict import predict_plan
from dnnscale.model.records import Part
from dnnscale.model.stage import StageCosts, StageTotals
from dnnscale.model.tp_overlap import hidden_exchange, linears_reading_gather
from dnnscale.optimize.modern import make_modern_space, optimize_modern
from dnnscale.plan.engines import engine_differences, plan_facts
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict, plan_label
from dnnscale.system import load_system
from dnnscale.workload import load_workload

GATED = "gpt:layers=2,hidden=4096,heads=32,kv_heads=8,ffn=11008,seq=2048,vocab=1000,gated=true"
PLAIN = "gpt:layers=2,hidden=4096,heads=32,seq=2048,vocab=1000"


def plan(**fields):  # noqa: ANN201
    return modern_plan_from_dict(fields)


def _layers(spec: str) -> dict:
    return {layer.kind: layer for layer in load_workload(spec).layers
            if layer.hyper.get("block") == 0}


def test_linears_reading_one_gather() -> None:
    """torchtitan's Attention reads its gathered input in wq, wk, wv; a gated FeedForward in
    w1 and w3; a GeLU MLP's first linear and the row-parallel linears are one each."""
    gated, plain = _layers(GATED), _layers(PLAIN)
    assert linears_reading_gather(gated["attn_qkv"]) == 3
    assert linears_reading_gather(gated["mlp_up"]) == 2
    assert linears_reading_gather(plain["mlp_up"]) == 1
    assert linears_reading_gather(gated["attn_out"]) == 1
    assert linears_reading_gather(gated["mlp_down"]) == 1


def test_hidden_exchange_by_hand() -> None:
    """k = 4 chunks, κ = 0.25 (κ/(1 + κ) = 0.2 of the hidden part comes back as contention).
    Forward T_c = 0.8 beside T_x = 2.0: exposed max(0.2, 0.8 − 1.5) = 0.2, hidden 0.6 costs
    0.12 more, so 0.8 − 0.32 = 0.48 hidden. A QKV projection's backward of 0.4, all of it the
    reduce-scatter: hidden 0.4 − (0.1 + 0.06) = 0.24, all of it unfused under torch's pass.
    A gated MLP's first linear with 0.8 in backward of which 0.4 is the reduce-scatter: 0.48
    hidden, 0.24 of it over the other 0.4, so 0.24 unfused. A GeLU MLP's and the row-parallel
    linears' reduce-scatters fuse: 0 unfused."""
    gated, plain = _layers(GATED), _layers(PLAIN)
    qkv = hidden_exchange(gated["attn_qkv"], 0.8, 0.4, 0.4, 2.0, 2.0, 4, 0.25)
    assert qkv.forward == pytest.approx(0.48, rel=1e-12)
    assert qkv.backward == pytest.approx(0.24, rel=1e-12)
    assert qkv.unfused == pytest.approx(0.24, rel=1e-12)
    up = hidden_exchange(gated["mlp_up"], 0.8, 0.8, 0.4, 2.0, 2.0, 4, 0.25)
    assert up.backward == pytest.approx(0.48, rel=1e-12)
    assert up.unfused == pytest.approx(0.24, rel=1e-12)
    assert hidden_exchange(plain["mlp_up"], 0.8, 0.8, 0.4, 2.0, 2.0, 4, 0.25).unfused == 0.0
    assert hidden_exchange(gated["mlp_down"], 0.8, 0.8, 0.4, 2.0, 2.0, 4, 0.25).unfused == 0.0
    assert hidden_exchange(gated["attn_qkv"], 0.0, 0.0, 0.0, 2.0, 2.0, 4, 0.25) == (0, 0, 0)


def test_stage_exposes_what_each_method_leaves() -> None:
    """T_mp = 1.0 s of which 0.6 s hidden under userbuffers and 0.2 s of that unfused under
    the micro-pipeline: exposed 1.0 (no overlap), 0.4, 0.6."""
    stage = StageCosts(1, 1, (), totals=StageTotals(partition_s=1.0, partition_hidden_s=0.6,
                                                    partition_unfused_s=0.2))
    assert stage.exposed_partition_s(None) == 1.0
    assert stage.exposed_partition_s("userbuffers") == pytest.approx(0.4)
    assert stage.exposed_partition_s("micro_pipeline") == pytest.approx(0.6)


def test_predict_exposes_the_backward_reduce_scatters_of_qkv_and_gate_up() -> None:
    """tp 4, sequence parallel, 2 micro-batches: the micro-pipelined step's tensor-parallel
    part is the userbuffers one plus, per micro-batch, each QKV projection's and gated first
    MLP linear's unfused backward seconds (equal to their whole hidden backward: their only
    backward exchange is that reduce-scatter); the recomputed forward hides as much (every
    forward exchange fuses), and the step lies between no overlap and userbuffers."""
    w, system = load_workload(GATED), load_system("dgx-h100:1")
    fields = dict(tp=4, dp=2, micro_batch=2, global_batch=8, sequence_parallel=True,
                  recompute="full")
    serial = predict_plan(w, system, plan(**fields))
    buffers = predict_plan(w, system, plan(**fields, overlap_tp=True))
    micro = predict_plan(w, system, plan(**fields, overlap_tp=True,
                                         overlap_tp_method="micro_pipeline"))
    unfused = 0.0
    for cost in micro.layers:
        if cost.kind in ("attn_qkv", "mlp_up"):
            assert cost.comm_unfused_s == pytest.approx(
                cost.comm_hidden_s - cost.comm_hidden_forward_s, rel=1e-12)
            assert cost.comm_unfused_s > 0
        else:
            assert cost.comm_unfused_s == 0.0
        unfused += cost.comm_unfused_s
    m = 2
    assert micro.part(Part.TP_COMM) - buffers.part(Part.TP_COMM) == pytest.approx(
        m * unfused, rel=1e-9)
    assert micro.part(Part.RECOMPUTE) == buffers.part(Part.RECOMPUTE)
    assert buffers.step_time_s < micro.step_time_s < serial.step_time_s


@pytest.mark.parametrize("fields, field", [
    (dict(tp=2, sequence_parallel=True, overlap_tp_method="micro_pipeline"),
     "plan.overlap_tp_method"),
    (dict(tp=2, sequence_parallel=True, overlap_tp=True, overlap_tp_method="nccl"),
     "plan.overlap_tp_method"),
    (dict(tp=2, sequence_parallel=True, overlap_tp=True, overlap_tp_method=True),
     "plan.overlap_tp_method"),
])
def test_method_rules_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(InputError) as caught:
        plan(**fields)
    assert caught.value.field == field


def test_round_trips_keep_the_method() -> None:
    """The plan fields and predict --json's plan both carry it back; a plan without overlap
    writes no method."""
    micro = plan(tp=2, sequence_parallel=True, overlap_tp=True,
                 overlap_tp_method="micro_pipeline")
    fields = modern_plan_to_dict(micro)
    assert fields["overlap_tp_method"] == "micro_pipeline"
    assert plan(**fields) == micro
    assert _from_plan_dict(json.loads(json.dumps(micro.to_dict())), "plan") == micro
    assert "overlap_tp_method" not in modern_plan_to_dict(plan(tp=2, sequence_parallel=True))
    assert "async-tp" in plan_label(micro)
    assert "tp-overlap" in plan_label(plan(tp=2, sequence_parallel=True, overlap_tp=True))


def test_each_engine_names_its_method() -> None:
    """torchtitan runs the micro-pipeline, Megatron-LM userbuffers: the other method is a
    difference naming the field; a plan without overlap has none."""
    buffers = plan(tp=2, dp=2, global_batch=4, zero=3, sequence_parallel=True, overlap_dp=True,
                   overlap_tp=True, grad_bytes=4, grad_accumulation="add", loss="torch")
    micro = plan(**{**modern_plan_to_dict(buffers), "overlap_tp_method": "micro_pipeline"})
    fields = [v.field for v in engine_differences("torchtitan", plan_facts(buffers))]
    assert "overlap_tp_method" in fields
    assert "overlap_tp_method" not in [
        v.field for v in engine_differences("torchtitan", plan_facts(micro))]
    assert "overlap_tp_method" in [
        v.field for v in engine_differences("megatron", plan_facts(micro))]
    assert "overlap_tp_method" not in [
        v.field for v in engine_differences("megatron", plan_facts(buffers))]


def test_torchtitan_search_prices_async_tp_its_way() -> None:
    """optimize --engine torchtitan with overlap searched: every overlapping plan it returns is
    priced micro-pipelined and labelled async-tp; without an engine, userbuffers."""
    w, system = load_workload(GATED), load_system("dgx-h100:1")
    for engine, method in (("torchtitan", "micro_pipeline"), (None, "userbuffers")):
        space = make_modern_space(w, system, 8, tensor=(2, 4), pipeline=(1,),
                                  micro_batch=(1, 2), overlap_tp=(True,), engine=engine,
                                  sequence_parallel=True)
        result = optimize_modern(w, system, space, top=3, curve=False)
        overlapped = [p for p in result.top if p.plan.tensor.overlap]
        assert overlapped
        for p in overlapped:
            assert p.plan.tensor.overlap_method == method
            expect = predict_plan(w, system, p.plan).step_time_s
            assert p.step_time_s == pytest.approx(expect, rel=1e-9)


def test_predict_cli_flag() -> None:
    """Real processes: --overlap-tp-method micro_pipeline prices a slower step than the
    default; without --overlap-tp it is one line naming the flag, exit 2."""
    base = [sys.executable, "-m", "dnnscale.cli", "predict", "-w", GATED, "-c", "dgx-h100:1",
            "--tp", "4", "--dp", "2", "--global-batch", "8", "--micro-batch", "2",
            "--sequence-parallel", "--json"]
    runs = [subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
            for extra in (["--overlap-tp"],
                          ["--overlap-tp", "--overlap-tp-method", "micro_pipeline"])]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr
    buffers, micro = (json.loads(r.stdout)["step_time_s"] for r in runs)
    assert buffers < micro
    bad = subprocess.run([*base, "--overlap-tp-method", "micro_pipeline"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: --overlap-tp-method:")


def test_exports_note_the_other_method() -> None:
    """A torchtitan export of a plan priced with userbuffers, and a Megatron-LM export of one
    priced micro-pipelined, each carry one note naming overlap_tp_method and the engine's."""
    from dnnscale.export.megatron import export_megatron
    from dnnscale.export.torchtitan import export_torchtitan

    shape = load_workload("llama3-8b").transformer
    buffers = plan(tp=2, dp=4, global_batch=8, zero=3, sequence_parallel=True, overlap_dp=True,
                   overlap_tp=True)
    notes = [n for n in export_torchtitan(buffers, shape, "llama3-8b").notes
             if "overlap_tp_method" in n]
    assert len(notes) == 1 and notes[0].endswith("use overlap_tp_method micro_pipeline")
    micro = plan(tp=2, dp=4, global_batch=8, sequence_parallel=True, overlap_tp=True,
                 overlap_tp_method="micro_pipeline")
    notes = [n for n in export_megatron(micro, shape, "llama3-8b").notes
             if "overlap_tp_method" in n]
    assert len(notes) == 1 and notes[0].endswith("use overlap_tp_method userbuffers")
