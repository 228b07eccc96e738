"""Composition: stage costs + aggregation -> throughput, step time and its parts (§3-§5).

The one function that turns a priced plan into a step: `predict` calls it once, the optimizer's
search calls it thousands of times on the same `StepContext` (everything of the plan but the
replica and shard counts, priced once: the stage costs, the bytes each replica pushes, pulls or
all-reduces, the update work). Each aggregation's arithmetic is written once, in `_ps_async`,
`_ps_sync` and `_collective`, returning every intermediate quantity; `throughput` reads one of
them, `compose` all of them, and `bound` calls the same arithmetic with relaxed arguments.

The structure the exact search relies on, read off these formulas (performance-model.md §4, §6):

- ps-async: X = R·n / T(R, Z, D), T the mean step of R replicas queueing at the busiest shard
  (ps.ps_queueing_cycle_s, Bard-Schweitzer), D = n / X_ps(share(S)) the shard's time per
  replica step and Z = T_w(S) − D the rest of the worker step. T_w, the worker step (compute +
  partition traffic combined with the longer of its own push/pull, S messages each, and the
  busiest shard's service of the replica, share·(push + pull)/B_ps), does not depend on R; its
  own part grows with S and the service part falls with the share; X_ps = min(X_ps,net,
  X_ps,cpu) grows as the busiest shard's share ceil(W/S)/W falls. X <= min(R·n / T_w, X_ps)
  (the queue's asymptotes), X is nondecreasing in R, and falls as T_w or D grows (at a fixed
  T_w, moving work from the replicas to the shard only adds queueing); tests/test_ps_queueing.py
  checks these. Over S in [lo, hi], T_w >= its value with the latency of lo shards and the
  share of hi shards, and the bound evaluates the queue at those relaxed Z and D.
- ps-sync: X = R·n / T(R, share, S) with T = combine(T_comp + T_mp, push + apply + pull), where
  push = max(W_push/P/B, R·share·W_push/B_ps) + S/k_push·α, pull alike but at least the
  held-pull convoy R·W_pull/B + R·P·α (collectives.held_pull_convoy; from a testbed's
  measured pieces S·f(W_pull/P/S), held_pull_convoy_s) on systems whose PS
  answers held pulls one worker after another (System.ps_pull_convoy), and apply =
  R·share·t_apply. T/R is nonincreasing in R (each term is a constant or proportional to R;
  combine is 1-homogeneous), so X is nondecreasing in R; X falls as share or S-latency grows.
  (A calibrated convoy fit per worker count keeps each term proportional to R only where the
  fits' per-worker cost does not grow with R, as measured ones do not beyond noise.) The
  measured convoy need not be monotone in S: over S in [lo, hi] the bound takes its least
  value there (StepContext.pull_convoy_s).
- PS modes, both: for fixed S the best R is the largest, floor((M − S)/P). Over an interval
  S ∈ [lo, hi], X ≤ X(R(lo), share(hi), latency of lo shards): a valid upper bound.
- Adam's vector protocol prices every shard from the parameter layout (model/vectors.py); the
  busiest shard's load need not fall monotonically with S, so the interval bound uses what
  every S ≤ hi must carry: splitting a shard's slice never sends fewer values nor multiplies
  less, so some shard holds at least 1/hi of the one-shard totals (vector values, outer-product
  FLOPs at the PS's peak rate); a worker's push is at least its one-shard push
  (StepContext.shard_terms).
- The search maximises `objective`, f·N / T_epoch = X / g with g the straggler factor of
  asynchronous epochs (model/stragglers.py; 1 unless the system states a spread of replica
  speeds). g ≥ 1, so `bound` (of X) bounds X / g; and X / g is nondecreasing in R for fixed S
  while the spread is at most system.load.MAX_STRAGGLER_SPREAD (tests/test_stragglers.py
  checks it), so the largest R still wins.
- collective (all-reduce): X = R·n / (combine(T_comp + T_mp, T_ring(R)) + T_update); T_ring
  grows with R, so X need not grow with R (latency-bound rings get slower); over R ∈ [lo, hi],
  X ≤ hi·n / T_step(lo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from dnnscale.model.accumulation import accumulation_bytes_per_step
from dnnscale.model.bookkeeping import worker_bookkeeping_s
from dnnscale.model.collectives import held_pull_convoy_s
from dnnscale.model.data_parallel import (buckets_for, deferred_gradient_sync,
                                          optimizer_step_bytes, overlapped_traffic_s,
                                          zero_traffic)
from dnnscale.model.gpu_compute import memory_pass_s
from dnnscale.model.mesh_split import MeshSplit
from dnnscale.model.network import (exposed_with_contention_s, overlapped_time_s,
                                    transfer_time_s)
from dnnscale.model.quota import background_exchange_s, collective_after_compute_s
from dnnscale.model.prediction import StepPart
from dnnscale.model.records import (Bottleneck, CollectiveTime, Part, PartKind,
                                    StageRecord, StepRecord)
from dnnscale.model.ps import (busiest_shard_share, ps_cpu_capacity_samples_per_s,
                               ps_network_capacity_samples_per_s, ps_outer_product_s,
                               ps_pull_bytes_per_step, ps_push_bytes_per_step,
                               ps_queueing_cycle_s)
from dnnscale.model.schedule import pipeline_time_s
from dnnscale.model.stage import StageCosts
from dnnscale.model.stragglers import slowest_device_factor, straggler_factor
from dnnscale.model.vectors import Region, flat_layout, vector_traffic
from dnnscale.model.zero3_fetch import bucket_calls
from dnnscale.plan.mesh import MeshDim, expert_stride, joint_span, placement
from dnnscale.plan.plan import OPTIMIZERS, ParallelPlan, ParameterServer
from dnnscale.system.device import Device
from dnnscale.system.system import System
from dnnscale.system.topology import GroupSpan, group_span
from dnnscale.workload.workload import Workload

MODE_PS_ASYNC, MODE_PS_SYNC, MODE_COLLECTIVE = "ps-async", "ps-sync", "collective"
CONVOY_BOUND_SPAN = 32
"""Shard counts a ps-sync bound prices the held-pull convoy at (StepContext.pull_convoy_s)."""


class MemberState(NamedTuple):
    """What one member of each pipeline stage holds under a collective plan: what its memory
    (model/predict.accelerator_stage_memory) and its optimizer step read. `member_state`
    computes it; a StepContext carries it, and the search's memory check builds it alone."""

    stages: tuple[StageCosts, ...]
    member_params: tuple[float, ...]
    """Per stage, the parameters a member holds: its dense share W/tp and its experts'
    (W_experts / (etp · ep))."""
    member_expert_params: tuple[float, ...]
    """Per stage, the routed experts' part of member_params."""
    param_bytes_per_value: float
    grad_bytes_per_value: float
    state_bytes_per_param: float

    def shard_params(self, plan: ParallelPlan, replicas: int, sharded: bool
                     ) -> tuple[float, ...]:
        """Per stage, a member's parameters, or where `sharded` its shard of them: the dense
        ones over their data-parallel group (ParallelPlan.dense_group: d·ep·cp) and the
        experts' over theirs (expert_group: d·cp·tp/etp), with `replicas` along dp."""
        if not sharded:
            return self.member_params
        dense, expert = plan.dense_group(replicas), plan.expert_group(replicas)
        return tuple((params - experts) / dense + experts / expert
                     for params, experts in zip(self.member_params, self.member_expert_params))


