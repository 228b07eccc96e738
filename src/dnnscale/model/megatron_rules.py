"""Megatron-LM's tensor-parallel rules (sharding registry 'megatron'), one per split rule a kind's
record names (workload/kind_record.py): column, row, vocab_embedding, local, vocab_loss,
replicated.

Shoeybi et al. 2019 split each block's two GEMM pairs column- then row-wise: the QKV projection
and the MLP's first linear by output columns (heads, MLP width), the attention output and the
MLP's second linear by input rows. The conjugate operators f (identity forward, all-reduce of
the input gradient backward) before each column-parallel GEMM and g (all-reduce forward,
identity backward) after each row-parallel GEMM give 2 all-reduces of the b·s·h activation
forward and 2 backward per block. The vocabulary-parallel embedding all-reduces its output;
the LM head is column parallel over the vocabulary (an f before it); the cross-entropy is
vocabulary parallel (3 small all-reduces of b·s values). Norms, dropout and residual adds run
whole on every member.

With sequence parallelism (Korthikanti et al. 2022, §4.2.2) each all-reduce becomes a
reduce-scatter plus an all-gather of the same tensor and the norms, dropouts and residual adds
work on 1/t of the sequence.
"""

from __future__ import annotations

from dataclasses import replace

from dnnscale.model.sharding import (PHASE_BACKWARD, PHASE_FORWARD, CommEvent, Shard,
                                     SplitContext, shard_layer, sharding_rule)
from dnnscale.workload.kind_record import record_of
from dnnscale.workload.layer import Layer

TENSOR = "tensor"
LOSS_STATISTIC_BYTES = 4
"""Vocabulary-parallel cross-entropy all-reduces three fp32 values per token (the max logit,
the sum of exponentials, the target's logit): Megatron's vocab_parallel_cross_entropy."""


FP8_GATHER_BYTES_PER_VALUE = 1
"""Bytes per value of an FP8 linear layer's sequence-parallel all-gathers under an FP8 plan:
both engines cast before they gather. Transformer Engine's LayerNormLinear gathers its FP8
norm output and its backward gathers the FP8 output gradient (module/base.py
grad_output_preprocess: 'gathered grad_output in FP8'); torchao's Float8ColwiseParallel and
PrepareFloat8ModuleInput cast the input to float8 before the Shard to Replicate all-gather,
and Float8RowwiseParallel casts the output gradient to float8 before its backward all-gather
(torchao/float8/float8_tensor_parallel.py; torchtitan docs/float8.md at d4c86e3: 'we cast
sharded input into float8 and perform float8 all-gather'). The reduce-scatters carry the
GEMMs' bf16 outputs and input gradients."""


def gather_bytes_per_value(layer: Layer, context: SplitContext) -> float:
    """Bytes per value of `layer`'s all-gathers: FP8_GATHER_BYTES_PER_VALUE for a layer that
    runs in FP8 (gpu_compute.kernel_precision: the fp8_gemm kinds) under an FP8 plan, but not
    the routed experts' (their gathers are the token dispatcher's, of the bf16 hidden states);
    else the context's."""
    record = record_of(layer)
    if context.fp8 and record.fp8_gemm and not record.expert:
        return FP8_GATHER_BYTES_PER_VALUE
    return context.bytes_per_value


def _activation_bytes(layer: Layer, context: SplitContext,
                      bytes_per_value: float | None = None) -> float:
    """b·s·h·bytes: one micro-batch's activation entering or leaving a block's sub-layer (of
    the member's s / cp tokens under context parallelism); b·s·k·h·bytes for a routed expert's
    linear, whose rows are the s·k token copies (Megatron-Core's AlltoAll dispatcher gathers
    the copies the expert-parallel exchange brought over the tensor group, AG(TP), and
    reduce-scatters the experts' outputs, RS(TP): transformer/moe/token_dispatcher.py). An LM
    head on the p positions of `predictions` exchanges b·p·h·bytes; with sequence parallelism
    the whole sequence is all-gathered before the positions are, b·s·h·bytes. `bytes_per_value`:
    the width the exchange carries (default: the context's)."""
    hidden = layer.hyper.get("hidden")
    seq = layer.hyper.get("seq")
    predictions = layer.hyper.get("predictions")
    if isinstance(predictions, int) and predictions and not context.sequence_parallel:
        seq = predictions
    values = (int(hidden) * int(seq) if isinstance(hidden, int) and isinstance(seq, int)
              else layer.activation_values)
    top_k = layer.hyper.get("top_k")
    if record_of(layer).expert and isinstance(top_k, int):
        values *= top_k
    width = context.bytes_per_value if bytes_per_value is None else bytes_per_value
    return values * width * context.minibatch * context.token_fraction


def _column_events(layer: Layer, degree: int, context: SplitContext,
                   sequence_parallel: bool) -> tuple[CommEvent, ...]:
    """The f operator before a column-parallel GEMM (or the all-gather of sequence parallel)."""
    if degree <= 1:
        return ()
    payload = _activation_bytes(layer, context)
    if sequence_parallel:
        gathered = _activation_bytes(layer, context, gather_bytes_per_value(layer, context))
        return (CommEvent("allgather", gathered, degree, PHASE_FORWARD),
                CommEvent("reduce_scatter", payload, degree, PHASE_BACKWARD))
    return (CommEvent("allreduce", payload, degree, PHASE_BACKWARD),)


