"""The device mesh: a plan's parallel dimensions, named and ordered, and where each one sits.

A plan runs on `devices` = Π sizes devices, numbered in Megatron's rank order: the dimensions
from outermost to innermost are (pp, dp, ep, cp, tp), tp fastest. A rank's coordinate along a
dimension is (rank // stride) mod size, where the stride is the product of the sizes of the
dimensions inside it (design README, "One plan on one device mesh").

`placement(mesh, topology)` is the one function that maps each dimension's groups onto the
topology's link tiers: a group of a dimension has `size` members `stride` devices apart, so
(system/topology.group_span) `per_node` of them share a node. No call site computes a rank
stride; the model, the optimizer and the runtime read it from here.

Adding a dimension (say cp) is one line in `MeshDim` and one in `MESH_ORDER`; the plan then
sets its size in `ParallelPlan.mesh`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache

from dnnscale.errors import InputError
from dnnscale.system.topology import GroupSpan, LinkTier, Topology, group_span


class MeshDim(StrEnum):
    """A parallel dimension: pipeline stages, data-parallel replicas (Adam's R), expert
    parallelism, context parallelism, the tensor split (Megatron's TP, Adam's P)."""

    PP = "pp"
    DP = "dp"
    EP = "ep"
    CP = "cp"
    TP = "tp"

    def __str__(self) -> str:
        return self.value


MESH_ORDER: tuple[MeshDim, ...] = (MeshDim.PP, MeshDim.DP, MeshDim.EP, MeshDim.CP, MeshDim.TP)
"""Outermost to innermost: Megatron-LM's rank order (Narayanan et al. SC'21 §3; Megatron-Core's
RankGenerator order 'tp-cp-ep-dp-pp', fastest first), tp the fastest-varying."""


_INDEX: dict[str, int] = {dim.value: index for index, dim in enumerate(MESH_ORDER)}
"""Position of each dimension in MESH_ORDER, by name (a MeshDim is its name: a str enum)."""


def _index(dim: MeshDim | str) -> int:
    try:
        return _INDEX[dim]
    except (KeyError, TypeError):
        names = ", ".join(d.value for d in MESH_ORDER)
        raise InputError("mesh", f"no dimension {dim!r}; the dimensions are {names}") from None


def _dimension(dim: MeshDim | str) -> MeshDim:
    return MESH_ORDER[_index(dim)]


@dataclass(frozen=True)
class DeviceMesh:
    """Sizes of the mesh's dimensions, in `MESH_ORDER` (outermost first). Build it with
    `DeviceMesh.of(tp=8, dp=4, ...)`; a dimension not named has size 1."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Per dimension, the product of the sizes of the dimensions inside it."""

    def __post_init__(self) -> None:
        if len(self.sizes) != len(MESH_ORDER):
            raise InputError("mesh", f"needs {len(MESH_ORDER)} sizes "
                             f"({', '.join(d.value for d in MESH_ORDER)}), got {len(self.sizes)}")
        strides, inner = [], 1
        for dim, size in zip(MESH_ORDER[::-1], self.sizes[::-1]):
            if type(size) is not int or size < 1:  # bool, float, str or < 1: not a size
                raise InputError(f"mesh.{dim.value}", f"must be an integer >= 1, got {size!r}")
            strides.append(inner)
            inner *= size
        object.__setattr__(self, "strides", tuple(strides[::-1]))

    @classmethod
    def of(cls, **sizes: int) -> DeviceMesh:
        """A mesh from sizes by dimension name (pp=, dp=, ep=, cp=, tp=); the rest are 1."""
        for name in sizes:
            _index(name)
        return cls(tuple([sizes.get(dim.value, 1) for dim in MESH_ORDER]))

    def __str__(self) -> str:
        """'pp8 × dp8 × ep1 × cp1 × tp8': the sizes, outermost first."""
        return " × ".join(f"{dim.value}{size}" for dim, size in zip(MESH_ORDER, self.sizes))

    def size(self, dim: MeshDim | str) -> int:
        """Members of each group of `dim`."""
        return self.sizes[_index(dim)]

    def stride(self, dim: MeshDim | str) -> int:
        """Ranks between neighbours of a group of `dim`: Π sizes of the inner dimensions.

        Formula: stride(d) = Π_{d' inside d} size(d'); stride(tp) = 1.
        Units: ranks.
        """
        return self.strides[_index(dim)]

    @property
    def devices(self) -> int:
        """Devices the mesh covers: Π sizes."""
        return self.strides[0] * self.sizes[0]

    def with_size(self, dim: MeshDim | str, size: int) -> DeviceMesh:
        """The same mesh with `dim` resized (the search varies the replicas of one plan)."""
        index = _index(dim)
        return DeviceMesh(self.sizes[:index] + (size,) + self.sizes[index + 1:])

    def rank_coords(self, rank: int) -> dict[MeshDim, int]:
        """A rank's coordinate along every dimension: (rank // stride) mod size."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.devices:
            raise InputError("rank", f"must be an integer in [0, {self.devices}), got {rank!r}")
        return {dim: (rank // stride) % size
                for dim, size, stride in zip(MESH_ORDER, self.sizes, self.strides)}

    def rank_of(self, coords: Mapping[MeshDim | str, int]) -> int:
        """The rank at `coords` (Σ coordinate · stride); a dimension of size 1 may be left out."""
        given = {_dimension(dim): value for dim, value in coords.items()}
        rank = 0
        for dim, size, stride in zip(MESH_ORDER, self.sizes, self.strides):
            if dim not in given and size > 1:
                raise InputError(f"rank.{dim.value}", f"needed: the mesh has {size} along it")
            value = given.get(dim, 0)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise InputError(f"rank.{dim.value}", f"must be in [0, {size}), got {value!r}")
            rank += value * stride
        return rank

    def group_ranks(self, dim: MeshDim | str, rank: int) -> list[int]:
        """The ranks of the group of `dim` that holds `rank`, in order along `dim`."""
        dim = _dimension(dim)
        coords = self.rank_coords(rank)
        base = rank - coords[dim] * self.stride(dim)
        return [base + index * self.stride(dim) for index in range(self.size(dim))]


@dataclass(frozen=True)
class PlacedDimension:
    """One dimension's groups on the topology: `size` members, `stride` ranks apart, `span`
    (how many share a node), and `tiers`, the link tiers a group's collective runs on — one,
    or (inside a node, between nodes) for a group with several members in each of several
    nodes; the last is the slowest."""

    dimension: MeshDim
    size: int
    stride: int
    span: GroupSpan
    tiers: tuple[LinkTier, ...]
    topology: Topology = field(repr=False, compare=False)

    @property
    def tier(self) -> LinkTier:
        """The slowest tier a group of this dimension crosses."""
        return self.tiers[-1]

    def span_of(self, members: int) -> GroupSpan:
        """The span of `members` consecutive members of this dimension's groups: a halo's
        neighbours, two adjacent pipeline stages, or the whole group at another size of this
        dimension (the stride depends only on the inner dimensions)."""
        return group_span(members, self.stride, self.topology.devices_per_node)

    def tier_of(self, members: int) -> LinkTier:
        """The slowest tier `members` consecutive members of a group cross."""
        return self.topology.tier(self.span_of(members))


@dataclass(frozen=True)
class Placement:
    """Every dimension of a mesh placed on one topology, in `MESH_ORDER`."""

    mesh: DeviceMesh
    dimensions: tuple[PlacedDimension, ...]

    def __getitem__(self, dim: MeshDim | str) -> PlacedDimension:
        return self.dimensions[_index(dim)]

    def __iter__(self) -> Iterator[PlacedDimension]:
        return iter(self.dimensions)


def joint_span(mesh: DeviceMesh, dims: tuple[MeshDim, ...], devices_per_node: int) -> GroupSpan:
    """The span of a group over several dimensions at once (the members that differ only in
    their coordinates along `dims`): the dense gradients' group dp × ep × cp, the experts'
    dp × cp. Nodes are filled by rank, so the node of rank 0 holds as many members as any.

    Formula: size = Π size(d) over `dims`; per node = #{members r of rank 0's group with
    r < devices_per_node}, r = Σ c_d · stride(d) (the mesh's strides), counted without
    listing the group (at most devices_per_node members are visited).
    Units: counts.
    Source: Megatron-Core's rank order (plan/mesh.py); its expert data-parallel group with
    context parallelism spans dp and cp.
    """
    return _joint_span(mesh, tuple(sorted({_dimension(d) for d in dims}, key=_index)),
                       devices_per_node)


@lru_cache(maxsize=4096)
def _joint_span(mesh: DeviceMesh, dims: tuple[MeshDim, ...], devices_per_node: int) -> GroupSpan:
    sizes = [mesh.size(d) for d in dims]
    size = 1
    for value in sizes:
        size *= value
    if size <= 1:
        return GroupSpan(1, 1)
    wide = [d for d in dims if mesh.size(d) > 1]
    if len(wide) == 1:  # one dimension: exactly its own placement
        return group_span(size, mesh.stride(wide[0]), devices_per_node)
    strides = [mesh.stride(d) for d in dims]

    def below(index: int, budget: int) -> int:
        """Members whose offsets along dims[index:] sum to less than `budget`."""
        if index == len(dims):
            return 1
        count, stride = 0, strides[index]
        for step in range(sizes[index]):
            if step * stride >= budget:
                break
            count += below(index + 1, budget - step * stride)
        return count

    return GroupSpan(size, max(1, min(size, below(0, devices_per_node))))


def span_tiers(span: GroupSpan, topology: Topology) -> tuple[LinkTier, ...]:
    """The tiers a group of `span` uses: inside one node its intra-node tier; one member per
    node the inter-node tier; k > 1 members in each of N > 1 nodes both (a hierarchical
    collective). A topology without an intra-node tier has only its inter-node one."""
    intra = topology.intra_node
    if intra is None:
        return (topology.inter_node,)
    if not span.crosses_nodes:
        return (intra,)
    if span.per_node == 1:
        return (topology.inter_node,)
    return (intra, topology.inter_node)


def placement(mesh: DeviceMesh, topology: Topology, etp: int | None = None) -> Placement:
    """Each dimension's group size, stride, span and tiers on `topology` (memoised: the
    search places the same few meshes on one topology thousands of times).

    Formula: stride(d) = Π sizes inside d; members per node = max(1, min(size,
    floor(devices_per_node / stride))) (system/topology.group_span); nodes = ceil(size / per
    node).
    Units: counts.
    Source: Megatron-LM's rank order (tp innermost, then cp, ep, dp, pp; Narayanan et al. SC'21
    §3), which keeps a tensor group inside a node when tp ≤ GPUs per node; ep's groups by the
    expert layers' order (`expert_stride`: etp apart, `etp` None: tp).
    """
    return _placement(mesh, topology, etp)


def expert_stride(mesh: DeviceMesh, etp: int | None = None) -> int:
    """How many ranks apart an expert-parallel group's members sit: tp, not tp · cp.

    Megatron-Core orders the expert layers' ranks etp-ep-edp-pp over the same devices as the
    dense order tp-cp-ep-dp-pp (`etp`, expert tensor parallelism, None: tp), so an ep group's
    members are etp apart, across the cp ranks first; torchtitan's sparse mesh (pp,
    dp_replicate, efsdp, ep, etp) likewise. The experts' gradient group (expert data parallel,
    dp · cp · tp / etp members) then lies etp · ep apart.
    Units: ranks.
    Source: Megatron-Core parallel_state.initialize_model_parallel (expert RankGenerator);
    torchtitan ParallelDims (ep borrows from dp_shard and cp).
    """
    return etp or mesh.size(MeshDim.TP)


@lru_cache(maxsize=4096)
def _placement(mesh: DeviceMesh, topology: Topology, etp: int | None) -> Placement:
    placed = []
    for dim, size, stride in zip(MESH_ORDER, mesh.sizes, mesh.strides):
        if dim is MeshDim.EP:
            stride = expert_stride(mesh, etp)
        span = group_span(size, stride, topology.devices_per_node)
        placed.append(PlacedDimension(dim, size, stride, span, span_tiers(span, topology),
                                      topology))
    return Placement(mesh, tuple(placed))

