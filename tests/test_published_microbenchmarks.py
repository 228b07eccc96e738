"""An uncalibrated device takes its GEMM efficiency per precision and its memory efficiency from
a published microbenchmark of its family (system/microbenchmarks.py), checked by hand."""

from __future__ import annotations

import dataclasses

import pytest

from dnnscale.model.gpu_compute import efficiency, gpu_phase_times_s
from dnnscale.system import microbenchmarks
from dnnscale.system.curve import RateCurve
from dnnscale.system.gpu import DEFAULT_EFFICIENCY, gpu_system, uncalibrated_profile
from dnnscale.workload.transformer import transformer_workload

T = 1e12


def _layer(kind: str):  # type: ignore[no-untyped-def]
    workload = transformer_workload("t", 1, 1024, 16, 128, 1000, flash_attention=False,
                                    bias=False)
    return next(layer for layer in workload.layers if layer.kind == kind)


def test_the_fractions_are_the_published_speeds_over_the_measured_devices_peaks() -> None:
    v100 = microbenchmarks.published_efficiency("V100-SXM2-16GB")
    assert v100 is not None and v100.measured_on == "V100-SXM2-32GB"
    # mli/transformers-benchmarks: 14 / 95 TFLOP/s of 15.7 / 125; 0.098 TFLOPS x 8 B of 900 GB/s
    assert v100.gemm == pytest.approx({"fp32": 14 / 15.7, "fp16": 95 / 125})
    assert v100.memory == pytest.approx(784 / 900)
    # the DGX-2's and DGX-2H's SXM3 parts: the same die, the same fractions
    assert microbenchmarks.published_efficiency("V100-SXM3-32GB") is v100
    assert microbenchmarks.published_efficiency("V100-SXM3-32GB-H") is v100
    assert microbenchmarks.published_efficiency("P100-SXM2-16GB") is None
    # H100 / H200: only the memory figure (Azure's 'Mul'); their GEMM table is FP8 alone
    h100 = microbenchmarks.published_efficiency("H100-SXM5-80GB")
    assert h100 is not None and h100.gemm == {} and h100.memory == pytest.approx(2900 / 3350)
    assert microbenchmarks.published_efficiency("H800-SXM5-80GB") is h100
    h200 = microbenchmarks.published_efficiency("H200-SXM-141GB")
    assert h200 is not None and h200.memory == pytest.approx(4000 / 4800)
    assert microbenchmarks.published_efficiency("H100-PCIe-80GB") is None
    # ... and MAMF's side-by-side matmuls, used as a ratio only: FP8 1402.6 of 1978.9 TFLOP/s
    # (70.88 %) over BF16 794.5 of 989.4 (80.30 %) = 0.8826 on H100; on H200 FP8 1453.4
    # (73.44 %) over the BF16 row MAMF says H200 shares = 0.9146
    assert h100.relative_base == "bf16"
    assert h100.relative_gemm == pytest.approx({"fp8": 0.8826}, rel=1e-4)
    assert h200.relative_gemm == pytest.approx({"fp8": 0.9146}, rel=1e-4)
    assert microbenchmarks.published_efficiency("V100-SXM2-16GB").relative_gemm == {}


def test_a_v100_gemm_runs_at_the_published_speed_of_its_precision() -> None:
    device = gpu_system("dgx-1-v100-16g", 1).machine
    layer = _layer("mlp_up")                                 # 2 x 128 x 1024 x 4096 per sample
    flops = 64 * layer.fwd_flops                             # 68.7 GFLOP: compute bound
    fwd32, _, _ = gpu_phase_times_s(layer, 1.0, 64, device, "fp32", 2.0)
    fwd16, _, _ = gpu_phase_times_s(layer, 1.0, 64, device, "fp16", 1.0)
    # the published rate plus the 15 us start-up (the curve is log-log sampled: within 1 %)
    assert fwd32 == pytest.approx(flops / (14 * T) + 15e-6, rel=0.01)   # 4.92 ms (60 %: 7.29)
    assert fwd16 == pytest.approx(flops / (95 * T) + 15e-6, rel=0.01)   # 0.74 ms (60 %: 0.92)
    # attention matmuls keep their own default (40 %) in every precision
    assert efficiency(device, "attention", 1e9, "fp32") == pytest.approx(0.4)
    # a precision the benchmark did not run keeps the round default for large GEMMs
    assert efficiency(device, "gemm", 1e13, "fp64") == pytest.approx(0.6, rel=1e-3)


