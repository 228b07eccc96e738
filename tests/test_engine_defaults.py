"""Defaults that match the engines (issue 23): the gradients' width per precision (Megatron's
fp32 gradients under bf16 and fp8), fused attention where the model family runs it, the memory
reserve per GPU, and the export's list of what the price assumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.errors import InputError
from dnnscale.model.memory import device_reserve_bytes
from dnnscale.model.predict import predict_plan
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from dnnscale.workload.hf_config import load_hf_config

TINY = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=128"
CONTEXT, CUBLAS, NCCL_GROUP = 287_047_680, 8 * 4 * 2**20, 2 * 32 * 4 * 2**20


@pytest.mark.parametrize("precision, grad_bytes", [("bf16", 4), ("fp8", 4), ("fp16", 2),
                                                   ("fp32", 4), ("tf32", 4)])
def test_gradient_width_per_precision_is_megatrons(precision: str, grad_bytes: int) -> None:
    """Megatron-LM forces accumulate_allreduce_grads_in_fp32 under --bf16 and leaves it off
    under --fp16; fp8 keeps bf16 weights, so its gradients are bf16's."""
    assert modern_plan_from_dict({"precision": precision}).precision.grad_bytes == grad_bytes
    narrow = modern_plan_from_dict({"precision": precision, "grad_bytes": 2})
    assert narrow.precision.grad_bytes == 2


def test_bf16_memory_by_hand() -> None:
    """One GPU, ZeRO-0, bf16: weights 2Ψ, fp32 gradients 4Ψ, Adam state and master 12Ψ (18 B
    per parameter, Megatron's distributed-optimizer table); no parallel group, so the reserve
    is the context and cuBLAS's workspace only; with --grad-bytes 2 the gradients are 2Ψ."""
    w, system = load_workload(TINY), load_system("dgx-a100-80g:1")
    psi = w.params
    memory = predict_plan(w, system, modern_plan_from_dict({"global_batch": 1})).memory_bytes
    assert (memory["weights"], memory["gradients"], memory["optimizer_state"]) == \
        pytest.approx((2 * psi, 4 * psi, 12 * psi), rel=1e-12)
    assert memory["reserve"] == CONTEXT + CUBLAS == 320_602_112
    narrow = predict_plan(w, system, modern_plan_from_dict({"global_batch": 1, "grad_bytes": 2}))
    assert narrow.memory_bytes["gradients"] == pytest.approx(2 * psi, rel=1e-12)


def test_reserve_counts_one_nccl_communicator_per_group() -> None:
    """tp 2 × pp 2 × dp 2: three groups of more than one member, 3 · 2 · 32 · 4 MiB of NCCL
    buffers beside the context and the workspace: 320,602,112 + 805,306,368 = 1,125,908,480 B."""
    assert device_reserve_bytes(0) == CONTEXT + CUBLAS
    assert device_reserve_bytes(3) == CONTEXT + CUBLAS + 3 * NCCL_GROUP == 1_125_908_480
    w, system = load_workload("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=128"), \
        load_system("dgx-a100-80g:1")
    plan = modern_plan_from_dict({"tp": 2, "pp": 2, "dp": 2, "global_batch": 4})
    prediction = predict_plan(w, system, plan)
    assert prediction.memory_bytes["reserve"] == 1_125_908_480
    assert all(dict((p.name, p.bytes) for p in stage)["reserve"] == 1_125_908_480
               for stage in prediction.stage_memory)


@pytest.mark.parametrize("name, fused", [("llama2-7b", True), ("llama3-70b", True),
                                         ("mixtral-8x7b", True), ("gpt3-175b", False),
                                         ("bert-large", False)])
def test_zoo_attention_follows_the_family(name: str, fused: bool) -> None:
    """Llama and Mixtral were trained with fused attention; GPT-3 (2020) and BERT (2019)
    predate it."""
    assert load_workload(name).transformer.flash_attention is fused


