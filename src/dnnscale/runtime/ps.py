"""Parameter-server shards and the worker's client, over point-to-point gloo messages.

Interface (the transport could be replaced behind it): `PSClient.push(flat_grad, step)`,
`PSClient.pull(flat_out, step)`, `PSClient.shard_of(index)`, plus `init` (replica 0 seeds the
shards with the initial weights) and `done`.

Protocol: a request is a header [op, step] (tag HEADER) followed, for INIT and PUSH, by the
worker's piece of the shard's slice (tag PAYLOAD); a PULL is answered with the piece (tag REPLY).
Requests travel in `requests`, a process group over all ranks with a long timeout (a shard
legitimately waits as long as a worker takes for push_every steps); replies in the default group,
whose timeout is the run's.
The worker posts the receive for the reply before it asks, and sends pushes non-blocking, so a
shard never waits on a worker that waits on the shard.

- ps-async (Project Adam): the shard applies each push as it arrives, w -= lr · g, and answers
  every pull at once with what it has.
- ps-sync: the shard sums the pushes of step t from all R replicas, applies w -= lr · Σg / R once
  all have arrived, and holds pulls for step t until then.

With Adam's FC vector protocol (`segments` given, runtime/vector_protocol.py) a push carries,
for the FC layers' part of a piece, the errors and inputs of the push's samples instead of
weight gradients; the shard forms the piece's update from them (the outer products, added in
place) and applies it exactly as above.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dnnscale.model.vectors import Region
from dnnscale.plan.mesh import DeviceMesh, MeshDim
from dnnscale.runtime.layout import Piece, ShardMap
from dnnscale.runtime.vector_protocol import (Segment, Vectors, add_update, pack,
                                              payload_length, piece_segments)

OP_INIT, OP_PUSH, OP_PULL, OP_DONE = 1, 2, 3, 4
TAG_HEADER, TAG_PAYLOAD, TAG_REPLY = 101, 102, 103


class PSClient:
    """A worker's view of the parameter servers: pieces of its partition's flat vector."""

    def __init__(self, shard_map: ShardMap, partition: int, first_ps_rank: int,
                 requests: Any = None, regions: tuple[Region, ...] = ()) -> None:
        self.shard_map = shard_map
        self.requests = requests
        self.partition = partition
        self.first_ps_rank = first_ps_rank
        self.pieces = shard_map.pieces_of_partition(partition)
        # The vector protocol (regions of model/vectors.py given): each piece's segments.
        self.segments: list[tuple[Segment, ...]] | None = (
            [piece_segments(regions, shard_map, piece) for piece in self.pieces]
            if regions else None)

    def shard_of(self, index: int) -> int:
        """The shard owning element `index` of this partition's flat parameter vector."""
        return self.shard_map.shard_of(self.shard_map.partition_offsets[self.partition] + index)

    def _send(self, op: int, step: int, flat: torch.Tensor | None,
              vectors: Vectors | None = None) -> None:
        works, buffers = [], []  # the buffers must outlive the sends
        header = torch.tensor([op, step], dtype=torch.int64)
        for index, piece in enumerate(self.pieces):
            dst = self.first_ps_rank + piece.shard
            works.append(dist.isend(header, dst, group=self.requests, tag=TAG_HEADER))
            if flat is not None:
                payload = flat[piece.worker_start:piece.worker_start + piece.length]
                if vectors is not None and self.segments is not None:
                    payload = pack(self.segments[index], payload, vectors)
                payload = payload.contiguous()
                buffers.append(payload)
                works.append(dist.isend(payload, dst, group=self.requests, tag=TAG_PAYLOAD))
        for work in works:
            work.wait()

    def init(self, flat_weights: torch.Tensor) -> None:
        """Seed the shards with this partition's initial weights (replica 0 only)."""
        self._send(OP_INIT, 0, flat_weights)

    def push(self, flat_grad: torch.Tensor, step: int, vectors: Vectors | None = None) -> None:
        """Send the accumulated gradient of this partition to the shards that own it; with
        the vector protocol, FC layers travel as `vectors` (their entries of `flat_grad` are
        not read)."""
        if (vectors is None) != (self.segments is None):
            raise ValueError("vectors go with a client made for the vector protocol")
        self._send(OP_PUSH, step, flat_grad, vectors)

    def pull(self, flat_out: torch.Tensor, step: int) -> None:
        """Overwrite `flat_out` with the shards' current weights for this partition."""
        replies = []
        for piece in self.pieces:
            buffer = torch.empty(piece.length)
            work = dist.irecv(buffer, self.first_ps_rank + piece.shard, tag=TAG_REPLY)
            replies.append((piece, buffer, work))
        self._send(OP_PULL, step, None)
        for piece, buffer, work in replies:
            work.wait()
            flat_out[piece.worker_start:piece.worker_start + piece.length] = buffer

    def done(self) -> None:
        self._send(OP_DONE, 0, None)


@dataclass
class ShardStats:
    """What a shard saw: pushes per worker rank, updates applied, time busy vs waiting."""

    pushes_by_rank: dict[int, int] = field(default_factory=dict)
    values_received: int = 0
    """Values received in pushes (gradients, or vectors under the vector protocol)."""
    pulls: int = 0
    updates_applied: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0


