"""Faults: a worker killed or frozen mid-run ends the whole run within the timeout, names the
rank and its role, exits non-zero, keeps the JSONL valid, and leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

DNNSCALE = str(Path(sys.executable).parent / "dnnscale")
TIMEOUT_S = 6.0


def _stop(launcher: subprocess.Popen, pids: list[int]) -> None:
    """Leave nothing running, also when an assertion failed."""
    if launcher.poll() is None:
        launcher.kill()
        launcher.wait()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run_and_hit_rank1(tmp_path: Path, sig: signal.Signals) -> tuple[int, str, float, list[Any]]:
    """Start a long 3-rank run, send `sig` to rank 1 once it has done 3 steps; return
    (exit code, stderr, seconds from the signal to the exit, pids of all ranks)."""
    out = tmp_path / "run.jsonl"
    live = tmp_path / "run.jsonl.partial"  # where the records go while the run lasts
    launcher = subprocess.Popen(
        [DNNSCALE, "run", "-w", "mlp:32-16-4", "-P", "2", "-R", "1", "-S", "1", "--sync",
         "ps-async", "-n", "8", "--steps", "100000", "--timeout", str(TIMEOUT_S), "--local",
         "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 40
        victim = None
        while time.monotonic() < deadline and launcher.poll() is None:
            records = _records(live)
            pids = [r["pid"] for r in records if r["type"] == "start"]
            starts = {r["rank"]: r["pid"] for r in records if r["type"] == "start"}
            if 1 in starts and sum(1 for r in records
                                   if r["type"] == "step" and r["rank"] == 1) >= 3:
                victim = starts[1]
                break
            time.sleep(0.05)
        assert victim is not None, "rank 1 never got going"
        os.kill(victim, sig)
        hit = time.monotonic()
        _, stderr = launcher.communicate(timeout=TIMEOUT_S + 10)
        return launcher.returncode, stderr, time.monotonic() - hit, pids
    finally:
        _stop(launcher, pids)


def _check_records_and_processes(path: Path, pids: list[int]) -> None:
    assert not path.with_name(path.name + ".partial").exists()  # renamed into place
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is whole JSON
    assert len(pids) == 3
    steps = [r for r in records if r["type"] == "step" and r["rank"] == 1]
    assert [r["step"] for r in steps] == list(range(len(steps))) and len(steps) >= 3
    assert records[-1]["type"] == "error" and records[-1]["rank"] == 1
    assert not any(r["type"] == "summary" for r in records)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
@pytest.mark.timeout(80)
def test_killed_worker_ends_the_run(tmp_path: Path) -> None:
    code, stderr, seconds, pids = _run_and_hit_rank1(tmp_path, signal.SIGKILL)
    assert code == 1
    assert "rank 1 (worker (replica 0, partition 1)) was killed by signal SIGKILL" in stderr
    assert seconds < TIMEOUT_S
    _check_records_and_processes(tmp_path / "run.jsonl", pids)


@pytest.mark.slow
@pytest.mark.timeout(80)
def test_frozen_worker_ends_the_run_within_the_timeout(tmp_path: Path) -> None:
    code, stderr, seconds, pids = _run_and_hit_rank1(tmp_path, signal.SIGSTOP)
    assert code == 1
    assert "rank 1 (worker (replica 0, partition 1)) stopped responding" in stderr
    assert TIMEOUT_S * 0.9 < seconds < TIMEOUT_S + 3
    _check_records_and_processes(tmp_path / "run.jsonl", pids)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_killed_launcher_leaves_no_rank_behind(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    launcher = subprocess.Popen(
        [DNNSCALE, "run", "-w", "mlp:32-16-4", "-P", "1", "-R", "2", "--sync", "allreduce",
         "-n", "8", "--steps", "100000", "--timeout", str(TIMEOUT_S), "--local", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)})  # its run folder stays in tmp_path
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(pids) < 2:
            pids = [r["pid"] for r in _records(tmp_path / "run.jsonl.partial")
                    if r["type"] == "start"]
            time.sleep(0.05)
        assert len(pids) == 2
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 3
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in pids if _exists(pid)]
            time.sleep(0.05)
        assert alive == []
    finally:
        _stop(launcher, pids)


def _exists(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped by init, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
