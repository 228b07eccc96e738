"""Re-predict the published development measurements (data/published-dev, issue 23) at HEAD.

    .venv/bin/python benchmarks/published_dev.py       # a few seconds; writes results/published_dev/

Each row becomes a workload, a system preset and a plan (validate/published_dev.py says how,
and which rows the model cannot express yet, with the reason); the model predicts its
throughput, and the summary gives per source and overall the median, p90 and max relative error
of throughput and the bias (the median of predicted over measured *time*: below 1 the model is
too fast), the same per model family (`family`), and the FP8/BF16 speed-ups of rows that
differ in precision alone. Nothing is fitted: every prediction uses the presets as committed.
Development data: the model may be shaped on it; the held-out public sets named in the data's
README are not here.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.metrics import error_summary  # noqa: E402
from dnnscale.validate.published_dev import (DATA, Case, Unexpressed, case_of,  # noqa: E402
                                             load_rows, speedup_pairs)

OUT = ROOT / "results" / "published_dev"
MEDIAN_TARGET, P90_TARGET, BIAS_TARGET, SPEEDUP_TARGET = 0.10, 0.25, (0.95, 1.05), 0.10
"""Issue 23's targets on this data: median and p90 relative error, bias, FP8/BF16 speed-up."""


def predict_case(case: Case) -> dict[str, Any]:
    """The row's prediction, or the reason there is none (an input the model refuses)."""
    import dnnscale
    from dnnscale.errors import InputError

    out: dict[str, Any] = asdict(case)
    try:
        prediction = dnnscale.predict(case.workload, case.system, case.plan)
    except InputError as exc:
        out["error"] = str(exc)
        return out
    predicted = prediction.throughput_samples_per_s
    out.update(predicted_samples_per_s=predicted, fits=bool(prediction.fits),
               step_time_s=prediction.step_time_s,
               relative_error=abs(predicted - case.measured_samples_per_s)
               / case.measured_samples_per_s,
               time_ratio=case.measured_samples_per_s / predicted,
               bottleneck=str(prediction.bottleneck))
    if prediction.error_band is not None and prediction.error_band.key is not None:
        out["regime_key"] = prediction.error_band.key.to_dict()  # benchmarks/error_bands.py
    return out


def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Error figures of predicted rows: median, p90, max, bias (median predicted / measured
    time) and how many are optimistic (predicted faster)."""
    scored = [r for r in rows if "relative_error" in r]
    out: dict[str, Any] = {"rows": len(scored)}
    out.update({key: value if scored else None  # an empty group: null, not NaN (strict JSON)
                for key, value in error_summary([r["relative_error"] for r in scored]).items()})
    out["bias"] = statistics.median(r["time_ratio"] for r in scored) if scored else None
    out["optimistic_rows"] = sum(r["time_ratio"] < 1 for r in scored)
    return out


def family(row: dict[str, Any]) -> str:
    """The row's model family: DeepLearningExamples' model as the row names it, or MPT."""
    return "MPT (llm-foundry)" if row["source"] == "llm-foundry" else row["model"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    started = time.monotonic()
    try:
        items = [case_of(row) for row in load_rows(args.data)]
    except KeyError as exc:
        print(f"error: --data {args.data}: missing column {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # a missing file, a row it cannot read
        print(f"error: --data {args.data}: {exc}", file=sys.stderr)
        return 2
    cases = [c for c in items if isinstance(c, Case)]
    rows = []
    for index, case in enumerate(cases, 1):
        rows.append(predict_case(case))
        if index % 25 == 0 or index == len(cases):
            print(f"predicted {index}/{len(cases)}", file=sys.stderr, flush=True)
    by_id = {r["id"]: r for r in rows}
    sources = sorted({c.source for c in cases})
    groups: dict[str, dict[str, Any]] = {}
    for source in sources:
        for precision in sorted({c.precision for c in cases if c.source == source}):
            groups[f"{source} / {precision}"] = block(
                [r for r in rows if r["source"] == source and r["precision"] == precision])
    speedups = []
    for bf16, fp8 in speedup_pairs(cases):
        a, b = by_id[bf16.id], by_id[fp8.id]
        if "relative_error" not in a or "relative_error" not in b:
            continue
        measured = fp8.measured_samples_per_s / bf16.measured_samples_per_s
        predicted = b["predicted_samples_per_s"] / a["predicted_samples_per_s"]
        speedups.append({"bf16": bf16.id, "fp8": fp8.id, "model": fp8.model,
                         "measured_speedup": measured, "predicted_speedup": predicted,
                         "speedup_relative_error": abs(predicted - measured) / measured})
    overall = block(rows)
    summary: dict[str, Any] = {
        "data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()})",
        "rows_in_data": len(items), "rows_expressed": len(cases),
        "rows_predicted": overall["rows"],
        "overall": overall,
        "per_source": {s: block([r for r in rows if r["source"] == s]) for s in sources},
        "per_source_and_precision": groups,
        "per_model": {name: block([r for r in rows if family(r) == name])
                      for name in sorted({family(r) for r in rows})},
        "closest_preset": block([r for r in rows if r["closest_preset"]]),
        "exact_preset": block([r for r in rows if not r["closest_preset"]]),
        "fp8_over_bf16": speedups,
        "not_expressed": [asdict(u) for u in items if isinstance(u, Unexpressed)],
        "not_predicted": [{"id": r["id"], "error": r["error"]} for r in rows if "error" in r],
        "targets": {"median_relative_error": MEDIAN_TARGET, "p90_relative_error": P90_TARGET,
                    "bias": list(BIAS_TARGET), "speedup_relative_error": SPEEDUP_TARGET},
        "seconds": round(time.monotonic() - started, 2),
    }
    low, high = BIAS_TARGET
    summary["targets_met"] = {
        "median_relative_error": overall["median_relative_error"] <= MEDIAN_TARGET,
        "p90_relative_error": overall["p90_relative_error"] <= P90_TARGET,
        "bias": overall["bias"] is not None and low <= overall["bias"] <= high,
        "speedups": bool(speedups) and all(s["speedup_relative_error"] <= SPEEDUP_TARGET
                                           for s in speedups)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{overall['rows']} of {len(items)} rows predicted ({len(items) - len(cases)} not "
          f"expressed): median {overall['median_relative_error']:.1%}, p90 "
          f"{overall['p90_relative_error']:.1%}, max {overall['max_relative_error']:.1%}, bias "
          f"{overall['bias']:.2f} (predicted / measured time)")
    for name, figures in groups.items():
        print(f"  {name:24} rows {figures['rows']:3}  median {figures['median_relative_error']:6.1%}"
              f"  p90 {figures['p90_relative_error']:6.1%}  max {figures['max_relative_error']:6.1%}"
              f"  bias {figures['bias']:.2f}")
    for name, figures in summary["per_model"].items():
        print(f"  {name:36} rows {figures['rows']:3}  median "
              f"{figures['median_relative_error']:6.1%}  max {figures['max_relative_error']:6.1%}"
              f"  bias {figures['bias']:.2f}")
    for s in speedups:
        print(f"  fp8/bf16 {s['model']} ({s['bf16']}, {s['fp8']}): measured "
              f"{s['measured_speedup']:.2f}x, predicted {s['predicted_speedup']:.2f}x")
    print(f"wrote {args.out / 'summary.json'} in {summary['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
