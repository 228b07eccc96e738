"""Start every rank of a run as its own process, watch them, and end the run cleanly.

Each rank runs ``placement.prefix + [python, -m, dnnscale.runtime.rank]`` in a new session (its
own process group), with GLOO_SOCKET_IFNAME = placement.ifname and rendezvous on the first
placement's address. The launcher polls every 50 ms:

- a rank that exits non-zero or dies by a signal ends the run;
- a rank whose heartbeat file is older than the timeout (frozen, stopped, gone) ends the run;
- ranks that gave up on a peer (exit 3: process-group timeout, 4: connection lost) are victims,
  so the blame goes to a rank that died by itself, else to one whose heartbeat is over 1 s old
  (frozen), else to the live worker with the least progress (stuck while still beating).

On any end, every process group still alive gets SIGKILL, and the launcher waits for each; the
JSONL records written so far stay as they are, followed by an "error" record.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dnnscale.errors import CommandFailed
from typing import Any

from dnnscale.runtime.job import RunSpec
from dnnscale.runtime.layout import RankRole, rank_roles
from dnnscale.runtime.placement import RankPlacement
from dnnscale.runtime.rank import EXIT_PEER_LOST, EXIT_PEER_TIMEOUT
from dnnscale.runtime.records import JsonlWriter, read_records

POLL_S = 0.05
SILENT_S = 1.0  # a heartbeat this old, once a peer gave up waiting, marks the frozen rank


class RunFailed(CommandFailed):
    """The run ended early; the message names the rank and its role."""


def free_port(address: str) -> int:
    """A TCP port free on `address` (bind port 0); any port when the address is not local
    (a testbed host in another network namespace has a port space of its own)."""
    for host in (address, "127.0.0.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                return int(sock.getsockname()[1])
        except OSError:
            continue
    raise RunFailed("no free TCP port for the rendezvous")


@dataclass
class _Rank:
    role: RankRole
    process: subprocess.Popen[bytes]
    heartbeat: Path
    log: Path


def _last_beat(rank: _Rank, started: float) -> tuple[float, int]:
    """(time of the last heartbeat, step it reported); the launch time before the first."""
    try:
        return rank.heartbeat.stat().st_mtime, int(rank.heartbeat.read_text().strip() or -1)
    except (OSError, ValueError):
        return started, -1


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_PEER_TIMEOUT:
        return "timed out waiting for a peer"
    if code == EXIT_PEER_LOST:
        return "lost the connection to a peer"
    return f"exited with code {code}"


def _log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(f"  | {line}" for line in text[-lines:])


def _blame(ranks: list[_Rank], timeout_s: float, started: float) -> tuple[_Rank, str] | None:
    """The rank that ended the run and why, or None while all is well."""
    now = time.time()
    exited = [(r, r.process.returncode) for r in ranks if r.process.poll() is not None]
    culprits = [(r, c) for r, c in exited if c != 0 and c not in (EXIT_PEER_TIMEOUT, EXIT_PEER_LOST)]
    if culprits:
        rank, code = min(culprits, key=lambda item: (item[1] >= 0, item[0].role.rank))
        return rank, _describe_exit(code)
    alive = [r for r in ranks if r.process.poll() is None]
    beats = {r.role.rank: _last_beat(r, started) for r in alive}
    frozen = [r for r in alive if now - beats[r.role.rank][0] > timeout_s]
    if frozen:
        rank = frozen[0]
        return rank, f"stopped responding (no heartbeat for {now - beats[rank.role.rank][0]:.1f} s)"
    victims = [(r, c) for r, c in exited if c != 0]
    if victims:
        silent = [r for r in alive if now - beats[r.role.rank][0] > SILENT_S]
        if silent:
            rank = max(silent, key=lambda r: now - beats[r.role.rank][0])
            return rank, (f"stopped responding (no heartbeat for "
                          f"{now - beats[rank.role.rank][0]:.1f} s)")
        workers_alive = [r for r in alive if r.role.kind == "worker"] or alive
        if workers_alive:
            laggard = min(workers_alive, key=lambda r: (beats[r.role.rank][1], r.role.rank))
            return laggard, (f"made no progress after step {beats[laggard.role.rank][1]} "
                             f"(rank {victims[0][0].role.rank} {_describe_exit(victims[0][1])})")
        rank, code = victims[0]
        return rank, _describe_exit(code)
    return None


def _kill_all(ranks: list[_Rank]) -> None:
    for rank in ranks:
        if rank.process.poll() is None:
            try:
                os.killpg(rank.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for rank in ranks:
        rank.process.wait()


def launch(spec: RunSpec, placements: list[RankPlacement]) -> dict[str, Any]:
    """Run every rank on its placement; return the summary record, or raise RunFailed."""
    roles = rank_roles(spec.config_obj())
    if len(placements) != len(roles):
        raise RunFailed(f"{len(roles)} ranks but {len(placements)} placements")
    Path(spec.output).write_text("")
    port = free_port(placements[0].address)
    init_method = f"tcp://{placements[0].address}:{port}"
    ranks: list[_Rank] = []
    with tempfile.TemporaryDirectory(prefix="dnnscale-run-") as tmp:
        run_dir = Path(tmp)
        spec_path = run_dir / "spec.json"
        spec.save(spec_path)
        started = time.time()
        previous = _stop_on_sigterm()
        try:
            for role, placement in zip(roles, placements):
                ranks.append(_start(role, placement, len(roles), init_method, spec_path, run_dir))
            while True:
                blamed = _blame(ranks, spec.timeout_s, started)
                if blamed is not None:
                    _fail(spec, ranks, *blamed)
                if all(r.process.poll() == 0 for r in ranks):
                    break
                time.sleep(POLL_S)
        finally:
            _kill_all(ranks)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    summaries = [r for r in read_records(spec.output) if r.get("type") == "summary"]
    if not summaries:
        raise RunFailed("every rank finished but no summary record was written")
    return summaries[-1]


def _stop_on_sigterm() -> Any:
    """Make SIGTERM unwind the launcher (so its `finally` kills the ranks); the old handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _start(role: RankRole, placement: RankPlacement, world: int, init_method: str,
           spec_path: Path, run_dir: Path) -> _Rank:
    heartbeat = run_dir / f"rank{role.rank}.beat"
    log = run_dir / f"rank{role.rank}.log"
    env = {**os.environ, **placement.env,
           "GLOO_SOCKET_IFNAME": placement.ifname, "DNNSCALE_RUN_SPEC": str(spec_path),
           "DNNSCALE_RANK": str(role.rank), "DNNSCALE_WORLD_SIZE": str(world),
           "DNNSCALE_INIT_METHOD": init_method, "DNNSCALE_HEARTBEAT": str(heartbeat),
           "DNNSCALE_HOST": placement.host, "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    command = [*placement.prefix, sys.executable, "-m", "dnnscale.runtime.rank"]
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return _Rank(role, process, heartbeat, log)


def _fail(spec: RunSpec, ranks: list[_Rank], rank: _Rank, reason: str) -> None:
    _kill_all(ranks)
    message = f"rank {rank.role.rank} ({rank.role.describe()}) {reason}; the run was stopped"
    writer = JsonlWriter(spec.output)
    writer.write({"type": "error", **rank.role.to_dict(), "message": message,
                  "time_unix_s": time.time()})
    writer.close()
    tail = _log_tail(rank.log)
    raise RunFailed(message + (f"\nlast lines of rank {rank.role.rank}'s log:\n{tail}"
                               if tail else ""))
