"""Compute calibration inside a testbed host, under its CPU quota, with the other hosts busy.

What runs see on a testbed is not a free core times the quota's share: throttling at period
boundaries, the other hosts' processes evicting caches between periods, and the machine's own
contention all stretch compute (shared/design/testbed.md: imagenet22k-small ran 2x slower under
a 0.25-core quota than a free core's calibration x 0.25 predicted). So on a testbed the compute
half of `dnnscale calibrate` runs as a child process in one worker host (its namespace and
cgroup, joined after torch is imported) while every other host runs a one-thread CPU loop in
its own cgroup, and the child times in wall seconds x the quota's share
(calibrate/timing.use_quota_timing): the profile's rates stay "per core", and the model's
share x per-core rate is what the host delivers.

Child: ``python -m dnnscale.calibrate.quota --out FILE --share S --period P [--quick]
[--kinds K,K]`` prints one ``step LABEL`` line per calibration step and writes the profile
(no network) to FILE. Parent: `calibrate_compute_under_quota`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dnnscale.system.profile import HardwareProfile

CHILD_TIMEOUT_S = 3600.0


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m dnnscale.calibrate.quota")
    parser.add_argument("--out", required=True)
    parser.add_argument("--share", type=float, required=True)
    parser.add_argument("--period", type=float, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kinds", default="")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (imported before joining the cgroup: start-up at full speed)

    from dnnscale.calibrate.run import Plan, calibrate
    from dnnscale.calibrate.timing import use_quota_timing
    from dnnscale.runtime.placement import join_cgroup
    from dnnscale.system.profile import save_profile

    join_cgroup()
    use_quota_timing(args.share, args.period)
    kinds = tuple(k for k in args.kinds.split(",") if k) or None
    plan = Plan.make(args.quick, network=False, grid_kinds=kinds)
    profile = calibrate(plan, lambda label: print(f"step {label}", flush=True))
    save_profile(profile, Path(args.out))
    return 0


def calibrate_compute_under_quota(desc: Any, quick: bool, grid_kinds: tuple[str, ...] | None,
                                  advance: Callable[[str], None] = lambda _: None,
                                  host_name: str | None = None) -> HardwareProfile:
    """Run the compute calibration in `host_name` (default: the first worker) of the testbed
    `desc` while every other host is busy; return its profile (no network), with
    `calibration.under_quota` saying how it was measured. Every process started is stopped
    before returning, also on failure."""
    from dataclasses import replace

    from dnnscale.runtime.placement import CGROUP_FD_ENV
    from dnnscale.system.profile import load_profile
    from dnnscale.testbed.check import _env, _read_line, _stop, probe_command
    from dnnscale.testbed.describe import CGROUP_FD, enter_prefix

    host = desc.host(host_name) if host_name else desc.hosts_with_role("worker")[0]
    others = [h for h in desc.hosts if h.name != host.name]
    procs: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="dnnscale-quota-") as tmp:
        out = Path(tmp) / "profile.yaml"
        try:
            busy = [subprocess.Popen(list(enter_prefix(h)) + probe_command(
                "cpu", "--seconds", f"{CHILD_TIMEOUT_S:g}"), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(h))
                for h in others]
            procs += busy
            for h, proc in zip(others, busy):
                _read_line(proc, 120, f"cpu loop on {h.name}")
                assert proc.stdin is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
            command = [*enter_prefix(host, join_late=True), sys.executable, "-m",
                       "dnnscale.calibrate.quota", "--out", str(out), "--share",
                       f"{host.cpu_cores:g}", "--period", f"{host.cpu_period_s:g}",
                       *(["--quick"] if quick else []),
                       *(["--kinds", ",".join(grid_kinds)] if grid_kinds else [])]
            log = open(Path(tmp) / "child.log", "w")  # noqa: SIM115 - closed below
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env={**_env(host), CGROUP_FD_ENV: str(CGROUP_FD)})
            log.close()
            procs.append(child)
            assert child.stdout is not None
            while True:
                line = _read_line_or_end(child, CHILD_TIMEOUT_S, host.name)
                if line is None:
                    break
                if line.startswith("step "):
                    advance(line[5:])
            if child.wait(timeout=60) != 0:
                tail = (Path(tmp) / "child.log").read_text().strip().splitlines()
                raise RuntimeError(f"compute calibration in {host.name} failed (exit "
                                   f"{child.returncode}): {tail[-1] if tail else ''}")
        finally:
            _stop(procs)
        profile = load_profile(out)
    under = {"host": host.name, "cpu_cores": host.cpu_cores, "cpu_period_s": host.cpu_period_s,
             "busy_hosts": len(others), "clock": "wall seconds x share, median sample",
             "load_average_1min": round(os.getloadavg()[0], 2)}
    return replace(profile, calibration={**profile.calibration, "under_quota": under})


def _read_line_or_end(proc: subprocess.Popen[str], timeout_s: float, host: str) -> str | None:
    """The child's next stdout line, None at its end; a child silent for `timeout_s` fails."""
    import select

    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise RuntimeError(f"compute calibration in {host} was silent for {timeout_s:g} s")
    line = proc.stdout.readline()
    return line.strip() if line else None


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
