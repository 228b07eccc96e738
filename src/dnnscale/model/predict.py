"""`predict`: price a plan's stage, compose its step, size its memory (performance-model.md)."""

from __future__ import annotations

import math

from dnnscale.model.compose import MemberState, StepContext, compose, epoch_time_s
from dnnscale.model.data_parallel import memory_zero_stage
from dnnscale.model.error_band import band_of
from dnnscale.model.expert_parallel import expert_load_factor
from dnnscale.model.gpu_compute import peak_flops_per_s
from dnnscale.model.mesh_split import MeshSplit
from dnnscale.model.memory import (MoeActivations, gathered_unit_bytes, loss_bytes,
                                   plan_reserve_bytes, ps_memory_parts, recompute_peak_bytes,
                                   sharded_state_parts, transformer_block_activation_bytes,
                                   worker_memory_parts)
from dnnscale.model.prediction import MemoryPart, Prediction
from dnnscale.model.schedule import in_flight_micro_batches, stage_layers
from dnnscale.model.stage import (StageCosts, pipeline_layout, stage_costs, stage_template,
                                  stages_from_template)
from dnnscale.model.zero3_fetch import DEEPSPEED_REDUCE_BUCKET, largest_gather
from dnnscale.plan.config import Config
from dnnscale.plan.plan import OPTIMIZERS, Collective, ParallelPlan, ParameterServer
from dnnscale.system.system import System
from dnnscale.workload.transformer_kinds import AMP_FP32_KINDS
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload


def plan_stage_costs(workload: Workload, system: System, plan: ParallelPlan,
                     per_layer: bool = True) -> tuple[StageCosts, ...]:
    """The costs of each pipeline stage of `plan` (its tensor split at its micro-batch);
    without `per_layer`, a pipeline of transformer blocks is built from one block's totals per
    kind of block (model/stage.py; the same totals up to the order of summation, no per-layer
    list)."""
    aggregation = plan.data.aggregation
    fc_protocol = aggregation.fc_protocol if isinstance(aggregation, ParameterServer) else "weights"
    b = workload.bytes_per_value
    scale = (plan.precision.activation_bytes or b) / b
    precision, sp = plan.precision.compute, plan.tensor.sequence_parallel
    split = MeshSplit.of(plan)
    if plan.pipeline.stages == 1:
        return (stage_costs(workload, system, plan.tensor.degree, plan.batch.micro_batch,
                            fc_protocol, plan.tensor.rules, precision=precision,
                            sequence_parallel=sp, bytes_scale=scale, split=split),)
    assignment = stage_layers(workload.layers, plan.pipeline.stages,
                              plan.pipeline.virtual_stages)
    layout = (pipeline_layout(workload, assignment)
              if not per_layer and plan.tensor.rules == "megatron" else None)
    if layout is not None:
        template = stage_template(workload, system, plan.tensor.degree, plan.batch.micro_batch,
                                  layout.kinds, precision=precision, sequence_parallel=sp,
                                  bytes_scale=scale, split=split)
        return stages_from_template(workload, template, layout)
    return tuple(stage_costs(workload, system, plan.tensor.degree, plan.batch.micro_batch,
                             fc_protocol, plan.tensor.rules, indices, precision=precision,
                             sequence_parallel=sp, bytes_scale=scale, split=split)
                 for indices in assignment)


def plan_workload(workload: Workload, plan: ParallelPlan) -> Workload:
    """`workload` as `plan` runs it (Workload.as_run): its loss kernel, and its
    mixed-precision mode at the plan's activation width."""
    return workload.as_run(plan.memory.loss, plan.precision.amp,
                           plan.precision.activation_bytes or workload.bytes_per_value)


def predict_plan(workload: Workload, system: System, plan: ParallelPlan,
                 stage: StageCosts | None = None, config: Config | None = None,
                 per_layer: bool = True) -> Prediction:
    """Predict one plan; `stage` may be passed in when already computed for a one-stage plan's
    split and batch. `config`: the Adam flags the plan was built from, reported with it.
    `per_layer`: keep every layer's costs (Prediction.layers); off, pipelines of identical
    blocks are costed per block (faster)."""
    workload = plan_workload(workload, plan)
    stages = ((stage,) if stage is not None
              else plan_stage_costs(workload, system, plan, per_layer))
    context = StepContext(workload, system, plan, stages)
    step = compose(context, plan.data.replicas, plan.ps_shards)
    stage_memory: tuple[tuple[MemoryPart, ...], ...] = ()
    if step.record is not None and step.record.by_stage:
        stage_memory = accelerator_stage_memory(workload, plan, context.members)
        memory, capacity = fullest_stage(stage_memory), {"worker": system.machine.memory_bytes}
    else:
        memory, capacity = memory_parts(workload, system, plan, stages[0])
    tokens = workload.transformer.seq if workload.transformer is not None else None
    mfu = None
    if system.machine.is_accelerator:
        model_flops = workload.fwd_flops + workload.input_grad_flops + workload.weight_grad_flops
        peak = peak_flops_per_s(system.machine, plan.precision.compute)
        mfu = step.throughput * model_flops / (plan.workers * peak)
    return Prediction(plan=plan, throughput_samples_per_s=step.throughput,
                      step_time_s=step.step_s,
                      epoch_time_s=epoch_time_s(workload, plan, step.throughput,
                                                step.straggler_factor),
                      bottleneck=step.bottleneck, parts=step.parts,
                      utilization=step.utilization, memory=memory,
                      memory_capacity_bytes=capacity, capacities_samples_per_s=step.capacities,
                      layers=tuple(layer for s in stages for layer in s.layers), config=config,
                      tokens_per_s=step.throughput * tokens if tokens else None, mfu=mfu,
                      straggler_factor=step.straggler_factor, step_record=step.record,
                      stage_memory=stage_memory,
                      error_band=band_of(system, plan, step.bottleneck))


