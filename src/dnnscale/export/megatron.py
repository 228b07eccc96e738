"""A plan as Megatron-LM's command-line options (``pretrain_gpt.py``).

Option names as Megatron-LM defines them (NVIDIA/Megatron-LM, megatron/training/arguments.py,
which builds most of them from the fields of megatron/core/model_parallel_config.py and
megatron/core/transformer/transformer_config.py: a field ``foo_bar`` is ``--foo-bar``;
docs/export.md lists each with its source line):

- parallelism: --tensor-model-parallel-size, --pipeline-model-parallel-size,
  --num-layers-per-virtual-pipeline-stage (interleaved 1F1B), --sequence-parallel. The
  data-parallel size is not an option: Megatron derives it as world size / (TP · PP).
- batch: --micro-batch-size, --global-batch-size (micro-batches per step = global /
  (micro · DP)); --no-gradient-accumulation-fusion for a plan priced with grad_accumulation
  'add' (autograd adds each micro-batch's weight gradients instead of the GEMM: Megatron's
  default fuses them, 'fused').
- data parallelism: --use-distributed-optimizer (ZeRO-1: optimizer state and fp32 master
  weights sharded over DP); ZeRO-2/3 are Megatron-FSDP's --use-megatron-fsdp with
  --data-parallel-sharding-strategy optim_grads / optim_grads_params (it needs
  --ckpt-format fsdp_dtensor); --overlap-grad-reduce.
- recomputation: --recompute-granularity selective --recompute-modules core_attn (Korthikanti
  et al.'s selective recomputation; Megatron refuses a --recompute-method with it) | full with
  --recompute-method uniform --recompute-num-layers 1 (every layer from its input; Megatron
  requires both with full).
- precision: --bf16, --fp16, --fp8-format hybrid (Transformer Engine, with --bf16);
  --grad-reduce-in-bf16 / --accumulate-allreduce-grads-in-fp32 for the gradients' width.
- model: --num-layers, --hidden-size, --ffn-hidden-size, --num-attention-heads,
  --group-query-attention --num-query-groups, --seq-length, --max-position-embeddings,
  --vocab-size, --swiglu, --normalization, --untie-embeddings-and-output-weights,
  --position-embedding-type, --rotary-base (RoPE's base, an integer), --disable-bias-linear,
  --attention-dropout, --hidden-dropout, --attention-backend flash.
- expert and context parallelism: --expert-model-parallel-size (the experts split over a
  sub-group of DP · CP; Megatron's DP is then dp · ep, the members that take different
  samples), --context-parallel-size with --cp-comm-type p2p (ring attention) or a2a (the
  all-to-all, "like DeepSpeed Ulysses"); DP = world size / (TP · PP · CP).
- mixture of experts (core/transformer/transformer_config.py): --num-experts, --moe-router-topk
  (with --moe-router-pre-softmax for top-1, which Megatron requires with its softmax router),
  --moe-ffn-hidden-size (each routed expert's width, where it is not --ffn-hidden-size),
  --moe-shared-expert-intermediate-size (the shared experts' total width),
  --moe-expert-capacity-factor (tokens above it dropped, lowest router probability first, the
  default --moe-token-drop-policy probs, and not padded up to it, as the plan prices), and
  always --moe-grouped-gemm (one grouped GEMM over the local experts, as priced) with
  --moe-token-dispatcher-type alltoall (the all-to-all token exchange the plan prices).
- environment (the torchrun script): CUDA_DEVICE_MAX_CONNECTIONS=1 with TP or CP > 1, unset under
  Megatron-FSDP (`device_connections`); the script also passes data and run-length options
  (mock data and the NullTokenizer, a short run) that DATA_ARGS and TRAIN_ARGS replace.

Megatron-LM has no GPipe schedule and no TF32 switch, and Megatron-FSDP (ZeRO-2/3) no
pipeline; plan/engines.py refuses plans that need them.
"""

from __future__ import annotations

import itertools

from collections.abc import Sequence

