"""Issue 22's cost terms, by hand: a CPU worker's passes over its parameters each step
(model/bookkeeping.py, timed in runtime/worker.py) and a collective's wait under a CPU quota
per group size (System.call_s)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dnnscale.model import predict_config
from dnnscale.model.bookkeeping import worker_bookkeeping_bytes, worker_bookkeeping_s
from dnnscale.plan import Config
from tests.tiny import tiny_cluster, tiny_machine, tiny_workload

N = 10


def test_bookkeeping_bytes_and_seconds_by_hand() -> None:
    # 1000 fp32 parameters: 9 values streamed each (cat 2, flatten 2, w -= lr g 3, write-back 2)
    assert worker_bookkeeping_bytes(1000, 4, parameter_server=False) == 36_000
    # with a PS the accumulator adds 3 more: 12 values
    assert worker_bookkeeping_bytes(1000, 4, parameter_server=True) == 48_000
    machine = dataclasses.replace(tiny_machine(cores=0.25), memory_bandwidth_bytes_per_s=2e10)
    # 36,000 B / (20 GB/s x 0.25 core) = 7.2 us
    assert worker_bookkeeping_s(1000, 4, False, machine) == pytest.approx(7.2e-6)


def _slow_memory_cluster():  # type: ignore[no-untyped-def]
    """The tiny cluster with 1 MB/s of memory bandwidth, so that the passes show."""
    machine = dataclasses.replace(tiny_machine(), memory_bandwidth_bytes_per_s=1e6)
    return dataclasses.replace(tiny_cluster(), machine=machine)


def test_allreduce_step_pays_the_passes_as_its_update() -> None:
    cfg = Config(partitions=1, replicas=2, ps_shards=0, sync="allreduce", minibatch=N)
    p = predict_config(tiny_workload(), _slow_memory_cluster(), cfg)
    update_s = 119 * 4 * 9 / 1e6                      # W = 119 parameters: 4.284 ms
    ring_s = 2 * (1 / 2) * 476 / 1e6 + 2 * 1 * 1e-4   # as test_model_terms.test_allreduce
    assert p.breakdown_s["update"] == pytest.approx(update_s)
    assert p.breakdown_s["allreduce"] == pytest.approx(ring_s)
    assert p.step_time_s == pytest.approx(p.breakdown_s["compute"] + ring_s + update_s)


def test_ps_worker_pays_the_passes_and_the_accumulator() -> None:
    cfg = Config(partitions=1, replicas=1, ps_shards=2, sync="ps-async", minibatch=N)
    slow = predict_config(tiny_workload(), _slow_memory_cluster(), cfg)
    update_s = 119 * 4 * 12 / 1e6                     # 5.712 ms
    assert slow.breakdown_s["update"] == pytest.approx(update_s)
    push_s = 476 / 1e6 + 2 * 1e-4                     # as test_model_terms: W·b, one per shard
    # worker step = compute + update + own push and pull
    assert slow.step_time_s == pytest.approx(slow.breakdown_s["compute"] + update_s + 2 * push_s)
    sync = predict_config(tiny_workload(), _slow_memory_cluster(),
                          dataclasses.replace(cfg, sync="ps-sync"))
    assert sync.breakdown_s["update"] == pytest.approx(update_s)


def test_call_wait_per_group_size_by_hand() -> None:
    system = dataclasses.replace(tiny_cluster(), collective_call_s=0.001,
                                 collective_call_waits=((2, 0.004), (3, 0.010), (4, 0.020)))
    assert system.call_s(1) == 0.0                    # no collective in a group of one
    assert system.call_s(2) == pytest.approx(0.004)
    assert system.call_s(3) == pytest.approx(0.010)
    assert system.call_s(4) == pytest.approx(0.020)
    # beyond the largest group measured: the line through (3, 10 ms) and (4, 20 ms)
    assert system.call_s(6) == pytest.approx(0.040)
    plain = dataclasses.replace(system, collective_call_waits=())
    assert plain.call_s(2) == plain.call_s(7) == pytest.approx(0.001)
    single = dataclasses.replace(system, collective_call_waits=((3, 0.006),))
    assert single.call_s(2) == single.call_s(8) == pytest.approx(0.006)
    falling = dataclasses.replace(system, collective_call_waits=((2, 0.008), (3, 0.006)))
    assert falling.call_s(5) == pytest.approx(0.006)  # never below the last measured


def test_partition_collectives_pay_their_group_size_wait() -> None:
    cfg = Config(partitions=2, replicas=1, ps_shards=0, sync="allreduce", minibatch=N)
    waits = ((2, 0.003), (4, 0.009))
    plain = predict_config(tiny_workload(), tiny_cluster(), cfg)
    waited = predict_config(tiny_workload(), dataclasses.replace(
        tiny_cluster(), collective_call_waits=waits), cfg)
    events = sum(layer.comm_messages > 0 for layer in plain.layers)
    assert events >= 1
    extra = waited.breakdown_s["partition_comm"] - plain.breakdown_s["partition_comm"]
    # every partition collective among the P = 2 workers pays 3 ms
    assert extra == pytest.approx(0.003 * round(extra / 0.003))
    assert round(extra / 0.003) >= events


def test_local_update_is_the_sgd_step_and_the_accumulation() -> None:
    torch = pytest.importorskip("torch")
    from torch.nn.utils import vector_to_parameters

    from dnnscale.runtime.worker import flat_gradient, local_update

    params = [torch.nn.Parameter(torch.tensor([1.0, 2.0])), torch.nn.Parameter(torch.tensor([3.0]))]
    params[0].grad = torch.tensor([10.0, 20.0])       # the second has no gradient: zeros
    grad = flat_gradient(params)
    assert grad.tolist() == [10.0, 20.0, 0.0]
    accumulated = torch.tensor([1.0, 1.0, 1.0])
    with torch.no_grad():
        flat = local_update(params, grad, 0.1, accumulated)
        vector_to_parameters(flat, params)
    assert flat.tolist() == pytest.approx([0.0, 0.0, 3.0], abs=1e-6)
    assert accumulated.tolist() == [11.0, 21.0, 1.0]
    assert params[0].tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


# --- the runtime's layer exchanges, calibrated per group size ---------------------------------

def test_exchange_fits_become_the_registry_alpha_beta(monkeypatch) -> None:
    from dnnscale.calibrate import network

    # three members: all-gather (3-1)/3·x in 2 messages, gloo's reduce-scatter 2·(3-1)/3·x in 4
    points = [[1024, 0.030, 0.060], [262_144, 0.031, 0.062], [1_048_576, 0.034, 0.068],
              [4_194_304, 0.046, 0.092]]
    monkeypatch.setattr(network, "run_ranks", lambda *args, **kwargs: points)
    gather, scatter = network.measure_partition_exchange([object()] * 3)
    assert (gather.operation, scatter.operation) == ("allgather", "reduce_scatter")
    assert gather.peers == scatter.peers == 3
    # a = the 1 KiB time; b = least-squares slope of t - a over the >= 256 KiB points
    sizes = [262_144, 1_048_576, 4_194_304]
    slope = sum(x * (t - 0.030) for x, t in zip(sizes, (0.031, 0.034, 0.046))) / sum(
        x * x for x in sizes)
    assert gather.latency_s == pytest.approx(0.030 / 2)
    assert gather.bandwidth_bytes_per_s == pytest.approx((2 / 3) / slope)
    scatter_slope = sum(x * (t - 0.060) for x, t in zip(sizes, (0.062, 0.068, 0.092))) / sum(
        x * x for x in sizes)
    assert scatter.latency_s == pytest.approx(0.060 / 4)
    assert scatter.bandwidth_bytes_per_s == pytest.approx((4 / 3) / scatter_slope)


def test_halo_fit_becomes_the_registry_alpha_beta(monkeypatch) -> None:
    from dnnscale.calibrate import network

    # [bytes, forward s, backward s] among 3 ranks: the middle member's two neighbours, so the
    # registry's halo is 2·x / B + 2·α; forward and backward points are fitted together
    points = [[1024, 0.004, 0.006], [262_144, 0.010, 0.012], [1_048_576, 0.030, 0.034]]
    monkeypatch.setattr(network, "run_ranks", lambda *args, **kwargs: points)
    fit = network.measure_halo_exchange([object()] * 3)
    assert (fit.operation, fit.peers) == ("halo", 2)
    a = 0.005                                   # the median of the two 1 KiB times
    large = [(262_144, 0.010), (262_144, 0.012), (1_048_576, 0.030), (1_048_576, 0.034)]
    slope = sum(x * (t - a) for x, t in large) / sum(x * x for x, _ in large)
    assert fit.latency_s == pytest.approx(a / 2)
    assert fit.bandwidth_bytes_per_s == pytest.approx(2 / slope)
    # two ranks: one neighbour
    assert network.measure_halo_exchange([object()] * 2).peers == 1


def test_a_profiles_own_exchanges_win_and_supplements_fill_the_rest(tmp_path) -> None:
    import yaml

    from dnnscale.system.profile import LinkFit, supplement_to_dict
    from dnnscale.testbed.describe import cluster_from_description, load_description
    from dnnscale.validate.profile import apply_profile

    folder = Path(__file__).parent.parent / "results/validation/corpus/100mbit"
    desc = load_description(folder / "testbed-s2.json")       # its profile has the exchanges
    cluster = cluster_from_description(desc)
    profile = folder / "profile-s2.yaml"
    first, second = tmp_path / "supplement.yaml", tmp_path / "supplement-halo.yaml"
    first.write_text(yaml.safe_dump(supplement_to_dict((
        LinkFit(1e9, 1.0, peers=2, operation="allgather"),))))
    second.write_text(yaml.safe_dump(supplement_to_dict((
        LinkFit(1e9, 2.0, peers=2, operation="allgather"),
        LinkFit(5e6, 3e-3, peers=1, operation="halo")))))
    system = apply_profile(cluster, profile, desc, [first, second])
    own = apply_profile(cluster, profile, desc)
    # the profile measured its all-gathers: they stay; nobody measured halos but the second
    assert system.network.fit("allgather", 2) == own.network.fit("allgather", 2)
    assert own.network.fit("allgather", 2) is not None
    assert system.network.fit("halo", 1) == (5e6, 3e-3)
    assert own.network.fit("halo", 1) is None


def test_an_operations_own_fit_prices_it_before_the_one_it_runs_as() -> None:
    from dnnscale.model.collectives import collective_time_s
    from dnnscale.system import LinkTier

    tier = LinkTier(1e8, 1e-4, allreduce_fits=((3, 5e7, 1e-3),))
    x = 1e6
    # gloo's reduce-scatter without its own fit: the all-reduce fit, 2·(2/3)·x / B + 4·α
    assert collective_time_s("reduce_scatter", "gloo", x, 3, tier) == pytest.approx(
        4 / 3 * x / 5e7 + 4 * 1e-3)
    own = dataclasses.replace(tier, fits=(("reduce_scatter", 3, 2e7, 1e-2),
                                          ("allgather", 3, 4e7, 5e-3)))
    assert collective_time_s("reduce_scatter", "gloo", x, 3, own) == pytest.approx(
        4 / 3 * x / 2e7 + 4 * 1e-2)
    assert collective_time_s("allgather", "gloo", x, 3, own) == pytest.approx(
        2 / 3 * x / 4e7 + 2 * 5e-3)
    # another group size has no fit: the link
    assert collective_time_s("allgather", "gloo", x, 2, own) == pytest.approx(
        1 / 2 * x / 1e8 + 1e-4)


def test_profile_and_supplement_carry_the_exchange_fits(tmp_path) -> None:
    import yaml

    from dnnscale.errors import InputError
    from dnnscale.system.profile import (LinkFit, load_supplement, profile_from_dict,
                                         supplement_to_dict)

    fits = (LinkFit(4e7, 5e-3, ((1024.0, 0.01),), peers=3, operation="allgather"),
            LinkFit(2e7, 1e-2, ((1024.0, 0.04),), peers=3, operation="reduce_scatter"))
    path = tmp_path / "supplement.yaml"
    path.write_text(yaml.safe_dump(supplement_to_dict(fits, date="2026-12-02")))
    assert load_supplement(path) == fits
    data = yaml.safe_load(path.read_text())
    data["partition_exchange"][0]["operation"] = "broadcast"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=r"partition_exchange\[0\]\.operation"):
        load_supplement(path)
    path.write_text("format: something-else\n")
    with pytest.raises(InputError, match="supplement.format"):
        load_supplement(path)
    with pytest.raises(InputError, match="profile.format"):
        profile_from_dict({"format": "x"})
