"""Overlap as plan options (issue 23): the tensor-parallel exchanges in tp chunks under the
GEMMs (overlap_tp, Megatron's --tp-comm-overlap), the pipeline's sends under compute
(overlap_pp, Megatron's overlap_p2p_comm), both priced by hand, searched exactly, checked as
plan rules and exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.errors import InputError
from dnnscale.export.megatron import export_megatron
from dnnscale.export.torchtitan import export_torchtitan
from dnnscale.model.network import chunked_exposed_s
from dnnscale.model.predict import predict_plan
from dnnscale.model.records import Part
from dnnscale.optimize.modern import exhaustive_modern, make_modern_space, optimize_modern
from dnnscale.plan.engines import plan_facts, require_engine, search_violation
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload

GPT = "gpt:layers=4,hidden=512,heads=8,seq=512,vocab=1000"
WIDE = "gpt:layers=2,hidden=4096,heads=32,seq=2048,vocab=1000"
"""Wide enough that a micro-batch's kernels outlast their launches (the step is device bound)."""


def plan(**fields):  # noqa: ANN201
    return modern_plan_from_dict(fields)


def test_chunked_exposure_by_hand() -> None:
    """k chunks: max(T_c / k, T_c − T_x·(k−1)/k). T_c = 4, T_x = 2, k = 2: max(2, 3) = 3;
    T_x = 10: max(2, −1) = 2 (one chunk always waits); k = 1: all of it."""
    assert chunked_exposed_s(4.0, 2.0, 2) == 3.0
    assert chunked_exposed_s(4.0, 10.0, 2) == 2.0
    assert chunked_exposed_s(4.0, 10.0, 1) == 4.0
    assert chunked_exposed_s(8.0, 3.0, 4) == pytest.approx(max(2.0, 8.0 - 3.0 * 3 / 4))


def test_tp_overlap_hides_each_linear_layers_exchange_under_its_own_gemm() -> None:
    """tp 4 with sequence parallelism: each of the four linear layers (QKV, out, MLP up, MLP
    down) runs its all-gather or reduce-scatter in 4 chunks beside the GEMM of the same phase:
    hidden forward = c_f − max(c_f/4, c_f − g_f·3/4), backward alike with the input- and
    weight-gradient GEMMs, of which the GEMM beside it gives back κ/(1 + κ), κ = 18.9 % (it
    runs that much slower beside a collective, Lee et al. 2025): the saving is hidden / 1.189.
    Other layers hide nothing. The step's tp_comm part loses exactly the saved seconds of each
    micro-batch."""
    w, system = load_workload(WIDE), load_system("dgx-a100-80g:1")
    fields = dict(tp=4, dp=2, micro_batch=2, global_batch=8, sequence_parallel=True)
    serial, overlapped = predict_plan(w, system, plan(**fields)), \
        predict_plan(w, system, plan(**fields, overlap_tp=True))
    linear = {"attn_qkv", "attn_out", "mlp_up", "mlp_down"}
    hidden = 0.0
    for cost in overlapped.layers:
        if cost.kind not in linear or cost.comm_s == 0:
            assert cost.comm_hidden_s == 0.0
            continue
        c_f, c_b = cost.comm_forward_s, cost.comm_s - cost.comm_forward_s
        g_f, g_b = cost.forward_s, cost.input_grad_s + cost.weight_grad_s
        expect_f = (c_f - max(c_f / 4, c_f - g_f * 3 / 4)) / 1.189
        expect_b = (c_b - max(c_b / 4, c_b - g_b * 3 / 4)) / 1.189
        assert cost.comm_hidden_forward_s == pytest.approx(expect_f, rel=1e-12)
        assert cost.comm_hidden_s == pytest.approx(expect_f + expect_b, rel=1e-12)
        hidden += expect_f + expect_b
    assert hidden > 0
    m = 2  # micro-batches: 8 / (2 replicas · 2)
    assert serial.part(Part.TP_COMM) - overlapped.part(Part.TP_COMM) == \
        pytest.approx(m * hidden, rel=1e-9)
    assert overlapped.step_time_s < serial.step_time_s
    device = [part for part in overlapped.parts if part.kind not in ("total", "sum")]
    assert sum(part.seconds for part in device) == pytest.approx(overlapped.step_time_s,
                                                                 rel=1e-9)