def _row_events(layer: Layer, degree: int, context: SplitContext,
                sequence_parallel: bool) -> tuple[CommEvent, ...]:
    """The g operator after a row-parallel GEMM (or the reduce-scatter of sequence parallel)."""
    if degree <= 1:
        return ()
    payload = _activation_bytes(layer, context)
    if sequence_parallel:
        gathered = _activation_bytes(layer, context, gather_bytes_per_value(layer, context))
        return (CommEvent("reduce_scatter", payload, degree, PHASE_FORWARD),
                CommEvent("allgather", gathered, degree, PHASE_BACKWARD))
    return (CommEvent("allreduce", payload, degree, PHASE_FORWARD),)


def _split(degree: int) -> float:
    return 1.0 / degree if degree > 1 else 1.0


def megatron_shard(layer: Layer, degree: int, context: SplitContext,
                   sequence_parallel: bool) -> Shard:
    """The split of one layer over a tensor-parallel group of `degree`, by the Megatron rule
    its kind's record names (with or without sequence parallelism)."""
    return shard_layer("megatron", layer, TENSOR, degree,
                       replace(context, sequence_parallel=sequence_parallel))


def _tensor_rule(layer: Layer, shard: Shard, degree: int) -> str | None:
    """The Megatron rule that splits a non-expert `layer` over a tensor group of `degree` > 1
    in `shard`, else None (no tensor split, or an expert layer's own split)."""
    record = record_of(layer)
    if degree > 1 and shard.scheme == TENSOR and not record.expert:
        return record.splits.get("megatron")
    return None


def output_share(layer: Layer, shard: Shard, degree: int, context: SplitContext) -> float:
    """The share of `layer`'s output a member of its `shard` holds once the split's operator
    has run: a row-parallel GEMM's whole output (its partial sums all-reduced) on the member's
    token share, 1/t of that under sequence parallelism (reduce-scattered); any other layer its
    share of the work. What a member's bias add and bias gradient run on (Megatron adds a
    row-parallel layer's bias after the reduction: RowParallelLinear, skip_bias_add)."""
    if _tensor_rule(layer, shard, degree) == "row":
        return context.token_fraction / (degree if context.sequence_parallel else 1)
    return shard.work_fraction


def input_share(layer: Layer, shard: Shard, degree: int, context: SplitContext) -> float:
    """The share of `layer`'s input a member of its `shard` holds: a column-parallel GEMM's
    whole input on the member's token share (all-gathered first under sequence parallelism);
    any other layer its share of the work. What the member's input gradient covers before the
    split's backward operator reduces it."""
    if _tensor_rule(layer, shard, degree) == "column":
        return context.token_fraction
    return shard.work_fraction


@sharding_rule("megatron", "column", TENSOR)
def column_parallel(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """A column-parallel GEMM (QKV projection, the MLP's first linear, the LM head over the
    vocabulary): 1/t of the work after the f operator (Shoeybi et al. 2019 §3)."""
    return Shard(TENSOR, _split(degree), 0,
                 _column_events(layer, degree, context, context.sequence_parallel))


@sharding_rule("megatron", "row", TENSOR)
def row_parallel(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """A row-parallel GEMM (attention output, the MLP's second linear): 1/t of the work, then
    the g operator."""
    return Shard(TENSOR, _split(degree), 0,
                 _row_events(layer, degree, context, context.sequence_parallel))


@sharding_rule("megatron", "vocab_embedding", TENSOR)
def vocab_parallel_embedding(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """The vocabulary-parallel embedding: 1/t of the table, its output all-reduced (a g)."""
    return Shard(TENSOR, _split(degree), 0,
                 _row_events(layer, degree, context, context.sequence_parallel))


@sharding_rule("megatron", "local", TENSOR)
def local_split(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Work between a column- and a row-parallel GEMM (the attention core by heads, the MLP's
    activation by width): 1/t on each member, no communication."""
    return Shard(TENSOR, _split(degree), 0, ())


@sharding_rule("megatron", "vocab_loss", TENSOR)
def vocab_parallel_loss(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Vocabulary-parallel cross-entropy: 1/t of the logits, 3 all-reduces of b·s fp32 values
    (max logit, sum of exponentials, target logit) forward (b·p over the p positions of
    `predictions`)."""
    seq = layer.hyper.get("predictions") or layer.hyper.get("seq")
    tokens = (int(seq) if isinstance(seq, int) else 1) * context.minibatch * context.token_fraction
    events = tuple(CommEvent("allreduce", tokens * LOSS_STATISTIC_BYTES, degree,
                             PHASE_FORWARD) for _ in range(3)) if degree > 1 else ()
    return Shard(TENSOR, _split(degree), 0, events)


@sharding_rule("megatron", "replicated", TENSOR)
def replicated(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Norms, residual adds and kinds Megatron has no split for: whole on every member (their
    parameters replicated), or 1/t of the sequence under sequence parallelism."""
    fraction = _split(degree) if context.sequence_parallel else 1.0
    return Shard(TENSOR, fraction, layer.params if degree > 1 else 0, ())
