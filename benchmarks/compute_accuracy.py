"""Compute accuracy: predicted vs measured forward+backward time per sample, layer by layer.

For every layer of adam-mnist, adam-cifar10, alexnet and a scaled-down adam-imagenet22k, the
prediction comes from a calibrated hardware profile through the model's `stage_costs` (P = 1,
one core) and the measurement from timing the layer as training runs it (an nn.Module under
autograd, one thread, median of repeated samples; see dnnscale/calibrate/layer_timing.py). The
profile is calibrated on the synthetic grid of dnnscale/calibrate/compute.py, not on these
layers. Flatten layers (a view: predicted 0 s) are listed but left out of the error statistics.

    .venv/bin/python benchmarks/compute_accuracy.py                 # calibrate, then measure
    .venv/bin/python benchmarks/compute_accuracy.py --profile p.yaml --repeats 3

Writes results/compute_accuracy.md and results/compute_accuracy.json (median_relative_error,
max_relative_error, machine, date, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def workloads() -> list[tuple[object, int]]:
    """(workload, minibatch) pairs of the benchmark."""
    from dnnscale.workload.zoo import adam_cifar10, adam_imagenet22k, adam_mnist, alexnet

    return [(adam_mnist(), 32), (adam_cifar10(), 32), (alexnet(), 16),
            (adam_imagenet22k(width=0.25, image_size=112), 16)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", type=Path, help="use this profile instead of calibrating")
    parser.add_argument("--save-profile", type=Path, help="write the fresh profile here")
    parser.add_argument("--quick", action="store_true", help="quick calibration")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per layer (median)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="measure layers on the thread's CPU clock (default; robust to "
                        "other processes) or on the wall clock (a quiet machine only)")
    parser.add_argument("--out", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    import torch

    from dnnscale.calibrate.layer_timing import measured_train_s
    from dnnscale.calibrate.run import Plan, calibrate, machine_facts
    from dnnscale.model.stage import stage_costs
    from dnnscale.system import LinkTier, System
    from dnnscale.system.load import profile_machine
    from dnnscale.system.profile import load_profile, save_profile

    torch.set_num_threads(1)
    load_before = os.getloadavg()
    started = time.perf_counter()
    if args.profile:
        profile = load_profile(args.profile)
    else:
        profile = calibrate(Plan.make(args.quick, network=False),
                            lambda label: print(f"  calibrated {label}", file=sys.stderr))
        if args.save_profile:
            save_profile(profile, args.save_profile)
    calibration_s = time.perf_counter() - started
    machine = profile_machine(profile, cores=1.0)
    system = System("one-core", 1, machine, LinkTier(bandwidth_bytes_per_s=1e9, latency_s=0.0))
    rows = []
    for workload, batch in workloads():
        predicted = stage_costs(workload, system, 1, batch).layers
        for layer, cost in zip(workload.layers, predicted):
            runs = [measured_train_s(layer, batch, clock=clock) for _ in range(args.repeats)]
            measured_s = statistics.median(runs) / batch
            predicted_s = cost.compute_s / batch
            counted = layer.kind != "flatten"
            rows.append({"workload": workload.name, "layer": layer.name, "kind": layer.kind,
                         "minibatch": batch, "predicted_s_per_sample": predicted_s,
                         "measured_s_per_sample": measured_s,
                         "measured_spread": (max(runs) - min(runs)) / statistics.median(runs),
                         "relative_error": abs(predicted_s - measured_s) / measured_s,
                         "counted": counted})
            print(f"{workload.name:>34} {layer.name:>12} pred {predicted_s * 1e6:10.1f} us "
                  f"meas {measured_s * 1e6:10.1f} us err {rows[-1]['relative_error']:6.1%}",
                  file=sys.stderr)
    load_after = os.getloadavg()
    errors = [row["relative_error"] for row in rows if row["counted"]]
    totals = _totals(rows)
    summary = {
        "median_relative_error": statistics.median(errors),
        "max_relative_error": max(errors),
        "p90_relative_error": sorted(errors)[int(0.9 * (len(errors) - 1))],
        "layers": len(errors),
        "machine": machine_facts(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch_version": str(torch.__version__),
        "load_average_before": list(load_before), "load_average_after": list(load_after),
        "profile": {"source": str(args.profile) if args.profile else "calibrated in this run",
                    "date": profile.date, "calibration": profile.calibration,
                    "seconds": round(calibration_s, 1)},
        "repeats": args.repeats,
        "clock": args.clock,
        "workload_totals": totals,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compute_accuracy.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "compute_accuracy.md").write_text(_markdown(summary))
    print(f"median {summary['median_relative_error']:.1%}, max {summary['max_relative_error']:.1%}"
          f" over {len(errors)} layers; load {load_before[0]:.2f} -> {load_after[0]:.2f}")
    return 0


def _totals(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(row["workload"] for row in rows):
        members = [row for row in rows if row["workload"] == name]
        predicted = sum(row["predicted_s_per_sample"] for row in members)
        measured = sum(row["measured_s_per_sample"] for row in members)
        out.append({"workload": name, "minibatch": members[0]["minibatch"],
                    "predicted_s_per_sample": predicted, "measured_s_per_sample": measured,
                    "relative_error": abs(predicted - measured) / measured})
    return out


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def _markdown(summary: dict) -> str:
    m = summary["machine"]
    lines = [
        "# Compute accuracy: predicted vs measured forward+backward time per sample",
        "",
        f"- machine: {m['hostname']}, {m['cpu_model']}, {m['cores']} cores; torch "
        f"{summary['torch_version']}; one thread",
        f"- date: {summary['date']}; load average (1/5/15 min) before "
        f"{'/'.join(f'{v:.2f}' for v in summary['load_average_before'])}, after "
        f"{'/'.join(f'{v:.2f}' for v in summary['load_average_after'])}",
        f"- profile: {summary['profile']['source']} (calibrated {summary['profile']['date']} on "
        "the synthetic grid of `dnnscale/calibrate/compute.py`, which does not contain these "
        "layers)",
        f"- measured: each layer as an nn.Module under autograd, median of {summary['repeats']} "
        f"runs, each the fastest of 7 timing samples on the {summary['clock']} clock "
        "(cpu = this thread's CPU time, which other processes do not inflate); predicted: "
        "`stage_costs(P=1)` on one core",
        "- command: `.venv/bin/python benchmarks/compute_accuracy.py`",
        "",
        f"**Median relative error {summary['median_relative_error']:.1%}, 90th percentile "
        f"{summary['p90_relative_error']:.1%}, maximum {summary['max_relative_error']:.1%}** over "
        f"{summary['layers']} layers (flatten layers, a view predicted at 0 s, not counted). "
        "Target: median <= 10 %, maximum <= 25 %.",
        "",
        "## Whole networks (sum of layers)",
        "",
        "| workload | minibatch | predicted us/sample | measured us/sample | error |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in summary["workload_totals"]:
        lines.append(f"| {row['workload']} | {row['minibatch']} | "
                     f"{_us(row['predicted_s_per_sample'])} | {_us(row['measured_s_per_sample'])}"
                     f" | {row['relative_error']:.1%} |")
    lines += ["", "## Layers", "",
              "| workload | layer | kind | predicted us/sample | measured us/sample | "
              "measurement spread | error |",
              "|---|---|---|---:|---:|---:|---:|"]
    for row in summary["rows"]:
        error = f"{row['relative_error']:.1%}" if row["counted"] else "(not counted)"
        lines.append(f"| {row['workload']} | {row['layer']} | {row['kind']} | "
                     f"{_us(row['predicted_s_per_sample'])} | {_us(row['measured_s_per_sample'])}"
                     f" | {row['measured_spread']:.0%} | {error} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
