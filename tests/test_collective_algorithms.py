"""Collectives keyed by (operation, library, algorithm), and the plan's algorithm read: a tree
all-reduce registered for NCCL, priced by hand, reached from a plan with algorithm 'tree'."""

from __future__ import annotations

import dataclasses

import pytest

from dnnscale.errors import InputError
from dnnscale.model import predict_plan
from dnnscale.model.collectives import (COLLECTIVE_COSTS, collective_transfer,
                                        flat_ring_extra_hops, group_collective_time_s)
from dnnscale.plan import modern_plan_from_dict
from dnnscale.system import LinkTier, Topology, load_system
from dnnscale.system.topology import group_span
from dnnscale.workload import load_workload

TOPOLOGY = Topology(8, LinkTier(10e9, 5e-6, "ib"), LinkTier(100e9, 1e-6, "nvlink"))


def test_tree_allreduce_by_hand() -> None:
    """Double binary tree over g = 8: bytes 2·7/8·x (as a ring), messages 2·⌊log₂ 8⌋ = 6
    against the ring's 2·7 = 14; g = 6: 2·⌊log₂ 6⌋ = 4; g = 1: nothing."""
    x = 8e6
    assert collective_transfer("allreduce", "nccl", x, 8, "tree") == (14e6, 6.0)
    assert collective_transfer("allreduce", "nccl", x, 8, "ring") == (14e6, 14.0)
    assert collective_transfer("allreduce", "nccl", x, 6, "tree").messages == 4.0
    assert collective_transfer("allreduce", "nccl", x, 1, "tree") == (0.0, 0.0)
    # one member per node (stride 8): the tree on IB, 14e6 / 10 GB/s + 6 · 5 µs
    assert group_collective_time_s("allreduce", "nccl", x, group_span(8, 8, 8), TOPOLOGY,
                                   algorithm="tree") == pytest.approx(1.4e-3 + 30e-6)
    # inside one node: the tree on NVLink, 14e6 / 100 GB/s + 6 · 1 µs
    assert group_collective_time_s("allreduce", "nccl", x, group_span(8, 1, 8), TOPOLOGY,
                                   algorithm="tree") == pytest.approx(1.4e-4 + 6e-6)


def test_two_level_tree_changes_only_the_step_across_nodes() -> None:
    """16 members, 8 per node on 2 nodes, 16 MB: ring reduce-scatter in the node (7/8·x over
    NVLink, 7 messages), the all-reduce of x/8 across 2 nodes (2·1/2·x/8 over IB; ring 2
    messages, tree 2·⌊log₂ 2⌋ = 2), ring all-gather in the node. NCCL's flat ring also hops
    through the other node's members: 2·(2−1)·(8−1) = 14 more NVLink hops of 1 µs; the
    hierarchical and tree forms do not. With 4 nodes of 4 (stride 2) the step across nodes
    takes 6 ring messages against 4 tree ones (2 · 5 µs), and the flat ring 2·3·3 = 18 more
    hops inside the nodes."""
    x = 16e6
    inside = 7 / 8 * x / 100e9 + 7 * 1e-6
    across = 2 * 1 / 2 * (x / 8) / 10e9 + 2 * 5e-6
    for algorithm in ("hierarchical", "tree"):
        assert group_collective_time_s("allreduce", "nccl", x, group_span(16, 1, 8), TOPOLOGY,
                                       algorithm=algorithm) == pytest.approx(2 * inside + across)
    assert group_collective_time_s("allreduce", "nccl", x, group_span(16, 1, 8), TOPOLOGY,
                                   algorithm="ring") == pytest.approx(2 * inside + across + 14e-6)
    ring = group_collective_time_s("allreduce", "nccl", x, group_span(16, 2, 8), TOPOLOGY)
    tree = group_collective_time_s("allreduce", "nccl", x, group_span(16, 2, 8), TOPOLOGY,
                                   algorithm="tree")
    assert ring - tree == pytest.approx(2 * 5e-6 + 18e-6)


