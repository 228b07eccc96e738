"""Re-predict the measurement corpus at the code's HEAD (issue 22: measure once, re-score
always). Nothing here runs anything on the testbed: every figure is the current model's
prediction of runs recorded in results/validation/corpus/<setting>/runs.jsonl, each with the
testbed description and calibration profile of the sitting that measured it.

- A row is a configuration of a setting's committed plan (or the optimizer's own choice,
  `opt-<workload>`): its measured throughput is the median over its usable repeats (finished,
  not busy), its per-phase seconds the median per phase, and its prediction the median over
  the sittings its repeats came from.
- Baselines (Paleo-style, Optimus) are fitted per setting and workload on the calibration rows
  only, as in the validation pipeline.
- Per split: median, p90 and max relative error of throughput; Kendall's τ-b within each
  setting and workload (the mean over those groups, weighted by rows; rankings across
  workloads say nothing), regret (within each group the row the model ranks first against the
  fastest measured; the worst group), and bias (the median of predicted over measured
  throughput: above 1 is optimistic).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnscale.plan import config_from_dict
from dnnscale.system import System
from dnnscale.validate.corpus import Plan, load_plan, read_runs, usable, workload_path
from dnnscale.validate.metrics import error_summary, kendall_tau, regret
from dnnscale.validate.reasons import REASON_THRESHOLD, phase_reason
from dnnscale.workload import Workload

EVALUATED = ("dev", "test")


SUPPLEMENT = "supplement.yaml"
"""A setting's supplementary calibration (benchmarks/corpus_supplement.py): what its sittings'
profiles did not measure yet, taken later on the same testbed setting and machine; later ones
(``supplement-<what>.yaml``) add operations the earlier did not measure."""
SUPPLEMENTS = "supplement*.yaml"
COLLECTIVE_CPU = "collective_cpu.yaml"
"""CPU per partition collective (format dnnscale-collective-cpu/1) at the corpus's top,
measured on loopback for the whole machine (benchmarks/collective_cpu_bench.py); a sitting's
profile's own figure wins for each operation it measured."""


@dataclass
class Sittings:
    """The System of each sitting of a setting: its description with the calibration profile
    (and the setting's supplement where the profile lacks what it holds)."""

    folder: Path
    systems: dict[int, System] = field(default_factory=dict)

    def system(self, sitting: int) -> System:
        if sitting not in self.systems:
            from dnnscale.testbed.describe import cluster_from_description, load_description
            from dnnscale.validate.profile import apply_profile

            desc = load_description(self.folder / f"testbed-s{sitting}.json")
            system = apply_profile(
                cluster_from_description(desc), self.folder / f"profile-s{sitting}.yaml", desc,
                sorted(self.folder.glob(SUPPLEMENTS)))
            cpu = self.folder.parent / COLLECTIVE_CPU
            if cpu.exists():  # the profile's own operations win, the corpus's fill the rest
                from dnnscale.system.profile import load_collective_cpu

                own = {fit[0] for fit in system.collective_cpu}
                system = dataclasses.replace(system, collective_cpu=system.collective_cpu + tuple(
                    fit for fit in load_collective_cpu(cpu) if fit[0] not in own))
            self.systems[sitting] = system
        return self.systems[sitting]


def predict_as_run(workload: Workload, system: System, config: Any,
                   conv_split: dict[str, str]) -> Any:
    """The prediction of `config` with the conv layers split as the run split them (the model's
    choice when the run was taken, which a later model may make differently: a run is
    compared with the price of what it did, not of another split)."""
    from dnnscale.model import predict_config, stage_costs

    if not conv_split or config.partitions <= 1:
        return predict_config(workload, system, config)
    stage = stage_costs(workload, system, config.partitions, config.minibatch,
                        config.fc_protocol, schemes=conv_split)
    return predict_config(workload, system, config, stage=stage)


def _workload_loader(root: Path) -> Callable[[str], Workload]:
    from dnnscale.workload import load_workload

    cache: dict[str, Workload] = {}

    def load(ref: str) -> Workload:
        if ref not in cache:
            cache[ref] = load_workload(workload_path(ref, root))
        return cache[ref]

    return load


