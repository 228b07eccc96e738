"""Selective recomputation as each engine runs it with a fused attention kernel: Megatron-Core
checkpoints its core attention whatever kernel runs it, so the flash kernel's forward runs again
in the backward pass and its log-sum-exp is not kept; Megatron-DeepSpeed runs flash attention
outside the checkpoint and torchtitan's selective checkpointing is per operation, which
plan/engines.py reports as differences (and `optimize --engine` leaves out)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.model.memory import transformer_block_activation_bytes
from dnnscale.model.predict import predict_plan
from dnnscale.plan.engines import engine_differences, plan_facts, search_violation, \
    workload_differences
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from dnnscale.workload.transformer import transformer_workload

FLASH = transformer_workload("flash-tiny", 2, 256, 4, 512, 1024, flash_attention=True)
PLAIN = transformer_workload("plain-tiny", 2, 256, 4, 512, 1024)
ONE_GPU = dict(tp=1, pp=1, dp=1, micro_batch=2, global_batch=6, precision="bf16")


def test_flash_kernel_forward_runs_again_under_selective() -> None:
    """One H100, 3 micro-batches of 2: selective adds, per micro-batch, the two blocks' flash
    forward (causal: 2·s²·h FLOP a sample, 134,217,728 at s 512, h 256) and nothing else;
    without recomputation nothing is added."""
    system = load_system("dgx-h100:1")
    flash = [layer for layer in FLASH.layers if layer.kind == "flash_attention"]
    assert len(flash) == 2
    assert all(layer.fwd_flops == 2 * 512 ** 2 * 256 for layer in flash)
    per_micro_batch = sum(gpu_phase_times_s(layer, 1.0, 2, system.machine, "bf16", 1.0)[0]
                          for layer in flash)
    assert per_micro_batch > 0
    none = predict_plan(FLASH, system, modern_plan_from_dict({**ONE_GPU, "recompute": "none"}))
    selective = predict_plan(FLASH, system,
                             modern_plan_from_dict({**ONE_GPU, "recompute": "selective"}))
    assert none.breakdown_s["recompute"] == 0.0
    assert selective.breakdown_s["recompute"] == pytest.approx(3 * per_micro_batch)
    assert selective.step_time_s > none.step_time_s
    # full recomputation runs every block layer's forward again, the flash kernel's among them
    full = predict_plan(FLASH, system, modern_plan_from_dict({**ONE_GPU, "recompute": "full"}))
    assert full.breakdown_s["recompute"] > selective.breakdown_s["recompute"]


def test_selective_with_flash_keeps_no_log_sum_exp() -> None:
    """Korthikanti et al.'s selective term, sbh·34/t under sequence parallelism, whether the
    core is the s² chain or a flash kernel (Megatron-Core's checkpoint keeps Q, K, V and the
    output projection keeps O); without recomputation flash adds its fp32 log-sum-exp,
    4·a·s·b/t (h 1024, a 16, s 2048, b 2, t 4: 65,536 bytes)."""
    s, b, h, a, t = 2048, 2, 1024, 16, 4
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h, ffn_in=4 * h,
                  ffn_out=4 * h, tensor=t, sequence_parallel=True)
    for flash in (False, True):
        assert transformer_block_activation_bytes(recompute="selective", flash_attention=flash,
                                                  **common) == pytest.approx(s * b * h * 34 / t)
    assert transformer_block_activation_bytes(recompute="none", flash_attention=True,
                                              **common) == pytest.approx(
        s * b * h * 34 / t + 4 * a * s * b / t)
    assert 4 * a * s * b / t == 65_536


def test_engines_that_keep_the_flash_outputs_say_so() -> None:
    """Megatron runs the plan as priced; DeepSpeed's Megatron differs only with flash attention
    (field recompute, advice: none); torchtitan's per-operation checkpointing differs whatever
    the attention."""
    selective = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "selective"}))
    none = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "none"}))
    flash, plain = FLASH.transformer, PLAIN.transformer
    assert flash is not None and plain is not None
    assert workload_differences("megatron", selective, flash) == ()
    [difference] = workload_differences("deepspeed", selective, flash)
    assert difference.field == "recompute"
    assert "recomputes nothing" in difference.message and "use recompute none" in \
        difference.message
    assert workload_differences("deepspeed", selective, plain) == ()
    assert workload_differences("deepspeed", none, flash) == ()
    titan = {d.field: d.message for d in engine_differences("torchtitan", selective)}
    assert "every second matmul" in titan["recompute"]
    assert set(titan) - {d.field for d in engine_differences("torchtitan", none)} == \
        {"recompute"}
    assert engine_differences("megatron", selective) == ()
    # the search's rule reads the same differences (a plan DeepSpeed runs as priced otherwise)
    runs = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "selective", "zero": 1,
                                             "grad_accumulation": "add"}))
    violation = search_violation("deepspeed", runs, flash)
    assert violation is not None and violation.field == "recompute"
    assert search_violation("deepspeed", runs, plain) is None


def test_flash_plans_price_selective_above_none() -> None:
    """Invariant over a few shapes and plans: with a flash kernel, selective costs its forward
    (never less than none), without one it still recomputes the s² chain."""
    system = load_system("dgx-a100-80g:2")
    for seq in (256, 1024):
        for tp in (1, 2):
            workload = transformer_workload(f"f{seq}", 2, 512, 8, seq, 2048,
                                            flash_attention=True)
            plan = dict(tp=tp, pp=1, dp=16 // tp, micro_batch=1, global_batch=32,
                        precision="bf16", sequence_parallel=tp > 1)
            steps = {rc: predict_plan(workload, system, modern_plan_from_dict(
                {**plan, "recompute": rc})).step_time_s for rc in ("none", "selective", "full")}
            assert steps["none"] < steps["selective"] < steps["full"]


def _optimize(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dnnscale", "optimize", "-w", "llama3-8b", "-c", "dgx-h100:2",
         "--global-batch", "64", *extra], capture_output=True, text=True, timeout=600)


def test_optimize_for_deepspeed_leaves_selective_flash_plans_out() -> None:
    """Real processes on llama3-8b (a flash workload): `--engine megatron --recompute
    selective` ranks selective plans; `--engine deepspeed` ranks none of them, and asked for
    selective only it is one line naming --recompute and the advice, exit 2."""
    transformer = load_workload("llama3-8b").transformer
    assert transformer is not None and transformer.flash_attention
    megatron = _optimize("--engine", "megatron", "--recompute", "selective", "--json")
    assert megatron.returncode == 0, megatron.stderr
    assert {entry["plan_fields"]["recompute"]
            for entry in json.loads(megatron.stdout)["top"]} == {"selective"}
    deepspeed = _optimize("--engine", "deepspeed", "--json")
    assert deepspeed.returncode == 0, deepspeed.stderr
    ranked = [entry["plan_fields"] for entry in json.loads(deepspeed.stdout)["top"]]
    assert ranked and all(plan["recompute"] != "selective" for plan in ranked)
    refused = _optimize("--engine", "deepspeed", "--recompute", "selective")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: --recompute: no plan of the search runs on "
                                     "deepspeed") and "use recompute none" in refused.stderr


def test_exports_say_how_each_engine_runs_the_elementwise_code() -> None:
    """`eager` against how each engine runs RMSNorm, SwiGLU and RoPE (an export's note, never a
    reason for the search to leave a plan out): Megatron-LM fuses all three, so an eager
    workload differs; Megatron-DeepSpeed fuses only the RMSNorm (Apex), so an eager workload
    differs there and a fused one in SwiGLU and RoPE; torchtitan runs what its export writes
    (compiled unless eager) and differs only when async TP compiles an eager workload. A
    LayerNorm + GeLU + learned-positions model has nothing that differs."""
    from dnnscale.plan.engines import elementwise_difference
    none = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "none"}))
    base = "gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,norm=rmsnorm,gated=true,positional=rope"
    eager, fused = (load_workload(base + tail).transformer for tail in (",eager=true", ""))
    assert eager is not None and fused is not None
    megatron = elementwise_difference("megatron", none, eager)
    assert megatron is not None and "Megatron-LM runs RMSNorm, SwiGLU, RoPE as fused" in \
        megatron.message and "use eager false" in megatron.message
    assert elementwise_difference("megatron", none, fused) is None
    deepspeed = elementwise_difference("deepspeed", none, eager)
    assert deepspeed is not None and "RMSNorm fused" in deepspeed.message
    loose = elementwise_difference("deepspeed", none, fused)
    assert loose is not None and "SwiGLU and RoPE as PyTorch operations" in loose.message
    assert elementwise_difference("torchtitan", none, eager) is None
    assert elementwise_difference("torchtitan", none, fused) is None
    async_tp = plan_facts(modern_plan_from_dict({**ONE_GPU, "tp": 2, "recompute": "none",
                                                 "sequence_parallel": True,
                                                 "overlap_tp": True}))
    compiled = elementwise_difference("torchtitan", async_tp, eager)
    assert compiled is not None and compiled.field == "overlap_tp"
    gelu = load_workload("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,eager=true").transformer
    assert gelu is not None
    assert all(elementwise_difference(engine, none, gelu) is None
               for engine in ("megatron", "deepspeed", "torchtitan"))
    # the search never leaves a plan out for it
    for engine in ("megatron", "deepspeed"):
        assert workload_differences(engine, none, eager) == ()
