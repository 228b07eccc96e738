"""Every term of the performance model for the tiny workload (tests/tiny.py), by hand."""

from __future__ import annotations

import math

import pytest

from dnnscale.plan import Config
from dnnscale.model import predict_config, stage_costs
from dnnscale.model.collectives import collective_transfer
from dnnscale.model.sharding import SplitContext, shard_layer
from dnnscale.workload import build_workload
from tests.tiny import tiny_cluster, tiny_machine, tiny_workload

N = 10  # minibatch
REL = 1e-12
PS_WORKER_UPDATE_S = 119 * 4 * 12 / 1e12
"""A worker's passes over its W = 119 fp32 parameters under a PS (model/bookkeeping.py): 12
values each at the tiny machine's 1 TB/s."""


def costs(partitions: int, fc_protocol: str = "weights"):
    cluster = tiny_cluster()
    return stage_costs(tiny_workload(), cluster, partitions, N, fc_protocol)


def test_workload_counts() -> None:
    w = tiny_workload()
    conv, flatten, fc = w.layers
    assert (conv.params, fc.params, w.params) == (20, 99, 119)
    assert (conv.fwd_flops, conv.input_grad_flops, conv.weight_grad_flops) == (576, 0, 576)
    assert (fc.fwd_flops, fc.input_grad_flops, fc.weight_grad_flops) == (192, 192, 192)
    assert flatten.output_shape == (32,) and flatten.fwd_bytes == 0


def test_compute_p1() -> None:
    c = costs(1)
    # n · (576 + 0 + 576 + 192 + 192 + 192) / 1e9
    assert c.compute_s == pytest.approx(10 * 1728 / 1e9, rel=REL)
    assert c.forward_s == pytest.approx(10 * (576 + 192) / 1e9, rel=REL)
    assert c.partition_s == 0.0 and c.partition_bytes == 0.0


def test_compute_and_traffic_p2() -> None:
    c = costs(2)
    conv, _, fc = c.layers
    assert conv.work_fraction == 0.5                  # 2 channels (or 4 rows) over 2 workers
    assert fc.work_fraction == pytest.approx(2 / 3)   # ceil(3/2)/3
    # conv (first layer: its input is the replicated sample) moves nothing
    assert conv.comm_bytes == 0.0
    # FC: 3 · (P-1)/P · n_in · b · n = 3 · 1/2 · 32 · 4 · 10 = 1920 bytes (all-gather forward,
    # gloo's all-reduce for the reduce-scatter backward) in 3 messages
    assert fc.comm_bytes == pytest.approx(1920)
    assert fc.comm_messages == 3
    assert c.partition_s == pytest.approx(1920 / 1e6 + 3 * 1e-4, rel=REL)
    # 10 · ((576 + 576)/2 + 3·192·2/3) / 1e9
    assert c.compute_s == pytest.approx(10 * (576 + 384) / 1e9, rel=REL)


def test_compute_and_traffic_p3() -> None:
    c = costs(3)
    conv, _, fc = c.layers
    # 2 channels cannot be split 3 ways: stripes, 4 rows -> ceil(4/3)/4 = 1/2
    assert conv.scheme == "rows" and conv.work_fraction == 0.5
    assert fc.work_fraction == pytest.approx(1 / 3)
    assert fc.comm_bytes == pytest.approx(3 * 2 / 3 * 32 * 4 * 10)   # 2560
    assert fc.comm_messages == 6
    # every stripe holds the conv's whole kernel (20 params, 80 bytes): its gradients are
    # ring-all-reduced over the 3 workers: 2·(2/3)·80 bytes in 2·2 messages
    assert conv.replicated_params == 20 and c.replicated_params == 20
    assert conv.comm_bytes == pytest.approx(2 * 2 / 3 * 80)
    assert conv.comm_s == pytest.approx(2 * 2 / 3 * 80 / 1e6 + 4 * 1e-4, rel=REL)
    assert c.partition_s == pytest.approx(2560 / 1e6 + 6e-4
                                          + 2 * 2 / 3 * 80 / 1e6 + 4e-4, rel=REL)
    assert c.compute_s == pytest.approx(10 * (1152 / 2 + 576 / 3) / 1e9, rel=REL)
    # the replica's workers hold 119 + 2·20 = 159 parameters together
    assert c.stored_params(119) == 159


