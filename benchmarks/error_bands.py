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
- The public development measurements re-predicted at HEAD: results/published_dev/rows.json
  (benchmarks/published_dev.py: DeepLearningExamples' BERT, Transformer-XL and ResNet-50 and
  llm-foundry's MPT on A100, H100 and V100 presets) and results/moe_context/summary.json's rows
  (benchmarks/moe_context.py: expert and context parallelism), each row with the `regime_key`
  its prediction carried. The model was shaped on these rows, so their bands say so in their
  name ('development data'); the held-out sets named in the data's README are not among them.

Rows of one regime from several sources make one band (their errors pooled; the band's source
and name list every source that contributed).

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

from dnnscale.model.error_band import (DATA_FILE, FORMAT, MIN_ROWS, Regime, has_band,  # noqa: E402
                                       regime_for, regime_of)
from dnnscale.plan.config import Config  # noqa: E402
from dnnscale.validate.metrics import error_summary  # noqa: E402


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def summary_date(summary: Path) -> str:
    """The `date` a benchmark's summary.json records ('' when it is missing or has none)."""
    return json.loads(summary.read_text()).get("date", "") if summary.exists() else ""


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
    date = summary_date(folder / "summary.json")
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
    date = summary_date(folder / "summary.json")
    return rows, (f"{_shown(folder)}/multi_node_rows.json: vTrain's multi-node rows "
                  f"(Megatron-DeepSpeed on A100, 64-512 GPUs{', ' + date if date else ''})")


PUBLISHED_DEV_NAME = "the public development measurements (development data)"
MOE_CONTEXT_NAME = "the public MoE and long-context measurements (development data)"


def recorded_rows(path: Path, listed: str | None = None) -> list[tuple[Regime, float]]:
    """(regime, relative error) of the predicted rows of a benchmark's JSON at `path` (a list
    of rows, or the list under `listed`) that recorded their prediction's `regime_key`."""
    data = json.loads(path.read_text())
    rows = data[listed] if listed else data
    return [(Regime.from_dict(r["regime_key"]), float(r["relative_error"])) for r in rows
            if "relative_error" in r and r.get("regime_key")]


def _dated(summary: Path, text: str) -> str:
    """`text` with the date `summary` (a benchmark's summary.json) records, when it has one."""
    date = summary_date(summary)
    return f"{text}, {date}" if date else text


Source = tuple[list[tuple[Regime, float]], str, str]
"""A source's (regime, relative error) rows, its source text and its short name."""


def bands(sources: list[Source]) -> dict[str, dict]:  # type: ignore[type-arg]
    """Per regime label: its key, the error summary of every source's rows of that regime
    pooled, the rows, and the sources' texts and short names (what a band and a missing
    band's reason cite), each listed once, in the order given."""
    by_regime: dict[Regime, tuple[list[float], list[str], list[str]]] = {}
    for rows, source, name in sources:
        for regime, error in rows:
            errors, texts, names = by_regime.setdefault(regime, ([], [], []))
            errors.append(error)
            if source not in texts:
                texts.append(source)
            if name not in names:
                names.append(name)
    return {regime.label: {"regime": regime.to_dict(), **error_summary(errors),
                           "rows": len(errors), "source": "; ".join(texts),
                           "name": " and ".join(names)}
            for regime, (errors, texts, names) in sorted(by_regime.items(),
                                                         key=lambda item: item[0].label)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "results" / "validation" / "wave1"))
    parser.add_argument("--vtrain", default=str(ROOT / "results" / "vtrain"),
                        help="folder of benchmarks/vtrain.py's results (skipped when absent)")
    parser.add_argument("--corpus", help="rows.json of benchmarks/rescore.py: the measurement "
                        "corpus re-scored at HEAD (instead of FOLDER)")
    parser.add_argument("--published-dev", default=str(ROOT / "results" / "published_dev"),
                        help="folder of benchmarks/published_dev.py's results (skipped when "
                        "absent)")
    parser.add_argument("--moe-context", default=str(ROOT / "results" / "moe_context"),
                        help="folder of benchmarks/moe_context.py's results (skipped when absent)")
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
    sources: list[Source] = [(rows, source, name)]
    vtrain = Path(args.vtrain)
    if (vtrain / "multi_node_rows.json").exists():
        gpu, gpu_source = vtrain_rows(vtrain)
        sources.append((gpu, gpu_source, "vTrain's multi-node A100 rows (development data)"))
        settings.append(gpu_source)
    published = Path(args.published_dev) / "rows.json"
    if published.exists():
        text = _dated(published.with_name("summary.json"),
                      f"{_shown(published)}: DeepLearningExamples' and llm-foundry's "
                      "published training throughput (A100, H100, V100)")
        sources.append((recorded_rows(published), text, PUBLISHED_DEV_NAME))
        settings.append(text)
    moe = Path(args.moe_context) / "summary.json"
    if moe.exists():
        text = _dated(moe, f"{_shown(moe)} rows: published MoE and long-context training "
                      "throughput (expert and context parallelism)")
        sources.append((recorded_rows(moe, "rows"), text, MOE_CONTEXT_NAME))
        settings.append(text)
    data = {"format": FORMAT, "source": source, "settings": settings, "regimes": bands(sources)}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for label, band in data["regimes"].items():
        mark = "" if has_band(band["rows"]) else f"  (< {MIN_ROWS} rows: no band)"
        print(f"{label:62s} rows {band['rows']:3d}  median {100 * band['median_relative_error']:5.1f} %"
              f"  p90 {100 * band['p90_relative_error']:5.1f} %{mark}")


if __name__ == "__main__":
    main()
