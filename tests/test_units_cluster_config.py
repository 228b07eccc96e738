"""Human units, cluster YAML and configuration rules."""

from __future__ import annotations

import pytest

from dnnscale.system import load_system, preset_names
from dnnscale.plan import Config, check_config, config_from_dict, max_partitions
from dnnscale.errors import InputError
from dnnscale.units import format_seconds, parse_quantity
from dnnscale.workload import zoo_workload


@pytest.mark.parametrize("text, dimension, expected", [
    ("10Gbit/s", "bandwidth", 1.25e9), ("200mbit", "bandwidth", 25e6), ("1gbit", "bandwidth", 125e6),
    ("1.25GB/s", "bandwidth", 1.25e9), ("96GB", "bytes", 96e9), ("2GiB", "bytes", 2 * 2**30),
    ("50us", "time", 50e-6), ("100ms", "time", 0.1), ("0.24ns", "time", 0.24e-9),
    ("10GFLOP/s", "flops", 1e10), ("100kFLOP", "flop", 1e5), (3.5, "time", 3.5),
])
def test_parse_quantity(text, dimension, expected) -> None:
    assert parse_quantity(text, dimension, "f") == pytest.approx(expected)


@pytest.mark.parametrize("text", ["fast", "10 parsecs", "-", "10Gb/s"])
def test_parse_quantity_rejects(text) -> None:
    with pytest.raises(InputError, match="^net.bw: "):
        parse_quantity(text, "bandwidth" if text != "10Gb/s" else "bytes", "net.bw")


def test_format_seconds() -> None:
    assert format_seconds(0.0123) == "12.3 ms"
    assert format_seconds(5400) == "1.50 h"


def test_presets_load() -> None:
    assert {"adam-2014", "local"} <= set(preset_names())
    adam = load_system("adam-2014")
    assert adam.network.bandwidth_bytes_per_s == 1.25e9
    assert adam.network.latency_s == pytest.approx(50e-6)
    assert adam.machine.cores == 16 and adam.machine.memory_bytes == 96e9
    assert not adam.calibrated
    # the default curve: 3 GFLOP/s per core at <= 100 kFLOP, 9 at >= 100 MFLOP, log-log between
    assert adam.machine.flops_per_s("conv2d", "forward", 1e5) == pytest.approx(16 * 3e9)
    assert adam.machine.flops_per_s("conv2d", "forward", 1e8) == pytest.approx(16 * 9e9)
    midpoint = 16 * 3e9 * 3 ** 0.5          # halfway in log size is the geometric mean of rates
    assert adam.machine.flops_per_s("linear", "forward", 1e5 * 1000 ** 0.5) == pytest.approx(midpoint)


def _cluster_yaml(tmp_path, network: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("machines: 4\nmachine: {cores: 2, memory: 8GB, memory_bandwidth: 10GB/s, "
                    "flops_per_core: 5GFLOP/s, update_time_per_param: 1ns}\n" + network)
    return str(path)


@pytest.mark.parametrize("network, field", [
    ("network: {bandwidth: -1, latency: 50us}\n", "cluster.network.bandwidth"),
    ("network: {bandwidth: 0, latency: 50us}\n", "cluster.network.bandwidth"),
    ("network: {bandwidth: 1Gbit/s, latency: -5us}\n", "cluster.network.latency"),
    ("network: {bandwidth: 1Gbit/s, jitter: 5us}\n", "cluster.network.jitter"),
    ("", "cluster.network"),
])
def test_bad_cluster_names_the_field(tmp_path, network, field) -> None:
    with pytest.raises(InputError) as info:
        load_system(_cluster_yaml(tmp_path, network))
    assert str(info.value).startswith(field + ":")


def test_ps_machine_inherits_missing_fields(tmp_path) -> None:
    path = _cluster_yaml(tmp_path, "network: {bandwidth: 1Gbit/s}\nps_machine: {cores: 8}\n")
    cluster = load_system(path)
    assert cluster.ps.cores == 8 and cluster.ps.memory_bytes == 8e9 and cluster.machine.cores == 2


@pytest.mark.parametrize("data, field", [
    ({"sync": "gossip"}, "config.sync"),
    ({"partitions": 0}, "config.partitions"),
    ({"replicas": 2.5}, "config.replicas"),
    ({"sync": "allreduce", "ps_shards": 2}, "config.ps_shards"),
    ({"sync": "ps-sync", "ps_shards": 0}, "config.ps_shards"),
    ({"fc_protocol": "gradients"}, "config.fc_protocol"),
    ({"wat": 1}, "config.wat"),
    ({"epoch_fraction": 1.5}, "config.epoch_fraction"),
])
def test_bad_config_names_the_field(data, field) -> None:
    with pytest.raises(InputError) as info:
        config_from_dict(data)
    assert str(info.value).startswith(field + ":")


def test_allreduce_defaults_to_no_ps() -> None:
    config = config_from_dict({"sync": "allreduce", "replicas": 3})
    assert config.ps_shards == 0 and config.machines == 3


def test_check_config_against_cluster_and_workload() -> None:
    cifar, adam = zoo_workload("adam-cifar10"), load_system("adam-2014")
    with pytest.raises(InputError, match="needs 125 machines .* has 120"):
        check_config(Config(partitions=1, replicas=121, ps_shards=4), cifar, adam)
    # fc2 has 10 outputs: the narrowest layer, so P <= 10
    assert max_partitions(cifar) == 10
    with pytest.raises(InputError, match="config.partitions: 11 is more than layer 'fc2'"):
        check_config(Config(partitions=11, replicas=1, ps_shards=1), cifar, adam)
    check_config(Config(partitions=10, replicas=1, ps_shards=1), cifar, adam)