def member_state(workload: Workload, plan: ParallelPlan,
                 stages: tuple[StageCosts, ...]) -> MemberState:
    """`MemberState` of `plan` over `stages`.

    Formula: per stage, (W_stored − W_experts) / tp + W_experts / (etp · ep), W_stored the
    stage's parameters with its tensor-replicated ones counted per member
    (StageCosts.stored_params); bytes per value from the plan's precision, else the
    workload's. Units: parameters, bytes.
    Source: Megatron-LM's layout (tp splits a dense layer's weights, etp · ep a routed expert
    layer's: Megatron Core's expert parallelism), the same shares StepContext has always
    priced its all-reduce and optimizer step on; optimizer_state_bytes_per_param for the state.
    """
    b = workload.bytes_per_value
    precision = plan.precision
    tensor, experts_over = plan.tensor.degree, plan.expert_tensor * plan.expert.degree
    per_stage: dict[int, tuple[float, float]] = {}
    for stage in stages:  # a pipeline's middle stages are often one shared record
        if id(stage) not in per_stage:
            stored = stage.stored_params(stage.params or workload.params)
            experts = stage.expert_params / experts_over
            per_stage[id(stage)] = ((stored - stage.expert_params) / tensor + experts, experts)
    return MemberState(stages, tuple(per_stage[id(stage)][0] for stage in stages),
                       tuple(per_stage[id(stage)][1] for stage in stages),
                       precision.param_bytes or b, precision.grad_bytes or b,
                       optimizer_state_bytes_per_param(plan, b))


