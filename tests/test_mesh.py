"""The device mesh (plan/mesh.py): strides, rank coordinates and the placement on tiers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.model.megatron_rules import megatron_shard
from dnnscale.model.sharding import SplitContext
from dnnscale.plan import Config, ParallelPlan, Pipeline, TensorSplit
from dnnscale.plan.mesh import MESH_ORDER, DeviceMesh, MeshDim, placement
from dnnscale.plan.plan import DataParallel
from dnnscale.system import GroupSpan, LinkTier, Topology, load_system
from dnnscale.workload import load_workload

IB = LinkTier(25e9, 5e-6, "ib")
NVLINK = LinkTier(300e9, 1e-6, "nvlink")
DGX = Topology(8, IB, NVLINK)
NIC = LinkTier(1.25e9, 50e-6, "network")
ONE_DEVICE_NODES = Topology(1, NIC)


def test_order_is_megatrons_with_tp_fastest() -> None:
    assert [d.value for d in MESH_ORDER] == ["pp", "dp", "ep", "cp", "tp"]


def test_megatron_plan_tp8_pp8_dp8_on_dgx_nodes() -> None:
    """tp=8 fills a node; dp neighbours are 8 ranks apart (one per node); pp ones 64 apart."""
    plan = ParallelPlan(tensor=TensorSplit(8, "megatron"), pipeline=Pipeline(8),
                        data=DataParallel(8))
    mesh = plan.mesh
    assert mesh.devices == plan.workers == 512
    assert plan.devices_per_replica == 64
    assert (mesh.stride("tp"), mesh.stride("cp"), mesh.stride("ep"), mesh.stride("dp"),
            mesh.stride("pp")) == (1, 8, 8, 8, 64)
    placed = placement(mesh, DGX)
    assert placed["tp"].span == GroupSpan(8, 8) and placed["tp"].tiers == (NVLINK,)
    assert placed["dp"].span == GroupSpan(8, 1) and placed["dp"].span.nodes == 8
    assert placed["dp"].tiers == (IB,)
    assert placed["pp"].stride == 64 and placed["pp"].span == GroupSpan(8, 1)
    assert placed["pp"].tier_of(2) is IB                  # adjacent stages: different nodes
    assert placed[MeshDim.CP].span == GroupSpan(1, 1)     # size 1: a group of one
    assert placed["cp"].tiers == (NVLINK,)


def test_dp_over_tp2_spans_two_tiers() -> None:
    """tp=2, dp=8 on 8-GPU nodes: dp stride 2, so 8 // 2 = 4 replicas share a node and the
    group spans 2 nodes: a hierarchical collective, NVLink then IB."""
    placed = placement(DeviceMesh.of(tp=2, dp=8), DGX)
    assert placed["dp"].stride == 2
    assert placed["dp"].span == GroupSpan(8, 4) and placed["dp"].span.nodes == 2
    assert placed["dp"].tiers == (NVLINK, IB) and placed["dp"].tier is IB
    assert placed["dp"].span_of(4) == GroupSpan(4, 4)     # 4 replicas fit in one node
    assert placed["dp"].tier_of(4) is NVLINK


def test_adam_plan_p4_r8_on_one_device_nodes() -> None:
    """Adam's P is tp, R is dp: P=4 R=8 puts the replica's 4 workers on 4 machines (one per
    node) and each partition's 8 copies 4 ranks apart, all on the NIC."""
    config = Config(partitions=4, replicas=8, ps_shards=2, sync="ps-async", minibatch=8)
    mesh = config.to_plan().mesh
    assert mesh.size("tp") == 4 and mesh.size("dp") == 8 and mesh.devices == 32
    assert mesh.stride("dp") == 4
    placed = placement(mesh, ONE_DEVICE_NODES)
    assert placed["tp"].span == GroupSpan(4, 1) and placed["tp"].tiers == (NIC,)
    assert placed["dp"].span == GroupSpan(8, 1) and placed["dp"].tiers == (NIC,)
    # the same on the adam-2014 preset (one core-host per node, no intra-node tier)
    system = load_system("adam-2014")
    assert placement(mesh, system.topology)["tp"].tiers == (system.topology.inter_node,)


def test_rank_coordinates_by_hand() -> None:
    """Rank 77 of tp=8 × dp=8 × pp=8: tp 77 mod 8 = 5, dp (77 // 8) mod 8 = 1, pp 77 // 64 = 1."""
    mesh = DeviceMesh.of(tp=8, dp=8, pp=8)
    coords = mesh.rank_coords(77)
    assert (coords[MeshDim.TP], coords[MeshDim.DP], coords[MeshDim.PP]) == (5, 1, 1)
    assert coords[MeshDim.CP] == coords[MeshDim.EP] == 0
    assert mesh.rank_of({"tp": 5, "dp": 1, "pp": 1}) == 77
    assert mesh.group_ranks("tp", 77) == list(range(72, 80))
    assert mesh.group_ranks("dp", 77) == [69 + 8 * i for i in range(8)]
    assert mesh.group_ranks("pp", 77) == [13 + 64 * i for i in range(8)]


