"""The validation grid of benchmarks/gpu_check.py: single-GPU GPT configurations, their
predictions and the accuracy summary (no torch).

The grid's configurations are disjoint from the calibration's: no grid model has a hidden
size of a calibration kernel shape or of a step-constant training run (`check_disjoint`), so
every prediction is of a model the profile never saw. Errors are |predicted − measured| /
measured step time (validate/metrics.py); the target (issue 17) is a median ≤ 5 % and a
maximum ≤ 12 % over ≥ 12 configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dnnscale.calibrate.gpu import GPT2_VOCAB, GpuCalibrationPlan, gpt_name
from dnnscale.errors import InputError

TARGET_MEDIAN = 0.05
TARGET_MAX = 0.12
MIN_CONFIGS = 12


@dataclass(frozen=True)
class GridConfig:
    """One single-GPU training configuration of the grid."""

    hidden: int
    heads: int
    layers: int
    seq: int
    micro_batch: int
    global_batch: int
    recompute: str = "none"
    vocab: int = GPT2_VOCAB

    @property
    def workload(self) -> str:
        return gpt_name(self.layers, self.hidden, self.heads, self.seq, self.vocab)

    def plan(self, precision: str) -> dict[str, Any]:
        from dnnscale.runtime.gpu_train import single_gpu_plan

        return single_gpu_plan(self.micro_batch, self.global_batch, self.recompute, precision)

    @property
    def label(self) -> str:
        return (f"h{self.hidden} L{self.layers} s{self.seq} b{self.micro_batch}x"
                f"{self.global_batch // self.micro_batch}"
                + (" rc" if self.recompute == "full" else ""))


H200_GRID = (
    GridConfig(768, 12, 12, 1024, 8, 8),
    GridConfig(768, 12, 12, 2048, 4, 8, "full"),
    GridConfig(1024, 16, 8, 2048, 4, 4),
    GridConfig(1024, 16, 24, 1024, 8, 16, "full"),
    GridConfig(1024, 16, 4, 512, 2, 2),
    GridConfig(1536, 24, 8, 2048, 2, 4),
    GridConfig(1536, 24, 16, 4096, 1, 2, "full"),
    GridConfig(2048, 16, 8, 2048, 2, 2),
    GridConfig(2048, 16, 12, 1024, 8, 8, "full"),
    GridConfig(2048, 16, 2, 8192, 1, 1),
    GridConfig(2560, 20, 6, 2048, 4, 4),
    GridConfig(2560, 20, 10, 4096, 1, 2, "full"),
    GridConfig(3072, 24, 6, 1024, 4, 8),
    GridConfig(3072, 24, 8, 2048, 2, 2, "full"),
    GridConfig(4096, 32, 4, 2048, 2, 2),
    GridConfig(4096, 32, 6, 4096, 1, 1, "full"),
)
"""16 configurations: hidden 768-4096 (GPT-3 widths; head width 64 to 1024, 128 above),
2-24 layers, seq 512-8192, micro-batch 1-8 with 1-2 micro-batches a step, half with full
recomputation; each 2-130 ms a step on an H200 by the uncalibrated model, all fitting in its
memory many times over."""

TINY_GRID = tuple(
    GridConfig(hidden, hidden // 16, layers, seq, micro, micro * accumulation, recompute, 256)
    for hidden, layers, seq, micro, accumulation, recompute in (
        (48, 1, 32, 1, 1, "none"), (48, 2, 64, 2, 1, "full"), (80, 1, 64, 1, 2, "none"),
        (80, 2, 32, 2, 1, "none"), (96, 1, 32, 2, 1, "full"), (96, 2, 64, 1, 1, "none"),
        (112, 1, 64, 1, 1, "none"), (112, 1, 32, 1, 2, "full"), (128, 2, 32, 1, 1, "none"),
        (128, 1, 64, 2, 1, "none"), (144, 1, 32, 1, 1, "full"), (160, 1, 32, 1, 1, "none")))
"""The CPU dry run's 12 configurations (fp32, vocab 256; hidden sizes not in the tiny plan)."""