def test_a_v100_elementwise_kernel_runs_at_the_published_bandwidth() -> None:
    device = gpu_system("dgx-2", 1).machine
    layer = _layer("mlp_act")                                # memory bound: no FLOPs
    fwd, _, _ = gpu_phase_times_s(layer, 1.0, 8, device, "fp16", 1.0)
    assert fwd == pytest.approx(8 * layer.fwd_bytes / 784e9)


def test_devices_without_figures_and_calibrated_ones_keep_their_large_gemm_rates() -> None:
    p100 = uncalibrated_profile("P100-SXM2-16GB")
    assert p100.memory_efficiency is DEFAULT_EFFICIENCY.memory_efficiency
    assert p100.efficiency["gemm@fp16"].at(1e13) == pytest.approx(0.6, rel=1e-3)
    h100 = gpu_system("dgx-h100", 1)                          # a memory figure only
    assert h100.machine.efficiency["gemm@bf16"].at(1e13) == pytest.approx(0.6, rel=1e-3)
    assert h100.machine.memory_efficiency.at(1e9) == pytest.approx(2900 / 3350)
    a100 = gpu_system("dgx-a100-80g", 1)                     # its packaged, fitted profile
    assert a100.calibrated and not any("@" in key for key in a100.machine.efficiency)
    v100 = gpu_system("dgx-2h", 2)
    assert not v100.calibrated
    assert "published figures" in v100.description and "89 % in fp32" in v100.description


def test_fp8_on_hopper_reaches_the_published_share_of_the_bf16_fraction() -> None:
    for preset, ratio in (("dgx-h100", 0.8826), ("hgx-h800", 0.8826), ("hgx-h200", 0.9146)):
        machine = gpu_system(preset, 1).machine
        large = {p: machine.efficiency[f"gemm@{p}"].at(1e13) / (1e13 / (1e13 + 15e-6 * peak * f))
                 for p, peak, f in (("bf16", 989.4e12, 0.6), ("fp8", 1978.9e12, 0.6 * ratio))}
        assert large == pytest.approx({"bf16": 0.6, "fp8": 0.6 * ratio}, rel=1e-3), preset
    # an FP8 GEMM of 1e12 FLOP on H100: F / (1978.9e12 x 0.5296) + 15 us = 0.969 ms, where
    # the round default (60 %) priced it at 0.857 ms
    device = gpu_system("dgx-h100", 1).machine
    layer = _layer("mlp_up")                                 # 1.074 GFLOP per sample
    samples = 931                                            # 1.0e12 FLOP
    fwd, _, _ = gpu_phase_times_s(layer, 1.0, samples, device, "fp8", 1.0)
    flops = samples * layer.fwd_flops
    casts = (samples * (layer.input_values) + layer.params) * 4 / (2900e9)
    assert fwd == pytest.approx(flops / (1978.9e12 * 0.5296) + 15e-6 + casts, rel=0.01)
    # an H100 without an entry (PCIe: lower clocks and power) keeps the round default
    pcie = gpu_system("h100-pcie", 1).machine
    assert pcie.efficiency["gemm@fp8"].at(1e13) == pytest.approx(0.6, rel=1e-2)
    assert "fp8 GEMMs at 0.883 x the bf16 fraction" in gpu_system("dgx-h100", 1).description


def test_a_profile_curve_for_one_precision_wins_over_the_class_curve() -> None:
    base = gpu_system("dgx-h100", 1).machine
    device = dataclasses.replace(base, efficiency={**base.efficiency,
                                                   "gemm@bf16": RateCurve.constant(0.5)})
    assert efficiency(device, "gemm", 1e9, "bf16") == pytest.approx(0.5)
    # fp8 keeps its own curve: 0.6 x 0.8826 (MAMF's side-by-side ratio) = 0.5296 when large,
    # F_1/2 = 15 us x 1978.9e12 x 0.5296 = 1.572e10 FLOP
    assert efficiency(device, "gemm", 1e13, "fp8") == pytest.approx(
        0.5296 * 1e13 / (1e13 + 1.572e10), rel=1e-3)
    device = dataclasses.replace(device, efficiency={**device.efficiency,
                                                     "attention@bf16": RateCurve.constant(0.3)})
    assert efficiency(device, "attention", 1e9, "bf16") == pytest.approx(0.3)