def test_with_size_keeps_the_inner_strides() -> None:
    mesh = DeviceMesh.of(tp=4, dp=2, pp=3).with_size("dp", 6)
    assert mesh.size("dp") == 6 and mesh.stride("dp") == 4 and mesh.stride("pp") == 24


@pytest.mark.parametrize("sizes, field", [({"tp": 0}, "mesh.tp"), ({"dp": -2}, "mesh.dp"),
                                          ({"pp": 1.5}, "mesh.pp"), ({"tp": True}, "mesh.tp"),
                                          ({"xp": 2}, "mesh")])
def test_bad_sizes_name_the_field(sizes: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as error:
        DeviceMesh.of(**sizes)  # type: ignore[arg-type]
    assert error.value.field == field


def test_plan_with_no_replicas_has_no_mesh() -> None:
    with pytest.raises(InputError) as error:
        ParallelPlan(data=DataParallel(0)).mesh
    assert error.value.field == "mesh.dp"


def test_bad_ranks_name_the_field() -> None:
    mesh = DeviceMesh.of(tp=2, dp=3)
    with pytest.raises(InputError) as error:
        mesh.rank_coords(6)
    assert error.value.field == "rank"
    with pytest.raises(InputError) as error:
        mesh.rank_of({"tp": 1})                           # dp has 3 members: needed
    assert error.value.field == "rank.dp"
    with pytest.raises(InputError) as error:
        mesh.rank_of({"tp": 2, "dp": 0})
    assert error.value.field == "rank.tp"
    assert mesh.rank_of({"tp": 1, "dp": 2}) == 5          # pp, ep, cp of size 1 may be left out


sizes = st.tuples(*(st.integers(1, 5) for _ in MESH_ORDER))


@given(sizes=sizes, data=st.data())
def test_rank_coordinates_round_trip(sizes: tuple[int, ...], data: st.DataObject) -> None:
    mesh = DeviceMesh(sizes)
    assert mesh.devices == math.prod(sizes)
    rank = data.draw(st.integers(0, mesh.devices - 1))
    coords = mesh.rank_coords(rank)
    assert mesh.rank_of(coords) == rank
    for index, dim in enumerate(MESH_ORDER):
        assert mesh.stride(dim) == math.prod(sizes[index + 1:])
        assert mesh.size(dim) == sizes[index]
        group = mesh.group_ranks(dim, rank)
        assert rank in group and len(group) == sizes[index]
        assert all(b - a == mesh.stride(dim) for a, b in zip(group, group[1:]))


@given(sizes=sizes, per_node=st.sampled_from([1, 2, 4, 8]))
def test_placement_agrees_with_the_topology(sizes: tuple[int, ...], per_node: int) -> None:
    """Each dimension's slowest tier is the topology's for a group of its size and stride, and
    its nodes times members per node cover the group. The stride is the mesh's, except ep's:
    tp (the expert layers' rank order, plan/mesh.expert_stride)."""
    topology = Topology(per_node, IB, NVLINK if per_node > 1 else None)
    mesh = DeviceMesh(sizes)
    for placed in placement(mesh, topology):
        assert placed.stride == (mesh.size(MeshDim.TP) if placed.dimension is MeshDim.EP
                                 else mesh.stride(placed.dimension))
        assert placed.tier is topology.tier_for(placed.size, placed.stride)
        assert placed.tier is topology.tier(placed.span)
        assert placed.span.nodes * placed.span.per_node >= placed.size
        assert len(placed.tiers) == 1 + (placed.span.crosses_nodes and placed.span.per_node > 1
                                         and topology.intra_node is not None)


def test_tensor_split_events_run_over_tp() -> None:
    workload = load_workload("gpt3-125m")
    context = SplitContext("tensor", True, 1, 2.0)
    kinds = {layer.kind: layer for layer in workload.layers}
    events = [event for kind in ("attn_qkv", "attn_out", "mlp_up", "mlp_down")
              for event in megatron_shard(kinds[kind], 4, context, False).events]
    assert events and all(event.dimension is MeshDim.TP for event in events)


def test_a_mesh_prints_its_sizes_outermost_first() -> None:
    assert str(DeviceMesh.of(tp=8, pp=4, dp=2)) == "pp4 × dp2 × ep1 × cp1 × tp8"
