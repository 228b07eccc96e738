"""How far to trust a prediction: the validated error distribution of its regime.

A regime is the aggregation mode × the predicted bottleneck's class (CPU plans), or "gpu"
(accelerators). Its band is a lookup, not a fit: the median and 90th percentile of the
relative throughput errors that the committed validation measured for rows of that regime
(results/validation/*/results.json: validated configurations and the optimizer's choices;
GPU: the vTrain benchmark's multi-node rows, results/vtrain/summary.json), stored in
`data/error_bands.json` by `benchmarks/error_bands.py`. A regime without validated rows has
no band: the numbers are None and `reason` says why.

No numbers are invented here and none are fitted: the file is the record of measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dnnscale.model.records import Bottleneck

DATA_FILE = Path(__file__).with_name("data") / "error_bands.json"
FORMAT = "dnnscale-error-bands/1"
MODES = ("ps-async", "ps-sync", "allreduce")
BOTTLENECK_CLASSES: dict[str, tuple[Bottleneck, ...]] = {
    "compute": (Bottleneck.WORKER_COMPUTE, Bottleneck.COMPUTE, Bottleneck.LAUNCHES,
                Bottleneck.OPTIMIZER_STEP, Bottleneck.BUBBLE),
    "partition communication": (Bottleneck.PARTITION_COMM, Bottleneck.TP_COMM,
                                Bottleneck.PP_COMM),
    "aggregation": (Bottleneck.PS_NETWORK, Bottleneck.PS_CPU, Bottleneck.WORKER_PS_TRANSFER,
                    Bottleneck.ALLREDUCE_NETWORK, Bottleneck.DP_COMM),
}
"""Bottleneck names (model/compose.py) by class: the worker's own compute, the traffic inside
a replica, and the traffic or work of combining replicas (parameter servers or all-reduce)."""
GPU_REGIME = "gpu"


def bottleneck_class(bottleneck: str) -> str:
    """The class of a bottleneck name ('aggregation' for the PS and all-reduce ones)."""
    for name, members in BOTTLENECK_CLASSES.items():
        if bottleneck in members:
            return name
    return "other"


def regime_of(mode: str, bottleneck: str, accelerator: bool = False) -> str:
    """'MODE / CLASS' of a CPU plan ('allreduce' for every collective mode), 'gpu' on
    accelerators."""
    if accelerator:
        return GPU_REGIME
    mode = mode if mode in ("ps-async", "ps-sync") else "allreduce"
    return f"{mode} / {bottleneck_class(bottleneck)}"


@dataclass(frozen=True)
class ErrorBand:
    """The measured relative-error distribution of one regime (None where nothing was
    validated, with the reason)."""

    regime: str
    median_relative_error: float | None
    p90_relative_error: float | None
    rows: int
    source: str
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"regime": self.regime,
                                "median_relative_error": self.median_relative_error,
                                "p90_relative_error": self.p90_relative_error,
                                "rows": self.rows, "source": self.source}
        if self.reason:
            data["reason"] = self.reason
        return data

    def text(self) -> str:
        """One line for a table: '±9 % median, ±35 % p90 (12 validated rows, ps-sync / ...)'."""
        if self.median_relative_error is None or self.p90_relative_error is None:
            return f"none: {self.reason}"
        return (f"±{100 * self.median_relative_error:.0f} % median, "
                f"±{100 * self.p90_relative_error:.0f} % p90 ({self.rows} validated "
                f"row{'s' if self.rows != 1 else ''}, {self.regime})")


@lru_cache(maxsize=4)
def load_bands(path: str = str(DATA_FILE)) -> dict[str, Any]:
    """The stored bands ({} when the file is missing or not the expected format)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == FORMAT else {}


def band_for(mode: str, bottleneck: str, accelerator: bool = False,
             bands: dict[str, Any] | None = None) -> ErrorBand:
    """The error band of the regime of (mode, bottleneck): the stored lookup, or a band of
    None values with the reason when the regime was never validated."""
    regime = regime_of(mode, bottleneck, accelerator)
    data = load_bands() if bands is None else bands
    entry = (data.get("regimes") or {}).get(regime)
    if entry and entry.get("rows"):
        return ErrorBand(regime, float(entry["median_relative_error"]),
                         float(entry["p90_relative_error"]), int(entry["rows"]),
                         str(entry.get("source", data.get("source", ""))))
    if not data:
        reason = f"no error-band data ({DATA_FILE.name} is missing)"
    elif regime == GPU_REGIME:
        reason = "no GPU validation results (results/vtrain/summary.json) when the bands were made"
    else:
        reason = f"no validated configuration of regime {regime!r} yet"
    return ErrorBand(regime, None, None, 0, str(data.get("source", "")), reason)
