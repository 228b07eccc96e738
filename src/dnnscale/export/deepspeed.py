"""A plan as a DeepSpeed config (``ds_config.json``) and, beside it, Megatron-DeepSpeed's flags.

DeepSpeed itself splits no layer: tensor and pipeline parallelism come from the model code,
here Megatron-DeepSpeed (deepspeedai/Megatron-DeepSpeed, ``pretrain_gpt.py``), whose
``--tensor-model-parallel-size`` and ``--pipeline-model-parallel-size`` build the Megatron
split and DeepSpeed's pipeline engine (a PipelineModule run by its 1F1B TrainSchedule). So the
export is two files: the ds_config and the Megatron-DeepSpeed options that point at it
(``--deepspeed --deepspeed_config ds_config.json``).

ds_config keys (deepspeed/runtime/constants.py, zero/config.py, activation_checkpointing/
config.py; docs/export.md gives the lines): train_batch_size, train_micro_batch_size_per_gpu,
gradient_accumulation_steps (DeepSpeed checks train = micro · accumulation · DP),
zero_optimization.stage and .overlap_comm, bf16.enabled, fp16.enabled (+ loss_scale 0: dynamic),
communication_data_type, data_types.grad_accum_dtype (fp32 where a 16-bit model's plan prices
4-byte gradients under ZeRO, so that DeepSpeed accumulates them as priced: its default is the
model's dtype), activation_checkpointing; with pp and tp > 1, pipeline.pipe_partitioned and .grad_partitioned
as the plan's pp_scatter_gather (DeepSpeed's defaults are true; Megatron-DeepSpeed's
GPTModelPipe asserts them off for MoE, which plan/engines.py refuses). The launch needs
CUDA_DEVICE_MAX_CONNECTIONS=1 with sequence parallelism (a note says so).

Mixture of experts, as DeepSpeed-MoE in Megatron-DeepSpeed (megatron/arguments.py,
megatron/model/transformer.py): --num-experts E --expert-interval 1 (every block's MLP, as the
workload has it; the default 2 is every other block), --topk, --moe-expert-parallel-size,
--enable-expert-tensor-parallelism with tp > 1 and etp = tp (the experts split over the tensor
group, as priced; without it, etp = 1, DeepSpeed drops each tensor member's duplicate tokens
before the exchange), --ffn-hidden-size the routed experts' width (each expert is built from it),
--mlp-type residual for a shared expert as wide as a routed one, --moe-train-capacity-factor or,
dropless, --disable-moe-token-dropping, and --create-moe-param-group (DeepSpeed's ZeRO
optimizers assert a MoE parameter group). Context parallelism is DeepSpeed-Ulysses:
--ds-sequence-parallel-size cp (DP = world size / (TP · PP · SP)).

Refused (plan/engines.py, DeepSpeed's limits with their sources): GPipe and interleaved
schedules with pp > 1, ZeRO-2/3 with pp > 1, overlap_dp with pp > 1 or without ZeRO, TF32,
1-byte gradients, ring attention (Ulysses is all-to-all), Ulysses with tp or pp > 1 or with
ep > 1, MoE under ZeRO-3, and shared experts of another width than a routed expert.
"""

from __future__ import annotations

from typing import Any

from dnnscale.export.megatron import (CONNECTIONS, batch_flags, model_flags, pipeline_flags,
                                      rotary_base, sequence_parallel)
from dnnscale.export.result import (EngineExport, ExportFile, Flag, args_text, check_exportable,
                                    elementwise_notes, engine_data_parallel, expert_notes,
                                    mesh_product, overlaps_dp, zero_stage)
from dnnscale.jsonout import dumps
from dnnscale.model.zero3_fetch import (DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET,
                                        DEEPSPEED_REDUCE_BUCKET)
from dnnscale.plan.engines import (engine_differences, moe_interval, plan_facts,
                                   require_engine, wide_accumulation, workload_differences)
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.transformer_shape import TransformerShape