class ShardServer:
    """One shard: owns slice `shard` of the flat parameters and serves workers until all are done.

    `partition_of(rank)` maps a worker rank to its partition; `workers_of_partition` counts the
    replicas (R) that push each piece.
    """

    def __init__(self, shard_map: ShardMap, shard: int, partitions: int, replicas: int,
                 lr: float, synchronous: bool, requests: Any = None,
                 regions: tuple[Region, ...] = (), samples_per_push: int = 0) -> None:
        """`regions` (model/vectors.py) turn on the vector protocol; a push then carries the
        vectors of `samples_per_push` samples (n · k_push)."""
        self.shard_map, self.shard = shard_map, shard
        self.requests = requests
        self.partitions, self.replicas = partitions, replicas
        self.mesh = DeviceMesh.of(tp=partitions, dp=replicas)  # the workers' ranks
        self.lr, self.synchronous = lr, synchronous
        self.weights = torch.zeros(shard_map.shard_size(shard))
        self.initial = self.weights
        self.pieces: dict[int, Piece] = {piece.partition: piece
                                         for piece in shard_map.pieces_of_shard(shard)}
        self.stats = ShardStats()
        self.samples_per_push = samples_per_push
        self.segments: dict[int, tuple[Segment, ...]] = {
            partition: piece_segments(regions, shard_map, piece)
            for partition, piece in self.pieces.items()} if regions else {}
        self._pending: dict[int, tuple[torch.Tensor, int]] = {}  # step -> (sum, pushes)
        self._applied_steps: set[int] = set()
        self._held_pulls: dict[int, list[int]] = {}  # step -> worker ranks waiting

    def _piece_of(self, rank: int) -> Piece:
        return self.pieces[self.mesh.rank_coords(rank)[MeshDim.TP]]

    def _recv_header(self) -> tuple[int, int, int]:
        header = torch.zeros(2, dtype=torch.int64)
        start = time.perf_counter()
        src = dist.recv(header, src=None, group=self.requests, tag=TAG_HEADER)
        self.stats.wait_s += time.perf_counter() - start
        return int(src), int(header[0]), int(header[1])

    def _recv_payload(self, src: int, push: bool = False) -> tuple[Piece, torch.Tensor]:
        """The piece `src` sends and its values: the weights (INIT), or the gradient (PUSH;
        FC vectors under the vector protocol)."""
        piece = self._piece_of(src)
        segments = self.segments.get(piece.partition) if push else None
        size = payload_length(segments, self.samples_per_push) if segments else piece.length
        payload = torch.empty(size)
        dist.recv(payload, src, group=self.requests, tag=TAG_PAYLOAD)
        if push:
            self.stats.values_received += size
        return piece, payload

    def _add(self, target: torch.Tensor, piece: Piece, payload: torch.Tensor,
             alpha: float) -> None:
        """target += alpha · the piece's pushed gradient (formed from FC vectors in place
        under the vector protocol)."""
        segments = self.segments.get(piece.partition)
        if segments:
            add_update(segments, payload, self.samples_per_push, target, alpha)
        else:
            target.add_(payload, alpha=alpha)

    def _reply(self, src: int) -> None:
        piece = self._piece_of(src)
        dist.send(self.weights[piece.shard_start:piece.shard_start + piece.length].contiguous(),
                  src, tag=TAG_REPLY)
        self.stats.pulls += 1

    def receive_init(self) -> None:
        """Receive the initial weights from replica 0's workers (one message per piece)."""
        for _ in range(len(self.pieces)):
            src, op, _ = self._recv_header()
            if op != OP_INIT:
                raise RuntimeError(f"shard {self.shard}: expected INIT from rank {src}, got op {op}")
            piece, payload = self._recv_payload(src)
            self.weights[piece.shard_start:piece.shard_start + piece.length] = payload
        self.initial = self.weights.clone()

    def serve(self) -> ShardStats:
        """Handle requests until every worker that touches this shard has said DONE."""
        remaining = len(self.pieces) * self.replicas
        while remaining:
            src, op, step = self._recv_header()
            start = time.perf_counter()
            if op == OP_PUSH:
                piece, payload = self._recv_payload(src, push=True)
                self.stats.pushes_by_rank[src] = self.stats.pushes_by_rank.get(src, 0) + 1
                if self.synchronous:
                    self._accumulate(step, piece, payload)
                else:
                    view = self.weights[piece.shard_start:piece.shard_start + piece.length]
                    self._add(view, piece, payload, -self.lr)
                    self.stats.updates_applied += 1
            elif op == OP_PULL:
                if self.synchronous and step not in self._applied_steps:
                    self._held_pulls.setdefault(step, []).append(src)
                else:
                    self._reply(src)
            elif op == OP_DONE:
                remaining -= 1
            else:
                raise RuntimeError(f"shard {self.shard}: unknown op {op} from rank {src}")
            self.stats.busy_s += time.perf_counter() - start
        return self.stats

    def _accumulate(self, step: int, piece: Piece, payload: torch.Tensor) -> None:
        total, count = self._pending.get(step, (torch.zeros_like(self.weights), 0))
        self._add(total[piece.shard_start:piece.shard_start + piece.length], piece, payload, 1.0)
        count += 1
        if count < len(self.pieces) * self.replicas:
            self._pending[step] = (total, count)
            return
        self._pending.pop(step, None)
        self.weights.add_(total, alpha=-self.lr / self.replicas)
        self.stats.updates_applied += 1
        self._applied_steps.add(step)
        for src in self._held_pulls.pop(step, []):
            self._reply(src)

    def change_l2(self) -> float:
        """Euclidean distance of the shard's weights from the initial weights."""
        return float(torch.linalg.vector_norm(self.weights - self.initial))
