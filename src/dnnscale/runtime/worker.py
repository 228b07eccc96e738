"""A worker's training loop: forward/backward of its slice, then the sync mode's exchange.

Per step (perf_counter): partition_comm_s is the time inside the partition collectives (measured
in the autograd Functions), allreduce_s / ps_push_s / ps_pull_s the time in those calls, and
compute_s the rest of the step (forward, backward and the local SGD update).

Sync modes:
- allreduce: gradients all-reduced over the R replicas of the partition and averaged, then SGD.
- ps-async: local SGD every step; the gradient accumulated since the last push goes to the shards
  every push_every steps; fresh weights come from the shards every pull_every steps.
- ps-sync: as ps-async, but every push_every steps all replicas push, and each pulls at once
  (the shards answer when all R pushes are in), so replicas stay identical.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from dnnscale.plan import Config
from dnnscale.runtime.data import TeacherData
from dnnscale.runtime.network import PartitionedNet
from dnnscale.runtime.ps import PSClient


@dataclass
class WorkerContext:
    """What a worker's loop needs besides its network and data."""

    rank: int
    replica: int
    partition: int
    config: Config
    lr: float
    replica_group: Any = None  # all-reduce group of this partition's replicas (None: R = 1)
    ps: PSClient | None = None


def _flat_grad(net: PartitionedNet) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in net.parameters()])


def train(net: PartitionedNet, data: TeacherData, ctx: WorkerContext, steps: int,
          emit: Callable[[dict[str, Any]], None],
          on_step: Callable[[int], None] = lambda step: None) -> list[dict[str, Any]]:
    """Run `steps` steps; `emit` each step record as it is made; return all step records."""
    cfg = ctx.config
    params = list(net.parameters())
    accumulated = torch.zeros(sum(p.numel() for p in params)) if ctx.ps is not None else None
    records = []
    for step in range(steps):
        on_step(step)
        start = time.perf_counter()
        net.comm.seconds = 0.0
        phase = {"allreduce": 0.0, "ps_push": 0.0, "ps_pull": 0.0}
        x, y = data.batch(step)
        for p in params:
            p.grad = None
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        net.sync_shared_grads()
        grad = _flat_grad(net)
        if cfg.sync == "allreduce" and ctx.replica_group is not None:
            t0 = time.perf_counter()
            dist.all_reduce(grad, group=ctx.replica_group)
            grad /= cfg.replicas
            phase["allreduce"] = time.perf_counter() - t0
        with torch.no_grad():
            flat = parameters_to_vector(params)
            flat.add_(grad, alpha=-ctx.lr)
            if ctx.ps is not None and accumulated is not None:
                accumulated += grad
                push_now = (step + 1) % cfg.push_every == 0
                pull_now = push_now if cfg.sync == "ps-sync" else (step + 1) % cfg.pull_every == 0
                if push_now:
                    t0 = time.perf_counter()
                    ctx.ps.push(accumulated, step)
                    accumulated.zero_()
                    phase["ps_push"] = time.perf_counter() - t0
                if pull_now:
                    t0 = time.perf_counter()
                    ctx.ps.pull(flat, step)
                    phase["ps_pull"] = time.perf_counter() - t0
            vector_to_parameters(flat, params)
        end = time.perf_counter()
        step_s = end - start
        comm_s = net.comm.seconds
        record = {"type": "step", "rank": ctx.rank, "role": "worker", "replica": ctx.replica,
                  "partition": ctx.partition, "step": step, "loss": float(loss),
                  "samples": cfg.minibatch, "t_start_s": start, "t_end_s": end,
                  "step_s": step_s,
                  "compute_s": max(0.0, step_s - comm_s - sum(phase.values())),
                  "partition_comm_s": comm_s, "ps_push_s": phase["ps_push"],
                  "ps_pull_s": phase["ps_pull"], "allreduce_s": phase["allreduce"]}
        emit(record)
        records.append(record)
    return records
