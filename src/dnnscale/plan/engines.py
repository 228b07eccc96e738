"""What each training engine can run: the one place of the engine limits, read by the GPU-plan
search (`optimize --engine`, and the engines a winner runs on) and by `export --to` alike.

Two kinds of fact, both as plan/rules.py `Violation`s (field relative to the plan):

- `engine_violation`: the engine cannot run the plan (no option for it, or its start-up
  asserts against it); `export` refuses it.
- `engine_difference`: the engine runs the plan, but not as the plan was priced (it always does
  one fixed thing); `export` goes on with a note, and `optimize --engine` leaves such plans out,
  so that the plan it prices is the one that runs.

The facts and their sources (each engine's own code; docs/export.md gives the option lines):

- Megatron-LM (NVIDIA/Megatron-LM, megatron/training/arguments.py, core/pipeline_parallel/
  schedules.py): pipelines run 1F1B, or interleaved 1F1B with virtual stages; there is no GPipe
  schedule and no TF32 switch; fp32 training reduces fp32 gradients. ZeRO-1 is the distributed
  optimizer, ZeRO-2/3 Megatron-FSDP, refused with pp > 1 conservatively: its v2 adapter
  (core/distributed/fsdp/mcore_fsdp_adapter.py) raises for pipeline_model_parallel_size != 1,
  its documentation (docs/user-guide/features/megatron_fsdp.md) lists no pipeline support, and
  v1, the default, has no check either way.
- DeepSpeed, through Megatron-DeepSpeed (deepspeedai/DeepSpeed, deepspeed/runtime/pipe/
  engine.py, schedule.py): the PipelineEngine runs one schedule, TrainSchedule (1F1B); it
  asserts ZeRO stage < 2 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"); it
  turns the backward all-reduce off and reduces the gradients in a ReduceGrads step after the
  last micro-batch, so nothing overlaps the backward pass with pp > 1; without a pipeline the
  reduction overlaps the backward only in the ZeRO optimizers (zero_optimization.overlap_comm).
  ds_config has bf16 and fp16 blocks, no TF32. Without ZeRO it holds, accumulates and reduces
  a 16-bit model's gradients in the model's dtype: its engine refuses
  data_types.grad_accum_dtype fp32 there (runtime/engine.py, _do_optimizer_sanity_check:
  "unsupported mix of model_dtype and grad_accum_dtype"), and communication_data_type defaults
  to the model's dtype; under ZeRO 1-3 ds_config can ask for fp32 (export/deepspeed.py does).
- torchtitan 0.2 (pytorch/torchtitan v0.2.2, torchtitan/config/job_config.py,
  models/llama3/infra/parallelize.py): data parallelism is DDP (data_parallel_replicate_degree)
  or FSDP2 (data_parallel_shard_degree), which shards the weights too, so there is no ZeRO-1;
  DDP runs only as the sole parallelism ("DDP has not supported > 1D parallelism"), so with
  tp or pp > 1 replicas shard (ZeRO-2/3); FSDP2 composes with TP and PP. It trains in bfloat16
  or float32 (mixed_precision_param), no fp16 or TF32, and always reduces in float32
  (mixed_precision_reduce), overlaps data-parallel communication with computation, and shards
  the norms over the sequence with tensor parallelism (SequenceParallel).
- No engine reduces 1-byte gradients or has a TF32 option.

Expert parallelism (ep) and context parallelism (cp, by ring attention or all-to-all), checked
at NVIDIA/Megatron-LM d98e8a64, deepspeedai/Megatron-DeepSpeed 4efb479d with DeepSpeed 0.19.8,
and pytorch/torchtitan v0.2.2 (73a0e697); docs/export.md gives the option lines:

- Megatron-LM runs both: --expert-model-parallel-size (core/model_parallel_config.py; the
  experts split over a sub-group of DP · CP, so DP = world / (TP · PP · CP) = dp · ep), and
  --context-parallel-size with --cp-comm-type p2p (ring attention: K/V blocks exchanged in a
  ring, overlapped with attention) or a2a ("like DeepSpeed Ulysses", core/transformer/
  transformer_config.py; training/arguments.py defines the option, default p2p). Its MoE layer
  raises a ValueError in training when the attention's tensor-parallel group is above 1 without
  sequence parallelism (core/transformer/moe/moe_layer.py, forward); validate_args asserts the
  sequence length a multiple of 2 · cp whatever --cp-comm-type.
- DeepSpeed (Megatron-DeepSpeed, megatron/arguments.py) runs MoE as DeepSpeed-MoE
  (--num-experts, --moe-expert-parallel-size; expert groups over the data-parallel ranks,
  deepspeed/utils/groups.py) but not under ZeRO-3 (runtime/engine.py: "Native DeepSpeed MoE is
  not supported with ZeRO Stage 3"), and context parallelism only as DeepSpeed-Ulysses
  (--ds-sequence-parallel-size: all-to-alls around the attention, deepspeed/sequence/layer.py),
  so ring attention has no option; Ulysses runs without tensor or pipeline parallelism
  (megatron/core/parallel_state.py asserts "DeepSpeed's sequence parallel does not work with
  tensor parallel or pipeline parallel"), and together with ep is refused conservatively: the
  expert groups are built over world / (TP · PP) ranks (groups.py, _get_expert_parallel_ranks)
  without regard to the sequence-parallel group. Its one shared-expert form is the residual MoE
  (--mlp-type residual: one dense MLP as wide as an expert).
- torchtitan 0.2 (config/job_config.py, distributed/parallel_dims.py): expert_parallel_degree
  with expert_tensor_parallel_degree (1 or tp) borrows ep from the FSDP dimension (its expert
  mesh is efsdp = dp_shard · cp · tp / (etp · ep)), and context_parallel_degree turns FSDP on
  whatever dp_shard is (fsdp_enabled = dp_shard > 1 or cp > 1), so both need zero 2 or 3; its
  context parallelism is ring attention over SDPA (context_parallel_rotate_method "allgather"
  or "alltoall" picks how K/V shards move: torch's _AllToAllRotater passes them to the next
  rank, _AllGatherRotater gathers them at once), no head split, so the all-to-all (Ulysses)
  algorithm has no option; the sequence must divide by tp · 2 · cp (parallelize.py asserts
  ParallelDims.seq_len_divisor). Its MoE (models/moe/moe.py) is dropless token choice, no
  capacity factor, with shared experts as wide as a multiple of one routed expert.

Gradient accumulation (plan/plan.py GRAD_ACCUMULATION, priced by model/accumulation.py):
Megatron-LM fuses it into the weight-gradient GEMMs by default (--gradient-accumulation-fusion,
megatron/core/tensor_parallel/layers.py) and adds through autograd with
--no-gradient-accumulation-fusion; DeepSpeed (its engine's backward leaves the micro-batches'
gradients to autograd's .grad accumulation, or to its ZeRO optimizers' gradient partitions) and
torchtitan (DDP or FSDP2 under autograd) always add; TensorFlow 1 BERT's per-micro-batch
clipping ('clip_add') is no engine's.

Pipeline sends (Pipeline.scatter_gather, PP_WHOLE_SENDS): DeepSpeed's pipeline engine
partitions each boundary tensor over the tensor group by default and its ds_config switches it
(the export writes the plan's choice; off for MoE, which GPTModelPipe asserts); Megatron-Core
and torchtitan send the tensor a member holds whole and have no switch (an engine difference).

`workload_violation` holds the limits that read the workload's shape too (MoE or not).
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.errors import InputError, short_repr
from dnnscale.plan.plan import MICRO_PIPELINE, USERBUFFERS, Collective, ParallelPlan
from dnnscale.plan.rules import Violation, require
from dnnscale.workload.transformer_kinds import AMP_NAMES, LOSS_KERNEL_NAMES
from dnnscale.workload.transformer_shape import TransformerShape

ENGINES = ("megatron", "deepspeed", "torchtitan")
ENGINE_NAMES = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan"}
TORCHTITAN_GRAD_BYTES = 4
"""torchtitan's mixed_precision_reduce has one value, float32: 4 bytes per gradient value."""


