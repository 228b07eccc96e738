"""Run records: JSONL lines written as they happen, and the end-of-run summary (no torch).

Every rank appends to the same file; each record is one `os.write` of one line to a descriptor
opened with O_APPEND, so lines from different ranks never interleave and a killed rank leaves
only whole lines behind.

Record types: "start" (one per rank: pid, role, host), "step" (one per worker per step), "ps"
(one per shard at the end), "summary" (rank 0, at the end; asynchronous runs add the measured
"epoch"), "error" (the launcher, on a fault).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from dnnscale.jsonout import dumps

PHASES = ("compute", "partition_comm", "ps_push", "ps_pull", "allreduce")


class JsonlWriter:
    """Append JSON records, one line each, flushed by the kernel as they are written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """One record as one line of strict JSON (a NaN loss is written as null)."""
        os.write(self._fd, (dumps(record, indent=None) + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a run file, in file order."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def worker_totals(step_records: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """One worker's aggregates from its own step records (all of one rank, in step order).

    Steps before `warmup` are excluded from the timing window and phase sums; the window runs
    from the start of step `warmup` to the end of the last step (perf_counter, this rank's clock).
    """
    timed = [record for record in step_records if record["step"] >= warmup]
    first, last = step_records[0], step_records[-1]
    window_s = (timed[-1]["t_end_s"] - timed[0]["t_start_s"]) if timed else 0.0
    totals = {
        "rank": first["rank"], "replica": first["replica"], "partition": first["partition"],
        "loss_first": _loss(step_records[0]), "loss_last": _loss(step_records[-1]),
        "timed_steps": len(timed), "timed_samples": sum(r["samples"] for r in timed),
        "window_s": window_s,
        "phase_sums_s": {phase: sum(r[f"{phase}_s"] for r in timed) for phase in PHASES + ("step",)},
    }
    if "epoch_target_steps" in last:  # the epoch cut-off ran (worker.EpochCutoff)
        totals["epoch"] = {"target_steps": last["epoch_target_steps"],
                           "steps_done": last.get("epoch_steps_done"),
                           "over": bool(last.get("epoch_over"))}
    return totals


def epoch_summary(leaders: list[dict[str, Any]], minibatch: int) -> dict[str, Any]:
    """The measured epoch of an asynchronous run, from each replica's partition-0 totals.

    The epoch is the timed steps (after warm-up). With the cut-off (epoch_fraction < 1) it ends
    when the replicas' step count reaches the target: its time is the timing window of the
    replica whose step reached it (each replica on its own clock, all starting together after
    the start barrier); the other replicas stop after their step in flight. Without it, the
    epoch ends when the slowest replica finishes: the longest window. replica_spread: the
    standard deviation of ln(mean step time) over the replicas (what the model's straggler term
    reads, model/stragglers.py).
    """
    mean_step_s = [w["window_s"] / w["timed_steps"] for w in leaders if w["timed_steps"]]
    crossing = [w for w in leaders if "epoch" in w
                and w["epoch"]["steps_done"] == w["epoch"]["target_steps"]]
    if crossing:
        target = crossing[0]["epoch"]["target_steps"]
        time_s = crossing[0]["window_s"]
    else:
        target = sum(w["timed_steps"] for w in leaders)
        time_s = max((w["window_s"] for w in leaders), default=0.0)
    return {"cut_off": bool(crossing), "target_steps": target, "samples": target * minibatch,
            "epoch_time_s": time_s,
            "throughput_samples_per_s": target * minibatch / time_s if time_s > 0 else 0.0,
            "steps_by_replica": {str(w["replica"]): w["timed_steps"] for w in leaders},
            "replica_mean_step_s": {str(w["replica"]): w["window_s"] / w["timed_steps"]
                                    for w in leaders if w["timed_steps"]},
            "replica_spread": log_spread(mean_step_s)}


def log_spread(seconds: list[float]) -> float:
    """Standard deviation of ln(t) over a list of positive times (0 for fewer than two)."""
    logs = [math.log(t) for t in seconds if t > 0]
    if len(logs) < 2:
        return 0.0
    mean = sum(logs) / len(logs)
    return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def _loss(record: dict[str, Any]) -> float:
    """A step's loss; null in the file (a diverged, non-finite loss) reads as NaN."""
    loss = record["loss"]
    return float("nan") if loss is None else loss


def summarize(workers: list[dict[str, Any]], *, config: dict[str, Any], workload: str,
              hosts: list[str], torch_version: str, steps: int, warmup: int,
              shards: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary record from every worker's `worker_totals` and every shard's record.

    measured_throughput_samples_per_s = Σ over replicas of timed samples / timing window, read
    on the replica's partition-0 worker (each replica's clock is its own; no clock sync needed).
    loss_first / loss_last: mean over replicas. per_phase_s: mean seconds per timed step, over
    all workers.
    """
    leaders = [w for w in workers if w["partition"] == 0]
    throughput = sum(w["timed_samples"] / w["window_s"] for w in leaders if w["window_s"] > 0)
    per_phase: dict[str, float] = {}
    for phase in ("step",) + PHASES:
        values = [w["phase_sums_s"][phase] / w["timed_steps"] for w in workers if w["timed_steps"]]
        per_phase[phase] = sum(values) / len(values) if values else 0.0
    summary = {
        "type": "summary", "config": config, "workload": workload, "hosts": hosts,
        "torch_version": torch_version,
        "measured_throughput_samples_per_s": throughput,
        "steps": steps, "warmup": warmup,
        "loss_first": sum(w["loss_first"] for w in leaders) / len(leaders),
        "loss_last": sum(w["loss_last"] for w in leaders) / len(leaders),
        "per_phase_s": per_phase,
        "shards": shards,
    }
    if config.get("sync") == "ps-async":
        summary["epoch"] = epoch_summary(leaders, int(config.get("minibatch", 0)))
    return summary


SUMMARY_KEYS = ("config", "workload", "measured_throughput_samples_per_s", "steps", "loss_first",
                "loss_last", "per_phase_s")
