"""Store the validated error distribution of each regime, the lookup behind `error_band`.

    .venv/bin/python benchmarks/error_bands.py [results/validation] [--vtrain results/vtrain/summary.json]

Reads every results/validation/*/results.json (the validated configurations and the
optimizer's choices; calibration rows, which fit the baselines, are left out) and writes
src/dnnscale/model/data/error_bands.json: per regime (mode × bottleneck class,
model/error_band.py) the median, 90th percentile and maximum relative throughput error and
the number of rows. Nothing is fitted: the errors are those the validation measured, with the
model that made its predictions. With a vTrain summary (benchmarks/vtrain.py), regime "gpu"
gets its multi-node figures. `benchmarks/validate.sh` runs this after the validation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.model.error_band import DATA_FILE, FORMAT, GPU_REGIME, regime_of  # noqa: E402
from dnnscale.validate.metrics import error_summary  # noqa: E402


def rows_of(folder: Path) -> tuple[list[dict], list[str]]:  # type: ignore[type-arg]
    """Validated rows (with their setting) of every results.json under `folder`."""
    rows, settings = [], []
    for path in sorted(folder.glob("*/results.json")):
        result = json.loads(path.read_text())
        settings.append(f"{result['workload']} @ {result['network']}")
        for row in result["rows"]:
            if row["set"] in ("validation", "optimizer"):
                rows.append({**row, "setting": path.parent.name})
    return rows, settings


def bands(rows: list[dict], source: str) -> dict[str, dict]:  # type: ignore[type-arg]
    by_regime: dict[str, list[float]] = {}
    for row in rows:
        regime = row.get("regime") or regime_of(row["config"]["sync"], row["predicted_bottleneck"])
        by_regime.setdefault(regime, []).append(float(row["relative_error"]))
    return {regime: {**error_summary(errors), "rows": len(errors), "source": source}
            for regime, errors in sorted(by_regime.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "results" / "validation"))
    parser.add_argument("--vtrain", default=str(ROOT / "results" / "vtrain" / "summary.json"))
    parser.add_argument("-o", "--output", default=str(DATA_FILE))
    args = parser.parse_args()
    folder = Path(args.folder)
    rows, settings = rows_of(folder)
    if not rows:
        raise SystemExit(f"no validated rows under {folder}/*/results.json")
    summary = folder / "summary.json"
    date = json.loads(summary.read_text()).get("date", "") if summary.exists() else ""
    source = f"{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else folder}/*/results.json"
    data = {"format": FORMAT, "source": f"{source} ({date})" if date else source,
            "settings": settings, "regimes": bands(rows, f"{source} ({date})" if date else source)}
    vtrain = Path(args.vtrain)
    if vtrain.exists():
        figures = json.loads(vtrain.read_text())
        data["regimes"][GPU_REGIME] = {
            key: figures[key] for key in ("median_relative_error", "p90_relative_error",
                                          "max_relative_error", "rows")}
        data["regimes"][GPU_REGIME]["source"] = (
            f"{vtrain.relative_to(ROOT) if vtrain.is_relative_to(ROOT) else vtrain}: vTrain "
            f"multi-node rows ({figures.get('date', '')})")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    for regime, band in data["regimes"].items():
        print(f"{regime:40s} rows {band['rows']:3d}  median {100 * band['median_relative_error']:5.1f} %"
              f"  p90 {100 * band['p90_relative_error']:5.1f} %")


if __name__ == "__main__":
    main()
