"""Re-predict DeepBench's published V100 GEMM kernel times (data/deepbench-v100-gemm) at HEAD.

    .venv/bin/python benchmarks/gemm_kernels.py      # about a second; writes results/gemm_kernels/

An uncalibrated V100 prices a GEMM by the published large-GEMM efficiency of its precision
(presets/microbenchmarks.yaml: 76 % of the FP16 Tensor Core peak, 89 % of the FP32 one) and a
fixed start-up per kernel (system/gpu.GEMM_START_UP_S, 15 µs, from the calibrated A100
profile), under HBM's roofline: model/gpu_compute.kernel_time_s with the device's efficiency
curves, as every GEMM layer is priced. DeepBench timed 320 GEMMs of real training shapes on a
DGX-1 V100 with cuBLAS (CUDA 10.1, the era of the NGC 19.xx containers). None of them set a
constant: this is a check of the curve's shape on kernels the model never saw. The summary
gives, per precision and per decade of FLOPs, the median of predicted over measured time and
the median, p90 and max relative error of the time, beside the same for a flat curve (the
large-GEMM efficiency at every size, the model before the start-up).
"""

from __future__ import annotations

import csv
import json
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.model.gpu_compute import efficiency, kernel_time_s, peak_flops_per_s  # noqa: E402
from dnnscale.system.device import Device  # noqa: E402
from dnnscale.system.gpu import gpu_system  # noqa: E402
from dnnscale.validate.metrics import error_summary  # noqa: E402

DATA = ROOT / "data" / "deepbench-v100-gemm" / "gemm.csv"
OUT = ROOT / "results" / "gemm_kernels"
SYSTEM = "dgx-1-v100-16g"
"""DeepBench's machine: an NVIDIA DGX-1 with V100 SXM2 (the spreadsheet's Specs sheet)."""
BYTES = {"fp16": 2, "fp32": 4}
LARGE_FLOPS = 1e13
"""The size at which the flat baseline reads the curve: its large-GEMM end."""


def gemm_time_s(device: Device, precision: str, m: int, n: int, k: int, flat: bool) -> float:
    """The model's time of one m x n x k GEMM: 2mnk FLOPs at the device's GEMM efficiency in
    `precision` (at its large-GEMM end when `flat`), its operands and result through HBM."""
    flops = 2.0 * m * n * k
    moved = float((m * k + k * n + m * n) * BYTES[precision])
    eta = efficiency(device, "gemm", LARGE_FLOPS if flat else flops, precision)
    memory_eta = device.memory_efficiency.at(moved) if device.memory_efficiency else 1.0
    return kernel_time_s(flops, moved, peak_flops_per_s(device, precision), eta,
                         device.memory_bandwidth_bytes_per_s, memory_eta)


def load() -> list[dict[str, Any]]:
    with DATA.open(newline="") as handle:
        return [{**row, "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"]),
                 "time_ms": float(row["time_ms"])} for row in csv.DictReader(handle)]


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    ratios = [row[key] for row in rows]
    return {"rows": len(rows), "time_ratio_median": statistics.median(ratios),
            **error_summary([abs(r - 1.0) for r in ratios])}


def main() -> int:
    device = gpu_system(SYSTEM, 1).machine
    rows = load()
    for row in rows:
        measured_s = row["time_ms"] * 1e-3
        for label, flat in (("curve", False), ("flat", True)):
            predicted = gemm_time_s(device, row["precision"], row["m"], row["n"], row["k"], flat)
            row[f"{label}_ratio"] = predicted / measured_s
        row["flops"] = 2.0 * row["m"] * row["n"] * row["k"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        decade = f"1e{int(len(str(int(row['flops']))) - 1)}"
        groups.setdefault(f"{row['precision']} {decade}", []).append(row)
        groups.setdefault(row["precision"], []).append(row)
    summary = {
        "data": str(DATA.relative_to(ROOT)), "system": SYSTEM,
        "device_source": device.name,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node() or 'unknown'} ({platform.machine()})",
        "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip(),
        "overall": {"curve": _summary(rows, "curve_ratio"), "flat": _summary(rows, "flat_ratio")},
        "groups": {name: {"curve": _summary(group, "curve_ratio"),
                          "flat": _summary(group, "flat_ratio")}
                   for name, group in sorted(groups.items(), key=lambda item: (
                       item[0].split()[0], float(item[0].split()[1]) if " " in item[0] else 0))},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [f"# DeepBench V100 GEMMs re-predicted ({summary['date']}, {summary['git']}, "
             f"{summary['machine']})", "",
             "Time ratio = predicted / measured kernel time (below 1: the model is too fast); "
             "error = |ratio - 1|. 'curve': the large-GEMM efficiency with the 15 us start-up "
             "(system/gpu.GEMM_START_UP_S); 'flat': the large-GEMM efficiency at every size.",
             "", "| group | rows | curve: ratio | median | p90 | max | flat: ratio | median | "
             "p90 | max |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, both in [("all", summary["overall"]), *summary["groups"].items()]:
        c, f = both["curve"], both["flat"]
        lines.append(f"| {name} | {c['rows']} | {c['time_ratio_median']:.2f} | "
                     f"{100 * c['median_relative_error']:.1f} % | "
                     f"{100 * c['p90_relative_error']:.1f} % | "
                     f"{100 * c['max_relative_error']:.1f} % | {f['time_ratio_median']:.2f} | "
                     f"{100 * f['median_relative_error']:.1f} % | "
                     f"{100 * f['p90_relative_error']:.1f} % | "
                     f"{100 * f['max_relative_error']:.1f} % |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
