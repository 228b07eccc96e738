"""Calibrate one GPU, then predict and measure a grid of single-GPU GPT training configurations.

    benchmarks/gpu_check.sh                  # on the GPU machine; writes results/gpu/
    .venv/bin/python benchmarks/gpu_check.py --dry-run    # the same flow on this CPU, tiny

Protocol (issue 17):

1. Calibrate (calibrate/gpu.py, quick plan): kernel efficiencies of one-block GPT shapes of
   hidden 512-4608 (calibrate/gpu.py CALIBRATION_HIDDENS), the HBM copy, the optimizer step,
   the launch time; then the step constants from four short training runs of GPT models of
   those hidden sizes. Written to OUT/profile.yaml as soon as it is fitted.
2. The grid (calibrate/gpu_grid.py H200_GRID): 16 configurations whose hidden sizes are none
   of the calibration's (checked before anything runs). For each: dnnscale's prediction on one
   GPU of the node preset (hgx-h200 for an H200) with that profile, then a measured run
   (runtime/gpu_train.py: bf16 weights with fp32 master weights and AdamW, WARMUP steps left
   out, the median of the STEPS − WARMUP timed ones). OUT/table.md and OUT/summary.json are
   rewritten after every configuration, so an interrupted check leaves what it measured
   (summary "complete": false); a configuration that would overrun --budget-s is skipped.
3. OUT/summary.json: median, p90 and max relative error of the step time, with the step
   constants and with the kernel curves only; the date, the device, torch and CUDA versions.

Run dnnscale from the source tree (PYTHONPATH=src), so the GPU machine needs only torch,
numpy, scipy, pyyaml, typer and rich.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.errors import InputError  # noqa: E402

OUT = ROOT / "results" / "gpu"
STEPS, WARMUP = 10, 3
BUDGET_S = 420.0
RUN_OVERHEAD_S = 3.0
"""Seconds a configuration costs beyond its steps (building the model, the first step)."""


def _pct(value: Any) -> str:
    """A fraction as a percentage; '-' when there is none (nothing measured: NaN or null)."""
    return f"{value:.1%}" if isinstance(value, (int, float)) and value == value else "-"


def _log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Check:
    """The state of one check: where it writes, what it has measured so far."""

    def __init__(self, out: Path, facts: dict[str, Any], budget_s: float) -> None:
        self.out, self.facts, self.budget_s = out, facts, budget_s
        self.started = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.phase = "calibrating"
        out.mkdir(parents=True, exist_ok=True)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def write(self, complete: bool = False, interrupted: bool = False) -> None:
        from dnnscale.atomic import atomic_write_text
        from dnnscale.calibrate.gpu_grid import accuracy, markdown_table
        from dnnscale.jsonout import dumps

        summary = {**self.facts, **accuracy(self.rows), "complete": complete,
                   "interrupted": interrupted, "phase": self.phase,
                   "wall_s": self.elapsed_s(), "rows": self.rows}
        atomic_write_text(self.out / "summary.json", dumps(summary) + "\n", "summary")
        stats = accuracy(self.rows)
        header = (f"# Predicted vs measured step time on one {self.facts['device_name']} "
                  f"({self.facts['date']})\n\n"
                  f"Produced by `benchmarks/gpu_check.sh`{' --dry-run' if self.facts['dry_run'] else ''}"
                  f"; profile `profile.yaml` (calibrated in this run), predictions on "
                  f"`{self.facts['node_preset']}:1`, plan precision {self.facts['precision']}. "
                  f"Median error {_pct(stats['median_relative_error'])}, p90 "
                  f"{_pct(stats['p90_relative_error'])}, max "
                  f"{_pct(stats['max_relative_error'])} over {stats['measured']} measured "
                  f"configurations (target: median <= 5 %, max <= 12 %); kernel curves alone: "
                  f"median {_pct(stats['kernel_only']['median_relative_error'])}, max "
                  f"{_pct(stats['kernel_only']['max_relative_error'])}."
                  + ("" if complete else " INCOMPLETE: " + self.phase))
        atomic_write_text(self.out / "table.md", markdown_table(self.rows, header), "table")


def _devices(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(device layer, torch device for training, devices.yaml name)."""
    import torch

    from dnnscale.calibrate.gpu import known_devices
    from dnnscale.calibrate.gpu_device import CpuDevice, CudaDevice, device_preset_for

    if args.dry_run:
        torch.set_num_threads(1)
        return CpuDevice(), torch.device("cpu"), args.as_device or "H200-SXM-141GB"
    from dnnscale.runtime.cuda import cuda_device

    device = cuda_device(args.device)
    preset = args.as_device or device_preset_for(
        torch.cuda.get_device_name(device),
        float(torch.cuda.get_device_properties(device).total_memory), known_devices())
    return CudaDevice(device), device, preset


def _facts(args: argparse.Namespace, layer: Any, preset: str, node_preset: str,
           precision: str, plan: Any) -> dict[str, Any]:
    import torch

    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device_name": layer.name, "device_preset": preset, "node_preset": node_preset,
            "host": platform.node(), "python": platform.python_version(),
            "torch_version": str(torch.__version__), "cuda_version": torch.version.cuda,
            "dry_run": bool(args.dry_run), "precision": precision,
            "calibration_plan": plan.mode, "steps": args.steps, "warmup": args.warmup,
            "budget_s": args.budget_s, "profile": "profile.yaml"}