@dataclass(frozen=True)
class EngineFacts:
    """What an engine's limits read of a plan: tp and pp degrees, whether there are several
    data-parallel replicas (no limit reads more of dp, so the search checks a group at one and
    at several replicas only), the schedule, the ZeRO stage, overlap of data-parallel
    communication, sequence parallelism, the compute precision, the bytes per gradient value
    reduced, and the expert and context parallel degrees with the context-parallel algorithm
    (plan/plan.py CP_ALGORITHMS)."""

    tp: int
    pp: int
    replicated: bool
    schedule: str
    zero: int
    overlap_dp: bool
    sequence_parallel: bool
    compute: str
    grad_bytes: int | None
    """None: the workload's own width."""
    ep: int = 1
    cp: int = 1
    cp_algorithm: str = "ring"
    etp: int | None = None
    """The experts' tensor split where it is not tp (None: tp)."""
    overlap_tp: bool = False
    """The tensor-parallel exchanges run in chunks under the GEMMs (TensorSplit.overlap)."""
    overlap_tp_method: str = USERBUFFERS
    """How they do (TensorSplit.overlap_method, plan/plan.py TP_OVERLAP_METHODS)."""
    overlap_pp: bool = False
    """The pipeline's sends overlap compute (Pipeline.overlaps_p2p)."""
    pp_scatter_gather: bool = False
    """Each tensor member sends 1/tp of a boundary tensor, all-gathered by the receivers
    (Pipeline.scatter_gather)."""
    zero3_fetch: str = "blocks"
    """ZeRO-3's gather granularity (Collective.fetch, plan/plan.py ZERO3_FETCH)."""
    grad_accumulation: str = "fused"
    """How the micro-batches' gradients accumulate (Batch.grad_accumulation)."""
    micro_batches: int = 1
    """Micro-batches per step (Batch.accumulation)."""
    recompute: str = "none"
    """Activation recomputation (MemoryPolicy.recompute)."""
    loss: str = "inplace"
    """How the loss is computed (MemoryPolicy.loss, workload/transformer_kinds.py LOSS_KERNELS)."""
    amp: str = "half"
    """How the memory-bound kernels of a 16-bit plan run (Precision.amp,
    workload/transformer_kinds.py AMP_MODES)."""


def plan_facts(plan: ParallelPlan) -> EngineFacts:
    """The EngineFacts of a Megatron-style plan (a parameter server counts as ZeRO-0).
    Replicated: the dense gradients meet over more than one member (dp · ep · cp > 1)."""
    aggregation = plan.data.aggregation
    collective = aggregation if isinstance(aggregation, Collective) else Collective()
    return EngineFacts(plan.tensor.degree, plan.pipeline.stages, plan.dense_replicas > 1,
                       plan.pipeline.schedule, collective.zero_stage, collective.overlap,
                       plan.tensor.sequence_parallel, plan.precision.compute,
                       plan.precision.grad_bytes, ep=plan.expert.degree,
                       cp=plan.context.degree, cp_algorithm=plan.context.algorithm,
                       etp=plan.expert.tensor, overlap_tp=plan.tensor.overlap,
                       overlap_tp_method=plan.tensor.overlap_method,
                       overlap_pp=plan.pipeline.overlaps_p2p, zero3_fetch=collective.fetch,
                       pp_scatter_gather=plan.pipeline.scatter_gather,
                       grad_accumulation=plan.batch.grad_accumulation,
                       micro_batches=plan.batch.accumulation, recompute=plan.memory.recompute,
                       loss=plan.memory.loss, amp=plan.precision.amp)