@dataclass
class StepContext:
    """A plan priced up to its replica and shard counts (and, for the search over data
    parallelism at a fixed global batch, its micro-batch count); memoises what depends on S."""

    workload: Workload
    system: System
    plan: ParallelPlan
    stages: tuple[StageCosts, ...]
    mode: str = field(init=False)
    _per_shards: dict[int, ShardTerms] = field(default_factory=dict, init=False, repr=False)
    _block_s: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False)
    regions: tuple[Region, ...] = field(default=(), init=False, repr=False)
    """The flat parameter layout under the vector protocol (model/vectors.py), else ()."""

    def __post_init__(self) -> None:
        plan, system = self.plan, self.system
        self.stage = stage = self.stages[0]
        self.micro_batches = plan.batch.accumulation
        self.split = MeshSplit.of(plan)
        self.ep = plan.expert.degree
        self.n, self.P = plan.batch.per_replica, plan.tensor.degree
        self.params = stage.stored_params(stage.params or self.workload.params)  # W + (P−1)·W_rep
        self.bandwidth = system.network.bandwidth_bytes_per_s
        self.latency = system.network.latency_s
        self.ps_bandwidth = system.ps_net.bandwidth_bytes_per_s
        aggregation = plan.data.aggregation
        if isinstance(aggregation, ParameterServer):
            # A worker's own step on its weights (local SGD and the push accumulator) beside
            # forward and backward; an accelerator's is not modelled under a PS.
            self.worker_update_s = (0.0 if system.machine.is_accelerator else worker_bookkeeping_s(
                self.params / self.P, self.workload.bytes_per_value, True, system.machine))
            self.mode = MODE_PS_ASYNC if aggregation.asynchronous else MODE_PS_SYNC
            self.push_every, self.pull_every = aggregation.push_every, aggregation.pull_every
            terms = ps_terms(self.workload, system, plan, self.params)
            self.push_bytes, self.pull_bytes = terms["push_bytes"], terms["pull_bytes"]
            self.update_s = terms["update_s"]
            if aggregation.fc_protocol == "vectors":
                schemes = {cost.name: cost.scheme for cost in stage.layers}
                self.regions = flat_layout(self.workload, self.P, schemes)
                self.push_bytes = self.per_shards(1).push_bytes  # one shard receives it all
            # An overlapped exchange's CPU, drawn from the worker's own quota (model/quota.py).
            self.exchange_cpu_s = background_exchange_s(
                system, self.push_bytes / self.P, self.pull_bytes / self.P) if plan.overlap \
                else 0.0
            self.busy_s = (stage.compute_s + stage.partition_s + self.worker_update_s
                           + self.exchange_cpu_s)
        else:
            self.mode = MODE_COLLECTIVE
            self.collective = aggregation
            self._prepare_collective()

    def _prepare_collective(self) -> None:
        """Per stage: one micro-batch's time, the data-parallel payloads, the update."""
        plan, system = self.plan, self.system
        self.topology = system.topology
        self.placement = placement(plan.mesh, self.topology)
        self.members = members = member_state(self.workload, plan, self.stages)
        self.grad_bytes_per_value = members.grad_bytes_per_value
        self.param_bytes_per_value = members.param_bytes_per_value
        self.state_bytes_per_param = members.state_bytes_per_param
        self.p2p_s = self._p2p_seconds()
        recompute, overlap_mode = plan.memory.recompute, plan.tensor.overlap_mode
        self.pipeline_step_s = system.machine.pipeline_step_s if len(self.stages) > 1 else 0.0
        per_stage: dict[int, tuple[float, float, int]] = {}
        for stage in self.stages:  # a pipeline's middle stages are often one shared record
            if id(stage) not in per_stage:
                per_stage[id(stage)] = (stage.work_s(recompute, overlap_mode),
                                        stage.exposed_comm_s(overlap_mode),
                                        stage.launches(recompute))
        self.work_s = tuple(per_stage[id(stage)][0] for stage in self.stages)
        """Each stage's compute and recompute per micro-batch on a median device."""
        self.comm_s = tuple(per_stage[id(stage)][1] for stage in self.stages)
        self.accumulation_s = self._accumulation_seconds(members)
        self.slowest_device_s = self._slowest_device_s(plan.data.replicas)
        self.device_s = self._device_s(self.slowest_device_s)
        self.launches = tuple(per_stage[id(stage)][2] for stage in self.stages)
        self.launch_s = self._launch_s(plan.data.replicas)
        self.host_s = self._host_s(self.launch_s)
        self.stage_seconds = self._stage_seconds(self.host_s)
        self.busy_s = pipeline_time_s(self.stage_seconds, self.micro_batches,
                                      plan.pipeline.virtual_stages)
        self.member_params = members.member_params
        self.member_expert_params = members.member_expert_params
        self.params_on_worker = self.member_params[0]
        self.ring_bytes = self.params_on_worker * self.grad_bytes_per_value
        self.update_s = self.update_time_s(1)

    def _accumulation_seconds(self, members: MemberState) -> tuple[float, ...]:
        """Each stage's gradient accumulation per micro-batch on an accelerator: the step's
        passes over the member's gradients (model/accumulation.py, by the plan's
        Batch.grad_accumulation) over its m micro-batches, memory bound; under ZeRO-2/3 the
        member accumulates its reduce-scattered shard, its dense parameters over the dense
        group and its experts' over theirs (one shard count d = Ψ / Σ shards for the
        formula). The hooked share is the stage's non-GEMM parameters' (StageCosts.
        hooked_params) of the member's. A CPU worker's passes are model/bookkeeping.py's."""
        device, plan, m = self.system.machine, self.plan, self.micro_batches
        if not device.is_accelerator:
            return (0.0,) * len(self.stages)
        shards = members.shard_params(plan, plan.data.replicas, self.collective.zero_stage >= 2)
        out = []
        for stage, params, held in zip(self.stages, members.member_params, shards):
            hooked = params * stage.hooked_params / max(1, stage.params or self.workload.params)
            moved = accumulation_bytes_per_step(
                plan.batch.grad_accumulation, m, params, hooked, members.grad_bytes_per_value,
                members.param_bytes_per_value, plan.precision.compute == "fp16",
                params / held if held > 0 else 1.0)
            out.append(memory_pass_s(device, moved) / m)
        return tuple(out)

    def _launch_s(self, replicas: int) -> float:
        """One kernel launch's host time with the node's devices busy: `replicas` replicas of
        the plan's tp·pp devices, at most a node's."""
        workers = self.plan.workers // self.plan.data.replicas * replicas
        return self.system.machine.launch_time_s(min(self.system.devices_per_node, workers))

    def _host_s(self, launch_s: float) -> tuple[float, ...]:
        return tuple(launches * launch_s + self.pipeline_step_s for launches in self.launches)

    def _stage_seconds(self, host_s: tuple[float, ...],
                       device_s: tuple[float, ...] | None = None) -> tuple[float, ...]:
        """A micro-batch takes the longer of its kernels' device time (default the plan's
        `device_s`) and their launch time, then its pipeline sends; sends that overlap compute
        (Pipeline.overlaps_p2p) travel while the next chunk computes, so only what outlasts the
        computation shows."""
        device_s = self.device_s if device_s is None else device_s
        return tuple(max(device, host) + self.exposed_p2p_s(p2p, max(device, host))
                     for device, host, p2p in zip(device_s, host_s, self.p2p_s))

    def exposed_p2p_s(self, p2p_s: float, busy_s: float) -> float:
        """A micro-batch's pipeline sends past its `busy_s` of kernels: all of them, or where
        the sends overlap compute (Pipeline.overlaps_p2p) what outlasts the computation."""
        if not self.plan.pipeline.overlaps_p2p:
            return p2p_s
        return exposed_with_contention_s(p2p_s, max(0.0, p2p_s - busy_s),
                                         self.system.machine.overlap_slowdown)

    def stage_seconds_at(self, replicas: int) -> tuple[float, ...]:
        """stage_seconds with `replicas` replicas instead of the plan's (the Adam search prices
        every R on one context; the launch time grows with the devices a node runs, and the
        wait for the slowest device with the devices in all)."""
        if replicas == self.plan.data.replicas:
            return self.stage_seconds
        launch_s = self._launch_s(replicas)
        slowest_s = self._slowest_device_s(replicas)
        if launch_s == self.launch_s and slowest_s == self.slowest_device_s:
            return self.stage_seconds
        return self._stage_seconds(self._host_s(launch_s), self._device_s(slowest_s))

    def _slowest_device_s(self, replicas: int) -> tuple[float, ...]:
        """Each stage's wait per micro-batch for the slowest of the devices of `replicas`
        replicas: its compute and recompute times (g − 1), g =
        stragglers.slowest_device_factor over those devices (every collective of the step
        waits for its slowest member)."""
        devices = self.plan.workers // self.plan.data.replicas * replicas
        extra = slowest_device_factor(devices, self.system.machine.speed_spread) - 1.0
        return tuple(work * extra for work in self.work_s)

    def _device_s(self, slowest_s: tuple[float, ...]) -> tuple[float, ...]:
        """Each stage's kernels per micro-batch: its compute and recompute, the wait for the
        slowest device, its exposed tp, ep and cp communication, and its gradient
        accumulation (`_accumulation_seconds`)."""
        return tuple(work + slowest + comm + accumulate for work, slowest, comm, accumulate
                     in zip(self.work_s, slowest_s, self.comm_s, self.accumulation_s))

    def _p2p_seconds(self) -> tuple[float, ...]:
        """Each stage's pipeline sends per micro-batch: its activation forward to the next
        stage and its input gradient backward to the previous, b·(s/cp)·h values each, over the
        tier between adjacent stages (v times with v virtual stages), two members of a pp group
        (plan/mesh.placement); each send is `p2p_send_s`."""
        stages = len(self.stages)
        if stages <= 1:
            return (0.0,) * stages
        shape = self.workload.transformer
        bytes_per_value = self.plan.precision.activation_bytes or self.workload.bytes_per_value
        out = []
        send_s: dict[float, float] = {}  # a transformer's stages all send one size
        for index, stage in enumerate(self.stages):
            values = shape.seq * shape.hidden if shape is not None else stage.boundary_values
            payload = (values * self.plan.batch.micro_batch * bytes_per_value
                       * self.split.token_fraction)
            if payload not in send_s:
                send_s[payload] = self.p2p_send_s(payload)
            sends = (index < stages - 1) + (index > 0)
            out.append(sends * self.plan.pipeline.virtual_stages * send_s[payload])
        return tuple(out)

    def p2p_send_s(self, payload_bytes: float) -> float:
        """One boundary tensor of `payload_bytes` from a stage's member to the next stage's.

        Formula: each of the t tensor members holds y = x, or y = x/t under sequence
        parallelism, and sends it whole over the tier between adjacent stages (α + y/B); with
        Pipeline.scatter_gather it sends y/t, and the receivers all-gather y over the tensor
        group (collective_after_compute_s: on its tier, plus the call).
        Units: bytes -> s.
        Source: Megatron-Core core/pipeline_parallel/schedules.py get_tensor_shapes (the
        shape (s/cp/t, b, h) under sequence parallelism, (s/cp, b, h) without); Narayanan et
        al., SC'21 §4.1 (the scatter/gather optimisation: t times fewer bytes between nodes,
        then an all-gather over NVLink); DeepSpeed runtime/pipe/engine.py (pipe_partitioned,
        grad_partitioned: a PartitionedTensor of 1/t sent, .full() all-gathers it on the
        slice-parallel group) and runtime/config.py (both on by default).
        """
        tier = self.placement[MeshDim.PP].tier_of(2)
        t = self.plan.tensor.degree
        held = payload_bytes / t if self.plan.tensor.sequence_parallel else payload_bytes
        if t <= 1 or not self.plan.pipeline.scatter_gather:
            return transfer_time_s(held, 1, tier.bandwidth_bytes_per_s, tier.latency_s)
        wire_s = transfer_time_s(held / t, 1, tier.bandwidth_bytes_per_s, tier.latency_s)
        return wire_s + collective_after_compute_s(self.system, "allgather", held,
                                                   self.placement[MeshDim.TP].span,
                                                   self.topology)

    def update_time_s(self, replicas: int) -> float:
        """The slowest stage's optimizer step: on a CPU the worker's passes over the
        parameters it holds (model/bookkeeping.py); on an accelerator the memory-bound step over
        the optimizer's shard (under ZeRO the dense parameters 1/(d·ep·cp), the experts'
        1/(d·cp·tp/etp): their data-parallel groups, ParallelPlan.dense_group / expert_group)."""
        device = self.system.machine
        if not device.is_accelerator:
            return worker_bookkeeping_s(self.params_on_worker, self.workload.bytes_per_value,
                                        False, device)
        seconds = 0.0
        for shard_params in self.members.shard_params(self.plan, replicas,
                                                      self.collective.zero_stage >= 1):
            moved = optimizer_step_bytes(shard_params, self.grad_bytes_per_value,
                                         self.param_bytes_per_value, self.state_bytes_per_param)
            seconds = max(seconds, memory_pass_s(device, moved))
        return seconds

    def data_parallel_spans(self, replicas: int) -> tuple[GroupSpan, GroupSpan]:
        """The spans of the dense parameters' gradient group (dp × ep × cp members,
        plan/mesh.joint_span) and the experts' (dp × cp × tp / etp members etp · ep apart: the
        expert layers' rank order, plan/mesh.expert_stride), with `replicas` along dp."""
        mesh = self.plan.mesh.with_size(MeshDim.DP, replicas)
        per_node = self.topology.devices_per_node
        return (joint_span(mesh, (MeshDim.DP, MeshDim.EP, MeshDim.CP), per_node),
                group_span(self.plan.expert_group(replicas),
                           expert_stride(mesh, self.plan.expert_tensor) * mesh.size(MeshDim.EP),
                           per_node))

    def data_parallel_s(self, replicas: int, micro_batches: int) -> float:
        """The slowest stage's data-parallel communication per step (exposed part): the dense
        parameters' among the dp × ep × cp members holding them, then the experts' among the
        dp × cp holding them (`data_parallel_spans`), each collective run by the plan's
        algorithm (collectives.py). With Collective.overlap each collective travels beside the
        pass it belongs to (data_parallel.overlapped_traffic_s): the gradients' reduction beside
        the backward in buckets, ZeRO-3's per-unit gathers beside the forward and the backward
        (FSDP's prefetch), its reduce-scatters beside the backward; the compute beside the
        hidden part runs slower (network.exposed_with_contention_s), which is counted here;
        ZeRO-1/2's all-gather of the updated parameters follows the optimizer step and is always
        exposed (zero_traffic)."""
        dense_span, expert_span = self.data_parallel_spans(replicas)
        if dense_span.size <= 1:
            return 0.0
        deferred = deferred_gradient_sync(self.collective.zero_stage, self.plan.pipeline.stages)
        slowest = 0.0
        zero3 = self.collective.zero_stage == 3
        slowdown = self.system.machine.overlap_slowdown
        for stage, params, experts in zip(self.stages, self.member_params,
                                          self.member_expert_params):
            gathers, reduces = (bucket_calls(stage.tensors, stage.partitions)
                                if zero3 and self.collective.fetch == "buckets"
                                else (stage.units, stage.units))
            pieces: list[tuple[str, int, float]] = []
            for span, group_params in ((dense_span, params - experts), (expert_span, experts)):
                if span.size <= 1 or group_params <= 0:
                    continue
                for traffic in zero_traffic(
                        self.collective.zero_stage, group_params * self.grad_bytes_per_value,
                        group_params * self.param_bytes_per_value, micro_batches, deferred,
                        gathers, reduces):
                    seconds = traffic.times * traffic.calls * collective_after_compute_s(
                        self.system, traffic.operation, traffic.payload_bytes / traffic.calls,
                        span, self.topology, self.collective.algorithm)
                    pieces.append((traffic.phase, traffic.times, seconds))
            if self.collective.overlap:
                backward = (stage.input_grad_s + stage.weight_grad_s
                            + stage.recompute_s(self.plan.memory.recompute,
                                                self.plan.tensor.overlap))
                chunks = gathers if zero3 else buckets_for(params * self.grad_bytes_per_value)
                exposed, hidden = overlapped_traffic_s(pieces, stage.forward_s, backward, chunks)
            else:
                exposed, hidden = sum(seconds for _, _, seconds in pieces), 0.0
            slowest = max(slowest, exposed_with_contention_s(exposed + hidden, exposed,
                                                             slowdown))
        return slowest

    @property
    def own_compute_s(self) -> float:
        """A PS worker's busy time less its bookkeeping and an overlapped exchange's CPU: its
        stage's compute and partition traffic."""
        return self.busy_s - self.worker_update_s - self.exchange_cpu_s

    def pull_convoy_s(self, replicas: int, shards: int, most_shards: int | None = None) -> float:
        """ps-sync: the held pulls of R·P workers from S shards answered one worker after
        another (collectives.held_pull_convoy_s) on the workers' tier, on systems whose PS does
        that; with `most_shards`, the least over S in [shards, most_shards] (a bound; 0 past
        CONVOY_BOUND_SPAN shards, where the loop would cost more than the bound saves)."""
        if not self.system.ps_pull_convoy:
            return 0.0
        hi = shards if most_shards is None else most_shards
        if hi - shards > CONVOY_BOUND_SPAN:
            return 0.0
        members, x = replicas * self.P, self.pull_bytes / self.P
        return min(held_pull_convoy_s(self.system.collective_library, x, members, s,
                                      self.system.network) for s in range(shards, hi + 1))

    @property
    def uses_ps(self) -> bool:
        return self.mode != MODE_COLLECTIVE

    def combine(self, busy_s: float, comm_s: float) -> float:
        """Busy time and communication time of a step, overlapped with the γ-norm if the plan
        overlaps them, else added."""
        if self.plan.overlap:
            return overlapped_time_s(busy_s, comm_s, self.system.overlap_gamma)
        return busy_s + comm_s

    def per_shards(self, shards: int) -> ShardTerms:
        """What depends on S alone (see ShardTerms); exact for a plan with S shards."""
        cached = self._per_shards.get(shards)
        if cached is None:
            cached = self._vector_terms(shards) if self.regions else self._weight_terms(shards)
            self._per_shards[shards] = cached
        return cached

    def _weight_terms(self, shards: int) -> ShardTerms:
        """Weight pushes: every shard receives, sends and updates its slice, so the busiest
        shard's share ceil(W/S)/W of every per-replica quantity."""
        n, P = self.n, self.P
        share = busiest_shard_share(self.params, shards)
        push_w_s = transfer_time_s(self.push_bytes / P, shards / self.push_every,
                                   self.bandwidth, self.latency)
        pull_w_s = transfer_time_s(self.pull_bytes / P, shards / self.pull_every,
                                   self.bandwidth, self.latency)
        x_net = ps_network_capacity_samples_per_s(self.ps_bandwidth, share,
                                                  self.push_bytes / n, self.pull_bytes / n)
        x_cpu = ps_cpu_capacity_samples_per_s(share, self.update_s / n, 0.0)
        return ShardTerms(share, push_w_s, pull_w_s, x_net, x_cpu, share * self.push_bytes,
                          share * self.pull_bytes, share * (self.push_bytes + self.pull_bytes),
                          share * self.update_s)

    def _block_time_s(self, rows: int, columns: int) -> float:
        """PS seconds per step for one FC block (one outer product per push of k_push steps)."""
        key = (rows, columns)
        seconds = self._block_s.get(key)
        if seconds is None:
            k = self.push_every
            seconds = ps_outer_product_s(rows, columns, self.n * k, self.workload.bytes_per_value,
                                         self.system.ps) / k
            self._block_s[key] = seconds
        return seconds

    def _vector_terms(self, shards: int) -> ShardTerms:
        """Adam's vector protocol: each shard's push, pull and CPU work from the layout
        (model/vectors.py), and the busiest shard of each; a worker's own push is its
        partition's dense gradients and vectors."""
        n, P, b = self.n, self.P, self.workload.bytes_per_value
        k_push, k_pull = self.push_every, self.pull_every
        t_upd = self.system.ps.update_s_per_param
        traffic = vector_traffic(self.regions, shards, P)
        push = [ps_push_bytes_per_step(load.dense_params, n * load.vector_values_per_sample, b,
                                       k_push) for load in traffic.shards]
        pull = [ps_pull_bytes_per_step(load.params, b, k_pull) for load in traffic.shards]
        apply = [load.params * t_upd / k_push
                 + sum(self._block_time_s(rows, cols) for rows, cols in load.blocks)
                 for load in traffic.shards]
        serve = max(a + c for a, c in zip(push, pull))
        worker_push = max(ps_push_bytes_per_step(dense, n * values, b, k_push) for dense, values
                          in zip(traffic.worker_dense_params,
                                 traffic.worker_vector_values_per_sample))
        push_w_s = transfer_time_s(worker_push, shards / k_push, self.bandwidth, self.latency)
        pull_w_s = transfer_time_s(self.pull_bytes / P, shards / k_pull, self.bandwidth,
                                   self.latency)
        x_net = ps_network_capacity_samples_per_s(self.ps_bandwidth, 1.0, serve / n, 0.0)
        x_cpu = ps_cpu_capacity_samples_per_s(1.0, max(apply) / n, 0.0)
        return ShardTerms(busiest_shard_share(self.params, shards), push_w_s, pull_w_s, x_net,
                          x_cpu, max(push), max(pull), serve, max(apply), worker_push)

    def shard_terms(self, share_shards: int, latency_shards: int) -> ShardTerms:
        """The terms of a plan with S shards when both arguments are S; otherwise terms that
        bound every S in [latency_shards, share_shards] (`bound`): busiest loads no larger, worker
        transfers no longer, capacities no smaller than any of theirs."""
        if share_shards == latency_shards:
            return self.per_shards(share_shards)
        lo, hi = latency_shards, share_shards
        if not self.regions:
            # Weights: the share falls with S, the messages grow with it.
            low, high = self.per_shards(lo), self.per_shards(hi)
            return high._replace(push_w_s=low.push_w_s, pull_w_s=low.pull_w_s)
        # Vectors: splitting a slice never sends fewer values nor computes less (model/vectors.py),
        # so every S ≤ hi has a shard carrying at least 1/hi of the one-shard totals.
        one = self.per_shards(1)
        low = self.per_shards(lo)
        flops = sum(2.0 * self.n * region.rows * region.cols for region in self.regions
                    if region.layer is not None)
        cpu_s = self.params * self.system.ps.update_s_per_param / self.push_every \
            + flops / _peak_flops_per_s(self.system.ps)
        push_w_s = transfer_time_s(one.worker_push_bytes, lo / self.push_every, self.bandwidth,
                                   self.latency)
        x_net = ps_network_capacity_samples_per_s(self.ps_bandwidth, 1.0, one.serve_bytes / hi
                                                  / self.n, 0.0)
        x_cpu = ps_cpu_capacity_samples_per_s(1.0, cpu_s / hi / self.n, 0.0)
        return ShardTerms(busiest_shard_share(self.params, hi), push_w_s, low.pull_w_s, x_net,
                          x_cpu, one.push_bytes / hi, one.pull_bytes / hi, one.serve_bytes / hi,
                          cpu_s / hi, one.worker_push_bytes)


