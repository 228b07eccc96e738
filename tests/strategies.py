"""Hypothesis strategies for random valid workloads, clusters and configurations."""

from __future__ import annotations

from hypothesis import strategies as st

from dnnscale.system import System, Device, LinkTier, RateCurve
from dnnscale.plan import Config, max_partitions
from dnnscale.workload import Workload, build_workload


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """A chain of 0-3 conv blocks (conv, relu, optional pool) then 1-3 linear layers."""
    channels = draw(st.integers(1, 4))
    size = draw(st.sampled_from([8, 12, 16]))
    specs: list[dict[str, object]] = []
    for _ in range(draw(st.integers(0, 3))):
        specs.append({"kind": "conv2d", "out_channels": draw(st.integers(2, 24)),
                      "kernel": draw(st.sampled_from([1, 3, 5])), "padding": 2})
        specs.append({"kind": "relu"})
        if draw(st.booleans()):
            specs.append({"kind": "maxpool2d", "kernel": 2})
    specs.append({"kind": "flatten"})
    for _ in range(draw(st.integers(1, 3))):
        specs.append({"kind": "linear", "out_features": draw(st.integers(2, 300))})
    specs.append({"kind": "softmax_loss"})
    return build_workload("random", [channels, size, size], specs,
                          samples_per_epoch=draw(st.integers(100, 10**6)))


def rate_curves(draw: st.DrawFn) -> RateCurve:
    low = draw(st.floats(1e8, 1e10))
    high = low * draw(st.floats(1.0, 10.0))
    return RateCurve((1e4, 1e8), (low, high))


@st.composite
def machines(draw: st.DrawFn) -> Device:
    return Device(cores=draw(st.floats(0.25, 32)), memory_bytes=1e12,
                       memory_bandwidth_bytes_per_s=draw(st.floats(1e9, 1e11)),
                       flops_per_s_per_core={"default": rate_curves(draw),
                                             "linear": rate_curves(draw)},
                       update_s_per_param=draw(st.floats(1e-11, 1e-8)))


@st.composite
def clusters(draw: st.DrawFn, machines_count: int = 256) -> System:
    ps = draw(st.one_of(st.none(), machines()))
    return System(name="random", machines=machines_count, machine=draw(machines()),
                   network=LinkTier(draw(st.floats(1e6, 1e10)), draw(st.floats(0, 1e-3))),
                   ps_machine=ps, overlap_gamma=draw(st.sampled_from([1.0, 2.0, 4.0, float("inf")])))


@st.composite
def configs(draw: st.DrawFn, workload: Workload) -> Config:
    sync = draw(st.sampled_from(["ps-async", "ps-sync", "allreduce"]))
    return Config(partitions=draw(st.integers(1, min(4, max_partitions(workload)))),
                  replicas=draw(st.integers(1, 16)),
                  ps_shards=0 if sync == "allreduce" else draw(st.integers(1, 8)), sync=sync,
                  minibatch=draw(st.integers(1, 256)), push_every=draw(st.integers(1, 4)),
                  pull_every=draw(st.integers(1, 4)),
                  fc_protocol="weights" if sync == "allreduce" else draw(
                      st.sampled_from(["weights", "vectors"])),
                  overlap=draw(st.booleans()))
