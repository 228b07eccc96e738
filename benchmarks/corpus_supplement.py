"""A supplementary calibration of corpus settings (issue 22): what their sittings' profiles did
not measure yet, taken later on the same testbed setting and machine, as
results/validation/corpus/<setting>/supplement.yaml (validate/rescore.SUPPLEMENT).

    .venv/bin/python benchmarks/corpus_supplement.py 1gbit 4h2g ...     # as root, machine quiet

What (`--what`):
- exchange (supplement.yaml): the runtime's layer exchanges per group size (calibrate/network.
  measure_partition_exchange), which calibration measures in a sitting since 2026-12-02 and the
  first sittings did not, for every group size a sitting's calibration measures
  (calibrate/run.coupled_groups);
- halo (supplement-halo.yaml): a stripe's halo exchanges with one and two neighbours
  (calibrate/network.measure_halo_exchange, calibrate/run.halo_groups), which calibration
  measures since 2026-12-03;
- cpu (collective_cpu.yaml, format dnnscale-collective-cpu/1): the CPU one rank spends per
  partition collective between two of the setting's workers (calibrate/network.
  measure_collective_cpu), which calibration measures since 2026-12-03.
Each setting: wait for a quiet machine, `testbed up`, measure, `testbed down`. A setting whose
supplement exists is skipped (delete it to measure again).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.corpus import load_settings  # noqa: E402
from dnnscale.validate.rescore import SUPPLEMENT  # noqa: E402

SETTING_CPU = "collective_cpu-testbed.yaml"
"""The collective CPU measured between two of a setting's workers: kept as a measurement, not
read by re-scoring (docs/accuracy.md)."""

BIN = ROOT / ".venv" / "bin"
CORPUS = ROOT / "results" / "validation" / "corpus"


WHAT = {"exchange": SUPPLEMENT, "halo": "supplement-halo.yaml", "cpu": SETTING_CPU}


def _measure(what: str, desc, quick: bool, name: str) -> list:  # type: ignore[no-untyped-def]
    from dnnscale.calibrate.network import measure_halo_exchange, measure_partition_exchange
    from dnnscale.calibrate.run import coupled_groups, halo_groups
    from dnnscale.testbed.describe import rank_placements

    workers = len(desc.hosts_with_role("worker"))
    fits = []
    if what == "halo":
        for peers in halo_groups(workers):
            fits.append(measure_halo_exchange(rank_placements(desc, peers, join_late=True),
                                              quick=quick))
    else:
        for peers in coupled_groups(workers):
            fits += measure_partition_exchange(rank_placements(desc, peers, join_late=True),
                                               quick=quick)
    for fit in fits:
        print(f"{name}: {fit.operation} x{fit.peers}: "
              + ", ".join(f"{x / 1024:.0f} KiB {t * 1e3:.1f} ms" for x, t in fit.points),
              flush=True)
    return fits


def _measure_cpu(desc, quick: bool, name: str):  # type: ignore[no-untyped-def]
    from dnnscale.calibrate.network import measure_collective_cpu
    from dnnscale.testbed.describe import rank_placements

    fits = measure_collective_cpu(rank_placements(desc, 2, join_late=True), quick=quick)
    for operation, a, b, points in fits:
        print(f"{name}: {operation} CPU {a * 1e3:.3f} ms + {b * 1e12:.0f} ps/B; "
              + ", ".join(f"{x / 1024:.0f} KiB {c * 1e3:.2f} ms" for x, c in points), flush=True)
    return fits


MEASURED_BY = {"exchange": "measure_partition_exchange", "halo": "measure_halo_exchange"}


def supplement(setting, quick: bool, what: str) -> dict:  # type: ignore[no-untyped-def]
    from dnnscale.system.profile import supplement_to_dict
    from dnnscale.testbed.describe import description_path, load_description

    load_before = list(os.getloadavg())
    started = time.monotonic()
    subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                   stdout=subprocess.DEVNULL)
    try:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "up", *setting.up_flags()],
                       check=True, stdout=subprocess.DEVNULL)
        desc = load_description(description_path(setting.testbed))
        fits = (_measure_cpu(desc, quick, setting.name) if what == "cpu"
                else _measure(what, desc, quick, setting.name))
    finally:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    info = dict(setting=setting.name, description=setting.description,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                seconds=round(time.monotonic() - started, 1), load_average_before=load_before,
                load_average_after=list(os.getloadavg()))
    if what == "cpu":
        from dnnscale.system.profile import collective_cpu_to_dict

        return collective_cpu_to_dict(tuple(fits), measured="calibrate/network."
                                      "measure_collective_cpu, two workers", **info)
    return supplement_to_dict(
        tuple(fits), measured=f"calibrate/network.{MEASURED_BY[what]}"
        + (" (quick)" if quick else ""), **info)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="+")
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--full", action="store_true", help="4 repeats instead of 2")
    parser.add_argument("--what", choices=sorted(WHAT), default="exchange",
                        help="what to measure (the module docstring)")
    args = parser.parse_args()
    settings = load_settings(ROOT / "benchmarks/corpus/settings.yaml")
    unknown = [name for name in args.settings if name not in settings]
    if unknown:
        print(f"settings: unknown {', '.join(unknown)} (known: {', '.join(settings)})",
              file=sys.stderr)
        return 2
    for name in args.settings:
        out = CORPUS / name / WHAT[args.what]
        if out.exists():
            print(f"{name}: {out.relative_to(ROOT)} exists; skipped")
            continue
        while os.getloadavg()[0] > args.max_load:
            print(f"waiting for a quiet machine (load {os.getloadavg()[0]:.2f})", flush=True)
            time.sleep(20)
        data = supplement(settings[name], quick=not args.full, what=args.what)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(yaml.safe_dump(data, sort_keys=False))
        print(f"{name}: wrote {out.relative_to(ROOT)} in {data['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