class ShardTerms(NamedTuple):
    """What depends on the shard count S alone, per step of one replica: the busiest shard's
    share of the parameters, a worker's own push and pull seconds, the parameter servers'
    capacities X_ps,net and X_ps,cpu (all replicas), and the busiest shard's bytes pushed,
    pulled and both (the one it serves longest) and its CPU seconds."""

    share: float
    push_w_s: float
    pull_w_s: float
    x_net: float
    x_cpu: float
    push_bytes: float
    pull_bytes: float
    serve_bytes: float
    apply_s: float
    worker_push_bytes: float = 0.0
    """Vectors only: the largest push of one worker (its partition's gradients and vectors)."""


def _peak_flops_per_s(machine: Device) -> float:
    """The highest FLOP/s any call of a linear weight gradient reaches on `machine` (a bound)."""
    curves = machine.flops_per_s_per_core
    curve = curves.get("linear.weight_grad") or curves.get("linear") or curves["default"]
    factor = machine.intensity_factors.get("linear.weight_grad") or \
        machine.intensity_factors.get("linear")
    return curve.peak * machine.cores * max(1.0, factor.peak if factor is not None else 1.0)


def ps_terms(workload: Workload, system: System, plan: ParallelPlan,
             params: int) -> dict[str, float]:
    """Per-step PS quantities of one replica pushing weight gradients: bytes pushed and pulled,
    PS update seconds (all shards). Adam's vector protocol is priced per shard from the
    parameter layout instead (StepContext._vector_terms, model/vectors.py).

    `params`: the parameters the replica's workers hold together, W + (P−1)·W_rep (stage.py).
    """
    aggregation = plan.data.aggregation
    if not isinstance(aggregation, ParameterServer):
        raise TypeError("ps_terms needs a plan aggregated by a parameter server")
    b = workload.bytes_per_value
    return {
        "push_bytes": ps_push_bytes_per_step(params, 0.0, b, aggregation.push_every),
        "pull_bytes": ps_pull_bytes_per_step(params, b, aggregation.pull_every),
        "update_s": params * system.ps.update_s_per_param / aggregation.push_every,
    }