def test_a_bad_entry_names_its_field() -> None:
    good = {"measured_on": "V100-SXM2-32GB", "matmul": {"fp32": 14}, "memory": 784,
            "source": "s"}
    assert microbenchmarks._entry("X", good).gemm == pytest.approx({"fp32": 14 / 15.7})
    with pytest.raises(ValueError, match="microbenchmarks.X.matmul.bf16: .* has no such unit"):
        microbenchmarks._entry("X", {**good, "matmul": {"bf16": 10}})
    with pytest.raises(ValueError, match="microbenchmarks.X.matmul.fp32: 16 is above"):
        microbenchmarks._entry("X", {**good, "matmul": {"fp32": 16}})
    with pytest.raises(ValueError, match="microbenchmarks.X.memory: must be a positive"):
        microbenchmarks._entry("X", {**good, "memory": "fast"})
    with pytest.raises(ValueError, match="microbenchmarks.X.measured_on: unknown device"):
        microbenchmarks._entry("X", {**good, "measured_on": "V99"})
    pair = {"measured_on": "H100-SXM5-80GB", "base": "bf16", "matmul": {"bf16": 500, "fp8": 800},
            "source": "s"}
    entry = microbenchmarks._entry("X", {**good, "matmul_relative": pair})
    assert entry.relative_gemm == pytest.approx({"fp8": (800 / 1978.9) / (500 / 989.4)})
    bad_pairs = (
        ({**pair, "base": "fp16"}, "matmul_relative.matmul: must give the base precision"),
        ({**pair, "matmul": {"bf16": 500}}, "matmul_relative.matmul: must give the base"),
        ({**pair, "matmul": {"bf16": 500, "fp8": 2500}}, "matmul_relative.matmul.fp8: 2500 is "
                                                         "above"),
        ({**pair, "measured_on": "H99"}, "matmul_relative.measured_on: unknown device"),
        ({**pair, "source": ""}, "matmul_relative.source: must say"),
        ([1, 2], "matmul_relative: must be a mapping"))
    for bad, message in bad_pairs:
        with pytest.raises(ValueError, match=f"microbenchmarks.X.{message}"):
            microbenchmarks._entry("X", {**good, "matmul_relative": bad})


def test_a_profile_names_a_per_precision_curve_by_a_known_precision() -> None:
    from dnnscale.errors import InputError
    from dnnscale.system.gpu_profile import gpu_profile_from_dict

    data = {"format": "dnnscale-gpu-profile/1", "memory_efficiency": [[1e6, 0.5]],
            "efficiency": {"gemm": [[1e9, 0.5]], "gemm@tf32": [[1e9, 0.4]]}}
    assert gpu_profile_from_dict(data).efficiency["gemm@tf32"].at(1e9) == pytest.approx(0.4)
    for bad in ("gemm@fp9", "@bf16"):
        with pytest.raises(InputError, match=f"gpu_profile.efficiency.{bad}: must be a kernel"):
            gpu_profile_from_dict({**data, "efficiency": {"gemm": [[1e9, 0.5]],
                                                          bad: [[1e9, 0.4]]}})


def test_a_small_gemm_pays_a_fixed_start_up_on_an_uncalibrated_device() -> None:
    from dnnscale.system.curve import saturating
    from dnnscale.system.gpu import GEMM_START_UP_S, published_gemm_curve

    assert GEMM_START_UP_S == 15e-6
    assert saturating(2.0, 0.8, 2.0) == pytest.approx(0.4)
    # V100 FP16: 76 % of 125 TFLOP/s when large; F_1/2 = 15 us x 125e12 x 0.76 = 1.425 GFLOP
    v100 = gpu_system("dgx-1-v100-16g", 1).machine
    assert efficiency(v100, "gemm", 1.425e9, "fp16") == pytest.approx(0.38, rel=0.01)
    # DeepBench's V100 (CUDA 10.1) FP16 4096x128x4096 = 4.29 GFLOP ran at 64.1 TFLOP/s (0.51);
    # the curve gives 0.76 x 4.29 / (4.29 + 1.425) = 0.571, the time 4.29e9 / (95e12) + 15 us
    assert efficiency(v100, "gemm", 4.29e9, "fp16") == pytest.approx(0.571, rel=0.01)
    # H100 BF16 on the round default: F_1/2 = 15 us x 989.4e12 x 0.6 = 8.90 GFLOP
    h100 = gpu_system("dgx-h100", 1).machine
    assert efficiency(h100, "gemm", 8.90e9, "bf16") == pytest.approx(0.30, rel=0.01)
    # the curve is the time form: F / (peak x eta(F)) = F / (peak x eta) + 15 us
    curve = published_gemm_curve(0.5, 100e12)
    for flops in (1e8, 3e9, 1e11):
        seconds = flops / (100e12 * curve.at(flops))
        assert seconds == pytest.approx(flops / 50e12 + 15e-6, rel=0.01)
