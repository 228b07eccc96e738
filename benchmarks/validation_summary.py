"""Merge the validation runs under results/validation/ into summary.json and summary.md.

    .venv/bin/python benchmarks/validation_summary.py results/validation

Every folder BENCH-SETTING/results.json (written by `dnnscale validate`) is one benchmark in
one network setting. Scopes: each benchmark (over its settings), each network setting (both
benchmarks), each benchmark × setting, and overall: configs, median / p90 / max relative error
of throughput, Kendall τ (per benchmark × setting, and their mean for wider scopes), regret
(the worst over the scope's settings), the same error figures for the Paleo-style and Optimus
baselines, and whether each target is met. The rows that count are the validated
configurations and the optimizer's own choice (calibration rows only fit the baselines).
Rows over 15 % error are listed with their per-phase reason (validate/reasons.py).
"""

from __future__ import annotations

import json
import math
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

from dnnscale.validate.metrics import error_summary, kendall_tau

TARGETS = {"median_relative_error": 0.05, "p90_relative_error": 0.12,
           "max_relative_error": 0.25, "kendall_tau": 0.85, "regret": 0.0}
"""Issue 11: median <= 5 %, p90 <= 12 %, max <= 25 %, Kendall τ >= 0.85, regret 0 %, and
dnnscale's median, p90 and max each below both baselines'."""
COUNTED = ("validation", "optimizer")


def _figures(rows: list[dict], key: str) -> dict[str, float]:  # type: ignore[type-arg]
    return error_summary([r[key] for r in rows if key in r])


def _tau(result: dict) -> float:  # type: ignore[type-arg]
    rows = [r for r in result["rows"] if r["set"] in COUNTED]
    return kendall_tau([r["predicted_throughput_samples_per_s"] for r in rows],
                       [r["measured"]["throughput_samples_per_s"] for r in rows])


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def block(items: list[dict]) -> dict:  # type: ignore[type-arg]
    """The figures of one scope (a list of results.json records)."""
    rows = [r for res in items for r in res["rows"] if r["set"] in COUNTED]
    taus = [_tau(res) for res in items]
    regrets = [res["summary"].get("regret", math.nan) for res in items]
    out = {"configs": len(rows), **_figures(rows, "relative_error"),
           "kendall_tau": _finite_mean(taus), "kendall_tau_per_setting": taus,
           "regret": max((r for r in regrets if not math.isnan(r)), default=math.nan),
           "regret_per_setting": regrets,
           "max_spread": max((r["measured"]["spread"] for r in rows), default=math.nan)}
    for name in ("paleo", "optimus"):
        figures = _figures(rows, f"{name}_relative_error")
        out[name] = figures
        for metric, value in figures.items():
            out[f"{name}_{metric}"] = value
    out["targets"] = targets_met(out)
    return out


def targets_met(figures: dict) -> dict[str, bool]:  # type: ignore[type-arg]
    """Each target of issue 11: met (True) or not."""
    met = {"median ≤ 5 %": figures["median_relative_error"] <= TARGETS["median_relative_error"],
           "p90 ≤ 12 %": figures["p90_relative_error"] <= TARGETS["p90_relative_error"],
           "max ≤ 25 %": figures["max_relative_error"] <= TARGETS["max_relative_error"],
           "Kendall τ ≥ 0.85": figures["kendall_tau"] >= TARGETS["kendall_tau"],
           "regret 0 %": figures["regret"] <= TARGETS["regret"] + 1e-12}
    for metric in ("median", "p90", "max"):
        key = f"{metric}_relative_error"
        met[f"{metric} below both baselines"] = all(
            figures[key] < figures[name][key] for name in ("paleo", "optimus")
            if not math.isnan(figures[name][key]))
    return met


def setting_of(path: Path, result: dict) -> str:  # type: ignore[type-arg]
    """The network setting of a results folder named BENCH-SETTING (e.g. cifar10-pshosts)."""
    return path.parent.name.rsplit("-", 1)[-1]