ENGINE = "DeepSpeed"
CONFIG_NAME = "ds_config.json"
ARGS_NAME = "megatron-deepspeed.args"
COMMUNICATION_TYPE = {4: "fp32", 2: "bf16"}
"""grad_bytes -> communication_data_type (fp16 plans reduce in "fp16" instead of "bf16")."""
MOE_BALANCING = ("Megatron-DeepSpeed adds the gate's auxiliary load-balancing loss weighted by "
                 "--moe-loss-coeff, 0.1 unless given")


def _check_plan(plan: ParallelPlan, shape: TransformerShape | None = None) -> None:
    require_engine("deepspeed", plan, shape=shape)  # DeepSpeed's limits: plan/engines.py


def ds_config(plan: ParallelPlan, shape: TransformerShape | None = None) -> dict[str, Any]:
    """The ds_config mapping for `plan` training `shape` (None: a dense model), checked first
    with `_check_plan`."""
    _check_plan(plan, shape)
    zero = zero_stage(plan)
    config: dict[str, Any] = {
        "train_batch_size": plan.samples_per_step,
        "train_micro_batch_size_per_gpu": plan.batch.micro_batch,
        "gradient_accumulation_steps": plan.batch.accumulation,
        "zero_optimization": ({"stage": zero, "overlap_comm": overlaps_dp(plan)} if zero
                              else {"stage": 0}),
    }
    if zero == 3:  # the buckets the plan priced (model/zero3_fetch.py), DeepSpeed's defaults
        config["zero_optimization"].update({
            "stage3_prefetch_bucket_size": DEEPSPEED_PREFETCH_BUCKET,
            "stage3_param_persistence_threshold": DEEPSPEED_PERSISTENCE_THRESHOLD,
            "reduce_bucket_size": DEEPSPEED_REDUCE_BUCKET})
    compute, grad = plan.precision.compute, plan.precision.grad_bytes
    if compute == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    elif compute in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    config["communication_data_type"] = ("fp16" if compute == "fp16" and grad == 2
                                         else COMMUNICATION_TYPE[grad])
    if zero and wide_accumulation(compute, grad):
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if plan.memory.recompute == "full":
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    if plan.pipeline.stages > 1 and plan.tensor.degree > 1:  # the sends the plan priced
        partitioned = plan.pipeline.scatter_gather
        config["pipeline"] = {"pipe_partitioned": partitioned, "grad_partitioned": partitioned}
    return config


def _moe_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """DeepSpeed-MoE's options in Megatron-DeepSpeed (none for a dense model)."""
    if not shape.is_moe:
        return []
    interval = moe_interval(shape) or 1  # plan/engines.py refuses the patterns it cannot take
    flags: list[Flag] = [("--num-experts", str(shape.experts)),
                         ("--expert-interval", str(interval)),
                         ("--topk", str(shape.top_k))]
    if shape.shared_ffn:  # as wide as a routed expert (plan/engines.py refuses the rest)
        flags.append(("--mlp-type", "residual"))
    if shape.capacity_factor is not None:
        flags.append(("--moe-train-capacity-factor", f"{shape.capacity_factor:g}"))
    else:
        flags.append(("--disable-moe-token-dropping", None))
    return flags + [("--create-moe-param-group", None)]


def _parallel_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """The expert-parallel size (for a mixture of experts) and its tensor split, and the
    Ulysses group's size."""
    flags: list[Flag] = []
    if shape.is_moe:
        flags.append(("--moe-expert-parallel-size", str(plan.expert.degree)))
        if plan.tensor.degree > 1 and plan.expert_tensor == plan.tensor.degree:
            flags.append(("--enable-expert-tensor-parallelism", None))  # etp = tp, else 1
    if plan.context.degree > 1:
        flags.append(("--ds-sequence-parallel-size", str(plan.context.degree)))
    return flags


