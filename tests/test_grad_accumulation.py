"""Gradient accumulation priced per micro-batch on accelerators (issue 23): the plan's
grad_accumulation (fused | add | clip_add), its bytes by hand, ZeRO-2/3 shards, the engines'
facts, the export flag, the optimizer's engine pricing and the published-dev mapping."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dnnscale
from dnnscale.model.accumulation import accumulation_bytes_per_step
from dnnscale.model.gpu_compute import memory_pass_s
from dnnscale.plan.engines import (engine_violation, plan_facts, priced_grad_accumulation,
                                   search_violation)
from dnnscale.plan.modern import modern_plan_from_dict, plan_label
from dnnscale.system.load import load_system
from dnnscale.validate.published_dev import grad_accumulation_of
from dnnscale.workload import load_workload

H = 64
TINY = f"gpt:layers=2,hidden={H},heads=4,seq=32,vocab=100,causal=false"
PARAMS = 6400 + 2048 + 2 * (128 + 12480 + 4160 + 128 + 16640 + 16448) + 128
"""TINY's parameters: the word table 100 x 64 and positions 32 x 64, per block two norms
(2 x 64 each), QKV 64 x 192 + 192, the projection 64 x 64 + 64, the MLP 64 x 256 + 256 and
256 x 64 + 64; the final norm."""
HOOKED = 6400 + 2048 + 5 * 128
"""Its parameters outside GEMM layers: the two tables and five norms."""
CLUSTER = "dgx-a100-40g:1"


def _plan(mode: str, **extra: object) -> dict[str, object]:
    return dict(dp=8, micro_batch=4, global_batch=128, precision="fp16",
                grad_accumulation=mode, **extra)


def _accumulation_s(mode: str, **extra: object) -> float:
    prediction = dnnscale.predict(load_workload(TINY), CLUSTER, _plan(mode, **extra))
    return prediction.breakdown_s.get("grad_accumulation", 0.0)


def test_bytes_per_step_by_hand() -> None:
    # m = 4 micro-batches, 1,000 parameters of which 100 hooked, 2-byte gradients and weights
    assert accumulation_bytes_per_step("fused", 4, 1000, 100, 2, 2, True) == 4 * 100 * 6
    assert accumulation_bytes_per_step("add", 4, 1000, 100, 2, 2, True) == 3 * 1000 * 6
    # TF BERT: fp32 whatever the width given; fp16 loss scaling adds the finite check
    assert accumulation_bytes_per_step("clip_add", 4, 1000, 100, 2, 2, True) == \
        1000 * 4 * (6 + 3 * 7)
    assert accumulation_bytes_per_step("clip_add", 4, 1000, 100, 2, 2, False) == \
        1000 * 4 * (5 + 3 * 6)
    # one micro-batch: nothing to add; Megatron's hook still adds the main gradients once
    assert accumulation_bytes_per_step("add", 1, 1000, 100, 4, 2, False) == 0
    assert accumulation_bytes_per_step("clip_add", 1, 1000, 100, 4, 2, False) == 0
    assert accumulation_bytes_per_step("fused", 1, 1000, 100, 4, 2, False) == 100 * 10
    # gradients reduce-scattered every micro-batch over 4 members: the shard accumulates;
    # Megatron's hook still adds the whole hooked gradients first
    assert accumulation_bytes_per_step("add", 4, 1000, 100, 2, 2, True, 4) == 3 * 250 * 6
    assert accumulation_bytes_per_step("fused", 4, 1000, 100, 2, 2, True, 4) == \
        4 * 100 * 6 + 3 * 250 * 6


def test_a_step_prices_the_passes_at_the_memory_bandwidth() -> None:
    """dp 8, 128 samples of 4: m = 4 micro-batches per replica; fp16 plans keep 2-byte weights
    and gradients (plan/modern.py PRECISION_PRESETS)."""
    device = load_system(CLUSTER).machine
    m = 4
    assert _accumulation_s("add") == pytest.approx(
        memory_pass_s(device, (m - 1) * PARAMS * 3 * 2))
    assert _accumulation_s("fused") == pytest.approx(memory_pass_s(device, m * HOOKED * 6))
    assert _accumulation_s("clip_add") == pytest.approx(
        memory_pass_s(device, PARAMS * 4 * (6 + (m - 1) * 7)))


def test_sharded_gradients_accumulate_the_members_shard() -> None:
    """ZeRO-2 reduce-scatters every micro-batch: each of the 8 members adds its eighth."""
    device = load_system(CLUSTER).machine
    assert _accumulation_s("add", zero=2) == pytest.approx(
        memory_pass_s(device, 3 * PARAMS / 8 * 3 * 2))
    assert _accumulation_s("add", zero=1) == _accumulation_s("add")
    assert _accumulation_s("fused", zero=2) == pytest.approx(
        memory_pass_s(device, 4 * HOOKED * 6 + 3 * PARAMS / 8 * 3 * 2))


def test_the_part_is_in_the_step_and_the_stage() -> None:
    workload = load_workload(TINY)
    fused = dnnscale.predict(workload, CLUSTER, _plan("fused"))
    added = dnnscale.predict(workload, CLUSTER, _plan("add"))
    extra = added.breakdown_s["grad_accumulation"] - fused.breakdown_s["grad_accumulation"]
    assert added.step_time_s - fused.step_time_s == pytest.approx(extra, rel=1e-9)
    stage = added.step_record.stages[0]
    assert 4 * stage.grad_accumulation_s == pytest.approx(
        added.breakdown_s["grad_accumulation"])


@given(m=st.integers(1, 64), params=st.integers(1, 10**9), grad=st.sampled_from([2, 4]))
def test_more_passes_cost_more(m: int, params: int, grad: int) -> None:
    add = accumulation_bytes_per_step("add", m, params, 0, grad, 2, False)
    clip = accumulation_bytes_per_step("clip_add", m, params, 0, grad, 2, False)
    assert 0 <= add <= clip
    assert (add == 0) == (m == 1)
    assert accumulation_bytes_per_step("add", m + 1, params, 0, grad, 2, False) > add


def test_engines_say_how_they_accumulate() -> None:
    fused = modern_plan_from_dict(_plan("fused"))
    added = modern_plan_from_dict(_plan("add"))
    clipped = modern_plan_from_dict(_plan("clip_add"))
    assert search_violation("deepspeed", plan_facts(fused)).field == "grad_accumulation"
    assert search_violation("torchtitan", plan_facts(fused)) is not None
    assert search_violation("deepspeed", plan_facts(added)) is None
    assert search_violation("megatron", plan_facts(added)) is None
    assert search_violation("megatron", plan_facts(fused)) is None
    for engine in ("megatron", "deepspeed", "torchtitan"):
        assert engine_violation(engine, plan_facts(clipped)).field == "grad_accumulation"
    # nothing accumulates (2-byte gradients: DeepSpeed's width without ZeRO)
    one = modern_plan_from_dict(dict(dp=8, micro_batch=4, global_batch=32, grad_bytes=2))
    assert search_violation("deepspeed", plan_facts(one)) is None
    assert [priced_grad_accumulation(e) for e in (None, "megatron", "deepspeed", "torchtitan")] \
        == ["fused", "fused", "add", "add"]
    assert "grad-add" in plan_label(added) and "grad-" not in plan_label(fused)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=120)


def test_megatron_export_turns_the_fusion_off_for_add(tmp_path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("tp: 2\ndp: 4\nmicro_batch: 1\nglobal_batch: 16\nprecision: bf16\n"
                    "grad_accumulation: add\n")
    out = _cli("export", str(plan), "--to", "megatron", "-w", "gpt3-125m", "--json")
    assert out.returncode == 0, out.stderr
    text = json.dumps(json.loads(out.stdout))
    assert "--no-gradient-accumulation-fusion" in text
    assert "added into the ones held" in text  # the assumption line
    plan.write_text(plan.read_text().replace("add", "fused"))
    out = _cli("export", str(plan), "--to", "megatron", "-w", "gpt3-125m", "--json")
    assert out.returncode == 0 and "--no-gradient-accumulation-fusion" not in out.stdout


def test_a_bad_mode_exits_2_naming_the_field() -> None:
    out = _cli("predict", "-w", TINY, "-c", CLUSTER, "--dp", "8", "--micro-batch", "4",
               "--global-batch", "128", "--grad-accumulation", "sum")
    assert out.returncode == 2
    assert "--grad-accumulation" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_optimize_with_an_engine_prices_its_accumulation() -> None:
    out = _cli("optimize", "-w", TINY, "-c", "dgx-a100-40g:1", "--global-batch", "256",
               "--engine", "deepspeed", "--json")
    assert out.returncode == 0, out.stderr
    best = json.loads(out.stdout)
    assert best["best"]["plan_fields"]["grad_accumulation"] == "add"


def test_published_dev_rows_name_their_codes_accumulation() -> None:
    assert grad_accumulation_of("TensorFlow 1.x (NGC 20.06-py3) + Horovod, LAMB") == "clip_add"
    for framework in ("PyTorch (NGC pytorch:21.11-py3), DDP/apex, LAMB",
                      "Composer + PyTorch FSDP (llm-foundry, ~Oct 2023)",
                      "MXNet (mxnet-20.12-py3), Horovod/DALI"):
        assert grad_accumulation_of(framework) == "add"


def test_deepspeed_is_told_to_accumulate_as_priced() -> None:
    """A 16-bit model's plan priced with 4-byte gradients: under ZeRO the ds_config asks for
    fp32 accumulation (DeepSpeed's default is the model's dtype); without ZeRO DeepSpeed refuses
    that mix and holds them in 16 bits, which is a difference the export notes and the search
    avoids by pricing DeepSpeed's ZeRO-0 at 2 bytes (tests/test_engines.py)."""
    from dnnscale.export.deepspeed import ds_config, export_deepspeed
    from dnnscale.plan.engines import engine_differences

    def plan(**change: object):  # type: ignore[no-untyped-def]
        return modern_plan_from_dict({**dict(dp=8, micro_batch=2, global_batch=64,
                                             precision="bf16", grad_accumulation="add"),
                                      **change})

    assert ds_config(plan(zero=1))["data_types"] == {"grad_accum_dtype": "fp32"}
    assert ds_config(plan(zero=3))["data_types"] == {"grad_accum_dtype": "fp32"}
    assert "data_types" not in ds_config(plan(zero=1, grad_bytes=2))
    assert "data_types" not in ds_config(plan(zero=0))
    assert "data_types" not in ds_config(plan(zero=1, precision="fp32"))
    shape = load_workload("gpt3-125m").transformer
    notes = export_deepspeed(plan(zero=0), shape, "gpt3-125m").notes
    assert sum("refuses data_types.grad_accum_dtype fp32 outside ZeRO" in n for n in notes) == 1
    (width,) = engine_differences("deepspeed", plan_facts(plan(zero=0)))
    assert width.field == "grad_bytes" and "use grad_bytes 2, or zero >= 1" in width.message
    assert engine_differences("deepspeed", plan_facts(plan(zero=0, grad_bytes=2))) == ()
    assert engine_differences("deepspeed", plan_facts(plan(zero=1))) == ()
    assert engine_differences("deepspeed", plan_facts(plan(zero=0, precision="fp32"))) == ()