"""Gather one chunk of the measurement corpus (issue 22): one testbed setting, at most
`--budget-min` minutes, resumable.

    sudo .venv/bin/python benchmarks/corpus_gather.py 100mbit          # one setting
    sudo .venv/bin/python benchmarks/corpus_gather.py 100mbit --budget-min 45

A chunk: wait for a quiet machine (1-minute load below --max-load), `testbed up` the setting
(benchmarks/corpus/settings.yaml), `testbed check`, `calibrate --testbed --quick --max-message`
(messages up to the largest full gradient of the corpus's workloads), the optimizer's choice for
each workload (first sitting only), then the setting's committed plan
(benchmarks/corpus/<setting>.yaml), repeat by repeat. Every run is one line of
results/validation/corpus/<setting>/runs.jsonl, appended as soon as it ends: a killed chunk keeps
its finished runs and the next chunk skips them. A *sitting* is one chunk: its check, testbed
description and calibration profile are kept as check-sN.json, testbed-sN.json and
profile-sN.yaml, and every run names its sitting, so that it is re-predicted with the
calibration taken next to it. A run during which anything but its own ranks used more than
0.3 core (validate/corpus.FOREIGN_CPU_LIMIT_CORES) is kept, marked busy, and run again.
Nothing else may run on the machine meanwhile: no tests, no builds, no helpers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dnnscale.validate.corpus import (RUN_FORMAT, WORKLOADS, ForeignLoad, Row,  # noqa: E402
                                      append_run, attempts, load_plan, load_settings, pending,
                                      read_runs, workload_path)

BIN = ROOT / ".venv" / "bin"
CORPUS = ROOT / "results" / "validation" / "corpus"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, text: str) -> None:
        line = f"[{now()}] load {os.getloadavg()[0]:.2f}: {text}"
        print(line, flush=True)
        with open(self.path, "a") as stream:
            stream.write(line + "\n")


def wait_quiet(max_load: float, wait_s: float, log: Log) -> bool:
    deadline = time.monotonic() + wait_s
    while os.getloadavg()[0] > max_load:
        if time.monotonic() > deadline:
            return False
        log(f"waiting for a quiet machine (load above {max_load})")
        time.sleep(20)
    return True


def dnnscale(*args: str, stdout=None) -> None:  # type: ignore[no-untyped-def]
    subprocess.run([str(BIN / "dnnscale"), *args], check=True, stdout=stdout)


def max_message_bytes() -> int:
    """The largest full gradient among the corpus's workloads, rounded up to a power of two."""
    from dnnscale.workload import load_workload

    largest = max(load_workload(workload_path(ref, ROOT)).params * 4
                  for ref in WORKLOADS.values())
    return 1 << (int(largest) - 1).bit_length()


def optimizer_rows(plan, cluster, folder: Path, log: Log) -> list[Row]:  # type: ignore[no-untyped-def]
    """The optimizer's choice per workload for the testbed's budget, chosen once (the first
    sitting, with its calibration) and kept in optimizer.json; rows `opt-<workload>`."""
    from dnnscale.optimize import optimize
    from dnnscale.plan import config_from_dict
    from dnnscale.workload import load_workload

    path = folder / "optimizer.json"
    if path.is_file():
        chosen = json.loads(path.read_text())
    else:
        chosen = {}
        for short, ref in WORKLOADS.items():
            rows = [r for r in plan.rows if r.workload == ref]
            if not rows:
                continue
            base = rows[0].config
            result = optimize(load_workload(workload_path(ref, ROOT)), cluster, machines=cluster.machines,
                              top=1, minibatch=base.minibatch, base=base, curve=False)
            config = result.best.config
            in_plan = [r.id for r in rows if r.config == config]
            chosen[short] = {"workload": ref, "config": config.to_dict(), "in_plan": in_plan,
                             "predicted_throughput_samples_per_s":
                                 result.best.throughput_samples_per_s, "chosen_at": now()}
            log(f"optimizer's choice for {short}: {config.label()}"
                + (f" (plan row {in_plan[0]})" if in_plan else ""))
        path.write_text(json.dumps(chosen, indent=1, sort_keys=True) + "\n")
    return [Row(f"opt-{short}", item["workload"], "optimizer", config_from_dict(item["config"]))
            for short, item in chosen.items() if not item["in_plan"]]