def check_engine(engine: object, field: str = "engine") -> str:
    """`engine` if it is one of ENGINES, else an InputError naming `field`."""
    if not isinstance(engine, str) or engine not in ENGINES:
        raise InputError(field, f"must be one of {', '.join(ENGINES)}, got {short_repr(engine)}")
    return engine


def _megatron(f: EngineFacts) -> Violation | None:
    name = ENGINE_NAMES["megatron"]
    if f.pp > 1 and f.schedule == "gpipe":
        return Violation("schedule", f"{name} has no GPipe schedule (its pipelines run 1F1B, or "
                         f"interleaved 1F1B with virtual stages); use 1f1b")
    if f.compute == "fp32" and f.grad_bytes != 4:
        return Violation("grad_bytes", f"{name} reduces fp32 gradients in fp32 (4 bytes), got "
                         f"{f.grad_bytes}")
    if f.schedule == "interleaved" and 1 < f.pp <= 2 and not f.overlap_pp:
        return Violation("overlap_pp", f"{name} asserts pp > 2 for the interleaved schedule "
                         f"without p2p overlap (two stages would send and receive twice between "
                         f"the same ranks in one batch); use overlap_pp true or pp > 2")
    if f.zero >= 2 and f.pp > 1:
        return Violation("zero", f"{name} shards gradients (ZeRO-{f.zero}, Megatron-FSDP) within "
                         f"one pipeline stage only (its FSDP adapter refuses pp > 1); use "
                         f"zero 0 or 1 with a pipeline")
    return None


def _deepspeed(f: EngineFacts) -> Violation | None:
    name = ENGINE_NAMES["deepspeed"]
    if f.pp > 1 and f.schedule != "1f1b":
        return Violation("schedule", f"{name}'s pipeline engine runs one schedule, 1F1B (its "
                         f"TrainSchedule); {f.schedule} has no {name} option")
    if f.zero >= 2 and f.pp > 1:
        return Violation("zero", f"{name}'s pipeline engine runs ZeRO-0 or ZeRO-1 only "
                         f"(PipelineEngine asserts that ZeRO-2 and ZeRO-3 are incompatible "
                         f"with pipeline parallelism); got ZeRO-{f.zero} with pp = {f.pp}")
    if f.overlap_dp and f.pp > 1:
        return Violation("overlap_dp", f"{name}'s pipeline engine reduces gradients after the "
                         f"last micro-batch (its ReduceGrads step), never during the backward "
                         f"pass; use overlap_dp false with pp > 1")
    if f.overlap_dp and f.zero == 0:
        return Violation("overlap_dp", f"{name} overlaps gradient reduction with the backward "
                         f"pass only under ZeRO (zero_optimization.overlap_comm); use zero >= 1 "
                         f"or overlap_dp false")
    if f.overlap_tp:
        return Violation("overlap_tp", f"{name}'s tensor parallelism runs its exchanges after "
                         f"the GEMMs (no userbuffers overlap, no --tp-comm-overlap option); use "
                         f"overlap_tp false")
    return _deepspeed_context(f) if f.cp > 1 else None


def _deepspeed_context(f: EngineFacts) -> Violation | None:
    """DeepSpeed's context parallelism is DeepSpeed-Ulysses (--ds-sequence-parallel-size)."""
    name = ENGINE_NAMES["deepspeed"]
    if f.cp_algorithm != "alltoall":
        return Violation("cp_algorithm", f"{name}'s context parallelism is DeepSpeed-Ulysses "
                         f"(--ds-sequence-parallel-size: all-to-alls around the attention); "
                         f"ring attention has no {name} option: use cp_algorithm alltoall")
    if f.tp > 1 or f.pp > 1:
        return Violation("cp", f"DeepSpeed-Ulysses runs without tensor or pipeline parallelism "
                         f"(Megatron-DeepSpeed's parallel_state asserts it); got cp {f.cp} with "
                         f"tp {f.tp} × pp {f.pp}")
    if f.ep > 1:
        return Violation("ep", f"{name} builds its expert-parallel groups over world / (TP·PP) "
                         f"ranks without regard to the Ulysses group (utils/groups.py), not the "
                         f"plan's ep × cp layout; use ep 1 or cp 1")
    return None


def _torchtitan(f: EngineFacts) -> Violation | None:
    name = ENGINE_NAMES["torchtitan"]
    if f.compute == "fp16":
        return Violation("precision", f"{name} trains in bfloat16 or float32 "
                         f"(training.mixed_precision_param); fp16 has no {name} option")
    if f.zero == 1:
        return Violation("zero", f"{name} has no ZeRO-1: its sharded data parallelism (FSDP2) "
                         f"shards the weights as well; use zero 0 (replicated), 2 or 3")
    if f.zero == 0 and f.replicated and f.tp * f.pp > 1:
        return Violation("zero", f"{name}'s DDP (zero 0) runs only as the sole parallelism "
                         f"(\"DDP has not supported > 1D parallelism\"); with tp {f.tp} × pp "
                         f"{f.pp} use zero 2 or 3 (FSDP2)")
    if f.cp > 1 and f.cp_algorithm != "ring":
        return Violation("cp_algorithm", f"{name}'s context parallelism is ring attention over "
                         f"SDPA (context_parallel_rotate_method only picks how K/V shards move); "
                         f"the all-to-all (Ulysses) head split has no {name} option: use "
                         f"cp_algorithm ring")
    if f.zero == 0 and f.cp > 1:
        return Violation("zero", f"{name} shards the weights with FSDP2 whenever cp > 1 (its "
                         f"FSDP mesh is dp_shard × cp); use zero 2 or 3 with cp {f.cp}")
    if f.zero == 0 and f.ep > 1:
        return Violation("zero", f"{name}'s expert parallelism borrows ep from the FSDP2 "
                         f"dimension (experts sharded over dp_shard · cp / ep); use zero 2 or "
                         f"3 with ep {f.ep}")
    return None


