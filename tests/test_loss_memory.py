"""The loss's memory (`loss: inplace | torch | fused`, model/memory.loss_bytes): what each
kernel keeps and holds at its peak, by hand; where it sits (the last stage, the micro-batches
it holds, the tensor and context splits); which engines run which; the CLI, the search and the
exports in real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.model.memory import loss_bytes, loss_bytes_per_logit
from dnnscale.model.predict import block_activation_bytes, predict_plan
from dnnscale.plan.engines import engine_differences, plan_facts, priced_loss
from dnnscale.plan.modern import modern_plan_from_dict, plan_label
from dnnscale.system import load_system
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_kinds import loss_traffic_per_logit

TINY = transformer_workload("loss-tiny", 2, 256, 4, 512, 1024, ffn=704, kv_heads=2,
                            gated=True, norm="rmsnorm", positional="rope",
                            flash_attention=True, bias=False, dropout=False)
LOGITS_PER_SAMPLE = 512 * 1024
"""s · V of TINY: one logit per vocabulary entry per position."""
ONE_GPU = dict(tp=1, pp=1, dp=1, micro_batch=2, global_batch=2, precision="bf16")


def _parts(plan: dict[str, object], stage: int = -1) -> dict[str, float]:
    prediction = predict_plan(TINY, load_system("dgx-h100:1"), modern_plan_from_dict(plan))
    return {part.name: part.bytes for part in prediction.stage_memory[stage]}


def test_bytes_per_logit_by_hand() -> None:
    """(kept, transient) per logit: inplace 4 and b (0 at b = 4, where the cast is the logits
    themselves); torch 4 and 8 at any width; torch16 b and 2b (torch's at b = 4); fused b and
    b."""
    assert loss_bytes_per_logit("inplace", 2) == (4.0, 2.0)
    assert loss_bytes_per_logit("inplace", 4) == (4.0, 0.0)
    assert loss_bytes_per_logit("torch", 2) == (4.0, 8.0)
    assert loss_bytes_per_logit("torch", 4) == (4.0, 8.0)
    assert loss_bytes_per_logit("torch16", 2) == (2.0, 4.0)
    assert loss_bytes_per_logit("torch16", 4) == (4.0, 8.0)
    assert loss_bytes_per_logit("fused", 2) == (2.0, 2.0)
    assert loss_bytes_per_logit("fused", 4) == (4.0, 4.0)
    assert loss_bytes(1000, 3, "torch", 2) == 1000 * (3 * 4 + 8)


def test_vocabulary_parallel_torch_loss_by_hand() -> None:
    """torch's loss on logits split by the vocabulary (loss_parallel, t > 1): torch keeps 4
    and holds 12 more (the backward's zero gradient, exp, sum and product: 16 with the kept
    log-softmax); torch16 at b = 2 keeps 2 and holds 2 + 12 = 14 (the forward's fp32 copy,
    shifted logits and result beside the 16-bit logits and result: 2·2 + 12 = 16 with the kept
    one), torch's at b = 4. Megatron's and the fused kernel are vocabulary parallel already:
    unchanged."""
    assert loss_bytes_per_logit("torch", 2, vocab_parallel=True) == (4.0, 12.0)
    assert loss_bytes_per_logit("torch", 4, vocab_parallel=True) == (4.0, 12.0)
    assert loss_bytes_per_logit("torch16", 2, vocab_parallel=True) == (2.0, 14.0)
    assert loss_bytes_per_logit("torch16", 4, vocab_parallel=True) == (4.0, 12.0)
    for kernel in ("inplace", "fused"):
        for width in (2, 4):
            assert (loss_bytes_per_logit(kernel, width, vocab_parallel=True)
                    == loss_bytes_per_logit(kernel, width))
    assert loss_bytes(1000, 3, "torch", 2, vocab_parallel=True) == 1000 * (3 * 4 + 12)


def test_tensor_parallel_torch_loss_holds_its_decomposition() -> None:
    """tp 2 under torch: each member's 524,288 logits (2 samples x 512 x 1024 / 2) x 16 B =
    8,388,608 B (the same plan at tp 1 holds 1,048,576 x 12 = 12,582,912 B: half the logits
    at 4/3 the bytes)."""
    assert _parts({**ONE_GPU, "tp": 2, "loss": "torch"})["loss"] == 8_388_608
    assert _parts({**ONE_GPU, "loss": "torch"})["loss"] == 12_582_912


def test_traffic_per_logit_by_hand() -> None:
    """(forward, backward) bytes a logit: inplace: the cast 2 + 4, the max 4, subtraction,
    exp and division in place 8 each, the sum 4 = 38; the multiplication in place 8 and the
    cast back 4 + 2 = 14 (no casts at fp32: 32, 8). torch: the cast 6, log-softmax 4 + 4 = 14;
    nll's dense gradient 4, log-softmax's backward 4 + 4 + 4, the cast back 6 = 22 (8, 16 at
    fp32). torch16: log-softmax 2 + 2; the dense gradient 2, log-softmax's backward 6 (torch's
    at fp32). fused: one read 2; a read and a write 4."""
    assert loss_traffic_per_logit("inplace", 2) == (38.0, 14.0)
    assert loss_traffic_per_logit("inplace", 4) == (32.0, 8.0)
    assert loss_traffic_per_logit("torch", 2) == (14.0, 22.0)
    assert loss_traffic_per_logit("torch", 4) == (8.0, 16.0)
    assert loss_traffic_per_logit("torch16", 2) == (4.0, 8.0)
    assert loss_traffic_per_logit("torch16", 4) == (8.0, 16.0)
    assert loss_traffic_per_logit("fused", 2) == (2.0, 4.0)


def test_the_plans_loss_prices_its_layer_and_the_step() -> None:
    """TINY's loss layer moves 524,288 logits x the kernel's bytes + 512 targets x 8 per sample
    in each phase; the plan's loss picks the layer its step is priced with, so the forward of
    one micro-batch of 2 differs between kernels by exactly that layer's forward time."""
    system = load_system("dgx-h100:1")
    forward = {}
    for kernel in ("inplace", "torch", "torch16", "fused"):
        layer = TINY.with_loss(kernel).layers[-1]
        ahead, back = loss_traffic_per_logit(kernel, 2)
        assert layer.kind == "cross_entropy"
        assert layer.fwd_bytes == LOGITS_PER_SAMPLE * ahead + 512 * 8
        assert layer.input_grad_bytes == LOGITS_PER_SAMPLE * back + 512 * 8
        seconds = gpu_phase_times_s(layer, 1.0, 2, system.machine, "bf16", 1.0)[0]
        step = predict_plan(TINY, system, modern_plan_from_dict({**ONE_GPU, "loss": kernel}))
        forward[kernel] = (seconds, step.breakdown_s["forward"])
    assert TINY.with_loss("inplace") is TINY  # built with Megatron's kernel
    for kernel in ("torch", "torch16", "fused"):
        assert forward["inplace"][1] - forward[kernel][1] == pytest.approx(
            forward["inplace"][0] - forward[kernel][0], rel=1e-9)
    assert forward["fused"][1] < forward["torch"][1] < forward["inplace"][1]


