"""A worker's per-step passes over its parameters under a testbed host's CPU quota (issue 22,
mechanism "compute while every host is busy"), against model/bookkeeping.py's formula.

    .venv/bin/python benchmarks/bookkeeping_bench.py 1gbit 4h2g     # as root, machine quiet

Per setting: `testbed up`, every host but the first worker runs a one-thread CPU loop, and a
child in the first worker host (its namespace and cgroup, joined after torch is imported)
times runtime/worker.py's own step bookkeeping (flat_gradient, local_update,
vector_to_parameters) on the parameter tensors of each corpus workload, with and without a
parameter server's accumulator, and the calibration's copy bandwidth
(calibrate/memory.memory_bandwidth_bytes_per_s) in the same place. Times are wall seconds x
the quota's share (what calibration reports: per-core seconds). Writes
results/validation/bookkeeping.json with the formula's seconds beside the measured ones.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

BIN = ROOT / ".venv" / "bin"
OUT = ROOT / "results" / "validation" / "bookkeeping.json"


def child(share: float, period_s: float, layers: dict[str, list[int]]) -> None:
    import torch

    from dnnscale.runtime.placement import join_cgroup

    join_cgroup()
    torch.set_num_threads(1)
    from torch.nn.utils import vector_to_parameters

    from dnnscale.calibrate.memory import memory_bandwidth_bytes_per_s
    from dnnscale.calibrate.timing import call_time_s, use_quota_timing
    from dnnscale.runtime.worker import flat_gradient, local_update

    use_quota_timing(share, period_s)  # wall seconds x share, as calibration times
    out = {"memory_bandwidth_bytes_per_s_per_core": memory_bandwidth_bytes_per_s(samples=5),
           "workloads": {}}
    for name, sizes in layers.items():
        params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes if n > 0]
        for p in params:
            p.grad = torch.ones_like(p)
        item = {}
        for ps in (False, True):
            accumulated = torch.zeros(sum(sizes)) if ps else None

            def step() -> None:
                with torch.no_grad():
                    grad = flat_gradient(params)
                    vector_to_parameters(local_update(params, grad, 0.01, accumulated), params)
            item["ps" if ps else "collective"] = call_time_s(step, samples=5)
        item["params"] = sum(sizes)
        out["workloads"][name] = item
    print(json.dumps(out), flush=True)


def measure(setting, layers: dict[str, list[int]]) -> dict:  # type: ignore[no-untyped-def]
    from coupling_bench import busy_loops

    from dnnscale.runtime.placement import CGROUP_FD_ENV
    from dnnscale.testbed.check import _env, _stop
    from dnnscale.testbed.describe import (CGROUP_FD, description_path, enter_prefix,
                                           load_description)

    subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                   stdout=subprocess.DEVNULL)
    procs = []
    try:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "up", *setting.up_flags()],
                       check=True, stdout=subprocess.DEVNULL)
        desc = load_description(description_path(setting.testbed))
        host = desc.hosts_with_role("worker")[0]
        procs = busy_loops([h for h in desc.hosts if h.name != host.name])
        command = [*enter_prefix(host, join_late=True), sys.executable, __file__, "--child",
                   "--share", f"{host.cpu_cores:g}", "--period", f"{host.cpu_period_s:g}",
                   "--layers", json.dumps(layers)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                              env={**_env(host), CGROUP_FD_ENV: str(CGROUP_FD),
                                   "PYTHONPATH": str(ROOT / "src")})
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1])
        result = json.loads(done.stdout.strip().splitlines()[-1])
        result["cpu_cores"] = host.cpu_cores
        return result
    finally:
        _stop(procs)
        subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="*")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--share", type=float, default=1.0)
    parser.add_argument("--layers")
    parser.add_argument("--period", type=float, default=0.01)
    args = parser.parse_args()
    if args.child:
        child(args.share, args.period, json.loads(args.layers))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from dnnscale.model.bookkeeping import worker_bookkeeping_bytes
    from dnnscale.validate.corpus import WORKLOADS, load_settings, workload_path
    from dnnscale.workload import load_workload

    settings = load_settings(ROOT / "benchmarks/corpus/settings.yaml")
    layers = {}
    for ref in WORKLOADS.values():
        workload = load_workload(str(workload_path(ref, ROOT)))
        layers[workload.name] = [int(layer.params) for layer in workload.layers if layer.params]
    report = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "benchmarks/bookkeeping_bench.py " + " ".join(args.settings),
              "load_before": list(os.getloadavg()), "settings": {}}
    for name in args.settings:
        result = measure(settings[name], layers)
        bandwidth = result["memory_bandwidth_bytes_per_s_per_core"]
        for workload, item in result["workloads"].items():
            for mode in ("collective", "ps"):
                formula = worker_bookkeeping_bytes(item["params"], 4, mode == "ps") / bandwidth
                item[f"{mode}_formula_s"] = formula
                print(f"{name:8s} {workload:24s} {mode:10s} measured {item[mode] * 1e3:7.2f} ms "
                      f"formula {formula * 1e3:7.2f} ms  ratio {item[mode] / formula:5.2f} "
                      f"(per core, B_mem {bandwidth / 1e9:.1f} GB/s)", flush=True)
        report["settings"][name] = result
    report["load_after"] = list(os.getloadavg())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
