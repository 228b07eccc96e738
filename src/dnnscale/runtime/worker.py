"""A worker's training loop: forward/backward of its slice, then the sync mode's exchange.

Per step (perf_counter): partition_comm_s is the time inside the partition collectives (measured
in the autograd Functions), allreduce_s / ps_push_s / ps_pull_s the time in those calls, and
compute_s the rest of the step (forward, backward, the local SGD update, and with the epoch
cut-off one update of the run's progress counter).

Sync modes:
- allreduce: gradients all-reduced over the R replicas of the partition and averaged, then SGD.
- ps-async: local SGD every step; the gradient accumulated since the last push goes to the shards
  every push_every steps; fresh weights come from the shards every pull_every steps.
- ps-sync: as ps-async, but every push_every steps all replicas push, and each pulls at once
  (the shards answer when all R pushes are in), so replicas stay identical.

Project Adam's mechanisms (issue 18):
- fc_protocol 'vectors': FC layers compute no weight gradient; their inputs and output errors of
  the steps since the last push travel to the shards, which form the outer products
  (runtime/vector_protocol.py). The worker's FC weights change only by pulls.
- overlap: a background thread per worker (`BackgroundExchange`) runs the push and pull of step
  t while the worker computes step t+1; the worker waits for it only at its next exchange, and
  then takes the shards' weights plus its own updates made since the exchange began
  (w ← w_pulled + (w − w_at_exchange)). At most one exchange is in flight, so the shards' state
  a step sees is at most one exchange older than without overlap: with pulls every k_pull steps
  the pull in a step's weights was issued at most 2·k_pull steps before it (k_pull without
  overlap). Every step record says after which step the pull in the weights it computed with
  was issued (`pulled_at_step`, −1 for the initial weights).
- epoch_fraction f < 1 (ps-async): the epoch (the steps after warm-up) ends once the replicas
  together have done ceil(f · R · (steps − warmup)) of them (`EpochCutoff`); every replica stops
  after the step in which it learns that, so stragglers are cut off. Step records carry the
  counter (`epoch_steps_done`, on partition 0) and `epoch_over`.
"""

from __future__ import annotations

import math
import queue
import threading
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
from dnnscale.runtime.vector_protocol import Vectors

EPOCH_KEY = "dnnscale/epoch"


class EpochCutoff:
    """Adam's straggler cut-off: the run's replicas count their finished steps in the
    rendezvous key-value store; the epoch is over when the count reaches `target_steps`.

    A replica's partition-0 worker adds each step and tells its partitions 1..P−1 (one key per
    step) whether to go on, so all partitions of a replica stop at the same step."""

    def __init__(self, store: Any, target_steps: int, replica: int, partition: int,
                 partitions: int, warmup: int = 0) -> None:
        self.store, self.target, self.warmup = store, target_steps, warmup
        self.replica, self.partition, self.partitions = replica, partition, partitions

    @classmethod
    def for_run(cls, config: Config, steps: int, warmup: int, replica: int, partition: int,
                store: Any = None) -> "EpochCutoff | None":
        """The cut-off of an asynchronous run with epoch_fraction f < 1 (None otherwise): the
        epoch is the timed steps (after `warmup`), ceil(f · R · (steps − warmup)) of them in
        all. The store defaults to the default process group's."""
        if config.sync != "ps-async" or config.epoch_fraction >= 1:
            return None
        if store is None:
            store = dist.distributed_c10d._get_default_store()
        target = math.ceil(config.epoch_fraction * config.replicas * (steps - warmup))
        return cls(store, target, replica, partition, config.partitions, warmup)

    def after_step(self, step: int) -> tuple[bool, int | None]:
        """(stop now?, replica-steps of the epoch done so far; None on partitions > 0 and
        during warm-up, which the epoch does not count)."""
        if step < self.warmup:
            return False, None
        key = f"{EPOCH_KEY}/go/{self.replica}/{step}"
        if self.partition == 0:
            total = int(self.store.add(f"{EPOCH_KEY}/done", 1))
            stop = total >= self.target
            if self.partitions > 1:
                self.store.set(key, "stop" if stop else "go")
            return stop, total
        return bytes(self.store.get(key)) == b"stop", None


@dataclass
class Exchange:
    """One push and/or pull, run by the background thread: `grad` (and `vectors`) to push,
    `pulled` to fill, `snapshot` the worker's weights when it began."""

    step: int
    grad: torch.Tensor | None
    vectors: Vectors | None
    pulled: torch.Tensor | None
    snapshot: torch.Tensor


