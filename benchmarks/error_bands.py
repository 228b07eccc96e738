"""Store the validated error distribution of each regime, the lookup behind `error_band`.

    .venv/bin/python benchmarks/error_bands.py [results/validation/wave1] [--vtrain results/vtrain]
    .venv/bin/python benchmarks/error_bands.py --corpus results/validation/rows.json   # rescore.py

A cheap re-scoring, no timing run: it reads the rows the validations recorded and groups their
relative throughput errors by regime (model/error_band.py: device, precision, calibrated or not,
aggregation and ZeRO stage, parallel dimensions used, and on CPUs the predicted bottleneck's
class), each row's regime made by `regime_of`, the function the predictions use.

- Every results/validation/<set>/*/results.json: the validated configurations and the
  optimizer's choices (calibration rows, which fit the baselines, are left out). A row's regime
  is its recorded `regime_key` where present, else made from its Adam flags (`config`) and
  predicted bottleneck on a 'cpu' device, calibrated when the validation used a profile (the
  result's `calibrated`, else its note), at the workload's fp32.
- vTrain's 109 multi-node rows (results/vtrain/multi_node_rows.json, in the order of
  data/vtrain-megatron-a100/ground_truth_multi.csv, whose columns give each row's TP, PP and DP):
  their plan (validate/vtrain.py: row_plan, fp16, ZeRO-0) on their system (row_system with the
  profile the predictions used, results/vtrain/profile-a100.yaml: calibrated A100-SXM4).

Writes src/dnnscale/model/data/error_bands.json: per regime the median, 90th percentile and
maximum relative error and the number of rows, also for regimes with fewer rows than a band
needs (MIN_ROWS: the lookup then says so). Nothing is fitted: the errors are those the
validations measured, with the model that made their predictions. `benchmarks/validate.sh`
runs this after the validation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.model.error_band import DATA_FILE, FORMAT, MIN_ROWS, Regime, regime_for, regime_of  # noqa: E402
from dnnscale.plan.config import Config  # noqa: E402
from dnnscale.validate.metrics import error_summary  # noqa: E402


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def cpu_rows(folder: Path) -> tuple[list[tuple[Regime, float]], list[str], str]:
    """(regime, relative error) of every validated row under `folder`/*/results.json, the
    settings, and the source text."""
    rows, settings = [], []
    for path in sorted(folder.glob("*/results.json")):
        result = json.loads(path.read_text())
        calibrated = bool(result.get("calibrated", " with profile " in result.get("note", "")))
        settings.append(f"{result['workload']} @ {result['network']} (testbed "
                        f"{result.get('testbed', '?')}, "
                        f"{'calibrated' if calibrated else 'uncalibrated'})")
        for row in result["rows"]:
            if row["set"] not in ("validation", "optimizer"):
                continue
            if row.get("regime_key"):
                regime = Regime.from_dict(row["regime_key"])
            else:
                regime = regime_of(Config(**row["config"]).to_plan(), row["predicted_bottleneck"],
                                   "cpu", calibrated, accelerator=False)
            rows.append((regime, float(row["relative_error"])))
    summary = folder / "summary.json"
    date = json.loads(summary.read_text()).get("date", "") if summary.exists() else ""
    source = f"{_shown(folder)}/*/results.json" + (f" ({date})" if date else "")
    return rows, settings, source


def corpus_rows(path: Path) -> tuple[list[tuple[Regime, float]], list[str], str]:
    """(regime, relative error) of the corpus's evaluated rows (dev, test and the optimizer's
    choices; calibration rows fit the baselines and are left out) as benchmarks/rescore.py
    scored them at HEAD, the settings, and the source text."""
    scored = json.loads(path.read_text())
    rows = [(Regime.from_dict(r["regime_key"]), float(r["relative_error"])) for r in scored
            if r["split"] != "calibration" and r.get("regime_key")]
    settings = sorted({f"testbed setting {r['setting']} (calibrated, corpus)" for r in scored})
    return rows, settings, f"{_shown(path)} (benchmarks/rescore.py)"


def vtrain_rows(folder: Path) -> tuple[list[tuple[Regime, float]], str]:
    """(regime, relative error) of vTrain's multi-node rows, and the source text."""
    from dnnscale.system.gpu_profile import load_gpu_profile
    from dnnscale.validate.vtrain import load_rows, row_plan, row_system

    recorded = json.loads((folder / "multi_node_rows.json").read_text())
    measured = load_rows("multi")
    labels = [row.label for row in measured]
    if labels != [row["label"] for row in recorded]:
        raise SystemExit(f"{folder}/multi_node_rows.json is not in the order of vTrain's "
                         "ground_truth_multi.csv; re-run benchmarks/vtrain.py")
    profile = load_gpu_profile(folder / "profile-a100.yaml")
    rows = [(regime_for(row_system(row, profile), row_plan(row), ""),
             float(record["relative_error"])) for row, record in zip(measured, recorded)]
    summary = folder / "summary.json"
    date = json.loads(summary.read_text()).get("date", "") if summary.exists() else ""
    return rows, (f"{_shown(folder)}/multi_node_rows.json: vTrain's multi-node rows "
                  f"(Megatron-DeepSpeed on A100, 64-512 GPUs{', ' + date if date else ''})")


def bands(rows: list[tuple[Regime, float]], source: str,
          name: str) -> dict[str, dict]:  # type: ignore[type-arg]
    """Per regime label: its key, error summary, rows, source and a short `name` of the
    measurements (what a missing band's reason cites)."""
    by_regime: dict[Regime, list[float]] = {}
    for regime, error in rows:
        by_regime.setdefault(regime, []).append(error)
    return {regime.label: {"regime": regime.to_dict(), **error_summary(errors),
                           "rows": len(errors), "source": source, "name": name}
            for regime, errors in sorted(by_regime.items(), key=lambda item: item[0].label)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "results" / "validation" / "wave1"))
    parser.add_argument("--vtrain", default=str(ROOT / "results" / "vtrain"),
                        help="folder of benchmarks/vtrain.py's results (skipped when absent)")
    parser.add_argument("--corpus", help="rows.json of benchmarks/rescore.py: the measurement "
                        "corpus re-scored at HEAD (instead of FOLDER)")
    parser.add_argument("-o", "--output", default=str(DATA_FILE))
    args = parser.parse_args()
    folder = Path(args.folder)
    if args.corpus:
        rows, settings, source = corpus_rows(Path(args.corpus))
        name = "the testbed measurement corpus"
    else:
        rows, settings, source = cpu_rows(folder)
        name = f"the testbed validation ({folder.name})"
    if not rows:
        raise SystemExit(f"no validated rows in {args.corpus or folder}")
    data = {"format": FORMAT, "source": source, "settings": settings,
            "regimes": bands(rows, source, name)}
    vtrain = Path(args.vtrain)
    if (vtrain / "multi_node_rows.json").exists():
        gpu, gpu_source = vtrain_rows(vtrain)
        data["regimes"].update(bands(gpu, gpu_source, "vTrain's multi-node A100 rows"))
        data["settings"].append(gpu_source)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for label, band in data["regimes"].items():
        mark = "" if band["rows"] >= MIN_ROWS else f"  (< {MIN_ROWS} rows: no band)"
        print(f"{label:62s} rows {band['rows']:3d}  median {100 * band['median_relative_error']:5.1f} %"
              f"  p90 {100 * band['p90_relative_error']:5.1f} %{mark}")


if __name__ == "__main__":
    main()
