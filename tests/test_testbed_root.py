"""Integration tests of the emulated cluster: real namespaces, links, qdiscs, cgroups (as root).

Every test tears down what it built, also on failure; `_assert_nothing_left` lists the objects of
a testbed name with the same commands a person would use (ip netns, ip link, tc, ls cgroupfs).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.testbed import build
from dnnscale.testbed.describe import (cluster_from_description, description_path, free_port,
                                       load_description, rank_placements)
from dnnscale.testbed.inventory import take_inventory
from dnnscale.testbed.system import TestbedError, support_problem
from dnnscale.testbed.teardown import down

PROBLEM = support_problem()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None, reason=f"testbed unavailable: {PROBLEM}")]

runner = CliRunner()
CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")


def _unique_name() -> str:
    return "t" + secrets.token_hex(2)  # 5 characters: fits the 6-character limit


def _objects_named(name: str) -> list[str]:
    """Everything on the machine whose name carries the testbed's prefix, listed independently."""
    prefix = f"dns-{name}-"
    found = [f"netns {line.split()[0]}" for line in
             subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
             if line.startswith(prefix)]
    for line in subprocess.run(["ip", "-o", "link", "show"], capture_output=True,
                               text=True).stdout.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0]
        if ifname.startswith(prefix):
            found.append(f"link {ifname}")
    for line in subprocess.run(["tc", "qdisc", "show"], capture_output=True,
                               text=True).stdout.splitlines():
        if f"dev {prefix}" in line:
            found.append(f"qdisc {line}")
    found += [f"cgroup {p}" for p in CGROUP_ROOT.iterdir() if p.name.startswith(prefix)]
    if description_path(name).exists():
        found.append(f"file {description_path(name)}")
    return found


def _assert_nothing_left(name: str) -> None:
    assert _objects_named(name) == []


def _teardown(name: str) -> None:
    try:
        down(name)
    finally:
        _assert_nothing_left(name)


@pytest.fixture(scope="module")
def testbed() -> Iterator[str]:
    """Three hosts at 100 mbit, 0.4 core each; always torn down."""
    name = _unique_name()
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "3", "--rate", "100mbit",
                                     "--cpu", "0.4", "--name", name, "--json"])
        assert result.exit_code == 0, result.output
        yield name
    finally:
        _teardown(name)


def test_up_builds_three_hosts_and_status_lists_them(testbed: str) -> None:
    desc = load_description(testbed)
    assert [h.name for h in desc.hosts] == ["h1", "h2", "h3"]
    assert len({h.address for h in desc.hosts}) == 3
    assert all(h.rate_bytes_per_s == 12.5e6 and h.cpu_cores == 0.4 for h in desc.hosts)
    for host in desc.hosts:
        # 0.4 core of the default 10 ms CFS period (docs/testbed.md)
        assert (Path(host.cgroup) / "cpu.cfs_period_us").read_text().strip() == "10000"
        assert (Path(host.cgroup) / "cpu.cfs_quota_us").read_text().strip() == "4000"
        qdiscs = subprocess.run(["tc", "-n", host.namespace, "qdisc", "show", "dev", "eth0"],
                                capture_output=True, text=True).stdout
        assert "tbf" in qdiscs and "rate 100Mbit" in qdiscs
    result = runner.invoke(app, ["testbed", "status", "--name", testbed, "--json"])
    assert result.exit_code == 0, result.output
    (state,) = json.loads(result.stdout)
    assert state["state"] == "complete"
    assert state["objects"]["namespaces"] == [f"dns-{testbed}-h{i}" for i in (1, 2, 3)]
    assert len(state["objects"]["qdiscs"]) == 3 and len(state["objects"]["cgroups"]) == 3


