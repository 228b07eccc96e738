"""The plan's mixed-precision mode (`amp: half | autocast | tf-amp`, workload/transformer_kinds.py
AMP_MODES): which kinds run on float32 values and what they then move, by hand; what a
block keeps (model/memory.transformer_block_activation_bytes); the weights' width; the
rules, the engines, the exports, the search and `run --gpu`'s record; the CLI in real
processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dnnscale.errors import InputError
from dnnscale.export.assumptions import plan_assumptions
from dnnscale.model.memory import transformer_block_activation_bytes
from dnnscale.model.predict import plan_workload, predict_plan
from dnnscale.plan.engines import engine_differences, plan_facts
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict, plan_label
from dnnscale.system import load_system
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_kinds import AMP_FP32_KINDS

S, H, A, F = 128, 64, 4, 256
BERT = transformer_workload("amp-bert", 2, H, A, S, 512, ffn=F, causal=False,
                            norm_position="post", predictions=20)
"""A post-norm BERT-like encoder: unfused attention with dropout, GELU, masked positions."""
FP16 = dict(tp=1, pp=1, dp=1, micro_batch=4, global_batch=4, precision="fp16")


def _layer(workload, kind: str):  # type: ignore[no-untyped-def]
    return next(layer for layer in workload.layers if layer.kind == kind)


def test_the_modes_list_what_their_code_runs_in_float32() -> None:
    """autocast: the norms, the residual stream's adds, the softmax, the embedding's float32
    output and the gathered positions; not the activation (fed by a 16-bit linear). TF-AMP:
    those and the activation (BERT's GELU takes a Pow, on its black list)."""
    assert AMP_FP32_KINDS["half"] == frozenset()
    assert AMP_FP32_KINDS["autocast"] == {"embedding", "layernorm", "rmsnorm", "residual_add",
                                          "attn_softmax", "lm_positions"}
    assert AMP_FP32_KINDS["tf-amp"] == AMP_FP32_KINDS["autocast"] | {"mlp_act"}


def test_widened_kinds_move_four_bytes_a_value_by_hand() -> None:
    """At 2 bytes a LayerNorm over s·h moves (2·s·h + 2·s)·2 forward; on float32 values
    (2·s·h + 2·s)·4: 33,280 and 66,560 bytes at s = 128, h = 64. The softmax's forward,
    2·a·s²·b + (b + 1)·a·s² with dropout: 458,752 at b = 2, 851,968 at b = 4. GELU's forward
    2·s·f·b: 131,072 at 2 bytes, widened under TF-AMP only, 262,144. A GEMM is never
    widened."""
    half = plan_workload(BERT, modern_plan_from_dict(FP16))
    autocast = plan_workload(BERT, modern_plan_from_dict({**FP16, "amp": "autocast"}))
    tf_amp = plan_workload(BERT, modern_plan_from_dict({**FP16, "amp": "tf-amp"}))
    assert half is BERT
    assert _layer(half, "layernorm").fwd_bytes == (2 * S * H + 2 * S) * 2 == 33_280
    assert _layer(autocast, "layernorm").fwd_bytes == (2 * S * H + 2 * S) * 4 == 66_560
    values = A * S * S
    assert _layer(half, "attn_softmax").fwd_bytes == 2 * values * 2 + 3 * values == 458_752
    assert _layer(autocast, "attn_softmax").fwd_bytes == 2 * values * 4 + 5 * values == 851_968
    assert _layer(half, "mlp_act").fwd_bytes == _layer(autocast, "mlp_act").fwd_bytes == 131_072
    assert _layer(tf_amp, "mlp_act").fwd_bytes == 2 * S * F * 4 == 262_144
    for kind in ("attn_qkv", "mlp_up", "logits"):
        assert _layer(tf_amp, kind) is _layer(BERT, kind)


def test_a_float32_workload_under_a_16_bit_plan_lands_on_four_bytes() -> None:
    """The model scales a workload built at 4 bytes by activation_bytes / 4 for a 16-bit plan;
    the widened kinds are built at 8 so that they come out at 4 (the LayerNorm's 66,560)."""
    wide = transformer_workload("amp-bert-fp32", 2, H, A, S, 512, ffn=F, causal=False,
                                norm_position="post", bytes_per_value=4)
    built = wide.with_amp("autocast", 2)
    assert _layer(built, "layernorm").fwd_bytes * 2 / 4 == 66_560
    assert _layer(built, "mlp_act") is _layer(wide, "mlp_act")


def test_switching_modes_rebuilds_and_returns_to_the_original() -> None:
    """'half' (and any mode at 4-byte activations) is the workload itself; going from one
    mode to another rebuilds the kinds either widens, and back to 'half' gives the original
    bytes."""
    assert BERT.with_amp("autocast", 4) is BERT and BERT.with_amp("half", 2) is BERT
    tf_amp = BERT.with_amp("tf-amp", 2)
    assert tf_amp.with_amp("tf-amp", 2) is tf_amp
    autocast = tf_amp.with_amp("autocast", 2)
    assert _layer(autocast, "mlp_act").fwd_bytes == _layer(BERT, "mlp_act").fwd_bytes
    assert _layer(autocast, "layernorm").fwd_bytes == _layer(tf_amp, "layernorm").fwd_bytes
    back = tf_amp.with_amp("half", 2)
    assert [layer.cost_key for layer in back.layers] == [layer.cost_key for layer in BERT.layers]


def test_block_memory_by_hand() -> None:
    """s = 128, b = 4, h = 64, a = 4, f = 256, t = 1, unfused: Korthikanti's s·b·h·34 +
    5·a·s²·b = 1,114,112 + 1,310,720 = 2,424,832 bytes. Autocast keeps the two norm inputs in
    float32, + 4·s·b·h = 131,072, and the softmax output, + 2·a·s²·b = 524,288: 3,080,192.
    TF-AMP also the GELU's input, + 2·s·b·f = 262,144: 3,342,336. Full recomputation keeps the
    block input, 2·s·b·h = 65,536, float32 under both: 131,072."""
    def block(kinds: frozenset[str], recompute: str = "none") -> float:
        return transformer_block_activation_bytes(S, 4, H, A, H, F, F, 1, False, recompute,
                                                  False, fp32_kinds=kinds)
    assert block(AMP_FP32_KINDS["half"]) == 2_424_832
    assert block(AMP_FP32_KINDS["autocast"]) == 3_080_192
    assert block(AMP_FP32_KINDS["tf-amp"]) == 3_342_336
    assert block(AMP_FP32_KINDS["half"], "full") == 65_536
    assert block(AMP_FP32_KINDS["autocast"], "full") == 131_072


def test_the_step_and_the_memory_grow_and_the_weights_stay_float32() -> None:
    """On one A100 the TF-AMP step is slower than 'half' by the widened kinds alone (the GEMMs
    cost the same); its weights are 4 bytes with no master copy, so weights + optimizer state
    are 4 + 8 = 12 bytes a parameter where 'half' keeps 2 + 12."""
    system = load_system("dgx-a100-80g:1")
    half = predict_plan(BERT, system, modern_plan_from_dict(FP16))
    tf_amp = predict_plan(BERT, system, modern_plan_from_dict({**FP16, "amp": "tf-amp"}))
    by_kind = {kind: [c for c in half.layers if c.kind == kind] for kind in ("mlp_up", "mlp_act")}
    assert tf_amp.step_time_s > half.step_time_s
    for kind, costs in by_kind.items():
        other = [c for c in tf_amp.layers if c.kind == kind]
        grew = [o.forward_s > c.forward_s for o, c in zip(other, costs)]
        assert all(grew) if kind == "mlp_act" else not any(grew)
    parts = {p.name: p.bytes for p in tf_amp.memory}
    half_parts = {p.name: p.bytes for p in half.memory}
    params = BERT.params
    assert parts["weights"] == 4 * params and half_parts["weights"] == 2 * params
    assert parts["activations"] > half_parts["activations"]


def test_plan_fields_rules_and_round_trip() -> None:
    """amp reads and writes as a plan field, shows in the label, sets fp32 weights; a 4-byte
    precision refuses any mode but 'half', and a bad value is named."""
    plan = modern_plan_from_dict({**FP16, "amp": "autocast"})
    assert (plan.precision.amp, plan.precision.param_bytes, plan.precision.master_weights) == (
        "autocast", 4, False)
    assert modern_plan_to_dict(plan)["amp"] == "autocast"
    assert "amp" not in modern_plan_to_dict(modern_plan_from_dict(FP16))
    assert modern_plan_from_dict(modern_plan_to_dict(plan)) == plan
    assert plan_label(plan).endswith("fp16 autocast")
    with pytest.raises(InputError, match=r"^plan\.amp: amp 'tf-amp' applies to 16-bit plans"):
        modern_plan_from_dict({**FP16, "precision": "tf32", "amp": "tf-amp"})
    with pytest.raises(InputError, match=r"^plan\.amp: must be one of half, autocast, tf-amp"):
        modern_plan_from_dict({**FP16, "amp": "O2"})


def test_engines_cast_the_model_and_exports_say_what_was_assumed() -> None:
    """Megatron-LM, DeepSpeed and torchtitan all run 'half': an autocast plan is a difference
    naming amp; the export's assumption line lists the float32 kernels."""
    plan = modern_plan_from_dict({**FP16, "amp": "autocast"})
    for engine in ("megatron", "deepspeed", "torchtitan"):
        fields = [d.field for d in engine_differences(engine, plan_facts(plan))]
        assert "amp" in fields
        assert "amp" not in [d.field for d in engine_differences(
            engine, plan_facts(modern_plan_from_dict(FP16)))]
    from dnnscale.export.assumptions import AMP_KIND_WORDS

    assert set(AMP_KIND_WORDS) == set().union(*AMP_FP32_KINDS.values())
    lines = plan_assumptions(plan, BERT.transformer)
    assert ("torch.autocast over float32 weights: the embedding's output, the norms, the "
            "residual adds, the attention softmax and the gathered positions on float32 values, "
            "the rest in 16 bits" in lines)
    llama = transformer_workload("amp-llama", 2, H, A, S, 512, ffn=F, gated=True,
                                 norm="rmsnorm", flash_attention=True)
    assert ("TensorFlow's automatic mixed-precision graph rewrite: the embedding's output, the "
            "norms, the residual adds and the MLP activation on float32 values, the rest in 16 "
            "bits" in plan_assumptions(modern_plan_from_dict({**FP16, "amp": "tf-amp"}),
                                       llama.transformer))
    assert not any("float32 values" in line
                   for line in plan_assumptions(modern_plan_from_dict(FP16), BERT.transformer))


def test_the_search_runs_the_mode_asked_for_and_engines_refuse_others() -> None:
    import dnnscale

    result = dnnscale.optimize(BERT, "dgx-a100-80g:1", gpus=8, global_batch=64,
                               precision="fp16", amp="tf-amp", curve=False, top=3)
    assert result.best.plan.precision.amp == "tf-amp"
    assert result.best.plan.precision.param_bytes == 4
    plain = dnnscale.optimize(BERT, "dgx-a100-80g:1", gpus=8, global_batch=64,
                              precision="fp16", curve=False, top=3)
    assert plain.best.plan.precision.amp == "half"
    assert result.best.step_time_s > plain.best.step_time_s
    with pytest.raises(InputError, match=r"^amp: DeepSpeed runs the model cast to 16 bits"):
        dnnscale.optimize(BERT, "dgx-a100-80g:1", gpus=8, global_batch=64, precision="fp16",
                          amp="autocast", engine="deepspeed")
    with pytest.raises(InputError, match=r"^amp: amp 'autocast' applies to 16-bit plans"):
        dnnscale.optimize(BERT, "dgx-a100-80g:1", gpus=8, global_batch=64, precision="tf32",
                          amp="autocast")


def test_run_gpu_records_autocast_and_refuses_another_mode() -> None:
    """`run --gpu --bf16-mode autocast` trains fp32 weights under torch.autocast: its plan says
    amp autocast with 4-byte gradients; a plan naming another mode is refused, naming
    plan.amp."""
    from dnnscale.runtime.gpu_commands import gpu_spec

    workload = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=128"
    spec = gpu_spec(workload, None, {"micro_batch": 2}, bf16_mode="autocast")
    plan = modern_plan_from_dict(spec.plan_dict())
    assert (plan.precision.amp, plan.precision.grad_bytes) == ("autocast", 4)
    master = modern_plan_from_dict(gpu_spec(workload, None, {}).plan_dict())
    assert (master.precision.amp, master.precision.grad_bytes) == ("half", 2)
    with pytest.raises(InputError, match=r"^plan\.amp: run --gpu runs torch.autocast"):
        gpu_spec(workload, None, {"amp": "tf-amp"}, bf16_mode="autocast")
    with pytest.raises(InputError, match=r"^plan\.amp: run --gpu runs the model cast"):
        gpu_spec(workload, None, {"amp": "autocast"})


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=120)


