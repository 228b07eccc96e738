"""Asynchronous replicas contending at a parameter-server shard (issue 22, mechanism "pulls
from several replicas contending at a shard"): a microbenchmark on one corpus setting's testbed,
no training run.

    .venv/bin/python benchmarks/ps_queue_bench.py 1gbit           # as root, machine quiet

For each shard count S, CPU chunk Z (a worker's compute) and replica count R (R + S <= hosts),
calibrate/psqueue.py runs R workers looping (chunk, push, pull) against S ps-async shards of the
runtime (runtime/ps.py) and measures the workers' mean step. Against it, from the step measured
at R = 1 (T_1) and the busiest shard's service per replica step as the model prices it
(D = ceil(W/S)/W · (push + pull bytes) / B, B the links' rate `testbed check` measured):

- bound: max(T_1, R·D), the step before issue 22 (a shard below capacity delays nobody);
- queue: model/ps.ps_queueing_cycle_s(R, T_1 − D, D), the queue the model prices.

Writes results/validation/ps_queue/<setting>.json (with the load average before and after);
`--rescore` re-predicts a committed file's measurements with the current formula.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.corpus import load_settings  # noqa: E402

BIN = ROOT / ".venv" / "bin"
OUT = ROOT / "results" / "validation" / "ps_queue"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("setting")
    parser.add_argument("--settings", type=Path, default=ROOT / "benchmarks/corpus/settings.yaml")
    parser.add_argument("--sizes", default="4194304", help="bytes pushed and pulled per step")
    parser.add_argument("--chunks-ms", default="0,10", help="CPU ms of compute per step")
    parser.add_argument("--shards", default="1,2")
    parser.add_argument("--max-replicas", type=int, default=4)
    parser.add_argument("--window-s", type=int, default=6)
    parser.add_argument("--rescore", action="store_true",
                        help="re-predict the committed measurements (no testbed, no timing)")
    args = parser.parse_args()
    if args.rescore:
        result = score(json.loads((OUT / f"{args.setting}.json").read_text()))
        for point in result["points"]:
            print(line(point))
        return write(result)
    setting = load_settings(args.settings)[args.setting]
    from dnnscale.calibrate.network import run_ranks
    from dnnscale.model.ps import busiest_shard_share
    from dnnscale.testbed.describe import (cluster_from_description, description_path,
                                           load_description, rank_placements)

    sizes = [int(s) for s in args.sizes.split(",")]
    chunks = [float(c) / 1e3 for c in args.chunks_ms.split(",")]
    subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                   stdout=subprocess.DEVNULL)
    result = {"setting": setting.name, "description": setting.description,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_before": list(os.getloadavg()), "window_s": args.window_s, "points": []}
    started = time.monotonic()
    try:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "up", *setting.up_flags()],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([str(BIN / "dnnscale"), "testbed", "check", "--name", setting.testbed,
                        "--no-cpu"], check=False, stdout=subprocess.DEVNULL)
        desc = load_description(description_path(setting.testbed))
        system = cluster_from_description(desc)
        bandwidth = system.ps_net.bandwidth_bytes_per_s
        result["ps_bandwidth_bytes_per_s"] = bandwidth
        hosts = len(desc.hosts)
        for shards in [int(s) for s in args.shards.split(",")]:
            for chunk in chunks:
                for replicas in range(1, args.max_replicas + 1):
                    if replicas + shards > hosts:
                        break
                    placements = rank_placements(desc, replicas + shards,
                                                 roles=["worker"] * replicas + ["ps"] * shards,
                                                 join_late=True)
                    points = run_ranks(placements, str(shards), sizes, args.window_s,
                                       timeout_s=600, extra=chunk,
                                       module="dnnscale.calibrate.psqueue")
                    for size, mean_s, slowest_s, chunk_s in points:
                        values = int(size) // 4
                        item = {"shards": shards, "replicas": replicas, "chunk_cpu_s": chunk,
                                "bytes": int(size), "step_s": mean_s, "slowest_step_s": slowest_s,
                                "chunk_alone_s": chunk_s, "service_s": busiest_shard_share(
                                    values, shards) * 2 * size / bandwidth}
                        result["points"].append(item)
                        score(result)
                        print(line(item), flush=True)
    finally:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result["load_after"] = list(os.getloadavg())
    result["seconds"] = round(time.monotonic() - started, 1)
    return write(result)


def score(result: dict) -> dict:
    """The model's two steps for every measured point, from the step measured at R = 1 of the
    same (S, chunk, size) and D; and measured/model over the points with R > 1. Run again on a
    committed file (--rescore) whenever the formula changes."""
    from dnnscale.model.ps import ps_queueing_cycle_s

    at_one: dict[tuple, float] = {}
    for point in result["points"]:
        key = (point["shards"], point["chunk_cpu_s"], point["bytes"])
        t_one = at_one.setdefault(key, point["step_s"])
        replicas, service_s = point["replicas"], point["service_s"]
        point["bound_s"] = max(t_one, replicas * service_s)
        point["queue_s"] = max(t_one, ps_queueing_cycle_s(replicas, max(0.0, t_one - service_s),
                                                          service_s))
    many = [p for p in result["points"] if p["replicas"] > 1]
    for name in ("bound_s", "queue_s"):
        ratios = sorted(p["step_s"] / p[name] for p in many)
        if ratios:
            result[f"measured_over_{name[:-2]}"] = {
                "min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1],
                "geomean": math.exp(sum(math.log(r) for r in ratios) / len(ratios))}
    return result


def line(point: dict) -> str:
    return (f"S={point['shards']} R={point['replicas']} chunk {point['chunk_cpu_s'] * 1e3:4.1f} "
            f"ms cpu ({point['chunk_alone_s'] * 1e3:5.1f} ms wall), {point['bytes'] / 2**20:.1f} "
            f"MiB: step {point['step_s'] * 1e3:7.1f} ms (slowest "
            f"{point['slowest_step_s'] * 1e3:7.1f}); D {point['service_s'] * 1e3:6.1f} ms; bound "
            f"{point['bound_s'] * 1e3:7.1f} ({point['step_s'] / point['bound_s']:4.2f}x), queue "
            f"{point['queue_s'] * 1e3:7.1f} ({point['step_s'] / point['queue_s']:4.2f}x)")


def write(result: dict) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{result['setting']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k.startswith("measured_over")}))
    print(f"wrote {path}" + (f" in {result['seconds']} s" if "seconds" in result else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