_LIMITS = {"megatron": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan}
NO_TF32 = {"megatron": "without --bf16 or --fp16 it trains in fp32, and PyTorch's allow_tf32 "
                       "setting decides the matmuls; use fp32, bf16, fp16 or fp8",
           "deepspeed": "ds_config has bf16 and fp16 blocks; without them it trains in fp32",
           "torchtitan": "float32 training leaves the matmuls to PyTorch's allow_tf32; use fp32 "
                         "or bf16"}
"""Why no engine has a TF32 option, per engine."""


def engine_violation(engine: str, facts: EngineFacts) -> Violation | None:
    """Why `engine` cannot run a plan with these facts (None: it can)."""
    name = ENGINE_NAMES[engine]
    if facts.grad_bytes == 1:
        return Violation("grad_bytes", f"1-byte gradient reduction has no {name} option "
                         f"(gradients are reduced in 2 or 4 bytes)")
    if facts.compute == "tf32":
        return Violation("precision", f"{name} has no TF32 option ({NO_TF32[engine]})")
    if facts.grad_accumulation == "clip_add":
        return Violation("grad_accumulation", f"{name} has no per-micro-batch gradient "
                         f"clipping (clip_add is TensorFlow 1 BERT's optimizer); use "
                         f"{ENGINE_GRAD_ACCUMULATION[engine]}")
    if facts.recompute == "op" and engine != "torchtitan":
        return Violation("recompute", f"{name} has no per-operation checkpointing (op is "
                         f"torchtitan's selective_ac_option); use none, selective or full")
    if facts.etp not in (None, 1) and engine in ETP_OFF_OR_TP:
        return Violation("etp", f"{name}'s experts are split over the whole tensor group or not "
                         f"at all ({ETP_OFF_OR_TP[engine]}): etp is tp = {facts.tp} or 1, not "
                         f"{facts.etp}")
    return _LIMITS[engine](facts)


ETP_OFF_OR_TP = {
    "deepspeed": "--enable-expert-tensor-parallelism or not, Megatron-DeepSpeed "
                 "megatron/arguments.py",
    "torchtitan": "parallel_dims.py asserts ETP=TP or ETP=1"}
"""Engines whose expert tensor parallelism is tp or 1 (Megatron-LM's
--expert-tensor-parallel-size takes any divisor)."""


def workload_violation(engine: str, facts: EngineFacts,
                       shape: TransformerShape) -> Violation | None:
    """Why `engine` cannot run the workload of `shape` under a plan with these facts (None: it
    can). The field is a plan field (relative to the plan) where another plan would run; ''
    where no plan does: the engine has no option for the shape itself."""
    if engine == "torchtitan":
        divisor = facts.tp * 2 * facts.cp
        if shape.seq % divisor:
            return Violation("cp" if facts.cp > 1 else "tp", f"torchtitan needs the sequence "
                             f"length divisible by tp × 2 × cp = {divisor} (sequence "
                             f"parallelism and the load-balanced context split); seq "
                             f"{shape.seq} is not")
    if engine == "megatron" and facts.cp > 1 and shape.seq % (2 * facts.cp):
        return Violation("cp", f"Megatron-LM asserts the sequence length is a multiple of 2 × "
                         f"cp = {2 * facts.cp} with context parallelism (every --cp-comm-type); "
                         f"seq {shape.seq} is not")
    # Megatron-DeepSpeed asserts cp divides seq (pretrain_gpt.py:138): plan/rules.context_splits
    # refuses that plan for every engine (Ulysses holds s / cp tokens a member)
    if not shape.is_moe:
        return None
    if engine == "megatron":
        if facts.tp > 1 and not facts.sequence_parallel:
            return Violation("sequence_parallel", "Megatron-LM's MoE layer refuses to train "
                             "with tensor parallelism but no sequence parallelism "
                             "(moe_layer.py); use sequence_parallel true with tp > 1")
        return None
    if shape.dense_blocks and engine == "torchtitan":
        return Violation("", f"the export's torchtitan MoE model (llama4, every block a "
                         f"mixture) has no dense blocks of their own width; the workload's "
                         f"blocks {list(shape.dense_blocks)[:8]} are dense (Megatron-LM's "
                         f"--moe-layer-freq takes them)")
    if engine == "deepspeed" and shape.dense_blocks and (
            moe_interval(shape) is None or shape.ffn != shape.routed_ffn):
        return Violation("", f"Megatron-DeepSpeed's --expert-interval N puts a mixture of "
                         f"experts in every N-th block only, its dense blocks as wide as an "
                         f"expert (--ffn-hidden-size); the workload's dense blocks "
                         f"{list(shape.dense_blocks)[:8]} (of width {shape.ffn}, experts "
                         f"{shape.routed_ffn}) are not that (Megatron-LM's --moe-layer-freq "
                         f"takes them)")
    if engine == "deepspeed":
        if facts.zero == 3:
            return Violation("zero", "DeepSpeed's MoE is not supported with ZeRO-3 (its engine "
                             "asserts \"Native DeepSpeed MoE is not supported with ZeRO Stage "
                             "3\"); use zero 0, 1 or 2")
        if facts.pp_scatter_gather and facts.pp > 1 and facts.tp > 1:
            return Violation("pp_scatter_gather", "Megatron-DeepSpeed's GPTModelPipe asserts "
                             "pipe_partitioned and grad_partitioned off for a mixture of "
                             "experts with pp and tp > 1 (megatron/model/gpt_model.py); use "
                             "pp_scatter_gather false")
        if shape.shared_ffn not in (0, shape.routed_ffn):
            return Violation("", f"DeepSpeed's one shared expert is the residual MoE's dense MLP, "
                             f"as wide as a routed expert ({shape.routed_ffn}); a shared width "
                             f"of {shape.shared_ffn} has no DeepSpeed option")
        return None
    if shape.capacity_factor is not None:
        return Violation("", f"torchtitan's MoE is dropless token choice (no capacity factor); "
                         f"the workload drops tokens above {shape.capacity_factor:g}× the mean "
                         f"(give capacity_factor null)")
    if shape.shared_ffn % shape.routed_ffn:
        return Violation("", f"torchtitan's shared experts are num_shared_experts MLPs as wide "
                         f"as a routed expert ({shape.routed_ffn}); a shared width of "
                         f"{shape.shared_ffn} is not a multiple of it")
    return None