def test_predict_and_optimize_in_real_processes() -> None:
    """predict --amp tf-amp prices a slower step than without and says so in its plan;
    predict --precision tf32 --amp autocast and optimize --engine megatron --amp autocast are
    one line each, exit 2."""
    base = ["predict", "-w", "bert-large", "-c", "dgx-2:1", "--dp", "16", "--micro-batch", "8",
            "--global-batch", "128", "--precision", "fp16", "--json"]
    half = _cli(*base)
    tf_amp = _cli(*base, "--amp", "tf-amp")
    assert half.returncode == 0 and tf_amp.returncode == 0, (half.stderr, tf_amp.stderr)
    plain, widened = json.loads(half.stdout), json.loads(tf_amp.stdout)
    assert widened["plan"]["precision"]["amp"] == "tf-amp"
    assert widened["step_time_s"] > plain["step_time_s"]
    bad = _cli("predict", "-w", "bert-large", "-c", "dgx-a100-80g:1", "--dp", "8",
               "--precision", "tf32", "--amp", "autocast")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: --amp: amp 'autocast' applies to 16-bit plans")
    refused = _cli("optimize", "-w", "bert-large", "-c", "dgx-a100-80g:1", "--global-batch",
                   "64", "--engine", "megatron", "--amp", "autocast")
    assert refused.returncode == 2 and refused.stderr.startswith(
        "error: --amp: Megatron-LM runs the model cast to 16 bits")


def test_an_autocast_plan_exports_with_a_note_in_real_processes(tmp_path) -> None:
    """predict --amp autocast --json, then export --to megatron: the plan reads back with its
    mode, the export goes on, and stderr says what Megatron-LM runs instead and which kernels
    the price took as float32."""
    predicted = _cli("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--dp", "8",
                     "--micro-batch", "4", "--global-batch", "32", "--precision", "bf16",
                     "--amp", "autocast", "--json")
    assert predicted.returncode == 0, predicted.stderr
    plan = tmp_path / "pred.json"
    plan.write_text(predicted.stdout)
    script = tmp_path / "run.sh"
    exported = _cli("export", str(plan), "-w", "gpt3-125m", "--to", "megatron", "-o",
                    str(script))
    assert exported.returncode == 0, exported.stderr
    assert script.is_file()
    assert "use amp half" in exported.stderr
    assert ("torch.autocast over float32 weights: the embedding's output, the norms, the "
            "residual adds and the attention softmax on float32 values" in exported.stderr)