def calibration_hiddens(plan: GpuCalibrationPlan) -> set[int]:
    """Hidden sizes the calibration measured: its kernel shapes and its training runs."""
    from dnnscale.workload import load_workload

    hiddens = {shape.hidden for shape in plan.shapes}
    for run in plan.runs:
        shape = load_workload(run.workload).transformer
        if shape is not None:
            hiddens.add(shape.hidden)
    return hiddens


def check_disjoint(grid: Sequence[GridConfig], plan: GpuCalibrationPlan) -> None:
    """InputError unless no grid configuration shares a hidden size with the calibration."""
    shared = sorted({c.hidden for c in grid} & calibration_hiddens(plan))
    if shared:
        raise InputError("grid", f"hidden sizes {shared} are also calibration shapes; the grid "
                         f"must be disjoint from them")


def predict_config(config: GridConfig, profile: Any, node_preset: str, precision: str
                   ) -> Any:
    """dnnscale's Prediction of `config` on one GPU of `node_preset` with `profile`."""
    from dnnscale.model import predict_plan
    from dnnscale.plan import check_plan, modern_plan_from_dict
    from dnnscale.system.gpu import gpu_system
    from dnnscale.workload import load_workload

    workload = load_workload(config.workload)
    system = gpu_system(node_preset, 1, profile)
    plan = modern_plan_from_dict(config.plan(precision))
    check_plan(plan, workload, system)
    return predict_plan(workload, system, plan)


def row(config: GridConfig, measured: dict[str, Any] | None, predicted_s: float,
        kernel_only_s: float, note: str = "") -> dict[str, Any]:
    """One line of the table: the configuration, measured and predicted step seconds."""
    out: dict[str, Any] = {"label": config.label, "workload": config.workload,
                           **asdict(config), "predicted_step_s": predicted_s,
                           "predicted_kernel_only_step_s": kernel_only_s, "note": note}
    if measured is not None:
        step = measured["step_time_s"]
        out.update(measured_step_s=step, step_times_s=measured.get("step_times_s"),
                   tokens_per_s=measured.get("tokens_per_s"),
                   peak_memory_bytes=measured.get("peak_memory_bytes"),
                   loss_first=measured.get("loss_first"), loss_last=measured.get("loss_last"),
                   relative_error=abs(predicted_s - step) / step,
                   signed_error=predicted_s / step - 1,
                   kernel_only_relative_error=abs(kernel_only_s - step) / step)
    return out


def accuracy(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median, p90 and max relative error over the measured rows, with and without the step
    constants, and whether the issue's target is met."""
    from dnnscale.validate.metrics import error_summary

    measured = [r for r in rows if "relative_error" in r]
    main = error_summary([r["relative_error"] for r in measured])
    kernel_only = error_summary([r["kernel_only_relative_error"] for r in measured])
    return {"configurations": len(rows), "measured": len(measured), **main,
            "kernel_only": kernel_only,
            "target": {"median_relative_error": TARGET_MEDIAN,
                       "max_relative_error": TARGET_MAX, "configurations": MIN_CONFIGS},
            "meets_target": bool(len(measured) >= MIN_CONFIGS
                                 and main["median_relative_error"] <= TARGET_MEDIAN
                                 and main["max_relative_error"] <= TARGET_MAX)}


def markdown_table(rows: Sequence[dict[str, Any]], header: str) -> str:
    """The predicted-vs-measured table as Markdown."""
    def ms(value: Any) -> str:
        return f"{value * 1e3:.2f}" if isinstance(value, (int, float)) else "-"

    def pct(value: Any) -> str:
        return f"{value * 100:+.1f} %" if isinstance(value, (int, float)) else "-"

    lines = [header, "",
             "| # | configuration | workload | measured ms | predicted ms | error | "
             "kernels only ms | tokens/s | note |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        tokens = r.get("tokens_per_s")
        lines.append(f"| {i} | {r['label']} | `{r['workload']}` | {ms(r.get('measured_step_s'))}"
                     f" | {ms(r['predicted_step_s'])} | {pct(r.get('signed_error'))} | "
                     f"{ms(r['predicted_kernel_only_step_s'])} | "
                     f"{f'{tokens:,.0f}' if tokens else '-'} | {r.get('note', '')} |")
    return "\n".join(lines) + "\n"
