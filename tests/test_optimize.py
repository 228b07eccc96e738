"""The optimizer's answers, structure, errors and report: unit tests on small hand-built cases."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings

from dnnscale.system import LinkTier
from dnnscale.plan import Config
from dnnscale.errors import InputError
from dnnscale.optimize import optimize
from dnnscale.optimize.space import curve_budgets, make_space
from dnnscale.report.curve_plot import plot_curve
from tests.test_optimize_exact import problems
from tests.tiny import tiny_cluster, tiny_machine, tiny_workload

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _memory_limited_cluster(worker_bytes: float, ps_bytes: float = 1e9):
    """The tiny cluster with `worker_bytes` per worker and `ps_bytes` per PS machine."""
    cluster = tiny_cluster()
    return dataclasses.replace(
        cluster, machine=dataclasses.replace(cluster.machine, memory_bytes=worker_bytes),
        ps_machine=dataclasses.replace(tiny_machine(), memory_bytes=ps_bytes))


# The tiny workload (tests/tiny.py), sgd, n = 32: a worker needs 11,576 B at P=1, 6,876 B at
# P=2 and 6,056 B at P=3 (predict_config's memory; at P=3 the conv is split in stripes and every
# worker holds its whole kernel); a PS machine 476 B at S=1, 240 B at S=2 (at P=3 the shards
# store 119 + 2·20 = 159 parameters: 636 B at S=1, 320 B at S=2).
NEEDS_THREE_PER_REPLICA = 6_100.0
NEEDS_TWO_SHARDS = 330.0


def test_budget_too_small_for_allreduce_says_what_is_missing() -> None:
    cluster = _memory_limited_cluster(NEEDS_THREE_PER_REPLICA)
    with pytest.raises(InputError) as error:
        optimize(tiny_workload(), cluster, machines=2, modes="allreduce")
    assert error.value.field == "machines"
    assert "at least 3 machines per replica to fit in memory" in str(error.value) or \
        "at least 3 machines per replica to fit in worker memory" in str(error.value)
    result = optimize(tiny_workload(), cluster, machines=3, modes="allreduce")
    assert result.best.config.partitions == 3 and result.curve[0].machines == 3


def test_budget_too_small_for_a_parameter_server_counts_the_shards() -> None:
    cluster = _memory_limited_cluster(NEEDS_THREE_PER_REPLICA, NEEDS_TWO_SHARDS)
    with pytest.raises(InputError) as error:
        optimize(tiny_workload(), cluster, machines=4, modes="ps-async,ps-sync")
    message = str(error.value)
    assert "at least 3 machines per replica" in message
    assert "2 parameter-server machines" in message and "at least 5 machines" in message
    result = optimize(tiny_workload(), cluster, machines=5, modes="ps-async")
    assert (result.best.config.partitions, result.best.config.ps_shards) == (3, 2)
    reported = {item.what for item in result.infeasible}
    assert "P=1-2 at n=32" in reported and "S<2" in reported


def test_model_that_never_fits_is_an_error_naming_the_workload() -> None:
    with pytest.raises(InputError) as error:
        optimize(tiny_workload(), _memory_limited_cluster(100.0), machines=8)
    assert error.value.field == "workload" and "does not fit in worker memory" in str(error.value)


@pytest.mark.parametrize("kwargs, field", [
    ({"modes": "ps-async,bogus"}, "modes"),
    ({"modes": ""}, "modes"),
    ({"minibatch": [0]}, "minibatch"),
    ({"push_every": []}, "push_every"),
    ({"top": 0}, "top"),
    ({"machines": 0}, "machines"),
    ({"method": "guess"}, "method"),
    ({"modes": "allreduce", "base": Config(fc_protocol="vectors")}, "modes"),
])
def test_bad_input_names_the_field(kwargs, field) -> None:
    with pytest.raises(InputError) as error:
        optimize(tiny_workload(), tiny_cluster(), **{"machines": 8, **kwargs})
    assert error.value.field == field


def test_vectors_protocol_leaves_allreduce_out_by_default() -> None:
    space = make_space(base=Config(fc_protocol="vectors"))
    assert space.modes == ("ps-async", "ps-sync")
    assert make_space().modes == ("ps-async", "ps-sync", "allreduce")
    assert make_space().minibatches == (32,)


def test_async_plan_approaches_the_ps_bound() -> None:
    """Tiny workload (W = 119 parameters, b = 4, n = 32) with fast workers (1 GB/s, 1 µs) and a
    slow PS NIC (10 kB/s): every configuration is PS-network bound. The PS NIC capacity is
    B_ps / (share · (push + pull bytes per sample)) = B_ps / (share · 2·W·b/n) with share =
    ceil(119/S)/119, largest (1/119) from S = 119 shards on: 1e4 · 119 / (2 · 476/32) = 40,000
    samples/s. One replica cannot fill it: besides its 55 µs of compute it waits for its shard
    to serve its share of the push and pull, D = (1/119) · 952 B / 1e4 B/s = 0.8 ms (longer than
    its own 2·(476 B / 1 GB/s + 119 · 1 µs) ≈ 0.24 ms), so it runs at 32 / 0.8553 ms = 37,414
    samples/s. Replicas queue at the shard (model/ps.ps_queueing_cycle_s): two have Z = 0.0553
    ms, R·D − Z = 1.5447 ms, r = (1.5447 + sqrt(1.5447² + 4·0.8·0.0553)) / 2 = 1.5728 ms, step
    1.6282 ms, 64 / 1.6282 ms = 39,309 samples/s, short of the bound (which said 40,000); more
    replicas close the gap (step ≈ R·D + D·Z/(R·D − Z)), so the best plan takes many replicas
    beside at least 119 shards and runs within 1e-4 of the bound, PS-network bound."""
    from dnnscale.model import predict_config

    cluster = dataclasses.replace(tiny_cluster(), network=LinkTier(1e9, 1e-6),
                                  ps_network=LinkTier(1e4, 1e-6))
    two = predict_config(tiny_workload(), cluster, Config(partitions=1, replicas=2,
                                                          ps_shards=119, minibatch=32,
                                                          sync="ps-async"))
    assert two.throughput_samples_per_s == pytest.approx(39_309, rel=1e-4)
    result = optimize(tiny_workload(), cluster, machines=200, modes="ps-async")
    best = result.best
    assert best.throughput_samples_per_s == pytest.approx(40_000, rel=1e-4)
    assert best.throughput_samples_per_s < 40_000
    assert best.config.ps_shards >= 119 and best.config.replicas > 2
    assert best.bottleneck == "ps network"
    assert best.utilization["ps_network"] == pytest.approx(1, rel=1e-4)
    assert any(line.startswith("saturated: ps network") for line in result.explanation)


def test_latency_bound_ring_leaves_machines_idle() -> None:
    """All-reduce throughput is not monotone in R. Tiny workload, P = 1, n = 32: compute
    1,728 FLOP·32 / 1 GFLOP/s = 55.3 µs, update U = 119 · 4 B · 9 / 1 TB/s ≈ 4 ns
    (model/bookkeeping.py), so one replica steps in 55.3 µs (578,700 samples/s). Two replicas
    add a ring of 2·(1/2)·476 B / 1 MB/s + 2·100 µs = 676 µs: 64 samples per 731.3 µs = 87,500
    samples/s. Every larger ring is slower than one replica too, so the plan is one machine."""
    update_s = 119 * 4 * 9 / 1e12
    result = optimize(tiny_workload(), tiny_cluster(), machines=16, modes="allreduce")
    best = result.best
    assert (best.config.partitions, best.config.replicas) == (1, 1)
    assert best.step_time_s == pytest.approx(1728 * 32 / 1e9 + update_s, rel=1e-9)
    from dnnscale.model import predict_config

    two = predict_config(tiny_workload(), tiny_cluster(), dataclasses.replace(best.config, replicas=2))
    assert two.throughput_samples_per_s == pytest.approx(
        64 / (1728 * 32 / 1e9 + 676e-6 + update_s), rel=1e-9)
    assert all(point.prediction.config.machines == 1 for point in result.curve)


def test_varying_the_minibatch_picks_from_the_choices() -> None:
    result = optimize(tiny_workload(), tiny_cluster(), machines=8, minibatch=[8, 64], top=10)
    assert {p.config.minibatch for p in result.top} <= {8, 64}
    single = optimize(tiny_workload(), tiny_cluster(), machines=8, minibatch=64)
    assert result.best.epoch_time_s <= single.best.epoch_time_s


@settings(max_examples=40, deadline=None)
@given(problems())
def test_curve_never_gets_slower_with_more_machines(case) -> None:
    try:
        result = optimize(**case)
    except InputError:
        return
    times = [point.epoch_time_s for point in result.curve]
    assert times == sorted(times, reverse=True)
    assert [p.machines for p in result.curve] == sorted({p.machines for p in result.curve})
    assert result.curve[0].speedup == 1.0
    assert result.curve[-1].epoch_time_s == result.best.epoch_time_s


def test_curve_on_imagenet22k_is_non_increasing_and_log_spaced() -> None:
    result = optimize("adam-imagenet22k", "adam-2014", machines=2000, top=3)
    machines = [p.machines for p in result.curve]
    assert machines[:256] == list(range(1, 257)) and machines[-1] == 2000
    assert len(machines) < 400 and 1000 in machines and 1024 in machines
    times = [p.epoch_time_s for p in result.curve]
    assert all(later <= earlier for earlier, later in zip(times, times[1:]))
    assert result.curve[-1].speedup > 100
    assert result.evaluated > 0 and result.search_time_s > 0


def test_curve_budgets() -> None:
    assert curve_budgets(3, 7) == [3, 4, 5, 6, 7]
    assert curve_budgets(5, 4) == []
    budgets = curve_budgets(1, 10_000)
    assert budgets[:256] == list(range(1, 257)) and budgets[-1] == 10_000
    ratios = [b / a for a, b in zip(budgets[256:], budgets[257:])]
    assert max(ratios) < 1.06  # 48 per decade: 10^(1/48) = 1.049, plus round budgets in between


def test_plot_is_a_png(tmp_path) -> None:
    result = optimize(tiny_workload(), tiny_cluster(), machines=16)
    out = plot_curve([p.machines for p in result.curve], [p.epoch_time_s for p in result.curve],
                     [p.speedup for p in result.curve], tmp_path / "curve.png")
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000


def test_plot_errors_are_input_errors(tmp_path) -> None:
    with pytest.raises(InputError):
        plot_curve([], [], [], tmp_path / "empty.png")
    with pytest.raises(InputError) as error:
        plot_curve([1, 2], [2.0, 1.0], [1.0, 2.0], tmp_path / "no" / "such" / "dir.png")
    assert error.value.field == "--plot"


def test_json_shape() -> None:
    result = optimize(tiny_workload(), tiny_cluster(), machines=12, top=3)
    data = result.to_dict()
    assert set(data) >= {"best", "top", "curve", "evaluated", "search_time_s"}
    assert data["best"]["config"] == result.best.config.to_dict()
    assert data["best"]["prediction"]["epoch_time_s"] == result.best.epoch_time_s
    assert len(data["top"]) == 3 and data["top"][0] == data["best"]
    assert [p["machines"] for p in data["curve"]] == list(range(1, 13))
    assert all(set(p) >= {"machines", "epoch_time_s", "speedup"} for p in data["curve"])