def predict(workload: Workload, system: System, plan: Config | ParallelPlan,
            per_layer: bool = True) -> Prediction:
    """Predict Adam's flags (a Config) or a plan."""
    if isinstance(plan, Config):
        return predict_config(workload, system, plan)
    return predict_plan(workload, system, plan, per_layer=per_layer)


def predict_config(workload: Workload, system: System, config: Config,
                   stage: StageCosts | None = None) -> Prediction:
    """Predict the plan that Adam's flags `config` describe."""
    return predict_plan(workload, system, config.to_plan(), stage, config)


def memory_parts(workload: Workload, system: System, plan: ParallelPlan,
                 stage: StageCosts) -> tuple[tuple[MemoryPart, ...], dict[str, float]]:
    """Memory parts per device role, and each role's capacity (bytes)."""
    b = workload.bytes_per_value
    state_bytes = OPTIMIZERS[plan.optimizer] * b
    activations = math.prod(workload.input_shape) + stage.totals.activation_values
    stored = stage.stored_params(workload.params)
    parts = worker_memory_parts(stored / plan.tensor.degree, b, b, state_bytes, activations, b,
                                plan.batch.micro_batch)
    capacity = {"worker": system.machine.memory_bytes}
    if plan.data.uses_ps:
        parts += ps_memory_parts(math.ceil(stored / plan.ps_shards), b, state_bytes)
        capacity["ps"] = system.ps.memory_bytes
    return parts, capacity


def block_activation_bytes(shape: TransformerShape, plan: ParallelPlan,
                           experts: bool | None = None, recompute: str | None = None) -> float:
    """Activation bytes one transformer block of `shape` keeps per micro-batch under `plan`
    (model/memory.transformer_block_activation_bytes), its MLP's terms those of its mixture
    of experts where it has one: the routed experts' at the busiest ep member's load.
    `experts`: whether the block is one of the mixture-of-experts blocks (default: whether the
    shape is a mixture of experts); False prices a dense block (`dense_blocks`). `recompute`:
    the recomputation it keeps for (default: the plan's)."""
    ffn_in = 2 * shape.ffn if shape.gated else shape.ffn
    moe = None
    if shape.is_moe if experts is None else experts:
        routed = shape.routed_ffn
        shared = shape.shared_ffn
        moe = MoeActivations(
            shape.top_k * expert_load_factor(plan.expert.imbalance, shape.capacity_factor),
            2 * routed if shape.gated else routed, routed, shape.experts,
            2 * shared if shape.gated else shared, shared,
            plan.expert_tensor / plan.tensor.degree)
    return transformer_block_activation_bytes(
        shape.seq, plan.batch.micro_batch, shape.hidden, shape.heads, shape.kv_hidden,
        ffn_in, shape.ffn, plan.tensor.degree, plan.tensor.sequence_parallel,
        plan.memory.recompute if recompute is None else recompute, shape.flash_attention,
        plan.context.degree, moe, shape.memory,
        shape.positional == "relative", AMP_FP32_KINDS[plan.precision.amp], shape.dropout,
        shape.drops_attention, shape.eager_norms, shape.eager_activation)


def accelerator_memory_parts(workload: Workload, system: System, plan: ParallelPlan,
                             members: MemberState
                             ) -> tuple[tuple[MemoryPart, ...], dict[str, float]]:
    """Memory parts of the device that needs the most (the fullest pipeline stage, the first of
    equals), and the device's capacity; `accelerator_stage_memory` gives every stage's."""
    return (fullest_stage(accelerator_stage_memory(workload, plan, members, distinct=True)),
            {"worker": system.machine.memory_bytes})


def fullest_stage(stage_memory: tuple[tuple[MemoryPart, ...], ...]) -> tuple[MemoryPart, ...]:
    """The memory parts of the stage that needs the most (the first of equals; () for none)."""
    return max(stage_memory, key=lambda parts: sum(part.bytes for part in parts), default=())


