"""`testbed down`: remove every object of a testbed, found by name, also after a crash.

Order: stop the processes still inside the testbed's namespaces and cgroups (SIGTERM, then
SIGKILL after a grace period), delete the root-namespace links (the bridge-side veth ends take
their peers and qdiscs with them; the bridge), delete the namespaces, remove the cgroups, remove
the description file; then look again and fail loudly if anything is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dnnscale.errors import InputError
from dnnscale.testbed.describe import STATE_DIR_ENV, description_path, state_dir
from dnnscale.testbed.inventory import Inventory, take_inventory
from dnnscale.testbed.names import valid_name
from dnnscale.testbed.system import TestbedError, require_root_and_support, run

GRACE_S = 2.0


@dataclass
class TeardownReport:
    """What `down` removed."""

    removed: list[str] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)


def _namespace_pids(namespace: str) -> list[int]:
    out = run(["ip", "netns", "pids", namespace], check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]


def _cgroup_pids(cgroup: Path) -> list[int]:
    try:
        text = (cgroup / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(tok) for tok in text.split() if tok.isdigit()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0; treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_processes(pids: list[int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM `pids`, SIGKILL the ones alive after `grace_s`; return the pids signalled."""
    signalled = []
    for pid in sorted(set(pids)):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in signalled) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in signalled:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return signalled


def kill_cgroup_processes(cgroup: Path) -> list[int]:
    return stop_processes(_cgroup_pids(cgroup))


def remove_cgroup(cgroup: Path, wait_s: float = 3.0) -> None:
    """rmdir a cgroup, waiting for just-killed processes to leave it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TestbedError(f"cannot remove cgroup {cgroup}: {exc.strerror} (pids "
                                   f"{_cgroup_pids(cgroup)})") from None
            time.sleep(0.05)


def remove_objects(inventory: Inventory, bridge_last: bool = True) -> TeardownReport:
    """Remove everything in `inventory`; raise TestbedError listing what could not be removed."""
    report = TeardownReport()
    pids = [pid for ns in inventory.namespaces for pid in _namespace_pids(ns)]
    pids += [pid for cg in inventory.cgroups for pid in _cgroup_pids(Path(cg))]
    report.killed_pids = stop_processes(pids)
    bridges = [link for link in inventory.links if link.endswith("-br")]
    for link in [link for link in inventory.links if link not in bridges] + bridges:
        run(["ip", "link", "del", link], check=False)
        report.removed.append(f"link {link}")
    for namespace in inventory.namespaces:
        run(["ip", "netns", "del", namespace], check=False)
        report.removed.append(f"netns {namespace}")
    problems = []
    for cgroup in inventory.cgroups:
        try:
            kill_cgroup_processes(Path(cgroup))
            remove_cgroup(Path(cgroup))
            report.removed.append(f"cgroup {cgroup}")
        except TestbedError as exc:
            problems.append(str(exc))
    if problems:
        raise TestbedError("; ".join(problems))
    return report


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Serialise `up`/`down` of all testbeds on this machine (a lock file in the state dir)."""
    folder = state_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / ".lock", "w")
    except OSError as exc:
        raise InputError("testbed", f"cannot use the state directory {folder}: {exc.strerror} "
                         f"(set {STATE_DIR_ENV} to another directory)") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def down(name: str | None) -> TeardownReport:
    """Remove testbed `name` (or every testbed when None): objects and description file."""
    require_root_and_support()
    with state_lock():
        report = remove_objects(take_inventory(name))
        paths = ([description_path(name)] if name else
                 [p for p in sorted(state_dir().glob("*.yaml")) if valid_name(p.stem)])
        for path in paths:
            if path.exists():
                path.unlink()
                report.removed.append(f"description {path}")
        left = take_inventory(name)
        if not left.empty:
            raise TestbedError(f"still present after down: {', '.join(left.objects())}")
    return report