def test_tp_overlap_hides_the_recomputed_forwards_exchanges_too() -> None:
    """Full recomputation repeats each block's forward with its exchanges: overlapped, the
    recompute part loses the hidden forward seconds of the block layers."""
    w, system = load_workload(GPT), load_system("dgx-a100-80g:1")
    fields = dict(tp=4, micro_batch=2, global_batch=2, sequence_parallel=True,
                  recompute="full")
    serial = predict_plan(w, system, plan(**fields))
    overlapped = predict_plan(w, system, plan(**fields, overlap_tp=True))
    hidden_forward = sum(c.comm_hidden_forward_s for c in overlapped.layers
                         if c.block is not None)
    assert serial.part(Part.RECOMPUTE) - overlapped.part(Part.RECOMPUTE) == \
        pytest.approx(hidden_forward, rel=1e-9)


def test_pipeline_sends_overlap_compute_under_interleaving() -> None:
    """Interleaved pipeline on 2 nodes with a 1 Gbit/s link between them (sends longer than a
    chunk's compute): overlapped, the sends past the kernels are exposed, and the kernels run
    κ = 18.9 % slower beside them (Lee et al. 2025), κ/(1 + κ) of the hidden sends (as long as
    the kernels); without, kernels + sends. Megatron overlaps them by default with the
    interleaved schedule, and only there."""
    w = load_workload(GPT)
    from dnnscale.system.load import load_cluster

    system = load_cluster("dgx-a100-80g:2", {"bandwidth": "1Gbit/s"})
    fields = dict(tp=1, pp=2, dp=1, micro_batch=4, global_batch=16, schedule="interleaved",
                  virtual_stages=2)
    default = plan(**fields)
    assert default.pipeline.overlaps_p2p and default.pipeline.overlap_p2p is None
    overlapped = predict_plan(w, system, default)
    serial = predict_plan(w, system, plan(**fields, overlap_pp=False))
    for on, off in zip(overlapped.step_record.stages, serial.step_record.stages):
        busy = max(off.device_s, off.host_s)
        assert off.micro_batch_s == pytest.approx(busy + off.p2p_s, rel=1e-12)
        exposed = max(0.0, off.p2p_s - busy)
        contention = (off.p2p_s - exposed) * 0.189 / 1.189
        assert on.p2p_s == pytest.approx(exposed + contention, rel=1e-12)
        assert on.micro_batch_s == pytest.approx(max(busy, off.p2p_s) + contention, rel=1e-12)
    assert overlapped.step_time_s < serial.step_time_s
    assert plan(tp=1, pp=2, global_batch=4).pipeline.overlaps_p2p is False  # 1F1B: never


@pytest.mark.parametrize("fields, field", [
    (dict(tp=2, overlap_tp=True), "plan.overlap_tp"),                    # no sequence parallel
    (dict(tp=1, sequence_parallel=True, overlap_tp=True), "plan.overlap_tp"),   # nothing split
    (dict(pp=2, global_batch=2, overlap_pp=True), "plan.overlap_pp"),    # 1F1B
    (dict(overlap_tp="yes"), "plan.overlap_tp"),
    (dict(pp=2, schedule="interleaved", virtual_stages=2, global_batch=2, overlap_pp=1),
     "plan.overlap_pp"),
])
def test_overlap_rules_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(InputError) as caught:
        plan(**fields)
    assert caught.value.field == field


def test_round_trip_keeps_the_overlaps() -> None:
    for fields in (dict(tp=2, sequence_parallel=True, overlap_tp=True),
                   dict(pp=2, schedule="interleaved", virtual_stages=2, global_batch=4,
                        overlap_pp=False),
                   dict(pp=2, schedule="interleaved", virtual_stages=2, global_batch=4)):
        original = plan(**fields)
        assert plan(**modern_plan_to_dict(original)) == original