def test_stripe_kernels_are_pushed_by_every_worker() -> None:
    cfg = Config(partitions=3, replicas=1, ps_shards=1, sync="ps-async", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    # each worker pushes 159/3 = 53 parameters (4 bytes each) to the one shard
    assert p.breakdown_s["ps_push"] == pytest.approx(53 * 4 / 1e6 + 1e-4, rel=REL)
    assert p.memory_bytes["ps"] == 159 * 4


def _wire_bytes_and_messages(layer, scheme: str, partitions: int, input_scheme: str = "rows",
                             library: str = "gloo") -> tuple[float, float]:
    shard = shard_layer("adam", layer, scheme, partitions, SplitContext(input_scheme, True, 10, 4))
    moved = [collective_transfer(e.operation, library, e.payload_bytes, e.members)
             for e in shard.events if e.operation != "allreduce"]  # the kernel's all-reduce aside
    return sum(t.bytes for t in moved), sum(t.messages for t in moved)


def test_conv_partition_formulas() -> None:
    w = build_workload("convs", [1, 4, 4], [
        {"kind": "conv2d", "name": "k3", "out_channels": 6, "kernel": 3, "padding": 1},
        {"kind": "conv2d", "name": "k1", "out_channels": 6, "kernel": 1}], samples_per_epoch=10)
    k3, k1 = w.layers
    # k1's input is 6x4x4. Stripes, 3x3 kernel (k3 on a 1x4x4 input): a halo of 1 row of
    # W_in · C_in = 4 · 1 values per neighbour, forward and backward, b = 4, n = 10.
    assert _wire_bytes_and_messages(k3, "rows", 2) == (2 * 1 * 1 * 4 * 1 * 4 * 10, 2)  # 1 neighbour
    assert _wire_bytes_and_messages(k3, "rows", 3) == (2 * 2 * 1 * 4 * 1 * 4 * 10, 4)  # 2 neighbours
    assert _wire_bytes_and_messages(k1, "rows", 3) == (0, 0)  # a 1-row kernel has no halo
    # channels: all-gather (P-1)/P and gloo's reduce-scatter-as-all-reduce 2·(P-1)/P of
    # C_in·H_in·W_in · b · n = 16 · 4 · 10 = 640 bytes (k3's 1x4x4 input), in 3·(P-1) messages
    assert _wire_bytes_and_messages(k3, "channels", 2, "channels") == (pytest.approx(960), 3)
    assert _wire_bytes_and_messages(k3, "channels", 3, "channels") == (
        pytest.approx(3 * 2 / 3 * 640), 6)
    # NCCL's reduce-scatter is a true ring: (P-1)/P each way, 2·(P-1) messages
    assert _wire_bytes_and_messages(k3, "channels", 2, "channels", "nccl") == (
        pytest.approx(640), 2)
    # stripes after a channel split re-gather the whole input first (the cost of channels)
    assert _wire_bytes_and_messages(k3, "rows", 2, "channels") == (pytest.approx(960), 3)
    # one partition: nothing moves
    assert shard_layer("adam", k3, "channels", 1, SplitContext("rows", True, 10, 4)).events == ()


def test_second_conv_picks_cheaper_split() -> None:
    # P = 3: the first conv has 2 channels, too few for 3 workers, so it is split in stripes;
    # the second (2->8, 3x3) then exchanges one halo row per neighbour (2 neighbours) plus the
    # all-reduce of its kernel (8·2·3·3 + 8 = 152 params): 2·2·1·16·2·4·n + 2·(2/3)·152·4 bytes,
    # far below a channel split's re-gather, 3·(2/3)·2·16·16·4·n.
    w = build_workload("two-conv", [1, 16, 16], [
        {"kind": "conv2d", "out_channels": 2, "kernel": 3, "padding": 1},
        {"kind": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1},
    ], samples_per_epoch=10)
    cluster = tiny_cluster()
    c = stage_costs(w, cluster, 3, N)
    first, second = c.layers
    assert first.scheme == "rows" and second.scheme == "rows"
    assert second.comm_bytes == pytest.approx(2 * 2 * 1 * 16 * 2 * 4 * N + 2 * (2 / 3) * 152 * 4)


def test_stripes_after_channels_pay_the_regather() -> None:
    # P = 2, the first conv (1->8) pinned to a channel split: stripes for the second would first
    # re-gather its whole input (the channel split's 3·(1/2)·8·16·16·4·n bytes) and then also
    # all-reduce the kernel, so the second conv stays split by channels.
    w = build_workload("two-conv", [1, 16, 16], [
        {"kind": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1},
        {"kind": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1},
    ], samples_per_epoch=10)
    cluster = tiny_cluster()
    c = stage_costs(w, cluster, 2, N, schemes={"conv2d1": "channels"})
    assert [layer.scheme for layer in c.layers] == ["channels", "channels"]
    assert c.layers[1].comm_bytes == pytest.approx(3 * (1 / 2) * 8 * 16 * 16 * 4 * N)
    # Unpinned, the shortest path over the chain (issue 24) stripes both: the first all-reduces
    # its 80-parameter kernel, 2·(1/2)·80·4 bytes (the greedy choice took channels to avoid
    # it), the second exchanges one halo row with its one neighbour forward and backward,
    # 2·1·16·8·4·n, plus its 584-parameter kernel's all-reduce, 2·(1/2)·584·4 — far below the
    # re-gather above.
    best = stage_costs(w, cluster, 2, N)
    assert [layer.scheme for layer in best.layers] == ["rows", "rows"]
    assert best.layers[0].comm_bytes == pytest.approx(2 * (1 / 2) * 80 * 4)
    assert best.layers[1].comm_bytes == pytest.approx(2 * 1 * 16 * 8 * 4 * N + 2 * (1 / 2) * 584 * 4)
    assert best.compute_s + best.partition_s < c.compute_s + c.partition_s
    # ...and its seconds: the halo goes to the one neighbour over the link (1e6 B/s, 0.1 ms a
    # message), forward and backward, 2·(16·8·4·n / 1e6 + 1e-4), and the kernel's all-reduce
    # between the two members is 2·(1/2)·584·4 / 1e6 + 2·1e-4. Before issue 22 a halo with
    # one neighbour spanned one member and cost nothing.
    assert best.layers[1].comm_s == pytest.approx(
        2 * (16 * 8 * 4 * N / 1e6 + 1e-4) + (2 * (1 / 2) * 584 * 4 / 1e6 + 2 * 1e-4), rel=REL)


def test_halo_prices_by_neighbours_on_the_tier_its_span_lies_on() -> None:
    from dnnscale.model.collectives import group_collective_time_s, span_members
    from dnnscale.system.topology import GroupSpan, LinkTier, Topology

    nvlink, nic = LinkTier(1e9, 1e-6), LinkTier(1e8, 1e-5)
    topology = Topology(devices_per_node=8, inter_node=nic, intra_node=nvlink)
    assert span_members("halo", 1) == 2 and span_members("halo", 2) == 3
    assert span_members("allgather", 2) == 2
    # one neighbour inside a node: 1e6 B over NVLink, one message, plus the call cost
    inside = GroupSpan(size=2, per_node=2)
    assert group_collective_time_s("halo", "gloo", 1e6, inside, topology, call_s=1e-3) == \
        pytest.approx(1e6 / 1e9 + 1e-6 + 1e-3, rel=REL)
    # two neighbours across nodes: 2·1e6 B over the NIC, two messages
    across = GroupSpan(size=3, per_node=1)
    assert group_collective_time_s("halo", "gloo", 1e6, across, topology) == pytest.approx(
        2e6 / 1e8 + 2e-5, rel=REL)
    # a fitted halo (B, α) for one neighbour replaces the tier's own
    fitted = Topology(1, LinkTier(1e8, 1e-5, fits=(("halo", 1, 5e7, 4e-3),)))
    assert group_collective_time_s("halo", "gloo", 1e6, GroupSpan(size=2, per_node=1),
                                   fitted) == pytest.approx(1e6 / 5e7 + 4e-3, rel=REL)


def test_ps_async_worker_bound() -> None:
    cfg = Config(partitions=1, replicas=2, ps_shards=2, sync="ps-async", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    push_s = 476 / 1e6 + 2 * 1e-4        # W·b = 119·4 bytes, one message per shard
    worker_step_s = 1.728e-5 + PS_WORKER_UPDATE_S + 2 * push_s
    assert p.breakdown_s["ps_push"] == pytest.approx(push_s, rel=REL)
    # The two replicas queue at the busiest shard (model/ps.ps_queueing_cycle_s): D = n / X_ps
    # = 10 / (1e6/48) = 0.48 ms, Z = 1.36929 − 0.48 = 0.88929 ms, R·D − Z = 0.07071 ms,
    # r = (0.07071 + sqrt(0.07071² + 4·0.48·0.88929)) / 2 = 0.68966 ms: step 1.57894 ms, 15 %
    # more than the worker step (the bound had it at 1.36929 ms).
    assert worker_step_s == pytest.approx(1.3692857e-3, rel=1e-7)
    assert p.step_time_s == pytest.approx(1.5789419e-3, rel=1e-7)
    assert p.throughput_samples_per_s == pytest.approx(2 * N / 1.5789419e-3, rel=1e-7)
    assert p.breakdown_s["ps_wait"] == pytest.approx(1.5789419e-3 - worker_step_s, rel=1e-6)
    # PS capacities: busiest shard holds ceil(119/2) = 60 of 119 parameters; it serves pushes
    # and pulls one at a time: network 1e6 / (60/119 · (476 + 476)/10) = 1e6 / 48;
    # cpu 1 / (60/119 · 119·1e-6/10) = 1/6e-6
    assert p.capacities_samples_per_s["ps_network"] == pytest.approx(1e6 / 48, rel=REL)
    assert p.capacities_samples_per_s["ps_cpu"] == pytest.approx(1 / 6e-6, rel=REL)
    assert p.bottleneck == "worker ps transfer"
    assert p.epoch_time_s == pytest.approx(1000 / p.throughput_samples_per_s, rel=REL)


def test_ps_async_replica_waits_for_its_shard() -> None:
    # P = 2 workers share one shard, which serves their requests one at a time: the replica
    # waits share · (push + pull) / B_ps = 1 · (476 + 476) / 1e6 s, longer than each worker's
    # own 2 · (238 / 1e6 + 1e-4) s.
    cfg = Config(partitions=2, replicas=1, ps_shards=1, sync="ps-async", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    busy_s = 10 * (576 + 384) / 1e9 + 1920 / 1e6 + 3e-4   # compute + FC partition traffic
    busy_s += PS_WORKER_UPDATE_S / 2                      # each worker's update of its half
    assert p.breakdown_s["ps_push"] == pytest.approx(238 / 1e6 + 1e-4, rel=REL)
    assert p.step_time_s == pytest.approx(busy_s + 952 / 1e6, rel=REL)
    assert p.breakdown_s["ps_serve_wait"] == pytest.approx(952 / 1e6 - 2 * (238 / 1e6 + 1e-4))
    assert p.bottleneck == "partition communication"   # 2.22 ms of FC traffic > 0.95 ms


def test_ps_async_network_bound() -> None:
    cfg = Config(partitions=1, replicas=10, ps_shards=2, sync="ps-async", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    # Ten replicas queue at the shard: D = 0.48 ms, Z = 0.88929 ms (test_ps_async_worker_bound),
    # R·D − Z = 3.91071 ms, r = (3.91071 + sqrt(3.91071² + 4·0.48·0.88929)) / 2 = 4.01698 ms:
    # step 4.90626 ms, 2 % above R·D = 4.8 ms, so 20,382 of the 20,833 samples/s the PS NIC
    # allows (1e6/48).
    assert p.step_time_s == pytest.approx(4.9062633e-3, rel=1e-7)
    assert p.throughput_samples_per_s == pytest.approx(20_382.11, rel=1e-6)
    assert p.bottleneck == "ps network"
    assert p.utilization["ps_network"] == pytest.approx(20_382.11 / (1e6 / 48), rel=1e-6)


def test_ps_async_cpu_bound() -> None:
    slow_ps = tiny_machine(update_s_per_param=1e-4)
    cfg = Config(partitions=1, replicas=2, ps_shards=2, sync="ps-async", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(ps_machine=slow_ps), cfg)
    # 1 / (60/119 · 119·1e-4/10) = 1 / 6e-4
    assert p.throughput_samples_per_s == pytest.approx(1 / 6e-4, rel=REL)
    assert p.bottleneck == "ps cpu"


def test_ps_async_overlap() -> None:
    cfg = Config(partitions=1, replicas=1, ps_shards=2, minibatch=N, overlap=True)
    push_s = 476 / 1e6 + 2e-4
    full = predict_config(tiny_workload(), tiny_cluster(), cfg)   # γ = ∞: max(busy, ps)
    assert full.throughput_samples_per_s == pytest.approx(N / (2 * push_s), rel=REL)
    half = predict_config(tiny_workload(), tiny_cluster(gamma=2.0), cfg)
    assert half.throughput_samples_per_s == pytest.approx(
        N / math.hypot(1.728e-5 + PS_WORKER_UPDATE_S, 2 * push_s), rel=1e-9)


def test_ps_sync() -> None:
    cfg = Config(partitions=1, replicas=2, ps_shards=2, sync="ps-sync", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    # push: max(worker NIC 476/1e6, busiest PS NIC 2 · 60/119 · 476 / 1e6) + 2 messages · 1e-4
    push_s = max(476 / 1e6, 2 * 60 / 119 * 476 / 1e6) + 2e-4
    apply_s = 2 * 60 / 119 * 119 * 1e-6
    step_s = 1.728e-5 + PS_WORKER_UPDATE_S + push_s + apply_s + push_s
    assert p.breakdown_s["ps_push"] == pytest.approx(push_s, rel=REL)
    assert p.breakdown_s["ps_apply"] == pytest.approx(apply_s, rel=REL)
    assert p.step_time_s == pytest.approx(step_s, rel=REL)
    assert p.throughput_samples_per_s == pytest.approx(2 * N / step_s, rel=REL)
    assert p.bottleneck == "ps network"


def test_allreduce() -> None:
    cfg = Config(partitions=1, replicas=2, ps_shards=0, sync="allreduce", minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    ring_s = 2 * (1 / 2) * 476 / 1e6 + 2 * 1 * 1e-4
    update_s = 119 * 4 * 9 / 1e12         # 9 passes over W·b at 1 TB/s (model/bookkeeping.py)
    step_s = 1.728e-5 + ring_s + update_s
    assert p.breakdown_s["allreduce"] == pytest.approx(ring_s, rel=REL)
    assert p.step_time_s == pytest.approx(step_s, rel=REL)
    assert p.throughput_samples_per_s == pytest.approx(2 * N / step_s, rel=REL)
    assert p.bottleneck == "allreduce network"
    assert p.memory_bytes["ps"] == 0


def test_fc_vector_protocol() -> None:
    cfg = Config(partitions=1, replicas=1, ps_shards=1, minibatch=N, fc_protocol="vectors")
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    # push: conv's 20 params as weights + n·(32 + 3) FC values, 4 bytes each
    push_bytes = 20 * 4 + 10 * 35 * 4
    assert p.breakdown_s["ps_push"] == pytest.approx(push_bytes / 1e6 + 1e-4, rel=REL)
    # the FC weight gradient (10 · 192 FLOP) moved from the worker to the PS
    assert p.breakdown_s["compute"] == pytest.approx(10 * (1728 - 192) / 1e9, rel=REL)
    ps_cpu_s_per_sample = 119 * 1e-6 / 10 + 192 / 1e9
    assert p.capacities_samples_per_s["ps_cpu"] == pytest.approx(1 / ps_cpu_s_per_sample, rel=REL)


def test_memory() -> None:
    cfg = Config(partitions=1, replicas=1, ps_shards=2, minibatch=N)
    p = predict_config(tiny_workload(), tiny_cluster(), cfg)
    # worker: W·b·(weights + gradients) + (16 input + 32 conv + 32 flatten + 3 fc) · n · b
    assert p.memory_bytes["worker"] == 119 * 4 * 2 + 83 * 10 * 4
    assert p.memory_bytes["ps"] == 60 * 4            # ceil(119/2) parameters
    assert p.fits
    p2 = predict_config(tiny_workload(), tiny_cluster(), Config(partitions=2, ps_shards=1, minibatch=N))
    # W/P params; activations 16 + 32/2 + 32/2 + 3·2/3
    assert p2.memory_bytes["worker"] == pytest.approx(59.5 * 4 * 2 + 50 * 40)
    momentum = predict_config(tiny_workload(), tiny_cluster(),
                              Config(ps_shards=2, minibatch=N, optimizer="momentum"))
    assert momentum.memory_bytes["ps"] == 60 * 4 * 2


def test_does_not_fit() -> None:
    cluster = tiny_cluster()
    small = type(cluster.machine)(**{**cluster.machine.__dict__, "memory_bytes": 1000.0})
    p = predict_config(tiny_workload(), type(cluster)(**{**cluster.__dict__, "machine": small}),
                       Config(ps_shards=1, minibatch=N))
    assert not p.fits
