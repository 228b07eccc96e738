"""Running `ip`, `tc` and friends, and the preflight checks that refuse early and clearly.

Every failure of a system command raises `TestbedError` with the command and its stderr, so a
broken step during `up` can be rolled back and reported in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dnnscale.errors import CommandFailed, InputError
from dnnscale.testbed.names import CGROUP_CPU_ROOT


class TestbedError(CommandFailed):
    """A system step of the testbed failed (not the user's input): exit code 1."""

    __test__ = False


def run(command: Sequence[str], check: bool = True, timeout_s: float = 30.0) -> str:
    """Run `command` (no shell), return its stdout; raise TestbedError if it fails and `check`."""
    try:
        result = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s,
                                check=False)
    except FileNotFoundError:
        raise TestbedError(f"`{command[0]}` not found") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"`{' '.join(command)}` took more than {timeout_s:g} s") from None
    if check and result.returncode != 0:
        message = (result.stderr or result.stdout).strip().splitlines()
        reason = message[-1] if message else f"exit code {result.returncode}"
        raise TestbedError(f"`{' '.join(command)}` failed: {reason}")
    return result.stdout


def write_file(path: Path, text: str) -> None:
    """Write a control file (sysfs / cgroupfs); raise TestbedError naming the file."""
    try:
        path.write_text(text)
    except OSError as exc:
        raise TestbedError(f"cannot write {text.strip()!r} to {path}: {exc.strerror}") from None


def require_root_and_support(need_cgroups: bool = True) -> None:
    """Refuse (InputError, exit 2) unless we are root and namespaces, tc and cgroups work."""
    if os.geteuid() != 0:
        raise InputError("testbed", "needs root (network namespaces, tc and cgroups); "
                         "run it as root, e.g. with sudo")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise InputError("testbed", f"needs the `{tool}` command (package iproute2)")
    if not Path("/proc/self/ns/net").exists():
        raise InputError("testbed", "network namespaces are not available in this kernel")
    try:
        subprocess.run(["ip", "netns", "list"], capture_output=True, check=True, timeout=10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
        raise InputError("testbed", "`ip netns list` fails: network namespaces are unavailable "
                         "(inside a container without CAP_SYS_ADMIN?)") from None
    if need_cgroups:
        quota = CGROUP_CPU_ROOT / "cpu.cfs_quota_us"
        if not quota.exists():
            raise InputError("testbed", f"needs the cgroup v1 cpu controller at {CGROUP_CPU_ROOT} "
                             "(cgroup-v2-only systems are not supported yet)")
        if not os.access(CGROUP_CPU_ROOT, os.W_OK):
            raise InputError("testbed", f"{CGROUP_CPU_ROOT} is not writable (read-only cgroupfs?)")


def support_problem() -> str | None:
    """Why the testbed cannot run here, or None if it can (used by tests to skip)."""
    try:
        require_root_and_support()
    except InputError as exc:
        return str(exc)
    return None
