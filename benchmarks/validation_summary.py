"""Merge the validation runs under results/validation/ into summary.json and summary.md.

    .venv/bin/python benchmarks/validation_summary.py results/validation

Per benchmark (over both network settings) and overall: configs, median / p90 / max relative
error of throughput, Kendall τ (per benchmark and network setting, and their mean), regret
(worst over the settings), and the same error figures for the Paleo-style and Optimus baselines.
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from dnnscale.validate.metrics import error_summary, kendall_tau


def _figures(rows: list[dict], key: str) -> dict[str, float]:
    return error_summary([r[key] for r in rows if key in r])


def main(folder: Path) -> None:
    runs = sorted(folder.glob("*/results.json"))
    if not runs:
        raise SystemExit(f"no */results.json under {folder}")
    results = [json.loads(path.read_text()) for path in runs]
    benchmarks: dict[str, list[dict]] = {}
    for result in results:
        benchmarks.setdefault(result["workload"], []).append(result)

    def block(items: list[dict]) -> dict:
        rows = [r for res in items for r in res["rows"] if r["set"] == "validation"]
        taus = [kendall_tau([r["predicted_throughput_samples_per_s"] for r in res["rows"]
                             if r["set"] == "validation"],
                            [r["measured"]["throughput_samples_per_s"] for r in res["rows"]
                             if r["set"] == "validation"]) for res in items]
        regrets = [res["summary"]["regret"] for res in items]
        out = {"configs": len(rows), **_figures(rows, "relative_error"),
               "kendall_tau": sum(taus) / len(taus), "kendall_tau_per_setting": taus,
               "regret": max(regrets), "regret_per_setting": regrets,
               "max_spread": max(r["measured"]["spread"] for r in rows)}
        for name in ("paleo", "optimus"):
            figures = _figures(rows, f"{name}_relative_error")
            out[name] = figures
            for metric, value in figures.items():
                out[f"{name}_{metric}"] = value
        return out

    summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.node()} ({platform.machine()})",
               "settings": [f"{r['workload']} @ {r['network']}" for r in results],
               "benchmarks": {name: block(items) for name, items in benchmarks.items()},
               "overall": block(results)}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))

    def pct(value: float) -> str:
        return f"{100 * value:.1f} %"

    lines = ["# Validation summary", "",
             f"Machine {summary['machine']}, {summary['date']}. Produced by "
             "`benchmarks/validate.sh` (then `benchmarks/validation_summary.py`).", "",
             "| scope | configs | predictor | median error | p90 error | max error | Kendall τ | regret |",
             "|---|---|---|---|---|---|---|---|"]
    scopes = list(summary["benchmarks"].items()) + [("overall", summary["overall"])]
    for scope, figures in scopes:
        lines.append(f"| {scope} | {figures['configs']} | dnnscale | "
                     f"{pct(figures['median_relative_error'])} | {pct(figures['p90_relative_error'])} | "
                     f"{pct(figures['max_relative_error'])} | {figures['kendall_tau']:.2f} | "
                     f"{pct(figures['regret'])} |")
        for name in ("paleo", "optimus"):
            f = figures[name]
            lines.append(f"| {scope} | {figures['configs']} | {name} | {pct(f['median_relative_error'])} | "
                         f"{pct(f['p90_relative_error'])} | {pct(f['max_relative_error'])} | | |")
    lines += ["", "Targets: median ≤ 5 %, p90 ≤ 10 %, max ≤ 15 %, Kendall τ ≥ 0.8 per benchmark, "
              "regret ≤ 5 %. Per-configuration tables: the `*/table.md` files beside this one."]
    (folder / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/validation"))