def test_a_flat_ring_pays_a_hop_per_member() -> None:
    """NCCL's ring latency (src/graph/tuning.cc): nRanks − 1 steps for an all-gather, nNodes − 1
    of them across nodes. 192 nodes of 8: 1535 steps, 191 on IB; the two-level form counts 191
    + 7, so 1344 − 7 = 1337 = 191 · 7 more NVLink hops; an all-reduce twice that. One member
    per node or one node: nothing to add."""
    assert flat_ring_extra_hops("allgather", "nccl", 192, 8) == 191 * 7
    assert flat_ring_extra_hops("reduce_scatter", "nccl", 192, 8) == 191 * 7
    assert flat_ring_extra_hops("allreduce", "nccl", 192, 8) == 2 * 191 * 7
    assert flat_ring_extra_hops("allreduce", "gloo", 3, 2) == 2 * 2 * 1   # gloo rings are flat
    assert flat_ring_extra_hops("allgather", "nccl", 192, 1) == 0
    assert flat_ring_extra_hops("allgather", "nccl", 1, 8) == 0
    # 1 GB all-gathered over 192 nodes of 8 (IB 10 GB/s, 5 µs; NVLink 100 GB/s, 1 µs): the
    # nodes' shards x/8 across (191/192 · x/8 / 10 GB/s + 191 · 5 µs), then inside the node
    # (7/8 · x / 100 GB/s + 7 µs), then 1337 NVLink hops of 1 µs
    x = 1e9
    two_level = 191 / 192 * x / 8 / 10e9 + 191 * 5e-6 + 7 / 8 * x / 100e9 + 7 * 1e-6
    span = group_span(1536, 1, 8)
    assert group_collective_time_s("allgather", "nccl", x, span, TOPOLOGY,
                                   algorithm="hierarchical") == pytest.approx(two_level)
    assert group_collective_time_s("allgather", "nccl", x, span, TOPOLOGY) == \
        pytest.approx(two_level + 1337e-6)


def test_ring_is_what_was_always_priced() -> None:
    """The default and 'hierarchical' are the same registered rings (the same bytes; the
    default adds the flat ring's hops, test above)."""
    for (operation, library, algorithm), cost in COLLECTIVE_COSTS.items():
        if algorithm == "hierarchical":
            assert COLLECTIVE_COSTS[(operation, library, "ring")] is cost
    assert group_collective_time_s("allreduce", "nccl", 16e6, group_span(16, 1, 8), TOPOLOGY) == \
        group_collective_time_s("allreduce", "nccl", 16e6, group_span(16, 1, 8), TOPOLOGY,
                                algorithm="ring")


def test_an_algorithm_a_library_lacks_is_an_input_error() -> None:
    with pytest.raises(InputError, match="gloo has no tree allreduce"):
        collective_transfer("allreduce", "gloo", 1.0, 4, "tree")
    with pytest.raises(InputError, match="algorithm"):
        collective_transfer("allgather", "nccl", 1.0, 4, "tree")
    with pytest.raises(KeyError, match="'allreduce' under 'mpi'"):
        collective_transfer("allreduce", "mpi", 1.0, 2)


def test_plan_algorithm_tree_reaches_the_data_parallel_allreduce() -> None:
    """GPT-3 125M, TP 8 fills each of 4 DGX nodes, DP 4 across them (one member per node): the
    gradient all-reduce's bytes are the same under both algorithms, its messages 2·3 = 6 (ring)
    against 2·⌊log₂ 4⌋ = 4 (tree); for these 31 MB NCCL runs both on its Simple protocol, whose
    network hop costs 14 µs in rings and trees alike (src/graph/tuning.cc; the preset's 2.7 µs
    is the ring's LL figure, so the scale is 1), so the step is 2 · 14 µs shorter and nothing
    else moves."""
    system = load_system("dgx-a100-80g:4")
    workload = load_workload("gpt3-125m")
    inter = system.topology.inter_node
    assert inter.fit("allreduce", 4) is None   # priced by (B, α), not a calibrated ring fit
    ring = modern_plan_from_dict({"tp": 8, "dp": 4, "micro_batch": 1})
    aggregation = dataclasses.replace(ring.data.aggregation, overlap=False)
    ring = dataclasses.replace(ring, data=dataclasses.replace(ring.data,
                                                              aggregation=aggregation))
    tree = dataclasses.replace(ring, data=dataclasses.replace(
        ring.data, aggregation=dataclasses.replace(aggregation, algorithm="tree")))
    by_ring, by_tree = predict_plan(workload, system, ring), predict_plan(workload, system, tree)
    assert inter.latency_s == pytest.approx(2.7e-6) and inter.hardware == "net"
    assert by_ring.step_time_s - by_tree.step_time_s == pytest.approx(2 * 14e-6, rel=1e-9)
    assert by_ring.part("dp_comm") - by_tree.part("dp_comm") == pytest.approx(2 * 14e-6,
                                                                              rel=1e-9)
    changed = {name for name, seconds in by_ring.breakdown_s.items()
               if seconds != pytest.approx(by_tree.breakdown_s[name], rel=1e-12)}
    assert changed == {"dp_comm", "step"}


# --- NCCL's protocols (src/graph/tuning.cc): LL, LL128 and Simple, the quickest by size ------

NVLINK_PROTOCOLS = LinkTier(200e9, 0.6e-6, "nvlink", hardware="nvlink",
                            protocols=("LL", "LL128", "Simple"))


