"""The GPU/transformer model (issue 13): memory formulas by hand on named cases, hierarchical
collectives, pipeline schedules, Megatron's tensor-parallel events, plan rules, CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.model import predict_plan
from dnnscale.model.collectives import group_collective_time_s
from dnnscale.model.megatron_rules import megatron_shard
from dnnscale.model.memory import sharded_state_parts, transformer_block_activation_bytes
from dnnscale.model.schedule import in_flight_micro_batches, pipeline_time_s, stage_layers
from dnnscale.model.sharding import SplitContext
from dnnscale.plan import check_modern_plan, modern_plan_from_dict, modern_plan_to_dict
from dnnscale.system import GroupSpan, LinkTier, Topology, load_system
from dnnscale.validate.vtrain import load_rows, padded_vocab
from dnnscale.workload import load_workload

GB = 1e9


@pytest.mark.parametrize("stage, expected_gb", [(0, 120.0), (1, 31.40625), (2, 16.640625),
                                                (3, 1.875)])
def test_zero_stages_reproduce_rajbhandari_figure_1(stage: int, expected_gb: float) -> None:
    """ZeRO (SC'20) Figure 1: Ψ = 7.5B, N_d = 64, K = 12 — 120 GB, 31.4 GB, 16.6 GB, 1.9 GB:
    (2+2+K)Ψ; 2Ψ + 2Ψ + KΨ/N_d; 2Ψ + (2+K)Ψ/N_d; (2+2+K)Ψ/N_d."""
    parts = sharded_state_parts(7.5e9, 2, 2, 12, stage, 64)
    assert sum(p.bytes for p in parts) / GB == pytest.approx(expected_gb)
    assert [p.name for p in parts] == ["weights", "gradients", "optimizer_state"]


def test_korthikanti_activation_formulas_gpt3() -> None:
    """Korthikanti et al. 2022 eq. 1-2 and §5 for GPT-3 175B (s 2048, h 12288, a 96), b = 1,
    t = 8, in bytes: 34·sbh + 5·a·s²·b without TP; sbh·(10 + 24/t + 5as/(ht)) with TP;
    (34 + 5as/h)·sbh/t with sequence parallel; selective drops 5as/h; full keeps 2sbh."""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h, ffn_in=4 * h,
                  ffn_out=4 * h, flash_attention=False)
    no_tp = transformer_block_activation_bytes(tensor=1, sequence_parallel=False,
                                               recompute="none", **common)
    assert no_tp == pytest.approx(sbh * (34 + 5 * a * s / h))            # 2.87 GB per layer
    assert no_tp / GB == pytest.approx(2.869, rel=1e-3)
    assert transformer_block_activation_bytes(tensor=t, sequence_parallel=False, recompute="none",
                                              **common) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert transformer_block_activation_bytes(tensor=t, sequence_parallel=True, recompute="none",
                                              **common) == pytest.approx(
        sbh * (34 + 5 * a * s / h) / t)
    assert transformer_block_activation_bytes(tensor=t, sequence_parallel=True,
                                              recompute="selective", **common) == pytest.approx(
        sbh * 34 / t)
    assert transformer_block_activation_bytes(tensor=t, sequence_parallel=False,
                                              recompute="full", **common) == pytest.approx(2 * sbh)


def test_activations_without_dropout_keep_no_masks() -> None:
    """GPT-3 175B's block (as above, t = 1): without the hidden dropout the two 1-byte masks,
    2·sbh, go: 32·sbh + 5·a·s²·b; without the attention dropout the core keeps only the softmax
    output, 2·a·s²·b (its mask and dropped copy, 3·a·s²·b, go): 34·sbh + 2·a·s²·b; neither:
    32·sbh + 2·a·s²·b. A float32 softmax (autocast's) keeps P at 4 bytes and the 16-bit copy
    the second matmul reads: 7 bytes a score with dropout, 6 without."""
    from dnnscale.model.memory import softmax_core_bytes_per_score
    s, b, h, a = 2048, 1, 12288, 96
    sbh, scores = s * b * h, a * s * s * b
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h, ffn_in=4 * h,
                  ffn_out=4 * h, flash_attention=False, tensor=1, sequence_parallel=False,
                  recompute="none")
    assert transformer_block_activation_bytes(**common, hidden_dropout=False) == \
        pytest.approx(32 * sbh + 5 * scores)
    assert transformer_block_activation_bytes(**common, attention_dropout=False) == \
        pytest.approx(34 * sbh + 2 * scores)
    assert transformer_block_activation_bytes(**common, hidden_dropout=False,
                                              attention_dropout=False) == \
        pytest.approx(32 * sbh + 2 * scores)
    assert [softmax_core_bytes_per_score(wide, drop) for wide in (False, True)
            for drop in (True, False)] == [5, 2, 7, 6]
    # flash attention keeps no score-sized tensor, dropout or not (FA2 regenerates its mask)
    flash = {**common, "flash_attention": True}
    assert transformer_block_activation_bytes(**flash, attention_dropout=False) == \
        transformer_block_activation_bytes(**flash)


def test_a_workload_without_attention_dropout_prices_and_keeps_less() -> None:
    """gpt: with attention_dropout=false: the softmax moves 2·a·s² values·b forward and
    3·a·s²·b backward (no mask, no dropped copy), the residual adds keep their dropout, and
    the predicted activation memory falls by 3 bytes a score value per block (the mask and the
    dropped copy; a·s² = 32 scores: 96 B a sample per block) against the shape with both."""
    import dnnscale
    from dnnscale.workload import load_workload
    base = "gpt:layers=2,hidden=8,heads=2,seq=4,vocab=10"
    both, attn_off = (load_workload(name) for name in (base, base + ",attention_dropout=false"))
    softmax = {w: next(l for l in w.layers if l.kind == "attn_softmax") for w in (both, attn_off)}
    assert not softmax[attn_off].hyper["dropout"] and softmax[both].hyper["dropout"]
    assert (softmax[attn_off].fwd_bytes, softmax[attn_off].input_grad_bytes) == \
        (2 * 32 * 2, 3 * 32 * 2)
    assert all(l.hyper["dropout"] for l in attn_off.layers if l.kind == "residual_add")
    assert attn_off.transformer.dropout and not attn_off.transformer.attention_dropout
    # dropout=false alone turns both off; attention_dropout=true keeps the attention's
    off = load_workload(base + ",dropout=false")
    assert not off.transformer.attention_dropout
    kept_attention = load_workload(base + ",dropout=false,attention_dropout=true")
    assert kept_attention.transformer.attention_dropout
    plan = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 3, "global_batch": 3}
    kept = {name: dnnscale.predict(w, "dgx-a100-80g:1", plan).memory_bytes["activations"]
            for name, w in (("both", both), ("attn_off", attn_off))}
    assert kept["both"] - kept["attn_off"] == 2 * 3 * 32 * 3  # blocks x 3 B x a·s² x samples


def test_a_recomputed_block_holds_its_activations_once_more() -> None:
    """Full recomputation keeps each block's input, 2·s·b·h = 1,024 B a sample (s 8, h 64),
    but the block being recomputed holds what it would keep without recomputation, 34·s·b·h +
    5·a·s²·b = 17,408 + 1,280 = 18,688 B a sample, while it runs its backward: 17,664 B more.
    The loss (inplace, 80 logits a sample at 2 bytes: 4 kept + 2 transient) has run its
    backward by then, so only the excess over its 480 B counts: 17,184 B a sample, 34,368 B at
    micro-batch 2. Without recomputation there is no such part; with a loss larger than the
    block (a 100,000-word vocabulary) none either."""
    import dnnscale
    base = "gpt:layers=2,hidden=64,heads=4,seq=8,vocab={v}"
    plan = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 2, "global_batch": 2, "recompute": "full"}
    full = dnnscale.predict(base.format(v=10), "dgx-a100-80g:1", plan).memory_bytes
    assert full["recompute"] == 34_368 == 2 * (18_688 - 1_024 - 80 * 6)
    assert full["loss"] == 2 * 80 * 6
    plain = dnnscale.predict(base.format(v=10), "dgx-a100-80g:1",
                             {**plan, "recompute": "none"}).memory_bytes
    assert "recompute" not in plain
    big_vocab = dnnscale.predict(base.format(v=100_000), "dgx-a100-80g:1", plan).memory_bytes
    assert "recompute" not in big_vocab and big_vocab["loss"] == 2 * 8 * 100_000 * 6


def test_hierarchical_allreduce_by_hand() -> None:
    """TP 16 over two nodes of 8 (NVLink 100 GB/s, IB 10 GB/s, no latency), 16 MB: reduce-
    scatter in the node 7/8·16 MB, all-reduce of 2 MB between 2 nodes 2·1/2·2 MB, all-gather
    7/8·16 MB: 0.14 ms + 0.2 ms + 0.14 ms."""
    topology = Topology(8, LinkTier(10e9, 0.0, "ib"), LinkTier(100e9, 0.0, "nvlink"))
    x = 16e6
    expected = 7 / 8 * x / 100e9 + 2 * 1 / 2 * (x / 8) / 10e9 + 7 / 8 * x / 100e9
    assert group_collective_time_s("allreduce", "nccl", x, GroupSpan(16, 8), topology) == \
        pytest.approx(expected)
    # inside one node: a plain ring on NVLink; one member per node: a ring on IB
    assert group_collective_time_s("allreduce", "nccl", x, GroupSpan(8, 8), topology) == \
        pytest.approx(2 * 7 / 8 * x / 100e9)
    assert group_collective_time_s("allreduce", "nccl", x, GroupSpan(4, 1), topology) == \
        pytest.approx(2 * 3 / 4 * x / 10e9)
    assert group_collective_time_s("allreduce", "nccl", x, GroupSpan(1, 1), topology) == 0.0


def test_pipeline_time_and_in_flight_micro_batches() -> None:
    # stages of 1, 1 and 2 s, 4 micro-batches: 4·2 + (1 + 1 + 2 − 2) = 10 s (bubble 2 s)
    assert pipeline_time_s((1.0, 1.0, 2.0), 4) == 10.0
    # equal stages: (m + (p−1)/v)·t — 8 micro-batches, 4 stages, v = 2: (8 + 1.5)·1
    assert pipeline_time_s((1.0,) * 4, 8, 2) == 9.5
    assert pipeline_time_s((3.0,), 1) == 3.0
    assert in_flight_micro_batches("1f1b", 0, 4, 16) == 4
    assert in_flight_micro_batches("1f1b", 3, 4, 16) == 1
    assert in_flight_micro_batches("gpipe", 3, 4, 16) == 16
    assert in_flight_micro_batches("interleaved", 0, 4, 16, 2) == pytest.approx(4 * (1 + 3 / 8))


def test_stage_layers_put_embedding_first_and_head_last() -> None:
    w = load_workload("gpt:layers=4,hidden=64,heads=4,seq=16,vocab=100")
    stages = stage_layers(w.layers, 2)
    names = [[w.layers[i].name for i in stage] for stage in stages]
    assert names[0][0] == "embedding" and names[-1][-1] == "cross_entropy"
    assert {w.layers[i].hyper["block"] for i in stages[0] if w.layers[i].hyper.get("block")
            is not None} == {0, 1}


def test_megatron_events_per_block() -> None:
    """Per block, forward 2 all-reduces of b·s·h (after attention and MLP), backward 2 (before
    QKV and the MLP's first linear); with sequence parallel each is a reduce-scatter plus an
    all-gather. b = 2, s = 16, h = 64, 2 bytes: 4096 bytes."""
    w = load_workload("gpt:layers=1,hidden=64,heads=4,seq=16,vocab=100")
    by_kind = {layer.kind: layer for layer in w.layers}
    context = SplitContext("tensor", False, 2, 2)
    events = [e for kind in ("attn_qkv", "attn_out", "mlp_up", "mlp_down")
              for e in megatron_shard(by_kind[kind], 4, context, False).events]
    assert [(e.operation, e.phase, e.payload_bytes) for e in events] == [
        ("allreduce", "backward", 4096), ("allreduce", "forward", 4096),
        ("allreduce", "backward", 4096), ("allreduce", "forward", 4096)]
    sp = megatron_shard(by_kind["attn_out"], 4, context, True).events
    assert [(e.operation, e.phase) for e in sp] == [("reduce_scatter", "forward"),
                                                    ("allgather", "backward")]
    norm = megatron_shard(by_kind["layernorm"], 4, context, False)
    assert norm.work_fraction == 1.0 and norm.replicated_params == by_kind["layernorm"].params
    assert megatron_shard(by_kind["layernorm"], 4, context, True).work_fraction == 0.25


def test_plan_fields_round_trip_and_rules() -> None:
    fields = {"tp": 8, "pp": 8, "dp": 8, "micro_batch": 1, "global_batch": 1536,
              "recompute": "full", "precision": "bf16"}
    plan = modern_plan_from_dict(fields)
    assert plan.batch.accumulation == 192 and plan.workers == 512
    assert modern_plan_from_dict(modern_plan_to_dict(plan)) == plan
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:64")
    check_modern_plan(plan, w, c)
    bad = [({"tp": 5}, "plan.tp: 5 does not divide the model's 96 attention heads"),
           ({"pp": 5}, "plan.pp: 96 layers do not divide into 5 stages"),
           ({"dp": 16}, "plan: needs 1024 devices"),
           ({"global_batch": 1001}, "plan.global_batch: 1001 is not a multiple"),
           ({"zero": 4}, "plan.zero: must be"),
           ({"schedule": "interleaved", "virtual_stages": 1}, "interleaved needs"),
           ({"precision": "fp9"}, "plan.precision: must be one of")]
    for change, message in bad:
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            check_modern_plan(modern_plan_from_dict({**fields, **change}), w, c)
    with pytest.raises(InputError, match="has no fp8 units"):
        check_modern_plan(modern_plan_from_dict({**fields, "precision": "fp8"}), w, c)


def test_gpt3_175b_prediction_has_every_part_and_fits() -> None:
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:64")
    plan = modern_plan_from_dict({"tp": 8, "pp": 8, "dp": 8, "micro_batch": 1,
                                  "global_batch": 1536, "recompute": "full"})
    p = predict_plan(w, c, plan)
    names = [part.name for part in p.parts]
    for name in ("compute", "recompute", "tp_comm", "pp_comm", "bubble", "dp_comm",
                 "optimizer_step", "step"):
        assert name in names
    device = [part for part in p.parts if part.kind != "total" and part.kind != "sum"]
    assert sum(part.seconds for part in device) == pytest.approx(p.step_time_s, rel=1e-9)
    assert p.fits and p.overflow() == ""
    assert p.tokens_per_s == pytest.approx(p.throughput_samples_per_s * 2048)
    assert 0 < p.mfu < 1
    # The fullest device is stage 0: 12 blocks of 12h² + 13h parameters and the embedding
    # (V + s)·h, split 8 ways, its norms (4h per block) held whole: Ψ = W/8 + 7/8·W_norms;
    # ZeRO-0 bf16 as Megatron runs it: weights 2Ψ, fp32 gradients 4Ψ, optimizer state 12Ψ;
    # the reserve: context 287,047,680 B + cuBLAS 33,554,432 B + 3 groups (tp, pp, dp) of
    # 2 · 32 · 4 MiB NCCL buffers.
    h, blocks = 12288, 12
    stage = blocks * (12 * h * h + 13 * h) + (50257 + 2048) * h
    psi = stage / 8 + 7 / 8 * blocks * 4 * h
    memory = p.memory_bytes
    assert (memory["weights"], memory["gradients"], memory["optimizer_state"]) == \
        pytest.approx((2 * psi, 4 * psi, 12 * psi))
    assert memory["reserve"] == 287_047_680 + 33_554_432 + 3 * 2 * 32 * 4 * 2 ** 20


def test_a_plan_that_does_not_fit_says_which_part() -> None:
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:8")
    p = predict_plan(w, c, modern_plan_from_dict({"tp": 8, "dp": 8, "global_batch": 64}))
    assert not p.fits
    assert p.overflow().startswith("a worker needs") and "optimizer state" in p.overflow()


def test_cli_predict_gpu_plan_json_and_errors() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["predict", "-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp",
                                 "8", "--pp", "8", "--dp", "8", "--global-batch", "1536",
                                 "--recompute", "full", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["config"] is None and data["plan"]["tensor"]["degree"] == 8
    assert {"tokens_per_s", "mfu"} <= set(data)
    assert {"weights", "gradients", "optimizer_state", "activations"} <= set(data["memory_bytes"])
    mixed = runner.invoke(app, ["predict", "-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp",
                                "8", "-R", "2"])
    assert mixed.exit_code == 2 and "--replicas: is one of Project Adam's flags" in mixed.output
    bad = runner.invoke(app, ["predict", "-w", "gpt3-175b", "-c", "dgx-a100-80g:x", "--tp", "8"])
    assert bad.exit_code == 2 and "cluster" in bad.output


def test_vtrain_rows_load() -> None:
    assert len(load_rows("single")) == 1440 and len(load_rows("multi")) == 109
    assert padded_vocab(1) == 50304 and padded_vocab(8) == 51200



def test_vtrain_rows_accumulate_through_autograd() -> None:
    """Megatron-DeepSpeed's weight gradients are plain matmuls that autograd adds into .grad
    (validate/vtrain.py VTRAIN_GRAD_ACCUMULATION): a row of m micro-batches pays m - 1 added
    micro-batches of 3 passes over each member's 2-byte gradients."""
    from dnnscale.model.accumulation import accumulation_bytes_per_step
    from dnnscale.validate.vtrain import row_plan

    row = next(r for r in load_rows("multi") if r.global_batch // (r.data * r.micro_batch) > 1)
    plan = row_plan(row)
    assert plan.batch.grad_accumulation == "add"
    m = plan.batch.accumulation
    assert accumulation_bytes_per_step("add", m, 1.0, 0.0, 2, 2, True) == (m - 1) * 3 * 2


def test_eager_rmsnorms_keep_their_fp32_copies() -> None:
    """RMSNorms run op by op keep the fp32 copy of their input and their 16-bit output, 4 bytes
    a value more than the fused kernel's input, for each of a block's two: GPT-3 175B's block
    (t = 1, flash attention) keeps 34·sbh + 8·sbh + the fp32 log-sum-exp; under sequence
    parallelism t = 8 the extra is 8·sbh/8; full and per-operation recomputation keep no norm
    input, so nothing changes there."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h, ffn_in=4 * h,
                  ffn_out=4 * h, flash_attention=True, tensor=1, sequence_parallel=False,
                  recompute="none")
    fused = transformer_block_activation_bytes(**common)
    assert fused == pytest.approx(34 * sbh + 4 * a * s * b)
    assert transformer_block_activation_bytes(**common, eager_norms=True) == \
        pytest.approx(fused + 8 * sbh)
    split = {**common, "tensor": 8, "sequence_parallel": True}
    assert transformer_block_activation_bytes(**split, eager_norms=True) == pytest.approx(
        transformer_block_activation_bytes(**split) + sbh)
    for recompute in ("full", "op"):
        again = {**common, "recompute": recompute}
        assert transformer_block_activation_bytes(**again, eager_norms=True) == \
            transformer_block_activation_bytes(**again)


def test_an_eager_swiglu_keeps_silus_output() -> None:
    """A SwiGLU run op by op keeps silu's output for the product's backward: f_out more values
    a row, 2·s·b·f bytes (/t): GPT-3 175B's shape with a gated MLP of f = 4h keeps 8·sbh more
    without TP and sbh more at t = 8."""
    s, b, h, a = 2048, 1, 12288, 96
    sbh = s * b * h
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h, ffn_in=8 * h,
                  ffn_out=4 * h, flash_attention=True, tensor=1, sequence_parallel=False,
                  recompute="none")
    assert transformer_block_activation_bytes(**common, eager_activation=True) == \
        pytest.approx(transformer_block_activation_bytes(**common) + 8 * sbh)
    split = {**common, "tensor": 8}
    assert transformer_block_activation_bytes(**split, eager_activation=True) == \
        pytest.approx(transformer_block_activation_bytes(**split) + sbh)