def main(folder: Path) -> None:
    runs = sorted(folder.glob("*/results.json"))
    if not runs:
        raise SystemExit(f"no */results.json under {folder}")
    results = [json.loads(path.read_text()) for path in runs]
    benchmarks: dict[str, list[dict]] = {}
    networks: dict[str, list[dict]] = {}
    per_setting: dict[str, dict] = {}
    over = []
    for path, result in zip(runs, results):
        setting = setting_of(path, result)
        benchmarks.setdefault(result["workload"], []).append(result)
        networks.setdefault(setting, []).append(result)
        per_setting[f"{result['workload']} @ {setting}"] = {
            "network": result["network"], "folder": path.parent.name, **block([result])}
        over += [{"setting": f"{result['workload']} @ {setting}", "id": r["id"],
                  "label": r["label"], "relative_error": r["relative_error"],
                  "reason": r.get("reason", "")}
                 for r in result["rows"] if r["set"] in COUNTED and r["relative_error"] > 0.15]
    summary = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.node()} ({platform.machine()})",
               "settings": [f"{r['workload']} @ {r['network']}" for r in results],
               "benchmarks": {name: block(items) for name, items in benchmarks.items()},
               "overall": block(results),
               "per_network_setting": {name: block(items) for name, items in networks.items()},
               "per_setting": per_setting,
               "rows_over_15_percent": over,
               "targets": {"median_relative_error": 0.05, "p90_relative_error": 0.12,
                           "max_relative_error": 0.25, "kendall_tau": 0.85, "regret": 0.0,
                           "below_both_baselines": ["median", "p90", "max"]}}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    (folder / "summary.md").write_text(markdown(summary))
    print(markdown(summary))


def _pct(value: float) -> str:
    return "—" if value is None or value != value else f"{100 * value:.1f} %"


def markdown(summary: dict) -> str:  # type: ignore[type-arg]
    lines = ["# Validation summary", "",
             f"Machine {summary['machine']}, {summary['date']}. Produced by "
             "`benchmarks/validate.sh` (then `benchmarks/validation_summary.py`). Rows that "
             "count: the validated configurations and the optimizer's own choice.", "",
             "| scope | configs | predictor | median error | p90 error | max error | Kendall τ | "
             "regret | targets missed |",
             "|---|---|---|---|---|---|---|---|---|"]
    scopes = (list(summary["per_setting"].items())
              + list(summary["per_network_setting"].items())
              + list(summary["benchmarks"].items()) + [("overall", summary["overall"])])
    for scope, figures in scopes:
        missed = [name for name, ok in figures["targets"].items() if not ok]
        lines.append(f"| {scope} | {figures['configs']} | dnnscale | "
                     f"{_pct(figures['median_relative_error'])} | "
                     f"{_pct(figures['p90_relative_error'])} | "
                     f"{_pct(figures['max_relative_error'])} | {figures['kendall_tau']:.2f} | "
                     f"{_pct(figures['regret'])} | {', '.join(missed) or 'none'} |")
        for name in ("paleo", "optimus"):
            f = figures[name]
            lines.append(f"| {scope} | {figures['configs']} | {name} | "
                         f"{_pct(f['median_relative_error'])} | {_pct(f['p90_relative_error'])} | "
                         f"{_pct(f['max_relative_error'])} | | | |")
    lines += ["", "Targets (issue 11), in every setting: median ≤ 5 %, p90 ≤ 12 %, max ≤ 25 %, "
              "the optimizer's own choice included; Kendall τ ≥ 0.85; regret 0 %; dnnscale's "
              "median, p90 and max each below both baselines'. Per-configuration tables: the "
              "`*/table.md` files beside this one."]
    if summary["rows_over_15_percent"]:
        lines += ["", "## Rows over 15 % error and their per-phase reason", ""]
        lines += [f"- {r['setting']} {r['id']} ({r['label']}, {_pct(r['relative_error'])}): "
                  f"{r['reason'] or 'no per-phase reason recorded'}"
                  for r in summary["rows_over_15_percent"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/validation"))
