"""Invariants of the model over random valid workloads, clusters and configurations."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.model import predict_config
from tests.strategies import clusters, configs, workloads

SETTINGS = settings(max_examples=150, deadline=None)


@st.composite
def cases(draw: st.DrawFn):
    workload = draw(workloads())
    return workload, draw(clusters()), draw(configs(workload))


def _throughput(workload, cluster, config) -> float:
    return predict_config(workload, cluster, config).throughput_samples_per_s


@SETTINGS
@given(cases())
def test_predictions_finite_and_positive(case) -> None:
    p = predict_config(*case)
    for value in (p.throughput_samples_per_s, p.step_time_s, p.epoch_time_s,
                  p.memory_bytes["worker"], *p.breakdown_s.values()):
        assert math.isfinite(value)
    assert p.throughput_samples_per_s > 0 and p.step_time_s > 0 and p.epoch_time_s > 0
    assert all(value >= 0 for value in p.breakdown_s.values())
    assert all(0 <= value <= 1 + 1e-9 for value in p.utilization.values())


@SETTINGS
@given(cases(), st.floats(1.0, 100.0))
def test_more_bandwidth_never_slower(case, factor) -> None:
    workload, cluster, config = case
    faster = dataclasses.replace(cluster, network=dataclasses.replace(
        cluster.network, bandwidth_bytes_per_s=cluster.network.bandwidth_bytes_per_s * factor))
    assert _throughput(workload, faster, config) >= _throughput(workload, cluster, config) * (1 - 1e-12)


@SETTINGS
@given(cases(), st.floats(1.0, 16.0))
def test_more_cores_never_slower(case, factor) -> None:
    workload, cluster, config = case
    bigger = dataclasses.replace(cluster.machine, cores=cluster.machine.cores * factor)
    more = dataclasses.replace(cluster, machine=bigger)
    assert _throughput(workload, more, config) >= _throughput(workload, cluster, config) * (1 - 1e-12)


@SETTINGS
@given(cases(), st.integers(1, 8))
def test_more_ps_shards_never_lower_ps_capacity(case, extra) -> None:
    workload, cluster, config = case
    if not config.uses_ps or config.sync != "ps-async":
        config = dataclasses.replace(config, sync="ps-async", ps_shards=max(1, config.ps_shards),
                                     fc_protocol=config.fc_protocol)
    base = predict_config(workload, cluster, config).capacities_samples_per_s
    more = predict_config(workload, cluster, dataclasses.replace(
        config, ps_shards=config.ps_shards + extra)).capacities_samples_per_s
    for resource in ("ps_network", "ps_cpu"):
        assert more[resource] >= base[resource] * (1 - 1e-12)


@SETTINGS
@given(cases())
def test_async_throughput_at_most_r_times_one_replica(case) -> None:
    workload, cluster, config = case
    config = dataclasses.replace(config, sync="ps-async", ps_shards=max(1, config.ps_shards))
    one = _throughput(workload, cluster, dataclasses.replace(config, replicas=1))
    assert _throughput(workload, cluster, config) <= config.replicas * one * (1 + 1e-12)