def test_one_gpu_by_hand_and_the_logits_left_out_of_the_activations() -> None:
    """2 samples of 512 x 1024 logits, bf16: inplace 1,048,576 x 6 = 6,291,456 B, torch x 12,
    fused x 4. The activations are the same under each kernel and no longer hold the logits
    or the loss's output: the blocks plus the embedding's and the final norm's outputs."""
    logits = 2 * LOGITS_PER_SAMPLE
    parts = {kernel: _parts({**ONE_GPU, "loss": kernel}) for kernel in ("inplace", "torch",
                                                                         "fused")}
    assert parts["inplace"]["loss"] == logits * 6 == 6_291_456
    assert parts["torch"]["loss"] == logits * 12
    assert parts["fused"]["loss"] == logits * 4
    assert len({p["activations"] for p in parts.values()}) == 1
    plan = modern_plan_from_dict(ONE_GPU)
    assert TINY.transformer is not None
    blocks = 2 * block_activation_bytes(TINY.transformer, plan)  # 2 blocks, 16-bit
    outside = [layer for layer in TINY.layers if layer.hyper.get("block") is None]
    assert [layer.kind for layer in outside] == ["embedding", "rmsnorm", "logits",
                                                 "cross_entropy"]
    kept = outside[0].activation_values + outside[1].activation_values  # 131,072 each
    assert parts["inplace"]["activations"] == pytest.approx(blocks + kept * 2 * 2)


