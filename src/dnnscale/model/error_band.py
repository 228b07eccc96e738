"""How far to trust a prediction: the validated error distribution of its regime, or none.

A *regime* (`Regime`) is where a measurement was made, in the terms a prediction can be matched
on: the device (a GPU model's family, e.g. A100-SXM4 for both A100 SXM4 sizes; 'cpu' for CPU
clusters), the precision the math runs in, whether the system is calibrated, the aggregation
(PS asynchronous / synchronous, all-reduce, ZeRO stage), the parallel dimensions the plan uses
(those of size > 1: tp, pp, dp, cp, ep; Adam's P is tp, its R dp) and, for CPU plans, the class
of the predicted bottleneck (compute, partition communication, aggregation). `regime_of` is the
one function that makes it, for the predictions (`band_of`, called by `predict_plan`) and for
the measured rows (`benchmarks/error_bands.py`).

A band is a lookup, not a fit: the median and 90th percentile of the relative errors that the
committed validation measured for rows of exactly that regime (results/validation/*/results.json:
the testbed's validated configurations and optimizer choices; results/vtrain: vTrain's
multi-node A100 rows; results/published_dev and results/moe_context: the public development
measurements, on which the model was shaped, which the band's name says), stored in
`data/error_bands.json` by `benchmarks/error_bands.py`. A band belongs only to predictions of
its regime. A regime with fewer than `MIN_ROWS` rows, or none,
has no band: the numbers are None and `reason` says why (how many rows, or which measured regime
is nearest and how it differs from the plan's).

No numbers are invented here and none are fitted: the file is the record of measurements.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from dnnscale.model.records import Bottleneck
from dnnscale.plan.mesh import MeshDim
from dnnscale.plan.plan import Collective, ParallelPlan, ParameterServer
from dnnscale.system.device import device_family
from dnnscale.system.system import System

DATA_FILE = Path(__file__).with_name("data") / "error_bands.json"
FORMAT = "dnnscale-error-bands/2"
MIN_ROWS = 10
"""Fewest validated rows a regime needs for a band: with 10, nine rows lie at or below the
stated p90 and one above it; with fewer the p90 (linear interpolation) is read off the largest
one or two rows and says nothing a 'max' would not."""


def has_band(rows: int) -> bool:
    """Whether a regime with `rows` validated rows has a band (at least MIN_ROWS)."""
    return rows >= MIN_ROWS
DIMS: tuple[MeshDim, ...] = (MeshDim.TP, MeshDim.PP, MeshDim.DP, MeshDim.CP, MeshDim.EP)
"""The order a regime lists the parallel dimensions it uses in."""
BOTTLENECK_CLASSES: dict[str, tuple[Bottleneck, ...]] = {
    "compute": (Bottleneck.WORKER_COMPUTE, Bottleneck.COMPUTE, Bottleneck.LAUNCHES,
                Bottleneck.OPTIMIZER_STEP, Bottleneck.BUBBLE),
    "partition communication": (Bottleneck.PARTITION_COMM, Bottleneck.TP_COMM,
                                Bottleneck.PP_COMM, Bottleneck.EP_COMM, Bottleneck.CP_COMM),
    "aggregation": (Bottleneck.PS_NETWORK, Bottleneck.PS_CPU, Bottleneck.WORKER_PS_TRANSFER,
                    Bottleneck.ALLREDUCE_NETWORK, Bottleneck.DP_COMM),
}
"""Bottleneck names (model/compose.py) by class: the worker's own compute, the traffic inside
a replica, and the traffic or work of combining replicas (parameter servers or all-reduce)."""


def bottleneck_class(bottleneck: str) -> str:
    """The class of a bottleneck name ('aggregation' for the PS and all-reduce ones)."""
    for name, members in BOTTLENECK_CLASSES.items():
        if bottleneck in members:
            return name
    return "other"


@dataclass(frozen=True)
class Regime:
    """Where a prediction (or a measured row) sits; JSON: `to_dict` (`regime_key`).

    device: a GPU model's family (A100-SXM4, H100-SXM5), 'cpu' for CPU clusters. precision:
    the precision the math runs in (fp32, fp16, bf16, fp8). calibrated: the system's rates come
    from a calibrated profile (System.calibrated). aggregation: 'ps-async', 'ps-sync' or
    'allreduce', with `zero_stage` (0 = plain data parallelism; 0 for PS). parallel: the
    dimensions of size > 1 in DIMS order. bottleneck_class: CPU plans, the predicted
    bottleneck's class; None on accelerators (their validation rows record no bottleneck).
    """

    device: str
    precision: str
    calibrated: bool
    aggregation: str
    zero_stage: int
    parallel: tuple[str, ...]
    bottleneck_class: str | None = None

    @property
    def label(self) -> str:
        """'A100-SXM4 / fp16 / calibrated / allreduce / tp+pp+dp' (CPU: '/ CLASS' added)."""
        aggregation = (f"ZeRO-{self.zero_stage}" if self.zero_stage else self.aggregation)
        parts = [self.device, self.precision, "calibrated" if self.calibrated else "uncalibrated",
                 aggregation, "+".join(self.parallel) or "one device"]
        if self.bottleneck_class is not None:
            parts.append(self.bottleneck_class)
        return " / ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "precision": self.precision,
                "calibrated": self.calibrated, "aggregation": self.aggregation,
                "zero_stage": self.zero_stage, "parallel": list(self.parallel),
                "bottleneck_class": self.bottleneck_class}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Regime:
        class_name = data.get("bottleneck_class")
        return cls(str(data["device"]), str(data["precision"]), bool(data["calibrated"]),
                   str(data["aggregation"]), int(data["zero_stage"]),
                   tuple(str(d) for d in data["parallel"]),
                   None if class_name is None else str(class_name))


def regime_of(plan: ParallelPlan, bottleneck: str, device: str, calibrated: bool,
              accelerator: bool) -> Regime:
    """The regime of `plan` predicted with `bottleneck` on `device` (a GPU family or 'cpu'),
    calibrated or not: the one formula behind every band, for predictions and measured rows."""
    aggregation = plan.data.aggregation
    if isinstance(aggregation, ParameterServer):
        mode, zero = ("ps-async" if aggregation.asynchronous else "ps-sync"), 0
    else:
        mode = "allreduce"
        zero = aggregation.zero_stage if isinstance(aggregation, Collective) else 0
    mesh = plan.mesh
    used = tuple(str(dim) for dim in DIMS if mesh.size(dim) > 1)
    return Regime(device, plan.precision.compute, calibrated, mode, zero, used,
                  None if accelerator else bottleneck_class(bottleneck))


def system_device(system: System) -> str:
    """The device a regime names for `system`: its GPU's family, 'cpu' for CPU machines."""
    machine = system.machine
    return device_family(machine.name) if machine.is_accelerator else "cpu"