# ------------------------------------------------------------------ the arithmetic, once each

def _ps_async(ctx: StepContext, replicas: int, share_shards: int,
              latency_shards: int) -> tuple[float, ...]:
    """(X, worker step, own push, own pull, serve, X_replicas, X_ps,net, X_ps,cpu) with R
    replicas, the busiest share of `share_shards` shards and the messages of `latency_shards`
    (the same S for a real plan)."""
    terms = ctx.shard_terms(share_shards, latency_shards)
    push_w_s, pull_w_s, x_net, x_cpu = terms.push_w_s, terms.pull_w_s, terms.x_net, terms.x_cpu
    # The busiest shard serves this replica's P workers one request at a time, so a replica
    # also waits for that shard to move its share of the replica's pushes and pulls.
    serve_s = terms.serve_bytes / ctx.ps_bandwidth
    worker_step_s = ctx.combine(ctx.busy_s, max(push_w_s + pull_w_s, serve_s))
    x_replicas = replicas * ctx.n / worker_step_s
    # The R replicas queue at the busiest shard, D = n / X_ps of its time per replica step,
    # spending the rest of their step on their own (ps.ps_queueing_cycle_s).
    x_ps = min(x_net, x_cpu)
    service_s = ctx.n / x_ps if x_ps < math.inf else 0.0
    # (at least the worker step itself, as it is in exact arithmetic: Z + D rounds)
    step_s = max(worker_step_s, ps_queueing_cycle_s(replicas, max(0.0, worker_step_s
                                                                   - service_s), service_s))
    throughput = replicas * ctx.n / step_s
    return throughput, worker_step_s, push_w_s, pull_w_s, serve_s, x_replicas, x_net, x_cpu


