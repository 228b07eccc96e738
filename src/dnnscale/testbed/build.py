"""`testbed up`: build every host, or nothing.

Each host is a network namespace whose ``eth0`` is one end of a veth pair; the other end is
enslaved to the testbed's bridge in the root namespace. A token-bucket filter limits the rate
on both ends (``eth0`` inside the namespace shapes the host's egress, the bridge-side end its
ingress), optional ``netem delay`` on ``eth0`` adds one-way latency, and a cgroup v1 cpu group
caps the host's CPU. Every step is recorded with its undo; if any step fails, or the process is
interrupted (SIGINT/SIGTERM), the steps done so far are undone in reverse order. A SIGKILL leaves
objects behind that `down` finds by name.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import ipaddress
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from dnnscale.errors import InputError
from dnnscale.testbed.describe import (HostDescription, TestbedDescription,
                                       description_path, save_copy, save_description, state_dir)
from dnnscale.testbed.inventory import BRIDGE_ALIAS_TAG, take_inventory, used_subnets
from dnnscale.testbed.names import TestbedNames
from dnnscale.testbed.spec import SUBNETS, HostSpec, TestbedSpec, cfs_quota_us, host_address
from dnnscale.testbed.system import TestbedError, require_root_and_support, run, write_file
from dnnscale.testbed.teardown import kill_cgroup_processes, remove_cgroup, state_lock

# Testing aid: seconds to sleep after each step of `up`, so a test can kill `up` half-way.
STEP_DELAY_ENV = "DNNSCALE_TESTBED_STEP_DELAY_S"


class Interrupted(BaseException):
    """SIGTERM during `up`: unwind and roll back like KeyboardInterrupt."""


def tbf_args(rate_bytes_per_s: float) -> list[str]:
    """tc arguments of a token bucket at `rate_bytes_per_s`.

    burst = max(64 KiB, 2 ms at the rate): tbf needs at least one timer tick's worth of tokens to
    reach its rate at high speeds, and a small burst keeps short transfers close to the rate.
    The queue holds 100 ms of traffic beyond the burst.
    """
    burst_bytes = max(64 * 1024, int(rate_bytes_per_s * 0.002))
    return ["tbf", "rate", f"{round(rate_bytes_per_s * 8)}bit", "burst", str(burst_bytes),
            "latency", "100ms"]


class Rollback:
    """Undo actions recorded as steps succeed; `undo_all` runs them newest first."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], None]]] = []
        self._delay_s = float(os.environ.get(STEP_DELAY_ENV) or 0)

    def done(self, what: str, undo: Callable[[], None]) -> None:
        self._undo.append((what, undo))
        if self._delay_s:
            time.sleep(self._delay_s)

    def undo_all(self) -> list[str]:
        """Undo everything; return the steps whose undo failed (best effort, never raises)."""
        failed = []
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - keep undoing the rest
                failed.append(f"{what}: {exc}")
        return failed


