"""Calibration without torch: curve fitting, the profile format, and clusters that use one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.calibrate.fit import fit_separable
from dnnscale.calibrate.network import fit_alpha_beta
from dnnscale.system.profile import (REQUIRED_FLOP_CURVES, HardwareProfile, LinkFit,
                                        load_profile, profile_from_dict, profile_to_dict,
                                        save_profile)
from dnnscale.system import RateCurve, load_system
from dnnscale.plan import Config
from dnnscale.errors import InputError
from dnnscale.model import predict_config
from dnnscale.workload import zoo_workload


# ------------------------------------------------------------------------------------ fitting

def test_size_curve_reproduces_its_calibration_points() -> None:
    # Knots need not fall on the points, so the points lie on a straight log-log line, which
    # piecewise-linear interpolation between any knots reproduces exactly.
    sizes = [1e4, 1e5, 1e6, 1e7, 1e8]
    rates = [2e9 * (s / 1e4) ** 0.5 for s in sizes]        # r ∝ sqrt(size): a straight log-log line
    curve, factor = fit_separable(sizes, rates)
    assert factor is None
    for size, rate in zip(sizes, rates):
        assert curve.at(size) == pytest.approx(rate, rel=1e-6)


def test_separable_fit_reproduces_rate_times_intensity_factor() -> None:
    # r(F, I) = φ(F)·η(I) with φ = 1e11·(F/1e6)^0.2 and η = min(1, I/100)^0.5 (monotone, 1 at top).
    points = [(f, i) for f in (1e5, 1e6, 1e7, 1e8, 1e9) for i in (1.0, 10.0, 100.0)]
    rates = [1e11 * (f / 1e6) ** 0.2 * min(1.0, i / 100) ** 0.5 for f, i in points]
    curve, factor = fit_separable([p[0] for p in points], rates, [p[1] for p in points])
    assert factor is not None
    assert factor.at(100.0) == pytest.approx(1.0)
    assert factor.at(1.0) == pytest.approx(0.1, rel=1e-3)       # (1/100)^0.5 by hand
    for (f, i), rate in zip(points, rates):
        assert curve.at(f) * factor.at(i) == pytest.approx(rate, rel=1e-3)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(1e8, 1e12), min_size=2, max_size=8))
def test_fit_stays_within_measured_rates(rates) -> None:
    sizes = [10.0 ** (3 + k) for k in range(len(rates))]
    curve, _ = fit_separable(sizes, rates)
    # Hard constraints of the fit: within the measured rates ±10 %.
    assert min(rates) / 1.1 * 0.9999 <= min(curve.rates)
    assert max(curve.rates) <= max(rates) * 1.1 * 1.0001


def test_alpha_beta_fit_recovers_latency_and_bandwidth() -> None:
    latency_s, bandwidth = 30e-6, 2e9
    points = [(b, latency_s + b / bandwidth) for b in (1, 1e3, 1e5, 1e7)]
    a, b = fit_alpha_beta(points)
    # a: median of the ≤ 1 KiB times (30 µs + 0.5 ns, 30 µs + 500 ns): their mean, 30.25025 µs.
    assert a == pytest.approx(30.25025e-6, rel=1e-9)
    assert 1 / b == pytest.approx(bandwidth, rel=1e-3)


# ------------------------------------------------------------------------------------ profile

def sample_profile(scale: float = 1.0, network: bool = True) -> HardwareProfile:
    flat = RateCurve((1e5, 1e9), (2e10 * scale, 1e11 * scale))
    return HardwareProfile(
        machine={"hostname": "h", "cpu_model": "cpu", "cores": 2}, date="2026-11-30T05:00:00+00:00",
        torch_version="2.13.0", flops_per_s_per_core={key: flat for key in REQUIRED_FLOP_CURVES},
        intensity_factors={"linear.forward": RateCurve((1.0, 100.0), (0.2, 1.0))},
        bytes_per_s_per_core={"relu.forward": RateCurve((1e3, 1e7), (1e9, 2e10))},
        allocation_bytes_per_s_per_core=RateCurve((1e6, 1e8), (1e13, 4e9)),
        memory_bandwidth_bytes_per_s=1e10, update_s_per_param=1e-10, update_s_per_message=1e-6,
        network=LinkFit(3e9, 20e-6, ((1.0, 2e-5), (1e6, 3.5e-4))) if network else None,
        allreduce=(LinkFit(1e9, 40e-6, ((1e3, 1e-4),), peers=4),) if network else (),
        calibration={"quick": True})


def test_profile_round_trips_through_yaml(tmp_path) -> None:
    profile = sample_profile()
    path = tmp_path / "p.yaml"
    save_profile(profile, path)
    assert load_profile(path) == profile
    assert not [p for p in tmp_path.iterdir() if p.name != "p.yaml"]   # no temporary left


def test_profile_write_is_atomic(tmp_path, monkeypatch) -> None:
    path = tmp_path / "p.yaml"
    save_profile(sample_profile(), path)
    before = path.read_text()

    def broken_dump(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(yaml, "safe_dump", broken_dump)
    with pytest.raises(RuntimeError):
        save_profile(sample_profile(scale=2.0), path)
    assert path.read_text() == before


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("compute"), "profile.compute: missing"),
    (lambda d: d["compute"]["flops_per_s_per_core"].pop("conv2d.weight_grad"),
     "profile.compute.flops_per_s_per_core.conv2d.weight_grad: missing"),
    (lambda d: d["memory"].pop("update_s_per_param"), "profile.memory.update_s_per_param: missing"),
    (lambda d: d.update(format="other/9"), "profile.format: unsupported"),
    (lambda d: d["compute"]["flops_per_s_per_core"].update({"linear.forward": [[1, -5]]}),
     r"profile.compute.flops_per_s_per_core.linear.forward\[0\]: must be > 0"),
    (lambda d: d["network"].pop("latency_s"), "profile.network.latency_s: missing"),
    (lambda d: d["compute"]["bytes_per_s_per_core"].update({"relu.forward": [[2, 1], [1, 1]]}),
     "profile.compute.bytes_per_s_per_core.relu.forward: sizes must be strictly increasing"),
])
def test_incomplete_profile_names_what_is_missing(tmp_path, mutate, field) -> None:
    data = profile_to_dict(sample_profile())
    mutate(data)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=f"^{field}"):
        load_profile(path)


def test_corrupt_profile_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("format: dnnscale-profile/1\ncompute: [unclosed\n")
    with pytest.raises(InputError, match="^profile: malformed YAML"):
        load_profile(path)
    with pytest.raises(InputError, match="^profile: must be a YAML mapping"):
        profile_from_dict(["a list"])


# ------------------------------------------------------------------------------------ cluster

_CLUSTER = """\
name: mine
machines: 4
machine: {cores: 0.5, memory: 6GB, memory_bandwidth: 5GB/s,
          flops_per_core: 20GFLOP/s, update_time_per_param: 2ns}