def _ps_sync(ctx: StepContext, replicas: int, share_shards: int,
             latency_shards: int) -> tuple[float, ...]:
    """(X, step, push, apply, pull) of synchronous SGD through the parameter servers: every
    worker pushes, the shards apply all R updates, every worker pulls."""
    terms = ctx.shard_terms(share_shards, latency_shards)
    P, B, B_ps = ctx.P, ctx.bandwidth, ctx.ps_bandwidth
    worker_push = terms.worker_push_bytes if ctx.regions else ctx.push_bytes / P
    push_s = max(worker_push / B, replicas * terms.push_bytes / B_ps) \
        + latency_shards / ctx.push_every * ctx.latency
    pull_s = max(max(ctx.pull_bytes / P / B, replicas * terms.pull_bytes / B_ps)
                 + latency_shards / ctx.pull_every * ctx.latency,
                 ctx.pull_convoy_s(replicas, latency_shards, share_shards))
    apply_s = replicas * terms.apply_s
    step_s = ctx.combine(ctx.busy_s, push_s + apply_s + pull_s)
    return replicas * ctx.n / step_s, step_s, push_s, apply_s, pull_s


def _collective(ctx: StepContext, replicas: int,
                micro_batches: int | None = None) -> tuple[float, ...]:
    """(X, step, data-parallel s, busy s, update s) of data parallelism by collectives among the
    R replicas' peers of the same tensor/pipeline rank: the pipeline's m micro-batches, then the
    exposed data-parallel communication, then the optimizer step."""
    m = ctx.micro_batches if micro_batches is None else micro_batches
    stage_seconds = ctx.stage_seconds_at(replicas)
    busy_s = ctx.busy_s if m == ctx.micro_batches and stage_seconds is ctx.stage_seconds \
        else pipeline_time_s(stage_seconds, m, ctx.plan.pipeline.virtual_stages)
    dp_s = ctx.data_parallel_s(replicas, m)
    update_s = ctx.update_s if ctx.collective.zero_stage == 0 else ctx.update_time_s(replicas)
    step_s = ctx.combine(busy_s, dp_s) + update_s
    samples = replicas * ctx.ep * ctx.plan.batch.micro_batch * m
    return samples / step_s, step_s, dp_s, busy_s, update_s


def throughput(ctx: StepContext, replicas: int, shards: int) -> float:
    """Samples/s of the plan with R replicas and S shards (S ignored without a PS)."""
    if ctx.mode == MODE_PS_ASYNC:
        return _ps_async(ctx, replicas, shards, shards)[0]
    if ctx.mode == MODE_PS_SYNC:
        return _ps_sync(ctx, replicas, shards, shards)[0]
    return _collective(ctx, replicas)[0]


def _straggler_factor(ctx: StepContext, replicas: int, x_replicas: float, x_net: float,
                      x_cpu: float) -> float:
    """The epoch's straggler factor g (model/stragglers.py): asynchronous replicas on a system
    with a measured spread of replica speeds; 1 otherwise."""
    spread = ctx.system.straggler_spread
    if ctx.mode != MODE_PS_ASYNC or replicas <= 1 or spread <= 0:
        return 1.0
    return straggler_factor(replicas, ctx.plan.epoch_fraction, spread,
                            min(x_net, x_cpu) / x_replicas)


def objective(ctx: StepContext, replicas: int, shards: int) -> float:
    """What the search maximises: samples per second of a whole epoch, f·N / T_epoch = X / g
    (g the straggler factor; X itself without a measured spread)."""
    if ctx.mode == MODE_PS_ASYNC and ctx.system.straggler_spread > 0:
        x, _, _, _, _, x_replicas, x_net, x_cpu = _ps_async(ctx, replicas, shards, shards)
        return x / _straggler_factor(ctx, replicas, x_replicas, x_net, x_cpu)
    return throughput(ctx, replicas, shards)


def bound(ctx: StepContext, lo: int, hi: int, replicas: int) -> float:
    """An upper bound of the objective over the search variable x ∈ [lo, hi]: x = S for PS
    modes, with at most `replicas` replicas (R at x = lo); x = R for collectives. Equal to the
    objective when lo == hi (see the module docstring for why it bounds)."""
    if lo == hi and ctx.uses_ps:
        return objective(ctx, replicas, lo)
    if ctx.mode == MODE_PS_ASYNC:
        return _ps_async(ctx, replicas, hi, lo)[0]
    if ctx.mode == MODE_PS_SYNC:
        return _ps_sync(ctx, replicas, hi, lo)[0]
    return hi * ctx.ep * ctx.n / _collective(ctx, lo)[1]


# ------------------------------------------------------------------ the typed result

@dataclass(frozen=True)
class Composition:
    """A step: throughput, step time, its parts, the bottleneck, utilisation, capacities, and
    the typed per-stage record the parts were read from (model/records.py)."""

    throughput: float
    step_s: float
    bottleneck: Bottleneck
    parts: tuple[StepPart, ...]
    utilization: dict[str, float]
    capacities: dict[str, float]
    straggler_factor: float = 1.0
    """The epoch takes f·N/X times this (model/stragglers.py)."""
    record: StepRecord | None = None


def _largest(named_seconds: dict[Bottleneck, float]) -> Bottleneck:
    return max(named_seconds.items(), key=lambda item: item[1])[0]


def _exchange_cpu(ctx: StepContext) -> list[StepPart]:
    """The overlapped exchange's CPU as a part where it costs anything (under a CPU quota)."""
    if not ctx.exchange_cpu_s:
        return []
    return [StepPart(Part.EXCHANGE_CPU, ctx.exchange_cpu_s, PartKind.UPDATE)]


