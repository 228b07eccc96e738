"""Fused attention priced by its kernel's published speed, and FP8 only where the engine runs
FP8 (model/gpu_compute.py, system/attention_kernels.py), checked by hand."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from dnnscale.errors import InputError
from dnnscale.model.gpu_compute import (FP8_CAST_BYTES_PER_VALUE, flash_efficiency,
                                        gpu_phase_times_s, kernel_precision)
from dnnscale.system.attention_kernels import kernel_figures, published_kernels
from dnnscale.system.curve import RateCurve
from dnnscale.system.gpu import gpu_system
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_shape import ATTENTION_KERNELS

T = 1e12
H100_BF16, H100_FP8 = 989.4e12, 1978.9e12


def _layer(workload, kind):  # type: ignore[no-untyped-def]
    return next(layer for layer in workload.layers if layer.kind == kind)


def _gpt(seq: int = 2048, hidden: int = 2048, heads: int = 16, **options):  # type: ignore[no-untyped-def]
    return transformer_workload("t", 1, hidden, heads, seq, 1000, flash_attention=True,
                                bias=False, **options)


def _h100():  # type: ignore[no-untyped-def]
    # uncalibrated: GEMMs at the 0.6 default, HBM at Azure's published 2.90 of 3.35 TB/s
    return gpu_system("dgx-h100", 1).machine


# --- the published figures ---------------------------------------------------------------------


def test_figures_at_their_own_points_and_between_them() -> None:
    fa2 = kernel_figures("fa2", "A100-SXM4-80GB")
    assert fa2 is not None and fa2.measured_on == "A100-SXM4-80GB"
    assert fa2.achieved_flops_per_s(128, True, 1024) == pytest.approx(133 * T)
    # halfway between 1k and 2k in log2(s): the mean of 133 and 155
    assert fa2.achieved_flops_per_s(128, True, 1448) == pytest.approx(144 * T, rel=1e-3)
    # head dim 96: halfway between 64 (140) and 128 (155) at 2k
    assert fa2.achieved_flops_per_s(96, True, 2048) == pytest.approx(147.5 * T)
    # held outside the benchmark: 16k's value at 64k, 512's at 128 tokens, 128's at d = 256
    assert fa2.achieved_flops_per_s(128, True, 65536) == pytest.approx(189 * T)
    assert fa2.achieved_flops_per_s(128, True, 128) == pytest.approx(99 * T)
    assert fa2.achieved_flops_per_s(256, True, 2048) == pytest.approx(155 * T)
    # the label the legend hides (full mask, d = 128, 512) is left out: 1k's value holds
    assert fa2.achieved_flops_per_s(128, False, 512) == pytest.approx(173 * T)


def test_which_figures_a_device_gets() -> None:
    h100 = kernel_figures("fa2", "H100-SXM5-80GB")
    assert h100 is not None and h100.achieved_flops_per_s(128, True, 4096) == pytest.approx(294 * T)
    assert kernel_figures("fa2", "H200-SXM-141GB") is h100          # same die and clocks
    triton_h100 = kernel_figures("triton", "H100-SXM5-80GB")        # derived, not fa2's
    assert triton_h100 is not None and triton_h100 is not h100 and triton_h100.estimated
    triton = kernel_figures("triton", "A100-SXM4-40GB")             # either A100 memory size
    assert triton is not None and triton.achieved_flops_per_s(128, True, 16384) == pytest.approx(80 * T)
    assert kernel_figures("fa2", "V100-SXM2-32GB") is None
    assert set(published_kernels()) == set(ATTENTION_KERNELS)


def test_triton_on_hopper_is_scaled_from_a100_by_fa2s_own_ratio() -> None:
    # the pre-MLIR Triton kernel runs Ampere MMAs on H100, as FA2 does: its A100 speed times
    # FA2's measured H100 / A100 ratio at the same point (presets/attention_kernels.yaml)
    triton = kernel_figures("triton", "H100-SXM5-80GB")
    assert triton is not None and triton.measured_on == "derived from A100-SXM4 by fa2"
    assert triton.precision == "fp16" and not kernel_figures("triton", "A100-SXM4-80GB").estimated
    assert triton.achieved_flops_per_s(128, True, 4096) == pytest.approx(74 * 294 / 173 * T)
    assert triton.achieved_flops_per_s(64, False, 16384) == pytest.approx(100 * 296 / 176 * T)
    assert triton.achieved_flops_per_s(128, True, 65536) == pytest.approx(80 * 328 / 189 * T)
    # FA2's A100 full-mask d = 128 label at 512 is not legible, so that point stays unknown and
    # the 1k value holds below it
    assert triton.achieved_flops_per_s(128, False, 512) == pytest.approx(85 * 294 / 173 * T)
    assert kernel_figures("triton", "H800-SXM5-80GB") is triton
    assert kernel_figures("triton", "H200-SXM-141GB") is triton
    # η on H100: 125.8 TFLOP/s of 989.4 at 4k, causal, d = 128
    layer = _layer(_gpt(seq=4096, attention_kernel="triton"), "flash_attention")
    assert flash_efficiency(_h100(), layer) == pytest.approx(74 * 294 / 173 * T / H100_BF16)


def test_a_derived_entry_must_name_what_it_scales() -> None:
    from dnnscale.system.attention_kernels import _derived
    a100 = kernel_figures("fa2", "A100-SXM4-80GB")
    h100 = kernel_figures("fa2", "H100-SXM5-80GB")
    triton = kernel_figures("triton", "A100-SXM4-80GB")
    measured = {("fa2", "A100-SXM4"): a100, ("fa2", "H100-SXM5"): h100,
                ("triton", "A100-SXM4"): triton}
    good = {"derived": {"from": "A100-SXM4", "scaled_by": "fa2"}, "source": "s"}
    assert _derived("triton", "H100-SXM5", good, measured).estimated
    with pytest.raises(ValueError, match="'from' and 'scaled_by'"):
        _derived("triton", "H100-SXM5", {"derived": {"from": "A100-SXM4"}, "source": "s"},
                 measured)
    with pytest.raises(ValueError, match="needs measured triton on A100-SXM4 and fa2"):
        _derived("triton", "H100-SXM5", good, {k: v for k, v in measured.items()
                                              if k != ("fa2", "H100-SXM5")})
    shorter = dataclasses.replace(h100, seq=h100.seq[:-1])
    with pytest.raises(ValueError, match="sequence lengths differ"):
        _derived("triton", "H100-SXM5", good, {**measured, ("fa2", "H100-SXM5"): shorter})


# --- fused attention ---------------------------------------------------------------------------


def test_flash_attention_time_is_its_flops_over_the_published_speed() -> None:
    device = _h100()
    layer = _layer(_gpt(), "flash_attention")                  # d = 2048 / 16 = 128, causal
    forward_flops = 4 * 2048 ** 2 * 2048 / 2
    assert layer.fwd_flops == pytest.approx(forward_flops)
    assert flash_efficiency(device, layer) == pytest.approx(265 * T / H100_BF16)
    fwd, ing, wg = gpu_phase_times_s(layer, 1.0, 1, device, "bf16", 1.0)
    assert fwd == pytest.approx(forward_flops / (265 * T))      # 64.8 us, compute bound
    assert ing == pytest.approx(2.5 * forward_flops / (265 * T))
    assert wg == 0.0
    # the kernel's speed does not depend on the plan's FP8: attention stays in bf16
    assert gpu_phase_times_s(layer, 1.0, 1, device, "fp8", 1.0) == (fwd, ing, wg)


def test_the_kernel_choice_and_a_measured_curve() -> None:
    a100 = gpu_system("dgx-a100-80g", 1).machine
    fa2 = _layer(_gpt(), "flash_attention")
    triton = _layer(_gpt(attention_kernel="triton"), "flash_attention")
    assert flash_efficiency(a100, fa2) == pytest.approx(155 * T / 312e12)
    assert flash_efficiency(a100, triton) == pytest.approx(68 * T / 312e12)
    measured = dataclasses.replace(a100, efficiency={**a100.efficiency,
                                                     "flash": RateCurve.constant(0.5)})
    assert flash_efficiency(measured, triton) is None          # the device's own curve wins
    fwd, _, _ = gpu_phase_times_s(triton, 1.0, 1, measured, "bf16", 1.0)
    assert fwd == pytest.approx(triton.fwd_flops / (0.5 * 312e12))


# --- FP8 ---------------------------------------------------------------------------------------


def test_fp8_runs_only_the_block_linears_in_fp8() -> None:
    w = _gpt()
    kinds = {layer.kind: kernel_precision(layer, "fp8") for layer in w.layers}
    assert {k for k, p in kinds.items() if p == "fp8"} == {"attn_qkv", "attn_out", "mlp_up",
                                                           "mlp_down"}
    assert kinds["flash_attention"] == kinds["logits"] == kinds["layernorm"] == "bf16"
    assert all(kernel_precision(layer, "bf16") == "bf16" for layer in w.layers)


def test_an_fp8_gemm_pays_its_casts_by_hand() -> None:
    device = _h100()
    s, h, f = 1024, 1024, 4096
    layer = _layer(_gpt(seq=s, hidden=h, heads=8), "mlp_up")
    assert layer.params == h * f and layer.fwd_flops == 2 * s * h * f
    # 8.19 us compute bound at 0.6 x 0.8826 = 52.96 % of the FP8 peak (the round default
    # times MAMF's side-by-side FP8/BF16 ratio on H100), + the 15 us start-up of a GEMM on an
    # uncalibrated device
    gemm_s = 2 * s * h * f / (H100_FP8 * 0.6 * 0.8826) + 15e-6
    hbm = 2.90e12                                           # Azure ND H100 v5 "Mul"
    cast_forward_s = (s * h + h * f) * FP8_CAST_BYTES_PER_VALUE / hbm   # input and weights
    cast_backward_s = s * f * FP8_CAST_BYTES_PER_VALUE / hbm            # output gradient
    fwd, ing, wg = gpu_phase_times_s(layer, 1.0, 1, device, "fp8", 1.0)
    # (the efficiency curve is log-log sampled: within 1 %)
    assert fwd == pytest.approx(gemm_s + cast_forward_s, rel=0.01)
    assert ing == pytest.approx(gemm_s + cast_backward_s, rel=0.01)
    assert wg == pytest.approx(gemm_s, rel=0.01)
    bf16 = gpu_phase_times_s(layer, 1.0, 1, device, "bf16", 1.0)
    assert bf16[0] == pytest.approx(2 * s * h * f / (H100_BF16 * 0.6) + 15e-6, rel=0.01)
    # FP8 gains less than its 2x peak: 2 GEMM phases carry casts
    assert 1.0 < sum(bf16) / (fwd + ing + wg) < 2.0


# --- the workload option -----------------------------------------------------------------------


def test_attention_kernel_is_validated_and_recorded() -> None:
    assert _layer(_gpt(attention_kernel="triton"), "flash_attention").hyper[
        "attention_kernel"] == "triton"
    with pytest.raises(InputError) as err:
        transformer_workload("t", 1, 64, 4, 16, 100, attention_kernel="triton")
    assert err.value.field == "transformer.attention_kernel"
    with pytest.raises(InputError) as err:
        _gpt(attention_kernel="fa9")
    assert err.value.field == "transformer.attention_kernel"


def test_a_bad_attention_kernel_on_the_command_line_is_one_line_and_exit_2() -> None:
    spec = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100,flash=true,attention_kernel=fa9"
    done = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "-w", spec,
                           "-c", "dgx-h100:1", "--dp", "8", "--micro-batch", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "attention_kernel" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_each_fp8_gemm_layer_launches_its_three_casts() -> None:
    """Under FP8 each of a block's four linears launches 2 casts forward and 1 backward: a
    one-block GPT launches 4 · 3 = 12 kernels more per micro-batch than under bf16."""
    from dnnscale.model.stage import stage_costs

    w = _gpt(seq=256, hidden=512, heads=4)
    system = gpu_system("dgx-h100", 1)
    launches = {p: stage_costs(w, system, 1, 1, rules="megatron", precision=p).launches("none")
                for p in ("bf16", "fp8")}
    assert launches["fp8"] - launches["bf16"] == 4 * 3