network: {bandwidth: 2GB/s, latency: 30us}
"""


def _clusters(tmp_path, profile: HardwareProfile) -> tuple[object, object]:
    save_profile(profile, tmp_path / "prof.yaml")
    (tmp_path / "plain.yaml").write_text(_CLUSTER)
    (tmp_path / "calibrated.yaml").write_text(_CLUSTER + "profile: prof.yaml\n")
    return load_system(tmp_path / "plain.yaml"), load_system(tmp_path / "calibrated.yaml")


def test_cluster_profile_replaces_rates_and_network(tmp_path) -> None:
    plain, calibrated = _clusters(tmp_path, sample_profile())
    assert not plain.calibrated and calibrated.calibrated
    m = calibrated.machine
    # linear forward at 1e9 FLOP, intensity 100: 1e11 FLOP/s per core · η 1 · 0.5 core.
    assert m.flops_per_s("linear", "forward", 1e9, 100.0) == pytest.approx(5e10)
    # intensity 1: η = 0.2 -> 1e10.
    assert m.flops_per_s("linear", "forward", 1e9, 1.0) == pytest.approx(1e10)
    assert m.memory_bytes_per_s("relu", "forward", 1e7) == pytest.approx(1e10)   # 2e10 · 0.5
    assert m.memory_bandwidth_bytes_per_s == 1e10
    assert m.update_s_per_param == pytest.approx(1e-10 / 0.5)
    assert calibrated.network.bandwidth_bytes_per_s == 3e9
    assert calibrated.network.latency_s == 20e-6
    assert calibrated.machines == 4 and m.cores == 0.5 and m.memory_bytes == 6e9


def test_predict_follows_the_profile(tmp_path) -> None:
    workload = zoo_workload("adam-cifar10")
    config = Config(partitions=1, replicas=2, ps_shards=1, sync="ps-async", minibatch=32)
    plain, fast = _clusters(tmp_path, sample_profile(scale=1.0))
    _, slow = _clusters(tmp_path, sample_profile(scale=0.5))
    t_plain = predict_config(workload, plain, config).breakdown_s["compute"]
    t_fast = predict_config(workload, fast, config).breakdown_s["compute"]
    t_slow = predict_config(workload, slow, config).breakdown_s["compute"]
    assert t_fast != pytest.approx(t_plain, rel=0.01)
    # Halving every FLOP rate makes the compute-bound part of the step slower, by at most 2x.
    assert t_fast < t_slow <= 2 * t_fast * 1.0001


def test_cluster_profile_errors_name_the_field(tmp_path) -> None:
    (tmp_path / "c.yaml").write_text(_CLUSTER + "profile: nowhere.yaml\n")
    with pytest.raises(InputError, match="^cluster.profile: no profile file"):
        load_system(tmp_path / "c.yaml")
    data = profile_to_dict(sample_profile())
    del data["memory"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "c2.yaml").write_text(_CLUSTER + "profile: bad.yaml\n")
    with pytest.raises(InputError, match="^profile.memory: missing"):
        load_system(tmp_path / "c2.yaml")


def test_profile_lets_measured_fields_be_left_out(tmp_path) -> None:
    save_profile(sample_profile(), tmp_path / "prof.yaml")
    (tmp_path / "c.yaml").write_text("name: m\nmachines: 2\nmachine: {cores: 1, memory: 4GB}\n"
                                     "network: {}\nprofile: prof.yaml\n")
    cluster = load_system(tmp_path / "c.yaml")
    assert cluster.network.bandwidth_bytes_per_s == 3e9
    assert cluster.machine.update_s_per_param == pytest.approx(1e-10)


def test_uncalibrated_machine_ignores_intensity() -> None:
    machine = load_system("local").machine
    assert machine.flops_per_s("linear", "forward", 1e6, 0.1) == machine.flops_per_s(
        "linear", "forward", 1e6)
    assert machine.allocation_s(1e9) == 0.0
    assert machine.memory_bytes_per_s("relu", "forward", 1e6) == machine.memory_bandwidth_bytes_per_s


def test_calibrate_command_imports_no_torch() -> None:
    code = ("import sys; import dnnscale.calibrate.commands, dnnscale.system.profile; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_additive_fit_reproduces_compute_plus_memory_times() -> None:
    from dnnscale.calibrate.fit import fit_compute_memory

    # t = F / 1e11 + Q / 2e10: every point lies on the model, so the fit must reproduce it.
    calls = [(f, q) for f in (1e5, 1e6, 1e7, 1e8, 1e9) for q in (1e4, 1e6, 1e8)]
    seconds = [f / 1e11 + q / 2e10 for f, q in calls]
    phi, beta = fit_compute_memory([c[0] for c in calls], [c[1] for c in calls], seconds)
    for (f, q), t in zip(calls, seconds):
        assert f / phi.at(f) + q / beta.at(q) == pytest.approx(t, rel=0.02)
    # 1e9 FLOP and 1e4 bytes: compute bound, 10 ms by hand.
    assert 1e9 / phi.at(1e9) + 1e4 / beta.at(1e4) == pytest.approx(1e9 / 1e11, rel=0.02)


def test_alpha_beta_fit_with_small_and_large_messages() -> None:
    # Small messages: 20 µs flat (buffered); large: 20 µs + bytes / 25 MB/s.
    points = [(1, 20e-6), (64, 20e-6), (1024, 20e-6), (2**20, 20e-6 + 2**20 / 25e6),
              (4 * 2**20, 20e-6 + 4 * 2**20 / 25e6)]
    a, b = fit_alpha_beta(points)
    assert a == pytest.approx(20e-6)
    assert 1 / b == pytest.approx(25e6, rel=1e-6)


def test_cluster_records_allreduce_fits(tmp_path) -> None:
    _, calibrated = _clusters(tmp_path, sample_profile())
    assert calibrated.network.allreduce_fits == ((4, 1e9, 40e-6),)
    assert calibrated.network.allreduce_fit(4) == (1e9, 40e-6)
    assert calibrated.network.allreduce_fit(2) is None
    assert calibrated.profile is not None and calibrated.profile.date