def regime_for(system: System, plan: ParallelPlan, bottleneck: str) -> Regime:
    """The regime of a prediction of `plan` on `system` with `bottleneck`."""
    return regime_of(plan, bottleneck, system_device(system), system.calibrated,
                     system.machine.is_accelerator)


@dataclass(frozen=True)
class ErrorBand:
    """The measured relative-error distribution of one regime, or None values with the reason
    (no rows of that regime, or fewer than MIN_ROWS)."""

    regime: str
    median_relative_error: float | None
    p90_relative_error: float | None
    rows: int
    """Validated rows of exactly this regime (also when too few for a band)."""
    source: str
    reason: str = ""
    key: Regime | None = None
    name: str = ""
    """Whose measurements the rows are, in a few words ('vTrain's multi-node A100 rows'; '...
    (development data)' where the model was shaped on them); '' where the file names none."""

    @property
    def validated(self) -> bool:
        return self.median_relative_error is not None and self.p90_relative_error is not None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"regime": self.regime,
                                "median_relative_error": self.median_relative_error,
                                "p90_relative_error": self.p90_relative_error,
                                "rows": self.rows, "source": self.source,
                                "validated": self.validated, "min_rows": MIN_ROWS}
        if self.name:
            data["name"] = self.name
        if self.key is not None:
            data["regime_key"] = self.key.to_dict()
        if self.reason:
            data["reason"] = self.reason
        return data

    def text(self) -> str:
        """One line for a table: '±6 % median, ±19 % p90 (76 validated rows, A100-SXM4 / ...;
        NAME)' or 'no validated band for this regime: REASON'."""
        if self.median_relative_error is None or self.p90_relative_error is None:
            return f"no validated band for this regime: {self.reason}"
        return (f"±{100 * self.median_relative_error:.0f} % median, "
                f"±{100 * self.p90_relative_error:.0f} % p90 ({self.rows} validated "
                f"row{'s' if self.rows != 1 else ''}, {self.regime}"
                f"{'; ' + self.name if self.name else ''})")


def band_text(band: ErrorBand | None, short: bool = False) -> str:
    """A prediction's band for a table: its one line (`short`: '±21 % p90', or 'none' without a
    validated band), '-' for a prediction that carries none (built by hand)."""
    if band is None:
        return "-"
    if not short:
        return band.text()
    if band.p90_relative_error is None:
        return "none"
    return f"±{100 * band.p90_relative_error:.0f} % p90"


