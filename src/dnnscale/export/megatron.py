"""A plan as Megatron-LM's command-line options (``pretrain_gpt.py``).

Option names as Megatron-LM defines them (NVIDIA/Megatron-LM, megatron/training/arguments.py,
which builds most of them from the fields of megatron/core/model_parallel_config.py and
megatron/core/transformer/transformer_config.py: a field ``foo_bar`` is ``--foo-bar``;
docs/export.md lists each with its source line):

- parallelism: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --num-layers-per-virtual-pipeline-stage (interleaved 1F1B), --sequence-parallel. The
  data-parallel size is not an option: Megatron derives it as world size / (TP · PP).
- batch: --micro-batch-size, --global-batch-size (micro-batches per step = global /
  (micro · DP)).
- data parallelism: --use-distributed-optimizer (ZeRO-1: optimizer state and fp32 master
  weights sharded over DP); ZeRO-2/3 are Megatron-FSDP's --use-megatron-fsdp with
  --data-parallel-sharding-strategy optim_grads / optim_grads_params (it needs
  --ckpt-format fsdp_dtensor); --overlap-grad-reduce.
- recomputation: --recompute-granularity selective (core attention) | full with
  --recompute-method uniform --recompute-num-layers 1 (every layer from its input).
- precision: --bf16, --fp16, --fp8-format hybrid (Transformer Engine, with --bf16);
  --grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32 for the gradients' width.
- model: --num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads,
  --group-query-attention --num-query-groups, --seq-length, --max-position-embeddings,
  --vocab-size, --swiglu, --normalization, --untie-embeddings-and-output-weights,
  --position-embedding-type, --disable-bias-linear, --attention-dropout, --hidden-dropout,
  --attention-backend flash.

Megatron-LM has no GPipe schedule and no TF32 switch, and Megatron-FSDP (ZeRO-2/3) no
pipeline; plan/engines.py refuses plans that need them.
"""

from __future__ import annotations

from dnnscale.errors import InputError, short_repr
from dnnscale.export.result import (EngineExport, ExportFile, Flag, args_text, check_exportable,
                                    overlaps_dp, zero_stage)
from dnnscale.plan.engines import require_engine
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.transformer_shape import TransformerShape

ENGINE = "Megatron-LM"
FORMATS = ("args", "torchrun")
SCRIPT = "pretrain_gpt.py"
FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""ZeRO stage -> Megatron-FSDP's --data-parallel-sharding-strategy (ZeRO-2 shards optimizer
state and gradients, ZeRO-3 also the parameters; Rajbhandari et al. SC'20, §5)."""
NORMALIZATION = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
POSITION_EMBEDDING = {"learned": "learned_absolute", "rope": "rope", "none": "none"}


def pipeline_flags(plan: ParallelPlan, shape: TransformerShape, engine: str) -> list[Flag]:
    """TP and PP sizes and the interleaved schedule's layers per virtual stage, shared by
    Megatron-LM and Megatron-DeepSpeed (same option names in both)."""
    pipeline = plan.pipeline
    flags: list[Flag] = [("--tensor-model-parallel-size", str(plan.tensor.degree)),
                         ("--pipeline-model-parallel-size", str(pipeline.stages))]
    if pipeline.schedule == "interleaved":
        per_chunk = shape.layers // (pipeline.stages * pipeline.virtual_stages)
        flags.append(("--num-layers-per-virtual-pipeline-stage", str(per_chunk)))
    return flags


def batch_flags(plan: ParallelPlan) -> list[Flag]:
    """Micro-batch per GPU and the global batch (both engines derive the accumulation)."""
    return [("--micro-batch-size", str(plan.batch.micro_batch)),
            ("--global-batch-size", str(plan.samples_per_step))]


def model_flags(shape: TransformerShape) -> list[Flag]:
    """The layer counts and widths both Megatron dialects name the same way."""
    flags: list[Flag] = [("--num-layers", str(shape.layers)),
                         ("--hidden-size", str(shape.hidden)),
                         ("--ffn-hidden-size", str(shape.ffn)),
                         ("--num-attention-heads", str(shape.heads)),
                         ("--seq-length", str(shape.seq)),
                         ("--max-position-embeddings",
                          str(shape.positions if shape.positional == "learned" else shape.seq)),
                         ("--vocab-size", str(shape.vocab))]
    if shape.gated:
        flags.append(("--swiglu", None))
    if not shape.tied_embeddings:
        flags.append(("--untie-embeddings-and-output-weights", None))
    if not shape.bias:
        flags.append(("--disable-bias-linear", None))
    if not shape.dropout:
        flags += [("--attention-dropout", "0"), ("--hidden-dropout", "0")]
    return flags


def _data_parallel_flags(plan: ParallelPlan) -> list[Flag]:
    zero = zero_stage(plan)
    flags: list[Flag] = []
    if zero == 1:
        flags.append(("--use-distributed-optimizer", None))
    elif zero in FSDP_STRATEGY:
        flags += [("--use-megatron-fsdp", None),
                  ("--data-parallel-sharding-strategy", FSDP_STRATEGY[zero]),
                  ("--ckpt-format", "fsdp_dtensor")]
    if overlaps_dp(plan):
        flags.append(("--overlap-grad-reduce", None))
    return flags


