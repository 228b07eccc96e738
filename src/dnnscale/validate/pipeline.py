"""The validation experiment: predict and run every configuration of a grid on the testbed,
fit the baselines on the calibration runs, compare, and check the optimizer's choice (regret)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnscale.system import System
from dnnscale.plan import Config, check_config
from dnnscale.model import predict_config, stage_costs
from dnnscale.validate.baselines import OptimusBaseline, PaleoBaseline, RunFeatures
from dnnscale.validate.grid import Grid
from dnnscale.validate.measure import Measurement, measure
from dnnscale.validate.metrics import error_summary, kendall_tau, regret, relative_errors
from dnnscale.validate.reasons import REASON_THRESHOLD, phase_reason
from dnnscale.workload import Workload, load_workload

Progress = Callable[[str], None]


def conv_split_for(workload: Workload, cluster: System, config: Config) -> dict[str, str]:
    """The split the model chose for each conv layer, so the run does what was predicted."""
    costs = stage_costs(workload, cluster, config.partitions, config.minibatch,
                        config.fc_protocol)
    return {c.name: c.scheme for c in costs.layers if c.kind == "conv2d"}


def run_features(workload: Workload, cluster: System, config: Config) -> RunFeatures:
    """What the baselines may know: FLOPs and bytes one worker handles per step."""
    costs = stage_costs(workload, cluster, config.partitions, config.minibatch,
                        config.fc_protocol)
    flops = sum(config.minibatch * c.work_fraction * layer.train_flops
                for c, layer in zip(costs.layers, workload.layers))
    share = workload.params * workload.bytes_per_value / config.partitions
    if config.sync == "allreduce":
        comm = 2 * (config.replicas - 1) / config.replicas * share
    else:
        comm = share / config.push_every + share / config.pull_every
    return RunFeatures(sync=config.sync, replicas=config.replicas, ps_shards=config.ps_shards,
                       minibatch=config.minibatch, flops_per_worker=flops,
                       bytes_per_worker=costs.partition_bytes + comm)


def _label(config: Config) -> str:
    ps = f"S={config.ps_shards}" if config.uses_ps else "AR"
    return f"P={config.partitions} R={config.replicas} {ps} {config.sync}"


def validate(workload_ref: str, cluster: System, testbed: Any, grid: Grid, run_dir: Path,
             progress: Progress = lambda _: None, network_label: str = "",
             optimizer: bool = True, reuse: bool = False) -> dict[str, Any]:
    """Predict and run every configuration; return the result record (see report.py)."""
    workload = load_workload(workload_ref)
    run_dir.mkdir(parents=True, exist_ok=True)
    measured: dict[Config, Measurement] = {}

    def run(config: Config, label: str) -> Measurement:
        if config not in measured:
            check_config(config, workload, cluster)
            progress(f"running {label}: {_label(config)}")
            measured[config] = measure(workload_ref, config, testbed,
                                       conv_split_for(workload, cluster, config), grid.repeats,
                                       grid.steps, grid.warmup, grid.timeout_s, grid.lr, run_dir,
                                       label, reuse=reuse)
        return measured[config]

    calibration = [(f"k{i + 1:02d}", c) for i, c in enumerate(grid.calibration)]
    validation = [(f"c{i + 1:02d}", c) for i, c in enumerate(grid.configs)]
    for label, config in calibration + validation:
        run(config, label)

    paleo = optimus = None
    if len(calibration) >= 2:
        feats = [run_features(workload, cluster, c) for _, c in calibration]
        xs = [measured[c].throughput for _, c in calibration]
        paleo, optimus = PaleoBaseline.fit(feats, xs), OptimusBaseline.fit(feats, xs)

    def row_of(label: str, kind: str, config: Config) -> dict[str, Any]:
        prediction = predict_config(workload, cluster, config)
        m = measured[config]
        row: dict[str, Any] = {
            "id": label, "set": kind, "label": _label(config), "config": config.to_dict(),
            "machines": config.machines,
            "predicted_throughput_samples_per_s": prediction.throughput_samples_per_s,
            "predicted_bottleneck": prediction.bottleneck,
            "regime": prediction.error_band.regime if prediction.error_band else "",
            "regime_key": (prediction.error_band.key.to_dict()
                           if prediction.error_band and prediction.error_band.key else None),
            "predicted_breakdown_s": prediction.breakdown_s, "measured": m.to_dict(),
            "relative_error": relative_errors([prediction.throughput_samples_per_s],
                                              [m.throughput])[0]}
        if row["relative_error"] > REASON_THRESHOLD:
            row["reason"] = phase_reason(row)
        if paleo is not None and optimus is not None:
            feats = run_features(workload, cluster, config)
            for name, model in (("paleo", paleo), ("optimus", optimus)):
                value = model.throughput(feats)
                row[f"{name}_predicted_samples_per_s"] = value
                row[f"{name}_relative_error"] = abs(value - m.throughput) / m.throughput
        return row

    rows = [row_of(label, "calibration" if label.startswith("k") else "validation", config)
            for label, config in calibration + validation]
    result: dict[str, Any] = {"workload": workload.name, "network": network_label,
                              "repeats": grid.repeats, "steps": grid.steps, "warmup": grid.warmup,
                              "rows": rows}
    regret_value = float("nan")
    if optimizer:
        result["optimizer"] = _optimizer_regret(workload, cluster, grid, validation, run, rows,
                                                lambda config: row_of("opt", "optimizer", config))
        regret_value = result["optimizer"]["regret"]
    # The optimizer's choice is validated like any other configuration.
    validated = [r for r in rows if r["set"] in ("validation", "optimizer")]
    measured_x = [r["measured"]["throughput_samples_per_s"] for r in validated]
    summary: dict[str, Any] = {
        "configs": len(validated),
        **error_summary([r["relative_error"] for r in validated]),
        "kendall_tau": kendall_tau([r["predicted_throughput_samples_per_s"] for r in validated],
                                   measured_x),
        "baselines": {}}
    for name in ("paleo", "optimus"):
        if validated and f"{name}_relative_error" in validated[0]:
            summary["baselines"][name] = {
                **error_summary([r[f"{name}_relative_error"] for r in validated]),
                "kendall_tau": kendall_tau([r[f"{name}_predicted_samples_per_s"]
                                            for r in validated], measured_x)}
    summary["regret"] = regret_value
    summary["rows_over_reason_threshold"] = sum(r["relative_error"] > REASON_THRESHOLD
                                                for r in validated)
    result["summary"] = summary
    return result


def _optimizer_regret(workload: Workload, cluster: System, grid: Grid,
                      validation: list[tuple[str, Config]], run: Callable[[Config, str], Measurement],
                      rows: list[dict[str, Any]],
                      row_of: Callable[[Config], dict[str, Any]]) -> dict[str, Any]:
    """Run the optimizer for the testbed's budget (its dedicated PS hosts kept apart), run its
    choice too, add it as a row of its own unless the grid has it, and compare it with the
    best configuration measured (regret on throughput, i.e. on epoch time)."""
    from dnnscale.optimize import optimize

    base = grid.configs[0]
    result = optimize(workload, cluster, machines=cluster.machines, top=1,
                      minibatch=base.minibatch, base=base, curve=False)
    chosen = result.best.config
    chosen_m = run(chosen, "opt")
    candidates = [(c, run(c, label)) for label, c in validation] + [(chosen, chosen_m)]
    best_config, best_m = max(candidates, key=lambda item: item[1].throughput)
    in_grid = any(row["set"] == "validation" and row["config"] == chosen.to_dict()
                  for row in rows)
    if not in_grid:
        rows.append(row_of(chosen))
    return {"machines": cluster.machines, "ps_machines": cluster.ps_machines,
            "label": _label(chosen), "config": chosen.to_dict(), "in_grid": in_grid,
            "predicted_throughput_samples_per_s": result.best.throughput_samples_per_s,
            "measured_throughput_samples_per_s": chosen_m.throughput,
            "best_label": _label(best_config), "best_config": best_config.to_dict(),
            "best_measured_throughput_samples_per_s": best_m.throughput,
            "regret": regret(1 / chosen_m.throughput, 1 / best_m.throughput)}