def _stage_parts(stage: StageRecord) -> list[StepPart]:
    """A one-stage CPU step's layer parts (wave 1's names), from its stage record."""
    return [StepPart(Part.FORWARD, stage.forward_s, PartKind.COMPUTE),
            StepPart(Part.INPUT_GRAD, stage.input_grad_s, PartKind.COMPUTE),
            StepPart(Part.WEIGHT_GRAD, stage.weight_grad_s, PartKind.COMPUTE),
            StepPart(Part.COMPUTE, stage.compute_s, PartKind.SUM,
                     (Part.FORWARD, Part.INPUT_GRAD, Part.WEIGHT_GRAD)),
            StepPart(Part.PARTITION_COMM, stage.tp_comm_s, PartKind.COMMUNICATION)]


def _stage_record(ctx: StepContext, index: int, stage: StageCosts) -> StageRecord:
    """Stage `index`'s seconds per micro-batch: under collectives the context's device, host
    and point-to-point times; under a parameter server one stage whose kernels are its compute
    and partition traffic (no launches, no pipeline)."""
    overlap_tp = ctx.plan.tensor.overlap
    tp_forward_s = sum((layer.comm_forward_s
                        - (layer.comm_hidden_forward_s if overlap_tp else 0.0)
                        for layer in stage.layers), 0.0)
    if ctx.uses_ps:
        busy_s = stage.compute_s + stage.partition_s
        return StageRecord(index, stage.forward_s, stage.input_grad_s, stage.weight_grad_s,
                           stage.partition_s, tp_forward_s, 0.0, busy_s, 0.0, 0.0, busy_s,
                           stage.layers)
    return StageRecord(index, stage.forward_s, stage.input_grad_s, stage.weight_grad_s,
                       stage.exposed_partition_s(ctx.plan.tensor.overlap_mode), tp_forward_s,
                       stage.recompute_s(ctx.plan.memory.recompute, overlap_tp),
                       ctx.device_s[index], ctx.host_s[index],
                       ctx.exposed_p2p_s(ctx.p2p_s[index],
                                         max(ctx.device_s[index], ctx.host_s[index])),
                       ctx.stage_seconds[index],
                       stage.layers, stage.expert_comm_s, stage.context_comm_s,
                       stage.totals.expert_forward_s, stage.totals.context_forward_s,
                       ctx.slowest_device_s[index], ctx.accumulation_s[index])


def step_record(ctx: StepContext, busy_s: float,
                collectives: tuple[CollectiveTime, ...] = ()) -> StepRecord:
    """Every stage's record, the slowest (largest micro-batch time) marked, and the bubble
    max(0, busy − m·t_slowest) of the pipeline's `busy_s`."""
    stages = tuple(_stage_record(ctx, index, stage) for index, stage in enumerate(ctx.stages))
    m = ctx.micro_batches
    slowest = max(range(len(stages)), key=lambda i: stages[i].micro_batch_s)
    bubble_s = max(0.0, busy_s - m * stages[slowest].micro_batch_s)
    by_stage = not ctx.uses_ps and is_modern(ctx)
    return StepRecord(stages, slowest, m, ctx.plan.pipeline.virtual_stages,
                      ctx.plan.pipeline.schedule, busy_s, bubble_s, by_stage, collectives)


def compose(ctx: StepContext, replicas: int, shards: int) -> Composition:
    """The step of the plan with R replicas and S shards, with its typed parts and record."""
    if ctx.mode == MODE_PS_ASYNC:
        (x, worker_step_s, push_w_s, pull_w_s, serve_s, x_replicas, x_net,
         x_cpu) = _ps_async(ctx, replicas, shards, shards)
        step_s = replicas * ctx.n / x
        transfer_s = max(push_w_s + pull_w_s, serve_s)
        record = step_record(ctx, ctx.own_compute_s, _adam_collectives(
            ctx, (Part.PS_PUSH, push_w_s), (Part.PS_PULL, pull_w_s)))
        stage = record.slowest_stage
        if x_replicas <= min(x_net, x_cpu):
            bottleneck = _largest({Bottleneck.WORKER_COMPUTE: stage.compute_s,
                                   Bottleneck.PARTITION_COMM: stage.tp_comm_s,
                                   Bottleneck.WORKER_PS_TRANSFER: transfer_s})
        else:
            bottleneck = Bottleneck.PS_NETWORK if x_net <= x_cpu else Bottleneck.PS_CPU
        parts = _stage_parts(stage) + [
            StepPart(Part.UPDATE, ctx.worker_update_s, PartKind.UPDATE), *_exchange_cpu(ctx),
            StepPart(Part.PS_PUSH, push_w_s, PartKind.COMMUNICATION),
            StepPart(Part.PS_PULL, pull_w_s, PartKind.COMMUNICATION),
            StepPart(Part.PS_SERVE_WAIT, max(0.0, serve_s - push_w_s - pull_w_s), PartKind.WAIT),
            StepPart(Part.PS_WAIT, max(0.0, step_s - worker_step_s), PartKind.WAIT),
            StepPart(Part.STEP, step_s, PartKind.TOTAL)]
        utilization = {"worker_compute": stage.compute_s / step_s,
                       "partition_network": stage.tp_comm_s / step_s,
                       "worker_ps_network": transfer_s / step_s,
                       "ps_network": x / x_net, "ps_cpu": x / x_cpu}
        capacities = {"workers": x_replicas, "ps_network": x_net, "ps_cpu": x_cpu}
        return Composition(x, step_s, bottleneck, tuple(parts), utilization, capacities,
                           _straggler_factor(ctx, replicas, x_replicas, x_net, x_cpu), record)
    if ctx.mode == MODE_PS_SYNC:
        x, step_s, push_s, apply_s, pull_s = _ps_sync(ctx, replicas, shards, shards)
        record = step_record(ctx, ctx.own_compute_s, _adam_collectives(
            ctx, (Part.PS_PUSH, push_s), (Part.PS_PULL, pull_s)))
        stage = record.slowest_stage
        bottleneck = _largest({Bottleneck.WORKER_COMPUTE: stage.compute_s,
                               Bottleneck.PARTITION_COMM: stage.tp_comm_s,
                               Bottleneck.PS_NETWORK: push_s + pull_s,
                               Bottleneck.PS_CPU: apply_s})
        parts = _stage_parts(stage) + [
            StepPart(Part.UPDATE, ctx.worker_update_s, PartKind.UPDATE), *_exchange_cpu(ctx),
            StepPart(Part.PS_PUSH, push_s, PartKind.COMMUNICATION),
            StepPart(Part.PS_APPLY, apply_s, PartKind.UPDATE),
            StepPart(Part.PS_PULL, pull_s, PartKind.COMMUNICATION),
            StepPart(Part.STEP, step_s, PartKind.TOTAL)]
        terms = ctx.per_shards(shards)
        ps_nic_s = replicas * max(terms.push_bytes, terms.pull_bytes) / ctx.ps_bandwidth
        utilization = {"worker_compute": stage.compute_s / step_s,
                       "partition_network": stage.tp_comm_s / step_s,
                       "ps_network": ps_nic_s / step_s, "ps_cpu": apply_s / step_s}
        return Composition(x, step_s, bottleneck, tuple(parts), utilization, {"workers": x},
                           record=record)
    x, step_s, allreduce_s, busy_s, update_s = _collective(ctx, replicas)
    if not is_modern(ctx):
        record = step_record(ctx, busy_s, _adam_collectives(ctx, (Part.ALLREDUCE, allreduce_s)))
        # Adam's one-stage plans report the first stage (the only one) with wave 1's names.
        first = record.stages[0]
        bottleneck = _largest({Bottleneck.WORKER_COMPUTE: first.compute_s + update_s,
                               Bottleneck.PARTITION_COMM: first.tp_comm_s,
                               Bottleneck.ALLREDUCE_NETWORK: allreduce_s})
        parts = _stage_parts(first) + [
            StepPart(Part.ALLREDUCE, allreduce_s, PartKind.COMMUNICATION),
            StepPart(Part.UPDATE, update_s, PartKind.UPDATE),
            StepPart(Part.STEP, step_s, PartKind.TOTAL)]
        utilization = {"worker_compute": (first.compute_s + update_s) / step_s,
                       "partition_network": first.tp_comm_s / step_s,
                       "allreduce_network": allreduce_s / step_s}
        return Composition(x, step_s, bottleneck, tuple(parts), utilization, {"workers": x},
                           record=record)
    return _modern_composition(ctx, x, step_s, allreduce_s, busy_s, update_s)


