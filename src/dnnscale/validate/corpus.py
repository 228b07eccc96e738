"""The measurement corpus (issue 22): what was measured on the testbed, kept apart from the
model so that every model change re-predicts it (benchmarks/rescore.py).

A *setting* is one testbed (hosts, link rates, CPU share). Its *plan* (committed before it is
measured) lists the configurations to run, each with its split: ``calibration`` rows fit only
the baselines (Paleo-style, Optimus), ``dev`` rows are for model work, ``test`` rows are frozen
and only reported. The corpus folder of a setting holds the testbed's description and check,
the calibration profile taken in the same sitting, and one record per run (``runs.jsonl``):
the configuration, the repeat, the per-phase seconds per step, and how busy the machine was
with anything else while it ran.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.plan import Config, config_from_dict
from dnnscale.yamlio import load_yaml_file

SPLITS = ("calibration", "dev", "test")
"""calibration: fits the baselines only; dev: model work; test: frozen, reported only."""

FOREIGN_CPU_LIMIT_CORES = 0.3
"""A run is *busy* when processes other than its own ranks (and this runner) used more than
this many cores on average while it ran; it is measured again. The testbed's hosts use at most
their quotas (about 1.5 cores together), so 0.3 core more is a machine shared with something
else, not noise (idle, the machine's daemons use about 0.01 core)."""

RUNS_FILE = "runs.jsonl"
WORKLOADS = {"cifar10": "adam-cifar10",
             "in22k": "benchmarks/validation/adam-imagenet22k-small.yaml",
             "mnist": "adam-mnist"}
"""The corpus's workloads by short name (row ids start with it): a zoo name, or a YAML path
relative to the repository (see `workload_path`)."""

PLAN_FORMAT = "dnnscale-corpus-plan/1"
RUN_FORMAT = "dnnscale-corpus-run/1"


@dataclass(frozen=True)
class Setting:
    """One testbed setting: `testbed up` flags and a short name (<= 6 characters)."""

    name: str
    testbed: str
    hosts: int
    rate: str
    cpu: float
    ps_hosts: int = 0
    ps_rate: str = ""
    description: str = ""

    def up_flags(self) -> list[str]:
        flags = ["--hosts", str(self.hosts), "--rate", self.rate, "--cpu", f"{self.cpu:g}",
                 "--name", self.testbed]
        if self.ps_hosts:
            flags += ["--ps-hosts", str(self.ps_hosts), "--ps-rate", self.ps_rate or self.rate]
        return flags


def load_settings(path: Path) -> dict[str, Setting]:
    """Settings by name from a YAML mapping ``settings: {NAME: {hosts, rate, cpu, ...}}``."""
    data = load_yaml_file(path, "settings")
    items = data.get("settings")
    if not isinstance(items, dict) or not items:
        raise InputError("settings", "must map setting names to testbed settings")
    known = {"testbed", "hosts", "rate", "cpu", "ps_hosts", "ps_rate", "description"}
    settings = {}
    for name, item in items.items():
        where = f"settings.{name}"
        if not isinstance(item, dict):
            raise InputError(where, f"must be a mapping, got {short_repr(item)}")
        unknown = sorted(set(item) - known)
        if unknown:
            raise InputError(f"{where}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
        settings[str(name)] = Setting(
            name=str(name), testbed=str(item.get("testbed", name))[:6],
            hosts=require_int(f"{where}.hosts", item.get("hosts")), rate=str(item["rate"]),
            cpu=float(item["cpu"]), ps_hosts=require_int(f"{where}.ps_hosts",
                                                         item.get("ps_hosts", 0), minimum=0),
            ps_rate=str(item.get("ps_rate", "")), description=str(item.get("description", "")))
    return settings


@dataclass(frozen=True)
class Row:
    """One configuration of a setting's plan."""

    id: str
    workload: str
    split: str
    config: Config
    group: str = ""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "workload": self.workload, "split": self.split,
                                "config": self.config.to_dict()}
        if self.group:
            data["group"] = self.group
        return data


@dataclass(frozen=True)
class Plan:
    """A setting's committed plan: rows and how each run is timed."""

    setting: str
    rows: tuple[Row, ...]
    steps: int = 6
    warmup: int = 2
    repeats: int = 3
    timeout_s: float = 240.0
    lr: float = 0.05
    notes: tuple[str, ...] = field(default=())

    def row(self, row_id: str) -> Row:
        for row in self.rows:
            if row.id == row_id:
                return row
        raise InputError("row", f"setting {self.setting!r} has no row {row_id!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "setting": self.setting, "steps": self.steps,
                "warmup": self.warmup, "repeats": self.repeats, "timeout_s": self.timeout_s,
                "lr": self.lr, "notes": list(self.notes),
                "rows": [row.to_dict() for row in self.rows]}


def plan_from_dict(data: dict[str, Any], where: str = "plan") -> Plan:
    if data.get("format") != PLAN_FORMAT:
        raise InputError(f"{where}.format", f"must be {PLAN_FORMAT!r}")
    rows = []
    for index, item in enumerate(data.get("rows") or []):
        at = f"{where}.rows[{index}]"
        if item.get("split") not in SPLITS:
            raise InputError(f"{at}.split", f"must be one of {', '.join(SPLITS)}")
        rows.append(Row(id=str(item["id"]), workload=str(item["workload"]),
                        split=str(item["split"]), group=str(item.get("group", "")),
                        config=config_from_dict(dict(item["config"]), f"{at}.config")))
    if len({row.id for row in rows}) != len(rows):
        raise InputError(f"{where}.rows", "row ids must be distinct")
    return Plan(setting=str(data["setting"]), rows=tuple(rows),
                steps=require_int(f"{where}.steps", data.get("steps", 6)),
                warmup=require_int(f"{where}.warmup", data.get("warmup", 2), minimum=0),
                repeats=require_int(f"{where}.repeats", data.get("repeats", 3)),
                timeout_s=float(data.get("timeout_s", 240.0)), lr=float(data.get("lr", 0.05)),
                notes=tuple(str(n) for n in data.get("notes") or ()))


def load_plan(path: Path) -> Plan:
    return plan_from_dict(load_yaml_file(path, "plan"), str(path))


def workload_path(ref: str, root: Path) -> str:
    """What load_workload and the ranks get for a plan's workload: a YAML path made absolute
    against the repository `root` (ranks may start in another folder), a zoo name as it is."""
    return str(root / ref) if ref.endswith(".yaml") else ref


# --- run records -------------------------------------------------------------------------------

def read_runs(folder: Path) -> list[dict[str, Any]]:
    """Every run record of a setting's corpus folder, in the order they were taken."""
    path = folder / RUNS_FILE
    if not path.is_file():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError(str(path), f"line {number} is not JSON") from None
    return records


def append_run(folder: Path, record: dict[str, Any]) -> None:
    """Append one run record (one line, flushed and synced: a killed chunk keeps it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / RUNS_FILE, "a") as stream:
        stream.write(json.dumps(record, sort_keys=True) + "\n")
        stream.flush()
        os.fsync(stream.fileno())


def usable(record: dict[str, Any]) -> bool:
    """A run that finished on a quiet machine."""
    return record.get("status") == "ok" and not record.get("busy", False)


def done_repeats(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(row id, repeat) -> its usable record (the last one taken)."""
    done: dict[tuple[str, int], dict[str, Any]] = {}
    for record in records:
        if usable(record):
            done[(record["id"], int(record["repeat"]))] = record
    return done


def attempts(records: list[dict[str, Any]], row_id: str, repeat: int,
             conv_split: dict[str, str] | None = None) -> int:
    """How often (row, repeat) was run; with `conv_split`, only the runs with that split count
    (a failure under a split the model no longer picks says nothing about the one it picks)."""
    return sum(1 for r in records if r.get("id") == row_id and int(r.get("repeat", 0)) == repeat
               and (conv_split is None or r.get("conv_split", {}) == conv_split))


# --- how busy the machine was ------------------------------------------------------------------

def _busy_cpu_s() -> float:
    """Seconds of CPU all processes of the machine have used (user, nice, system, irq, softirq,
    steal), from /proc/stat."""
    with open("/proc/stat") as stream:
        fields = stream.readline().split()[1:]
    ticks = [int(value) for value in fields]
    busy = ticks[0] + ticks[1] + ticks[2] + sum(ticks[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and every child it has waited for (the runs' ranks)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class ForeignLoad:
    """Cores used by anything but this runner and its runs while a run ran, and the load
    average at its start and end."""

    started_s: float = 0.0
    busy0_s: float = 0.0
    own0_s: float = 0.0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @classmethod
    def start(cls) -> "ForeignLoad":
        return cls(time.monotonic(), _busy_cpu_s(), _own_cpu_s(), os.getloadavg())

    def stop(self) -> dict[str, Any]:
        wall = max(time.monotonic() - self.started_s, 1e-9)
        foreign = max(0.0, (_busy_cpu_s() - self.busy0_s) - (_own_cpu_s() - self.own0_s)) / wall
        return {"wall_s": round(wall, 3), "foreign_cpu_cores": round(foreign, 3),
                "load_before": [round(x, 2) for x in self.load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "busy": foreign > FOREIGN_CPU_LIMIT_CORES}


def pending(plan: Plan, records: list[dict[str, Any]], max_attempts: int = 3,
            split_of: Callable[[Row], dict[str, str]] | None = None
            ) -> Iterator[tuple[Row, int]]:
    """(row, repeat) still to run, repeat by repeat (every row's first repeat, then every
    row's second, ...), so that a chunk cut short has every row at least once and the repeats
    of a row are spread over the sitting; within a repeat the rows tried fewest times come
    first, so a busy or failed run is tried again after the others, not at once; a repeat
    that failed or was busy `max_attempts` times is given up (with `split_of`, the row's conv
    split now: times under that split)."""
    done = done_repeats(records)
    for repeat in range(1, plan.repeats + 1):
        tries = []
        for row in plan.rows:
            split = split_of(row) if split_of is not None else None
            count = attempts(records, row.id, repeat, split)
            if (row.id, repeat) not in done and count < max_attempts:
                tries.append((count, row))
        for _, row in sorted(tries, key=lambda item: item[0]):
            yield row, repeat