def moe_interval(shape: TransformerShape) -> int | None:
    """N where block i (from 0) is a mixture of experts exactly when (i + 1) % N == 0 — the only
    patterns Megatron-DeepSpeed (--expert-interval: MoE where layer_number % interval == 0,
    megatron/model/transformer.py get_num_experts_per_layer) and torchtitan's llama4
    (interleave_moe_layer_step) express — else None (1: every block)."""
    if not shape.is_moe:
        return None
    moe = [shape.is_moe_block(i) for i in range(shape.layers)]
    first = moe.index(True) + 1
    return first if all(m == ((i + 1) % first == 0) for i, m in enumerate(moe)) else None


def workload_differences(engine: str, facts: EngineFacts,
                         shape: TransformerShape) -> tuple[Violation, ...]:
    """How `engine` runs the workload of `shape` otherwise than the plan priced it (field
    relative to the plan; '' for the workload); empty where it runs as priced."""
    if engine != "deepspeed":
        return ()
    found = []
    if facts.recompute == "selective" and shape.flash_attention:
        # megatron/model/transformer.py, ParallelAttention.forward: only the unfused core
        # attention goes through _checkpointed_attention_forward
        found.append(Violation("recompute", "Megatron-DeepSpeed keeps flash attention out of "
                               "its selective checkpoint, so selective recomputes nothing "
                               "there, where the plan priced the kernel's forward run again: "
                               "use recompute none"))
    if shape.is_moe and shape.capacity_factor is not None:
        factor = shape.capacity_factor
        found.append(Violation("", f"DeepSpeed-MoE pads every expert's tokens to its capacity "
                               f"({factor:g}× the mean, at least --moe-min-capacity 4): each "
                               f"expert computes and exchanges {factor:g}× the mean routed "
                               f"tokens, where the plan priced the busiest member's "
                               f"min(expert_imbalance, {factor:g})× the mean and the rest "
                               f"below it"))
    return tuple(found)


def eager_kinds(shape: TransformerShape) -> tuple[str, ...]:
    """The element-wise code of `shape` whose price `eager` changes, in words: its RMSNorms,
    a gated activation and RoPE (TransformerShape.eager)."""
    return tuple(word for word, present in (("RMSNorm", shape.norm == "rmsnorm"),
                                            ("SwiGLU", shape.gated),
                                            ("RoPE", shape.positional == "rope")) if present)


def elementwise_difference(engine: str, facts: EngineFacts,
                           shape: TransformerShape) -> Violation | None:
    """How `engine` runs the element-wise code the workload priced fused or op by op
    (TransformerShape.eager), where it differs: an export's note. Not a reason for the search
    to leave a plan out (`workload_differences`): it is the workload's, the same for every
    plan of the engine, a few per cent of a step.

    Megatron-LM fuses all three (Transformer Engine's RMSNorm, fused bias_swiglu, RoPE fusion
    on unless --no-rope-fusion: megatron/training/arguments.py at d98e8a64). Megatron-DeepSpeed
    fuses the RMSNorm (Apex's MixedFusedRMSNorm where Apex is installed:
    megatron/model/__init__.py at 4efb479d) and runs SwiGLU (F.silu(x[0]) * x[1]) and RoPE
    (rotate_half) as PyTorch operations (megatron/model/transformer.py,
    rotary_pos_embedding.py). torchtitan runs everything op by op unless compiled; its export
    compiles the model unless the workload is eager, and async TP needs the compiler."""
    kinds = eager_kinds(shape)
    if not kinds:
        return None
    name = ENGINE_NAMES[engine]
    if engine == "megatron" and shape.eager:
        return Violation("", f"{name} runs {', '.join(kinds)} as fused kernels, where the "
                         "workload priced them op by op (eager): use eager false")
    if engine == "deepspeed":
        if shape.eager and "RMSNorm" in kinds:
            return Violation("", f"{name} runs its RMSNorm fused (Apex's MixedFusedRMSNorm), "
                             "where the workload priced it op by op (eager)")
        loose = [kind for kind in kinds if kind != "RMSNorm"]
        if not shape.eager and loose:
            return Violation("", f"{name} runs {' and '.join(loose)} as PyTorch operations, "
                             "where the workload priced fused kernels: a few per cent of the "
                             "step more than predicted (eager true prices them so, and the "
                             "RMSNorm op by op too)")
    if engine == "torchtitan" and shape.eager and facts.overlap_tp:
        return Violation("overlap_tp", f"{name} compiles the model for async TP, which fuses "
                         f"{', '.join(kinds)}, where the workload priced them op by op "
                         "(eager): use eager false")
    return None


