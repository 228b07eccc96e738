"""Pilot: Adam's FC vector protocol against weight pushes, measured on loopback (`run --local`).

Runs the PS-network-bound pair of the issue-18 grids (P=1 R=3 S=1 ps-async, n=8, pulls every
2 steps) on both benchmarks, and a case that is PS bound even on loopback (mlp 2048-2048-2048-10,
33 MB of weights per push against 0.2 GFLOP of compute per step: P=1 R=2 S=1, n=4), with each
protocol, alternating, `--repeats` times; writes the measured throughputs, the load average
before and after, and the model's prediction for the local preset next to them to
results/adam-mechanisms/pilot-vectors.json. On loopback the grids' pair is compute bound (the
"network" is memory copies), so only the third case can show the protocol's advantage here.

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
    args = parser.parse_args()
    dnnscale = str(Path(sys.executable).parent / "dnnscale")
    out: dict[str, object] = {"steps": args.steps, "warmup": 3,
                              "load_before": _load(), "cpus": os.cpu_count(), "workloads": {}}
    from dnnscale.model import predict_config
    from dnnscale.plan import Config
    from dnnscale.system import load_system
    from dnnscale.workload import load_workload

    for workload, case in CASES:
        measured: dict[str, list[float]] = {"weights": [], "vectors": []}
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
                measured[protocol].append(
                    json.loads(result.stdout)["measured_throughput_samples_per_s"])
        w = load_workload(workload)
        predicted = {p: predict_config(w, load_system("local"), Config(
            **case, fc_protocol=p)).throughput_samples_per_s for p in measured}
        median = {p: statistics.median(v) for p, v in measured.items()}
        out["workloads"][workload] = {  # type: ignore[index]
            "config": case, "measured_samples_per_s": measured, "median": median,
            "measured_speedup": median["vectors"] / median["weights"],
            "predicted_local_preset": predicted,
            "predicted_speedup": predicted["vectors"] / predicted["weights"]}
        print(workload, json.dumps(out["workloads"][workload]))  # type: ignore[index]
    out["load_after"] = _load()
    path = Path("results/adam-mechanisms/pilot-vectors.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"load average before {out['load_before']}, after {out['load_after']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
