"""The CPU one rank spends per call in the runtime's partition collectives (issue 22), on this
machine at full speed, as results/validation/corpus/collective_cpu.yaml; the model prices the
wait for a CPU quota's next period from it (model/quota.py), and re-scoring reads it for every
setting of the corpus (validate/rescore.COLLECTIVE_CPU).

    .venv/bin/python benchmarks/collective_cpu_bench.py          # machine quiet, ~1 minute

Two ranks on loopback (netbench `cpu`: GatherSplit's all-gather and reduce-scatter,
HaloExchange forward and backward, an all-reduce, a PS push and pull), 1 KiB to 4 MiB, run
`--runs` times (3), each point the runs' median, each operation fitted to c = a + x·b
(calibrate/network.measure_collective_cpu). CPU seconds do not depend on the
quota or the link, so one measurement serves every testbed setting of this machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.rescore import COLLECTIVE_CPU  # noqa: E402

OUT = ROOT / "results" / "validation" / "corpus" / COLLECTIVE_CPU


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--runs", type=int, default=3,
                        help="runs of the microbenchmark; each point is their median")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    from dnnscale.calibrate.network import measure_collective_cpu
    from dnnscale.runtime.placement import local_placements
    from dnnscale.system.profile import collective_cpu_to_dict

    while os.getloadavg()[0] > args.max_load:
        print(f"waiting for a quiet machine (load {os.getloadavg()[0]:.2f})", flush=True)
        time.sleep(20)
    load_before = list(os.getloadavg())
    started = time.monotonic()
    fits = measure_collective_cpu(local_placements(2), runs=args.runs)
    for operation, a, b, points in fits:
        print(f"{operation}: {a * 1e3:.3f} ms + {b * 1e12:.1f} ps/B; "
              + ", ".join(f"{x / 1024:.0f} KiB {c * 1e3:.2f} ms" for x, c in points), flush=True)
    data = collective_cpu_to_dict(
        fits, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        machine=f"{platform.node()} ({os.cpu_count()} cores)", ranks=2,
        measured="calibrate/network.measure_collective_cpu, loopback, full speed",
        runs=args.runs,
        seconds=round(time.monotonic() - started, 1), load_average_before=load_before,
        load_average_after=list(os.getloadavg()))
    args.out.write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