@lru_cache(maxsize=4)
def load_bands(path: str = str(DATA_FILE)) -> dict[str, Any]:
    """The stored bands ({} when the file is missing or not the expected format)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("format") == FORMAT else {}


_FIELDS = (("device", "device"), ("precision", "precision"), ("calibrated", "calibration"),
           ("aggregation", "aggregation"), ("zero_stage", "ZeRO stage"),
           ("parallel", "parallel dimensions"), ("bottleneck_class", "bottleneck class"))


def _value(regime: Regime, name: str) -> str:
    value = getattr(regime, name)
    if name == "calibrated":
        return "calibrated" if value else "uncalibrated"
    if name == "parallel":
        return "+".join(value) or "one device"
    return "none recorded" if value is None else str(value)


def _nearest_reason(regime: Regime, entries: dict[str, Any]) -> str:
    """Why nothing was measured for `regime`: the stored regime nearest to it (fewest differing
    fields; a band before a too-small record, then more rows) and how the two differ."""
    candidates = []
    for entry in entries.values():
        try:
            other = Regime.from_dict(entry["regime"])
        except (KeyError, TypeError, ValueError):
            continue
        differing = [(label, _value(other, name), _value(regime, name))
                     for name, label in _FIELDS if getattr(other, name) != getattr(regime, name)]
        rows = int(entry.get("rows", 0))
        candidates.append((len(differing), rows < MIN_ROWS, -rows, other.label, differing, entry))
    if not candidates:
        return "no validated rows were recorded when the bands were made"
    _, _, _, label, differing, entry = min(candidates, key=lambda c: c[:4])
    what = "; ".join(f"{name} ({theirs} there, {ours} here)" for name, theirs, ours in differing)
    rows = int(entry.get("rows", 0))
    return (f"nothing was measured in it; the nearest measured regime is {label} "
            f"({rows} row{'s' if rows != 1 else ''} of "
            f"{entry.get('name') or entry.get('source', '')}), which differs in {what}")


def band_for(regime: Regime, bands: dict[str, Any] | None = None) -> ErrorBand:
    """The error band of `regime`: the stored figures when at least MIN_ROWS rows of exactly
    that regime were validated, else None values and the reason."""
    if bands is None:
        return _stored_band(regime)
    return _lookup(regime, bands)


@lru_cache(maxsize=256)
def _stored_band(regime: Regime) -> ErrorBand:
    return _lookup(regime, load_bands())


def _lookup(regime: Regime, data: dict[str, Any]) -> ErrorBand:
    label = regime.label
    entries: dict[str, Any] = data.get("regimes") or {}
    source = str(data.get("source", ""))
    entry = entries.get(label)
    if not data:
        return ErrorBand(label, None, None, 0, "", f"no error-band data ({DATA_FILE.name} is "
                         "missing)", regime)
    if not entry:
        return ErrorBand(label, None, None, 0, "none measured", _nearest_reason(regime, entries),
                         regime)
    rows, where = int(entry.get("rows", 0)), str(entry.get("source", source))
    if not has_band(rows):
        return ErrorBand(label, None, None, rows, where,
                         f"only {rows} validated row{'s' if rows != 1 else ''} of this regime "
                         f"({entry.get('name') or where}); a p90 needs at least {MIN_ROWS}",
                         regime)
    return ErrorBand(label, float(entry["median_relative_error"]),
                     float(entry["p90_relative_error"]), rows, where, "", regime,
                     str(entry.get("name") or ""))


@dataclass(frozen=True)
class MeasuredRegime:
    """One regime of the stored bands as `dnnscale bands` lists it: its rows' error summary,
    whether that is a band (at least MIN_ROWS rows), and whose measurements they are."""

    regime: Regime
    rows: int
    median_relative_error: float
    p90_relative_error: float
    max_relative_error: float
    source: str
    name: str

    @property
    def validated(self) -> bool:
        return has_band(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"regime": self.regime.label, "regime_key": self.regime.to_dict(),
                "rows": self.rows, "validated": self.validated, "min_rows": MIN_ROWS,
                "median_relative_error": self.median_relative_error,
                "p90_relative_error": self.p90_relative_error,
                "max_relative_error": self.max_relative_error,
                "source": self.source, "name": self.name}


def measured_regimes(data: dict[str, Any] | None = None) -> list[MeasuredRegime]:
    """Every regime the stored bands record (`load_bands`, or `data`), by label: those with a
    band and those with too few rows alike; [] when there is no band file."""
    entries: dict[str, Any] = (load_bands() if data is None else data).get("regimes") or {}
    out = []
    for label in sorted(entries):
        entry = entries[label]
        out.append(MeasuredRegime(Regime.from_dict(entry["regime"]), int(entry["rows"]),
                                  float(entry["median_relative_error"]),
                                  float(entry["p90_relative_error"]),
                                  float(entry["max_relative_error"]),
                                  str(entry.get("source", "")), str(entry.get("name") or "")))
    return out


def band_of(system: System, plan: ParallelPlan, bottleneck: str) -> ErrorBand:
    """The band of a prediction of `plan` on `system` with `bottleneck` (what `predict_plan`
    attaches to every Prediction)."""
    return band_for(regime_for(system, plan, bottleneck))