def _calibrate(check: Check, layer: Any, train_device: Any, plan: Any, preset: str,
               node_preset: str) -> tuple[Any, Any]:
    """(profile with step constants, kernel-only profile), the former written to profile.yaml."""
    from dnnscale.calibrate.gpu import DeviceFacts, measure, profile_from_measurements
    from dnnscale.calibrate.gpu_step_fit import fit_step_constants, measure_steps
    from dnnscale.system.gpu_profile import save_gpu_profile

    count = [0]

    def advance(label: str) -> None:
        count[0] += 1
        if count[0] % 50 == 0 or label.startswith(("skipped", "training")):
            _log(f"  {count[0]} kernels/runs: {label}")

    skipped: list[dict[str, str]] = []
    measurements = measure(layer, plan, advance, skipped=skipped)
    kernels = profile_from_measurements(measurements, DeviceFacts.of(preset), plan, layer.name,
                                        layer.timing, skipped=skipped)
    kernels = replace(kernels, extra={**kernels.extra, "wall_s": {"kernels_s": check.elapsed_s()}})
    save_gpu_profile(kernels, check.out / "profile.yaml")
    _log(f"kernels measured in {check.elapsed_s():.0f} s ({len(measurements)} kernels)")
    runs = measure_steps(plan, train_device, advance, _log)
    profile = fit_step_constants(kernels, node_preset, runs, _log)
    profile = replace(profile, extra={**profile.extra, "wall_s": {
        **kernels.extra["wall_s"], "calibration_s": check.elapsed_s()}})
    save_gpu_profile(profile, check.out / "profile.yaml")
    return profile, kernels


def _grid(check: Check, grid: Any, profile: Any, kernels: Any, node_preset: str,
          precision: str, train_device: Any, args: argparse.Namespace) -> None:
    import torch

    from dnnscale.calibrate.gpu_grid import predict_config, row
    from dnnscale.runtime.cuda import failure_reason
    from dnnscale.runtime.gpu_train import GpuTrainSpec, train_gpu
    from dnnscale.runtime.records import JsonlWriter
    from dnnscale.workload import load_workload

    writer = JsonlWriter(check.out / "runs.jsonl")
    try:
        for index, config in enumerate(grid, 1):
            check.phase = f"grid {index - 1}/{len(grid)} measured"
            predicted = predict_config(config, profile, node_preset, precision).step_time_s
            kernel_only = predict_config(config, kernels, node_preset, precision).step_time_s
            estimate_s = RUN_OVERHEAD_S + args.steps * predicted * 1.5
            if check.elapsed_s() + estimate_s > check.budget_s:
                check.rows.append(row(config, None, predicted, kernel_only, "skipped: budget"))
                _log(f"{config.label}: skipped (would pass the {check.budget_s:.0f} s budget)")
                check.write()
                continue
            spec = GpuTrainSpec(config.workload, config.micro_batch, config.global_batch,
                                config.recompute, precision, steps=args.steps,
                                warmup=args.warmup)
            try:
                summary = train_gpu(spec, load_workload(config.workload), train_device,
                                    writer.write)
            except Exception as exc:  # noqa: BLE001 - one failed run costs its row only
                if train_device.type == "cuda":
                    torch.cuda.empty_cache()
                why = f"failed: {failure_reason(exc)}"
                _log(f"{config.label}: {why}")
                check.rows.append(row(config, None, predicted, kernel_only, why))
                check.write()
                continue
            writer.write(summary)
            check.rows.append(row(config, summary, predicted, kernel_only))
            last = check.rows[-1]
            _log(f"{config.label}: measured {last['measured_step_s'] * 1e3:.2f} ms, predicted "
                 f"{predicted * 1e3:.2f} ms ({last['signed_error']:+.1%}; kernels only "
                 f"{kernel_only * 1e3:.2f} ms)")
            check.write()
    finally:
        writer.close()
    check.phase = "done"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the whole flow on this CPU: tiny shapes, fp32, a temp folder")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default {OUT.relative_to(ROOT)}; a temporary "
                             f"folder with --dry-run)")
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N")
    parser.add_argument("--as", dest="as_device", default=None,
                        help="devices.yaml name of the GPU (default: from its CUDA name)")
    parser.add_argument("--full", action="store_true", help="the full calibration plan")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--budget-s", type=float, default=BUDGET_S,
                        help="skip grid configurations that would end after this many seconds")
    args = parser.parse_args(argv)

    from dnnscale.calibrate.gpu import GpuCalibrationPlan, node_preset_for
    from dnnscale.calibrate.gpu_grid import H200_GRID, TINY_GRID, check_disjoint

    try:
        layer, train_device, preset = _devices(args)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    precision = "fp32" if args.dry_run else "bf16"
    plan = GpuCalibrationPlan.make("tiny" if args.dry_run else "full" if args.full else "quick",
                                   precision)
    grid = TINY_GRID if args.dry_run else H200_GRID
    check_disjoint(grid, plan)
    node_preset = node_preset_for(preset)
    out = args.out or (Path(tempfile.mkdtemp(prefix="gpu-check-")) if args.dry_run else OUT)
    check = Check(out, _facts(args, layer, preset, node_preset, precision, plan), args.budget_s)
    _log(f"{layer.name} as {preset} ({node_preset}:1), {plan.mode} calibration, "
         f"{len(grid)} grid configurations, writing {out}")
    try:
        check.write()
        profile, kernels = _calibrate(check, layer, train_device, plan, preset, node_preset)
        _log(f"calibrated in {check.elapsed_s():.0f} s")
        _grid(check, grid, profile, kernels, node_preset, precision, train_device, args)
    except KeyboardInterrupt:
        check.write(interrupted=True)
        _log(f"interrupted after {check.elapsed_s():.0f} s; partial results in {out}")
        return 130
    check.write(complete=True)
    stats = json.loads((out / "summary.json").read_text())
    _log(f"done in {check.elapsed_s():.0f} s: median {_pct(stats['median_relative_error'])}, "
         f"max {_pct(stats['max_relative_error'])} over {stats['measured']} configurations; "
         f"{out}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