@contextlib.contextmanager
def _sigterm_as_exception() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Interrupted(f"signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def choose_subnet(taken: set[str]) -> str:
    """The first /24 of 198.18.0.0/15 that no existing testbed uses."""
    for subnet in SUBNETS:
        if str(subnet) not in taken:
            return str(subnet)
    raise InputError("testbed", f"all {len(SUBNETS)} testbed subnets are in use")


def _taken_subnets() -> set[str]:
    taken = used_subnets()
    folder = state_dir()
    if folder.is_dir():
        import yaml

        for path in folder.glob("*.yaml"):
            try:
                data = yaml.safe_load(path.read_text())
                taken.add(str(data.get("subnet")))
            except (OSError, yaml.YAMLError, AttributeError):
                continue
    return taken


def up(spec: TestbedSpec, copy_to: Path | None = None) -> TestbedDescription:
    """Build the testbed `spec`; raise InputError if it exists already. All or nothing."""
    require_root_and_support()
    names = spec.names
    with state_lock():
        existing = take_inventory(spec.name)
        path = description_path(spec.name)
        if not existing.empty or path.exists():
            found = existing.objects()[:3] or [str(path)]
            raise InputError("testbed", f"testbed {spec.name!r} already exists ({', '.join(found)}"
                             f"{', …' if len(existing.objects()) > 3 else ''}); run `dnnscale "
                             f"testbed down --name {spec.name}` first or pick another --name")
        subnet = choose_subnet(_taken_subnets())
        rollback = Rollback()
        try:
            with _sigterm_as_exception():
                _make_bridge(names, subnet, rollback)
                network = ipaddress.IPv4Network(subnet)
                hosts = [_make_host(names, host, host_address(network, i), rollback)
                         for i, host in enumerate(spec.hosts)]
                desc = TestbedDescription(
                    name=spec.name, subnet=subnet, bridge=names.bridge, hosts=tuple(hosts),
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    source=str(path))
                save_description(desc, path)
                rollback.done(f"description {path}", lambda: path.unlink(missing_ok=True))
                if copy_to is not None:
                    save_copy(desc, copy_to, "--output")
        except BaseException as exc:
            failed = rollback.undo_all()
            if failed:
                raise TestbedError(f"{exc}; rollback incomplete ({'; '.join(failed)}): run "
                                   f"`dnnscale testbed down --name {spec.name}`") from exc
            raise
    return desc


def _command(command: list[str], check: bool = True) -> Callable[[], None]:
    def undo() -> None:
        run(command, check=check)

    return undo


def _remove_cgroup(cgroup: Path) -> None:
    kill_cgroup_processes(cgroup)
    remove_cgroup(cgroup)


def _make_bridge(names: TestbedNames, subnet: str, rollback: Rollback) -> None:
    bridge = names.bridge
    run(["ip", "link", "add", bridge, "type", "bridge", "nf_call_iptables", "0",
         "nf_call_ip6tables", "0", "nf_call_arptables", "0"])
    rollback.done(f"bridge {bridge}", _command(["ip", "link", "del", bridge]))
    run(["ip", "link", "set", bridge, "alias", f"{BRIDGE_ALIAS_TAG} {subnet}"])
    _disable_ipv6(bridge)
    run(["ip", "link", "set", bridge, "up"])


def _disable_ipv6(ifname: str) -> None:
    """No IPv6 (no link-local chatter) on our root-namespace interfaces, where supported."""
    knob = Path("/proc/sys/net/ipv6/conf") / ifname / "disable_ipv6"
    if knob.exists():
        with contextlib.suppress(TestbedError):
            write_file(knob, "1")


def _make_host(names: TestbedNames, host: HostSpec, address: str,
               rollback: Rollback) -> HostDescription:
    namespace, veth, cgroup = names.namespace(host.name), names.veth(host.name), names.cgroup(host.name)
    run(["ip", "netns", "add", namespace])
    rollback.done(f"netns {namespace}", _command(["ip", "netns", "del", namespace]))
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace])
    rollback.done(f"link {veth}", _command(["ip", "link", "del", veth], check=False))
    _disable_ipv6(veth)
    run(["ip", "link", "set", veth, "master", names.bridge, "up"])
    run(["ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0"])
    run(["ip", "-n", namespace, "link", "set", "lo", "up"])
    run(["ip", "-n", namespace, "link", "set", "eth0", "up"])
    # Egress of the host: [netem delay ->] tbf on eth0 inside the namespace.
    if host.latency_s > 0:
        delay = f"{host.latency_s * 1e6:.0f}us"
        try:
            run(["tc", "-n", namespace, "qdisc", "add", "dev", "eth0", "root", "handle", "1:",
                 "netem", "delay", delay, "limit", "100000"])
        except TestbedError as exc:
            if "unknown" not in str(exc).lower():
                raise
            raise InputError("--latency", "adding latency needs the netem qdisc, which this "
                             "kernel lacks (CONFIG_NET_SCH_NETEM); leave --latency out") from None
        run(["tc", "-n", namespace, "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle",
             "10:", *tbf_args(host.rate_bytes_per_s)])
    else:
        run(["tc", "-n", namespace, "qdisc", "add", "dev", "eth0", "root", "handle", "10:",
             *tbf_args(host.rate_bytes_per_s)])
    # Ingress of the host: tbf on the bridge-side end (its egress towards the host).
    run(["tc", "qdisc", "add", "dev", veth, "root", "handle", "10:",
         *tbf_args(host.rate_bytes_per_s)])
    try:
        cgroup.mkdir()
    except OSError as exc:
        raise TestbedError(f"cannot create cgroup {cgroup}: {exc.strerror}") from None
    rollback.done(f"cgroup {cgroup}", lambda: _remove_cgroup(cgroup))
    period_us, quota_us = cfs_quota_us(host.cpu_cores, host.cpu_period_s)
    write_file(cgroup / "cpu.cfs_period_us", str(period_us))
    write_file(cgroup / "cpu.cfs_quota_us", str(quota_us))
    if (cgroup / "cpu.cfs_burst_us").exists():  # no carry-over of unused quota (Linux >= 5.14)
        write_file(cgroup / "cpu.cfs_burst_us", "0")
    return HostDescription(name=host.name, role=host.role, namespace=namespace, address=address,
                           ifname="eth0", veth=veth, cgroup=str(cgroup),
                           rate_bytes_per_s=host.rate_bytes_per_s, latency_s=host.latency_s,
                           cpu_cores=host.cpu_cores, cpu_period_s=host.cpu_period_s)
