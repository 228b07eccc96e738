"""The search over Megatron-style plans: TP × PP × DP × EP × CP × micro-batch × schedule × ZeRO ×
recompute × sequence parallel, for a GPU count and a global batch (performance-model.md §9).
ep (expert parallelism) and cp (context parallelism, ring or all-to-all) are fixed within a
group like tp; the group's devices are tp · pp · ep · cp · d.

A *group* fixes everything but the data-parallel degree d. Per group the stage costs are built
once (one block's costs times the blocks each stage holds, model/stage.py), and two facts make
the search exact and fast:

- Memory never grows with d (ZeRO shards by d; the micro-batches in flight, min(m, p − i) with
  m = B / (d · b), fall with d), so a group that does not fit at its largest d fits nowhere.
- The step is the pipeline's time plus data-parallel communication and the optimizer step, each
  ≥ 0, and the pipeline's time m · t_max + (Σ t − t_max) / v falls as d grows (m falls). The
  pipeline time at the largest d, with no pipeline transfers, is a lower bound of the group's
  step time; for the cost objective the bound is min over d of that time × devices.

Groups are priced in order of their bound; the search stops when the next bound cannot beat the
K-th best plan found. Every reported plan is re-predicted by `predict_plan`, the same
composition, and must agree with the search to CHECK_TOLERANCE. `exhaustive` prices every plan
through `predict_plan` (the reference the tests compare against).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar

from dnnscale.boundary import require_switches
from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.model.compose import StepContext, member_state, throughput
from dnnscale.model.data_parallel import memory_zero_stage
from dnnscale.model.mesh_split import MeshSplit
from dnnscale.model.predict import accelerator_memory_parts, predict_plan
from dnnscale.model.prediction import Prediction
from dnnscale.model.records import Part
from dnnscale.model.schedule import pipeline_time_s, stage_layers
from dnnscale.model.stragglers import slowest_device_factor
from dnnscale.model.stage import (MAX_BLOCK_KINDS, LayerOptions, PipelineLayout, StageCosts,
                                  StageTemplate, pipeline_layout, stage_template,
                                  stages_from_template)
from dnnscale.optimize.result import CurvePoint, OptimizeResult, SpaceKind, cost_per_step
from dnnscale.optimize.space import MAX_CHOICES
from dnnscale.plan.modern import PRECISION_PRESETS, amp_precision
from dnnscale.plan.engines import (ENGINE_AMP, ENGINE_NAMES, EngineFacts, check_engine,
                                   priced_grad_bytes, priced_grad_accumulation, priced_loss,
                                   priced_overlap_tp_method, priced_pp_scatter_gather,
                                   priced_zero3_fetch,
                                   search_violation)
from dnnscale.plan.plan import (CP_ALGORITHMS, RECOMPUTE, SCHEDULES, Batch, Collective,
                                ContextParallel, DataParallel, ExpertParallel, MemoryPolicy,
                                USERBUFFERS, ParallelPlan, Pipeline, Precision, TensorSplit)
from dnnscale.plan.rules import (Violation, amp_needs_16_bit, batch_divides, batch_violation,
                                 context_splits, experts_divide, global_batch_within_epoch,
                                 imbalance_within_experts, per_op_recompute_shape,
                                 pipeline_divides_layers,
                                 pipeline_overlap_needs_interleaving, precision_on_device,
                                 require, schedule_violation, sequence_parallel_splits,
                                 tensor_divides_heads, tensor_overlap_needs_sequence_parallel)
from dnnscale.system.system import System
from dnnscale.workload.transformer_kinds import AMP_MODES, AMP_NAMES, LOSS_KERNELS
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload

CHECK_TOLERANCE = 1e-9
OBJECTIVES = ("time", "cost")
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
DEFAULT_VIRTUAL_STAGES = (2, 4)
QUICK_SLACK = 1e-9
"""Relative slack of the quick bound (float sums in two orders differ by far less)."""


ZERO_STAGES = (0, 1, 2, 3)
"""The ZeRO stages a search may take: 0 (plain data parallelism) to 3 (FSDP)."""


@dataclass(frozen=True)
class ModernSpace:
    """What the search may choose (each a tuple of allowed values) and what is fixed."""

    global_batch: int
    tensor: tuple[int, ...]
    pipeline: tuple[int, ...]
    micro_batch: tuple[int, ...]
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    virtual_stages: tuple[int, ...] = DEFAULT_VIRTUAL_STAGES
    zero: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = ("none", "selective", "full")
    sequence_parallel: tuple[bool, ...] = (False, True)
    precision: str = "bf16"
    overlap_dp: tuple[bool, ...] = (False, True)
    engine: str | None = None
    """The engine the plans must run on as priced (plan/engines.py), or None: any."""
    grad_bytes: tuple[int | None, ...] = (None,) * len(ZERO_STAGES)
    """Bytes per gradient value at ZeRO stage 0, 1, 2, 3, where the engine fixes it
    (plan/engines.priced_grad_bytes: torchtitan's float32 reduction at every stage, DeepSpeed's
    16-bit gradients without ZeRO); None: the precision's."""
    expert: tuple[int, ...] = (1,)
    """Expert-parallel degrees (1 only for a dense model)."""
    context: tuple[int, ...] = (1,)
    """Context-parallel degrees."""
    cp_algorithms: tuple[str, ...] = ("ring",)
    """Context parallelism's algorithms (for cp > 1)."""
    expert_imbalance: float = 1.0
    """The busiest ep member's load over the mean, for every plan of the search."""
    engine_shape: TransformerShape | None = None
    """With an engine, the workload's shape, for the engine's limits that read it
    (plan/engines.workload_violation: DeepSpeed's MoE under ZeRO-3, dense-block patterns)."""
    expert_tensor: tuple[int, ...] = (0,)
    """Expert tensor-parallel degrees (etp) for mixture-of-experts workloads; 0 is each
    plan's tp (the default, Megatron-Core's); a value above a plan's tp or not dividing it is
    skipped for that tp."""
    overlap_tp: tuple[bool, ...] = (False,)
    """Whether the tensor-parallel exchanges overlap the GEMMs (for tp > 1 with sequence
    parallelism; the others run without). Default: off, the engines' default (Megatron's
    --tp-comm-overlap needs Transformer Engine's userbuffers, torchtitan's async TP
    torch.compile); (False, True) searches both."""
    overlap_pp: tuple[bool, ...] = (True,)
    """Whether the pipeline's sends overlap compute (for the interleaved schedule; the others
    run without). Default: on, Megatron-LM's default there, which the model never prices
    slower than off (a plan without it is the same plan, no faster)."""
    zero3_fetch: str = "blocks"
    """ZeRO-3's gather granularity for the plans with zero 3: the engine's where one is named
    (plan/engines.priced_zero3_fetch), else FSDP's blocks."""
    grad_accumulation: str = "fused"
    """How every plan's micro-batches accumulate their gradients: the engine's where one is
    named (plan/engines.priced_grad_accumulation: DeepSpeed and torchtitan add), else
    Megatron's fused default."""
    loss: str = "inplace"
    """How every plan computes the loss (its memory): the engine's where one is named
    (plan/engines.priced_loss: torchtitan's torch cross_entropy), else Megatron's."""
    amp: str = "half"
    """How every 16-bit plan runs its memory-bound kernels (Precision.amp): 'half', every
    engine's (plan/engines.ENGINE_AMP), unless asked for."""
    overlap_tp_method: str = USERBUFFERS
    """How the plans that overlap their tensor-parallel exchanges do: the engine's where one is
    named (plan/engines.priced_overlap_tp_method: torchtitan's micro-pipeline), else
    Transformer Engine's userbuffers."""
    pp_scatter_gather: bool = False
    """Whether every plan's pipeline stages send 1/tp of a boundary tensor from each tensor
    member (Pipeline.scatter_gather): the engine's where one is named (plan/engines.
    priced_pp_scatter_gather: DeepSpeed's dense models), else Megatron-Core's whole tensors."""

    def precision_of(self, zero: int) -> Precision:
        """The precision of the plans at ZeRO stage `zero`: the preset, with the engine's
        gradient width at that stage where it fixes one (`grad_bytes`), in the space's
        mixed-precision mode."""
        return amp_precision(_precision(self.precision, self.grad_bytes[zero]), self.amp)


