"""What a collective costs a model-parallel group under the CPU quota beyond its own time
(issue 22, mechanism "partition communication at P >= 2"): a microbenchmark on one corpus
setting's testbed, no training run.

    .venv/bin/python benchmarks/coupling_bench.py 1gbit            # as root, machine quiet

For each group size P (2 up to 4 workers), each collective (the all-gather of a model-parallel
layer's forward, the all-reduce gloo runs for its backward reduce-scatter), each message size
and each CPU chunk (the compute of a layer between two exchanges), netbench `coupled` /
`coupled-allgather` times (chunk, collective) x 10 against the chunk alone and the collective
alone, first with the other hosts idle, then with every other host running a one-thread CPU
loop (as in a run, where the replicas and the other partitions compute). The excess per call
is what the model must price beyond the collective. Writes
results/validation/coupling/<setting>.json (with the load average before and after).
"""

from __future__ import annotations

import argparse
import json
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
OUT = ROOT / "results" / "validation" / "coupling"
MODES = ("coupled-layer", "coupled-allgather", "coupled")
"""netbench modes: the runtime's layer exchange (all-gather, then reduce-scatter, each after a
chunk), a bare all-gather, a bare all-reduce (what calibration measures)."""


def busy_loops(hosts):  # type: ignore[no-untyped-def]
    """One-thread CPU loops in `hosts` (their namespaces and cgroups), started and running."""
    from dnnscale.testbed.check import _env, _read_line, probe_command
    from dnnscale.testbed.describe import enter_prefix

    procs = [subprocess.Popen(list(enter_prefix(h)) + probe_command("cpu", "--seconds", "3600"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(h)) for h in hosts]
    for h, proc in zip(hosts, procs):
        _read_line(proc, 120, f"cpu loop on {h.name}")
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("setting")
    parser.add_argument("--settings", type=Path, default=ROOT / "benchmarks/corpus/settings.yaml")
    parser.add_argument("--sizes", default="65536,1048576")
    parser.add_argument("--chunks-ms", default="0.5,2.5,10", help="CPU ms per chunk")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--peers", default="2,3,4")
    args = parser.parse_args()
    setting = load_settings(args.settings)[args.setting]
    from dnnscale.calibrate.network import run_ranks
    from dnnscale.testbed.check import _stop
    from dnnscale.testbed.describe import description_path, load_description, rank_placements

    sizes = [int(s) for s in args.sizes.split(",")]
    chunks = [float(c) / 1e3 for c in args.chunks_ms.split(",")]
    subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                   stdout=subprocess.DEVNULL)
    result = {"setting": setting.name, "description": setting.description,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "load_before": list(os.getloadavg()), "points": []}
    started = time.monotonic()
    try:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "up", *setting.up_flags()],
                       check=True, stdout=subprocess.DEVNULL)
        desc = load_description(description_path(setting.testbed))
        workers = desc.hosts_with_role("worker")
        result["cpu_cores"] = workers[0].cpu_cores
        result["cpu_period_s"] = workers[0].cpu_period_s
        for peers in [int(p) for p in args.peers.split(",") if int(p) <= len(workers)]:
            placements = rank_placements(desc, peers, join_late=True)
            members = {h.name for h in workers[:peers]}  # rank k on worker host k
            others = [h for h in desc.hosts if h.name not in members]
            for busy in (False, True):
                procs = busy_loops(others) if busy else []
                try:
                    for mode in args.modes.split(","):
                        for chunk in chunks:
                            points = run_ranks(placements, mode, sizes, args.repeats,
                                               timeout_s=600, extra=chunk)
                            for size, extra, iteration, own, alone in points:
                                item = {"peers": peers, "busy_others": len(procs),
                                        "operation": mode.partition("-")[2] or "allreduce",
                                        "chunk_cpu_s": chunk,
                                        "bytes": int(size), "excess_s": extra,
                                        "iteration_s": iteration, "chunk_alone_s": own,
                                        "collective_alone_s": alone}
                                result["points"].append(item)
                                print(f"P={peers} busy={len(procs)} {item['operation']:9s} "
                                      f"chunk {chunk * 1e3:4.1f} ms cpu, {size:8.0f} B: "
                                      f"excess {extra * 1e3:6.2f} ms (iteration "
                                      f"{iteration * 1e3:6.2f}, chunk {own * 1e3:6.2f}, "
                                      f"collective {alone * 1e3:6.2f})", flush=True)
                finally:
                    _stop(procs)
    finally:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result["load_after"] = list(os.getloadavg())
    result["seconds"] = round(time.monotonic() - started, 1)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{setting.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT / (setting.name + '.json')} in {result['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