def test_nccl_picks_its_quickest_protocol_by_size() -> None:
    """A ring all-gather among 8 on NVLink at 200 GB/s: 7 steps, 7/8 · x on the wire. LL: half
    the bandwidth, 0.6 µs a hop; LL128: 0.92 of it, 1.9 µs; Simple: all of it, 3.4 µs.
    x = 64 kB: LL 56 kB / 100 GB/s + 4.2 µs = 4.76 µs (LL128 13.6, Simple 24.1);
    x = 8 MB: LL128 7 MB / 184 GB/s + 13.3 µs = 51.3 µs (LL 74.2, Simple 58.8);
    x = 1 GB: Simple 875 MB / 200 GB/s + 23.8 µs = 4.3988 ms."""
    from dnnscale.model.collectives import collective_time_s

    def at(x: float) -> float:
        return collective_time_s("allgather", "nccl", x, 8, NVLINK_PROTOCOLS)

    assert at(64e3) == pytest.approx(7 / 8 * 64e3 / 100e9 + 7 * 0.6e-6, rel=1e-12)
    assert at(8e6) == pytest.approx(7 / 8 * 8e6 / 184e9 + 7 * 1.9e-6, rel=1e-12)
    assert at(1e9) == pytest.approx(7 / 8 * 1e9 / 200e9 + 7 * 3.4e-6, rel=1e-12)
    # gloo, point-to-point patterns and tiers without the model keep one protocol
    plain = LinkTier(200e9, 0.6e-6, "nvlink")
    assert collective_time_s("allgather", "nccl", 1e9, 8, plain) == pytest.approx(
        7 / 8 * 1e9 / 200e9 + 7 * 0.6e-6, rel=1e-12)
    assert collective_time_s("allgather", "gloo", 1e9, 8, NVLINK_PROTOCOLS) == pytest.approx(
        7 / 8 * 1e9 / 200e9 + 7 * 0.6e-6, rel=1e-12)


def test_the_tiers_of_a_gpu_preset_carry_the_protocols() -> None:
    """NVLink nodes enable LL128; a PCIe node (h100-pcie) does not (tuning.cc enables it only
    where the intra-node path is NVLink). A tree's hops cost its own figures: an NCCL tree
    all-reduce of 4 kB across 4 nodes runs LL, 5.0 µs a network hop (the ring's is 2.7)."""
    from dnnscale.model.collectives import collective_time_s

    dgx = load_system("dgx-a100-80g:2").topology
    assert dgx.intra_node is not None and dgx.intra_node.hardware == "nvlink"
    assert dgx.inter_node.hardware == "net"
    assert dgx.intra_node.protocols == dgx.inter_node.protocols == ("LL", "LL128", "Simple")
    pcie = load_system("h100-pcie:2").topology
    assert pcie.intra_node is not None and pcie.intra_node.hardware == "pci"
    assert pcie.intra_node.protocols == ("LL", "Simple")
    net = dgx.inter_node
    tree = collective_time_s("allreduce", "nccl", 4e3, 4, net, "tree")
    assert tree == pytest.approx(2 * 3 / 4 * 4e3 / (net.bandwidth_bytes_per_s / 3.8)
                                 + 4 * 5.0e-6, rel=1e-12)


def test_a_links_own_latency_adds_to_every_protocols_hop() -> None:
    """RoCE's 2.9 µs per hop is IB's 2.7 (NCCL's LL figure) + 0.2: every protocol pays the
    0.2 µs more (Simple 14.2 µs, LL128 4.2 µs) at its own share of the bandwidth."""
    from dnnscale.model.collectives import protocol_link

    roce = LinkTier(25e9, 2.9e-6, "roce-200", hardware="net",
                    protocols=("LL", "LL128", "Simple"))
    assert protocol_link(roce, "Simple") == pytest.approx((25e9, 14.2e-6))
    assert protocol_link(roce, "LL128") == pytest.approx((23e9, 4.2e-6))
    assert protocol_link(roce, "LL") == pytest.approx((12.5e9, 2.9e-6))
    assert protocol_link(roce, None) == (25e9, 2.9e-6)


def test_a_registered_cost_is_never_read_from_a_stale_cache(monkeypatch) -> None:
    """group_collective_time_s remembers its answers per version of the registry: replacing a
    cost bumps the version, so the next price is the new cost's."""
    from dnnscale.model.collectives import Transfer

    span = group_span(8, 1, 8)
    before = group_collective_time_s("allreduce", "nccl", 8e6, span, TOPOLOGY)
    version = COLLECTIVE_COSTS.version
    monkeypatch.setitem(COLLECTIVE_COSTS, ("allreduce", "nccl", "ring"),
                        lambda payload, members: Transfer(0.0, 0.0))
    assert COLLECTIVE_COSTS.version == version + 1
    assert group_collective_time_s("allreduce", "nccl", 8e6, span, TOPOLOGY) == 0.0
    monkeypatch.undo()
    assert group_collective_time_s("allreduce", "nccl", 8e6, span, TOPOLOGY) == before
