"""Issue 22: a partition collective that follows computation under a CPU quota waits for the
quota's next period (model/quota.py), priced from the runtime's measured CPU per call; by hand,
and the measurement's file and microbenchmark."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.model.quota import quota_stall_s
from dnnscale.model.sharding import CommEvent
from dnnscale.model.quota import call_wait_s
from dnnscale.system.profile import collective_cpu_to_dict, load_collective_cpu
from tests.tiny import tiny_cluster


def test_the_stall_by_hand() -> None:
    # 0.25 core, T = 10 ms: Q = 2.5 ms; a 1 ms collective stalls with p = 0.4 per member for
    # the 7.5 ms left of the period; two members: 7.5 · (1 − 0.6²) = 4.8 ms
    assert quota_stall_s(0.01, 0.25, 1e-3, 2) == pytest.approx(7.5e-3 * (1 - 0.6 ** 2))
    assert quota_stall_s(0.01, 0.25, 1e-3, 3) == pytest.approx(7.5e-3 * (1 - 0.6 ** 3))
    # CPU beyond the budget: every member stalls, the whole rest of the period
    assert quota_stall_s(0.01, 0.25, 5e-3, 2) == pytest.approx(7.5e-3)
    # no quota, no CPU or one member: nothing
    assert quota_stall_s(0.01, 1.0, 1e-3, 2) == 0.0
    assert quota_stall_s(0.01, 0.25, 0.0, 2) == 0.0
    assert quota_stall_s(0.01, 0.25, 1e-3, 1) == 0.0


@given(q=st.floats(0.05, 0.95), cpu=st.floats(1e-6, 0.05), members=st.integers(2, 8))
def test_the_stall_is_bounded_and_grows_with_the_group(q: float, cpu: float,
                                                       members: int) -> None:
    stall = quota_stall_s(0.01, q, cpu, members)
    assert 0.0 <= stall <= (1 - q) * 0.01 + 1e-15
    assert quota_stall_s(0.01, q, cpu, members + 1) >= stall - 1e-15
    assert quota_stall_s(0.01, q, cpu * 2, members) >= stall - 1e-15


def test_partition_calls_pay_the_stall_only_with_a_period_and_a_measurement() -> None:
    base = dataclasses.replace(tiny_cluster(), collective_call_s=2e-3)
    event = CommEvent("allgather", 1e5, 2, "forward")
    assert call_wait_s(base, event.operation, event.payload_bytes, 2) == 2e-3                       # the calibrated wait
    quota = dataclasses.replace(base, machine=dataclasses.replace(base.machine, cores=0.25),
                                cpu_period_s=0.01,
                                collective_cpu=(("allgather", 2e-4, 5e-9),))
    # CPU 0.2 ms + 1e5 · 5 ns = 0.7 ms: p = 0.28, 7.5 ms · (1 − 0.72²)
    assert quota.collective_cpu_s("allgather", 1e5) == pytest.approx(7e-4)
    assert call_wait_s(quota, event.operation, event.payload_bytes, 2) == pytest.approx(7.5e-3 * (1 - 0.72 ** 2))
    # a collective of 40 ms (own time) spreads its CPU over four periods: a quarter at once,
    # 0.175 ms: p = 0.07
    assert call_wait_s(quota, "allgather", 1e5, 2, own_s=0.04) == pytest.approx(
        7.5e-3 * (1 - 0.93 ** 2))
    # an operation without a measurement keeps the calibrated wait
    assert call_wait_s(quota, "halo", 1e5, 2) == 2e-3


def test_an_overlapped_exchange_pays_its_cpu_under_a_quota_by_hand() -> None:
    from dnnscale.model import predict_config
    from dnnscale.model.quota import background_exchange_s
    from dnnscale.plan import Config
    from dnnscale.workload import load_workload

    base = tiny_cluster()
    measured = dataclasses.replace(base, collective_cpu=(("ps_push_pull", 1e-4, 5e-10),))
    quota = dataclasses.replace(measured, machine=dataclasses.replace(base.machine, cores=0.25))
    # a push of 4 MB and a pull of 2 MB: 0.1 ms + 3 MB x 0.5 ns = 1.6 ms of CPU, at 0.25 core
    assert background_exchange_s(quota, 4e6, 2e6) == pytest.approx(1.6e-3 / 0.25)
    assert background_exchange_s(dataclasses.replace(quota, collective_cpu=()), 4e6, 2e6) == 0.0
    assert base.machine.cores == 1.0
    assert background_exchange_s(measured, 4e6, 2e6) == 0.0          # no quota: another core
    workload = load_workload("adam-cifar10")
    # in a step: only where the plan overlaps the exchange, as its own part, inside the busy time
    plain = predict_config(workload, quota, Config(1, 2, 1, "ps-async", 16))
    overlapped = predict_config(workload, quota, Config(1, 2, 1, "ps-async", 16, overlap=True))
    x = workload.params * workload.bytes_per_value                  # one worker's push and pull
    assert "exchange_cpu" not in plain.breakdown_s
    assert overlapped.breakdown_s["exchange_cpu"] == pytest.approx((1e-4 + x * 5e-10) / 0.25)


def test_the_collective_cpu_file_round_trips_and_names_bad_fields(tmp_path: Path) -> None:
    path = tmp_path / "collective_cpu.yaml"
    fits = (("allgather", 2e-4, 5e-9, ((1024.0, 3e-4),)), ("halo", 3e-4, 2e-9, ()))
    path.write_text(yaml.safe_dump(collective_cpu_to_dict(fits, date="2026-12-03")))
    assert load_collective_cpu(path) == (("allgather", 2e-4, 5e-9), ("halo", 3e-4, 2e-9))
    data = yaml.safe_load(path.read_text())
    bad = [({"cpu_s": -1}, r"collective_cpu\[1\]\.cpu_s"),
           ({"cpu_s": 1e-4, "operation": "broadcast"}, r"collective_cpu\[1\]\.operation")]
    for change, field in bad:
        data["collective_cpu"][1].update(change)
        path.write_text(yaml.safe_dump(data))
        with pytest.raises(InputError, match=field):
            load_collective_cpu(path)
    path.write_text("format: other\n")
    with pytest.raises(InputError, match="collective_cpu.format"):
        load_collective_cpu(path)


def test_the_committed_measurement_feeds_every_setting() -> None:
    from dnnscale.validate.rescore import Sittings

    root = Path(__file__).parent.parent / "results/validation/corpus"
    measured = load_collective_cpu(root / "collective_cpu.yaml")
    system = Sittings(root / "1gbit").system(1)
    assert system.collective_cpu == measured and system.cpu_period_s == pytest.approx(0.01)
    assert {op for op, _, _ in measured} == {"allgather", "reduce_scatter", "halo", "allreduce",
                                             "ps_push_pull"}
    # a sitting whose profile measured the partition collectives keeps its own, and takes the
    # PS push and pull (which its calibration did not measure yet) from the corpus's file
    later = Sittings(root / "1gbit").system(2)
    own = {op: (a, b) for op, a, b in later.collective_cpu}
    assert own["allgather"] != {op: (a, b) for op, a, b in measured}["allgather"]
    assert own["ps_push_pull"] == {op: (a, b) for op, a, b in measured}["ps_push_pull"]
    assert len(later.collective_cpu) == len(own) == 5


def test_a_profile_carries_its_collective_cpu_and_it_wins(tmp_path: Path) -> None:
    from dnnscale.system.profile import load_profile, profile_to_dict
    from dnnscale.testbed.describe import cluster_from_description, load_description
    from dnnscale.validate.profile import apply_profile

    folder = Path(__file__).parent.parent / "results/validation/corpus/1gbit"
    profile = load_profile(folder / "profile-s1.yaml")
    own = dataclasses.replace(profile, collective_cpu=(("allgather", 1e-4, 1e-9),))
    data = profile_to_dict(own)
    assert data["collective_cpu"] == [{"operation": "allgather", "cpu_s": 1e-4,
                                       "cpu_s_per_byte": 1e-9}]
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(path).collective_cpu == (("allgather", 1e-4, 1e-9),)
    data["collective_cpu"][0]["cpu_s"] = "fast"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=r"profile\.collective_cpu\[0\]\.cpu_s"):
        load_profile(bad)
    desc = load_description(folder / "testbed-s1.json")
    system = apply_profile(cluster_from_description(desc), path, desc)
    assert system.collective_cpu == (("allgather", 1e-4, 1e-9),)
    assert system.cpu_period_s == pytest.approx(0.01)


def test_the_collective_cpu_points_are_the_median_of_the_runs(monkeypatch) -> None:
    """measure_collective_cpu(runs=3): each point the median of three runs' (by hand), then the
    fit; a run count below 1 is refused."""
    import dnnscale.calibrate.network as network

    def batch(gather_small: float, gather_large: float) -> list[list[float]]:
        # [bytes, gather, scatter, halo fwd, halo bwd, all-reduce, push + pull]
        return [[1024.0, gather_small, 2e-3, 1e-3, 1e-3, 5e-4, 1e-4],
                [4096.0, gather_large, 3e-3, 2e-3, 2e-3, 6e-4, 2e-4]]

    runs = iter([batch(1e-3, 2e-3), batch(9e-3, 4e-3), batch(3e-3, 3e-3)])
    monkeypatch.setattr(network, "run_ranks", lambda *args, **kwargs: next(runs))
    fits = {op: (a, b, points) for op, a, b, points in
            network.measure_collective_cpu([], sizes=[1024, 4096], runs=3)}
    # all-gather: medians 3 ms at 1 KiB (of 1, 9, 3) and 3 ms at 4 KiB (of 2, 4, 3): flat
    assert fits["allgather"][2] == ((1024.0, 3e-3), (4096.0, 3e-3))
    assert fits["allgather"][0] == pytest.approx(3e-3) and fits["allgather"][1] == pytest.approx(0)
    # the PS push and pull: 0.1 ms at 1 KiB, 0.2 ms at 4 KiB: 1e-4 / 3072 s per byte
    assert fits["ps_push_pull"][1] == pytest.approx(1e-4 / 3072)
    with pytest.raises(ValueError, match="runs"):
        network.measure_collective_cpu([], runs=0)