def _median(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.median(items) if items else math.nan


def score_setting(folder: Path, plan: Plan, load: Callable[[str], Workload]) -> list[dict[str, Any]]:
    """Every row of one setting with at least one usable run, predicted at HEAD, each run as it
    ran (predict_as_run)."""
    from dnnscale.validate.baselines import OptimusBaseline, PaleoBaseline
    from dnnscale.validate.pipeline import conv_split_for, run_features

    sittings = Sittings(folder)
    planned = {row.id: row for row in plan.rows}
    by_id: dict[str, list[dict[str, Any]]] = {}
    for record in read_runs(folder):
        if usable(record):
            by_id.setdefault(record["id"], []).append(record)
    rows = []
    for row_id, records in by_id.items():
        row = planned.get(row_id)
        ref = row.workload if row else records[0]["workload"]
        split = row.split if row else records[0]["split"]
        config = row.config if row else config_from_dict(records[0]["config"])
        if row is not None and config.to_dict() != records[0]["config"]:
            raise ValueError(f"{folder.name}/{row_id}: runs.jsonl holds another configuration "
                             "than the plan; the plan must not change after measuring")
        workload = load(ref)
        ran: dict[tuple[int, tuple[tuple[str, str], ...]], Any] = {}
        per_run = []
        for r in records:  # each run priced as it ran: its sitting's system, its conv split
            key = (int(r["sitting"]), tuple(sorted(r.get("conv_split", {}).items())))
            if key not in ran:
                ran[key] = predict_as_run(workload, sittings.system(key[0]), config,
                                          dict(key[1]))
            per_run.append(ran[key])
        first = per_run[0]
        system = sittings.system(min(k[0] for k in ran))
        measured = [float(r["measured_throughput_samples_per_s"]) for r in records]
        phases = {name: _median(r["per_phase_s"].get(name, 0.0) for r in records)
                  for name in records[0]["per_phase_s"]}
        predicted = _median(p.throughput_samples_per_s for p in per_run)
        m = statistics.median(measured)
        item: dict[str, Any] = {
            "setting": folder.name, "id": row_id, "workload": workload.name, "workload_ref": ref,
            "split": split, "group": row.group if row else "", "config": config.to_dict(),
            "label": config.label(), "repeats": len(records),
            "sittings": sorted({k[0] for k in ran}),
            "measured_throughput_samples_per_s": m,
            "measured_spread": (max(measured) - min(measured)) / m,
            "measured": {"per_phase_s": phases},
            "foreign_cpu_cores_max": max(float(r.get("foreign_cpu_cores", 0.0)) for r in records),
            "load_before_max": max(float(r.get("load_before", [0.0])[0]) for r in records),
            "predicted_throughput_samples_per_s": predicted,
            "predicted_bottleneck": first.bottleneck,
            "predicted_breakdown_s": first.breakdown_s,
            "regime_key": (first.error_band.key.to_dict()
                           if first.error_band and first.error_band.key else None),
            "relative_error": abs(predicted - m) / m, "ratio": predicted / m,
            "split_changed": conv_split_for(workload, system, config) != records[0].get(
                "conv_split", {}),
            "_features": run_features(workload, system, config)}
        if item["relative_error"] > REASON_THRESHOLD:
            item["reason"] = phase_reason(item)
        rows.append(item)
    for ref in {r["workload_ref"] for r in rows}:
        group = [r for r in rows if r["workload_ref"] == ref]
        calibration = [r for r in group if r["split"] == "calibration"]
        if len(calibration) < 2:
            continue
        feats = [r["_features"] for r in calibration]
        xs = [r["measured_throughput_samples_per_s"] for r in calibration]
        for name, model in (("paleo", PaleoBaseline.fit(feats, xs)),
                            ("optimus", OptimusBaseline.fit(feats, xs))):
            for r in group:
                value = model.throughput(r["_features"])
                r[f"{name}_predicted_samples_per_s"] = value
                m = r["measured_throughput_samples_per_s"]
                r[f"{name}_relative_error"] = abs(value - m) / m
                r[f"{name}_ratio"] = value / m
    for r in rows:
        del r["_features"]
    return sorted(rows, key=lambda r: r["id"])


def _groups(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["setting"], r["workload"]), []).append(r)
    return groups


def figures(rows: list[dict[str, Any]], prefix: str = "") -> dict[str, Any]:
    """Error, ranking and bias figures of `rows` for the model (prefix '') or a baseline
    ('paleo_' / 'optimus_')."""
    predicted_key = (f"{prefix}predicted_samples_per_s" if prefix
                     else "predicted_throughput_samples_per_s")
    rows = [r for r in rows if predicted_key in r]
    out: dict[str, Any] = {"configs": len(rows),
                           **error_summary([r[f"{prefix}relative_error"] for r in rows])}
    taus, weights, regrets = [], [], []
    for group in _groups(rows).values():
        predicted = [r[predicted_key] for r in group]
        measured = [r["measured_throughput_samples_per_s"] for r in group]
        if len(group) >= 3:
            tau = kendall_tau(predicted, measured)
            if not math.isnan(tau):
                taus.append(tau)
                weights.append(len(group))
        if len(group) >= 2:
            chosen = max(group, key=lambda r: r[predicted_key])
            regrets.append(regret(1 / chosen["measured_throughput_samples_per_s"],
                                  1 / max(measured)))
    out["kendall_tau"] = (sum(t * w for t, w in zip(taus, weights)) / sum(weights)
                          if taus else math.nan)
    out["regret"] = max(regrets) if regrets else math.nan
    out["bias"] = _median(r[f"{prefix}ratio"] for r in rows)
    out["optimistic_rows"] = sum(r[f"{prefix}ratio"] > 1 for r in rows)
    return out