@pytest.mark.timeout(120)
def test_check_measures_each_link_within_ten_percent(testbed: str) -> None:
    result = runner.invoke(app, ["testbed", "check", "--name", testbed, "--seconds", "0.3",
                                 "--cpu-seconds", "1", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["links_off"] == []
    for host in report["hosts"]:
        for direction in ("egress", "ingress"):
            measured = host["measured"][f"{direction}_bytes_per_s"]
            assert abs(measured / 12.5e6 - 1) <= 0.10, (host["name"], direction, measured)
        assert 0 < host["measured"]["cpu_share"] <= 0.4 * 1.25  # a quota cannot be exceeded much
    # The measurements are stored and a System derived from the description uses them.
    desc = load_description(testbed)
    assert desc.measured_at is not None
    cluster = cluster_from_description(desc)
    rates = [h.measured.bandwidth_bytes_per_s for h in desc.hosts]
    assert cluster.network.bandwidth_bytes_per_s == pytest.approx(sum(rates) / 3)
    assert cluster.machines == 3


@pytest.mark.timeout(120)
def test_check_fills_a_fast_ps_link_from_several_workers() -> None:
    """A 300 mbit PS host behind 100 mbit workers is measured with all three at once, within
    10 % of the asked rate both ways. (A non-strict expected failure from wave 2 to issue 22:
    full-suite runs had measured 71-93 %; on 2026-12-02 it measured 94-96 % quiet and with one,
    two or three CPU-burning processes beside it, at 0.3 s and 2 s windows: docs/testbed.md.)"""
    name = _unique_name()
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "3", "--rate", "100mbit",
                                     "--ps-hosts", "1", "--ps-rate", "300mbit", "--cpu", "0.2",
                                     "--name", name])
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["testbed", "check", "--name", name, "--seconds", "0.3",
                                     "--no-cpu", "--json"])
        assert result.exit_code == 0, result.output
        ps = json.loads(result.stdout)["hosts"][3]
        assert ps["measured"]["peer"] == "h1,h2,h3"
        assert ps["expected"]["egress_bytes_per_s"] == 37.5e6            # 300 mbit / 8
        for direction in ("egress", "ingress"):
            assert abs(ps["measured"][f"{direction}_bytes_per_s"] / 37.5e6 - 1) <= 0.10
    finally:
        _teardown(name)


RANK_PROGRAM = textwrap.dedent("""
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, address, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    values = torch.full((1 << 18,), float(rank + 1))        # 1 MiB of fp32
    dist.all_reduce(values)
    if rank == 0:
        dist.send(torch.arange(1000, dtype=torch.float32), dst=1)
        received = None
    else:
        buffer = torch.zeros(1000)
        dist.recv(buffer, src=0)
        received = float(buffer.sum())
    dist.barrier()
    dist.destroy_process_group()
    cpu_cgroup = [l for l in open("/proc/self/cgroup").read().splitlines() if ":cpu:" in l]
    print(json.dumps({"rank": rank, "sum": float(values[0]), "received": received,
                      "netns": os.readlink("/proc/self/ns/net"), "cgroup": cpu_cgroup,
                      "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}))
""")


@pytest.mark.timeout(150)
def test_two_rank_gloo_run_across_hosts(testbed: str) -> None:
    pytest.importorskip("torch")
    placements = rank_placements(testbed, 2)
    assert [p.host for p in placements] == ["h1", "h2"]
    port = free_port(placements[0])
    procs = []
    try:
        for rank, placement in enumerate(placements):
            command = [*placement.prefix, sys.executable, "-c", RANK_PROGRAM, str(rank),
                       placements[0].address, str(port)]
            procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env={**os.environ, **placement.env}))
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-2000:]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert [r["sum"] for r in results] == [3.0, 3.0]                 # 1 + 2 on both ranks
    assert results[1]["received"] == sum(range(1000))
    for rank, result in enumerate(results):
        host = f"dns-{testbed}-h{rank + 1}"
        inode = os.stat(f"/run/netns/{host}").st_ino
        assert result["netns"] == f"net:[{inode}]"                    # in the host's namespace
        assert result["cgroup"][0].endswith(f":/{host}")              # and in its cgroup
        assert result["ifname"] == "eth0"


def test_up_twice_is_refused_and_leaves_the_testbed_intact(testbed: str) -> None:
    before = take_inventory(testbed)
    result = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "1gbit",
                                 "--name", testbed])
    assert result.exit_code == 2
    assert "already exists" in result.output
    assert take_inventory(testbed) == before
    assert len(load_description(testbed).hosts) == 3


@pytest.mark.timeout(60)
def test_down_removes_everything_and_stops_processes_inside(testbed: str) -> None:
    """A second testbed beside the module's: its own subnet, and `down` leaves the other alone."""
    name = _unique_name()
    other_before = take_inventory(testbed)
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--ps-hosts", "1",
                                     "--rate", "200mbit", "--ps-rate", "1gbit", "--cpu", "0.2",
                                     "--name", name])
        assert result.exit_code == 0, result.output
        objects = _objects_named(name)
        kinds = [obj.split()[0] for obj in objects]
        assert [kinds.count(k) for k in ("netns", "link", "cgroup", "file")] == [3, 4, 3, 1]
        assert sum("qdisc tbf" in obj for obj in objects) == 3     # the bridge-side ends
        assert load_description(name).subnet != load_description(testbed).subnet
        placement = rank_placements(name, 1, roles=["ps"])[0]
        assert placement.host == "ps1"
        stray = subprocess.Popen([*placement.prefix, "sleep", "60"])
        deadline = time.monotonic() + 10
        while str(stray.pid) not in (CGROUP_ROOT / f"dns-{name}-ps1" / "cgroup.procs").read_text():
            assert time.monotonic() < deadline, "the process never joined the cgroup"
            time.sleep(0.02)
        result = runner.invoke(app, ["testbed", "down", "--name", name, "--json"])
        assert result.exit_code == 0, result.output
        assert stray.wait(timeout=10) != 0                     # down stopped it
        assert stray.pid in json.loads(result.stdout)["killed_pids"]
        _assert_nothing_left(name)
        assert take_inventory(testbed) == other_before
        again = runner.invoke(app, ["testbed", "down", "--name", name])
        assert again.exit_code == 0 and "nothing to remove" in again.output
    finally:
        _teardown(name)


