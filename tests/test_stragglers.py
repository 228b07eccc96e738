"""The straggler term of asynchronous epochs: by hand, its invariants, what it does to predict,
and the exact search with it (fast == exhaustive)."""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.model import predict_config
from dnnscale.model.stragglers import replica_rates, straggler_factor
from dnnscale.optimize import optimize
from dnnscale.plan import Config
from dnnscale.system import load_system
from dnnscale.system.load import MAX_STRAGGLER_SPREAD, system_from_dict
from dnnscale.workload import load_workload


def _two_rates(spread: float) -> tuple[float, float]:
    """R = 2: Blom's scores ±Φ⁻¹(1 − 0.625/2.25) = ±0.5895, rates e^(∓c·z) over their mean."""
    z = -NormalDist().inv_cdf(0.625 / 2.25)
    fast, slow = math.exp(spread * z), math.exp(-spread * z)
    mean = (fast + slow) / 2
    return fast / mean, slow / mean


def test_two_replicas_by_hand() -> None:
    fast, slow = _two_rates(0.1)            # 1.0589, 0.9411
    assert replica_rates(2, 0.1) == pytest.approx([fast, slow])
    # f = 1: the epoch ends when the slow one has done its half: t = 1/slow, g = t·2/2
    assert straggler_factor(2, 1.0, 0.1) == pytest.approx(1 / slow)
    assert straggler_factor(2, 1.0, 0.1) == pytest.approx(1.0626, abs=1e-4)
    # f = 0.75: 1.5 shares; at t = 1/fast = 0.944 the two have done 1 + 0.941·0.944 = 1.89,
    # so the epoch ends earlier, at t = 1.5/(fast + slow) = 0.75, with both running: g = 1
    assert straggler_factor(2, 0.75, 0.1) == pytest.approx(1.0)
    # a parameter server at half the replicas' rate (u = 0.5) throttles both to 0.5: g = 1
    assert replica_rates(2, 0.1, 0.5) == pytest.approx([0.5, 0.5])
    assert straggler_factor(2, 1.0, 0.1, 0.5) == pytest.approx(1.0)
    assert straggler_factor(1, 1.0, 0.3) == 1.0 and straggler_factor(8, 1.0, 0.0) == 1.0


def test_cut_off_buys_time_with_many_replicas() -> None:
    """16 replicas, spread 0.1: the slowest's share decides at f = 1 (rate e^(−0.1·1.97)/mean);
    at f = 0.9 the fast replicas' finished shares end the epoch sooner."""
    z16 = NormalDist().inv_cdf((16 - 0.375) / 16.25)
    scores = [NormalDist().inv_cdf((i - 0.375) / 16.25) for i in range(1, 17)]
    mean = sum(math.exp(-0.1 * z) for z in scores) / 16
    assert straggler_factor(16, 1.0, 0.1) == pytest.approx(mean / math.exp(-0.1 * z16))
    assert 1.0 < straggler_factor(16, 0.9, 0.1) < straggler_factor(16, 1.0, 0.1)


@settings(max_examples=200, deadline=None)
@given(spread=st.floats(0.0, MAX_STRAGGLER_SPREAD), fraction=st.floats(0.05, 1.0),
       capacity=st.floats(0.1, 1e4), replicas=st.integers(1, 120))
def test_epoch_throughput_never_falls_with_a_replica(spread: float, fraction: float,
                                                     capacity: float, replicas: int) -> None:
    """X = min(R·x̄, C) (x̄ = 1) over the factor: nondecreasing in R up to the largest spread a
    cluster may state — the exact search takes the most replicas (model/compose.py)."""
    def epoch_x(r: int) -> float:
        return min(r, capacity) / straggler_factor(r, fraction, spread, capacity / r)

    assert straggler_factor(replicas, fraction, spread, capacity / replicas) >= 1.0
    assert epoch_x(replicas + 1) >= epoch_x(replicas) * (1 - 1e-12)


def _cluster(spread: float) -> object:
    return dataclasses.replace(load_system("adam-2014").with_machines(24),
                               straggler_spread=spread)


def test_predict_applies_the_factor_to_async_epochs_only() -> None:
    workload = load_workload("adam-cifar10")
    config = Config(partitions=1, replicas=4, ps_shards=2, minibatch=32)
    plain = predict_config(workload, _cluster(0.0), config)
    spread = predict_config(workload, _cluster(0.2), config)
    assert spread.throughput_samples_per_s == plain.throughput_samples_per_s
    factor = spread.straggler_factor
    assert factor == straggler_factor(
        4, 1.0, 0.2, min(spread.capacities_samples_per_s["ps_network"],
                         spread.capacities_samples_per_s["ps_cpu"])
        / spread.capacities_samples_per_s["workers"]) > 1
    assert spread.epoch_time_s == pytest.approx(plain.epoch_time_s * factor, rel=1e-12)
    assert spread.to_dict()["straggler_factor"] == factor
    assert "straggler_factor" not in plain.to_dict()
    cut = predict_config(workload, _cluster(0.2), dataclasses.replace(config, epoch_fraction=0.8))
    assert cut.epoch_time_s < 0.8 * spread.epoch_time_s  # the cut-off's predicted benefit
    sync = predict_config(workload, _cluster(0.2), dataclasses.replace(config, sync="ps-sync"))
    assert sync.straggler_factor == 1.0


@pytest.mark.parametrize("fraction", [1.0, 0.8])
def test_exact_search_with_stragglers_matches_exhaustive(fraction: float) -> None:
    base = Config(epoch_fraction=fraction)
    kwargs = dict(machines=24, modes="ps-async,ps-sync", minibatch=[16, 64], base=base,
                  curve=False)
    fast = optimize("adam-cifar10", _cluster(0.3), **kwargs)
    slow = optimize("adam-cifar10", _cluster(0.3), method="exhaustive", **kwargs)
    assert fast.best.epoch_time_s == pytest.approx(slow.best.epoch_time_s, rel=1e-9)
    assert [p.epoch_time_s for p in fast.top] == pytest.approx([p.epoch_time_s for p in slow.top],
                                                               rel=1e-9)


def test_cluster_field_and_its_limit() -> None:
    data = {"machines": 4, "machine": {"cores": 1, "memory": "1GB", "memory_bandwidth": "1GB/s",
                                       "flops_per_core": "1GFLOP/s",
                                       "update_time_per_param": "1ns"},
            "network": {"bandwidth": "1Gbit/s", "latency": "50us"}}
    assert system_from_dict({**data, "straggler_spread": 0.1}).straggler_spread == 0.1
    with pytest.raises(InputError, match="cluster.straggler_spread"):
        system_from_dict({**data, "straggler_spread": 0.9})
    with pytest.raises(InputError, match="cluster.straggler_spread"):
        system_from_dict({**data, "straggler_spread": "wide"})