def test_predict_cli_flags_and_one_line_errors(tmp_path: Path) -> None:
    """Real processes: --overlap-tp prices the overlap (a faster step), a refused overlap is
    one line naming the field, exit 2."""
    base = [sys.executable, "-m", "dnnscale.cli", "predict", "-w", WIDE, "-c", "dgx-a100-80g:1",
            "--tp", "4", "--dp", "2", "--global-batch", "8", "--micro-batch", "2", "--json"]
    plain = subprocess.run([*base, "--sequence-parallel"], capture_output=True, text=True,
                           timeout=60)
    over = subprocess.run([*base, "--sequence-parallel", "--overlap-tp"], capture_output=True,
                          text=True, timeout=60)
    assert plain.returncode == over.returncode == 0, over.stderr
    assert json.loads(over.stdout)["step_time_s"] < json.loads(plain.stdout)["step_time_s"]
    bad = subprocess.run([*base, "--overlap-tp"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: plan.overlap_tp:")


def test_engines_run_the_overlaps_as_their_options_say() -> None:
    """Megatron: --tp-comm-overlap, and --no-overlap-p2p-communication for an interleaved plan
    whose sends do not overlap; torchtitan: async TP (compiled); DeepSpeed refuses TP overlap,
    and torchtitan's interleaved schedule always overlaps its sends (a plan without is left
    out of its search)."""
    shape = load_workload("gpt3-175b").transformer
    both = plan(tp=8, pp=8, dp=12, global_batch=1536, schedule="interleaved", virtual_stages=2,
                sequence_parallel=True, overlap_tp=True, overlap_pp=False, zero=1)
    flags = export_megatron(both, shape, "gpt3-175b").files[0].text.splitlines()
    assert "--tp-comm-overlap" in flags and "--no-overlap-p2p-communication" in flags
    default = plan(tp=8, pp=8, dp=12, global_batch=1536, schedule="interleaved",
                   virtual_stages=2, sequence_parallel=True, zero=1)
    flags = export_megatron(default, shape, "gpt3-175b").files[0].text.splitlines()
    assert "--tp-comm-overlap" not in flags and "--no-overlap-p2p-communication" not in flags
    with pytest.raises(InputError) as caught:
        require_engine("deepspeed", plan(tp=2, sequence_parallel=True, overlap_tp=True))
    assert caught.value.field == "plan.overlap_tp"
    llama = load_workload("llama3-8b").transformer
    titan = export_torchtitan(plan(tp=2, dp=4, global_batch=8, zero=3, sequence_parallel=True,
                                   overlap_dp=True, overlap_tp=True), llama, "llama3-8b")
    text = titan.files[0].text
    assert "enable_async_tensor_parallel = true" in text and "[compile]" in text
    facts = plan_facts(plan(tp=2, pp=2, dp=2, global_batch=8, schedule="interleaved",
                            virtual_stages=2, zero=2, sequence_parallel=True, overlap_dp=True,
                            overlap_pp=False))
    assert search_violation("torchtitan", facts).field == "overlap_pp"


@pytest.mark.parametrize("engine", [None, "megatron", "torchtitan"])
def test_search_over_the_overlaps_equals_exhaustive(engine: str | None) -> None:
    """Both overlaps searched on and off (tp up to 4, pp 1-4 with interleaving): the fast
    search's top 3 are the exhaustive reference's, and the best plan overlaps what it can (an
    overlapped plan is never slower than its twin without)."""
    w, system = load_workload(GPT), load_system("dgx-a100-80g:2")
    space = make_modern_space(w, system, 32, tensor=(1, 2, 4), pipeline=(1, 2, 4),
                              micro_batch=(1, 2), overlap_tp=(False, True),
                              overlap_pp=(False, True), engine=engine)
    reference = exhaustive_modern(w, system, space, system.machines)
    fast = optimize_modern(w, system, space, top=3, curve=False)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in reference[:3]], rel=1e-9)
    best = fast.best.plan
    if best.tensor.degree > 1 and best.tensor.sequence_parallel:
        assert best.tensor.overlap
    if best.pipeline.schedule == "interleaved":
        assert best.pipeline.overlaps_p2p
    default = make_modern_space(w, system, 32)
    assert default.overlap_tp == (False,) and default.overlap_pp == (True,)


def test_tp_overlap_leaves_the_routed_experts_exchanges_alone() -> None:
    """A mixture of experts with tp 2 and sequence parallelism: the attention and dense
    linears hide part of their exchanges, the routed experts' all-gather and reduce-scatter of
    the token copies (Megatron-Core's token dispatcher, not Transformer Engine's userbuffers)
    stay exposed."""
    from dnnscale.workload.transformer import transformer_workload

    w = transformer_workload("moe", 2, 2048, 16, 2048, 1000, flash_attention=True, experts=4,
                             top_k=2)
    p = predict_plan(w, load_system("dgx-a100-80g:1"),
                     plan(tp=2, global_batch=2, micro_batch=2, sequence_parallel=True,
                          overlap_tp=True))
    by_kind = {cost.kind: cost for cost in p.layers if cost.block == 0}
    assert by_kind["attn_qkv"].comm_hidden_s > 0
    assert by_kind["expert_up"].comm_s > 0 and by_kind["expert_up"].comm_hidden_s == 0.0
    assert by_kind["expert_down"].comm_hidden_s == 0.0
