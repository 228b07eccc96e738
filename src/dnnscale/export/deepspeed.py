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
communication_data_type, activation_checkpointing. The launch needs CUDA_DEVICE_MAX_CONNECTIONS=1
with sequence parallelism (a note says so).

Refused (plan/engines.py, DeepSpeed's limits with their sources): GPipe and interleaved
schedules with pp > 1, ZeRO-2/3 with pp > 1, overlap_dp with pp > 1 or without ZeRO, TF32,
1-byte gradients.
"""

from __future__ import annotations

from typing import Any

from dnnscale.errors import InputError
from dnnscale.export.megatron import (CONNECTIONS, batch_flags, model_flags, pipeline_flags,
                                      rotary_base, sequence_parallel)
from dnnscale.export.result import (EngineExport, ExportFile, Flag, args_text, check_exportable,
                                    overlaps_dp, zero_stage)
from dnnscale.jsonout import dumps
from dnnscale.plan.engines import require_engine
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.transformer_shape import TransformerShape

ENGINE = "DeepSpeed"
CONFIG_NAME = "ds_config.json"
ARGS_NAME = "megatron-deepspeed.args"
COMMUNICATION_TYPE = {4: "fp32", 2: "bf16"}
"""grad_bytes -> communication_data_type (fp16 plans reduce in "fp16" instead of "bf16")."""


def _check_plan(plan: ParallelPlan) -> None:
    require_engine("deepspeed", plan)  # DeepSpeed's limits live in plan/engines.py


def ds_config(plan: ParallelPlan) -> dict[str, Any]:
    """The ds_config mapping for `plan` (checked first with `_check_plan`)."""
    _check_plan(plan)
    zero = zero_stage(plan)
    config: dict[str, Any] = {
        "train_batch_size": plan.samples_per_step,
        "train_micro_batch_size_per_gpu": plan.batch.micro_batch,
        "gradient_accumulation_steps": plan.batch.accumulation,
        "zero_optimization": ({"stage": zero, "overlap_comm": overlaps_dp(plan)} if zero
                              else {"stage": 0}),
    }
    compute, grad = plan.precision.compute, plan.precision.grad_bytes
    if compute == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}
    elif compute in ("bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    config["communication_data_type"] = ("fp16" if compute == "fp16" and grad == 2
                                         else COMMUNICATION_TYPE[grad])
    if plan.memory.recompute == "full":
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False,
                                              "cpu_checkpointing": False}
    return config


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
    flags += batch_flags(plan)
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
    flags += model_flags(shape)
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
    return flags


def export_deepspeed(plan: ParallelPlan, shape: TransformerShape | None, workload: str,
                     config_name: str = CONFIG_NAME) -> EngineExport:
    """ds_config (named `config_name`, which the flags point at) and Megatron-DeepSpeed's
    flags for `plan` training `workload`."""
    shape = check_exportable(plan, shape, workload, ENGINE)
    config = ds_config(plan)
    flags = megatron_deepspeed_flags(plan, shape, config_name)
    notes = [f"{ARGS_NAME} holds Megatron-DeepSpeed's flags (pretrain_gpt.py): DeepSpeed has "
             f"no tensor or pipeline split of its own, the model code builds it",
             f"launch tp·pp·dp = {plan.tensor.degree}·{plan.pipeline.stages}·"
             f"{plan.data.replicas} = {plan.workers} processes (deepspeed or torchrun); DP = "
             f"world size / (TP·PP), and DeepSpeed checks train_batch_size = micro · "
             f"accumulation · DP"]
    if plan.tensor.sequence_parallel and plan.tensor.degree == 1:
        notes.append("sequence_parallel with tp = 1 has nothing to split: --sequence-parallel "
                     "left out")
    if sequence_parallel(plan):
        # Its other reason, the asynchronous tensor-parallel all-reduce, is off under --deepspeed.
        notes.append(f"the launch needs {CONNECTIONS}=1: Megatron-DeepSpeed's validate_args "
                     f"raises without it with --sequence-parallel on CUDA")
    files = (ExportFile(config_name, dumps(config) + "\n"), ExportFile(ARGS_NAME, args_text(flags)))
    return EngineExport(ENGINE, files, tuple(notes), plan.workers)