def test_fp32_logits_need_no_cast() -> None:
    """At fp32 the in-place kernel's softmax is the logits themselves: 4 bytes per logit."""
    parts = _parts({**ONE_GPU, "precision": "fp32"})
    assert parts["loss"] == 2 * LOGITS_PER_SAMPLE * 4


def test_only_the_last_stage_and_its_micro_batches() -> None:
    """pp 2, 4 micro-batches of 2: 1F1B's last stage holds one micro-batch's loss (6 B per
    logit); GPipe's holds all four forwards' softmaxes and one peak: 1,048,576 x (4·4 + 2) =
    18,874,368 B. The first stage has no loss part."""
    pipeline = {**ONE_GPU, "pp": 2, "global_batch": 8}
    assert _parts(pipeline)["loss"] == 2 * LOGITS_PER_SAMPLE * 6
    assert "loss" not in _parts(pipeline, stage=0)
    assert _parts({**pipeline, "schedule": "gpipe"})["loss"] == 18_874_368


@pytest.mark.parametrize("split", [{"tp": 2}, {"cp": 2}])
def test_tensor_and_context_splits_halve_the_logits(split: dict[str, int]) -> None:
    """Megatron splits the logits by vocabulary over tp, context parallelism by position over
    cp: each member holds half, 3,145,728 B under inplace."""
    assert _parts({**ONE_GPU, **split})["loss"] == LOGITS_PER_SAMPLE * 6 == 3_145_728


def test_context_parallelism_halves_the_other_outside_activations_once() -> None:
    """cp 2: the embedding's and the final norm's outputs are 2 x 131,072 values per sample,
    65,536 each on a member, kept for 2 samples at 2 bytes: 524,288 B beside the blocks (each
    layer's values are already the member's share; they were divided by cp a second time)."""
    plan = modern_plan_from_dict({**ONE_GPU, "cp": 2})
    assert TINY.transformer is not None
    blocks = 2 * block_activation_bytes(TINY.transformer, plan)
    assert _parts({**ONE_GPU, "cp": 2})["activations"] == pytest.approx(blocks + 524_288)


def test_engines_run_their_own_loss() -> None:
    """Megatron-LM and DeepSpeed run inplace, torchtitan torch: a plan priced otherwise gets
    a difference naming loss that advises the engine's; the search prices the engine's."""
    for engine, runs in (("megatron", "inplace"), ("deepspeed", "inplace"),
                         ("torchtitan", "torch")):
        assert priced_loss(engine) == runs
        for kernel in ("inplace", "torch", "torch16", "fused"):
            facts = plan_facts(modern_plan_from_dict({**ONE_GPU, "loss": kernel}))
            found = [d for d in engine_differences(engine, facts) if d.field == "loss"]
            if kernel == runs:
                assert not found
            else:
                assert len(found) == 1 and found[0].message.endswith(f"use loss {runs}")
    assert priced_loss(None) == "inplace"
    assert plan_label(modern_plan_from_dict({**ONE_GPU, "loss": "torch"})).endswith("loss-torch")
    assert "loss" not in plan_label(modern_plan_from_dict(ONE_GPU))


def test_the_search_prices_the_loss_asked_for_or_the_engines() -> None:
    """make_modern_space: the engine's kernel by default, Megatron's without one; a kernel
    asked for is every plan's; one the engine does not run is an InputError naming loss."""
    from dnnscale.errors import InputError
    from dnnscale.optimize.modern import make_modern_space
    from dnnscale.workload import load_workload

    workload, system = load_workload("llama3-8b"), load_system("dgx-h100:2")
    space = lambda **kw: make_modern_space(workload, system, 64, **kw)  # noqa: E731
    assert space().loss == "inplace"
    assert space(engine="torchtitan").loss == "torch"
    assert space(loss="fused").loss == "fused"
    assert space(engine="torchtitan", loss="torch").loss == "torch"
    for bad in ({"loss": "chunked"}, {"engine": "torchtitan", "loss": "fused"}):
        with pytest.raises(InputError) as caught:
            space(**bad)
        assert caught.value.field == "loss"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=600)


