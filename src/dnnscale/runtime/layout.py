"""Who does what in a run: rank roles, neuron splits, and parameter-server shard slices.

Pure functions of the Config (no torch), shared by every rank so they all agree without talking.

Rank numbering: the R·P workers come first, in the plan's mesh order (plan/mesh.py: dp outside
tp, so rank = replica·P + partition); the S parameter-server shards follow (ranks R·P …
R·P+S−1). Rank 0 is therefore always worker (replica 0, partition 0),
which hosts the rendezvous and writes the summary.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.errors import InputError
from dnnscale.plan import Config
from dnnscale.plan.mesh import DeviceMesh, MeshDim
from dnnscale.plan.rules import require, shards_within_params


@dataclass(frozen=True)
class RankRole:
    """One rank's job: a worker (replica, partition) or a parameter-server shard."""

    rank: int
    kind: str  # "worker" | "ps"
    replica: int | None = None
    partition: int | None = None
    shard: int | None = None

    def describe(self) -> str:
        """Human name used in messages, e.g. 'worker (replica 1, partition 0)'."""
        if self.kind == "ps":
            return f"parameter server (shard {self.shard})"
        return f"worker (replica {self.replica}, partition {self.partition})"

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"rank": self.rank, "role": self.kind}
        if self.kind == "ps":
            data["shard"] = self.shard
        else:
            data.update(replica=self.replica, partition=self.partition)
        return data


def world_size(config: Config) -> int:
    """Ranks a run needs: R·P workers plus S shards in the PS modes (0 with all-reduce)."""
    return config.workers + (config.ps_shards if config.uses_ps else 0)


def worker_mesh(config: Config) -> DeviceMesh:
    """The workers' device mesh: the plan's (tp = P, dp = R)."""
    return config.to_plan().mesh


def rank_roles(config: Config) -> list[RankRole]:
    """Every rank's role, in rank order."""
    mesh = worker_mesh(config)
    roles = []
    for rank in range(mesh.devices):
        coords = mesh.rank_coords(rank)
        roles.append(RankRole(rank=rank, kind="worker", replica=coords[MeshDim.DP],
                              partition=coords[MeshDim.TP]))
    if config.uses_ps:
        roles += [RankRole(rank=config.workers + s, kind="ps", shard=s)
                  for s in range(config.ps_shards)]
    return roles


def partition_group_ranks(config: Config, replica: int) -> list[int]:
    """The P worker ranks of one replica (they exchange activations and input gradients)."""
    mesh = worker_mesh(config)
    return mesh.group_ranks(MeshDim.TP, mesh.rank_of({MeshDim.DP: replica, MeshDim.TP: 0}))


def replica_group_ranks(config: Config, partition: int) -> list[int]:
    """The R worker ranks that hold the same partition (all-reduce data parallelism)."""
    mesh = worker_mesh(config)
    return mesh.group_ranks(MeshDim.DP, mesh.rank_of({MeshDim.DP: 0, MeshDim.TP: partition}))


def split_offsets(sizes: list[int]) -> list[int]:
    """Start offset of each part: [4, 3, 3] -> [0, 4, 7]."""
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += size
    return offsets


@dataclass(frozen=True)
class Piece:
    """The overlap of one worker partition's flat parameters with one shard's slice.

    `worker_start` indexes the partition's flat parameter vector, `shard_start` the shard's
    slice; `length` values are shared.
    """

    partition: int
    shard: int
    worker_start: int
    shard_start: int
    length: int


class ShardMap:
    """S shards own disjoint, contiguous slices of the global flat parameter vector.

    The global vector is partition 0's flat parameters, then partition 1's, and so on; shard s
    owns [s·N//S, (s+1)·N//S). `pieces_of_partition` is what a worker pushes and pulls.
    """

    def __init__(self, partition_sizes: list[int], shards: int) -> None:
        total = sum(partition_sizes)
        if shards < 1:
            raise InputError("config.ps_shards", f"must be >= 1, got {shards}")
        require(shards_within_params(shards, total), "config")
        self.partition_sizes = list(partition_sizes)
        self.partition_offsets = split_offsets(self.partition_sizes)
        self.shards = shards
        self.total = total
        self.bounds = [(s * total // shards, (s + 1) * total // shards) for s in range(shards)]

    def shard_size(self, shard: int) -> int:
        start, end = self.bounds[shard]
        return end - start

    def shard_of(self, index: int) -> int:
        """The shard that owns global flat parameter `index`."""
        if not 0 <= index < self.total:
            raise IndexError(index)
        # bounds are s·N//S; invert and correct for rounding.
        shard = min(index * self.shards // self.total, self.shards - 1)
        while index < self.bounds[shard][0]:
            shard -= 1
        while index >= self.bounds[shard][1]:
            shard += 1
        return shard

    def pieces_of_partition(self, partition: int) -> list[Piece]:
        """The slices of partition `partition`'s flat vector, one per shard it touches."""
        start = self.partition_offsets[partition]
        end = start + self.partition_sizes[partition]
        pieces = []
        for shard, (lo, hi) in enumerate(self.bounds):
            a, b = max(start, lo), min(end, hi)
            if a < b:
                pieces.append(Piece(partition=partition, shard=shard, worker_start=a - start,
                                    shard_start=a - lo, length=b - a))
        return pieces

    def pieces_of_shard(self, shard: int) -> list[Piece]:
        """Every partition's overlap with `shard` (what the shard receives from one replica)."""
        return [piece for p in range(len(self.partition_sizes))
                for piece in self.pieces_of_partition(p) if piece.shard == shard]
