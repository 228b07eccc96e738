"""Run one configuration for real on the testbed, several times, and summarise what was measured."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnscale.plan import Config


@dataclass(frozen=True)
class Measurement:
    """Throughput of each repeat (samples/s) and the median per-phase seconds per step."""

    config: Config
    throughputs: tuple[float, ...]
    per_phase_s: dict[str, float] = field(default_factory=dict)
    loss_first: float = float("nan")
    loss_last: float = float("nan")

    @property
    def throughput(self) -> float:
        """Median over repeats."""
        return statistics.median(self.throughputs)

    @property
    def spread(self) -> float:
        """(max − min) / median over repeats."""
        return (max(self.throughputs) - min(self.throughputs)) / self.throughput

    def observed_bottleneck(self) -> str:
        """The phase that took the most worker time per step, in the model's words."""
        phases = self.per_phase_s
        named = {"worker compute": phases.get("compute", 0.0),
                 "partition communication": phases.get("partition_comm", 0.0),
                 "ps transfer": phases.get("ps_push", 0.0) + phases.get("ps_pull", 0.0),
                 "allreduce network": phases.get("allreduce", 0.0)}
        return max(named.items(), key=lambda item: item[1])[0]

    def to_dict(self) -> dict[str, Any]:
        return {"throughputs_samples_per_s": list(self.throughputs),
                "throughput_samples_per_s": self.throughput, "spread": self.spread,
                "per_phase_s": self.per_phase_s, "loss_first": self.loss_first,
                "loss_last": self.loss_last, "observed_bottleneck": self.observed_bottleneck()}


def _recorded_summary(path: Path, config: Config, conv_split: dict[str, str]) -> dict | None:
    """The summary record of an earlier run of the same configuration and splits, if any."""
    from dnnscale.runtime.records import read_records

    if not path.is_file():
        return None
    summaries = [r for r in read_records(str(path)) if r.get("type") == "summary"]
    if not summaries or summaries[-1].get("config") != config.to_dict():
        return None
    split = summaries[-1].get("conv_split")
    return summaries[-1] if split is None or split == conv_split else None


def measure(workload: str, config: Config, testbed: Any, conv_split: dict[str, str],
            repeats: int, steps: int, warmup: int, timeout_s: float, lr: float,
            run_dir: Path, label: str, reuse: bool = False) -> Measurement:
    """Run `config` `repeats` times on `testbed` (a TestbedDescription), JSONL per run in
    `run_dir`; raises runtime.launch.RunFailed when a run fails. With `reuse`, a repeat whose
    JSONL already holds the summary of the same configuration and splits is read, not re-run."""
    from dnnscale.runtime.job import RunSpec
    from dnnscale.runtime.launch import launch
    from dnnscale.runtime.layout import rank_roles
    from dnnscale.testbed.describe import rank_placements

    roles = [role.kind for role in rank_roles(config)]
    summaries: list[dict] = []
    for repeat in range(repeats):
        path = run_dir / f"{label}-r{repeat + 1}.jsonl"
        recorded = _recorded_summary(path, config, conv_split) if reuse else None
        if recorded is not None:
            summaries.append(recorded)
            continue
        spec = RunSpec(workload=workload, config=config.to_dict(), steps=steps, warmup=warmup,
                       timeout_s=timeout_s, output=str(run_dir / f"{label}-r{repeat + 1}.jsonl"),
                       lr=lr, seed=repeat, conv_split=dict(conv_split))
        placements = list(rank_placements(testbed, len(roles), roles=roles, join_late=True))
        summaries.append(launch(spec, placements))
    phases = {name: statistics.median(s["per_phase_s"].get(name, 0.0) for s in summaries)
              for name in summaries[0]["per_phase_s"]}
    return Measurement(config=config,
                       throughputs=tuple(float(s["measured_throughput_samples_per_s"])
                                         for s in summaries),
                       per_phase_s=phases, loss_first=float(summaries[0]["loss_first"]),
                       loss_last=float(summaries[0]["loss_last"]))
