"""Typed step records: one vocabulary of step parts and bottlenecks, and per-stage times.

`compose()` (model/compose.py) writes these once; `Prediction` carries them, and the report,
explain, CSV and export read them and never price a plan themselves.

- `Part` names every step part the composition emits (the JSON keys of `breakdown_s`, wave 1's
  strings unchanged); `PartKind` says what a part is; `Bottleneck` names what limits a step
  (the JSON's `bottleneck`). All three are `StrEnum`s, so a member equals, hashes and formats
  as its string and the JSON stays byte-identical.
- `StageRecord`: one pipeline stage's seconds per micro-batch on its most loaded device: the
  layers' phases, its tensor-group collectives (mesh dimension tp; Adam's partitions), the
  recomputed forward, the kernels' device time, the host's launch time, the point-to-point
  sends to its neighbours (mesh dimension pp).
- `StepRecord`: every stage, the slowest marked, the micro-batch count and schedule, the
  pipeline's time and bubble, and the step's collectives by mesh dimension (tp, ep, cp, pp,
  dp).

Units: seconds throughout; per micro-batch on a stage record, per step on the step record.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dnnscale.model.stage import LayerCost
from dnnscale.plan.mesh import MeshDim


class Part(StrEnum):
    """A step part's name: the key of `breakdown_s` (docs/report.md explains each)."""

    FORWARD = "forward"
    INPUT_GRAD = "input_grad"
    WEIGHT_GRAD = "weight_grad"
    COMPUTE = "compute"
    RECOMPUTE = "recompute"
    GRAD_ACCUMULATION = "grad_accumulation"
    PARTITION_COMM = "partition_comm"
    TP_COMM = "tp_comm"
    EP_COMM = "ep_comm"
    CP_COMM = "cp_comm"
    PP_COMM = "pp_comm"
    PS_PUSH = "ps_push"
    PS_PULL = "ps_pull"
    PS_SERVE_WAIT = "ps_serve_wait"
    PS_WAIT = "ps_wait"
    PS_APPLY = "ps_apply"
    ALLREDUCE = "allreduce"
    DP_COMM = "dp_comm"
    LAUNCH_WAIT = "launch_wait"
    SLOWEST_DEVICE = "slowest_device"
    BUBBLE = "bubble"
    UPDATE = "update"
    EXCHANGE_CPU = "exchange_cpu"
    OPTIMIZER_STEP = "optimizer_step"
    STEP = "step"


class PartKind(StrEnum):
    """What a step part is: a phase of the layers, the sum of parts listed in `of`,
    communication, a wait for another resource, applying the optimizer, or the whole step."""

    COMPUTE = "compute"
    SUM = "sum"
    COMMUNICATION = "communication"
    WAIT = "wait"
    UPDATE = "update"
    TOTAL = "total"


class Bottleneck(StrEnum):
    """What limits a step: the largest of the composition's candidates (model/compose.py)."""

    WORKER_COMPUTE = "worker compute"
    PARTITION_COMM = "partition communication"
    WORKER_PS_TRANSFER = "worker ps transfer"
    PS_NETWORK = "ps network"
    PS_CPU = "ps cpu"
    ALLREDUCE_NETWORK = "allreduce network"
    COMPUTE = "compute"
    TP_COMM = "tensor-parallel communication"
    EP_COMM = "expert-parallel all-to-all"
    CP_COMM = "context-parallel exchange"
    PP_COMM = "pipeline communication"
    BUBBLE = "pipeline bubble"
    LAUNCHES = "kernel launches (host bound)"
    DP_COMM = "data-parallel communication"
    OPTIMIZER_STEP = "optimizer step"


@dataclass(frozen=True)
class StageRecord:
    """One pipeline stage, per micro-batch, on its most loaded device (seconds).

    device_s = forward + input_grad + weight_grad + tp_comm + ep_comm + cp_comm + recompute
    + slowest_device + grad_accumulation (the kernels); slowest_device_s: the wait for the group's slowest device,
    (g − 1) · (compute + recompute) (model/stragglers.slowest_device_factor); ep_comm_s: expert parallelism's all-to-alls, cp_comm_s: context
    parallelism's exposed exchange (ring attention's sends past its compute, or Ulysses'
    all-to-alls);
    host_s = launches × launch time (+ the pipeline's per-step host cost);
    micro_batch_s = max(device_s, host_s) + p2p_s (model/compose.py), p2p_s the sends' exposed
    part (all of them, or what outlasts the kernels where they overlap compute).
    `tp_forward_s`: the part of `tp_comm_s` in the forward phase (0 when the stage was costed
    from block totals, without its layers). `layers`: its layers' costs (may be empty).
    """

    index: int
    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    tp_comm_s: float
    tp_forward_s: float
    recompute_s: float
    device_s: float
    host_s: float
    p2p_s: float
    micro_batch_s: float
    layers: tuple[LayerCost, ...] = ()
    ep_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_forward_s: float = 0.0
    """The part of ep_comm_s in the forward phase (the dispatch and combine all-to-alls)."""
    cp_forward_s: float = 0.0
    """The part of cp_comm_s in the forward phase."""
    slowest_device_s: float = 0.0
    """The wait for the slowest device of the synchronous step, per micro-batch."""
    grad_accumulation_s: float = 0.0
    """The step's gradient accumulation over its micro-batches, per micro-batch
    (model/accumulation.py)."""

    @property
    def compute_s(self) -> float:
        """forward + input_grad + weight_grad."""
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def launch_wait_s(self) -> float:
        """The device idle while the host launches kernels: max(0, host − device)."""
        return max(0.0, self.host_s - self.device_s)


@dataclass(frozen=True)
class CollectiveTime:
    """Seconds per step of one step part that communicates over one mesh dimension (the
    slowest stage's, as the step counts it)."""

    part: Part
    dimension: MeshDim
    seconds: float


@dataclass(frozen=True)
class StepRecord:
    """A step's stages and the times that are not a stage's own.

    by_stage: the step was composed as m micro-batches through pipeline stages (GPU and
    Megatron plans: tp_comm, pp_comm, bubble parts); False for Project Adam's one-stage CPU
    plans (wave 1's part names). pipeline_s: the model's time of the m micro-batches through
    the stages, m·t_max + (Σt − t_max)/v (model/schedule.py); bubble_s = max(0, pipeline_s −
    m·t_slowest). `collectives`: the step's communication by mesh dimension.
    """

    stages: tuple[StageRecord, ...]
    slowest: int
    micro_batches: int
    virtual_stages: int
    schedule: str
    pipeline_s: float
    bubble_s: float
    by_stage: bool
    collectives: tuple[CollectiveTime, ...] = ()

    @property
    def slowest_stage(self) -> StageRecord:
        return self.stages[self.slowest]

    def collective_s(self, dimension: MeshDim) -> float:
        """Seconds per step of the collectives over `dimension`."""
        return sum(c.seconds for c in self.collectives if c.dimension == dimension)