from dnnscale.errors import InputError, short_repr
from dnnscale.export.result import (EngineExport, ExportFile, Flag, args_text, check_exportable,
                                    elementwise_notes, engine_data_parallel, expert_notes,
                                    mesh_product, overlaps_dp, zero_stage)
from dnnscale.plan.engines import engine_differences, plan_facts, require_engine
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
SELECTIVE_MODULES = "core_attn"
"""What selective recomputation recomputes: core attention (QK^T, softmax, dropout, ·V), the
part Korthikanti et al. 2022 (§4.2) recompute and the plan prices; Megatron's default too."""
VOCAB_DIVISOR = 128
"""--make-vocab-size-divisible-by's default: Megatron pads the vocabulary to a multiple of this
times TP (megatron/core/tokenizers/utils/build_tokenizer.py, vocab_size_with_padding)."""
CP_COMM_TYPE = {"ring": "p2p", "alltoall": "a2a"}
"""Plan cp_algorithm -> --cp-comm-type: p2p exchanges K/V blocks in a ring overlapped with the
attention (ring attention), a2a scatters the heads over the cp group ("like DeepSpeed
Ulysses"; transformer_config.py, cp_comm_type)."""
MOE_BALANCING = ("Megatron-LM's auxiliary load-balancing loss is off unless --moe-aux-loss-coeff "
                 "is given: its default is 0, its suggested start 1e-2")
CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"
DATA_ARGS = "--mock-data --tokenizer-type NullTokenizer"
"""The torchrun script's data options unless DATA_ARGS is set: Megatron's mock dataset and the
NullTokenizer, whose vocabulary is --vocab-size, so the script launches without files."""
TRAIN_ARGS = "--train-iters 50 --eval-iters 0 --lr 0.0001 --log-interval 1"
"""The run length and learning rate unless TRAIN_ARGS is set (Megatron needs --train-iters or
--train-samples, and a learning rate): 50 steps timed one by one, no evaluation."""


def pipeline_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """TP and PP sizes and the interleaved schedule's layers per virtual stage, shared by
    Megatron-LM and Megatron-DeepSpeed (same option names in both)."""
    pipeline = plan.pipeline
    flags: list[Flag] = [("--tensor-model-parallel-size", str(plan.tensor.degree)),
                         ("--pipeline-model-parallel-size", str(pipeline.stages))]
    if pipeline.schedule == "interleaved":
        per_chunk = shape.layers // (pipeline.stages * pipeline.virtual_stages)
        flags.append(("--num-layers-per-virtual-pipeline-stage", str(per_chunk)))
    return flags


def sequence_parallel(plan: ParallelPlan) -> bool:
    """Whether the launch passes --sequence-parallel (both dialects): the plan asks for it and
    TP > 1 has something to split."""
    return plan.tensor.sequence_parallel and plan.tensor.degree > 1


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
    if not shape.drops_attention:
        flags.append(("--attention-dropout", "0"))
    if not shape.dropout:
        flags.append(("--hidden-dropout", "0"))
    return flags