def test_torchtitan_llama3_8b_in_real_processes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """torchtitan's Llama 3 8B at 2 x 8,192 tokens per GPU: 2 · 8,192 · 128,256 logits x 12
    bytes = 25,216,155,648 B of loss (`predict --loss torch`); a bad value is one line naming
    the flag, exit 2. `optimize --engine torchtitan` prices torch's loss, its export says so
    and Megatron's export of that plan advises inplace; `optimize --loss fused` prices fused,
    which torchtitan refuses in one line naming --loss."""
    base = ("predict", "-w", "llama3-8b", "-c", "dgx-h100:1", "--dp", "8", "--micro-batch",
            "2", "--global-batch", "16", "--zero", "3", "--json")
    done = _cli(*base, "--loss", "torch")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["memory_bytes"]["loss"] == 25_216_155_648
    bad = _cli(*base, "--loss", "chunked")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "loss" in bad.stderr and "Traceback" not in bad.stderr
    ranked = _cli("optimize", "-w", "llama3-8b", "-c", "dgx-h100:2", "--global-batch", "64",
                  "--engine", "torchtitan", "--json")
    assert ranked.returncode == 0, ranked.stderr
    result = json.loads(ranked.stdout)
    assert {entry["plan_fields"]["loss"] for entry in result["top"]} == {"torch"}
    best = tmp_path / "best.json"
    best.write_text(ranked.stdout)
    exported = _cli("export", str(best), "--to", "torchtitan", "-o",
                    str(tmp_path / "torchtitan.toml"))
    assert exported.returncode == 0, exported.stderr
    assert "assumes: the loss computed by torch's cross_entropy" in exported.stderr
    assert "use loss" not in exported.stderr
    megatron = _cli("export", str(best), "--to", "megatron", "-o", str(tmp_path / "run.sh"))
    assert megatron.returncode == 0, megatron.stderr
    assert "use loss inplace" in megatron.stderr
    fused = _cli("optimize", "-w", "llama3-8b", "-c", "dgx-h100:2", "--global-batch", "64",
                 "--loss", "fused", "--json")
    assert fused.returncode == 0, fused.stderr
    assert {entry["plan_fields"]["loss"] for entry in json.loads(fused.stdout)["top"]} == \
        {"fused"}
    clash = _cli("optimize", "-w", "llama3-8b", "-c", "dgx-h100:2", "--global-batch", "64",
                 "--loss", "fused", "--engine", "torchtitan")
    assert clash.returncode == 2 and clash.stderr.startswith("error: --loss: torchtitan")
    assert clash.stderr.count("\n") == 1


def test_exports_say_what_the_vocabulary_parallel_loss_and_eager_norms_hold() -> None:
    """The assumption lines: torch's loss under tp 2 names loss_parallel and three more fp32
    values; at tp 1 the two of torch's kernels; an eager-norm workload gets its own line."""
    from dnnscale.export.assumptions import EAGER_TEXT, plan_assumptions
    assert TINY.transformer is not None
    split = plan_assumptions(modern_plan_from_dict({**ONE_GPU, "tp": 2, "loss": "torch"}),
                             TINY.transformer)
    [line] = [line for line in split if line.startswith("the loss")]
    assert "loss_parallel" in line and "three more fp32 values" in line
    whole = plan_assumptions(modern_plan_from_dict({**ONE_GPU, "loss": "torch"}),
                             TINY.transformer)
    [line] = [line for line in whole if line.startswith("the loss")]
    assert "two more fp32 values" in line and EAGER_TEXT not in whole
    eager = transformer_workload("loss-eager", 2, 256, 4, 512, 1024, norm="rmsnorm",
                                 eager=True).transformer
    assert EAGER_TEXT in plan_assumptions(modern_plan_from_dict(ONE_GPU), eager)