class Group(NamedTuple):
    """A plan but its data-parallel degree."""

    tensor: int
    pipeline: int
    schedule: str
    virtual_stages: int
    micro_batch: int
    sequence_parallel: bool
    recompute: str
    zero: int
    overlap_dp: bool = False
    ep: int = 1
    cp: int = 1
    cp_algorithm: str = "ring"
    etp: int | None = None
    """The experts' tensor split where it is not tp (None: tp)."""
    overlap_tp: bool = False
    overlap_pp: bool | None = None
    """The pipeline's sends overlap compute (None: the schedule's default, Pipeline)."""

    @property
    def devices_per_replica(self) -> int:
        """tp · pp · ep · cp: the devices of the group's plan at one replica."""
        return self.tensor * self.pipeline * self.ep * self.cp

    def micro_batches(self, space: ModernSpace, replicas: int) -> int:
        """m = B / (d · ep · b): the dp · ep members each take m micro-batches."""
        return space.global_batch // (replicas * self.ep * self.micro_batch)

    def split(self, space: ModernSpace) -> MeshSplit:
        return _mesh_split(self.ep, self.cp, self.cp_algorithm, space.expert_imbalance,
                           self.etp)

    def pipeline_part(self, space: ModernSpace) -> Pipeline:
        """The plan's Pipeline (stages, schedule, virtual stages, sends' overlap, the space's
        partitioned sends)."""
        return Pipeline(self.pipeline, self.schedule, self.virtual_stages, self.overlap_pp,
                        space.pp_scatter_gather)

    def plan(self, space: ModernSpace, replicas: int) -> ParallelPlan:
        return ParallelPlan(
            tensor=TensorSplit(self.tensor, "megatron", self.sequence_parallel, self.overlap_tp,
                               self.overlap_method(space)),
            pipeline=self.pipeline_part(space),
            data=DataParallel(replicas, Collective("ring", self.zero, self.overlap_dp,
                                                   self.fetch(space))),
            batch=Batch(self.micro_batch, self.micro_batches(space, replicas),
                        space.grad_accumulation),
            memory=MemoryPolicy(self.recompute, space.loss),
            precision=space.precision_of(self.zero),
            optimizer="adam", expert=ExpertParallel(self.ep, space.expert_imbalance, self.etp),
            context=ContextParallel(self.cp, self.cp_algorithm))

    def facts(self, space: ModernSpace, replicated: bool) -> EngineFacts:
        """What an engine's limits read of the group's plan, with one replica or several."""
        return EngineFacts(self.tensor, self.pipeline, replicated, self.schedule, self.zero,
                           self.overlap_dp, self.sequence_parallel, space.precision,
                           space.precision_of(self.zero).grad_bytes, ep=self.ep, cp=self.cp,
                           cp_algorithm=self.cp_algorithm, etp=self.etp,
                           overlap_tp=self.overlap_tp,
                           overlap_tp_method=self.overlap_method(space),
                           overlap_pp=self.pipeline_part(space).overlaps_p2p,
                           zero3_fetch=self.fetch(space),
                           pp_scatter_gather=space.pp_scatter_gather,
                           grad_accumulation=space.grad_accumulation,
                           recompute=self.recompute, loss=space.loss, amp=space.amp)

    def overlap_method(self, space: ModernSpace) -> str:
        """How the group's tensor-parallel exchanges overlap the GEMMs: the space's method
        where the group overlaps them, else the default."""
        return space.overlap_tp_method if self.overlap_tp else USERBUFFERS

    def fetch(self, space: ModernSpace) -> str:
        """The group's ZeRO-3 granularity: the space's under zero 3, else 'blocks'."""
        return space.zero3_fetch if self.zero == 3 else "blocks"

    def can_overlap_tp(self) -> bool:
        """Whether the group's tensor-parallel exchanges can overlap the GEMMs (plan/rules.py)."""
        return tensor_overlap_needs_sequence_parallel(True, self.tensor,
                                                      self.sequence_parallel) is None

    def can_overlap_pp(self) -> bool:
        """Whether the group's pipeline sends can overlap compute (plan/rules.py)."""
        return pipeline_overlap_needs_interleaving(True, self.schedule, self.pipeline) is None

    def may_overlap_tp(self, space: ModernSpace) -> bool:
        """Whether the space lets the group's tensor-parallel exchanges overlap the GEMMs."""
        return True in space.overlap_tp and self.can_overlap_tp()

    def runs_on(self, space: ModernSpace, replicated: bool) -> bool:
        """Whether the space's engine (any, if None) runs the group's plan as priced."""
        return space.engine is None or _runs(space.engine, self.facts(space, replicated),
                                             space.engine_shape)


@functools.lru_cache(maxsize=1024)
def _mesh_split(ep: int, cp: int, algorithm: str, imbalance: float,
                etp: int | None = None) -> MeshSplit:
    return MeshSplit(ep, cp, algorithm, imbalance, etp)


@functools.lru_cache(maxsize=64)
def _precision(name: str, grad_bytes: int | None) -> Precision:
    preset = PRECISION_PRESETS[name]
    if grad_bytes is None or grad_bytes == preset.grad_bytes:
        return preset
    return replace(preset, grad_bytes=grad_bytes)


def _divisors(value: int) -> list[int]:
    return [d for d in range(1, value + 1) if value % d == 0]