ENGINE_GRAD_ACCUMULATION = {"megatron": "fused", "deepspeed": "add", "torchtitan": "add"}
"""How each engine accumulates gradients by default (module docstring; Megatron-LM also runs
'add' with --no-gradient-accumulation-fusion)."""


SIXTEEN_BIT_COMPUTE = ("bf16", "fp8", "fp16")
"""Compute precisions whose model weights are 16-bit (fp8 trains bf16 weights)."""


def wide_accumulation(compute: str, grad_bytes: int | None) -> bool:
    """Whether a plan accumulates 4-byte gradients for a 16-bit model (bf16, fp8's bf16
    weights, fp16): DeepSpeed does so only when told (data_types.grad_accum_dtype fp32; its
    default is the model's dtype)."""
    return compute in SIXTEEN_BIT_COMPUTE and grad_bytes == 4


DEEPSPEED_UNSHARDED_GRAD_BYTES = 2
"""Bytes per gradient value DeepSpeed without ZeRO holds, accumulates and reduces for a 16-bit
model: the model's dtype (module docstring, DeepSpeed)."""


def _deepspeed_width_difference(facts: EngineFacts) -> Violation | None:
    """DeepSpeed without ZeRO runs a 16-bit model's gradients at 2 bytes (it refuses fp32
    accumulation outside ZeRO); a plan priced with 4-byte gradients there runs otherwise."""
    if facts.zero or not wide_accumulation(facts.compute, facts.grad_bytes):
        return None
    return Violation("grad_bytes", f"DeepSpeed without ZeRO holds and accumulates a "
                     f"{facts.compute} model's gradients in its 16-bit dtype (its engine refuses "
                     f"data_types.grad_accum_dtype fp32 outside ZeRO), where the plan priced "
                     f"4-byte gradients (communication_data_type fp32 casts them for the "
                     f"all-reduce only): use grad_bytes {DEEPSPEED_UNSHARDED_GRAD_BYTES}, or "
                     f"zero >= 1")


