"""Experiment, not adopted: the vTrain A100 refit with the memory curve taken from published
figures instead of fitted, scored on every check the kept profile is.

The packaged A100 profile (benchmarks/vtrain.py, 2026-12-01) fits a memory curve of η_max 0.95
with its half-point at 142 MB: 0.17 of HBM bandwidth for a 32 MB elementwise pass. Two
published measurements say otherwise:

- η_max 0.88: an A100 80 GB SXM's best read kernel reaches 1.80 of its 2.04 TB/s, 88 % by
  Nsight Compute too, about the 90 % an NVIDIA GTC talk gives as the best any kernel reached
  (NVIDIA developer forum, "Trouble to Reach Peak Bandwidth of A100", 2025);
- 0.79 at 32 MB: mli/transformers-benchmarks (README, micro_bench.ipynb) multiplies a
  4M-element fp32 vector on an A100 80 GB at 0.202 TFLOP/s, 8 bytes moved per element:
  1.62 TB/s of 2,039 GB/s.

The saturating curve η(x) = η_max · x / (x + x½) through both gives x½ = 32e6 · (0.88 / 0.79 − 1)
= 3.65 MB. This script pins those two constants beside benchmarks/vtrain.py's published ones,
fits the other seven on the same single-node split, and scores the held-out shapes, the
fitted rows, the 109 multi-node rows and published-dev with the result. Nothing here changes
a packaged profile; it writes results/vtrain/pinned-memory/. About 6 minutes on 2 cores;
--reuse-profiles scores the profiles written before, in seconds.

    .venv/bin/python benchmarks/vtrain_pinned_memory.py [--reuse-profiles]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.calibrate.gpu_fit import predict_all  # noqa: E402
from dnnscale.system.gpu_profile import load_gpu_profile, save_gpu_profile  # noqa: E402
from dnnscale.validate.vtrain import load_rows, predict_row  # noqa: E402

OUT = ROOT / "results" / "vtrain" / "pinned-memory"
MEMORY_MAX = 0.88
MEMORY_AT_32_MB = 0.79
MEMORY_HALF_BYTES = 32e6 * (MEMORY_MAX / MEMORY_AT_32_MB - 1)


def _module(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(vtrain, rows, predicted) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """benchmarks/vtrain.py's summary (median, p90, max) and the median predicted / measured."""
    return {**vtrain._summary(rows, predicted),
            "bias": statistics.median(p / r.measured_s for r, p in zip(rows, predicted))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reuse-profiles", action="store_true",
                        help="skip the fits: score results/vtrain/pinned-memory/profile-*.yaml")
    args = parser.parse_args()
    vtrain = _module("vtrain")
    vtrain.PUBLISHED = vtrain.PUBLISHED + (
        ("memory_max", MEMORY_MAX), ("memory_half_log10_bytes", math.log10(MEMORY_HALF_BYTES)))
    OUT.mkdir(parents=True, exist_ok=True)
    single, multi = load_rows("single"), load_rows("multi")
    train = [r for r in single if (r.hidden, r.layers) in vtrain.TRAIN_SHAPES]
    held_out = [r for r in single if (r.hidden, r.layers) not in vtrain.TRAIN_SHAPES]
    started = time.perf_counter()
    held_path, profile_path = OUT / "profile-held-out.yaml", OUT / "profile-a100.yaml"
    if args.reuse_profiles:
        held, full = load_gpu_profile(held_path), load_gpu_profile(profile_path)
    else:
        held = vtrain._fit(train, 2, "pinned memory: 4 of 8 single-node shapes")[0].profile
        full = vtrain._fit(single, 2, "pinned memory: all 1,440 single-node rows")[0].profile
        save_gpu_profile(held, held_path)
        save_gpu_profile(full, profile_path)
    multi_pred = [predict_row(r, full) for r in multi]
    summary = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "adopted": False,
        "pinned": {"memory_max": MEMORY_MAX, "memory_half_bytes": MEMORY_HALF_BYTES,
                   **dict(vtrain.PUBLISHED)},
        "fitted": full.extra.get("fitted", {}),
        "single_node_held_out": _summary(vtrain, held_out,
                                         predict_all(predict_row, held_out, held)),
        "single_node_fitted_rows": _summary(vtrain, single,
                                            predict_all(predict_row, single, full)),
        "multi_node": _summary(vtrain, multi, multi_pred),
        "groups": [{k: g[k] for k in ("model", "kendall_tau", "regret")}
                   for g in vtrain._groups(multi, multi_pred)],
        "published_dev": _published_dev(profile_path),
        "seconds": time.perf_counter() - started}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def _published_dev(profile_path: Path) -> dict[str, object]:
    """published-dev's rows with `profile_path` in place of the packaged A100 profile."""
    import dnnscale.system.gpu as gpu

    packaged = gpu.default_profile_path

    def swapped(device: str) -> Path | None:
        path = packaged(device)
        return profile_path if path is not None and path.name == "A100-SXM4.yaml" else path

    gpu.default_profile_path = swapped
    try:
        published = _module("published_dev")
        sys.argv = ["published_dev.py", "--out", str(OUT / "published_dev")]
        published.main()
    finally:
        gpu.default_profile_path = packaged
    overall = json.loads((OUT / "published_dev" / "summary.json").read_text())["overall"]
    return {key: overall[key] for key in ("rows", "median_relative_error", "p90_relative_error",
                                          "max_relative_error", "bias")}


if __name__ == "__main__":
    main()
