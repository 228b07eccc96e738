"""Network accuracy: predicted vs measured point-to-point and all-reduce times.

Calibrates the α-β network model the way `dnnscale calibrate` does (message sizes of
dnnscale.calibrate.run.Plan), then measures transfers at *other* sizes and compares with the
model's formulas: transfer_time_s for one message, the ring all-reduce of model/collectives.py for
an all-reduce — the latter both with the point-to-point α, β (what a cluster's `network` gives
the predictor) and with the all-reduce fit of that group size (what the profile also records).

    .venv/bin/python benchmarks/network_accuracy.py                   # loopback, 2 processes
    .venv/bin/python benchmarks/network_accuracy.py --testbed NAME    # between testbed hosts

Writes results/network_accuracy.md (one section per place measured; earlier sections for other
places are kept).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
P2P_SIZES = (300, 20_000, 500_000, 3_000_000, 30_000_000)
ALLREDUCE_SIZES = (16_384, 262_144, 4_000_000, 16_000_000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--testbed", help="testbed name or description file")
    parser.add_argument("--peers", default="2,4", help="all-reduce group sizes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "network_accuracy.md")
    args = parser.parse_args()

    from dnnscale.calibrate.network import measure_allreduce, measure_p2p, run_ranks
    from dnnscale.calibrate.run import Plan
    from dnnscale.model.collectives import collective_time_s
    from dnnscale.model.network import transfer_time_s
    from dnnscale.system import LinkTier
    from dnnscale.runtime.placement import local_placements

    peers = tuple(int(p) for p in args.peers.split(","))
    plan = Plan.make(quick=False, allreduce_peers=peers)
    if args.testbed:
        from dnnscale.testbed.describe import rank_placements

        def placements(count: int):  # type: ignore[no-untyped-def]
            return rank_placements(args.testbed, count)

        limit = 4 * 2**20
        p2p_sizes = [s for s in P2P_SIZES if s <= limit]
        reduce_sizes = [s for s in ALLREDUCE_SIZES if s <= limit]
        calibration_sizes = [s for s in plan.message_sizes if s <= limit]
        reduce_calibration = [s for s in plan.allreduce_sizes if s <= limit]
        where = f"testbed {args.testbed}"
    else:
        placements = local_placements
        p2p_sizes, reduce_sizes = list(P2P_SIZES), list(ALLREDUCE_SIZES)
        calibration_sizes, reduce_calibration = list(plan.message_sizes), list(plan.allreduce_sizes)
        where = "loopback (2 and more local processes, gloo)"
    load_before = os.getloadavg()
    p2p_fit = measure_p2p(placements(2), calibration_sizes)
    rows = []
    measured = _median_points([run_ranks(placements(2), "p2p", p2p_sizes, 5)
                               for _ in range(args.repeats)])
    for size, seconds in measured:
        predicted = transfer_time_s(size, 1, p2p_fit.bandwidth_bytes_per_s, p2p_fit.latency_s)
        rows.append(("point-to-point", 2, size, predicted, None, seconds))
    for n in peers:
        reduce_fit = measure_allreduce(placements(n), reduce_calibration)
        measured = _median_points([run_ranks(placements(n), "allreduce", reduce_sizes, 5)
                                   for _ in range(args.repeats)])
        for size, seconds in measured:
            from_p2p = collective_time_s("allreduce", "gloo", size, n, LinkTier(
                p2p_fit.bandwidth_bytes_per_s, p2p_fit.latency_s))
            from_fit = collective_time_s("allreduce", "gloo", size, n, LinkTier(
                reduce_fit.bandwidth_bytes_per_s, reduce_fit.latency_s))
            rows.append((f"all-reduce x{n}", n, size, from_p2p, from_fit, seconds))
    load_after = os.getloadavg()
    section = _section(where, rows, p2p_fit, load_before, load_after, args.repeats,
                       calibration_sizes, reduce_calibration)
    _write(args.out, where, section)
    print(section)
    return 0


def _median_points(runs: list[list[list[float]]]) -> list[tuple[float, float]]:
    return [(runs[0][i][0], statistics.median(run[i][1] for run in runs))
            for i in range(len(runs[0]))]


def _error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def _section(where, rows, p2p_fit, load_before, load_after, repeats, cal_sizes,
             reduce_cal) -> str:  # type: ignore[no-untyped-def]
    from dnnscale.calibrate.run import machine_facts

    m = machine_facts()
    p2p_errors = [_error(r[3], r[5]) for r in rows if r[0] == "point-to-point"]
    reduce_p2p = [_error(r[3], r[5]) for r in rows if r[0] != "point-to-point"]
    reduce_fit = [_error(r[4], r[5]) for r in rows if r[0] != "point-to-point"]
    lines = [
        f"## {where}",
        "",
        f"- machine: {m['hostname']}, {m['cpu_model']}, {m['cores']} cores; date "
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}; load average before "
        f"{'/'.join(f'{v:.2f}' for v in load_before)}, after "
        f"{'/'.join(f'{v:.2f}' for v in load_after)}",
        f"- calibration sizes (bytes): point-to-point {', '.join(map(str, cal_sizes))}; "
        f"all-reduce {', '.join(map(str, reduce_cal))}. Validation sizes differ from these.",
        f"- fitted point-to-point: bandwidth {p2p_fit.bandwidth_bytes_per_s / 1e9:.3g} GB/s, "
        f"latency {p2p_fit.latency_s * 1e6:.3g} us",
        f"- measured: median over {repeats} runs of the per-call median (one-way time = half a "
        "ping-pong round trip)",
        "",
        f"**Median relative error: point-to-point {statistics.median(p2p_errors):.1%}; "
        f"all-reduce with the point-to-point α-β {statistics.median(reduce_p2p):.1%}, with the "
        f"all-reduce fit {statistics.median(reduce_fit):.1%}.** Target: median <= 10 %.",
        "",
        "| pattern | bytes | predicted (p2p α-β) | predicted (all-reduce fit) | measured | "
        "error (p2p α-β) | error (all-reduce fit) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pattern, _, size, from_p2p, from_fit, seconds in rows:
        fit_text = f"{from_fit * 1e6:,.1f} us" if from_fit is not None else "-"
        fit_error = f"{_error(from_fit, seconds):.1%}" if from_fit is not None else "-"
        lines.append(f"| {pattern} | {size:,} | {from_p2p * 1e6:,.1f} us | {fit_text} | "
                     f"{seconds * 1e6:,.1f} us | {_error(from_p2p, seconds):.1%} | {fit_error} |")
    return "\n".join(lines) + "\n"


def _write(path: Path, where: str, section: str) -> None:
    header = ("# Network accuracy: predicted vs measured transfer times\n\n"
              "Command: `.venv/bin/python benchmarks/network_accuracy.py [--testbed NAME]`\n\n")
    sections: dict[str, str] = {}
    if path.exists():
        text = path.read_text()
        for chunk in text.split("\n## ")[1:]:
            title = chunk.split("\n", 1)[0]
            sections[title] = "## " + chunk.rstrip() + "\n"
    sections[where] = section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "\n".join(sections.values()))


if __name__ == "__main__":
    sys.exit(main())
