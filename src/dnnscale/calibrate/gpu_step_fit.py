"""Step-level constants of a GPU profile, fitted on short training runs (no torch at import).

The kernel curves say what each kernel costs alone. A training step also pays what no single
kernel shows: the host's time per kernel in eager PyTorch (autograd, the dispatcher, Python —
far more than a bare launch), and kernels the model does not list (casts, the loss scale-
down, gradient copies), while its kernels run at the clocks and cache states of sustained
work. Three constants absorb that, fitted by gpu_fit.py's least squares on log(predicted /
measured) step time of the calibration's training runs (GPT models of the calibration's own
shapes, none of the validation grid's): `launch_s` (host seconds per kernel the model
counts), and one factor each on the compute curves (gemm, attention, flash, in every
precision the kernels were measured in: the runs train in the first, and the factor stands for
what a step adds to its kernels, not for the precision) and on the memory curve. With fewer runs
than constants the later ones stay fixed at 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dnnscale.calibrate.gpu_fit import FitSpace
from dnnscale.system.gpu_profile import GpuProfile, curve_class

COMPUTE_CLASSES = ("gemm", "attention", "flash")
LAUNCH_STARTS = (1.0, 3.0, 10.0, 30.0)
"""Starting launch times of the fit, in multiples of the bare kernel launch measured."""


@dataclass(frozen=True)
class StepRun:
    """A measured training configuration: workload name, plan fields, median step seconds."""

    workload: str
    plan: dict[str, Any]
    measured_step_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "plan": dict(self.plan),
                "measured_step_s": self.measured_step_s}


@dataclass(frozen=True)
class StepSpace(FitSpace):
    """The unknowns: host µs per kernel, compute-curve factor, memory-curve factor."""

    names: tuple[str, ...] = ("launch_us", "compute_scale", "memory_scale")
    lower: tuple[float, ...] = (0.0, 0.25, 0.25)
    upper: tuple[float, ...] = (500.0, 2.0, 2.0)
    start: tuple[float, ...] = (10.0, 1.0, 1.0)

    def profile(self, x: Sequence[float], base: GpuProfile) -> GpuProfile:
        launch_us, compute_scale, memory_scale = self.full(x)
        curves = {name: curve.scaled(compute_scale) if curve_class(name) in COMPUTE_CLASSES
                  else curve
                  for name, curve in base.efficiency.items()}
        held = dict(self.fixed)
        fitted = {name: value for name, value in zip(self.names, (launch_us, compute_scale,
                                                                  memory_scale))
                  if name not in held}
        return replace(base, efficiency=curves,
                       memory_efficiency=base.memory_efficiency.scaled(memory_scale),
                       launch_s=launch_us * 1e-6, extra={**base.extra, "fitted": fitted})


@functools.cache
def _workload(name: str) -> Any:
    from dnnscale.workload import load_workload

    return load_workload(name)


def predicted_step_s(run: StepRun, profile: GpuProfile, node_preset: str) -> float:
    """dnnscale's step time of `run` on one GPU of `node_preset` with `profile`."""
    from dnnscale.model import predict_plan
    from dnnscale.plan import modern_plan_from_dict
    from dnnscale.system.gpu import gpu_system

    system = gpu_system(node_preset, 1, profile)
    return predict_plan(_workload(run.workload), system,
                        modern_plan_from_dict(run.plan)).step_time_s


def fit_step_constants(base: GpuProfile, node_preset: str, runs: Sequence[StepRun],
                       log: Callable[[str], None] = lambda _: None) -> GpuProfile:
    """`base` with launch_s and the curve factors fitted to `runs` (unchanged without runs)."""
    from dnnscale.calibrate.gpu_fit import fit_gpu_profile

    if not runs:
        return base

    def predict(run: StepRun, profile: GpuProfile) -> float:
        return predicted_step_s(run, profile, node_preset)

    before = [predict(run, base) / run.measured_step_s - 1 for run in runs]
    result, space = None, None
    # A micro-batch takes max(device time, launches x launch_s): launch_s has no gradient while
    # every run is device bound, so the fit starts from several launch times, the bare
    # kernel launch measured and multiples of it, and keeps the best.
    bare_us = max(base.launch_s * 1e6, 1.0)
    for factor in LAUNCH_STARTS:
        start = StepSpace(start=(min(bare_us * factor, StepSpace.upper[0]), 1.0, 1.0))
        start = replace(start, fixed=tuple((name, start.start[start.names.index(name)])
                                           for name in start.names[len(runs):]))
        attempt = fit_gpu_profile(list(runs), [run.measured_step_s for run in runs], predict,
                                  base, start, max_evaluations=200)
        if result is None or attempt.cost < result.cost:
            result, space = attempt, start
    assert result is not None and space is not None
    after = [predict(run, result.profile) / run.measured_step_s - 1 for run in runs]
    fitted = dict(result.profile.extra.get("fitted", {}))
    log(f"step constants: {', '.join(f'{k} {v:.3g}' for k, v in fitted.items())}; "
        f"calibration runs' error {_worst(before):.1%} -> {_worst(after):.1%} (max)")
    extra = {k: v for k, v in result.profile.extra.items() if k != "fitted"}
    extra["step_fit"] = {"fitted": fitted, "held": dict(space.fixed), "node_preset": node_preset,
                         "runs": [{**run.to_dict(), "error_before": b, "error_after": a}
                                  for run, b, a in zip(runs, before, after)],
                         "evaluations": result.evaluations}
    return replace(result.profile, extra=extra,
                   source=base.source + "; launch time and curve factors fitted to "
                                        f"{len(runs)} training runs")


def _worst(errors: Sequence[float]) -> float:
    return max(abs(e) for e in errors) if errors else 0.0


def measure_steps(plan: Any, device: Any, advance: Callable[[str], None] = lambda _: None,
                  log: Callable[[str], None] = lambda _: None) -> list[StepRun]:
    """Train each of `plan.runs` briefly on `device` (a torch.device) and keep its median
    step time; a run that fails (out of memory, say) is skipped and logged."""
    import torch

    from dnnscale.runtime.cuda import failure_reason
    from dnnscale.runtime.gpu_train import train_gpu

    runs = []
    for config in plan.runs:
        spec = plan.run(config)
        try:
            summary = train_gpu(spec, _workload(spec.workload), device)
        except Exception as exc:  # noqa: BLE001 - a failed run costs its row, not the fit
            if device.type == "cuda":
                torch.cuda.empty_cache()
            why = failure_reason(exc)
            log(f"skipped ({why}): {spec.workload}")
            advance(f"skipped ({why}): {spec.workload}")
            continue
        runs.append(StepRun(spec.workload, spec.plan_dict(), summary["step_time_s"]))
        advance(f"training {spec.workload} b={spec.micro_batch}")
    return runs
