"""Adam's per-layer splits are a shortest path over the layer chain (model/stage.py stage_costs).

The pinned case was a strict xfail in tests/test_known_defects.py (issue 24), found by
tests/test_model_properties.py::test_more_cores_never_slower (hypothesis). Under the greedy
choice (each conv layer's cheapest scheme for its own compute, blind to the partition traffic it
forces on the next layer), twice the cores switched the first conv from rows to channels, the
channels-to-rows transition before conv2d3 cost 3.4 ms of partition communication per step
instead of 0.5 ms, and the throughput fell from 25,042 to 9,909 samples/s. The shortest path
keeps rows for both convs on 14 and on 28 cores: 25,042 and 28,380 samples/s (25,019 and 28,365
since issue 22 prices the worker's passes over its parameters, model/bookkeeping.py; 22,001 and
24,547 since the stripes' halo is the rows the runtime exchanges, workload/splits.
stripe_exchange: conv2d3's 1x1 kernel with padding 2 makes 16 output rows from 12, split
6 + 5 + 5 against the input's 4 + 4 + 4, so the middle member borrows a row, where ⌊K/2⌋ = 0
had priced no halo).
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from dnnscale.model import predict_config, stage_costs
from dnnscale.workload.splits import split_extent, split_schemes
from dnnscale.plan import Config
from dnnscale.system import Device, LinkTier, RateCurve, System
from dnnscale.workload import build_workload
from tests.strategies import clusters, configs, workloads

BANDWIDTH_BYTES_PER_S = 350160039.0
MINIBATCH = 44


def _pinned_case(cores: float):
    workload = build_workload("random", [1, 12, 12], [
        {"kind": "conv2d", "name": "conv2d1", "out_channels": 20, "kernel": 5, "padding": 2},
        {"kind": "relu", "name": "relu2"},
        {"kind": "conv2d", "name": "conv2d3", "out_channels": 2, "kernel": 1, "padding": 2},
        {"kind": "relu", "name": "relu4"},
        {"kind": "flatten", "name": "flatten5"},
        {"kind": "linear", "name": "linear6", "out_features": 3},
    ], samples_per_epoch=100)
    device = Device(cores=cores, memory_bytes=1e12, memory_bandwidth_bytes_per_s=2256912536.0,
                    flops_per_s_per_core={"default": RateCurve.constant(952358348.0),
                                          "linear": RateCurve.constant(1e8)},
                    update_s_per_param=9.13774814699462e-09)
    system = System(name="random", machines=256, machine=device,
                    network=LinkTier(bandwidth_bytes_per_s=BANDWIDTH_BYTES_PER_S, latency_s=0.0),
                    overlap_gamma=1.0)
    config = Config(partitions=3, replicas=1, ps_shards=1, sync="ps-async", minibatch=MINIBATCH)
    return workload, system, config


def _throughput(cores: float) -> float:
    return predict_config(*_pinned_case(cores)).throughput_samples_per_s


def test_more_cores_never_slower_on_the_pinned_case() -> None:
    assert _throughput(14.0) == pytest.approx(22000.628, rel=1e-6)
    assert _throughput(28.0) == pytest.approx(24547.430, rel=1e-6)
    for cores in (14.0, 28.0):
        workload, system, config = _pinned_case(cores)
        stage = stage_costs(workload, system, config.partitions, config.minibatch)
        assert [(c.name, c.scheme) for c in stage.layers if c.kind == "conv2d"] == [
            ("conv2d1", "rows"), ("conv2d3", "rows")]
        # conv2d3: one borrowed row of 12 columns x 20 channels x 4 B x 44 samples each way,
        # forward and backward, plus its kernel's ring all-reduce 2·(2/3)·(2·20 + 2)·4 B
        conv3 = next(c for c in stage.layers if c.name == "conv2d3")
        assert conv3.comm_bytes == pytest.approx(2 * 12 * 20 * 4 * MINIBATCH + 2 * 2 / 3 * 42 * 4)


def test_the_greedy_choice_costs_its_transition_by_hand() -> None:
    """With conv2d1 pinned to channels, conv2d3 (rows) re-gathers its distributed input: an
    all-gather forward and a reduce-scatter backward of x = 20·12·12 values · 4 B · 44 samples =
    506,880 B over 3 members: the ring all-gather (3−1)/3 · x / B = 0.965 ms and gloo's
    reduce-scatter, run as an all-reduce, 2·(3−1)/3 · x / B = 1.930 ms (B = 350,160,039 B/s,
    zero latency), plus the all-reduce of its 42-parameter kernel, 2·(3−1)/3 · 168 B / B. The
    shortest path (rows, rows) pays no halo for a 1×1 kernel, so it is the cheaper chain."""
    workload, system, config = _pinned_case(28.0)
    greedy = stage_costs(workload, system, 3, MINIBATCH, schemes={"conv2d1": "channels"})
    conv2d3 = next(c for c in greedy.layers if c.name == "conv2d3")
    x = 20 * 12 * 12 * 4 * MINIBATCH
    regather_s = (2 / 3 + 2 * 2 / 3) * x / BANDWIDTH_BYTES_PER_S
    kernel_s = 2 * (2 / 3) * 42 * 4 / BANDWIDTH_BYTES_PER_S
    assert conv2d3.scheme == "rows"
    assert conv2d3.comm_s == pytest.approx(regather_s + kernel_s, rel=1e-12)
    best = stage_costs(workload, system, 3, MINIBATCH)
    assert best.compute_s + best.partition_s < greedy.compute_s + greedy.partition_s


def test_a_pinned_scheme_must_be_one_of_the_layer_s() -> None:
    workload, system, _ = _pinned_case(14.0)
    with pytest.raises(ValueError, match="has no split 'features'"):
        stage_costs(workload, system, 3, MINIBATCH, schemes={"conv2d1": "features"})


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_shortest_path_is_the_cheapest_chain(data: st.DataObject) -> None:
    """Exact: Σ(compute + split communication) of the chosen chain equals the least over every
    valid assignment of schemes to the weighted layers (each priced with its splits pinned)."""
    workload = data.draw(workloads())
    system, config = data.draw(clusters()), data.draw(configs(workload))
    p, n = config.partitions, config.minibatch
    weighted = [layer for layer in workload.layers if layer.has_weights]
    options = [[s for s in split_schemes(layer)
                if p == 1 or len(split_schemes(layer)) == 1 or split_extent(layer, s) >= p]
               for layer in weighted]
    totals = []
    for assignment in itertools.product(*options):
        try:
            pinned = stage_costs(workload, system, p, n, config.fc_protocol,
                                 schemes={layer.name: s for layer, s in zip(weighted, assignment)})
        except ValueError:  # stripes through a pooling layer with fewer rows than members
            continue
        names = {layer.name for layer in weighted}
        assert [c.scheme for c in pinned.layers if c.name in names] == list(assignment)
        totals.append(pinned.compute_s + pinned.partition_s)
    assert totals  # max_partitions leaves at least one runnable chain
    best = stage_costs(workload, system, p, n, config.fc_protocol)
    assert best.compute_s + best.partition_s == pytest.approx(min(totals), rel=1e-12, abs=1e-18)