def megatron_deepspeed_flags(plan: ParallelPlan, shape: TransformerShape,
                             config_path: str = CONFIG_NAME) -> list[Flag]:
    """Megatron-DeepSpeed's options for the same plan (its megatron/arguments.py)."""
    flags: list[Flag] = [("--deepspeed", None), ("--deepspeed_config", config_path),
                         ("--zero-stage", str(zero_stage(plan)))]
    flags += pipeline_flags(plan, shape)
    if plan.pipeline.stages == 1:
        flags.append(("--no-pipeline-parallel", None))
    if sequence_parallel(plan):
        flags.append(("--sequence-parallel", None))
    flags += _parallel_flags(plan, shape) + batch_flags(plan)
    if plan.memory.recompute == "selective":
        flags.append(("--recompute-granularity", "selective"))
    elif plan.memory.recompute == "full":
        flags += [("--checkpoint-activations", None), ("--checkpoint-num-layers", "1"),
                  ("--deepspeed-activation-checkpointing", None)]
    compute = plan.precision.compute
    if compute == "fp16":
        flags.append(("--fp16", None))
    elif compute in ("bf16", "fp8"):
        flags.append(("--bf16", None))
    if compute == "fp8":
        flags += [("--fp8-hybrid", None), ("--transformer-impl", "transformer_engine")]
    # Every block's MLP is the mixture (--expert-interval 1): each expert is built from
    # --ffn-hidden-size, so it is the routed experts' width.
    flags += [(name, str(shape.routed_ffn) if name == "--ffn-hidden-size" and shape.is_moe
               else value) for name, value in model_flags(shape)]
    if shape.kv_heads != shape.heads:
        flags.append(("--num-key-value-heads", str(shape.kv_heads)))
    flags.append(("--normalization", shape.norm))
    if shape.positional == "rope":
        flags += [("--use-rotary-position-embeddings", None), ("--no-position-embedding", None),
                  ("--rotary-position-embeddings-theta", rotary_base(shape, ENGINE))]
    elif shape.positional == "none":
        flags.append(("--no-position-embedding", None))
    if shape.flash_attention:
        flags.append(("--use-flash-attn-v2", None))
    return flags + _moe_flags(plan, shape)


def export_deepspeed(plan: ParallelPlan, shape: TransformerShape | None, workload: str,
                     config_name: str = CONFIG_NAME) -> EngineExport:
    """ds_config (named `config_name`, which the flags point at) and Megatron-DeepSpeed's
    flags for `plan` training `workload`."""
    shape = check_exportable(plan, shape, workload, ENGINE)
    config = ds_config(plan, shape)
    flags = megatron_deepspeed_flags(plan, shape, config_name)
    split = "TP·PP·SP" if plan.context.degree > 1 else "TP·PP"
    notes = [f"{ARGS_NAME} holds Megatron-DeepSpeed's flags (pretrain_gpt.py): DeepSpeed has "
             f"no tensor or pipeline split of its own, the model code builds it",
             f"launch {mesh_product(plan)} processes (deepspeed or torchrun); DP = "
             f"world size / ({split})"
             + (f" = {engine_data_parallel(plan)}" if plan.expert.degree > 1 else "")
             + ", and DeepSpeed checks train_batch_size = micro · accumulation · DP"]
    if plan.tensor.sequence_parallel and plan.tensor.degree == 1:
        notes.append("sequence_parallel with tp = 1 has nothing to split: --sequence-parallel "
                     "left out")
    if sequence_parallel(plan):
        # Its other reason, the asynchronous tensor-parallel all-reduce, is off under --deepspeed.
        notes.append(f"the launch needs {CONNECTIONS}=1: Megatron-DeepSpeed's validate_args "
                     f"raises without it with --sequence-parallel on CUDA")
    notes += expert_notes(plan, shape, ENGINE, MOE_BALANCING)
    facts = plan_facts(plan)
    notes += [d.message for d in engine_differences("deepspeed", facts)]
    notes += [d.message for d in workload_differences("deepspeed", facts, shape)]
    notes += elementwise_notes(plan, shape, "deepspeed")
    files = (ExportFile(config_name, dumps(config) + "\n"), ExportFile(ARGS_NAME, args_text(flags)))
    return EngineExport(ENGINE, files, tuple(notes), plan.workers)