def padded_vocab(vocab: int, tp: int) -> int:
    """The embedding rows Megatron builds: `vocab` up to a multiple of VOCAB_DIVISOR · TP."""
    multiple = VOCAB_DIVISOR * tp
    return -(-vocab // multiple) * multiple


def overlap_flags(plan: ParallelPlan) -> list[Flag]:
    """The tensor- and pipeline-parallel overlaps: --tp-comm-overlap (Transformer Engine's
    userbuffers: the sequence-parallel all-gathers and reduce-scatters in chunks under the
    linear layers' GEMMs; arguments.py refuses it without --sequence-parallel) and, with the
    interleaved schedule, --no-overlap-p2p-communication where the plan's sends do not overlap
    compute (Megatron-LM overlaps them by default there, and only there)."""
    flags: list[Flag] = []
    if plan.tensor.overlap:
        flags.append(("--tp-comm-overlap", None))
    if plan.pipeline.schedule == "interleaved" and not plan.pipeline.overlaps_p2p:
        flags.append(("--no-overlap-p2p-communication", None))
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
        return [("--recompute-granularity", "selective"),
                ("--recompute-modules", SELECTIVE_MODULES)]
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


def rotary_base(shape: TransformerShape, engine: str) -> str:
    """RoPE's base as the integer both Megatron dialects parse (argparse type=int)."""
    base = shape.rotary_base
    if not base.is_integer():
        raise InputError("transformer.rope_theta", f"{engine} takes RoPE's base as an integer, "
                         f"got {base}")
    return str(int(base))


def _megatron_model_flags(shape: TransformerShape) -> list[Flag]:
    flags = model_flags(shape)
    if shape.kv_heads != shape.heads:
        flags += [("--group-query-attention", None), ("--num-query-groups", str(shape.kv_heads))]
    flags += [("--normalization", NORMALIZATION[shape.norm]),
              ("--position-embedding-type", POSITION_EMBEDDING[shape.positional])]
    if shape.positional == "rope":
        flags.append(("--rotary-base", rotary_base(shape, ENGINE)))
    if shape.flash_attention:
        flags.append(("--attention-backend", "flash"))
    return flags


def _expert_context_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """The expert-parallel size (for a mixture of experts, whatever ep) and, with cp > 1, the
    context-parallel size and its communication type."""
    flags: list[Flag] = []
    if shape.is_moe:
        flags.append(("--expert-model-parallel-size", str(plan.expert.degree)))
        if plan.expert.tensor is not None:  # Megatron's default is tp
            flags.append(("--expert-tensor-parallel-size", str(plan.expert.tensor)))
    if plan.context.degree > 1:
        flags += [("--context-parallel-size", str(plan.context.degree)),
                  ("--cp-comm-type", CP_COMM_TYPE[plan.context.algorithm])]
    return flags


def moe_layer_pattern(shape: TransformerShape) -> str:
    """--moe-layer-freq's list expression (1: a mixture of experts, 0: a dense MLP of
    --ffn-hidden-size), runs of equal blocks as [v]*n joined by +, e.g. "[0]*3+[1]*58"
    (megatron/training/arguments.py moe_freq_type evaluates it)."""
    runs = itertools.groupby(int(shape.is_moe_block(i)) for i in range(shape.layers))
    return "+".join(f"[{value}]*{sum(1 for _ in run)}" for value, run in runs)


def _moe_flags(shape: TransformerShape) -> list[Flag]:
    """A mixture of experts' options (none for a dense model)."""
    if not shape.is_moe:
        return []
    flags: list[Flag] = [("--num-experts", str(shape.experts)),
                         ("--moe-router-topk", str(shape.top_k))]
    if shape.top_k == 1:  # TransformerConfig refuses a top-1 softmax router without it
        flags.append(("--moe-router-pre-softmax", None))
    if shape.routed_ffn != shape.ffn:
        flags.append(("--moe-ffn-hidden-size", str(shape.routed_ffn)))
    if shape.dense_blocks:
        flags.append(("--moe-layer-freq", moe_layer_pattern(shape)))
    if shape.shared_ffn:
        flags.append(("--moe-shared-expert-intermediate-size", str(shape.shared_ffn)))
    if shape.capacity_factor is not None:
        flags.append(("--moe-expert-capacity-factor", f"{shape.capacity_factor:g}"))
    return flags + [("--moe-grouped-gemm", None), ("--moe-token-dispatcher-type", "alltoall")]


def megatron_flags(plan: ParallelPlan, shape: TransformerShape) -> list[Flag]:
    """Every option of the plan and the model, in the order parallelism, batch, data
    parallelism, recomputation, precision, model, mixture of experts."""
    flags = pipeline_flags(plan, shape)
    if sequence_parallel(plan):
        flags.append(("--sequence-parallel", None))
    flags += overlap_flags(plan)
    accumulation = ([("--no-gradient-accumulation-fusion", None)]
                    if plan.batch.grad_accumulation == "add" else [])
    return (flags + _expert_context_flags(plan, shape) + batch_flags(plan) + accumulation
            + _data_parallel_flags(plan) + _recompute_flags(plan) + _precision_flags(plan)
            + _megatron_model_flags(shape) + _moe_flags(shape))


def device_connections(plan: ParallelPlan) -> str | None:
    """What the launch does with CUDA_DEVICE_MAX_CONNECTIONS: "1" with TP or CP > 1
    (Megatron-LM's validate_args asserts it on GPUs before Blackwell, compute capability < 10:
    one hardware work queue keeps each tensor- or context-parallel collective ahead of the
    kernel it overlaps), "unset" under Megatron-FSDP (ZeRO-2/3, which asserts it is not 1, and
    only warns with TP or CP > 1), None when Megatron checks nothing."""
    if zero_stage(plan) in FSDP_STRATEGY:
        return "unset"
    return "1" if plan.tensor.degree > 1 or plan.context.degree > 1 else None


def _environment(plan: ParallelPlan, script: bool) -> tuple[list[str], str | None]:
    """The torchrun script's lines for CUDA_DEVICE_MAX_CONNECTIONS, and the note saying what
    the launch needs and why (None when it needs nothing); `script`: the note is for the
    torchrun script, which does it, else for the args file's user."""
    setting = device_connections(plan)
    if setting is None:
        return [], None
    if setting == "1":
        split, which = (("tensor parallelism", "tp > 1") if plan.context.degree == 1 else
                        ("tensor or context parallelism", "tp or cp > 1"))
        lines = [f"# Megatron-LM asserts {CONNECTIONS}=1 with {split} on GPUs before "
                 f"Blackwell.", f"export {CONNECTIONS}=1"]
        need, done = f"{CONNECTIONS}=1", "the script exports it"
        why = (f"Megatron-LM's validate_args asserts it with {which} on GPUs before Blackwell "
               f"(compute capability < 10; Blackwell does not need it)")
    else:
        lines = [f"# Megatron-FSDP asserts {CONNECTIONS} is not 1.", f"unset {CONNECTIONS}"]
        need, done = f"{CONNECTIONS} unset or above 1", "the script unsets it"
        why = "Megatron-FSDP (zero 2/3) asserts it is not 1"
    return lines, f"the launch needs {need}{f' ({done})' if script else ''}: {why}"


def torchrun_text(flags: list[Flag], world_size: int, gpus_per_node: int, script: str,
                  header: list[str], environment: Sequence[str] = (),
                  trailing: Sequence[str] = ()) -> str:
    """A shell script: `environment` lines, then torchrun over world_size / gpus_per_node nodes
    running `script` with `flags` and then the `trailing` words (unquoted, so that a
    variable's words split into options)."""
    nodes = max(1, world_size // gpus_per_node)
    per_node = min(world_size, gpus_per_node)
    lines = ["#!/bin/sh", *(f"# {line}" for line in header),
             "# Run on every node with NODE_RANK, MASTER_ADDR and MASTER_PORT set.",
             *environment,
             f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --node-rank \"$NODE_RANK\" "
             f"--master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\",
             f"    {script} \\"]
    body = [f"    {name} {value}" if value is not None else f"    {name}"
            for name, value in flags]
    if trailing:
        body.append("    " + " ".join(trailing))
    return "\n".join(lines + [line + " \\" for line in body[:-1]] + body[-1:]) + "\n"


def check_nodes(world_size: int, gpus_per_node: int, engine: str,
                degrees: str = "tp·pp·dp") -> None:
    """A multi-node job fills whole nodes (`degrees`: the names whose product is the world)."""
    if world_size > gpus_per_node and world_size % gpus_per_node:
        raise InputError("--gpus-per-node", f"the {engine} job needs {degrees} = {world_size} "
                         f"GPUs, not a whole number of {gpus_per_node}-GPU nodes")


def export_megatron(plan: ParallelPlan, shape: TransformerShape | None, workload: str,
                    output_format: str = "args", gpus_per_node: int = 8) -> EngineExport:
    """Megatron-LM's options for `plan` training `workload` (see the module docstring)."""
    if output_format not in FORMATS:
        raise InputError("--format", f"{ENGINE} exports as {' or '.join(FORMATS)}, got "
                         f"{short_repr(output_format)}")
    shape = check_exportable(plan, shape, workload, ENGINE)
    require_engine("megatron", plan, shape=shape)  # Megatron-LM's limits: plan/engines.py
    flags = megatron_flags(plan, shape)
    world = plan.workers
    notes = []
    if plan.tensor.sequence_parallel and plan.tensor.degree == 1:
        notes.append("sequence_parallel with tp = 1 has nothing to split: --sequence-parallel "
                     "left out (Megatron-LM turns it off itself)")
    notes.append(f"data-parallel size {engine_data_parallel(plan)} is implied: launch "
                 f"{mesh_product(plan)} processes and Megatron-LM takes DP = world size / "
                 f"({'TP·PP·CP' if plan.context.degree > 1 else 'TP·PP'})"
                 + (" and splits the experts over EP members of DP·CP"
                    if plan.expert.degree > 1 else ""))
    notes += expert_notes(plan, shape, ENGINE, MOE_BALANCING)
    notes += [d.message for d in engine_differences("megatron", plan_facts(plan))]
    notes += elementwise_notes(plan, shape, "megatron")
    padded = padded_vocab(shape.vocab, plan.tensor.degree)
    if padded != shape.vocab:
        notes.append(f"Megatron-LM pads the vocabulary to a multiple of {VOCAB_DIVISOR}·TP: "
                     f"{padded:,} embedding and output rows where the plan priced "
                     f"{shape.vocab:,}")
    environment, why = _environment(plan, output_format == "torchrun")
    if why is not None:
        notes.append(why)
    if output_format == "args":
        notes.append(f"the file holds the plan's and the model's options only: add data, "
                     f"tokenizer and run length (for a run without files: {DATA_ARGS} "
                     f"{TRAIN_ARGS}) and the optimizer's options")
        files = (ExportFile("megatron.args", args_text(flags)),)
    else:
        check_nodes(world, gpus_per_node, ENGINE, mesh_product(plan).split(" = ")[0])
        notes.append(f"the script trains on mock data with the NullTokenizer ({DATA_ARGS}) "
                     f"for a short run ({TRAIN_ARGS}); set DATA_ARGS and TRAIN_ARGS to replace "
                     f"them, e.g. DATA_ARGS=\"--data-path PREFIX --tokenizer-type "
                     f"HuggingFaceTokenizer --tokenizer-model DIR\"")
        mesh = "".join(f" x {name} {size}" for name, size in (
            ("EP", plan.expert.degree), ("CP", plan.context.degree)) if size > 1)
        header = [f"Megatron-LM launch for {workload}, exported by dnnscale.",
                  f"World size {world} = TP {plan.tensor.degree} x PP {plan.pipeline.stages} x "
                  f"DP {plan.data.replicas}{mesh} (DP is implied by the world size)."]
        environment += [
            "# Data and run length: mock data and the NullTokenizer (its vocabulary is "
            "--vocab-size) and a",
            "# short run, unless DATA_ARGS / TRAIN_ARGS give yours (their words are passed "
            "unquoted).",
            f"DATA_ARGS=${{DATA_ARGS:-\"{DATA_ARGS}\"}}",
            f"TRAIN_ARGS=${{TRAIN_ARGS:-\"{TRAIN_ARGS}\"}}"]
        text = torchrun_text(flags, world, gpus_per_node, SCRIPT, header, environment,
                             ["$DATA_ARGS", "$TRAIN_ARGS"])
        files = (ExportFile("megatron-launch.sh", text),)
    return EngineExport(ENGINE, files, tuple(notes), world)
