"""`testbed check`: measure every host's link (both directions), latency and CPU share.

Network: every host runs a probe server in its namespace. For each host H in turn, peers are
chosen so that H's own link is the bottleneck where possible (`choose_peers`: the fastest other
host, or several when H is faster than any one of them, as a PS host behind slower workers);
a client in H sends to the peers at once (H's egress, after a ping-pong with the first peer for
the latency), then clients in the peers send to H at once (H's ingress); each direction is
measured `tries` times and the best counts, since on a busy machine interference (a descheduled
probe) can only slow a flow down. The expected rate is the slower side: min(H's rate, the
peers' rates added up). Network probes run in the namespace
only, outside the CPU cgroup, so they measure the link and not the host's CPU quota.

CPU: every host runs a one-thread matmul loop inside its cgroup and namespace (through the same
command prefix as a training rank), all hosts at once, started together after their imports;
the share is CPU seconds per wall second.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import select
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from typing import Any

from dnnscale.errors import InputError
from dnnscale.testbed.describe import (HostDescription, HostMeasurement, TestbedDescription,
                                       enter_prefix, host_env)
from dnnscale.testbed.inventory import take_inventory
from dnnscale.testbed.probe import aggregate_rate
from dnnscale.testbed.system import TestbedError, require_root_and_support

MIN_FLOW_BYTES = 1 << 20
# Per client: time for the clients of a fan-in to start (Python) and connect before sending.
FAN_IN_START_DELAY_S = 0.25
MAX_FLOW_BYTES = 512 << 20


@dataclass(frozen=True)
class CheckOptions:
    """How long and how hard `check` measures."""

    seconds_per_flow: float = 0.5
    tries: int = 2
    """Flows per direction; the best counts (interference on a busy machine only slows a flow)."""
    ping_count: int = 50
    cpu_seconds: float = 2.0
    network: bool = True
    cpu: bool = True


@dataclass(frozen=True)
class HostCheck:
    """One host: what was asked, what each flow could reach, and what was measured."""

    host: HostDescription
    measured: HostMeasurement
    expected_egress_bytes_per_s: float | None
    expected_ingress_bytes_per_s: float | None

    def to_dict(self) -> dict[str, Any]:
        h = self.host
        return {"name": h.name, "role": h.role, "address": h.address,
                "asked": {"rate_bytes_per_s": h.rate_bytes_per_s, "latency_s": h.latency_s,
                          "cpu_cores": h.cpu_cores},
                "expected": {"egress_bytes_per_s": self.expected_egress_bytes_per_s,
                             "ingress_bytes_per_s": self.expected_ingress_bytes_per_s},
                "measured": self.measured.to_dict(),
                "ratio": {"egress": _ratio(self.measured.egress_bytes_per_s,
                                           self.expected_egress_bytes_per_s),
                          "ingress": _ratio(self.measured.ingress_bytes_per_s,
                                            self.expected_ingress_bytes_per_s),
                          "cpu": _ratio(self.measured.cpu_share, h.cpu_cores)}}


def _ratio(measured: float | None, asked: float | None) -> float | None:
    return measured / asked if measured is not None and asked else None


def probe_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "dnnscale.testbed.probe", *args]


def netns_prefix(host: HostDescription) -> list[str]:
    return ["ip", "netns", "exec", host.namespace]


def _env(host: HostDescription) -> dict[str, str]:
    return {**os.environ, **host_env(host)}


def choose_peers(hosts: tuple[HostDescription, ...], index: int) -> list[HostDescription]:
    """The fewest other hosts whose links together reach host `index`'s rate: fastest first,
    ring order (the hosts after `index`) among equals. Usually one; a fast PS host behind slow
    workers gets several, sending or receiving at once (fan-out and fan-in)."""
    host = hosts[index]
    ring = [hosts[(index + k) % len(hosts)] for k in range(1, len(hosts))]
    chosen: list[HostDescription] = []
    for peer in sorted(ring, key=lambda h: -h.rate_bytes_per_s):
        chosen.append(peer)
        if sum(p.rate_bytes_per_s for p in chosen) >= host.rate_bytes_per_s:
            break
    return chosen


def expected_rate(host: HostDescription, peers: list[HostDescription]) -> float:
    """What flows between `host` and `peers` can reach: the slower of the two sides."""
    return min(host.rate_bytes_per_s, sum(p.rate_bytes_per_s for p in peers))


def flow_bytes(rate_bytes_per_s: float, seconds: float) -> int:
    return int(min(MAX_FLOW_BYTES, max(MIN_FLOW_BYTES, rate_bytes_per_s * seconds)))


def _read_line(proc: subprocess.Popen[str], timeout_s: float, what: str) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline() if ready else ""
    if not line:
        raise TestbedError(f"{what} did not answer within {timeout_s:g} s "
                           f"(rc {proc.poll()}): {_stderr(proc)}")
    return line.strip()


def _stderr(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None or proc.stderr is None:
        return ""
    lines = proc.stderr.read().strip().splitlines()
    return lines[-1] if lines else ""


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _client_command(host: HostDescription, args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(netns_prefix(host) + probe_command(*args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(host))


def _client_result(host: HostDescription, proc: subprocess.Popen[str],
                   timeout_s: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise TestbedError(f"probe on {host.name} took more than {timeout_s:g} s") from None
    if proc.returncode != 0:
        tail = err.strip().splitlines()
        raise TestbedError(f"probe on {host.name} failed: {tail[-1] if tail else proc.returncode}")
    return json.loads(out.strip().splitlines()[-1])


def _egress(host: HostDescription, peers: list[HostDescription], ports: dict[str, str],
            size: int, ping_count: int, timeout_s: float) -> dict[str, Any]:
    """One client in `host` sending to every peer at once, after a ping-pong with the first."""
    proc = _client_command(host, ["send", "--to", ",".join(p.address for p in peers),
                                  "--port", ",".join(ports[p.name] for p in peers),
                                  "--bytes", str(size), "--ping-count", str(ping_count)])
    return _client_result(host, proc, timeout_s)


def _ingress(host: HostDescription, peers: list[HostDescription], ports: dict[str, str],
             size: int, timeout_s: float) -> float | None:
    """One client in each peer, all sending to `host` at once; their aggregate rate."""
    args = ["send", "--to", host.address, "--port", ports[host.name], "--bytes", str(size)]
    if len(peers) > 1:  # start the flows together, after every client has started and connected
        args += ["--start-at", f"{time.monotonic() + FAN_IN_START_DELAY_S * len(peers):.6f}"]
    procs = [(peer, _client_command(peer, args)) for peer in peers]
    try:
        flows = [flow for peer, proc in procs
                 for flow in _client_result(peer, proc, timeout_s)["flows"]]
    finally:
        _stop([proc for _, proc in procs])
    return aggregate_rate(flows)


def _best(rates: list[float | None]) -> float | None:
    measured = [rate for rate in rates if rate is not None]
    return max(measured) if measured else None


def measure_network(desc: TestbedDescription, options: CheckOptions) -> dict[str, dict[str, Any]]:
    """Per host name: egress/ingress rates, one-way latency, the peers and the expected rate."""
    hosts = desc.hosts
    servers: list[subprocess.Popen[str]] = []
    try:
        for host in hosts:
            proc = subprocess.Popen(netns_prefix(host) + probe_command("serve", "--bind", host.address),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    env=_env(host))
            servers.append(proc)
        ports = {host.name: _read_line(proc, 60, f"probe server on {host.name}")
                 for host, proc in zip(hosts, servers)}
        results: dict[str, dict[str, Any]] = {}
        for i, host in enumerate(hosts):
            peers = choose_peers(hosts, i)
            expected = expected_rate(host, peers)
            size = flow_bytes(expected / len(peers), options.seconds_per_flow)
            timeout_s = 60 + 10 * options.seconds_per_flow
            egress, ingress, rtts = [], [], []
            for attempt in range(options.tries):
                out = _egress(host, peers, ports, size, options.ping_count if attempt == 0 else 0,
                              timeout_s)
                rtts += out.get("rtts_s") or []
                egress.append(out.get("rate_bytes_per_s"))
                ingress.append(_ingress(host, peers, ports, size, timeout_s))
            results[host.name] = {
                "egress_bytes_per_s": _best(egress), "ingress_bytes_per_s": _best(ingress),
                "latency_s": statistics.median(rtts) / 2 if rtts else None,
                "peer": ",".join(p.name for p in peers), "expected_bytes_per_s": expected}
        return results
    finally:
        _stop(servers)


def measure_cpu(desc: TestbedDescription, options: CheckOptions) -> dict[str, dict[str, Any]]:
    """Per host name: CPU share and one-thread matmul FLOP/s, all hosts busy at once."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for host in desc.hosts:
            procs.append(subprocess.Popen(
                list(enter_prefix(host)) + probe_command("cpu", "--seconds", str(options.cpu_seconds)),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=_env(host)))
        for host, proc in zip(desc.hosts, procs):
            _read_line(proc, 120, f"cpu probe on {host.name}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = {}
        for host, proc in zip(desc.hosts, procs):
            line = _read_line(proc, 60 + 10 * options.cpu_seconds, f"cpu probe on {host.name}")
            results[host.name] = json.loads(line)
        return results
    finally:
        _stop(procs)


def check(desc: TestbedDescription, options: CheckOptions = CheckOptions()) -> list[HostCheck]:
    """Measure the testbed `desc` (which must exist in full)."""
    require_root_and_support()
    found = take_inventory(desc.name)
    missing = [h.namespace for h in desc.hosts if h.namespace not in found.namespaces]
    missing += [h.cgroup for h in desc.hosts if h.cgroup not in found.cgroups]
    if missing:
        raise InputError("testbed", f"testbed {desc.name!r} is incomplete (missing "
                         f"{', '.join(missing[:3])}); run `dnnscale testbed down --name "
                         f"{desc.name}` and `up` again")
    network = measure_network(desc, options) if options.network and len(desc.hosts) > 1 else {}
    cpu = measure_cpu(desc, options) if options.cpu else {}
    checks = []
    for host in desc.hosts:
        net, share = network.get(host.name, {}), cpu.get(host.name, {})
        measured = HostMeasurement(
            egress_bytes_per_s=net.get("egress_bytes_per_s"),
            ingress_bytes_per_s=net.get("ingress_bytes_per_s"),
            latency_s=net.get("latency_s"), cpu_share=share.get("cpu_share"),
            matmul_flops_per_s=share.get("matmul_flops_per_s"), peer=net.get("peer"))
        expected = net.get("expected_bytes_per_s")
        checks.append(HostCheck(host, measured, expected, expected))
    return checks


def _merge(old: HostMeasurement | None, new: HostMeasurement | None) -> HostMeasurement | None:
    """`new`, keeping `old`'s values where `new` measured nothing (e.g. check --no-cpu)."""
    if old is None or new is None:
        return new or old
    return HostMeasurement(**{key: value if value is not None else getattr(old, key)
                              for key, value in vars(new).items()})


def with_measurements(desc: TestbedDescription, checks: list[HostCheck]) -> TestbedDescription:
    """`desc` with each host's measurements (for the description file), merged into the old."""
    by_name = {c.host.name: c.measured for c in checks}
    hosts = tuple(replace(h, measured=_merge(h.measured, by_name.get(h.name))) for h in desc.hosts)
    return replace(desc, hosts=hosts,
                   measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