class BackgroundExchange:
    """A worker's sender/receiver thread (Adam's overlap of transfers with computation): runs
    one Exchange at a time while the worker computes."""

    def __init__(self, client: PSClient) -> None:
        self.client = client
        self._jobs: queue.Queue[Exchange | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._job: Exchange | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0
        """How long the last finished exchange took in the background."""
        self._thread = threading.Thread(target=self._loop, name="ps-exchange", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            start = time.perf_counter()
            try:
                if job.grad is not None:
                    self.client.push(job.grad, job.step, job.vectors)
                if job.pulled is not None:
                    self.client.pull(job.pulled, job.step)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the worker's thread
                self._error = exc
            self.seconds = time.perf_counter() - start
            self._idle.set()

    def start(self, job: Exchange) -> None:
        """Begin `job` in the background (the previous one must be finished)."""
        if self._job is not None:
            raise RuntimeError("an exchange is still in flight")
        self._job = job
        self._idle.clear()
        self._jobs.put(job)

    def finish(self) -> Exchange | None:
        """Wait for the exchange in flight (None if there is none); re-raise its failure."""
        self._idle.wait()
        if self._error is not None:
            raise self._error
        job, self._job = self._job, None
        return job

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)


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
    epoch: EpochCutoff | None = None


def flat_gradient(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The gradients of `params` as one vector (a parameter without one contributes zeros)."""
    return torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel())
                      for p in params])


def local_update(params: list[torch.nn.Parameter], grad: torch.Tensor, lr: float,
                 accumulated: torch.Tensor | None) -> torch.Tensor:
    """The worker's own step on its weights: the flattened weights after w -= lr·grad, and with
    parameter servers `grad` added to the gradient accumulated for the next push. The caller
    writes the vector back (vector_to_parameters) once the exchange has run. What these passes
    over the parameters cost is model/bookkeeping.py's; benchmarks/bookkeeping_bench.py times
    this function."""
    flat = parameters_to_vector(params)
    flat.add_(grad, alpha=-lr)
    if accumulated is not None:
        accumulated += grad
    return flat


def _stacked(steps: list[Vectors]) -> Vectors:
    """The vectors of several steps, stacked along the sample dimension."""
    return {name: (torch.cat([s[name][0] for s in steps]), torch.cat([s[name][1] for s in steps]))
            for name in steps[0]}


def train(net: PartitionedNet, data: TeacherData, ctx: WorkerContext, steps: int,
          emit: Callable[[dict[str, Any]], None],
          on_step: Callable[[int], None] = lambda step: None) -> list[dict[str, Any]]:
    """Run `steps` steps (fewer if the epoch is cut off); `emit` each step record as it is
    made; return all step records."""
    cfg = ctx.config
    params = list(net.parameters())
    ps = ctx.ps
    accumulated = torch.zeros(sum(p.numel() for p in params)) if ps is not None else None
    vectors_on = ps is not None and cfg.fc_protocol == "vectors"
    net.capture_vectors(vectors_on)
    pending: list[Vectors] = []
    background = BackgroundExchange(ps) if ps is not None and cfg.overlap else None
    pulled_at = -1  # the step after which the pull now in the weights was issued (-1: initial)
    records = []
    try:
        for step in range(steps):
            on_step(step)
            start = time.perf_counter()
            weights_from = pulled_at
            net.comm.seconds = 0.0
            phase = {"allreduce": 0.0, "ps_push": 0.0, "ps_pull": 0.0}
            x, y = data.batch(step)
            for p in params:
                p.grad = None
            loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            net.sync_shared_grads()
            grad = flat_gradient(params)
            if cfg.sync == "allreduce" and ctx.replica_group is not None:
                t0 = time.perf_counter()
                dist.all_reduce(grad, group=ctx.replica_group)
                grad /= cfg.replicas
                phase["allreduce"] = time.perf_counter() - t0
            extra: dict[str, Any] = {}
            with torch.no_grad():
                flat = local_update(params, grad, ctx.lr, accumulated)
                if ps is not None and accumulated is not None:
                    if vectors_on:
                        pending.append(net.vectors())
                    push_now = (step + 1) % cfg.push_every == 0
                    pull_now = push_now if cfg.sync == "ps-sync" \
                        else (step + 1) % cfg.pull_every == 0
                    vectors = _stacked(pending) if vectors_on and push_now else None
                    if background is None:
                        if push_now:
                            t0 = time.perf_counter()
                            ps.push(accumulated, step, vectors)
                            phase["ps_push"] = time.perf_counter() - t0
                        if pull_now:
                            t0 = time.perf_counter()
                            ps.pull(flat, step)
                            phase["ps_pull"] = time.perf_counter() - t0
                            pulled_at = step
                    elif push_now or pull_now:
                        t0 = time.perf_counter()
                        done = background.finish()
                        phase["ps_pull"] = time.perf_counter() - t0
                        t0 = time.perf_counter()
                        if done is not None and done.pulled is not None:
                            flat.sub_(done.snapshot).add_(done.pulled)
                            pulled_at = done.step
                        if done is not None:
                            extra["ps_exchange_s"] = background.seconds
                        background.start(Exchange(
                            step, accumulated.clone() if push_now else None, vectors,
                            torch.empty_like(flat) if pull_now else None, flat.clone()))
                        phase["ps_push"] = time.perf_counter() - t0
                    if push_now:
                        accumulated.zero_()
                        pending = []
                vector_to_parameters(flat, params)
            stop = False
            if ctx.epoch is not None:
                stop, total = ctx.epoch.after_step(step)
                extra["epoch_steps_done"] = total
                extra["epoch_target_steps"] = ctx.epoch.target
                extra["epoch_over"] = stop
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
            if ps is not None:
                record["pulled_at_step"] = weights_from
            record.update(extra)
            emit(record)
            records.append(record)
            if stop:
                break
        if background is not None:
            done = background.finish()  # the last exchange lands before the worker is done
            if done is not None and done.pulled is not None:
                with torch.no_grad():
                    flat = parameters_to_vector(params)
                    flat.sub_(done.snapshot).add_(done.pulled)
                    vector_to_parameters(flat, params)
    finally:
        if background is not None:
            background.close()
    return records