def run_one(row: Row, repeat: int, sitting: int, plan, cluster, desc, folder: Path,  # type: ignore[no-untyped-def]
            previous: int) -> dict:
    from dnnscale.runtime.job import RunSpec
    from dnnscale.runtime.launch import launch
    from dnnscale.runtime.layout import rank_roles
    from dnnscale.testbed.describe import rank_placements
    from dnnscale.validate.pipeline import conv_split_for
    from dnnscale.workload import load_workload

    ref = workload_path(row.workload, ROOT)
    split = conv_split_for(load_workload(ref), cluster, row.config)
    roles = [role.kind for role in rank_roles(row.config)]
    record = {"format": RUN_FORMAT, "setting": plan.setting, "sitting": sitting, "id": row.id,
              "workload": row.workload, "split": row.split, "config": row.config.to_dict(),
              "repeat": repeat, "attempt": previous + 1, "steps": plan.steps,
              "warmup": plan.warmup, "conv_split": split, "started": now()}
    scratch = folder / "scratch"
    scratch.mkdir(exist_ok=True)
    spec = RunSpec(workload=ref, config=row.config.to_dict(), steps=plan.steps,
                   warmup=plan.warmup, timeout_s=plan.timeout_s,
                   output=str(scratch / f"{row.id}-r{repeat}.jsonl"), lr=plan.lr,
                   seed=repeat - 1, conv_split=dict(split))
    placements = list(rank_placements(desc, len(roles), roles=roles, join_late=True))
    meter = ForeignLoad.start()
    try:
        summary = launch(spec, placements)
    except Exception as exc:  # a failed run is recorded and retried later
        lines = str(exc).splitlines() or [type(exc).__name__]
        record.update(meter.stop(), status="failed", error=lines[0][:300],
                      error_log=[line[:300] for line in lines[1:]][-8:])
        return record
    record.update(meter.stop(), status="ok")
    record["measured_throughput_samples_per_s"] = summary["measured_throughput_samples_per_s"]
    record["per_phase_s"] = summary["per_phase_s"]
    record["loss_first"], record["loss_last"] = summary["loss_first"], summary["loss_last"]
    record["shards"] = [{k: s.get(k) for k in ("shard", "host", "busy_s", "wait_s", "pulls",
                                               "updates_applied")}
                        for s in summary.get("shards", [])]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("setting")
    parser.add_argument("--settings", type=Path, default=ROOT / "benchmarks/corpus/settings.yaml")
    parser.add_argument("--budget-min", type=float, default=45.0)
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--wait-min", type=float, default=5.0)
    parser.add_argument("--only", help="comma-separated row ids (a pilot)")
    parser.add_argument("--corpus", type=Path, default=CORPUS,
                        help="corpus folder (a pilot writes elsewhere)")
    parser.add_argument("--repeats", type=int, help="override the plan's (a pilot)")
    args = parser.parse_args()
    started = time.monotonic()
    settings = load_settings(args.settings)
    if args.setting not in settings:
        print(f"setting: unknown {args.setting!r} (known: {', '.join(settings)})", file=sys.stderr)
        return 2
    setting = settings[args.setting]
    plan = load_plan(args.settings.parent / f"{setting.name}.yaml")
    if args.repeats:
        plan = dataclasses.replace(plan, repeats=args.repeats)
    folder = args.corpus / setting.name
    folder.mkdir(parents=True, exist_ok=True)
    log = Log(folder / "gather.log")
    records = read_runs(folder)
    sitting = 1 + max((int(r["sitting"]) for r in records), default=0)
    while (folder / f"profile-s{sitting}.yaml").exists():
        sitting += 1
    todo = list(pending(plan, records))
    if not todo and (folder / "optimizer.json").exists():
        log("nothing to run: every repeat is in the corpus")
        return 0
    if not wait_quiet(args.max_load, args.wait_min * 60, log):
        log("machine busy: not measuring")
        return 3
    log(f"sitting {sitting} of {setting.name}: {setting.description}; "
        f"{len(todo)} runs pending")
    dnnscale("testbed", "down", "--name", setting.testbed, stdout=subprocess.DEVNULL)
    try:
        dnnscale("testbed", "up", *setting.up_flags(), stdout=subprocess.DEVNULL)
        with open(folder / f"check-s{sitting}.json", "w") as stream:
            subprocess.run([str(BIN / "dnnscale"), "testbed", "check", "--name", setting.testbed,
                            "--json"], stdout=stream)
        from dnnscale.testbed.describe import (cluster_from_description, description_path,
                                               load_description)
        from dnnscale.validate.profile import apply_profile

        shutil.copyfile(description_path(setting.testbed), folder / f"testbed-s{sitting}.json")
        cap = max_message_bytes()
        log(f"calibrate --quick --max-message {cap} bytes")
        profile = folder / f"profile-s{sitting}.yaml"
        partial = folder / f"profile-s{sitting}.partial.yaml"
        dnnscale("calibrate", "--testbed", str(description_path(setting.testbed)), "--quick",
                 "--max-message", str(cap), "-o", str(partial))
        partial.replace(profile)
        desc = load_description(folder / f"testbed-s{sitting}.json")
        cluster = apply_profile(cluster_from_description(desc), profile, desc)
        rows = list(plan.rows) + optimizer_rows(plan, cluster, folder, log)
        plan = dataclasses.replace(plan, rows=tuple(rows))
        if args.only:
            wanted = set(args.only.split(","))
            plan = dataclasses.replace(plan, rows=tuple(r for r in plan.rows if r.id in wanted))
        splits: dict[str, dict[str, str]] = {}

        def split_of(row: Row) -> dict[str, str]:
            """The row's conv split as the model picks it now (failures under another count
            not against it: validate/corpus.attempts)."""
            if row.id not in splits:
                from dnnscale.validate.pipeline import conv_split_for
                from dnnscale.workload import load_workload

                splits[row.id] = conv_split_for(load_workload(workload_path(row.workload, ROOT)),
                                                cluster, row.config)
            return splits[row.id]

        total = len(list(pending(plan, read_runs(folder), split_of=split_of)))
        number = 0
        while True:
            records = read_runs(folder)
            todo = list(pending(plan, records, split_of=split_of))
            if not todo:
                log("setting complete")
                break
            if (time.monotonic() - started) / 60 > args.budget_min:
                log(f"budget of {args.budget_min:g} min spent; {len(todo)} runs left")
                break
            row, repeat = todo[0]
            record = run_one(row, repeat, sitting, plan, cluster, desc, folder,
                             attempts(records, row.id, repeat, split_of(row)))
            append_run(folder, record)
            number += 1
            what = (f"{record['measured_throughput_samples_per_s']:.2f} samples/s"
                    if record["status"] == "ok" else f"FAILED {record['error']}")
            log(f"[{number}/{total}] {row.id} r{repeat} ({row.config.label()}): {what}, "
                f"{record['wall_s']:.1f} s, foreign {record['foreign_cpu_cores']:.2f} core"
                + (" BUSY, again later" if record.get("busy") else ""))
    except subprocess.CalledProcessError as exc:
        log(f"failed: {exc}")
        return 1
    except Exception:
        log("failed: " + traceback.format_exc().strip().splitlines()[-1])
        raise
    finally:
        subprocess.run([str(BIN / "dnnscale"), "testbed", "down", "--name", setting.testbed],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(folder / "scratch", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