def _adam_collectives(ctx: StepContext, *data_parallel: tuple[Part, float]
                      ) -> tuple[CollectiveTime, ...]:
    """A one-stage (Project Adam) step's communication by mesh dimension: the partition
    traffic among the replica's P workers (tp), then each data-parallel part (dp: the push and
    pull to the shards, or the all-reduce)."""
    return (CollectiveTime(Part.PARTITION_COMM, MeshDim.TP, ctx.stage.partition_s),
            *(CollectiveTime(part, MeshDim.DP, seconds) for part, seconds in data_parallel))


def is_modern(ctx: StepContext) -> bool:
    """Plans priced with modern part names: Megatron splits, pipelines, micro-batches, ZeRO or
    accelerators (Project Adam's CPU plans keep wave 1's names)."""
    plan = ctx.plan
    return (plan.tensor.rules != "adam" or plan.pipeline.stages > 1 or ctx.micro_batches > 1
            or ctx.system.machine.is_accelerator or ctx.collective.zero_stage > 0)


def _modern_composition(ctx: StepContext, x: float, step_s: float, dp_s: float, busy_s: float,
                        update_s: float) -> Composition:
    """Parts of a pipelined step, per device of the slowest stage, over m micro-batches: m
    times each of its per-micro-batch records, the bubble, then dp and the optimizer step."""
    m = ctx.micro_batches
    record = step_record(ctx, busy_s)
    stage = record.slowest_stage
    recompute_s = m * stage.recompute_s
    phases = {Part.FORWARD: m * stage.forward_s, Part.INPUT_GRAD: m * stage.input_grad_s,
              Part.WEIGHT_GRAD: m * stage.weight_grad_s}
    compute_s = sum(phases.values())
    tp_s, pp_s = m * stage.tp_comm_s, m * stage.p2p_s
    ep_s, cp_s = m * stage.ep_comm_s, m * stage.cp_comm_s
    launch_s = m * stage.launch_wait_s
    slowest_s = m * stage.slowest_device_s
    accumulation_s = m * stage.grad_accumulation_s
    bubble_s = record.bubble_s
    record = replace(record, collectives=(CollectiveTime(Part.TP_COMM, MeshDim.TP, tp_s),
                                          CollectiveTime(Part.EP_COMM, MeshDim.EP, ep_s),
                                          CollectiveTime(Part.CP_COMM, MeshDim.CP, cp_s),
                                          CollectiveTime(Part.PP_COMM, MeshDim.PP, pp_s),
                                          CollectiveTime(Part.DP_COMM, MeshDim.DP, dp_s)))
    parts = [StepPart(name, seconds, PartKind.COMPUTE) for name, seconds in phases.items()]
    parts += [StepPart(Part.COMPUTE, compute_s, PartKind.SUM, tuple(phases)),
              StepPart(Part.RECOMPUTE, recompute_s, PartKind.COMPUTE),
              *([StepPart(Part.GRAD_ACCUMULATION, accumulation_s, PartKind.COMPUTE)]
                if accumulation_s else []),
              StepPart(Part.TP_COMM, tp_s, PartKind.COMMUNICATION),
              *([StepPart(Part.EP_COMM, ep_s, PartKind.COMMUNICATION)]
                if ctx.split.ep > 1 else []),
              *([StepPart(Part.CP_COMM, cp_s, PartKind.COMMUNICATION)]
                if ctx.split.cp > 1 else []),
              StepPart(Part.PP_COMM, pp_s, PartKind.COMMUNICATION),
              StepPart(Part.LAUNCH_WAIT, launch_s, PartKind.WAIT),
              StepPart(Part.SLOWEST_DEVICE, slowest_s, PartKind.WAIT),
              StepPart(Part.BUBBLE, bubble_s, PartKind.WAIT),
              StepPart(Part.DP_COMM, dp_s, PartKind.COMMUNICATION),
              StepPart(Part.OPTIMIZER_STEP, update_s, PartKind.UPDATE),
              StepPart(Part.STEP, step_s, PartKind.TOTAL)]
    bottleneck = _largest({Bottleneck.COMPUTE: compute_s + recompute_s + slowest_s
                           + accumulation_s,
                           Bottleneck.TP_COMM: tp_s,
                           Bottleneck.EP_COMM: ep_s, Bottleneck.CP_COMM: cp_s,
                           Bottleneck.PP_COMM: pp_s, Bottleneck.BUBBLE: bubble_s,
                           Bottleneck.LAUNCHES: launch_s,
                           Bottleneck.DP_COMM: dp_s, Bottleneck.OPTIMIZER_STEP: update_s})
    utilization = {"compute": (compute_s + recompute_s) / step_s, "tp_network": tp_s / step_s,
                   "pp_network": pp_s / step_s, "dp_network": dp_s / step_s}
    if ctx.split.ep > 1:
        utilization["ep_network"] = ep_s / step_s
    if ctx.split.cp > 1:
        utilization["cp_network"] = cp_s / step_s
    return Composition(x, step_s, bottleneck, tuple(parts), utilization, {"devices": x},
                       record=record)


def optimizer_state_bytes_per_param(plan: ParallelPlan, bytes_per_value: float) -> float:
    """Optimizer-state bytes per parameter: o values (OPTIMIZERS) of the state width, plus the
    fp32 master copy under mixed precision."""
    precision = plan.precision
    state = precision.optimizer_state_bytes or bytes_per_value
    return OPTIMIZERS[plan.optimizer] * state + (4 if precision.master_weights else 0)


def epoch_time_s(workload: Workload, plan: ParallelPlan, throughput_samples_per_s: float,
                 straggler: float = 1.0) -> float:
    """T_epoch = f · N_samples / X · g (performance-model.md §4; f is Adam's cut-off, g the
    straggler factor of model/stragglers.py, 1 without a measured spread)."""
    return plan.epoch_fraction * workload.samples_per_epoch / throughput_samples_per_s * straggler

