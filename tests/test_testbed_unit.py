"""Testbed pieces that need no root: names, flags, the description file, placements, the
derived System, the command prefix, the probes over loopback, and clear refusals."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.system import load_system
from dnnscale.errors import InputError
from dnnscale.testbed import build, check, describe, probe, spec
from dnnscale.testbed.describe import (HostDescription, HostMeasurement, TestbedDescription,
                                       cluster_from_description, load_description,
                                       rank_placements, save_description)
from dnnscale.testbed.names import TestbedNames, check_name, is_ours, owner_of
from tests.fake_ip import install_fake_ip

runner = CliRunner()


# --- names ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tb", "a", "abc123", "z9"])
def test_valid_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", "Tb", "1tb", "abcdefg", "t-b", "t b", "tb!"])
def test_invalid_names_name_the_flag(name: str) -> None:
    with pytest.raises(InputError, match=r"^--name: must be 1-6"):
        check_name(name, "--name")


@pytest.mark.parametrize("obj,name,ours", [
    ("dns-tb-h1", "tb", True), ("dns-tb-ps12", "tb", True), ("dns-tb-br", "tb", True),
    ("dns-tb-h1", None, True), ("dns-tb-h1", "t", False), ("dns-tbx-h1", "tb", False),
    ("dns-tb-h0", "tb", False), ("dns-tb-h100", "tb", False), ("dns-tb-h1x", "tb", False),
    ("dns-tb-eth0", "tb", False), ("dns-server", None, False), ("eth0", None, False),
])
def test_ownership_is_decided_by_the_exact_pattern(obj: str, name: str | None, ours: bool) -> None:
    assert is_ours(obj, name) is ours


@given(st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True), st.sampled_from(["worker", "ps"]),
       st.integers(1, 99))
def test_every_object_name_fits_linux_and_maps_back(name: str, role: str, index: int) -> None:
    names = TestbedNames(name)
    host = names.host(role, index)
    for ifname in (names.veth(host), names.bridge):
        assert len(ifname) <= 15                         # IFNAMSIZ - 1
        assert is_ours(ifname, name) and owner_of(ifname) == name
    assert is_ours(names.namespace(host), name) and is_ours(names.cgroup(host).name, name)


# --- the up flags -----------------------------------------------------------------------------

def test_make_spec_converts_units_and_numbers_hosts() -> None:
    s = spec.make_spec("tb", 2, "200mbit", "0", 0.3, ps_hosts=1, ps_rate="1gbit")
    assert [(h.name, h.role) for h in s.hosts] == [("h1", "worker"), ("h2", "worker"), ("ps1", "ps")]
    assert [h.rate_bytes_per_s for h in s.hosts] == [25e6, 25e6, 125e6]   # 200e6/8, 1e9/8
    assert [h.cpu_cores for h in s.hosts] == [0.3, 0.3, 0.3]              # PS inherit --cpu
    assert s.cpu_cores_total == pytest.approx(0.9)


def test_latency_flag_is_seconds() -> None:
    s = spec.make_spec("tb", 1, "1gbit", "100us", 0.5)
    assert s.hosts[0].latency_s == pytest.approx(1e-4)


def test_default_cpu_share_splits_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert spec.default_cpu_share(6) == 0.26             # floor(100 * 0.8 * 2 / 6) / 100
    assert spec.default_cpu_share(1) == 1.0              # never more than one core
    s = spec.make_spec("tb", 3, "1gbit", cpu=0.6)
    assert "1.8 cores" in (spec.cpu_budget_warning(s) or "")
    assert spec.cpu_budget_warning(spec.make_spec("tb", 3, "1gbit", cpu=0.5)) is None


@pytest.mark.parametrize("kwargs,field", [
    ({"hosts": 0}, "--hosts"), ({"hosts": 100}, "--hosts"), ({"rate": "fast"}, "--rate"),
    ({"rate": "0mbit"}, "--rate"), ({"rate": "5"}, "--rate"), ({"latency": "-1ms"}, "--latency"),
    ({"latency": "2s"}, "--latency"), ({"cpu": 0.0}, "--cpu"), ({"cpu": 10_000.0}, "--cpu"),
    ({"ps_rate": "1gbit"}, "--ps-rate"), ({"ps_cpu": 0.2}, "--ps-cpu"),
    ({"name": "Bad"}, "--name"),
])
def test_bad_flags_name_the_flag(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"name": "tb", "hosts": 2, "rate": "100mbit"}
    args.update(kwargs)
    with pytest.raises(InputError) as info:
        spec.make_spec(**args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_tbf_arguments() -> None:
    # 100 mbit: 12.5e6 B/s; 2 ms of it is 25 kB < 64 KiB, so the burst is 64 KiB.
    assert build.tbf_args(12.5e6) == ["tbf", "rate", "100000000bit", "burst", "65536",
                                      "latency", "100ms"]
    assert build.tbf_args(125e6)[4] == "250000"           # 1 gbit: 2 ms = 250 kB


def test_subnets_are_the_first_free_24_in_the_benchmark_block() -> None:
    assert build.choose_subnet(set()) == "198.18.0.0/24"
    assert build.choose_subnet({"198.18.0.0/24", "198.18.1.0/24"}) == "198.18.2.0/24"
    with pytest.raises(InputError, match="in use"):
        build.choose_subnet({str(s) for s in spec.SUBNETS})


@given(st.sets(st.integers(0, len(spec.SUBNETS) - 2), max_size=40))
def test_chosen_subnet_never_collides(taken_indices: set[int]) -> None:
    taken = {str(spec.SUBNETS[i]) for i in taken_indices}
    chosen = build.choose_subnet(taken)
    assert chosen not in taken
    assert ipaddress.ip_network(chosen).subnet_of(ipaddress.ip_network("198.18.0.0/15"))


# --- the description file ---------------------------------------------------------------------

def _host(name: str, role: str, index: int, rate: float, cpu: float, cgroup_root: Path = Path(
        "/sys/fs/cgroup/cpu"), measured: HostMeasurement | None = None) -> HostDescription:
    return HostDescription(name=name, role=role, namespace=f"dns-tb-{name}",
                           address=f"198.18.0.{index}", ifname="eth0", veth=f"dns-tb-{name}",
                           cgroup=str(cgroup_root / f"dns-tb-{name}"), rate_bytes_per_s=rate,
                           latency_s=0.0, cpu_cores=cpu, measured=measured)


def _desc(hosts: list[HostDescription]) -> TestbedDescription:
    return TestbedDescription(name="tb", subnet="198.18.0.0/24", bridge="dns-tb-br",
                              created="2026-11-30T05:00:00+00:00", hosts=tuple(hosts))


TWO_WORKERS_ONE_PS = [_host("h1", "worker", 1, 25e6, 0.3), _host("h2", "worker", 2, 25e6, 0.3),
                      _host("ps1", "ps", 3, 125e6, 0.5)]


def test_description_round_trips_through_yaml(tmp_path: Path) -> None:
    measured = HostMeasurement(egress_bytes_per_s=2.4e7, ingress_bytes_per_s=2.3e7,
                               latency_s=3e-5, cpu_share=0.29, matmul_flops_per_s=3e10, peer="h2")
    desc = _desc([_host("h1", "worker", 1, 25e6, 0.3, measured=measured),
                  *TWO_WORKERS_ONE_PS[1:]])
    path = tmp_path / "tb.yaml"
    save_description(desc, path)
    loaded = load_description(path)
    assert loaded == desc
    assert loaded.source == str(path)


def test_a_name_resolves_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(describe.STATE_DIR_ENV, str(tmp_path))
    save_description(_desc(TWO_WORKERS_ONE_PS), tmp_path / "tb.yaml")
    assert load_description("tb").hosts[2].name == "ps1"
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    monkeypatch.chdir(empty)
    assert load_description(Path("tb")).name == "tb"     # `run --testbed tb` passes a Path
    with pytest.raises(InputError, match="no testbed description.*up --name other"):
        load_description("other")


@pytest.mark.parametrize("change,field", [
    (lambda d: d["hosts"][0].update(address="10.0.0.1"), "testbed.hosts[0].address"),
    (lambda d: d["hosts"][1].update(namespace="dns-xx-h1"), "testbed.hosts[1].namespace"),
    (lambda d: d["hosts"][0].update(cgroup="/sys/fs/cgroup/cpu/user"), "testbed.hosts[0].cgroup"),
    (lambda d: d["hosts"][0].update(role="boss"), "testbed.hosts[0].role"),
    (lambda d: d["hosts"][0].update(rate_bytes_per_s="fast"), "testbed.hosts[0].rate_bytes_per_s"),
    (lambda d: d["hosts"][0].pop("cpu_cores"), "testbed.hosts[0].cpu_cores"),
    (lambda d: d.update(subnet="10.0.0.0/24"), "testbed.subnet"),
    (lambda d: d.update(hosts=[]), "testbed.hosts"),
])
def test_bad_description_names_the_field(change, field: str) -> None:  # type: ignore[no-untyped-def]
    data = _desc(TWO_WORKERS_ONE_PS).to_dict()
    change(data)
    with pytest.raises(InputError) as info:
        describe.description_from_dict(data)
    assert info.value.field == field


# --- placements -------------------------------------------------------------------------------

def test_ranks_spread_over_hosts_of_their_role() -> None:
    desc = _desc(TWO_WORKERS_ONE_PS)
    assert [p.host for p in rank_placements(desc, 3)] == ["h1", "h2", "h1"]
    placed = rank_placements(desc, 4, roles=["ps", "worker", "worker", "ps"])
    assert [p.host for p in placed] == ["ps1", "h1", "h2", "ps1"]
    assert [p.address for p in placed] == ["198.18.0.3", "198.18.0.1", "198.18.0.2", "198.18.0.3"]
    assert all(p.ifname == "eth0" and p.env["GLOO_SOCKET_IFNAME"] == "eth0" for p in placed)
    assert all(p.env["OMP_NUM_THREADS"] == "1" for p in placed)


@pytest.mark.parametrize("count,roles,match", [
    (2, ["worker"], "one role per rank"), (1, ["boss"], "must be one of"),
    (0, None, "integer >= 1"),
])
def test_bad_placement_requests(count: int, roles: list[str] | None, match: str) -> None:
    with pytest.raises(InputError, match=match):
        rank_placements(_desc(TWO_WORKERS_ONE_PS), count, roles=roles)


def test_ps_ranks_without_ps_hosts_follow_the_workers() -> None:
    # two worker hosts, no PS host: worker rank 0 on h1, the PS rank on the next host, h2
    placed = rank_placements(_desc(TWO_WORKERS_ONE_PS[:2]), 2, roles=["worker", "ps"])
    assert [p.host for p in placed] == ["h1", "h2"]


def test_prefix_joins_the_cgroup_and_keeps_the_pid(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix writes its own pid into the cgroup, then execs `ip netns exec NS CMD`; a fake
    `ip` (that just runs CMD) shows the command keeps that pid and receives its arguments."""
    fake_ip = install_fake_ip(tmp_path, monkeypatch)
    cgroup = tmp_path / "dns-tb-h1"
    cgroup.mkdir()
    host = _host("h1", "worker", 1, 25e6, 0.3, cgroup_root=tmp_path)
    prefix = describe.enter_prefix(host)
    assert prefix[-1] == "dnnscale-rank" and str(fake_ip) in prefix[2]
    out = subprocess.run([*prefix, "sh", "-c", 'echo "$$ $1"', "x", "arg with space"],
                         capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert (cgroup / "cgroup.procs").read_text().strip() == out[0]
    assert out[1].strip() == "arg with space"


# --- the derived System ----------------------------------------------------------------------

def test_cluster_from_asked_values() -> None:
    cluster = cluster_from_description(_desc(TWO_WORKERS_ONE_PS))
    local = load_system("local").machine
    assert cluster.machines == 3
    assert cluster.network.bandwidth_bytes_per_s == 25e6 and cluster.network.latency_s == 0
    assert cluster.ps_net.bandwidth_bytes_per_s == 125e6
    assert cluster.machine.cores == 0.3 and cluster.ps.cores == 0.5
    assert cluster.machine.flops_per_s_per_core == local.flops_per_s_per_core
    # Whole-machine rate = the local per-core curve x the CPU share.
    assert cluster.machine.flops_per_s("linear", "forward", 1e8) == pytest.approx(
        0.3 * local.flops_per_s("linear", "forward", 1e8) / local.cores)
    assert not cluster.calibrated


def test_cluster_prefers_measured_values_when_every_host_has_them() -> None:
    m1 = HostMeasurement(egress_bytes_per_s=24e6, ingress_bytes_per_s=23e6, latency_s=4e-5,
                         cpu_share=0.28)
    m2 = HostMeasurement(egress_bytes_per_s=22e6, ingress_bytes_per_s=24e6, latency_s=6e-5,
                         cpu_share=0.26)
    hosts = [_host("h1", "worker", 1, 25e6, 0.3, measured=m1),
             _host("h2", "worker", 2, 25e6, 0.3, measured=m2), TWO_WORKERS_ONE_PS[2]]
    cluster = cluster_from_description(_desc(hosts))
    assert cluster.network.bandwidth_bytes_per_s == pytest.approx((23e6 + 22e6) / 2)  # slower way
    assert cluster.network.latency_s == pytest.approx(5e-5)
    assert cluster.machine.cores == pytest.approx(0.27)
    assert cluster.ps.cores == 0.5                       # PS host not measured: as asked
    partial = cluster_from_description(_desc([hosts[0], TWO_WORKERS_ONE_PS[1]]))
    assert partial.network.bandwidth_bytes_per_s == 25e6  # one host unmeasured: as asked


def test_a_later_partial_check_keeps_earlier_measurements() -> None:
    old = HostMeasurement(egress_bytes_per_s=1e7, ingress_bytes_per_s=1e7, cpu_share=0.3)
    desc = _desc([_host("h1", "worker", 1, 25e6, 0.3, measured=old)])
    new = HostMeasurement(egress_bytes_per_s=2e7, ingress_bytes_per_s=2.1e7)
    merged = check.with_measurements(desc, [check.HostCheck(desc.hosts[0], new, 25e6, 25e6)])
    assert merged.hosts[0].measured == HostMeasurement(egress_bytes_per_s=2e7,
                                                       ingress_bytes_per_s=2.1e7, cpu_share=0.3)
    assert merged.measured_at is not None


# --- check's plan -------------------------------------------------------------------------------

def test_each_host_is_measured_against_the_fastest_other_hosts() -> None:
    hosts = tuple(TWO_WORKERS_ONE_PS)
    assert [p.name for p in check.choose_peers(hosts, 0)] == ["ps1"]
    assert [p.name for p in check.choose_peers(hosts, 1)] == ["ps1"]
    # The 1 gbit PS host needs both 200 mbit workers and still cannot be filled: 2 x 25e6 B/s.
    peers = check.choose_peers(hosts, 2)
    assert [p.name for p in peers] == ["h1", "h2"]
    assert check.expected_rate(hosts[2], peers) == 50e6
    assert check.expected_rate(hosts[0], check.choose_peers(hosts, 0)) == 25e6
    equal = tuple(_host(f"h{i}", "worker", i, 25e6, 0.3) for i in (1, 2, 3))
    assert [p.name for p in check.choose_peers(equal, 2)] == ["h1"]   # ring order among equals
    assert check.flow_bytes(12.5e6, 0.4) == 5_000_000
    assert check.flow_bytes(1e3, 0.4) == check.MIN_FLOW_BYTES


def test_aggregate_rate_spans_all_flows() -> None:
    # Two flows of 1e6 bytes (first reads 1e5 each) from t=10.0 to t=10.5 and t=10.1 to t=11.0:
    # (0.9e6 + 0.9e6) payload bytes over 1.0 s.
    flows = [{"bytes": 1e6, "first_bytes": 1e5, "t_first": 10.0, "t_last": 10.5},
             {"bytes": 1e6, "first_bytes": 1e5, "t_first": 10.1, "t_last": 11.0}]
    assert probe.aggregate_rate(flows) == pytest.approx(1.8e6)
    assert probe.aggregate_rate([{"bytes": 5, "first_bytes": 5, "t_first": 1, "t_last": 1}]) is None


def test_aggregate_rate_of_staggered_flows_uses_the_common_window() -> None:
    # Flow a: 1 MB/s from t=0 to t=4; flow b starts late, 2 MB/s from t=1 to t=3.5. Both run in
    # [1, 3.5] (2.5 s >= half the 4 s span): a gets 2.5 MB and b 5 MB there -> 3 MB/s.
    a = {"bytes": 4e6, "first_bytes": 1e3, "t_first": 0.001, "t_last": 4.0,
         "samples": [[0.001, 1e3], [2.0, 2e6], [4.0, 4e6]]}
    b = {"bytes": 5e6, "first_bytes": 1e3, "t_first": 1.0, "t_last": 3.5,
         "samples": [[1.0, 0.0], [3.5, 5e6]]}
    assert probe.aggregate_rate([a, b]) == pytest.approx(3e6, rel=1e-3)


# --- the probes, over loopback ------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_probe_server_sink_and_ping_over_loopback() -> None:
    server = subprocess.Popen([sys.executable, "-m", "dnnscale.testbed.probe", "serve", "--bind",
                               "127.0.0.1", "--max-seconds", "30"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        # Two flows at once to the same server: it answers each connection in its own thread.
        result = probe.send([("127.0.0.1", port), ("127.0.0.1", port)], 3_000_000, ping_count=20)
        assert [flow["bytes"] for flow in result["flows"]] == [3_000_000, 3_000_000]
        assert all(flow["t_last"] >= flow["t_first"] for flow in result["flows"])
        assert result["rate_bytes_per_s"] == probe.aggregate_rate(result["flows"]) > 0
        assert len(result["rtts_s"]) == 20 and all(0 < r < 1 for r in result["rtts_s"])
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.timeout(60)
def test_cpu_probe_reports_share_and_rate() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "dnnscale.testbed.probe", "cpu", "--seconds",
                             "0.3"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        start = time.perf_counter()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.stdout.readline())
        assert time.perf_counter() - start >= 0.3
        assert 0 < result["cpu_share"] <= 1.1           # one thread: at most one core
        assert result["matmul_flops_per_s"] == pytest.approx(
            2 * 256**3 * result["calls"] / result["wall_s"])
    finally:
        proc.wait(timeout=10)


# --- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["up", "--hosts", "2", "--rate", "100mbit", "--name", "zz"],
                                  ["down", "--name", "zz"], ["check", "--name", "zz"]])
def test_commands_refuse_without_root(args: list[str], monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(describe.STATE_DIR_ENV, str(tmp_path))
    save_description(_desc(TWO_WORKERS_ONE_PS), tmp_path / "zz.yaml")   # for `check`
    result = runner.invoke(app, ["testbed", *args])
    assert result.exit_code == 2
    assert "needs root" in result.output


def test_bad_flags_exit_2_with_one_line() -> None:
    result = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "lots"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --rate: cannot read 'lots' as a bandwidth (e.g. '10Gbit/s' or '1.25GB/s')"]
