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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dnnscale.runtime.layout import Piece, ShardMap

OP_INIT, OP_PUSH, OP_PULL, OP_DONE = 1, 2, 3, 4
TAG_HEADER, TAG_PAYLOAD, TAG_REPLY = 101, 102, 103


class PSClient:
    """A worker's view of the parameter servers: pieces of its partition's flat vector."""

    def __init__(self, shard_map: ShardMap, partition: int, first_ps_rank: int,
                 requests: Any = None) -> None:
        self.shard_map = shard_map
        self.requests = requests
        self.partition = partition
        self.first_ps_rank = first_ps_rank
        self.pieces = shard_map.pieces_of_partition(partition)

    def shard_of(self, index: int) -> int:
        """The shard owning element `index` of this partition's flat parameter vector."""
        return self.shard_map.shard_of(self.shard_map.partition_offsets[self.partition] + index)

    def _send(self, op: int, step: int, flat: torch.Tensor | None) -> None:
        works, buffers = [], []  # the buffers must outlive the sends
        header = torch.tensor([op, step], dtype=torch.int64)
        for piece in self.pieces:
            dst = self.first_ps_rank + piece.shard
            works.append(dist.isend(header, dst, group=self.requests, tag=TAG_HEADER))
            if flat is not None:
                payload = flat[piece.worker_start:piece.worker_start + piece.length].contiguous()
                buffers.append(payload)
                works.append(dist.isend(payload, dst, group=self.requests, tag=TAG_PAYLOAD))
        for work in works:
            work.wait()

    def init(self, flat_weights: torch.Tensor) -> None:
        """Seed the shards with this partition's initial weights (replica 0 only)."""
        self._send(OP_INIT, 0, flat_weights)

    def push(self, flat_grad: torch.Tensor, step: int) -> None:
        """Send the accumulated gradient of this partition to the shards that own it."""
        self._send(OP_PUSH, step, flat_grad)

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
                 lr: float, synchronous: bool, requests: Any = None) -> None:
        self.shard_map, self.shard = shard_map, shard
        self.requests = requests
        self.partitions, self.replicas = partitions, replicas
        self.lr, self.synchronous = lr, synchronous
        self.weights = torch.zeros(shard_map.shard_size(shard))
        self.initial = self.weights
        self.pieces: dict[int, Piece] = {piece.partition: piece
                                         for piece in shard_map.pieces_of_shard(shard)}
        self.stats = ShardStats()
        self._pending: dict[int, tuple[torch.Tensor, int]] = {}  # step -> (sum, pushes)
        self._applied_steps: set[int] = set()
        self._held_pulls: dict[int, list[int]] = {}  # step -> worker ranks waiting

    def _piece_of(self, rank: int) -> Piece:
        return self.pieces[rank % self.partitions]

    def _recv_header(self) -> tuple[int, int, int]:
        header = torch.zeros(2, dtype=torch.int64)
        start = time.perf_counter()
        src = dist.recv(header, src=None, group=self.requests, tag=TAG_HEADER)
        self.stats.wait_s += time.perf_counter() - start
        return int(src), int(header[0]), int(header[1])

    def _recv_payload(self, src: int) -> tuple[Piece, torch.Tensor]:
        piece = self._piece_of(src)
        payload = torch.empty(piece.length)
        dist.recv(payload, src, group=self.requests, tag=TAG_PAYLOAD)
        return piece, payload

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
                piece, payload = self._recv_payload(src)
                self.stats.pushes_by_rank[src] = self.stats.pushes_by_rank.get(src, 0) + 1
                if self.synchronous:
                    self._accumulate(step, piece, payload)
                else:
                    view = self.weights[piece.shard_start:piece.shard_start + piece.length]
                    view.add_(payload, alpha=-self.lr)
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
        total[piece.shard_start:piece.shard_start + piece.length] += payload
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