def _recompute_flags(plan: ParallelPlan) -> list[Flag]:
    recompute = plan.memory.recompute
    if recompute == "selective":
        return [("--recompute-granularity", "selective")]
    if recompute == "full":
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", "1")]
    return []


def _precision_flags(plan: ParallelPlan) -> list[Flag]:
    compute, grad = plan.precision.compute, plan.precision.grad_bytes
    if compute == "fp32":  # with 4-byte gradients (plan/engines.py refuses the rest)
        return []
    flags: list[Flag] = [("--fp16", None)] if compute == "fp16" else [("--bf16", None)]
    if compute == "fp8":
        flags.append(("--fp8-format", "hybrid"))
    if compute == "fp16" and grad == 4:
        flags.append(("--accumulate-allreduce-grads-in-fp32", None))
    elif compute != "fp16" and grad == 2:
        # With --bf16 Megatron accumulates and all-reduces gradients in fp32 unless told not to.
        flags.append(("--grad-reduce-in-bf16", None))
    return flags


def _megatron_model_flags(shape: TransformerShape) -> list[Flag]:
    flags = model_flags(shape)
    if shape.kv_heads != shape.heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", str(shape.kv_heads))]
    flags += [("--normalization", NORMALIZATION[shape.norm]),
              ("--position-embedding-type", POSITION_EMBEDDING[shape.positional])]
    if shape.flash_attention:
        flags.append(("--attention-backend", "flash"))
    return flags


def megatron_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """Every option of the plan and the model, in the order parallelism, batch, data
    parallelism, recomputation, precision, model."""
    flags = pipeline_flags(plan, shape, ENGINE)
    if plan.tensor.sequence_parallel and plan.tensor.degree > 1:
        flags.append(("--sequence-parallel", None))
    return (flags + batch_flags(plan) + _data_parallel_flags(plan) + _recompute_flags(plan)
            + _precision_flags(plan) + _megatron_model_flags(shape))


def torchrun_text(flags: list[Flag], world_size: int, gpus_per_node: int, script: str,
                  header: list[str]) -> str:
    """A shell script: torchrun over world_size / gpus_per_node nodes running `script`."""
    nodes = max(1, world_size // gpus_per_node)
    per_node = min(world_size, gpus_per_node)
    lines = ["#!/bin/sh", *(f"# {line}" for line in header),
             "# Run on every node with NODE_RANK, MASTER_ADDR and MASTER_PORT set.",
             f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank \"$NODE_RANK\" "
             f"--master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\",
             f"    {script} \\"]
    body = [f"    {name} {value}" if value is not None else f"    {name}"
            for name, value in flags]
    return "\n".join(lines + [line + " \\" for line in body[:-1]] + body[-1:]) + "\n"


def check_nodes(world_size: int, gpus_per_node: int, engine: str) -> None:
    """A multi-node job fills whole nodes."""
    if world_size > gpus_per_node and world_size % gpus_per_node:
        raise InputError("--gpus-per-node", f"the {engine} job needs tp·pp·dp = {world_size} "
                         f"GPUs, not a whole number of {gpus_per_node}-GPU nodes")


def export_megatron(plan: ParallelPlan, shape: TransformerShape | None, workload: str,
                    output_format: str = "args", gpus_per_node: int = 8) -> EngineExport:
    """Megatron-LM's options for `plan` training `workload` (see the module docstring)."""
    if output_format not in FORMATS:
        raise InputError("--format", f"{ENGINE} exports as {' or '.join(FORMATS)}, got "
                         f"{short_repr(output_format)}")
    shape = check_exportable(plan, shape, workload, ENGINE)
    require_engine("megatron", plan)  # Megatron-LM's limits live in plan/engines.py
    flags = megatron_flags(plan, shape)
    world = plan.workers
    notes = []
    if plan.tensor.sequence_parallel and plan.tensor.degree == 1:
        notes.append("sequence_parallel with tp = 1 has nothing to split: --sequence-parallel "
                     "left out (Megatron-LM turns it off itself)")
    notes.append(f"data-parallel size {plan.data.replicas} is implied: launch tp·pp·dp = "
                 f"{plan.tensor.degree}·{plan.pipeline.stages}·{plan.data.replicas} = {world} "
                 f"processes and Megatron-LM takes DP = world size / (TP·PP)")
    notes.append("data and tokenizer options (--data-path, --tokenizer-type, ...) and the "
                 "optimizer's are left to you")
    if output_format == "args":
        files = (ExportFile("megatron.args", args_text(flags)),)
    else:
        check_nodes(world, gpus_per_node, ENGINE)
        header = [f"Megatron-LM launch for {workload}, exported by dnnscale.",
                  f"World size {world} = TP {plan.tensor.degree} x PP {plan.pipeline.stages} x "
                  f"DP {plan.data.replicas} (DP is implied by the world size)."]
        files = (ExportFile("megatron-launch.sh",
                            torchrun_text(flags, world, gpus_per_node, SCRIPT, header)),)
    return EngineExport(ENGINE, files, tuple(notes), world)