def _wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _slow_up(name: str, hosts: int) -> subprocess.Popen[str]:
    env = {**os.environ, build.STEP_DELAY_ENV: "0.1"}
    return subprocess.Popen([sys.executable, "-m", "dnnscale.cli", "testbed", "up", "--hosts",
                             str(hosts), "--rate", "100mbit", "--cpu", "0.1", "--name", name],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(60)
def test_down_after_a_killed_up_cleans_up() -> None:
    name = _unique_name()
    proc = _slow_up(name, 6)
    try:
        _wait_for(lambda: f"dns-{name}-h2" in take_inventory(name).namespaces, 30, "host h2")
        proc.kill()
        proc.wait(timeout=10)
        left = take_inventory(name)
        assert not left.empty and f"dns-{name}-h6" not in left.namespaces   # really half-built
        assert not description_path(name).exists()
        (state,) = json.loads(runner.invoke(app, ["testbed", "status", "--name", name,
                                                  "--json"]).stdout)
        assert state["state"] == "incomplete"
        result = runner.invoke(app, ["testbed", "down", "--name", name])
        assert result.exit_code == 0, result.output
        _assert_nothing_left(name)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _teardown(name)


@pytest.mark.timeout(60)
def test_sigterm_during_up_rolls_back() -> None:
    name = _unique_name()
    proc = _slow_up(name, 6)
    try:
        _wait_for(lambda: f"dns-{name}-h2" in take_inventory(name).namespaces, 30, "host h2")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 130
        assert "interrupted; everything it had made was removed" in err
        _assert_nothing_left(name)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _teardown(name)


def test_down_cleans_up_objects_made_by_hand() -> None:
    """A crash can leave any subset: here a namespace, a veth and a cgroup, no bridge, no file."""
    name = _unique_name()
    try:
        subprocess.run(["ip", "netns", "add", f"dns-{name}-h1"], check=True)
        subprocess.run(["ip", "link", "add", f"dns-{name}-h1", "type", "veth", "peer", "name",
                        "eth0", "netns", f"dns-{name}-h1"], check=True)
        subprocess.run(["tc", "qdisc", "add", "dev", f"dns-{name}-h1", "root", "tbf", "rate",
                        "1mbit", "burst", "64kb", "latency", "100ms"], check=True)
        (CGROUP_ROOT / f"dns-{name}-h2").mkdir()
        assert len(_objects_named(name)) == 4
        result = runner.invoke(app, ["testbed", "down", "--name", name])
        assert result.exit_code == 0, result.output
        _assert_nothing_left(name)
    finally:
        _teardown(name)


def test_failure_half_way_through_up_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _unique_name()
    real_make_host = build._make_host
    calls = []

    def failing_make_host(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 3:
            raise TestbedError("injected failure at the third host")
        return real_make_host(*args, **kwargs)

    monkeypatch.setattr(build, "_make_host", failing_make_host)
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "4", "--rate", "100mbit",
                                     "--name", name])
        assert result.exit_code == 1
        assert "injected failure" in result.output
        _assert_nothing_left(name)
    finally:
        _teardown(name)


def test_latency_is_added_or_refused_cleanly() -> None:
    """With netem, --latency shows in the round trip; without it, a clear refusal, nothing left."""
    name = _unique_name()
    try:
        result = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "1gbit",
                                     "--latency", "2ms", "--cpu", "0.2", "--name", name])
        if result.exit_code == 2:
            assert "netem" in result.output
            _assert_nothing_left(name)
            return
        assert result.exit_code == 0, result.output
        checked = runner.invoke(app, ["testbed", "check", "--name", name, "--seconds", "0.2",
                                      "--no-cpu", "--json"])
        for host in json.loads(checked.stdout)["hosts"]:
            assert host["measured"]["latency_s"] >= 0.9 * 2e-3
    finally:
        _teardown(name)
