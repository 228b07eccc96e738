"""Issue 11 without root: the CFS period, the late cgroup join, the testbed-derived system's roles
and calibrated fits, the held-pull convoy, error bands, per-phase reasons, the summary's targets
and the committed fresh grids. Numbers are computed by hand in the comments."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dnnscale.errors import InputError
from dnnscale.model import predict_config
from dnnscale.model.collectives import (PULL_PIECE_CURVE, collective_time_s, collective_transfer,
                                       held_pull_convoy, held_pull_convoy_s)
from dnnscale.model.error_band import DATA_FILE, FORMAT, bottleneck_class, load_bands
from dnnscale.plan import Config, check_config
from dnnscale.runtime.placement import CGROUP_FD_ENV, join_cgroup
from dnnscale.system import System
from dnnscale.system.topology import LinkTier
from dnnscale.testbed import describe, spec
from dnnscale.testbed.describe import (HostDescription, HostMeasurement, TestbedDescription,
                                       cluster_from_description, load_description,
                                       rank_placements, save_description)
from dnnscale.testbed.fidelity import pace
from dnnscale.validate.grid import load_grid
from dnnscale.validate.reasons import phase_gaps, phase_reason
from dnnscale.workload import load_workload

from tests.fake_ip import install_fake_ip

ROOT = Path(__file__).resolve().parents[1]
GRIDS = ROOT / "benchmarks" / "validation"


def _host(name: str, role: str, index: int, rate: float, cpu: float, cgroup_root: Path = Path(
        "/sys/fs/cgroup/cpu"), measured: HostMeasurement | None = None) -> HostDescription:
    return HostDescription(name=name, role=role, namespace=f"dns-tb-{name}",
                           address=f"198.18.0.{index}", ifname="eth0", veth=f"dns-tb-{name}",
                           cgroup=str(cgroup_root / f"dns-tb-{name}"), rate_bytes_per_s=rate,
                           latency_s=0.0, cpu_cores=cpu, measured=measured, cpu_period_s=0.01)


def _desc(hosts: list[HostDescription]) -> TestbedDescription:
    return TestbedDescription(name="tb", subnet="198.18.0.0/24", bridge="dns-tb-br",
                              created="2026-12-01T00:00:00+00:00", hosts=tuple(hosts))


SIX_HOSTS = [_host(f"h{i}", "worker", i, 125e6, 0.25) for i in range(1, 7)]
PS_HOSTS = ([_host(f"h{i}", "worker", i, 125e6, 0.25) for i in range(1, 5)]
            + [_host("ps1", "ps", 5, 50e6, 0.25), _host("ps2", "ps", 6, 50e6, 0.25)])


# --- the CFS period ---------------------------------------------------------------------------

def test_default_period_is_ten_ms_and_grows_for_small_shares() -> None:
    assert spec.parse_cpu_period(None, [0.25]) == 0.01              # 0.25 x 10 ms = 2.5 ms >= 1 ms
    assert spec.parse_cpu_period(None, [0.25, 0.05]) == 0.02        # 1 ms / 0.05 = 20 ms
    assert spec.parse_cpu_period(None, [0.03]) == 0.034             # 1/0.03 = 33.3 -> 34 ms


def test_explicit_period_is_checked_against_the_kernels_minimum_quota() -> None:
    assert spec.parse_cpu_period("100ms", [0.25]) == pytest.approx(0.1)
    assert spec.parse_cpu_period("4ms", [0.25]) == pytest.approx(0.004)     # quota exactly 1 ms
    with pytest.raises(InputError, match=r"^--cpu-period: .*at least 4ms"):
        spec.parse_cpu_period("2ms", [0.25])                         # 0.5 ms quota
    with pytest.raises(InputError, match=r"^--cpu-period: must be between 1ms and 1s"):
        spec.parse_cpu_period("2s", [0.25])


def test_quota_files_follow_the_period() -> None:
    assert spec.cfs_quota_us(0.25, 0.01) == (10_000, 2_500)
    assert spec.cfs_quota_us(0.25, 0.1) == (100_000, 25_000)
    assert spec.cfs_quota_us(0.005, 0.1) == (100_000, 1_000)         # never under 1 ms


def test_make_spec_gives_every_host_the_period() -> None:
    s = spec.make_spec("tb", 2, "1gbit", cpu=0.25, ps_hosts=1, ps_cpu=0.1, cpu_period="20ms")
    assert [h.cpu_period_s for h in s.hosts] == [pytest.approx(0.02)] * 3
    with pytest.raises(InputError, match="--cpu-period"):
        spec.make_spec("tb", 2, "1gbit", cpu=0.25, ps_hosts=1, ps_cpu=0.1, cpu_period="5ms")


def test_description_keeps_the_period_and_old_files_read_as_100_ms(tmp_path: Path) -> None:
    desc = _desc(SIX_HOSTS[:2])
    path = tmp_path / "tb.yaml"
    save_description(desc, path)
    assert load_description(path).hosts[0].cpu_period_s == 0.01
    data = yaml.safe_load(path.read_text())
    for host in data["hosts"]:
        del host["cpu_period_s"]
    path.write_text(yaml.safe_dump(data))
    assert load_description(path).hosts[0].cpu_period_s == 0.1      # the kernel's default


def test_burst_pace_by_hand() -> None:
    assert pace(0.2, 0.05, 0.25) == pytest.approx(1.0)   # 0.05 CPU-s at 0.25 core = 0.2 s wall
    assert pace(0.1, 0.05, 0.25) == pytest.approx(0.5)   # twice the quota's pace: a burst
    assert pace(0.26, 0.05, 0.25) == pytest.approx(1.3)  # contention


# --- the late cgroup join ---------------------------------------------------------------------

def test_late_join_prefix_opens_the_cgroup_and_the_process_joins_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_ip(tmp_path, monkeypatch)
    (tmp_path / "dns-tb-h1").mkdir()
    host = _host("h1", "worker", 1, 125e6, 0.25, cgroup_root=tmp_path)
    placement = rank_placements(_desc([host]), 1, join_late=True)[0]
    assert placement.env[CGROUP_FD_ENV] == str(describe.CGROUP_FD)
    procs = tmp_path / "dns-tb-h1" / "cgroup.procs"
    program = ("import os, sys; from pathlib import Path; p = Path(sys.argv[1]);"
               "before = p.read_text(); from dnnscale.runtime.placement import join_cgroup;"
               "joined = join_cgroup(); print(repr(before), joined, os.getpid(),"
               " os.environ.get('DNNSCALE_CGROUP_FD'))")
    out = subprocess.run([*placement.prefix, sys.executable, "-c", program, str(procs)],
                         env={**os.environ, **placement.env}, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[0] == "''" and out[1] == "True"            # nothing written before the join
    assert procs.read_text() == out[2]                    # then its own pid
    assert out[3] == "None"                               # children will not join again
    immediate = rank_placements(_desc([host]), 1)[0]
    assert CGROUP_FD_ENV not in immediate.env and "echo $$" in immediate.prefix[2]


def test_join_cgroup_without_a_deferred_join_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CGROUP_FD_ENV, raising=False)
    assert join_cgroup() is False


# --- what is predicted is what runs -------------------------------------------------------------

def test_cluster_knows_its_ps_hosts_and_the_runtimes_convoy() -> None:
    cluster = cluster_from_description(_desc(PS_HOSTS))
    assert (cluster.machines, cluster.ps_machines, cluster.worker_machines) == (6, 2, 4)
    assert cluster.ps_pull_convoy
    assert cluster.network.bandwidth_bytes_per_s == 125e6
    assert cluster.ps_network is not None and cluster.ps_network.bandwidth_bytes_per_s == 50e6
    assert cluster_from_description(_desc(SIX_HOSTS)).ps_machines == 0


def test_all_reduce_workers_need_worker_hosts_when_ps_hosts_are_dedicated() -> None:
    cluster = cluster_from_description(_desc(PS_HOSTS))
    workload = load_workload("adam-cifar10")
    check_config(Config(1, 4, 0, "allreduce", 16), workload, cluster)
    with pytest.raises(InputError, match=r"^config: needs 6 worker machines .* has 4"):
        check_config(Config(1, 6, 0, "allreduce", 16), workload, cluster)   # the wave-1 mistake
    with pytest.raises(InputError, match=r"^config.ps_shards: 3 shards"):
        check_config(Config(1, 2, 3, "ps-sync", 16), workload, cluster)


def test_optimizer_budget_rules_and_placement_agree_on_a_ps_host_testbed() -> None:
    from dnnscale.optimize import optimize
    from dnnscale.runtime.layout import rank_roles

    desc = _desc(PS_HOSTS)
    cluster = cluster_from_description(desc)
    workload = load_workload("adam-cifar10")
    result = optimize(workload, cluster, machines=cluster.machines, top=5, minibatch=16,
                      curve=False)
    for prediction in result.top:
        config = prediction.config
        check_config(config, workload, cluster)
        roles = [role.kind for role in rank_roles(config)]
        hosts = [p.host for p in rank_placements(desc, len(roles), roles=roles)]
        workers = [h for h, r in zip(hosts, roles) if r == "worker"]
        shards = [h for h, r in zip(hosts, roles) if r == "ps"]
        assert len(set(workers)) == len(workers) and all(h.startswith("h") for h in workers)
        assert len(set(shards)) == len(shards) and all(h.startswith("ps") for h in shards)


def _profile_file(tmp_path: Path, under_quota: bool) -> Path:
    curve = [[1e6, 1e10], [1e9, 4e10]]
    base = {"format": "dnnscale-profile/1", "machine": {"hostname": "t", "cores": 2},
            "date": "2026-12-01", "torch_version": "2.13.0",
            "compute": {"flops_per_s_per_core": {
                f"{kind}.{phase}": curve for kind in ("conv2d", "linear")
                for phase in ("forward", "input_grad", "weight_grad")}},
            "memory": {"bandwidth_bytes_per_s": 8e9, "update_s_per_param": 3e-10},
            "network": {"bandwidth_bytes_per_s": 1.2e8, "latency_s": 6e-5, "points": []},
            "allreduce": [{"peers": 2, "bandwidth_bytes_per_s": 1.1e8, "latency_s": 2e-4},
                          {"peers": 3, "bandwidth_bytes_per_s": 1.0e8, "latency_s": 3e-4}],
            "ps_sync_pull": [{"peers": 2, "shards": 2, "bandwidth_bytes_per_s": 2e8,
                              "latency_s": 1e-4, "points": [[1e6, 0.01], [4e6, 0.05]]}],
            "collective_call_wait": [[2, 0.001], [3, 0.002], [4, 0.004]],
            "calibration": ({"under_quota": {"host": "h1", "cpu_cores": 0.25}}
                            if under_quota else {})}
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def test_apply_profile_wires_the_calibrated_fits_and_the_quota_cores(tmp_path: Path) -> None:
    from dnnscale.validate.profile import apply_profile

    measured = HostMeasurement(egress_bytes_per_s=1.19e8, ingress_bytes_per_s=1.2e8,
                               latency_s=5e-6, cpu_share=0.2)
    desc = _desc([dataclasses.replace(h, measured=measured) for h in SIX_HOSTS])
    cluster = cluster_from_description(desc)
    assert cluster.machine.cores == pytest.approx(0.2)              # check's measured share
    applied = apply_profile(cluster, _profile_file(tmp_path, True), desc)
    assert applied.machine.cores == pytest.approx(0.25)             # the asked quota
    assert applied.network.bandwidth_bytes_per_s == pytest.approx(1.19e8)   # the link stays
    assert applied.network.latency_s == pytest.approx(6e-5)        # max(5 µs, 60 µs)
    assert applied.network.allreduce_fit(3) == (1.0e8, 3e-4)
    assert applied.network.fit("ps_sync_pull", 2) == (2e8, 1e-4)
    # the measured held pulls, per piece: 2 shards, (x / 2, t / 2)
    assert applied.network.curve(PULL_PIECE_CURVE, 2) == ((5e5, 0.005), (2e6, 0.025))
    assert applied.collective_call_s == pytest.approx(0.002)        # median of 1, 2, 4 ms
    assert applied.call_s(3) == pytest.approx(0.002)                # per group size
    assert applied.call_s(4) == pytest.approx(0.004)
    free = apply_profile(cluster, _profile_file(tmp_path, False), desc)
    assert free.machine.cores == pytest.approx(0.2)                 # a free core x the share
    assert applied.network.fit("allgather", 3) is None              # no exchanges measured
    # a setting's supplement adds the runtime's layer exchanges, bounded by the link's rate
    from dnnscale.system.profile import LinkFit, supplement_to_dict

    supplement = tmp_path / "supplement.yaml"
    supplement.write_text(yaml.safe_dump(supplement_to_dict((
        LinkFit(5e8, 5e-3, peers=3, operation="allgather"),
        LinkFit(2e7, 1e-2, peers=3, operation="reduce_scatter")))))
    with_exchanges = apply_profile(cluster, _profile_file(tmp_path, True), desc, [supplement])
    assert with_exchanges.network.fit("allgather", 3) == (1.19e8, 5e-3)   # min(5e8, link)
    assert with_exchanges.network.fit("reduce_scatter", 3) == (2e7, 1e-2)


# --- the held-pull convoy -----------------------------------------------------------------------

def test_held_pull_convoy_by_hand() -> None:
    assert held_pull_convoy(1e6, 3) == (3e6, 3.0)                  # 3 workers x 1 MB in turn
    tier = LinkTier(1e8, 1e-4)
    assert collective_time_s("ps_sync_pull", "gloo", 1e6, 3, tier) == pytest.approx(
        3e6 / 1e8 + 3 * 1e-4)                                       # 0.0303 s
    fitted = dataclasses.replace(tier, fits=(("ps_sync_pull", 3, 2e8, 0.0),))
    assert collective_time_s("ps_sync_pull", "gloo", 1e6, 3, fitted) == pytest.approx(0.015)


def test_held_pull_convoy_from_the_measured_pieces_by_hand() -> None:
    # measured with 3 shards: 3 workers pulling 1 MB took 0.1 s, 4 MB 0.5 s; per piece
    # (x / 3, t / 3): (333 kB, 0.0333 s), (1.333 MB, 0.1667 s)
    tier = LinkTier(1e8, 1e-4, curves=((PULL_PIECE_CURVE, 3,
                                        ((1e6 / 3, 0.1 / 3), (4e6 / 3, 0.5 / 3))),))
    # the same shards: the measured time itself
    assert held_pull_convoy_s("gloo", 1e6, 3, 3, tier) == pytest.approx(0.1)
    # 2 shards, 2 MB each: pieces of 1 MB, f(1 MB) = 0.0333 + 0.1333 x (0.6667 / 1) = 0.1222 s
    # per shard's piece, and each worker's link carries 2 of them: 0.2444 s
    assert held_pull_convoy_s("gloo", 2e6, 3, 2, tier) == pytest.approx(
        2 * (0.1 / 3 + (0.4 / 3) * (1e6 - 1e6 / 3) / 1e6))
    # 1 shard, 1 MB: a piece of 1 MB as well, carried once: 0.1222 s
    assert held_pull_convoy_s("gloo", 1e6, 3, 1, tier) == pytest.approx(
        0.1 / 3 + (0.4 / 3) * (2 / 3))
    # no curve for 2 workers: the registry's alpha-beta, 2 x 1 MB / 1e8 + 2 x 0.1 ms
    assert held_pull_convoy_s("gloo", 1e6, 2, 3, tier) == pytest.approx(0.0202)
    assert held_pull_convoy_s("gloo", 0.0, 3, 3, tier) == 0.0


def test_gloo_reduce_scatter_uses_the_all_reduce_fit() -> None:
    tier = LinkTier(1e8, 1e-4, allreduce_fits=((2, 5e7, 0.0),))
    # ring all-reduce bytes among 2: 2·(1/2)·1e6 = 1e6, at the fitted 5e7 B/s = 0.02 s
    assert collective_time_s("reduce_scatter", "gloo", 1e6, 2, tier) == pytest.approx(0.02)
    assert collective_transfer("reduce_scatter", "gloo", 1e6, 2).bytes == pytest.approx(1e6)


def _plain_system(convoy: bool) -> System:
    from dnnscale.system import load_system

    base = load_system("local")
    return dataclasses.replace(base, machines=6, network=LinkTier(1e7, 1e-4), ps_network=None,
                               ps_pull_convoy=convoy)


def test_sync_ps_pull_pays_the_convoy_only_where_the_system_has_one() -> None:
    workload = load_workload("adam-cifar10")
    config = Config(1, 3, 3, "ps-sync", 16)
    W = workload.params
    plain = predict_config(workload, _plain_system(False), config).part("ps_pull")
    convoy = predict_config(workload, _plain_system(True), config).part("ps_pull")
    own = W * 4 / 1e7                                   # each worker pulls W·4 bytes at 10 MB/s
    shard_side = 3 * (-(-W // 3) / W) * W * 4 / 1e7     # R · share · pull / B_ps
    assert plain == pytest.approx(max(own, shard_side) + 3 * 1e-4)      # S messages of α
    assert convoy == pytest.approx(max(max(own, shard_side) + 3 * 1e-4,
                                       3 * W * 4 / 1e7 + 3 * 1e-4))     # three pulls in turn
    assert convoy > 2.9 * own


# --- error bands --------------------------------------------------------------------------------

# The regime key and the lookup: tests/test_error_bands.py.


def test_the_committed_bands_come_from_the_validation_results() -> None:
    data = load_bands()
    assert data["format"] == FORMAT and DATA_FILE.is_file()
    assert data["regimes"] and all(entry["rows"] >= 1 for entry in data["regimes"].values())
    for regime, entry in data["regimes"].items():
        assert entry["median_relative_error"] <= entry["p90_relative_error"] <= \
            entry["max_relative_error"]


def test_predictions_carry_their_band_in_json() -> None:
    workload = load_workload("adam-cifar10")
    from dnnscale.system import load_system

    prediction = predict_config(workload, load_system("local"), Config(1, 2, 1, "ps-async", 16))
    band = prediction.to_dict()["error_band"]
    assert band["regime"] == "cpu / fp32 / uncalibrated / ps-async / dp / " + \
        bottleneck_class(prediction.bottleneck)
    assert set(band) >= {"median_relative_error", "p90_relative_error", "rows", "source",
                         "regime_key", "validated", "reason"}
    json.dumps(band)


def test_predict_and_optimize_tables_show_the_band() -> None:
    from typer.testing import CliRunner

    from dnnscale.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["predict", "-w", "adam-cifar10", "-c", "local", "-P", "1",
                                 "-R", "2", "-S", "1", "--sync", "ps-async", "-n", "16"])
    assert result.exit_code == 0 and "error band" in result.output
    result = runner.invoke(app, ["optimize", "-w", "adam-mnist", "-c", "local", "-M", "3"])
    assert result.exit_code == 0, result.output
    assert "error band" in result.output


# --- per-phase reasons --------------------------------------------------------------------------

def test_phase_reason_names_the_phase_that_differs_most() -> None:
    row = {"predicted_breakdown_s": {"compute": 0.11, "ps_push": 0.026, "ps_pull": 0.026,
                                     "ps_wait": 0.098, "step": 0.26},
           "measured": {"per_phase_s": {"compute": 0.073, "ps_push": 0.052, "ps_pull": 0.096,
                                        "step": 0.225}}}
    gaps = phase_gaps(row["predicted_breakdown_s"], row["measured"]["per_phase_s"])
    assert gaps["ps_pull"] == pytest.approx((0.124, 0.096))       # pull + the PS wait
    assert gaps["compute"] == (0.11, 0.073)                        # 0.037 s apart: the most
    assert gaps["other"] == pytest.approx((0.0, 0.004))            # 0.225 − 0.221
    assert phase_reason(row).startswith("compute: predicted 0.110 s, measured 0.073 s "
                                        "(-0.037 s per step)")


# --- the summary's targets ----------------------------------------------------------------------

def _summary_module():  # type: ignore[no-untyped-def]
    import importlib.util

    path = ROOT / "benchmarks" / "validation_summary.py"
    module_spec = importlib.util.spec_from_file_location("validation_summary", path)
    module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_targets_by_hand() -> None:
    summary = _summary_module()
    figures = {"median_relative_error": 0.04, "p90_relative_error": 0.13,
               "max_relative_error": 0.2, "kendall_tau": 0.9, "regret": 0.0,
               "paleo": {"median_relative_error": 0.1, "p90_relative_error": 0.2,
                         "max_relative_error": 0.19},
               "optimus": {"median_relative_error": 0.05, "p90_relative_error": 0.3,
                           "max_relative_error": 0.5}}
    met = summary.targets_met(figures)
    assert met == {"median ≤ 5 %": True, "p90 ≤ 12 %": False, "max ≤ 25 %": True,
                   "Kendall τ ≥ 0.85": True, "regret 0 %": True,
                   "median below both baselines": True, "p90 below both baselines": True,
                   "max below both baselines": False}             # 0.2 is not below Paleo's 0.19


def test_summary_has_per_setting_rows_and_keeps_its_fields(tmp_path: Path) -> None:
    summary = _summary_module()
    rows = [{"id": f"c{i}", "set": "validation", "label": "x", "config": {"sync": "ps-sync"},
             "predicted_throughput_samples_per_s": p, "relative_error": abs(p - m) / m,
             "measured": {"throughput_samples_per_s": m, "spread": 0.01},
             "paleo_relative_error": 0.3, "optimus_relative_error": 0.2}
            for i, (p, m) in enumerate([(100, 100), (210, 200), (290, 300)])]
    rows.append({**rows[0], "id": "opt", "set": "optimizer", "relative_error": 0.5,
                 "reason": "compute: ..."})
    for setting in ("1gbit", "pshosts"):
        folder = tmp_path / f"cifar10-{setting}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps({
            "workload": "adam-cifar10", "network": setting, "rows": rows,
            "summary": {"regret": 0.0}}))
    summary.main(tmp_path)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert set(data) >= {"date", "machine", "settings", "benchmarks", "overall"}
    assert set(data["per_setting"]) == {"adam-cifar10 @ 1gbit", "adam-cifar10 @ pshosts"}
    block = data["per_setting"]["adam-cifar10 @ 1gbit"]
    assert block["configs"] == 4                                   # 3 validated + the optimizer's
    assert block["max_relative_error"] == pytest.approx(0.5)       # the optimizer's row counts
    assert block["targets"]["max ≤ 25 %"] is False
    assert set(data["per_network_setting"]) == {"1gbit", "pshosts"}
    assert [r["id"] for r in data["rows_over_15_percent"]] == ["opt", "opt"]


# --- the committed fresh grids ------------------------------------------------------------------

def _wave1_configs() -> set[Config]:
    names = ("grid-cifar10.yaml", "grid-imagenet22k-small.yaml", "grid-followup-async.yaml")
    return {c for name in names for c in load_grid(GRIDS / name).configs}


@pytest.mark.parametrize("bench", ["cifar10", "imagenet22k-small"])
def test_fresh_grids_fit_their_testbeds_and_are_new(bench: str) -> None:
    wave1 = _wave1_configs()
    for grid_name, hosts in (("6hosts", SIX_HOSTS), ("pshosts", PS_HOSTS)):
        grid = load_grid(GRIDS / f"grid-{bench}-{grid_name}.yaml")
        workload = load_workload(str(ROOT / grid.workload) if grid.workload.endswith(".yaml")
                                 else grid.workload)
        cluster = cluster_from_description(_desc(hosts))
        assert len(grid.configs) >= 8 and grid.repeats == 3
        for config in grid.configs + grid.calibration:
            check_config(config, workload, cluster)
        if grid_name == "6hosts":    # the settings of wave 1: none of its configurations
            assert not set(grid.configs) & wave1
        assert {c.sync for c in grid.configs} == {"ps-async", "ps-sync", "allreduce"}


def test_fresh_grids_hold_at_least_48_validated_configurations() -> None:
    count = 0
    for bench in ("cifar10", "imagenet22k-small"):
        count += 2 * len(load_grid(GRIDS / f"grid-{bench}-6hosts.yaml").configs)   # 100M, 1G
        count += len(load_grid(GRIDS / f"grid-{bench}-pshosts.yaml").configs)
    assert count >= 48


# --- timing under a quota -----------------------------------------------------------------------

class _Clocks:
    """A fake `time` module: each call of the timed function takes 4 ms of wall time, of which
    the thread runs 1 ms (throttled the rest)."""

    def __init__(self) -> None:
        self.wall, self.cpu = 0.0, 0.0

    def perf_counter(self) -> float:
        return self.wall

    def thread_time(self) -> float:
        return self.cpu

    def call(self) -> None:
        self.wall += 0.004
        self.cpu += 0.001


def test_quota_timing_is_wall_time_times_the_share(monkeypatch: pytest.MonkeyPatch) -> None:
    from dnnscale.calibrate import timing

    clocks = _Clocks()
    monkeypatch.setattr(timing, "time", clocks)
    monkeypatch.setattr(timing, "_QUOTA", None)
    assert timing.call_time_s(clocks.call, samples=3) == pytest.approx(0.001)   # CPU time
    timing.use_quota_timing(0.25, 0.01)               # samples of >= 10 periods = 100 ms
    assert timing._QUOTA is not None and timing._QUOTA.min_sample_s == pytest.approx(0.1)
    before = clocks.wall
    assert timing.call_time_s(clocks.call, samples=3, sample_s=0.001) == pytest.approx(0.001)
    # 4 ms of wall per call x 0.25 core. Sized by CPU time: 100 ms x 0.25 = 25 ms of CPU per
    # sample = 25 calls of 1 ms; 1 warm-up + 1 sizing call + 3 x 25 = 77 calls of 4 ms
    assert clocks.wall - before == pytest.approx(77 * 0.004)


def test_pull_groups_by_hand() -> None:
    from dnnscale.calibrate.run import coupled_groups, pull_groups

    assert pull_groups(6, 0, 6) == [(2, 2), (3, 3), (4, 2), (5, 1)]   # shards = min(g, 6 − g)
    assert pull_groups(4, 2, 6) == [(2, 2), (3, 2), (4, 2)]           # the dedicated PS hosts
    assert coupled_groups(6) == [2, 3, 4] and coupled_groups(2) == [2]