def accelerator_stage_memory(workload: Workload, plan: ParallelPlan, members: MemberState,
                             distinct: bool = False) -> tuple[tuple[MemoryPart, ...], ...]:
    """Per pipeline stage, the memory parts of one of its devices: weights, gradients and
    optimizer state under ZeRO, the activations it keeps in flight (transformer blocks by
    Korthikanti et al.'s formula, other layers by their outputs), the loss's peak, under
    recomputation what the block being recomputed holds beyond the loss's peak
    (memory.recompute_peak_bytes), and the reserve no tensor can use (CUDA context,
    workspaces, NCCL buffers: memory.plan_reserve_bytes). `distinct`: leave
    out a stage like an earlier one (it holds no more micro-batches in flight), for a search
    that needs only the fullest."""
    aggregation = plan.data.aggregation
    zero = aggregation.zero_stage if isinstance(aggregation, Collective) else 0
    buckets = isinstance(aggregation, Collective) and aggregation.fetch == "buckets"
    b = workload.bytes_per_value
    act_bytes = plan.precision.activation_bytes or b
    shape = workload.transformer
    p = plan.pipeline.stages
    moe_block = dense_block = 0.0  # bytes of a block with a mixture of experts, with a dense MLP
    moe_rerun = dense_rerun = 0.0  # what such a block holds more while it is recomputed
    recomputes = plan.memory.recompute != "none"
    if shape is not None:
        dense_block = block_activation_bytes(shape, plan, experts=False)
        if recomputes:
            dense_rerun = block_activation_bytes(shape, plan, False, "none") - dense_block
        if shape.is_moe:
            moe_block = block_activation_bytes(shape, plan, experts=True)
            if recomputes:
                moe_rerun = block_activation_bytes(shape, plan, True, "none") - moe_block
    out: list[tuple[MemoryPart, ...]] = []
    seen: set[tuple[object, ...]] = set()
    zero_stage = memory_zero_stage(zero, plan.pipeline.stages)
    reserve = MemoryPart("reserve", plan_reserve_bytes(plan))
    for index, (stage, params, experts) in enumerate(zip(members.stages, members.member_params,
                                                         members.member_expert_params)):
        signature = (params, stage.unit_params, stage.totals.blocks, stage.totals.expert_blocks,
                     stage.totals.outside_activation_values, stage.totals.loss_values,
                     stage.tensors if buckets else None)
        if distinct and signature in seen:
            continue
        seen.add(signature)
        # dense parameters shard over their dp × ep × cp group, the experts' over dp × cp × tp/etp
        dense, expert = (sharded_state_parts(
            group_params, members.param_bytes_per_value, members.grad_bytes_per_value,
            members.state_bytes_per_param, zero_stage, replicas)
            for group_params, replicas in ((params - experts, plan.dense_replicas),
                                           (experts, plan.expert_replicas)))
        gathered = (0.0, 0.0)  # ZeRO-3's units held whole: the member's share of the largest
        if zero_stage >= 3 and buckets:  # DeepSpeed: its largest call, its reduce bucket
            gathered = gathered_unit_bytes(largest_gather(stage.tensors, stage.partitions),
                                           members.param_bytes_per_value,
                                           members.grad_bytes_per_value, DEEPSPEED_REDUCE_BUCKET)
        elif zero_stage >= 3:
            share = params / max(1, stage.stored_params(stage.params or workload.params))
            gathered = gathered_unit_bytes(stage.unit_params * share,
                                           members.param_bytes_per_value,
                                           members.grad_bytes_per_value)
        state = tuple(MemoryPart(a.name, a.bytes + b.bytes + extra)
                      for a, b, extra in zip(dense, expert, (*gathered, 0.0)))
        held = in_flight_micro_batches(plan.pipeline.schedule, index, p, plan.batch.accumulation,
                                       plan.pipeline.virtual_stages)
        blocks = stage.blocks
        per_micro_batch = rerun = 0.0
        if shape is not None and blocks:
            moe_blocks = stage.expert_blocks
            per_micro_batch = (moe_block * moe_blocks + dense_block * (blocks - moe_blocks)
                               ) * act_bytes / 2
            rerun = max(moe_rerun if moe_blocks else 0.0,
                        dense_rerun if blocks > moe_blocks else 0.0) * act_bytes / 2
        outside = (stage.totals.outside_activation_values if shape is not None
                   else stage.totals.activation_values)
        # the loss reads the logits (its input, the layer before it: as many values as its
        # output) and keeps what its kernel keeps instead of either output (loss_bytes); each
        # layer's values are already its member's share (tp's split, cp's tokens)
        logits = stage.totals.loss_values * plan.batch.micro_batch
        per_micro_batch += (outside * plan.batch.micro_batch - 2 * logits) * act_bytes
        loss_peak = (loss_bytes(logits, held, plan.memory.loss, act_bytes,
                                vocab_parallel=plan.tensor.degree > 1) if logits else 0.0)
        loss = (MemoryPart("loss", loss_peak),) if logits else ()
        over = recompute_peak_bytes(rerun, loss_peak)
        again = (MemoryPart("recompute", over),) if over else ()
        out.append(state + (MemoryPart("activations", per_micro_batch * held), *loss, *again,
                            reserve))
    return tuple(out)
