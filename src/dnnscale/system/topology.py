"""Links between devices in tiers, and the placement rule that puts each parallel group on one.

A system's devices sit in nodes of `devices_per_node`; devices inside a node share a fast tier
(NVLink/NVSwitch on a GPU node), nodes are joined by a slower one (InfiniBand, Ethernet). A CPU
cluster is nodes of one device and a single tier: its NIC.

Parallel groups are laid out by the plan's device mesh (plan/mesh.py: tp innermost, then cp, ep,
dp and pp, the Megatron order), whose `placement` gives each group's stride: a group of `size`
members whose neighbours are `stride` devices apart spans
ceil(size·stride / devices_per_node) nodes when it does not fit in one. `GroupSpan` says how
many of its members share a node, which decides the tier (and, for a hierarchical collective,
both tiers) it runs on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkTier:
    """One tier of links: per-device bandwidth in each direction (full duplex) and per-message
    latency. `allreduce_fits`: calibrated all-reduce α-β fits per group size, as
    ((peers, bandwidth_bytes_per_s, latency_s), ...) — measured by `dnnscale calibrate`.
    `fits`: calibrated α-β fits of other registered operations per group size, as
    ((operation, members, bandwidth_bytes_per_s, latency_s), ...) (a testbed's
    ps_sync_pull). `curves`: measured times of an operation among `members` at each payload,
    as ((operation, members, ((payload_bytes, seconds), ...)), ...) (a testbed's partition
    exchanges; its held pulls per shard's piece, model/collectives.PULL_PIECE_CURVE), which
    price it before any fit (model/network.measured_time_s)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    name: str = "network"
    allreduce_fits: tuple[tuple[int, float, float], ...] = ()
    hardware: str = ""
    """NCCL's class of the link in its cost model ('nvlink', 'pci' or 'net'); '' where no
    protocol model applies and `latency_s` prices every message (model/collectives.py)."""
    protocols: tuple[str, ...] = ()
    """The NCCL protocols a ring collective may pick on this tier (model/collectives.
    NCCL_PROTOCOLS), `latency_s` being the LL protocol's per-hop latency; () for one protocol
    at `latency_s`."""
    fits: tuple[tuple[str, int, float, float], ...] = ()
    curves: tuple[tuple[str, int, tuple[tuple[float, float], ...]], ...] = ()

    def allreduce_fit(self, peers: int) -> tuple[float, float] | None:
        """The calibrated (bandwidth, latency) of an all-reduce among `peers`, if measured."""
        for size, bandwidth, latency in self.allreduce_fits:
            if size == peers:
                return bandwidth, latency
        return None

    def fit(self, operation: str, members: int) -> tuple[float, float] | None:
        """The calibrated (bandwidth, latency) of `operation` among `members`, if measured."""
        if operation == "allreduce":
            return self.allreduce_fit(members)
        for name, size, bandwidth, latency in self.fits:
            if name == operation and size == members:
                return bandwidth, latency
        return None

    def curve(self, operation: str, members: int) -> tuple[tuple[float, float], ...] | None:
        """The measured (payload bytes, seconds) of `operation` among `members`, if measured."""
        for name, size, points in self.curves:
            if name == operation and size == members:
                return points
        return None



@dataclass(frozen=True)
class GroupSpan:
    """Where a parallel group's members sit: `size` members, `per_node` of them in each node."""

    size: int
    per_node: int

    @property
    def nodes(self) -> int:
        return math.ceil(self.size / self.per_node)

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def group_span(size: int, stride: int, devices_per_node: int) -> GroupSpan:
    """The span of a group of `size` devices, `stride` apart (1 for the innermost group).

    Formula: members per node = max(1, min(size, floor(devices_per_node / stride))).
    Units: counts.
    Source: Megatron-LM's rank order (tensor innermost, then data, then pipeline; Narayanan et
    al. SC'21 §3; plan/mesh.py), which keeps a tensor-parallel group inside a node when t ≤ GPUs
    per node.
    """
    if size <= 1:
        return GroupSpan(1, 1)
    per_node = max(1, min(size, devices_per_node // max(1, stride)))
    return GroupSpan(size, per_node)


@dataclass(frozen=True)
class Topology:
    """Nodes of `devices_per_node` devices; `intra_node` joins devices inside a node (None for
    one-device nodes), `inter_node` joins nodes."""

    devices_per_node: int
    inter_node: LinkTier
    intra_node: LinkTier | None = None

    def tier(self, span: GroupSpan) -> LinkTier:
        """The slowest tier a group crosses: between nodes when it spans several, else inside."""
        if span.crosses_nodes or self.intra_node is None:
            return self.inter_node
        return self.intra_node

    def tier_for(self, size: int, stride: int) -> LinkTier:
        """`tier(group_span(size, stride, devices_per_node))`, without building the span (the
        optimizer asks this for every candidate replica count): a group stays inside a node
        exactly when size · stride ≤ devices_per_node."""
        if self.intra_node is None:
            return self.inter_node
        if size <= 1 or size * stride <= self.devices_per_node:
            return self.intra_node
        return self.inter_node