def _grad_accumulation_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where `engine` accumulates a plan's micro-batches otherwise than it was priced: DeepSpeed
    and torchtitan cannot fuse (Megatron runs 'add' too, with a flag)."""
    runs = ENGINE_GRAD_ACCUMULATION[engine]
    if facts.micro_batches <= 1 or facts.grad_accumulation == runs or engine == "megatron":
        return None
    return Violation("grad_accumulation", f"{ENGINE_NAMES[engine]} adds each micro-batch's "
                     f"gradients into the ones held (autograd's accumulation: 3 x grad_bytes "
                     f"per parameter per micro-batch); the plan priced grad_accumulation "
                     f"{facts.grad_accumulation}: use grad_accumulation {runs}")


ENGINE_LOSS = {"megatron": "inplace", "deepspeed": "inplace", "torchtitan": "torch"}
"""How each engine computes a language model's loss (workload/transformer_kinds.py
LOSS_KERNELS): Megatron-LM and Megatron-DeepSpeed with their vocabulary-parallel
cross-entropy (Megatron-LM's --cross-entropy-loss-fusion keeps the same fp32 softmax;
Megatron-DeepSpeed, 4efb479d, subtracts the max into a new fp32 tensor, 4 bytes a logit more
at its forward's peak, not priced apart), torchtitan with torch's cross_entropy on an fp32
cast (components/loss.py)."""

def _loss_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where `engine` computes the loss otherwise than the plan priced its memory."""
    runs = ENGINE_LOSS[engine]
    if facts.loss == runs:
        return None
    return Violation("loss", f"{ENGINE_NAMES[engine]} computes the loss with "
                     f"{LOSS_KERNEL_NAMES[runs]}; "
                     f"the plan priced loss {facts.loss}: use loss {runs}")


ENGINE_AMP = "half"
"""How every engine runs a 16-bit plan's memory-bound kernels (workload/transformer_kinds.py
AMP_MODES): on the model cast to 16 bits. Megatron-LM and Megatron-DeepSpeed wrap the model in
Float16Module (megatron/core/transformer/module.py at d98e8a64), DeepSpeed's engine casts it
(deepspeed/runtime/engine.py _configure_distributed_model: module.half() under fp16,
module.bfloat16() under bf16), torchtitan's FSDP2 runs its parameters in
training.mixed_precision_param, bf16 by default (models/llama3/parallelize.py,
MixedPrecisionPolicy param_dtype); none runs torch.autocast around it."""


def _amp_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where `engine` runs a plan's memory-bound kernels otherwise than it was priced."""
    if facts.amp == ENGINE_AMP:
        return None
    return Violation("amp", f"{ENGINE_NAMES[engine]} runs {AMP_NAMES[ENGINE_AMP]}, every "
                     f"kernel on 16-bit values; the plan priced amp {facts.amp} "
                     f"({AMP_NAMES[facts.amp]}): use amp {ENGINE_AMP}")


ENGINE_ZERO3_FETCH = {"megatron": "blocks", "deepspeed": "buckets", "torchtitan": "blocks"}
"""How each engine's ZeRO-3 gathers (plan/plan.py ZERO3_FETCH): DeepSpeed's stage 3 in its
prefetch and reduce buckets (deepspeed/runtime/zero/partitioned_param_coordinator.py,
stage3.py); torchtitan's FSDP2 per transformer block (models/llama3/infra/parallelize.py
applies fully_shard to each block); Megatron-FSDP per FSDP unit module, the transformer layer
(megatron/core/distributed/fsdp, fsdp_unit_modules)."""


def _zero3_fetch_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where `engine`'s ZeRO-3 gathers otherwise than the plan priced."""
    runs = ENGINE_ZERO3_FETCH[engine]
    if facts.zero != 3 or not facts.replicated or facts.zero3_fetch == runs:
        return None
    how = ("in buckets: all-gathers of stage3_prefetch_bucket_size parameters ahead of use, "
           "gradients reduce-scattered in reduce_bucket_size buckets" if runs == "buckets" else
           "one all-gather and one reduce-scatter per transformer block")
    return Violation("zero3_fetch", f"{ENGINE_NAMES[engine]}'s ZeRO-3 gathers {how}; the plan "
                     f"priced zero3_fetch {facts.zero3_fetch}: use zero3_fetch {runs}")


PP_WHOLE_SENDS = {
    "megatron": "Megatron-LM (Megatron-Core) sends the whole boundary tensor each tensor member "
                "holds between pipeline stages (s/tp of the sequence under sequence "
                "parallelism, all of it without; core/pipeline_parallel/schedules.py "
                "get_tensor_shapes)",
    "torchtitan": "torchtitan's pipeline stages (torch.distributed.pipelining) send each "
                  "member's local output whole (s/tp of the sequence under its sequence "
                  "parallelism)"}
"""The engines whose pipeline stages never send 1/tp of the boundary tensor a tensor member
holds (Pipeline.scatter_gather), and how they send: Megatron-Core the tensor whole, (s/cp, b,
h), or (s/(cp·tp), b, h) under sequence parallelism (no scatter-gather option since Megatron-LM's
legacy --no-scatter-gather-tensors-in-pipeline); torchtitan its sequence-sharded tensors. Every
other engine partitions by default: DeepSpeed's PipelineEngine (runtime/config.py:
pipeline.pipe_partitioned and grad_partitioned true; the export writes the plan's choice)."""


def _pp_scatter_gather_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where an engine sends whole boundary tensors that the plan priced partitioned."""
    if engine not in PP_WHOLE_SENDS or not facts.pp_scatter_gather or facts.pp <= 1 or \
            facts.tp <= 1:
        return None
    return Violation("pp_scatter_gather", f"{PP_WHOLE_SENDS[engine]}; the plan priced 1/tp of "
                     f"it sent and all-gathered: use pp_scatter_gather false")


def priced_pp_scatter_gather(engine: str | None, shape: TransformerShape | None) -> bool:
    """Whether `optimize --engine` prices partitioned pipeline sends: the engine's default
    (on unless it is in PP_WHOLE_SENDS), off for DeepSpeed's mixtures of experts
    (workload_violation), and off without an engine (Megatron-Core's whole tensors)."""
    if engine is None or (shape is not None and shape.is_moe):
        return False
    return engine not in PP_WHOLE_SENDS


ENGINE_TP_OVERLAP = {"megatron": USERBUFFERS, "torchtitan": MICRO_PIPELINE}
"""How each engine overlaps its tensor-parallel exchanges with the GEMMs (plan/plan.py
TP_OVERLAP_METHODS; DeepSpeed has no such option): Megatron-LM's --tp-comm-overlap runs
Transformer Engine's userbuffers over every linear layer's exchanges (its fused linear_qkv and
linear_fc1 make one GEMM of each gradient); torchtitan's enable_async_tensor_parallel turns on
torch's micro-pipeline pass (torchtitan 9dec370, parallelisms/parallelize_llama.py apply_tp:
torch._inductor.config._micro_pipeline_tp), whose fuse_matmul_reduce_scatter needs the reduce-
scatter's input to be one matmul's output (_find_producer_matmul). apply_tp gathers the
attention's and the feed-forward's input once for their separate wq / wk / wv and w1 / w3
(models/llama/model.py), so the gradient reduce-scattered in backward is their sum."""


def _tp_overlap_difference(engine: str, facts: EngineFacts) -> Violation | None:
    """Where `engine` overlaps the tensor-parallel exchanges otherwise than the plan priced."""
    runs = ENGINE_TP_OVERLAP.get(engine)
    if runs is None or not facts.overlap_tp or facts.overlap_tp_method == runs:
        return None
    how = ("fuses each all-gather with the matmuls that read it and each reduce-scatter with "
           "the one matmul that produces it (torch's async TP), so the backward reduce-"
           "scatters after the separate Q, K, V and gate/up projections stay exposed"
           if runs == MICRO_PIPELINE else
           "hides every exchange of the linear layers under their GEMMs (Transformer Engine's "
           "userbuffers)")
    return Violation("overlap_tp_method", f"{ENGINE_NAMES[engine]} {how}; the plan priced "
                     f"overlap_tp_method {facts.overlap_tp_method}: use overlap_tp_method {runs}")


def engine_differences(engine: str, facts: EngineFacts) -> tuple[Violation, ...]:
    """How `engine` runs a plan it can run otherwise than the plan was priced (torchtitan's
    fixed behaviour, DeepSpeed's gradient width without ZeRO, each engine's ZeRO-3
    granularity, tensor-parallel overlap, accumulation, loss and mixed-precision mode); empty for the plans it runs as
    priced."""
    fixed: list[Violation | None] = (
        list(_torchtitan_differences(facts)) if engine == "torchtitan" else
        [_deepspeed_width_difference(facts)] if engine == "deepspeed" else [])
    found = (_zero3_fetch_difference(engine, facts), _tp_overlap_difference(engine, facts),
             _pp_scatter_gather_difference(engine, facts), *fixed,
             _grad_accumulation_difference(engine, facts), _loss_difference(engine, facts),
             _amp_difference(engine, facts))
    return tuple(violation for violation in found if violation is not None)


def _torchtitan_differences(facts: EngineFacts) -> list[Violation]:
    """torchtitan's fixed behaviour where the plan priced another: its float32 reduction,
    its overlapped data parallelism and pipeline sends, its sequence-sharded norms, and its
    selective activation checkpointing, which is per operation (torchtitan v0.2.2,
    distributed/activation_checkpoint.py: the policy saves the outputs of the ops in
    models/llama3/infra/parallelize.py's _op_sac_save_list, mm and the SDPA kernels among
    them, except every second mm, and recomputes every other op)."""
    out: list[Violation] = []
    if facts.replicated and facts.grad_bytes is not None and \
            facts.grad_bytes != TORCHTITAN_GRAD_BYTES:
        out.append(Violation("grad_bytes", f"torchtitan reduces gradients in float32 "
                             f"(mixed_precision_reduce has no other value): "
                             f"{TORCHTITAN_GRAD_BYTES / facts.grad_bytes:g}x the data-parallel "
                             f"bytes the plan priced"))
    if facts.replicated and not facts.overlap_dp:
        out.append(Violation("overlap_dp", "torchtitan always overlaps data-parallel "
                             "communication with computation (FSDP2 prefetch, DDP buckets); "
                             "the plan priced it after the backward pass"))
    if facts.pp > 1 and facts.schedule == "interleaved" and not facts.overlap_pp:
        out.append(Violation("overlap_pp", "torch.distributed.pipelining's interleaved schedule "
                             "posts its sends and receives asynchronously and computes "
                             "meanwhile; the plan priced them after each chunk"))
    if facts.tp > 1 and not facts.sequence_parallel:
        out.append(Violation("sequence_parallel", "torchtitan's tensor parallelism always "
                             "shards the norms over the sequence (SequenceParallel); the plan "
                             "priced it without"))
    if facts.recompute == "selective":
        out.append(Violation("recompute", "torchtitan's selective activation checkpointing "
                             "(selective_ac_option op) keeps the matmuls' and the attention "
                             "kernel's outputs and recomputes every second matmul and the "
                             "other operations of each block, where the plan priced the "
                             "attention core recomputed: use recompute op"))
    return out


def priced_zero3_fetch(engine: str | None) -> str:
    """The ZeRO-3 granularity `optimize --engine` prices: the engine's (ENGINE_ZERO3_FETCH),
    else FSDP's blocks."""
    return ENGINE_ZERO3_FETCH[engine] if engine is not None else "blocks"


def priced_overlap_tp_method(engine: str | None) -> str:
    """How `optimize --engine` prices an overlap of the tensor-parallel exchanges: the
    engine's (ENGINE_TP_OVERLAP), else Transformer Engine's userbuffers."""
    return ENGINE_TP_OVERLAP.get(engine, USERBUFFERS) if engine is not None else USERBUFFERS


def priced_grad_accumulation(engine: str | None) -> str:
    """The gradient accumulation `optimize --engine` prices: the engine's
    (ENGINE_GRAD_ACCUMULATION), else Megatron's fused default."""
    return ENGINE_GRAD_ACCUMULATION[engine] if engine is not None else "fused"


def priced_loss(engine: str | None) -> str:
    """How `optimize --engine` prices the loss: the engine's (ENGINE_LOSS), else Megatron's
    vocabulary-parallel cross-entropy."""
    return ENGINE_LOSS[engine] if engine is not None else "inplace"


def priced_grad_bytes(engine: str | None, zero: int, compute: str) -> int | None:
    """The gradient width `optimize --engine` prices for a plan at ZeRO stage `zero` in
    `compute`: the engine's where it fixes one (torchtitan's float32 reduction; DeepSpeed
    without ZeRO, a 16-bit model's own dtype), else None (the precision's)."""
    if engine == "torchtitan":
        return TORCHTITAN_GRAD_BYTES
    if engine == "deepspeed" and zero == 0 and compute in SIXTEEN_BIT_COMPUTE:
        return DEEPSPEED_UNSHARDED_GRAD_BYTES
    return None


def search_violation(engine: str, facts: EngineFacts,
                     shape: TransformerShape | None = None) -> Violation | None:
    """Why `optimize --engine` leaves a plan out: the engine cannot run it, or runs it
    otherwise than it is priced — for the workload of `shape` too, where given (None: the
    limits that read only the plan)."""
    violation = engine_violation(engine, facts)
    if violation is None and shape is not None:
        violation = workload_violation(engine, facts, shape)
    if violation is not None:
        return violation
    differences = engine_differences(engine, facts)
    if shape is not None:
        differences += workload_differences(engine, facts, shape)
    return differences[0] if differences else None


def runnable_engines(plan: ParallelPlan) -> dict[str, Violation | None]:
    """Per engine, why it cannot run `plan` (None: it can)."""
    facts = plan_facts(plan)
    return {engine: engine_violation(engine, facts) for engine in ENGINES}


def require_engine(engine: str, plan: ParallelPlan, where: str = "plan",
                   shape: TransformerShape | None = None) -> None:
    """The InputError of the first limit of `engine` that `plan` breaks (export's refusal),
    then, given the workload's `shape`, of the first limit the pair breaks (named
    `where`.FIELD, or 'workload' for the shape itself)."""
    facts = plan_facts(plan)
    require(engine_violation(engine, facts), where)
    if shape is not None:
        violation = workload_violation(engine, facts, shape)
        require(violation, where if violation is None or violation.field else "workload")