def test_hf_configs_default_to_fused_attention(tmp_path: Path) -> None:
    """Hugging Face runs SDPA by default; flash=false prices the unfused kernels. Llama-2-7B at
    its 4,096 tokens, micro-batch 1, no recomputation: the unfused attention core keeps its
    softmax output, 2·a·s²·b bytes a block (Korthikanti et al. 2022's 5as/h term less the
    dropout's mask and dropped copy: Llama drops nothing, attention_dropout 0.0), the fused one
    only its fp32 log-sum-exp, 4·a·s·b: 32 blocks · (2 · 32 · 4096² − 4 · 32 · 4096) · 1 B =
    34,342,961,152 B (issue 23's "106 GB instead of 21 GB" counted the masks Llama has not)."""
    config = {"hidden_size": 4096, "intermediate_size": 11008, "max_position_embeddings": 4096,
              "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
              "num_key_value_heads": 32, "tie_word_embeddings": False, "vocab_size": 32000}
    path = tmp_path / "Llama-2-7b-hf" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    fused = load_hf_config(path)
    unfused = load_workload(f"hf:{path}:flash=false")
    assert fused.transformer.flash_attention and not unfused.transformer.flash_attention
    assert fused.transformer == load_workload("llama2-7b").transformer
    system, plan = load_system("dgx-a100-80g:1"), modern_plan_from_dict({"global_batch": 1})
    difference = (predict_plan(unfused, system, plan).memory_bytes["activations"]
                  - predict_plan(fused, system, plan).memory_bytes["activations"])
    assert difference == pytest.approx(32 * (2 * 32 * 4096**2 - 4 * 32 * 4096), rel=1e-12) \
        == 34_342_961_152


def test_run_gpu_keeps_its_own_gradient_width() -> None:
    """One-GPU training keeps bf16 gradients: its recorded plan says 2 bytes, and a plan file
    asking for fp32 gradients is refused naming the field."""
    from dnnscale.runtime.gpu_commands import gpu_spec

    assert gpu_spec(TINY, None, {}).precision == "bf16"
    with pytest.raises(InputError) as caught:
        gpu_spec(TINY, None, {"grad_bytes": 4})
    assert caught.value.field == "plan.grad_bytes" and "2-byte" in caught.value.problem


def test_export_lists_what_the_price_assumed(tmp_path: Path) -> None:
    """A real `dnnscale export` process: the assumptions come in --json and as `assumes:`
    lines on stderr, with the reserve of the plan's groups (tp 8, pp 8, dp 12: 1.13 GB)."""
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 8\npp: 8\ndp: 12\nglobal_batch: 1536\nprecision: bf16\n"
                    "sequence_parallel: true\n")
    run = [sys.executable, "-m", "dnnscale.cli", "export", str(plan), "--to", "megatron",
           "-w", "gpt3-175b"]
    result = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assumptions = json.loads(result.stdout)["assumptions"]
    assert assumptions == [
        "gradients accumulated and reduced in fp32 (4 bytes per value)",
        "128 micro-batches' weight gradients accumulated inside the weight-gradient GEMMs "
        "(gradient-accumulation fusion), the norms' and embeddings' added by a hook",
        "attention unfused (scores, softmax and context kernels, the s x s scores in memory)",
        "the loss computed as Megatron's vocabulary-parallel cross-entropy: an fp32 softmax "
        "kept per logit, the 16-bit logits or their gradient beside it at its peak",
        "1.13 GB per GPU held back for the CUDA context, cuBLAS's workspace and NCCL's buffers "
        "of 3 parallel groups; allocator fragmentation not counted"]
    text = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0
    assert "assumes: gradients accumulated and reduced in fp32" in text.stderr
    assert "--grad-reduce-in-bf16" not in text.stdout


def test_a_fused_kernel_assumption_says_its_speed_may_be_an_estimate() -> None:
    """The export cannot see the GPU, so the fused-attention line names both ways its speed is
    priced: the kernel's published figures, or an estimate derived from another GPU's (the
    Triton kernel on H100, presets/attention_kernels.yaml)."""
    from dnnscale.export.assumptions import plan_assumptions
    from dnnscale.plan.modern import modern_plan_from_dict

    shape = load_workload("gpt:layers=2,hidden=256,heads=4,seq=512,vocab=1000,flash=true,"
                          "attention_kernel=triton").transformer
    lines = plan_assumptions(modern_plan_from_dict({"dp": 1, "global_batch": 1}), shape)
    assert ("attention fused (triton, priced by its published speed, or on a GPU with none by "
            "an estimate derived from another's)") in lines
    assert not any("recomputation" in line for line in lines)
    selective = plan_assumptions(modern_plan_from_dict(
        {"dp": 1, "global_batch": 1, "recompute": "selective"}), shape)
    assert ("selective recomputation: the fused attention kernel of every block run forward "
            "again in the backward pass, nothing else") in selective
    unfused = load_workload("gpt:layers=2,hidden=256,heads=4,seq=512,vocab=1000").transformer
    assert ("selective recomputation: the scores, softmax and context of every block run "
            "forward again in the backward pass, nothing else") in plan_assumptions(
        modern_plan_from_dict({"dp": 1, "global_batch": 1, "recompute": "selective"}), unfused)
    assert ("full recomputation: every block's forward run again in the backward pass from its "
            "kept input") in plan_assumptions(
        modern_plan_from_dict({"dp": 1, "global_batch": 1, "recompute": "full"}), unfused)
