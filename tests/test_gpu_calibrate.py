"""`dnnscale calibrate --gpu`: curve fitting, kernel accounting, the whole pipeline on a synthetic
device with a known roofline, the refusal without CUDA, and real CUDA where there is one."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from dnnscale.calibrate.gpu import (DeviceFacts, GpuCalibrationPlan, KernelShape,  # noqa: E402
                                    Measurement, calibrate_gpu, efficiency, measure,
                                    optimizer_bytes, shape_kernels)
from dnnscale.calibrate.gpu_curves import fit_rate_curve  # noqa: E402
from dnnscale.calibrate.gpu_device import (CpuDevice, Roofline, SyntheticDevice,  # noqa: E402
                                           device_preset_for)
from dnnscale.cli import app  # noqa: E402
from dnnscale.errors import InputError  # noqa: E402

H200 = "H200-SXM-141GB"
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() "
                                                 "is False here)")


def gemm_eta(flops: float) -> float:
    return 0.8 * flops / (flops + 3e9)


def attention_eta(flops: float) -> float:
    return 0.5 * flops / (flops + 1e9)


def flash_eta(flops: float) -> float:
    return 0.6 * flops / (flops + 2e10)


def memory_eta(moved: float) -> float:
    return 0.9 * moved / (moved + 2e6)


def roofline() -> Roofline:
    facts = DeviceFacts.of(H200)
    return Roofline(facts.peak("bf16"), facts.bandwidth_bytes_per_s,
                    {"gemm": gemm_eta, "attention": attention_eta, "flash": flash_eta},
                    memory_eta, lambda moved: 0.7, launch_s=6e-6)


@pytest.fixture(scope="module")
def synthetic_profile():
    truth = roofline()
    plan = GpuCalibrationPlan.make("quick")
    profile = calibrate_gpu(SyntheticDevice(truth), plan, H200)
    return profile, truth, plan


# --- curves -------------------------------------------------------------------------------------


def test_curve_fit_is_exact_on_a_log_log_line():
    # η = 0.2·(F/1e9)^0.1: at 1e9 0.2, at 1e13 0.2·10^0.4 = 0.50238
    sizes = [10 ** (9 + 0.25 * i) for i in range(17)]
    values = [0.2 * (size / 1e9) ** 0.1 for size in sizes]
    curve = fit_rate_curve(sizes, values)
    assert curve.at(1e9) == pytest.approx(0.2, rel=1e-9)
    assert curve.at(1e13) == pytest.approx(0.2 * 10 ** 0.4, rel=1e-9)
    assert curve.at(3e11) == pytest.approx(0.2 * 300 ** 0.1, rel=1e-9)


def test_curve_fit_of_one_size_is_the_median_and_of_a_constant_is_constant():
    assert fit_rate_curve([1e9, 1e9, 1e9], [0.3, 0.5, 0.4]).rates == pytest.approx((0.4,))
    curve = fit_rate_curve([1e6, 1e8, 1e10], [0.7, 0.7, 0.7])
    assert all(rate == pytest.approx(0.7) for rate in curve.rates)


def test_curve_fit_follows_a_saturating_curve_within_one_percent():
    sizes = [10 ** (8 + 0.1 * i) for i in range(51)]
    values = [gemm_eta(s) for s in sizes]
    curve = fit_rate_curve(sizes, values)
    assert max(abs(curve.at(s) / v - 1) for s, v in zip(sizes, values)) < 0.01
    assert len(curve.sizes) == 21          # 5 decades, 4 knots a decade, both ends


def test_curve_fit_refuses_nonpositive_values():
    with pytest.raises(ValueError):
        fit_rate_curve([1e9, 1e10], [0.5, 0.0])


# --- the numbers of a kernel ---------------------------------------------------------------------


def test_kernel_flops_and_bytes_are_the_layers():
    shape = KernelShape(hidden=512, heads=8, seq=1024, micro_batch=1, vocab=50257)
    kernels = {(k.kind, k.phase): k for k in shape_kernels(shape, "bf16", True)}
    qkv = kernels[("attn_qkv", "forward")]
    # 2·s·h·3h = 2·1024·512·1536; bytes (s·h + s·3h)·2 = (524288 + 1572864)·2
    assert qkv.flops == 2 * 1024 * 512 * 1536 == 1_610_612_736
    assert qkv.bytes_moved == (1024 * 512 + 1024 * 1536) * 2 == 4_194_304
    assert qkv.kernel_class == "gemm"
    flash = kernels[("flash_attention", "forward")]
    assert flash.flops == 4 * 1024 ** 2 * 512 / 2 == 1_073_741_824   # causal halves it
    assert kernels[("flash_attention", "input_grad")].flops == 2.5 * flash.flops
    assert kernels[("attn_scores", "forward")].flops == 2 * 1024 ** 2 * 512
    assert kernels[("attn_scores", "forward")].kernel_class == "attention"
    norm = kernels[("layernorm", "forward")]
    assert norm.flops == 0 and norm.bytes_moved == (2 * 1024 * 512 + 2 * 1024) * 2
    assert norm.kernel_class == "memory"
    assert kernels[("embedding", "weight_grad")].kernel_class == "embedding"
    assert ("embedding", "input_grad") not in kernels     # ids have no gradient


def test_kernel_bytes_scale_with_the_measured_precision():
    shape = KernelShape(hidden=512, heads=8, seq=1024, micro_batch=2, vocab=50257)
    bf16 = {(k.kind, k.phase): k for k in shape_kernels(shape, "bf16", False)}
    fp32 = {(k.kind, k.phase): k for k in shape_kernels(shape, "fp32", False)}
    key = ("mlp_act", "forward")
    assert fp32[key].bytes_moved == 2 * bf16[key].bytes_moved
    assert bf16[key].bytes_moved == 2 * (2 * 1024 * 2048 * 2)   # micro-batch 2, 2·s·f·b


def test_optimizer_bytes_are_the_models():
    # Ψ·(3·b_g + 2·s + b_p): bf16 3·2 + 2·12 + 2 = 32; fp32 3·4 + 2·8 + 4 = 32 bytes/param
    assert optimizer_bytes(1_000_000, "bf16") == 32_000_000
    assert optimizer_bytes(1_000_000, "fp32") == 32_000_000


def test_efficiency_inverts_the_roofline():
    facts = DeviceFacts.of(H200)
    gemm = Measurement("mlp_up", "forward", "gemm", "bf16", 1e12, 1e7, 2e-3, "x")
    # 1e12 FLOP in 2 ms at the 989.4 TFLOP/s bf16 peak: 1e12 / (989.4e12 · 2e-3) = 0.50536
    assert efficiency(gemm, facts) == pytest.approx(1e12 / (989.4e12 * 2e-3))
    copy = Measurement("copy", "-", "memory", "bf16", 0.0, 4.8e9, 1.25e-3, "y")
    assert efficiency(copy, facts) == pytest.approx(4.8e9 / (4.8e12 * 1.25e-3)) == 0.8


# --- the pipeline on the synthetic device --------------------------------------------------------


def test_synthetic_calibration_runs_every_kernel(synthetic_profile):
    _, truth, plan = synthetic_profile
    assert len(truth.calls) == len(plan.kernels()) - 1    # all but the launch kernel


def test_synthetic_calibration_recovers_the_compute_curves(synthetic_profile):
    profile, truth, _ = synthetic_profile
    compute_bound = 0
    for point in profile.extra["points"]:
        cls = point["class"]
        if cls not in truth.efficiency:
            continue
        eta = truth.efficiency[cls](point["flops"])
        memory_s = point["bytes"] / (truth.bandwidth_bytes_per_s * memory_eta(point["bytes"]))
        if point["flops"] / (truth.peak_flops_per_s * eta) < memory_s:
            continue                # memory bound in the truth: its η is not the class's
        compute_bound += 1
        assert profile.efficiency[cls].at(point["flops"]) == pytest.approx(eta, rel=0.02)
    assert compute_bound > 200
    # one GEMM by hand: the h=512, T=1024 QKV forward, F = 1,610,612,736:
    # η = 0.8·F/(F + 3e9) = 0.27946
    assert profile.efficiency["gemm"].at(1_610_612_736) == pytest.approx(
        0.8 * 1_610_612_736 / (1_610_612_736 + 3e9), rel=0.01)


def test_synthetic_calibration_recovers_memory_launch_and_optimizer(synthetic_profile):
    profile, _, _ = synthetic_profile
    split = profile.extra["memory_curve_split_bytes"]
    assert split == 32 * 50_000_000            # the smallest optimizer step measured
    for moved in (1e5, 1e6, 1e7, 1e8, 1e9):
        assert profile.memory_efficiency.at(moved) == pytest.approx(memory_eta(moved), rel=0.01)
    assert profile.memory_efficiency.at(1e10) == pytest.approx(0.7, rel=0.01)
    assert profile.launch_s == pytest.approx(6e-6)
    # the best copy: 2^30 bf16 values, 4 GiB moved at 0.9·4.8e12·Q/(Q + 2e6)
    moved = 2 * 2 ** 30 * 2
    assert profile.extra["hbm_copy_bandwidth_bytes_per_s"] == pytest.approx(
        4.8e12 * memory_eta(moved))
    assert profile.device == H200
    assert set(profile.efficiency) == {"gemm", "attention", "flash"}
    assert "gemm.weight_grad" in profile.extra["curves"]["bf16"]


def test_synthetic_profile_round_trips_and_drives_a_prediction(synthetic_profile, tmp_path):
    from dnnscale.model import predict_plan
    from dnnscale.plan import modern_plan_from_dict
    from dnnscale.system.gpu import gpu_system
    from dnnscale.system.gpu_profile import load_gpu_profile, save_gpu_profile
    from dnnscale.workload import load_workload

    profile, _, _ = synthetic_profile
    save_gpu_profile(profile, tmp_path / "p.yaml")
    loaded = load_gpu_profile(tmp_path / "p.yaml")
    assert loaded.efficiency == profile.efficiency
    assert loaded.memory_efficiency == profile.memory_efficiency
    system = gpu_system("hgx-h200", 1, loaded)
    assert system.calibrated
    workload = load_workload("gpt:layers=2,hidden=1024,heads=16,seq=1024,vocab=50257,flash=true")
    plan = modern_plan_from_dict({"micro_batch": 2, "precision": "bf16"})
    assert predict_plan(workload, system, plan).step_time_s > 0


def test_precision_order_puts_the_chosen_first():
    assert GpuCalibrationPlan.make("full", "tf32").precisions == ("tf32", "bf16")
    assert GpuCalibrationPlan.make("tiny").precisions == ("fp32",)
    with pytest.raises(InputError):
        GpuCalibrationPlan.make("huge")


# --- the kernels' code on the CPU ----------------------------------------------------------------


def test_every_kernel_runs_on_the_cpu():
    plan = replace(GpuCalibrationPlan.make("tiny"), shapes=GpuCalibrationPlan.make("tiny").shapes[:1],
                   samples=1, sample_s=1e-4)
    results = measure(CpuDevice(), plan)
    kinds = {m.kind for m in results}
    assert {"attn_qkv", "flash_attention", "attn_scores", "attn_softmax", "attn_context",
            "layernorm", "mlp_act", "cross_entropy", "embedding", "copy", "optimizer",
            "launch"} <= kinds
    assert all(m.seconds > 0 and math.isfinite(m.seconds) for m in results)


# --- which device ---------------------------------------------------------------------------------


def test_device_preset_from_the_cuda_name():
    known = ["A100-SXM4-40GB", "A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB",
             "V100-SXM2-32GB"]
    assert device_preset_for("NVIDIA H200", 150e9, known) == "H200-SXM-141GB"
    assert device_preset_for("NVIDIA H100 80GB HBM3", 85e9, known) == "H100-SXM5-80GB"
    assert device_preset_for("NVIDIA A100-SXM4-40GB", 42.5e9, known) == "A100-SXM4-40GB"
    assert device_preset_for("NVIDIA A100-SXM4-80GB", 85.1e9, known) == "A100-SXM4-80GB"
    with pytest.raises(InputError, match="--as"):
        device_preset_for("Radeon Instinct MI300X", 192e9, known)


def test_device_preset_from_the_cuda_name_among_form_factors():
    # With H100 SXM5, PCIe and NVL presets known, 'NVIDIA H100 80GB HBM3' (the SXM part, whose
    # name states no form factor) must not become the PCIe card of the same memory size, and
    # 'Tesla V100-SXM3-32GB' not the DGX-2H's '-H' part.
    from dnnscale.calibrate.gpu import known_devices

    known = known_devices()
    assert {"H100-PCIe-80GB", "H100-NVL-94GB", "V100-SXM3-32GB-H"} <= set(known)
    for name, memory, preset in (("NVIDIA H100 80GB HBM3", 85.5e9, "H100-SXM5-80GB"),
                                 ("NVIDIA H100 PCIe", 85.5e9, "H100-PCIe-80GB"),
                                 ("NVIDIA H100 NVL", 100.5e9, "H100-NVL-94GB"),
                                 ("NVIDIA H800", 85.5e9, "H800-SXM5-80GB"),
                                 ("NVIDIA H200", 150.8e9, "H200-SXM-141GB"),
                                 ("Tesla V100-SXM2-16GB", 16.9e9, "V100-SXM2-16GB"),
                                 ("Tesla V100-SXM3-32GB", 34.1e9, "V100-SXM3-32GB"),
                                 ("Tesla V100-SXM3-32GB-H", 34.1e9, "V100-SXM3-32GB-H"),
                                 ("Tesla P100-SXM2-16GB", 17.1e9, "P100-SXM2-16GB")):
        assert device_preset_for(name, memory, known) == preset, name


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA GPU")
def test_calibrate_gpu_refuses_without_cuda(tmp_path):
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "-o", str(tmp_path / "p.yaml")])
    assert result.exit_code == 2
    assert result.stderr == ("error: --gpu: no CUDA device (torch.cuda.is_available() is "
                             "False)\n")
    assert not (tmp_path / "p.yaml").exists()


def test_calibrate_gpu_flag_errors(tmp_path):
    out = str(tmp_path / "p.yaml")
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "--local", "-o", out])
    assert result.exit_code == 2 and "exactly one of --local, --testbed FILE or --gpu" in \
        result.stderr
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "--device", "cpu", "-o", out])
    assert result.exit_code == 2 and "--device: must be cuda or cuda:N" in result.stderr
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "--kinds", "linear", "-o", out])
    assert result.exit_code == 2 and "--kinds: only applies with --local or with --testbed; " \
        "not with --gpu" in result.stderr


# --- on a real GPU -------------------------------------------------------------------------------


@needs_cuda
def test_cuda_kernels_measure_plausible_efficiencies():
    from dnnscale.calibrate.gpu_device import CudaDevice

    plan = replace(GpuCalibrationPlan.make("quick"),
                   shapes=(KernelShape(1280, 10, 1024, 2, 50257),), copy_elements=(2 ** 26,),
                   optimizer_params=(10_000_000,))
    results = measure(CudaDevice(torch.device("cuda")), plan)
    facts = DeviceFacts.of(device_preset_for(torch.cuda.get_device_name(),
                                             torch.cuda.get_device_properties(0).total_memory,
                                             ["A100-SXM4-40GB", "A100-SXM4-80GB",
                                              "H100-SXM5-80GB", "H200-SXM-141GB",
                                              "V100-SXM2-32GB"]))
    for m in results:
        if m.kernel_class != "launch":
            assert 0 < efficiency(m, facts) < 1.2, m.label


# --- the step constants --------------------------------------------------------------------------


def test_step_fit_recovers_known_constants(synthetic_profile):
    from dnnscale.calibrate.gpu import QUICK_RUNS
    from dnnscale.calibrate.gpu_step_fit import (StepRun, StepSpace, fit_step_constants,
                                                 predicted_step_s)

    base, _, _ = synthetic_profile
    # the truth: 20 µs of host time per kernel, compute curves at 0.9 and memory at 0.8 of
    # the microbenchmarks'
    truth = StepSpace().profile([20.0, 0.9, 0.8], base)
    runs = [StepRun(c.workload, c.plan_dict(), 0.0) for c in QUICK_RUNS]
    runs = [replace(run, measured_step_s=predicted_step_s(run, truth, "hgx-h200"))
            for run in runs]
    fitted = fit_step_constants(base, "hgx-h200", runs)
    values = fitted.extra["step_fit"]["fitted"]
    assert values["launch_us"] == pytest.approx(20.0, rel=0.02)
    assert values["compute_scale"] == pytest.approx(0.9, rel=0.02)
    assert values["memory_scale"] == pytest.approx(0.8, rel=0.05)
    assert fitted.launch_s == pytest.approx(20e-6, rel=0.02)
    assert fitted.efficiency["gemm"].at(1e11) == pytest.approx(
        0.9 * base.efficiency["gemm"].at(1e11), rel=0.02)
    for run in fitted.extra["step_fit"]["runs"]:
        assert abs(run["error_after"]) < 0.01


def test_step_fit_holds_what_too_few_runs_cannot_tell(synthetic_profile):
    from dnnscale.calibrate.gpu import QUICK_RUNS
    from dnnscale.calibrate.gpu_step_fit import StepRun, fit_step_constants, predicted_step_s

    base, _, _ = synthetic_profile
    run = StepRun(QUICK_RUNS[1].workload, QUICK_RUNS[1].plan_dict(), 0.0)
    run = replace(run, measured_step_s=1.1 * predicted_step_s(run, base, "hgx-h200"))
    fitted = fit_step_constants(base, "hgx-h200", [run])
    assert set(fitted.extra["step_fit"]["fitted"]) == {"launch_us"}
    assert fitted.extra["step_fit"]["held"] == {"compute_scale": 1.0, "memory_scale": 1.0}
    assert fit_step_constants(base, "hgx-h200", []) is base


def test_calibrate_gpu_command_with_the_device_faked(tmp_path, monkeypatch):
    """The command's plumbing (device check, preset from the CUDA name, progress, the profile
    written, the summary line) with CUDA faked by the synthetic device."""
    import types

    import dnnscale.calibrate.gpu_device as gpu_device
    import dnnscale.runtime.cuda as cuda

    monkeypatch.setattr(cuda, "cuda_device", lambda text, flag="--gpu": torch.device("meta"))
    monkeypatch.setattr(gpu_device, "CudaDevice", lambda device: SyntheticDevice(roofline()))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=150e9))
    out = tmp_path / "h200.yaml"
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "--quick", "--no-steps", "-o",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert "calibrating NVIDIA H200 (meta) as H200-SXM-141GB, quick plan" in result.stderr
    assert f"wrote {out}: H200-SXM-141GB, gemm η ≤ 0.80" in " ".join(result.stderr.split())
    from dnnscale.system.gpu_profile import load_gpu_profile

    profile = load_gpu_profile(out)
    assert profile.efficiency["gemm"].at(1e12) == pytest.approx(gemm_eta(1e12), rel=0.01)
    assert profile.extra["measured_on"] == "synthetic roofline"
    result = CliRunner().invoke(app, ["calibrate", "--gpu", "--as", "TPU-v5", "-o", str(out)])
    assert result.exit_code == 2 and "--as: unknown device 'TPU-v5'" in result.stderr


def test_a_failing_kernel_is_skipped_and_recorded():
    from dnnscale.calibrate.gpu_kernels import Kernel, copy_kernel

    def broken(factory):
        raise RuntimeError("no such kernel on this device\nsecond line")

    plan = GpuCalibrationPlan.make("tiny")
    kernels = [Kernel("mlp_up", "forward", "gemm", 1e9, 1e6, "fp32", "broken", broken),
               copy_kernel(1024, "fp32", 4)]
    skipped, seen = [], []
    results = measure(CpuDevice(), plan, seen.append, kernels=kernels, skipped=skipped)
    assert [m.label for m in results] == ["copy n=1024"]
    assert skipped == [{"kernel": "broken", "why": "RuntimeError: no such kernel on this device"}]
    assert seen[0] == "skipped (RuntimeError: no such kernel on this device): broken"


def test_a_second_precision_becomes_its_own_curves():
    """The synthetic device runs every kernel at its bf16 roofline, whatever the dtype: a TF32
    GEMM of F FLOPs takes F / (989.4 TFLOP/s · η(F)), which is 2·η(F) of H200's 494.7 TFLOP/s
    TF32 peak. The profile keeps bf16's curves as the plain classes and gives TF32 its own
    (`gemm@tf32`), which a TF32 plan then uses."""
    from dnnscale.model.gpu_compute import efficiency
    from dnnscale.system.gpu import gpu_device

    plan = replace(GpuCalibrationPlan.make("tiny"), precisions=("bf16", "tf32"))
    profile = calibrate_gpu(SyntheticDevice(roofline()), plan, H200)
    assert {"gemm", "gemm@tf32"} <= set(profile.efficiency)
    points = [p for p in profile.extra["points"] if p["class"] == "gemm"
              and p["precision"] == "tf32"]
    flops = max(p["flops"] for p in points)               # the largest, compute bound
    assert profile.efficiency["gemm@tf32"].at(flops) == pytest.approx(2 * gemm_eta(flops),
                                                                      rel=0.02)
    assert profile.efficiency["gemm"].at(flops) == pytest.approx(gemm_eta(flops), rel=0.02)
    device = gpu_device(H200, profile)
    assert efficiency(device, "gemm", flops, "tf32") == pytest.approx(
        profile.efficiency["gemm@tf32"].at(flops))
    assert efficiency(device, "gemm", flops, "bf16") == pytest.approx(
        profile.efficiency["gemm"].at(flops))


def test_the_step_fit_scales_every_precisions_compute_curves(synthetic_profile):
    from dnnscale.calibrate.gpu_step_fit import StepSpace
    from dnnscale.system.curve import RateCurve

    profile, _, _ = synthetic_profile
    base = replace(profile, efficiency={**profile.efficiency,
                                        "gemm@tf32": RateCurve.constant(0.4)})
    scaled = StepSpace().profile([10.0, 1.5, 1.0], base)
    assert scaled.efficiency["gemm@tf32"].at(1e9) == pytest.approx(0.6)
    assert scaled.efficiency["gemm"].at(1e9) == pytest.approx(1.5 * profile.efficiency["gemm"].at(1e9))


def test_norm_backward_is_two_kernels_timed_apart():
    """torch's layer_norm_backward_cuda runs grad_x (layer_norm_grad_input_kernel), then the
    gain and bias gradients (GammaBetaBackward), which read grad_y and x again: the kinds price
    them as the input- and weight-gradient phases, and the calibration times each alone."""
    from dnnscale.calibrate import gpu_kernels

    shape = KernelShape(hidden=512, heads=8, seq=1024, micro_batch=1, vocab=50257)
    kernels = {(k.kind, k.phase): k for k in shape_kernels(shape, "bf16", True)}
    # grad_x reads grad_y and x and writes grad_x, with mean and 1/std per token: (3·s·h + 2·s)·2
    assert kernels[("layernorm", "input_grad")].bytes_moved == (3 * 1024 * 512 + 2 * 1024) * 2
    # the gain/bias column reduction reads grad_y, x and the statistics: (2·s·h + 2·s)·2
    assert kernels[("layernorm", "weight_grad")].bytes_moved == (2 * 1024 * 512 + 2 * 1024) * 2
    assert kernels[("layernorm", "weight_grad")].kernel_class == "memory"
    assert gpu_kernels._norm_targets(False) == {"input_grad": ("x",),
                                                "weight_grad": ("w", "bias")}
    assert gpu_kernels._norm_targets(True) == {"input_grad": ("x",), "weight_grad": ("w",)}