@functools.lru_cache(maxsize=256)
def _divisors_cached(value: int) -> tuple[int, ...]:
    small = [d for d in range(1, int(value ** 0.5) + 1) if value % d == 0]
    return tuple(sorted(set(small + [value // d for d in small])))


def _choices(values: Iterable[int] | int | None, default: Sequence[int], field_name: str,
             minimum: int = 1) -> tuple[int, ...]:
    if values is None:
        return tuple(default)
    items = [values] if isinstance(values, int) else list(values)
    if not items:
        raise InputError(field_name, "must list at least one value")
    if len(items) > MAX_CHOICES:
        raise InputError(field_name, f"lists {len(items):,} values; the limit is {MAX_CHOICES}")
    return tuple(sorted({require_int(field_name, v, minimum=minimum) for v in items}))


def _rejected(choices: tuple[int, ...], rule: Callable[[int], Violation | None]) -> None:
    """Raise the InputError of the first user-given choice that `rule` rejects."""
    for value in choices:
        require(rule(value), "")


def make_modern_space(workload: Workload, system: System, global_batch: int,
                      tensor: Iterable[int] | int | None = None,
                      pipeline: Iterable[int] | int | None = None,
                      micro_batch: Iterable[int] | int | None = None,
                      zero: Iterable[int] | int | None = None,
                      recompute: Sequence[str] | None = None,
                      schedules: Sequence[str] | None = None, precision: str = "bf16",
                      sequence_parallel: bool | Sequence[bool] | None = None,
                      overlap_dp: bool | Sequence[bool] | None = None,
                      engine: str | None = None,
                      expert: Iterable[int] | int | None = None,
                      context: Iterable[int] | int | None = None,
                      cp_algorithms: Sequence[str] | None = None,
                      expert_imbalance: float = 1.0,
                      expert_tensor: Iterable[int] | int | None = None,
                      overlap_tp: bool | Sequence[bool] | None = None,
                      overlap_pp: bool | Sequence[bool] | None = None,
                      loss: str | None = None, amp: str | None = None) -> ModernSpace:
    """The space for a transformer on GPUs; defaults: TP dividing the heads and key/value heads
    within one node, PP dividing the layers, micro-batches 1-32 dividing the global batch,
    ep dividing the experts (1 for a dense model: `default_expert_degrees`), cp up to 8
    (16 from 64k tokens) for sequences of 16k tokens and more (`default_context_degrees`),
    both cp algorithms. `expert_imbalance`: the ep load imbalance every plan is priced at.
    `expert_tensor`: the experts' tensor-parallel degrees to try besides tp (etp; each plan
    takes those that divide its tp; default: etp = tp only).

    A user-given tp, pp or zero that plan/rules.py rejects on its own (tp not dividing the
    heads, pp not dividing the layers, a ZeRO stage outside 0-3) is an InputError naming the
    field; a combination the rules reject (ZeRO-2 with a pipeline, a micro-batch not dividing
    the batch, an interleaved chunking) is left out of the space, as the defaults' are.
    sequence_parallel, overlap_dp: one value, or the choices (None: both); overlap_tp (tp > 1
    with sequence parallelism only) and overlap_pp (the interleaved schedule only) the same,
    None the engines' default: overlap_tp off, overlap_pp on. engine: only plans that engine
    runs as they are priced (plan/engines.py search_violation), its gradient width where it
    fixes one (None: any engine)."""
    shape = workload.transformer
    if shape is None:
        raise InputError("workload", f"{workload.name} is not a transformer: the GPU-plan search "
                         "needs one (a zoo name like gpt3-175b, gpt:..., or hf:config.json)")
    global_batch = require_int("global_batch", global_batch)
    require(global_batch_within_epoch(global_batch, workload), "")  # before any search
    per_node = system.devices_per_node
    tp_default = [t for t in _divisors(per_node) if tensor_divides_heads(t, shape) is None]
    tp = _choices(tensor, tp_default, "tp")
    _rejected(tp, lambda t: tensor_divides_heads(t, shape))
    pp = _choices(pipeline, [p for p in _divisors(shape.layers) if p <= system.machines], "pp")
    _rejected(pp, lambda p: pipeline_divides_layers(p, 1, shape.layers))
    mb = _choices(micro_batch, [b for b in DEFAULT_MICRO_BATCHES if global_batch % b == 0],
                  "micro_batch")
    for b in mb:  # a micro-batch that does not divide B is in no plan
        violation = batch_divides(global_batch, 1, b)
        if violation is not None:
            raise InputError("micro_batch", f"{b} can be in no plan: {violation.message}")
    zeros = _choices(zero, ZERO_STAGES, "zero", minimum=0)
    if any(z > 3 for z in zeros):
        raise InputError("zero", "stages are 0-3")
    rec = tuple(recompute) if recompute is not None else SEARCHED_RECOMPUTE.get(
        engine if isinstance(engine, str) else None, SEARCHED_RECOMPUTE[None])
    for value in rec:
        if value not in RECOMPUTE:
            raise InputError("recompute", f"must be one of {', '.join(RECOMPUTE)}, got "
                             f"{short_repr(value)}")
    if recompute is not None:
        for value in rec:
            require(per_op_recompute_shape(value, shape), "")
    else:
        rec = tuple(r for r in rec if per_op_recompute_shape(r, shape) is None)
    sched = tuple(schedules) if schedules is not None else ("1f1b", "interleaved")
    for value in sched:
        if value not in SCHEDULES:
            raise InputError("schedules", f"must be one of {', '.join(SCHEDULES)}, got "
                             f"{short_repr(value)}")
    if precision not in PRECISION_PRESETS:
        raise InputError("precision", f"must be one of {', '.join(PRECISION_PRESETS)}")
    require(precision_on_device(precision, system), "")
    both = (False, True)  # None: search both
    sp = require_switches("sequence_parallel", sequence_parallel) or both
    overlap = require_switches("overlap_dp", overlap_dp) or both
    tp_overlap = require_switches("overlap_tp", overlap_tp) or (False,)
    pp_overlap = require_switches("overlap_pp", overlap_pp) or (True,)
    if engine is not None:
        engine = check_engine(engine)
    ep = _choices(expert, default_expert_degrees(shape, system.machines), "ep")
    _rejected(ep, lambda e: experts_divide(e, shape))
    cp = _choices(context, default_context_degrees(shape, system.machines), "cp")
    algorithms = tuple(cp_algorithms) if cp_algorithms is not None else CP_ALGORITHMS
    for value in algorithms:
        if value not in CP_ALGORITHMS:
            raise InputError("cp_algorithm", f"must be one of {', '.join(CP_ALGORITHMS)}, got "
                             f"{short_repr(value)}")
    if not algorithms:
        raise InputError("cp_algorithm", "must list at least one algorithm")
    imbalance = _imbalance("expert_imbalance", expert_imbalance)
    require(imbalance_within_experts(imbalance, max(ep)), "")
    etp = (0,) if expert_tensor is None else (0, *_choices(expert_tensor, (), "etp"))
    if expert_tensor is not None and not shape.experts:
        raise InputError("etp", "the model has no experts to split (a dense model takes no "
                         "etp)")
    space = ModernSpace(global_batch, tp, pp, mb, sched, DEFAULT_VIRTUAL_STAGES, zeros, rec, sp,
                        precision, overlap, engine,
                        tuple(priced_grad_bytes(engine, z, precision) for z in ZERO_STAGES), ep, cp,
                        tuple(dict.fromkeys(algorithms)), imbalance,
                        shape if engine is not None else None, etp, tp_overlap, pp_overlap,
                        priced_zero3_fetch(engine), priced_grad_accumulation(engine),
                        _loss(loss, engine), _amp(amp, engine, precision),
                        priced_overlap_tp_method(engine),
                        priced_pp_scatter_gather(engine, shape))
    if not groups_of(space, workload):  # every combination the user left open breaks a rule
        _no_group(space, workload, shape.layers)
    return space


SEARCHED_RECOMPUTE: dict[str | None, tuple[str, ...]] = {
    None: ("none", "selective", "full"), "torchtitan": ("none", "op", "full")}
"""The recomputations a search tries by default: torchtitan's selective checkpointing is per
operation ('op'); every other engine's (and no engine's, None) selective is the attention
core."""

LONG_CONTEXT_TOKENS = 16_384
"""From this sequence length the default space offers context parallelism (Megatron-Core
recommends it for long sequences; below it a sequence's activations fit without it)."""
DEFAULT_CONTEXT = (1, 2, 4, 8)
VERY_LONG_CONTEXT_TOKENS = 65_536
"""From this length the default space offers cp = 16 too (Llama 3 trained 128k-token sequences
with cp = 16; Dubey et al. 2024 §3.3.1)."""


def _loss(loss: object, engine: str | None) -> str:
    """The loss kernel every plan of the space computes: `loss` (workload/transformer_kinds.py
    LOSS_KERNELS) where given, else the engine's (plan/engines.priced_loss); an engine that
    computes it otherwise refuses it, naming loss."""
    if loss is None:
        return priced_loss(engine)
    if not isinstance(loss, str) or loss not in LOSS_KERNELS:
        raise InputError("loss", f"must be one of {', '.join(LOSS_KERNELS)}, got "
                         f"{short_repr(loss)}")
    if engine is not None and loss != priced_loss(engine):
        raise InputError("loss", f"{ENGINE_NAMES[engine]} computes the loss as "
                         f"{priced_loss(engine)}, not {loss}: leave loss out or name another "
                         f"engine")
    return loss


def _amp(amp: object, engine: str | None, precision: str) -> str:
    """The mixed-precision mode every plan of the space runs (workload/transformer_kinds.py
    AMP_MODES): `amp` where given, else 'half'; an engine refuses any other (they all cast the
    model: plan/engines.ENGINE_AMP), and so does a 4-byte precision (plan/rules.py
    amp_needs_16_bit), each naming amp."""
    if amp is None:
        return ENGINE_AMP
    if not isinstance(amp, str) or amp not in AMP_MODES:
        raise InputError("amp", f"must be one of {', '.join(AMP_MODES)}, got {short_repr(amp)}")
    if engine is not None and amp != ENGINE_AMP:
        raise InputError("amp", f"{ENGINE_NAMES[engine]} runs {AMP_NAMES[ENGINE_AMP]} "
                         f"(amp {ENGINE_AMP}), not {amp}: leave amp out or name no engine")
    require(amp_needs_16_bit(amp, precision, PRECISION_PRESETS[precision].activation_bytes), "")
    return amp


def default_expert_degrees(shape: TransformerShape, devices: int) -> tuple[int, ...]:
    """ep choices: the divisors of the experts up to the cluster's devices; (1,) when dense."""
    if not shape.is_moe:
        return (1,)
    return tuple(d for d in _divisors_cached(shape.experts) if d <= devices)


def default_context_degrees(shape: TransformerShape, devices: int) -> tuple[int, ...]:
    """cp choices: (1,) below LONG_CONTEXT_TOKENS or without fused attention, else the
    DEFAULT_CONTEXT degrees (and 16 from VERY_LONG_CONTEXT_TOKENS) that fit the cluster and
    split the sequence into 2 · cp chunks."""
    if shape.seq < LONG_CONTEXT_TOKENS or not shape.flash_attention:
        return (1,)
    degrees = DEFAULT_CONTEXT + ((16,) if shape.seq >= VERY_LONG_CONTEXT_TOKENS else ())
    return tuple(c for c in degrees if c <= devices and shape.seq % (2 * c) == 0)


def _imbalance(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not value >= 1 or value == float("inf"):
        raise InputError(field, f"must be a number >= 1 (1: uniform routing), got "
                         f"{short_repr(value)}")
    return float(value)


SPACE_FIELDS = {"schedule": "schedules", "virtual_stages": "schedules", "grad_bytes": "precision"}
"""A rule's plan field -> the search's argument that chooses it (the rest share the name)."""


def _no_group(space: ModernSpace, workload: Workload, layers: int) -> None:
    """The InputError naming the first rule (a pipeline's, or the engine's) that leaves no
    group in `space`."""
    anywhere = groups_of(replace(space, engine=None), workload) if space.engine else []
    for group in anywhere:
        violation = search_violation(str(space.engine), group.facts(space, False),
                                     space.engine_shape)
        if violation is not None:
            raise InputError(SPACE_FIELDS.get(violation.field, violation.field or "engine"),
                             f"no plan of the search runs on {space.engine}, e.g. "
                             f"{violation.message}")
    for p_, schedule in itertools.product(space.pipeline, space.schedules):
        for v in ((1,) if schedule != "interleaved" else DEFAULT_VIRTUAL_STAGES):
            violation = schedule_violation(p_, schedule, v, layers)
            if violation is not None:
                raise InputError(SPACE_FIELDS.get(violation.field, violation.field),
                                 f"no plan of the search passes the rules, e.g. "
                                 f"{violation.message}")


def groups_of(space: ModernSpace, workload: Workload) -> list[Group]:
    """Every group of the space that plan/rules.py accepts: the schedule's virtual stages with
    pp · v dividing the layers, sequence parallelism only where it splits something (tp > 1;
    with tp = 1 it is the plan without it, also where the space asks for it on), ep dividing
    the experts, cp's rules (plan/rules.context_splits), and, with an engine, what it runs as
    priced at one replica (the engine's limits that need replicas > 1 are replica_choices')."""
    return [member for rep in group_classes(space, workload)
            for member in class_members(rep, space)]


def class_members(rep: Group, space: ModernSpace) -> list[Group]:
    """The groups of `rep`'s class in `space`: its plan at each of the space's ZeRO stages and
    overlaps (data parallel; tensor parallel where tp > 1 with sequence parallelism; the
    pipeline's sends under the interleaved schedule) that the space's engine runs as priced
    at one replica."""
    overlap_tp = space.overlap_tp if rep.can_overlap_tp() else (False,)
    overlap_pp: tuple[bool | None, ...] = space.overlap_pp if rep.can_overlap_pp() else (None,)
    out = []
    for zero, overlap, tp_overlap, pp_overlap in itertools.product(
            space.zero, space.overlap_dp, overlap_tp, overlap_pp):
        group = rep._replace(zero=zero, overlap_dp=overlap, overlap_tp=tp_overlap,
                             overlap_pp=pp_overlap)
        if group.runs_on(space, False):
            out.append(group)
    return out


def group_classes(space: ModernSpace, workload: Workload) -> list[Group]:
    """One representative (ZeRO 0, no overlap) per class of groups_of: the groups that differ
    only in their ZeRO stage and overlap, which no stage cost and no quick bound reads."""
    shape = workload.transformer
    if shape is None:
        raise InputError("workload", f"{workload.name} is not a transformer")
    # The schedule rules depend on pp alone (and the layers): checked once per pp, not once
    # per group.
    schedules = {pp: [(schedule, v) for schedule in space.schedules
                      for v in ((1,) if schedule != "interleaved" else space.virtual_stages)
                      if schedule_violation(pp, schedule, v, shape.layers) is None]
                 for pp in space.pipeline}
    tensors = [tp for tp in space.tensor if tensor_divides_heads(tp, shape) is None]
    experts = [ep for ep in space.expert if experts_divide(ep, shape) is None]
    # cp = 1 has no algorithm to choose: it is offered once, as 'ring'
    contexts = [(cp, algorithm) for cp in space.context
                for algorithm in (space.cp_algorithms if cp > 1 else ("ring",))]
    # etp: tp (None) and the space's divisors of tp below it, for a mixture of experts
    splits = {tp: list(dict.fromkeys(None if e in (0, tp) else e
                                     for e in (space.expert_tensor if shape.experts else (0,))
                                     if e == 0 or tp % e == 0)) for tp in tensors}
    out = []
    for tp, pp, mb, sp, rec, ep, (cp, algorithm) in itertools.product(
            tensors, space.pipeline, space.micro_batch, space.sequence_parallel,
            space.recompute, experts, dict.fromkeys(contexts)):
        if sp != sequence_parallel_splits(sp, tp):  # tp = 1: the plan without it, once
            if False in space.sequence_parallel:
                continue
            sp = False
        if context_splits(cp, algorithm, tp, shape) is not None:
            continue
        for etp in splits[tp]:
            for schedule, v in schedules[pp]:
                out.append(Group(tp, pp, schedule, v, mb, sp, rec, 0, False, ep, cp, algorithm,
                                 etp))
    return out


def memory_group(group: Group) -> Group:
    """The group whose memory is the same as `group`'s at every data-parallel degree: memory
    does not depend on overlap, and follows model/data_parallel.memory_zero_stage."""
    return group._replace(overlap_dp=False, overlap_tp=False, overlap_pp=None,
                          zero=memory_zero_stage(group.zero, group.pipeline))


def replica_choices(group: Group, space: ModernSpace, devices: int) -> list[int]:
    """Data-parallel degrees the group may take within `devices` GPUs: the divisors d of
    B / b with t · p · d ≤ devices that plan/rules.py's batch rules accept (B a multiple of
    d · b; m = B / (d · b) a multiple of p when interleaved) and, with an engine, at which
    it runs the plan as priced (plan/engines.py)."""
    # the dp · ep members each take micro-batches of b: B must divide by d · (ep · b)
    choices = _replica_choices(space.global_batch, group.micro_batch * group.ep, group.schedule,
                               group.pipeline, devices // group.devices_per_replica)
    if group.runs_on(space, True):  # at one replica groups_of checked it
        return list(choices)
    return [d for d in choices if d == 1]


@functools.lru_cache(maxsize=65536)
def _runs(engine: str, facts: EngineFacts, shape: TransformerShape | None) -> bool:
    return search_violation(engine, facts, shape) is None


@functools.lru_cache(maxsize=4096)
def _replica_choices(global_batch: int, micro_batch: int, schedule: str, pipeline: int,
                     limit: int) -> tuple[int, ...]:
    """replica_choices for the values it depends on (many groups share them)."""
    if global_batch % micro_batch:
        return ()
    return tuple(d for d in _divisors_cached(global_batch // micro_batch)
                 if d <= limit and batch_violation(global_batch, d, micro_batch, schedule,
                                                   pipeline) is None)


SUBSPACE_FIELDS = {"tensor": "tensor", "pipeline": "pipeline", "zero": "zero",
                   "expert": "ep", "context": "cp"}
"""Space fields a family may narrow -> the Group field each chooses (Caches.classes_for)."""


def _narrows(space: ModernSpace, parent: ModernSpace) -> bool:
    """Whether `space` is `parent` with some SUBSPACE_FIELDS narrowed to subsets."""
    for name in ModernSpace.__dataclass_fields__:
        mine, theirs = getattr(space, name), getattr(parent, name)
        if mine == theirs:
            continue
        if name not in SUBSPACE_FIELDS or not set(mine) <= set(theirs):
            return False
    return True


@dataclass
class Priced:
    """One plan the search priced: its step time, devices, fit, and cost per step."""

    group: Group
    replicas: int
    step_s: float
    devices: int
    cost: float


T = TypeVar("T")


def equivalence_key(group: Group, replicas: int, space: ModernSpace) -> tuple[object, ...]:
    """Plans with one key are one plan to whoever runs it: where the dense gradients meet over
    no one (dp · ep · cp = 1) the ZeRO stage and the data-parallel overlap change nothing that
    runs but the gradients' width, which the key keeps. A ranking lists each key once."""
    grad_bytes = space.precision_of(group.zero).grad_bytes
    if replicas * group.ep * group.cp == 1:
        group = group._replace(zero=0, overlap_dp=False)
    return group, replicas, grad_bytes


def distinct(ranked: list[T], key: Callable[[T], object]) -> list[T]:
    """`ranked` with each key's first entry only (the best, in a ranked list)."""
    seen: set[object] = set()
    out = []
    for item in ranked:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


@dataclass
class Caches:
    """What one workload on one system shares across searches (budgets, families): per-split
    stage templates, per-pipeline layouts, built stages, and their device seconds."""

    templates: dict[tuple[object, ...], StageTemplate] = field(default_factory=dict)
    """Per (tp, micro-batch, sequence parallel, ep, cp, cp algorithm, imbalance)."""
    layouts: dict[tuple[int, int], PipelineLayout] = field(default_factory=dict)
    built: dict[tuple[object, ...], tuple[StageCosts, ...]] = field(default_factory=dict)
    seconds: dict[tuple[int, str], tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict)
    whole: dict[tuple[object, ...], tuple[float, float]] = field(default_factory=dict)
    """The whole model's T on one stage per (split, recompute)."""
    fits: dict[tuple[Group, int], bool] = field(default_factory=dict)
    """Whether a plan fits, per (memory_group, replicas): budgets share it."""
    classes: dict[ModernSpace, list[Group]] = field(default_factory=dict)
    """Per space, one representative per class of groups (group_classes)."""
    bounds: dict[tuple[object, ...], float] = field(default_factory=dict)
    """Quick bounds by what they read (quick_bound)."""
    layer_options: dict[tuple[object, ...], LayerOptions] = field(default_factory=dict)
    """Layer options shared by every split's stage template (model/stage.stage_costs)."""
    checked: dict[tuple[Group, int], Prediction] = field(default_factory=dict)
    """Plans already re-predicted by predict_plan (the same plan in several searches)."""

    def classes_for(self, space: ModernSpace, workload: Workload) -> list[Group]:
        """group_classes(space), once per space. A family's space (a known space with some of
        SUBSPACE_FIELDS narrowed) filters that space's classes instead of building its own:
        group_classes makes each from the fields' values alone, so the narrowed space's are
        the known ones whose values it allows (ZeRO, which no class fixes, is narrowed when
        a class is split into its groups, class_members)."""
        known = self.classes.get(space)
        if known is not None:
            return known
        for parent, classes in self.classes.items():
            if _narrows(space, parent):
                narrowed = [(SUBSPACE_FIELDS[name], set(getattr(space, name)))
                            for name in SUBSPACE_FIELDS if name != "zero"
                            and getattr(space, name) != getattr(parent, name)]
                known = list(classes)
                for name, allowed in narrowed:  # one field at a time: each pass is shorter
                    known = [rep for rep in known if getattr(rep, name) in allowed]
                break
        else:
            known = group_classes(space, workload)
        self.classes[space] = known
        return known


@dataclass
class _Search:
    workload: Workload
    system: System
    space: ModernSpace
    objective: str = "time"
    evaluated: int = 0
    bounded: int = 0
    caches: "Caches" = field(default_factory=lambda: Caches())

    @property
    def templates(self) -> dict[tuple[object, ...], StageTemplate]:
        return self.caches.templates

    @property
    def layouts(self) -> dict[tuple[int, int], PipelineLayout]:
        return self.caches.layouts

    @property
    def built(self) -> dict[tuple[object, ...], tuple[StageCosts, ...]]:
        return self.caches.built

    def price(self) -> float:
        return self.system.price_per_device_hour or 1.0

    def stages(self, group: Group) -> tuple[StageCosts, ...]:
        """The group's stage costs from cached layouts and per-split templates."""
        key = (group.pipeline, group.virtual_stages)
        layout = self.layouts.get(key)
        if layout is None:
            layout = pipeline_layout(self.workload, stage_layers(
                self.workload.layers, group.pipeline, group.virtual_stages))
            if layout is None:
                raise InputError("workload", f"{self.workload.name}: the GPU-plan search needs "
                                 f"transformer blocks of at most {MAX_BLOCK_KINDS} kinds")
            self.layouts[key] = layout
        mesh_split = group.split(self.space)
        split = (group.tensor, group.micro_batch, group.sequence_parallel, mesh_split)
        built = self.built.get((*split, *key))
        if built is not None:
            return built
        template = self.templates.get(split)
        if template is None:
            b = self.workload.bytes_per_value
            precision = PRECISION_PRESETS[self.space.precision]  # compute and activations only
            template = stage_template(self.workload, self.system, group.tensor,
                                      group.micro_batch, layout.kinds,
                                      precision=precision.compute,
                                      sequence_parallel=group.sequence_parallel,
                                      bytes_scale=(precision.activation_bytes or b) / b,
                                      split=mesh_split, shared=self.caches.layer_options)
            self.templates[split] = template
        built = stages_from_template(self.workload, template, layout)
        self.built[(*split, *key)] = built
        return built

    def context(self, group: Group, replicas: int,
                stages: tuple[StageCosts, ...]) -> StepContext:
        return StepContext(self.workload, self.system, group.plan(self.space, replicas), stages)

    def fits(self, group: Group, replicas: int, stages: tuple[StageCosts, ...]) -> bool:
        """Whether the plan fits, priced once per memory_group and replicas."""
        same = memory_group(group)
        key = (same, replicas)
        known = self.caches.fits.get(key)
        if known is None:
            plan = same.plan(self.space, replicas)
            memory, capacity = accelerator_memory_parts(
                self.workload, self.system, plan, member_state(self.workload, plan, stages))
            known = self.caches.fits[key] = sum(p.bytes for p in memory) <= capacity["worker"]
        return known

    def key(self, priced: Priced) -> tuple[object, ...]:
        """Rank: the objective, then fewer devices, then a fixed order of the plan's fields."""
        first = priced.step_s if self.objective == "time" else priced.cost
        return first, priced.devices, priced.group, priced.replicas

    def seconds(self, group: Group, stages: tuple[StageCosts, ...],
                overlap: bool) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per stage, one micro-batch on the devices alone (no launch or transfer time): its
        work (compute + recompute, what the wait for the slowest device scales) and its
        tensor-, expert- and context-parallel communication; with `overlap`, the
        tensor-parallel exchanges less what the GEMMs hide."""
        key = (id(stages), group.recompute, overlap)
        seconds = self.caches.seconds.get(key)
        if seconds is None:
            mode = self.space.overlap_tp_method if overlap else None
            seconds = (tuple(stage.work_s(group.recompute, mode) for stage in stages),
                       tuple(stage.exposed_comm_s(mode) for stage in stages))
            self.caches.seconds[key] = seconds
        return seconds

    def slowest(self, group: Group, replicas: int) -> float:
        """The wait for the slowest device as a factor on the work of `replicas` replicas
        (model/stragglers.slowest_device_factor, as model/compose prices it)."""
        return slowest_device_factor(group.devices_per_replica * replicas,
                                     self.system.machine.speed_spread)

    def over_choices(self, group: Group, choices: list[int],
                     pipeline_s: Callable[[int, float], float]) -> float:
        """The objective's lower bound over the data-parallel degrees, from a lower bound
        pipeline_s(m, g) of the pipeline's time at m micro-batches (which falls as d grows)
        with the work slowed by g (which grows with d): for the time, m at the largest d and
        g at the smallest."""
        if self.objective == "time":
            return pipeline_s(group.micro_batches(self.space, choices[-1]),
                              self.slowest(group, choices[0]))
        best = float("inf")
        for replicas in choices:
            m = group.micro_batches(self.space, replicas)
            devices = group.devices_per_replica * replicas
            best = min(best, pipeline_s(m, self.slowest(group, replicas)) * devices
                       * self.price() / 3600)
        return best

    def bound(self, group: Group, choices: list[int], stages: tuple[StageCosts, ...]) -> float:
        """Lower bound of the objective over the group's data-parallel degrees: the pipeline's
        time on the devices alone (no launch or transfer time, no data-parallel traffic, no
        optimizer step), which falls as d grows (fewer micro-batches)."""
        self.bounded += 1
        work, comm = self.seconds(group, stages, group.overlap_tp)
        return self.over_choices(group, choices, lambda m, g: pipeline_time_s(
            tuple(w * g + c for w, c in zip(work, comm)), m, group.virtual_stages))

    def quick_bound(self, group: Group, choices: list[int], overlap: bool) -> float:
        """A lower bound of `bound` without the group's pipeline layout, from the whole model
        on one stage (shared by every pipeline degree): stage totals are additive and every
        layer sits on one device, so Σ t_i is the whole model's T; t_max ≥ T / p; and
        m · t_max + (T − t_max) / v grows with t_max (m ≥ 1 ≥ 1/v). QUICK_SLACK covers the
        rounding of the two sums' orders. `overlap`: the tensor-parallel exchanges less what
        the GEMMs hide (a class's bound where any member may overlap them, a member's where
        it does)."""
        self.bounded += 1
        memo = (group.tensor, group.micro_batch, group.sequence_parallel, group.ep, group.cp,
                group.cp_algorithm, group.etp, group.recompute, overlap,
                group.pipeline, group.virtual_stages,
                (choices[0], choices[-1]) if self.objective == "time" else tuple(choices))
        known = self.caches.bounds.get(memo)
        if known is not None:
            return known
        key = memo[:9]
        totals = self.caches.whole.get(key)
        if totals is None:
            whole = self.stages(group._replace(pipeline=1, schedule="1f1b", virtual_stages=1))
            work, comm = self.seconds(group, whole, overlap)
            totals = self.caches.whole[key] = (work[0], comm[0])
        p, v = group.pipeline, group.virtual_stages

        def pipeline_s(m: int, g: float) -> float:
            total = totals[0] * g + totals[1]
            share = total / p
            return (m * share + (total - share) / v) * (1 - QUICK_SLACK)

        bound = self.caches.bounds[memo] = self.over_choices(group, choices, pipeline_s)
        return bound

    def run(self, devices: int, top: int) -> list[Priced]:
        """The `top` best plans within `devices` GPUs: groups in order of their bound, each
        priced at every data-parallel degree, until no bound can beat the top-th plan. Groups
        enter with their quick bound; the first time one comes up it is laid out and goes back
        with its exact bound (best-first search with lazily tightened bounds: exact, because
        every bound is a lower bound of the group's objective). Plans that are one plan to
        whoever runs it (`equivalence_key`) are listed once, the best of them.

        Groups that differ only in their ZeRO stage and overlap share their quick bound (it
        reads neither): they enter as one class, bounded at the replica counts of any engine
        (a superset of each member's, so a lower bound of each), and are split into their
        groups when the class comes up.

        A group whose tensor-parallel exchanges do not overlap the GEMMs is never faster than
        its twin that overlaps them (the same plan with less exposed communication per stage:
        every step term is the same or larger, memory the same): once the twin is priced, the
        group's bound rises to the twin's best objective."""
        heap: list[tuple[float, tuple[int, int], bool, Group, list[int],
                         tuple[StageCosts, ...] | None]] = []
        classes = self.caches.classes_for(self.space, self.workload)
        for index, rep in enumerate(classes):
            choices = list(_replica_choices(self.space.global_batch, rep.micro_batch * rep.ep,
                                            rep.schedule, rep.pipeline,
                                            devices // rep.devices_per_replica))
            if choices:
                heap.append((self.quick_bound(rep, choices, rep.may_overlap_tp(self.space)),
                             (index, -1), True, rep, choices, None))
        heapq.heapify(heap)
        found: list[Priced] = []
        twin_best: dict[Group, float] = {}
        """Per group that overlaps its tensor-parallel exchanges, its best objective."""
        while heap:
            bound, order, is_class, group, choices, stages = heapq.heappop(heap)
            if len(found) >= top and bound >= self.key(found[top - 1])[0] * (1 + 1e-12):
                break
            if not is_class and not group.overlap_tp:
                twin = twin_best.pop(group._replace(overlap_tp=True), None)
                if twin is not None and twin > bound:
                    heapq.heappush(heap, (twin, order, False, group, choices, stages))
                    continue
            if is_class:  # a class: its groups, each at its own replica counts
                # members with the same replica counts and overlap share one quick bound:
                # asked once here, not once a member (~10^4 fewer calls on the MoE row)
                shared: dict[tuple[tuple[int, ...], bool], float] = {}
                for j, member in enumerate(class_members(group, self.space)):
                    own = replica_choices(member, self.space, devices)
                    if own:
                        key = (tuple(own), member.overlap_tp)
                        if key not in shared:
                            shared[key] = self.quick_bound(member, own, member.overlap_tp)
                        heapq.heappush(heap, (shared[key], (order[0], j), False, member, own,
                                              None))
                continue
            if stages is None:
                stages = self.stages(group)
                heapq.heappush(heap, (self.bound(group, choices, stages), order, False, group,
                                      choices, stages))
                continue
            best = float("inf")
            for replicas in reversed(choices):  # memory never grows with d: stop at a misfit
                if not self.fits(group, replicas, stages):
                    break
                context = self.context(group, replicas, stages)
                self.evaluated += 1
                x = throughput(context, replicas, 0)
                step = self.space.global_batch / x
                used = group.devices_per_replica * replicas
                found.append(Priced(group, replicas, step, used, step * used * self.price() / 3600))
                best = min(best, self.key(found[-1])[0])
            if group.overlap_tp:
                twin_best[group] = best
            found.sort(key=self.key)
            found[:] = distinct(found, lambda p: equivalence_key(p.group, p.replicas,
                                                                  self.space))
            del found[max(top, 1) * 4:]
        return found[:top]


def _checked(workload: Workload, system: System, space: ModernSpace, priced: Priced) -> Prediction:
    prediction = predict_plan(workload, system, priced.group.plan(space, priced.replicas))
    if abs(prediction.step_time_s - priced.step_s) > CHECK_TOLERANCE * priced.step_s:
        raise RuntimeError(f"optimizer bug: {prediction.label()}: search step {priced.step_s!r} "
                           f"!= predict's {prediction.step_time_s!r}")
    if not prediction.fits:
        raise RuntimeError(f"optimizer bug: {prediction.label()} does not fit")
    return prediction


FAMILIES = {"no pipeline (pp = 1)": {"pipeline": (1,)},
            "no tensor parallelism (tp = 1)": {"tensor": (1,)},
            "ZeRO-3 / FSDP": {"zero": (3,), "pipeline": (1,)},
            "no expert parallelism (ep = 1)": {"expert": (1,)},
            "no context parallelism (cp = 1)": {"context": (1,)}}
"""The best plan of each family is reported beside the winner ("why it wins")."""
LARGE_BATCH_TOKENS = 4 * 2**20
"""A global batch above ~4M tokens is beyond what GPT-3 trained with (3.2M tokens for 175B,
Brown et al. 2020 Table 2.1) and past the critical batch size of such models (McCandlish et al.
2018): the model predicts throughput, not convergence."""


def _search(workload: Workload, system: System, space: ModernSpace, devices: int, top: int,
            objective: str, caches: Caches | None = None) -> tuple[list[Prediction], _Search]:
    caches = caches or Caches()
    # every plan of the space computes its loss so and runs its mixed-precision mode
    workload = workload.as_run(space.loss, space.amp,
                               PRECISION_PRESETS[space.precision].activation_bytes
                               or workload.bytes_per_value)
    search = _Search(workload, system, space, objective, caches=caches)
    found = search.run(devices, top)
    checked = []
    for priced in found:
        key = (priced.group, priced.replicas)
        if key not in caches.checked:
            caches.checked[key] = _checked(workload, system, space, priced)
        checked.append(caches.checked[key])
    return checked, search


def _budgets(gpus: int, per_node: int) -> list[int]:
    """GPU counts of the scalability curve: powers of two up to the budget, and the budget."""
    counts = {gpus}
    value = 1
    while value < gpus:
        counts.add(value)
        value *= 2
    return sorted(counts)


def _mesh_lines(best: Prediction) -> list[str]:
    """Why the winner's ep and cp are what they are: what each splits, and what its exchange
    costs of the step."""
    plan, step = best.plan, best.step_time_s
    lines = []
    if plan.expert.degree > 1:
        ep = plan.expert.degree
        lines.append(f"ep {ep}: each GPU holds 1/{ep} of the experts' weights (the memory and "
                     f"gradient traffic they save), their all-to-alls take "
                     f"{100 * best.part(Part.EP_COMM) / step:.0f} % of the step")
    if plan.context.degree > 1:
        cp, algorithm = plan.context.degree, plan.context.algorithm
        how = "ring attention" if algorithm == "ring" else "all-to-all (Ulysses)"
        lines.append(f"cp {cp} ({how}): each GPU holds 1/{cp} of every sequence's tokens and "
                     f"activations; the exchange not hidden behind attention takes "
                     f"{100 * best.part(Part.CP_COMM) / step:.0f} % of the step")
    return lines


def _why(best: Prediction, families: dict[str, Prediction], objective: str) -> list[str]:
    parts = {p.name: p.seconds for p in best.parts if p.kind not in ("sum", "total")}
    step = best.step_time_s
    top_parts = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    lines = [f"bottleneck: {best.bottleneck}",
             "largest parts: " + ", ".join(f"{name.replace('_', ' ')} {100 * s / step:.0f} %"
                                           for name, s in top_parts)]
    lines += _mesh_lines(best)
    if best.plan.memory.recompute != "none":
        lines.append(f"recompute {best.plan.memory.recompute}: the plan fits in memory only "
                     "with it, or it is faster overall" if objective == "time" else
                     f"recompute {best.plan.memory.recompute}")
    for name, other in families.items():
        ratio = other.step_time_s / step
        lines.append(f"best with {name}: {other.label()} at {ratio:.2f}x the step time")
    return lines


def _smallest_plan_fits(space: ModernSpace, devices: int) -> None:
    """InputError naming tp or pp when even the smallest plan the search may take (its least
    tp × its least pp, one replica) needs more than the `devices` of the budget."""
    tp, pp = min(space.tensor), min(space.pipeline)
    ep, cp = min(space.expert), min(space.context)
    if tp * pp * ep * cp > devices:
        field = ("ep" if ep > 1 else "cp" if cp > 1 else
                 "tp" if tp > 1 and (pp == 1 or tp > devices) else "pp")
        mesh = f"tp {tp} × pp {pp}" + (f" × ep {ep}" if ep > 1 else "") + (
            f" × cp {cp}" if cp > 1 else "")
        raise InputError(field, f"the smallest plan the search may take, {mesh}, needs "
                         f"{tp * pp * ep * cp} GPUs; the budget is {devices}")


def optimize_modern(workload: Workload, system: System, space: ModernSpace,
                    gpus: int | None = None, top: int = 5, objective: str = "time",
                    pareto: bool = False, curve: bool = True) -> OptimizeResult:
    """The fastest (or cheapest) plan within `gpus` GPUs, the top `top`, the best of each
    family, the scalability curve over GPU counts and (with `pareto`) the plans no other beats
    on both step time and GPUs (or cost)."""
    if objective not in OBJECTIVES:
        raise InputError("objective", f"must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "cost" and system.price_per_device_hour is None:
        raise InputError("objective", f"cost needs a price per device-hour: the system "
                         f"{system.name!r} has none (give --price)")
    started = time.perf_counter()
    devices = require_int("gpus", gpus if gpus is not None else system.machines)
    if devices > system.machines:
        raise InputError("gpus", f"{devices} GPUs but cluster {system.name!r} has {system.machines}")
    caches = Caches()
    ranked, search = _search(workload, system, space, devices, top, objective, caches)
    if not ranked:
        _smallest_plan_fits(space, devices)
        raise InputError("gpus", f"no plan of {workload.name} fits in {devices} GPU{'s' if devices != 1 else ''} of "
                         f"{system.name} at global batch {space.global_batch} (memory, or the "
                         f"batch does not divide)")
    evaluated, bounded = search.evaluated, search.bounded
    families = {}
    for name, restriction in FAMILIES.items():
        allowed = {k: tuple(v for v in values if v in getattr(space, k))
                   for k, values in restriction.items()}
        if any(not values for values in allowed.values()) or all(
                values == getattr(space, k) for k, values in allowed.items()):
            continue  # the family is empty, or it is the whole space (nothing to compare)
        family_space = replace(space, **allowed)
        found, extra = _search(workload, system, family_space, devices, 1, objective, caches)
        evaluated, bounded = evaluated + extra.evaluated, bounded + extra.bounded
        if found:
            families[name] = found[0]
    points: list[CurvePoint] = []
    front: list[Prediction] = []
    if curve or pareto:
        best_by_count: dict[int, Prediction] = {}
        for count in _budgets(devices, system.devices_per_node):
            found, extra = _search(workload, system, space, count, 1, "time", caches)
            evaluated, bounded = evaluated + extra.evaluated, bounded + extra.bounded
            if found:
                best_by_count[count] = found[0]
        first = None
        for count, prediction in sorted(best_by_count.items()):
            first = first or prediction.step_time_s
            points.append(CurvePoint(count, prediction.epoch_time_s,
                                     first / prediction.step_time_s, prediction,
                                     SpaceKind.GPU))
        if pareto:
            candidates = sorted({id(p): p for p in list(best_by_count.values()) + ranked}.values(),
                                key=lambda p: (p.plan.workers, p.step_time_s))
            metric = ((lambda p: p.plan.workers) if objective == "time"
                      else (lambda p: cost_per_step(p, system.price_per_device_hour) or 0.0))
            for p in sorted(candidates, key=lambda p: (metric(p), p.step_time_s)):
                if not front or p.step_time_s < front[-1].step_time_s:
                    front.append(p)
    warnings = []
    if not system.calibrated:
        warnings.append(f"{system.name} is uncalibrated: its efficiencies are defaults "
                        f"({system.profile_source})")
    tokens = space.global_batch * (workload.transformer.seq if workload.transformer else 1)
    if tokens > LARGE_BATCH_TOKENS:
        warnings.append(f"a global batch of {tokens:,} tokens is beyond what trains well for "
                        f"most models (GPT-3 used 3.2M tokens); dnnscale predicts throughput, "
                        f"not convergence")
    return OptimizeResult(
        workload=workload.name, cluster=system.name, machines=devices, method="fast",
        best=ranked[0], top=ranked, curve=points, families=families, evaluated=evaluated,
        bounds_evaluated=bounded, search_time_s=time.perf_counter() - started,
        explanation=_why(ranked[0], families, objective), space=SpaceKind.GPU,
        global_batch=space.global_batch, objective=objective, pareto=front, warnings=warnings,
        price_per_device_hour=system.price_per_device_hour, engine=space.engine)


def exhaustive_modern(workload: Workload, system: System, space: ModernSpace, devices: int,
                      objective: str = "time", distinct_plans: bool = True) -> list[Prediction]:
    """Every plan of the space within `devices` GPUs through `predict_plan`, feasible ones
    ranked, each `equivalence_key` once as the search lists them unless not `distinct_plans`
    (the reference for tests)."""
    out = []
    for group in groups_of(space, workload):
        for replicas in replica_choices(group, space, devices):
            prediction = predict_plan(workload, system, group.plan(space, replicas))
            if prediction.fits:
                out.append((prediction, equivalence_key(group, replicas, space)))
    price = system.price_per_device_hour or 1.0

    def key(entry: tuple[Prediction, object]) -> tuple[float, int, str]:
        p = entry[0]
        first = p.step_time_s if objective == "time" else p.step_time_s * p.plan.workers * price
        return first, p.plan.workers, p.label()

    ranked = sorted(out, key=key)
    return [p for p, _ in (distinct(ranked, lambda entry: entry[1]) if distinct_plans
                           else ranked)]