def split_block(rows: list[dict[str, Any]]) -> dict[str, Any]:
    block = figures(rows)
    for name in ("optimus", "paleo"):
        block[name] = figures(rows, f"{name}_")
    return block


def optimizer_block(rows: list[dict[str, Any]], optimizer_files: dict[str, dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """Per setting and workload: the optimizer's choice made when the setting was measured,
    its measured throughput, and its regret against every row measured there."""
    out = []
    for setting, chosen in sorted(optimizer_files.items()):
        for short, item in sorted(chosen.items()):
            group = [r for r in rows if r["setting"] == setting
                     and r["workload_ref"] == item["workload"]]
            ids = item.get("in_plan") or [f"opt-{short}"]
            mine = [r for r in group if r["id"] in ids]
            if not group or not mine:
                continue
            best = max(group, key=lambda r: r["measured_throughput_samples_per_s"])
            out.append({"setting": setting, "workload": mine[0]["workload"],
                        "row": mine[0]["id"], "label": mine[0]["label"],
                        "measured_throughput_samples_per_s":
                            mine[0]["measured_throughput_samples_per_s"],
                        "relative_error": mine[0]["relative_error"],
                        "best_row": best["id"], "best_label": best["label"],
                        "regret": regret(1 / mine[0]["measured_throughput_samples_per_s"],
                                         1 / best["measured_throughput_samples_per_s"])})
    return out


def mechanism_block(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each Adam-mechanism pair (rows `…-mNa` and `…-mNb`): measured and predicted speed-up of
    b over a."""
    out = []
    by_group: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r["group"]:
            by_group.setdefault((r["setting"], r["group"]), {})[r["id"][-1]] = r
    for (setting, group), pair in sorted(by_group.items()):
        if set(pair) != {"a", "b"}:
            continue
        a, b = pair["a"], pair["b"]
        measured = b["measured_throughput_samples_per_s"] / a["measured_throughput_samples_per_s"]
        predicted = b["predicted_throughput_samples_per_s"] / a["predicted_throughput_samples_per_s"]
        out.append({"setting": setting, "group": group, "split": a["split"],
                    "a": a["label"], "b": b["label"], "measured_speedup": measured,
                    "predicted_speedup": predicted,
                    "speedup_relative_error": abs(predicted - measured) / measured})
    return out


def rescore(corpus: Path, plans: Path, root: Path) -> dict[str, Any]:
    """The summary of the whole corpus (see the module's docstring)."""
    import json

    load = _workload_loader(root)
    rows: list[dict[str, Any]] = []
    runs = busy = 0
    optimizer_files = {}
    for folder in sorted(p for p in corpus.iterdir() if (p / "runs.jsonl").is_file()):
        plan = load_plan(plans / f"{folder.name}.yaml")
        records = read_runs(folder)
        runs += sum(usable(r) for r in records)
        busy += sum(bool(r.get("busy")) for r in records)
        rows += score_setting(folder, plan, load)
        if (folder / "optimizer.json").is_file():
            optimizer_files[folder.name] = json.loads((folder / "optimizer.json").read_text())
    evaluated = [r for r in rows if r["split"] in EVALUATED]
    settings = sorted({r["setting"] for r in rows})
    summary: dict[str, Any] = {
        "corpus": {"configs": len(rows), "settings": len(settings), "runs": runs,
                   "busy_runs_discarded": busy,
                   "complete_configs": sum(r["repeats"] >= 3 for r in rows)},
        "splits": {split: split_block([r for r in rows if r["split"] == split])
                   for split in EVALUATED},
        "per_setting": [{"setting": s, "split": split,
                         **figures([r for r in evaluated if r["setting"] == s
                                    and r["split"] == split])}
                        for s in settings for split in EVALUATED],
        "optimizer": optimizer_block(rows, optimizer_files),
        "mechanisms": mechanism_block(rows),
        "split_changed_rows": sum(r["split_changed"] for r in evaluated),
        "test_rows_over_reason_threshold": [
            {k: r[k] for k in ("setting", "id", "label", "workload", "relative_error", "reason")}
            for r in rows if r["split"] == "test" and r["relative_error"] > REASON_THRESHOLD],
    }
    return {"summary": summary, "rows": rows}
