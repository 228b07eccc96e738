"""`dnnscale calibrate --gpu`: measure one GPU's kernels and write a GPU profile.

1. Kernels (calibrate/gpu_kernels.py) on the calibration shapes of `GpuCalibrationPlan`: every
   phase of every layer of one-block GPT workloads (GEMMs of the linear layers and the logits,
   fused and unfused attention, norms, activations, residual adds, the loss, the embedding), an
   HBM copy, the optimizer step, a tiny kernel for the launch time — timed by the device layer
   (calibrate/gpu_device.py).
2. Curves (calibrate/gpu_curves.py): a kernel's achieved efficiency is F / (peak·t) for the
   FLOP classes (gemm, attention, flash; peak of the precision, presets/devices.yaml) and
   Q / (B·t) for memory traffic (B the spec-sheet HBM bandwidth). One log-log least-squares
   curve per class over FLOPs per call, and the memory curve over bytes per call, go into the
   profile the model reads (system/gpu_profile.py); curves per class and phase, and per
   precision, with every measured point, go into its informative fields.
   The memory curve: the model prices both memory-bound layer kernels and the optimizer step
   (model/compose.py `update_time_s`) with it. Layer kernels are small (< ~1 GB a call) and
   steps large (32 bytes a parameter), so below the smallest optimizer step measured the curve
   is the layer kernels' and the copy's, above it the optimizer's. The embedding's kernels are
   recorded but not fitted: its dense gradient writes the whole V x h table, which the model's
   bytes (the touched rows) leave out, and one such point would drag the curve at its size.
3. Step constants (calibrate/gpu_step_fit.py, unless skipped): short training runs of GPT
   models of the calibration shapes fit the host time per kernel and one scale each on the
   compute and memory curves to measured step times (gpu_fit.py's least squares).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from dnnscale.errors import InputError
from dnnscale.runtime.gpu_train import RUN_LOSS, GpuTrainSpec
from dnnscale.system.gpu_profile import GpuProfile

Advance = Callable[[str], None]
MODES = ("full", "quick", "tiny")
COMPUTE_BOUND = 0.9
"""A FLOP-class kernel informs its class's curve when the model's memory time for its bytes
is under this fraction of its measured time."""


@dataclass(frozen=True)
class KernelShape:
    """A one-block GPT workload whose kernels are timed: hidden, heads, seq, micro-batch, vocab."""

    hidden: int
    heads: int
    seq: int
    micro_batch: int
    vocab: int

    @property
    def label(self) -> str:
        return (f"h={self.hidden} a={self.heads} s={self.seq} b={self.micro_batch} "
                f"V={self.vocab}")


def gpt_name(layers: int, hidden: int, heads: int, seq: int, vocab: int) -> str:
    """The `gpt:` workload name of a GPT-3-style model with fused attention and no dropout."""
    return (f"gpt:layers={layers},hidden={hidden},heads={heads},seq={seq},vocab={vocab},"
            f"flash=true,dropout=false")


def _heads(hidden: int) -> int:
    """Head width 64 up to hidden 1024, 128 above (GPT-3's 125M-350M vs 1.3B+ models); at
    least one head."""
    return max(1, hidden // (64 if hidden <= 1024 else 128))


GPT2_VOCAB = 50257
CALIBRATION_HIDDENS = (512, 896, 1280, 1792, 2304, 2816, 3584, 4608)
"""Hidden sizes of the calibration shapes: multiples of 128 that benchmarks/gpu_check.py's grid
does not use (its configurations are disjoint from these)."""


def _shapes(hiddens: Sequence[int], tokens: Sequence[tuple[int, int]], vocab: int
            ) -> tuple[KernelShape, ...]:
    return tuple(KernelShape(h, _heads(h), seq, batch, vocab)
                 for h in hiddens for seq, batch in tokens)


@dataclass(frozen=True)
class GpuCalibrationPlan:
    """What to measure: precisions, kernel shapes, copy sizes (values), optimizer sizes
    (parameters), timing samples, and the training runs for the step constants."""

    mode: str
    precisions: tuple[str, ...]
    shapes: tuple[KernelShape, ...]
    unfused_attention: bool
    copy_elements: tuple[int, ...]
    optimizer_params: tuple[int, ...]
    samples: int
    sample_s: float
    runs: tuple[GpuTrainSpec, ...] = ()
    """Training runs for the step constants (their precision, steps and warm-up are the
    plan's: the first precision, `run_steps`, `run_warmup`)."""
    run_steps: int = 6
    run_warmup: int = 2

    @classmethod
    def make(cls, mode: str, precision: str | None = None) -> "GpuCalibrationPlan":
        """`full` (2170 kernels, two precisions, 6 training runs), `quick` (544 kernels, 4
        runs: about a minute on an H200 by estimate, never yet measured), `tiny` (CPU-sized,
        for dry runs and tests). `precision` becomes the first (the profile's) precision."""
        if mode == "tiny":
            plan = cls("tiny", ("fp32",), _shapes((32, 64), ((32, 1), (64, 2)), 256), True,
                       tuple(2 ** k for k in range(10, 19, 4)), (30_000, 300_000), 2, 0.002,
                       (GpuTrainSpec(gpt_name(2, 32, 2, 32, 256), 1, 2),
                        GpuTrainSpec(gpt_name(1, 64, 4, 64, 256), 2, 2, "full")), 4, 1)
        elif mode == "quick":
            plan = cls("quick", ("bf16",),
                       _shapes(CALIBRATION_HIDDENS, ((1024, 1), (2048, 4)), GPT2_VOCAB), True,
                       tuple(2 ** k for k in range(10, 31, 2)),
                       (50_000_000, 200_000_000, 800_000_000, 1_600_000_000), 3, 0.005,
                       QUICK_RUNS)
        elif mode == "full":
            plan = cls("full", ("bf16", "tf32"),
                       _shapes(CALIBRATION_HIDDENS, ((512, 1), (1024, 2), (2048, 4), (4096, 4)),
                               GPT2_VOCAB), True,
                       tuple(2 ** k for k in range(10, 31)),
                       tuple(int(25e6 * 2 ** k) for k in range(7)), 5, 0.01, FULL_RUNS)
        else:
            raise InputError("calibrate.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
        if precision is not None:
            plan = replace(plan, precisions=(precision,) + tuple(
                p for p in plan.precisions if p != precision))
        return plan

    def kernels(self) -> list[Any]:
        """Every kernel of the plan, in measuring order (precision by precision)."""
        from dnnscale.calibrate.gpu_kernels import (copy_kernel, launch_kernel,
                                                    optimizer_kernel)

        kernels: list[Any] = []
        for precision in self.precisions:
            kernels.append(launch_kernel(precision))
            for shape in self.shapes:
                kernels += shape_kernels(shape, precision, self.unfused_attention)
            width = activation_bytes(precision)
            kernels += [copy_kernel(n, precision, width) for n in self.copy_elements]
            kernels += [optimizer_kernel(n, precision, optimizer_bytes(n, precision),
                                         master=precision == "bf16")
                        for n in self.optimizer_params]
        return kernels

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "precisions": list(self.precisions),
                "shapes": [shape.label for shape in self.shapes],
                "unfused_attention": self.unfused_attention,
                "copy_elements": list(self.copy_elements),
                "optimizer_params": list(self.optimizer_params), "samples": self.samples,
                "sample_s": self.sample_s,
                "runs": [{"workload": s.workload, "micro_batch": s.micro_batch,
                          "global_batch": s.global_batch, "recompute": s.recompute}
                         for s in self.runs], "run_steps": self.run_steps,
                "run_warmup": self.run_warmup}

    def run(self, spec: GpuTrainSpec) -> GpuTrainSpec:
        """A training run of `runs` in the plan's precision, steps and warm-up."""
        return replace(spec, precision=self.precisions[0], steps=self.run_steps,
                       warmup=self.run_warmup)


QUICK_RUNS = (
    GpuTrainSpec(gpt_name(8, 512, 8, 256, GPT2_VOCAB), 1, 1),                  # host bound
    GpuTrainSpec(gpt_name(6, 1280, 10, 1024, GPT2_VOCAB), 4, 4),
    GpuTrainSpec(gpt_name(4, 2304, 18, 2048, GPT2_VOCAB), 2, 4, "full"),
    GpuTrainSpec(gpt_name(3, 3584, 28, 1024, GPT2_VOCAB), 4, 4),
)
FULL_RUNS = QUICK_RUNS + (
    GpuTrainSpec(gpt_name(12, 896, 14, 512, GPT2_VOCAB), 2, 4),
    GpuTrainSpec(gpt_name(4, 4608, 36, 2048, GPT2_VOCAB), 1, 2, "full"),
)


def activation_bytes(precision: str) -> int:
    """Bytes per activation value of a precision (plan/modern.py PRECISION_PRESETS)."""
    from dnnscale.plan.modern import PRECISION_PRESETS

    value = PRECISION_PRESETS[precision].activation_bytes
    return int(value) if value else 4


def optimizer_bytes(params: int, precision: str) -> float:
    """What the model's optimizer step moves for `params` parameters in `precision`
    (model/data_parallel.py `optimizer_step_bytes` with the widths of the plan the timed step
    runs: the runtime's gradients, runtime/gpu_train.GRAD_BYTES, bf16 under bf16)."""
    from dnnscale.model.compose import optimizer_state_bytes_per_param
    from dnnscale.model.data_parallel import optimizer_step_bytes
    from dnnscale.plan.modern import modern_plan_from_dict
    from dnnscale.runtime.gpu_train import GRAD_BYTES

    plan = modern_plan_from_dict({"precision": precision,
                                  **({"grad_bytes": GRAD_BYTES[precision]}
                                     if precision in GRAD_BYTES else {})})
    width = activation_bytes(precision)
    return optimizer_step_bytes(params, plan.precision.grad_bytes or width,
                                plan.precision.param_bytes or width,
                                optimizer_state_bytes_per_param(plan, width))


def shape_kernels(shape: KernelShape, precision: str, unfused_attention: bool) -> list[Any]:
    """The kernels of a one-block GPT of `shape`: the fused-attention chain's layers, plus the
    unfused attention kinds (scores, softmax, context) when asked."""
    from dnnscale.calibrate.gpu_kernels import layer_kernels
    from dnnscale.workload.transformer import transformer_workload

    scale = activation_bytes(precision) / 2  # the workloads count bf16 activations
    # the loss is timed as runtime/gpt_model.lm_loss computes it: the plan's loss 'torch'
    chains = [transformer_workload("calibration", 1, shape.hidden, shape.heads, shape.seq,
                                   shape.vocab, flash_attention=True,
                                   dropout=False).with_loss(RUN_LOSS)]
    if unfused_attention:
        chains.append(transformer_workload("calibration", 1, shape.hidden, shape.heads,
                                           shape.seq, shape.vocab,
                                           dropout=False).with_loss(RUN_LOSS))
    kernels, seen = [], set()
    for workload in chains:
        for layer in workload.layers:
            if layer.kind in seen:
                continue
            seen.add(layer.kind)
            kernels += layer_kernels(layer, shape.micro_batch, precision, scale, shape.label)
    return kernels


# --- measuring ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """One timed kernel: its facts and the seconds per call (host seconds for the launch)."""

    kind: str
    phase: str
    kernel_class: str
    precision: str
    flops: float
    bytes_moved: float
    seconds: float
    label: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "phase": self.phase, "class": self.kernel_class,
                "precision": self.precision, "flops": self.flops, "bytes": self.bytes_moved,
                "seconds": self.seconds, "label": self.label}


def measure(device: Any, plan: GpuCalibrationPlan, advance: Advance = lambda _: None,
            kernels: list[Any] | None = None, skipped: list[dict[str, str]] | None = None
            ) -> list[Measurement]:
    """Time every kernel of `plan` (or `kernels`) on `device` (a device layer).

    A kernel that fails — out of memory, or an operation this torch or device lacks — is
    skipped: reported through `advance` ("skipped (why): label") and appended to `skipped`, so
    one bad kernel costs its point, not the calibration (the tests check that every kernel runs
    on the CPU and on the synthetic device)."""
    import torch

    from dnnscale.calibrate.gpu_kernels import LAUNCH
    from dnnscale.runtime.cuda import failure_reason
    from dnnscale.runtime.gpu_train import matmul_precision

    results = []
    for kernel in kernels if kernels is not None else plan.kernels():
        device.use(kernel.precision)
        fn = None
        try:
            with matmul_precision(device.device, kernel.precision):
                fn = kernel.make(device)
                if kernel.kernel_class == LAUNCH:
                    seconds = device.host_time_s(fn, 200)
                else:
                    seconds = device.device_time_s(kernel, fn, plan.samples, plan.sample_s)
        except Exception as exc:  # noqa: BLE001 - one kernel's failure is reported, not fatal
            fn = None
            if device.device.type == "cuda":
                torch.cuda.empty_cache()
            why = failure_reason(exc)
            if skipped is not None:
                skipped.append({"kernel": kernel.label, "why": why})
            advance(f"skipped ({why}): {kernel.label}")
            continue
        fn = None  # noqa: F841 (frees the kernel's tensors before the next one)
        results.append(Measurement(kernel.kind, kernel.phase, kernel.kernel_class,
                                   kernel.precision, kernel.flops, kernel.bytes_moved,
                                   seconds, kernel.label))
        advance(kernel.label)
    if device.device.type == "cuda":
        torch.cuda.empty_cache()
    return results


# --- curves -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceFacts:
    """Spec-sheet facts the efficiencies are relative to (presets/devices.yaml)."""

    preset: str
    peak_flops_per_s: dict[str, float]
    bandwidth_bytes_per_s: float

    @classmethod
    def of(cls, preset: str) -> "DeviceFacts":
        from dnnscale.system.gpu import gpu_device

        device = gpu_device(preset, None)
        return cls(preset, dict(device.peak_flops_per_s), device.memory_bandwidth_bytes_per_s)

    def peak(self, precision: str) -> float:
        if precision not in self.peak_flops_per_s:
            raise InputError("calibrate.precision", f"{self.preset} has no {precision} peak")
        return self.peak_flops_per_s[precision]


def efficiency(m: Measurement, facts: DeviceFacts) -> float:
    """η of a measured kernel: F / (peak·t) for FLOP classes, Q / (B·t) otherwise.

    Formula: η = F / (P_precision · t) or Q / (B_HBM · t), the inverse of model/gpu_compute.py
    `kernel_time_s` on one kernel. Units: FLOP, bytes, s -> fraction.
    Source: the roofline with achieved efficiencies (Williams et al., CACM 2009), as the model
    applies it."""
    from dnnscale.calibrate.gpu_kernels import COMPUTE_CLASSES

    if m.kernel_class in COMPUTE_CLASSES:
        return m.flops / (facts.peak(m.precision) * m.seconds)
    return m.bytes_moved / (facts.bandwidth_bytes_per_s * m.seconds)


@dataclass
class Curves:
    """The fitted curves of one precision, their misfit, and the points behind them."""

    classes: dict[str, Any]
    memory: Any
    by_phase: dict[str, Any]
    misfit: dict[str, dict[str, float]]
    memory_split_bytes: float | None
    points: list[dict[str, Any]] = field(default_factory=list)


def fit_curves(measurements: Sequence[Measurement], facts: DeviceFacts, precision: str
               ) -> Curves:
    """Fit the curves of one precision's measurements (see the module doc)."""
    from dnnscale.calibrate.gpu_curves import fit_rate_curve, relative_misfit
    from dnnscale.calibrate.gpu_kernels import (COMPUTE_CLASSES, COPY, MEMORY, OPTIMIZER)
    from dnnscale.system.curve import RateCurve

    ours = [m for m in measurements if m.precision == precision and m.seconds > 0]
    points = [{**m.to_dict(), "efficiency": efficiency(m, facts)} for m in ours
              if m.kernel_class != "launch"]

    def series(keep: Callable[[Measurement], bool], over_flops: bool) -> tuple[list, list]:
        chosen = [m for m in ours if keep(m)]
        return ([m.flops if over_flops else m.bytes_moved for m in chosen],
                [efficiency(m, facts) for m in chosen])

    misfit: dict[str, dict[str, float]] = {}
    by_phase: dict[str, Any] = {}
    steps = [m for m in ours if m.kernel_class == OPTIMIZER]
    split = min(m.bytes_moved for m in steps) if steps else None

    def memory_point(m: Measurement) -> bool:
        small = split is None or m.bytes_moved < split
        return small and m.bytes_moved > 0 and (m.kernel_class == MEMORY or m.kind == COPY)

    sizes, etas = series(memory_point, False)
    if not sizes:
        raise InputError("calibrate", "no memory-bound kernel was measured")
    memory = fit_rate_curve(sizes, etas)
    if steps:  # above the split the optimizer's own curve (module doc)
        step_sizes, step_etas = series(lambda m: m.kernel_class == OPTIMIZER, False)
        upper = fit_rate_curve(step_sizes, step_etas)
        memory = RateCurve(memory.sizes + upper.sizes, memory.rates + upper.rates)
        sizes, etas = sizes + step_sizes, etas + step_etas
    misfit["memory"] = relative_misfit(memory, sizes, etas)
    for name, keep in (("memory.layers", lambda m: m.kernel_class == MEMORY and m.kind != COPY),
                       ("memory.copy", lambda m: m.kind == COPY),
                       ("memory.optimizer", lambda m: m.kernel_class == OPTIMIZER)):
        sizes, etas = series(keep, False)
        if sizes:
            by_phase[name] = fit_rate_curve(sizes, etas)
    for kind in sorted({m.kind for m in ours if m.kernel_class == MEMORY and m.kind != COPY}):
        sizes, etas = series(lambda m, k=kind: m.kind == k and m.kernel_class == MEMORY, False)
        by_phase[f"memory.{kind}"] = fit_rate_curve(sizes, etas)

    def compute_bound(m: Measurement) -> bool:
        """Whether the model's memory term, Q / (B·η_mem(Q)), leaves the kernel's time to its
        FLOPs: a kernel its bytes already explain says nothing about its class's η."""
        memory_s = m.bytes_moved / (facts.bandwidth_bytes_per_s * memory.at(m.bytes_moved)) \
            if m.bytes_moved > 0 else 0.0
        return memory_s < COMPUTE_BOUND * m.seconds

    classes = {}
    for cls in COMPUTE_CLASSES:
        members = [m for m in ours if m.kernel_class == cls and m.flops > 0]
        bound = [m for m in members if compute_bound(m)] or members
        if not bound:
            continue
        sizes, etas = series(lambda m, chosen=bound: m in chosen, True)
        classes[cls] = fit_rate_curve(sizes, etas)
        misfit[cls] = {**relative_misfit(classes[cls], sizes, etas),
                       "memory_bound_left_out": len(members) - len(bound)}
        for phase in ("forward", "input_grad", "weight_grad"):
            sizes, etas = series(lambda m, chosen=bound, p=phase: m in chosen and m.phase == p,
                                 True)
            if sizes:
                by_phase[f"{cls}.{phase}"] = fit_rate_curve(sizes, etas)
    return Curves(classes, memory, by_phase, misfit, split, points)


def launch_seconds(measurements: Sequence[Measurement]) -> float:
    from dnnscale.calibrate.gpu_kernels import LAUNCH

    values = [m.seconds for m in measurements if m.kernel_class == LAUNCH]
    return min(values) if values else 0.0


def copy_bandwidth(measurements: Sequence[Measurement], precision: str) -> float | None:
    """The best bytes per second of the copy kernel (HBM bandwidth as a copy achieves it)."""
    from dnnscale.calibrate.gpu_kernels import COPY

    rates = [m.bytes_moved / m.seconds for m in measurements
             if m.kind == COPY and m.precision == precision and m.seconds > 0]
    return max(rates) if rates else None


def profile_from_measurements(measurements: Sequence[Measurement], facts: DeviceFacts,
                              plan: GpuCalibrationPlan, device_name: str, timing: str,
                              date: str | None = None,
                              skipped: Sequence[dict[str, str]] = ()) -> GpuProfile:
    """The GPU profile of `measurements`: the first precision's curves as the model's, each
    other precision's compute curves as its own (`class@precision`, gpu_profile.curve_key:
    the model prices a plan in that precision by them), and every precision's in the
    informative fields."""
    from dnnscale.calibrate.gpu_curves import curve_points
    from dnnscale.system.gpu import DEFAULT_EFFICIENCY
    from dnnscale.system.gpu_profile import curve_key

    import torch

    primary = plan.precisions[0]
    fitted = {p: fit_curves(measurements, facts, p) for p in plan.precisions
              if any(m.precision == p for m in measurements)}
    if primary not in fitted:
        raise InputError("calibrate", f"nothing was measured in {primary}")
    main = fitted[primary]
    efficiencies = dict(main.classes)
    if "gemm" not in efficiencies:
        raise InputError("calibrate", "no GEMM was measured")
    for precision, curves in fitted.items():
        if precision != primary:
            efficiencies.update({curve_key(cls, precision): curve
                                 for cls, curve in curves.classes.items()})
    launch_s = launch_seconds(measurements)
    extra = {
        "measured_on": device_name, "precision": primary, "torch_version": str(torch.__version__),
        "timing": timing, "spec_peak_flops_per_s": facts.peak(primary),
        "spec_memory_bandwidth_bytes_per_s": facts.bandwidth_bytes_per_s,
        "hbm_copy_bandwidth_bytes_per_s": copy_bandwidth(measurements, primary),
        "kernel_launch_s": launch_s,
        "memory_curve_split_bytes": main.memory_split_bytes,
        "not_measured": "intra_node_efficiency, inter_node_efficiency, collective_latency_s, "
                        "launch_contention (one GPU): dnnscale's uncalibrated defaults",
        "curve_misfit": {p: c.misfit for p, c in fitted.items()},
        "curves": {p: {**{k: curve_points(v) for k, v in c.classes.items()},
                       "memory": curve_points(c.memory),
                       **{k: curve_points(v) for k, v in c.by_phase.items()}}
                   for p, c in fitted.items()},
        "plan": plan.to_dict(),
        "skipped_kernels": list(skipped),
        "points": [point for c in fitted.values() for point in c.points],
    }
    return GpuProfile(
        device=facts.preset, efficiency=efficiencies, memory_efficiency=main.memory,
        launch_s=launch_s, launch_contention=0.0, pipeline_step_s=0.0,
        intra_node_efficiency=DEFAULT_EFFICIENCY.intra_node_efficiency,
        inter_node_efficiency=DEFAULT_EFFICIENCY.inter_node_efficiency,
        collective_latency_s=DEFAULT_EFFICIENCY.collective_latency_s,
        date=date or datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        source=f"dnnscale calibrate --gpu ({plan.mode}) on {device_name}: kernel efficiencies "
               f"in {primary} over FLOPs and bytes per call", extra=extra)


# --- the whole calibration ------------------------------------------------------------------------


def known_devices() -> list[str]:
    """The accelerators of the node presets (presets/devices.yaml names)."""
    from dnnscale.system.gpu import gpu_system, node_preset_names

    return sorted({gpu_system(name, 1).machine.name for name in node_preset_names()})


def node_preset_for(device_preset: str) -> str:
    """A node preset whose GPU is `device_preset` (single-GPU predictions need one)."""
    from dnnscale.system.gpu import gpu_system, node_preset_names

    for name in node_preset_names():
        if gpu_system(name, 1).machine.name == device_preset:
            return name
    raise InputError("--as", f"no node preset has the device {device_preset!r}")


def calibrate_gpu(device: Any, plan: GpuCalibrationPlan, device_preset: str,
                  advance: Advance = lambda _: None, train_device: Any = None,
                  log: Callable[[str], None] = lambda _: None) -> GpuProfile:
    """Measure, fit, and (with `train_device` and step configurations) fit the step
    constants; returns the profile."""
    started = time.perf_counter()
    facts = DeviceFacts.of(device_preset)
    skipped: list[dict[str, str]] = []
    measurements = measure(device, plan, advance, skipped=skipped)
    profile = profile_from_measurements(measurements, facts, plan, device.name, device.timing,
                                        skipped=skipped)
    kernels_s = time.perf_counter() - started
    extra: dict[str, Any] = {"kernels_s": kernels_s}
    if train_device is not None and plan.runs:
        from dnnscale.calibrate.gpu_step_fit import fit_step_constants, measure_steps

        runs = measure_steps(plan, train_device, advance, log)
        profile = fit_step_constants(profile, node_preset_for(device_preset), runs, log)
        extra["steps_s"] = time.perf_counter() - started - kernels_s
    return replace(profile, extra={**profile.extra, "wall_s": extra})


def calibration_steps(plan: GpuCalibrationPlan, train: bool) -> int:
    """How many `advance` calls a calibration makes (for a progress bar)."""
    return len(plan.kernels()) + (len(plan.runs) if train else 0)

