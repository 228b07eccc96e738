"""Asked vs measured link rate, latency and CPU share of a 6-host testbed at 100 mbit and 1 gbit
(and of 5 workers at 200 mbit with a 1 gbit parameter-server host, filled by fan-in/fan-out),
and the testbed's CPU fidelity: compute after idle gaps for several CFS periods.

    sudo .venv/bin/python benchmarks/testbed_check.py [--repeats 3]   # writes results/testbed_check.md
    sudo .venv/bin/python benchmarks/testbed_check.py --fidelity-only  # only the fidelity section

For each scenario: `dnnscale testbed up ... --cpu 0.25 --name bench`, then
`dnnscale testbed check --name bench --json` REPEATS times, then `down` (always, also on
failure). Each host's numbers are the mean over the repeats with the min-max range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

NAME = "bench"
HOSTS = 6
CPU = 0.25
SCENARIOS = {  # title -> `up` flags
    f"100mbit, {HOSTS} hosts": ["--hosts", str(HOSTS), "--rate", "100mbit"],
    f"1gbit, {HOSTS} hosts": ["--hosts", str(HOSTS), "--rate", "1gbit"],
    "5 workers at 200mbit + 1 PS host at 1gbit": ["--hosts", "5", "--rate", "200mbit",
                                                  "--ps-hosts", "1", "--ps-rate", "1gbit"],
}
DNNSCALE = [sys.executable, "-m", "dnnscale.cli"]
FIDELITY_HEADING = "## Compute after idle gaps (CPU fidelity)"
FIDELITY_PERIODS = ("100ms", "20ms", "10ms", "5ms")


def dnnscale(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DNNSCALE, *args], capture_output=True, text=True, timeout=600)


def measure(up_flags: list[str], repeats: int, check_args: list[str]) -> list[dict]:  # type: ignore[type-arg]
    up = dnnscale("testbed", "up", *up_flags, "--cpu", str(CPU), "--name", NAME)
    if up.returncode != 0:
        raise SystemExit(f"up failed: {up.stderr.strip()}")
    try:
        runs = []
        for _ in range(repeats):
            result = dnnscale("testbed", "check", "--name", NAME, *check_args, "--json")
            if not result.stdout.strip():
                raise SystemExit(f"check failed: {result.stderr.strip()}")
            runs.append(json.loads(result.stdout))
        return runs
    finally:
        dnnscale("testbed", "down", "--name", NAME)


def _stat(values: list[float], scale: float, digits: int) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean * scale:.{digits}f}"
    return f"{mean * scale:.{digits}f} ({min(values) * scale:.{digits}f}–{max(values) * scale:.{digits}f})"


def table(title: str, runs: list[dict]) -> tuple[str, dict[str, list[float]]]:  # type: ignore[type-arg]
    lines = [f"### {title}, {CPU} core each\n",
             "| host | peers | asked Mbit/s | expected Mbit/s | egress Mbit/s | ingress Mbit/s | "
             "egress / expected | ingress / expected | one-way latency µs | asked cpu | cpu share | "
             "matmul GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {"link": [], "cpu": []}
    for i, host in enumerate(runs[0]["hosts"]):
        per_run = [run["hosts"][i] for run in runs]
        m = {key: [h["measured"][key] for h in per_run] for key in per_run[0]["measured"]
             if key != "peer"}
        egress_r = [h["ratio"]["egress"] for h in per_run]
        ingress_r = [h["ratio"]["ingress"] for h in per_run]
        cpu_r = [h["ratio"]["cpu"] for h in per_run]
        ratios["link"] += egress_r + ingress_r
        ratios["cpu"] += cpu_r
        asked, expected = host["asked"]["rate_bytes_per_s"], host["expected"]["egress_bytes_per_s"]
        lines.append(
            f"| {host['name']} | {host['measured']['peer']} | {asked * 8 / 1e6:.0f} | "
            f"{expected * 8 / 1e6:.0f} | "
            f"{_stat(m['egress_bytes_per_s'], 8e-6, 1)} | {_stat(m['ingress_bytes_per_s'], 8e-6, 1)} | "
            f"{_stat(egress_r, 100, 1)} % | {_stat(ingress_r, 100, 1)} % | "
            f"{_stat(m['latency_s'], 1e6, 1)} | {host['asked']['cpu_cores']} | "
            f"{_stat(m['cpu_share'], 1, 3)} | {_stat(m['matmul_flops_per_s'], 1e-9, 1)} |")
    return "\n".join(lines) + "\n", ratios


def fidelity_rows(period: str, rounds: int) -> list[dict]:  # type: ignore[type-arg]
    """Burst probe in h1 of a 6-host 1gbit testbed at CPU share CPU and `period`: alone, then
    with the other five hosts busy; the load average next to each."""
    from dnnscale.testbed.build import up
    from dnnscale.testbed.fidelity import measure_burst
    from dnnscale.testbed.spec import make_spec
    from dnnscale.testbed.teardown import down

    down(NAME)
    rows = []
    try:
        desc = up(make_spec(NAME, HOSTS, "1gbit", cpu=CPU, cpu_period=period))
        for busy in (False, True):
            load = os.getloadavg()[0]
            result = measure_burst(desc, rounds=rounds, busy_others=busy).to_dict()
            rows.append({**result, "load_before": load, "load_after": os.getloadavg()[0]})
    finally:
        down(NAME)
    return rows


def fidelity_section(rounds: int) -> str:
    from dnnscale.testbed.fidelity import DEFAULT_GAPS_S
    from dnnscale.testbed.spec import DEFAULT_CFS_PERIOD_S

    rows = [row for period in FIDELITY_PERIODS for row in fidelity_rows(period, rounds)]
    gaps = [f"{g:g}" for g in DEFAULT_GAPS_S]
    lines = [FIDELITY_HEADING, "",
             f"Date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Produced by `sudo .venv/bin/"
             f"python benchmarks/testbed_check.py --fidelity-only --rounds {rounds}`: for each CFS "
             f"period, `testbed up --hosts {HOSTS} --rate 1gbit --cpu {CPU} --cpu-period P`, then "
             "the burst probe (testbed/fidelity.py) in h1: sleep an idle gap, then a chunk of "
             "256×256 matmuls worth 50 ms of CPU time, each gap "
             f"{rounds} times, once alone and once with the other five hosts running CPU loops "
             "in their cgroups (1.5 cores of quota on 2 cores). **pace** = wall time / (CPU time "
             f"/ {CPU}): 1.00 is a machine of {CPU} core's speed, below 1 a burst (the host spends "
             "a period's quota at full core speed after idling), above 1 contention. The load "
             "average (1 min) of the whole machine is shown beside each row; other sessions "
             "shared the machine, so rows with a load above about 1 are preliminary.", "",
             "| period | other hosts | pace min–max | median | " + " | ".join(
                 f"gap {g} s" for g in gaps) + " | load before / after |",
             "|---|---|---|---|" + "---|" * len(gaps) + "---|"]
    for row in rows:
        by_gap = row["paces_by_gap"]
        cells = " | ".join("–".join(f"{v:.2f}" for v in (min(by_gap[g]), max(by_gap[g])))
                           for g in gaps)
        lines.append(f"| {1000 * row['cpu_period_s']:g} ms | "
                     f"{'busy' if row['busy_others'] else 'idle'} | {row['pace_min']:.2f}–"
                     f"{row['pace_max']:.2f} | {row['pace_median']:.2f} | {cells} | "
                     f"{row['load_before']:.2f} / {row['load_after']:.2f} |")
    lines += ["", f"`testbed up` uses a {1000 * DEFAULT_CFS_PERIOD_S:g} ms period unless "
              "`--cpu-period` says otherwise (longer only where a share needs it for the "
              "kernel's 1 ms minimum quota).", ""]
    return "\n".join(lines)


def replace_section(text: str, heading: str, section: str) -> str:
    """`text` with the section under `heading` (up to the next '## ' heading) replaced by
    `section`, or `section` appended."""
    start = text.find(heading)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + section
    end = text.find("\n## ", start + len(heading))
    return text[:start] + section + (text[end + 1:] if end >= 0 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", default="0.5", help="length of each bandwidth flow")
    parser.add_argument("--cpu-seconds", default="3", help="length of the CPU test")
    parser.add_argument("--rounds", type=int, default=3, help="chunks per idle gap (fidelity)")
    parser.add_argument("--fidelity-only", action="store_true",
                        help="only measure the CPU fidelity section and update it in place")
    args = parser.parse_args()
    out = Path(__file__).resolve().parents[1] / "results" / "testbed_check.md"
    if args.fidelity_only:
        section = fidelity_section(args.rounds)
        out.write_text(replace_section(out.read_text() if out.exists() else "", FIDELITY_HEADING,
                                       section))
        print(section)
        return
    check_args = ["--seconds", args.seconds, "--cpu-seconds", args.cpu_seconds]
    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    sections, summary = [], []
    for title, up_flags in SCENARIOS.items():
        runs = measure(up_flags, args.repeats, check_args)
        text, ratios = table(title, runs)
        sections.append(text)
        summary.append(f"| {title} | {100 * min(ratios['link']):.1f}–{100 * max(ratios['link']):.1f} % "
                       f"| {100 * min(ratios['cpu']):.0f}–{100 * max(ratios['cpu']):.0f} % |")
    load_after = os.getloadavg()[0]
    cpu_model = next((line.split(":", 1)[1].strip() for line in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())
    command = (f"sudo .venv/bin/python benchmarks/testbed_check.py --repeats {args.repeats} "
               f"--seconds {args.seconds} --cpu-seconds {args.cpu_seconds}")
    text = (
        "# Testbed self-check: asked vs measured\n\n"
        f"Machine: {platform.node()}, {platform.machine()}, {cpu_model}, {os.cpu_count()} cores, "
        f"Linux {platform.release()}, cgroup v1; date {started:%Y-%m-%d %H:%M} UTC; load average "
        f"before the run {load_before[0]:.2f} (other jobs shared the machine).\n\n"
        f"Produced by `{command}`, which for each scenario runs\n\n"
        f"```\ndnnscale testbed up UP_FLAGS --cpu {CPU} --name {NAME}   # UP_FLAGS: see the titles\n"
        f"dnnscale testbed check --name {NAME} {' '.join(check_args)} --json   # x{args.repeats}\n"
        f"dnnscale testbed down --name {NAME}\n```\n\n"
        "Each cell is the mean over the repeats with the min–max range in brackets.\n\n"
        "- **Bandwidth** is the TCP payload rate of the flow to (egress) or from (ingress) the "
        "peer, one host at a time, measured by the receiver from the end of its first read to "
        "the last byte; *expected* is the slower side (the host's rate, or the peers' rates "
        "added up: the 1 gbit PS host is measured with all five 200 mbit workers at once, "
        "fan-out and fan-in). The tbf counts Ethernet + IP + TCP headers too (66 of every 1514 "
        "bytes), so about 95.6 % of the asked rate is what a TCP payload can get (up to one "
        "bucket of burst, 64-250 kB, more when the bucket is full as a flow starts).\n"
        "- **Latency** is one-way: half the median round trip of 64-byte TCP messages between "
        "two Python processes (no latency was added: this kernel has no netem qdisc, so "
        "`--latency` is refused here; the numbers are the base latency of veth + bridge + "
        "Python).\n"
        "- **CPU share** is CPU seconds per wall second of a one-thread 256×256 fp32 matmul loop "
        "in each host's cgroup, all six hosts busy at once (1.5 cores of quota on a 2-core "
        "machine). Other jobs were using the same 2 cores at the same time, so the shares and "
        "GFLOP/s are noisy and can fall below the quota when the machine is oversubscribed; "
        "this is why compute is calibrated with every host busy, not assumed.\n"
        "- At 1 gbit the probes themselves need CPU (≈ 120 MB/s through Python and the "
        "kernel's veth/bridge/tbf path); while other jobs oversubscribe the 2 cores, a single "
        "flow can fall a few points below the ≈ 95.6 % ceiling (see the min–max ranges); "
        "each direction is the best of `check`'s 2 tries. The PS host's fan-in is received by "
        "one Python process (five threads), the hungriest probe, and reads lowest under load. "
        f"Load average after the run: {load_after:.2f}.\n\n"
        "## Summary\n\n| scenario | measured / expected, every link and direction | cpu share / asked |\n"
        "|---|---|---|\n" + "\n".join(summary) + "\n\n## Per host\n\n" + "\n".join(sections))
    text = replace_section(text, FIDELITY_HEADING, fidelity_section(args.rounds))
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
