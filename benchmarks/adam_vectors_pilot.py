"""Pilot: Adam's FC vector protocol against weight pushes, measured on loopback (`run --local`).

Runs the PS-network-bound pair of the issue-18 grids (P=1 R=3 S=1 ps-async, n=8, pulls every
2 steps) on both benchmarks, and cases that are PS bound even on loopback (mlp 2048-2048-2048-10,
33 MB of weights per push against 0.2 GFLOP of compute per step: P=1 R=2 or 1, S=1, n=4), with each
protocol, alternating, `--repeats` times; writes the measured throughputs, the load average
before and after, and the model's prediction for the local preset next to them to
results/adam-mechanisms/pilot-vectors.json, with each run's worker time in push + pull per step
and the busiest shard's busy time per step. On loopback the grids' pair is compute bound (the
"network" is memory copies), so there the advantage shows in the PS times, not the throughput.

    .venv/bin/python benchmarks/adam_vectors_pilot.py [--repeats 3] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

GRID_PAIR = {"partitions": 1, "replicas": 3, "ps_shards": 1, "minibatch": 8, "pull_every": 2}
CASES = (("adam-cifar10", GRID_PAIR),
         ("benchmarks/validation/adam-imagenet22k-small.yaml", GRID_PAIR),
         ("mlp:2048-2048-2048-10", {"partitions": 1, "replicas": 2, "ps_shards": 1,
                                    "minibatch": 4, "pull_every": 1}),
         ("mlp:2048-2048-2048-10", {"partitions": 1, "replicas": 1, "ps_shards": 1,
                                    "minibatch": 4, "pull_every": 1}))


def _flags(case: dict[str, int]) -> list[str]:
    return ["-P", str(case["partitions"]), "-R", str(case["replicas"]), "-S",
            str(case["ps_shards"]), "--sync", "ps-async", "-n", str(case["minibatch"]),
            "--pull-every", str(case["pull_every"])]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--cases", default=",".join(str(i) for i in range(len(CASES))),
                        help="which cases to run, by index (default all)")
    parser.add_argument("-o", "--output", default="results/adam-mechanisms/pilot-vectors.json")
    args = parser.parse_args()
    chosen = [CASES[int(i)] for i in args.cases.split(",")]
    dnnscale = str(Path(sys.executable).parent / "dnnscale")
    out: dict[str, object] = {"steps": args.steps, "warmup": 3,
                              "load_before": _load(), "cpus": os.cpu_count(), "workloads": {}}
    from dnnscale.model import predict_config
    from dnnscale.plan import Config
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    for workload, case in chosen:
        measured: dict[str, list[float]] = {"weights": [], "vectors": []}
        ps_s: dict[str, list[float]] = {"weights": [], "vectors": []}
        shard_busy_s: dict[str, list[float]] = {"weights": [], "vectors": []}
        for _ in range(args.repeats):
            for protocol in measured:
                result = subprocess.run(
                    [dnnscale, "run", "-w", workload, *_flags(case), "--fc-protocol", protocol,
                     "--steps", str(args.steps), "--warmup", "3", "--lr", "0.05", "--local",
                     "--timeout", "300", "--json"],
                    capture_output=True, text=True, timeout=900,
                    env={**os.environ, "OMP_NUM_THREADS": "1"})
                if result.returncode != 0:
                    print(result.stderr, file=sys.stderr)
                    return 1
                summary = json.loads(result.stdout)
                measured[protocol].append(summary["measured_throughput_samples_per_s"])
                phases = summary["per_phase_s"]
                ps_s[protocol].append(phases["ps_push"] + phases["ps_pull"])
                shard_busy_s[protocol].append(max(s["busy_s"] for s in summary["shards"])
                                              / args.steps)
        w = load_workload(workload)
        predicted = {p: predict_config(w, load_system("local"), Config(
            **case, fc_protocol=p)).throughput_samples_per_s for p in measured}
        median = {p: statistics.median(v) for p, v in measured.items()}
        key = f"{workload} P={case['partitions']} R={case['replicas']} S={case['ps_shards']}"
        out["workloads"][key] = {  # type: ignore[index]
            "config": case, "measured_samples_per_s": measured,
            "worker_ps_push_plus_pull_s_per_step": ps_s,
            "shard_busy_s_per_step": shard_busy_s,
            "median_worker_ps_s": {p: statistics.median(v) for p, v in ps_s.items()},
            "median_shard_busy_s": {p: statistics.median(v) for p, v in shard_busy_s.items()}, "median": median,
            "measured_speedup": median["vectors"] / median["weights"],
            "predicted_local_preset": predicted,
            "predicted_speedup": predicted["vectors"] / predicted["weights"]}
        print(key, json.dumps(out["workloads"][key]))  # type: ignore[index]
    out["load_after"] = _load()
    path = Path(args.output)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average before {out['load_before']}, after {out['load_after']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
