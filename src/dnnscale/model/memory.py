"""Memory per device, by part (performance-model.md §5): weights, gradients, optimizer state,
activations on a worker; weights and optimizer state on a parameter-server machine."""

from __future__ import annotations

from typing import NamedTuple

from dnnscale.model.prediction import MemoryPart
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.transformer_kinds import FP32_BYTES, STAT_BYTES


def worker_memory_parts(params_on_worker: float, param_bytes: float, grad_bytes: float,
                        optimizer_state_bytes_per_param: float,
                        activation_values_on_worker: float, activation_bytes: float,
                        minibatch: int) -> tuple[MemoryPart, ...]:
    """Memory one worker needs, by part.

    Formula: weights W_w·b_p, gradient buffer W_w·b_g, optimizer state W_w·s (s bytes of state per
    parameter: o values of b bytes, plus a master copy under mixed precision), activations kept
    for backward A·n·b_a (A values per sample on this worker, n samples).
    Units: parameters, bytes per value, values, samples -> bytes.
    Source: performance-model.md §5; Rajbhandari et al. SC'20 §3 (the 2+2+12 bytes per parameter
    of mixed-precision Adam).
    """
    return (MemoryPart("weights", params_on_worker * param_bytes),
            MemoryPart("gradients", params_on_worker * grad_bytes),
            MemoryPart("optimizer_state", params_on_worker * optimizer_state_bytes_per_param),
            MemoryPart("activations", activation_values_on_worker * minibatch * activation_bytes))


def ps_memory_parts(params_on_shard: float, param_bytes: float,
                    optimizer_state_bytes_per_param: float) -> tuple[MemoryPart, ...]:
    """Memory one parameter-server machine needs, by part.

    Formula: weights (W/S)·b, optimizer state (W/S)·s   (replication factor 1)
    Units: parameters, bytes per value -> bytes.
    Source: performance-model.md §5.
    """
    return (MemoryPart("ps_weights", params_on_shard * param_bytes, "ps"),
            MemoryPart("ps_optimizer_state", params_on_shard * optimizer_state_bytes_per_param, "ps"))


CUDA_CONTEXT_BYTES = 287_047_680
"""Device memory a PyTorch process's CUDA context takes before any tensor: 287,047,680 bytes
with lazy module loading (CUDA_MODULE_LOADING=LAZY, which PyTorch sets by default since 1.13),
666,632,192 loaded eagerly. Source: pytorch/pytorch pull request #86509 (2022), the figures
its author measured."""
CUBLAS_WORKSPACE_BYTES = 8 * 4 * 2 ** 20
"""cuBLAS's workspace per handle under PyTorch's default CUBLAS_WORKSPACE_CONFIG ":4096:8"
(8 buffers of 4096 KiB). Source: PyTorch docs, "Reproducibility" / torch.backends.cuda."""
NCCL_BUFFER_BYTES = 4 * 2 ** 20
"""NCCL_BUFFSIZE's default: the Simple protocol's buffer per channel and peer, 4 MiB (NCCL
user guide, environment variables)."""
NCCL_CHANNELS = 32
"""Channels NCCL may open per communicator (NCCL_MAX_NCHANNELS's default, 32): with one buffer
to send and one to receive per channel, a communicator holds at most 2 · 32 · 4 MiB = 256 MiB
(an upper bound: NCCL opens fewer channels over a slow link)."""


def device_reserve_bytes(communicators: int) -> float:
    """Device memory no tensor of the model can use: the CUDA context, cuBLAS's workspace and
    NCCL's buffers of each communicator the device is in.

    Formula: C_ctx + W_cublas + g · 2 · n_ch · B_nccl, g the communicators (the device's
    parallel groups of more than one member), n_ch = 32, B_nccl = 4 MiB.
    Units: count -> bytes.
    Source: CUDA_CONTEXT_BYTES, CUBLAS_WORKSPACE_BYTES, NCCL_BUFFER_BYTES, NCCL_CHANNELS (each
    with its source). The caching allocator's fragmentation is not counted: it depends on the
    allocation pattern, and no published figure fits every workload.
    """
    return (CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
            + communicators * 2 * NCCL_CHANNELS * NCCL_BUFFER_BYTES)


def parallel_groups(plan: ParallelPlan) -> int:
    """The parallel groups of more than one member a device of `plan` is in (its mesh's
    dimensions of size > 1), each an NCCL communicator."""
    return sum(1 for size in plan.mesh.sizes if size > 1)


def plan_reserve_bytes(plan: ParallelPlan) -> float:
    """device_reserve_bytes of a device of `plan`, one communicator per parallel group."""
    return device_reserve_bytes(parallel_groups(plan))


class MoeActivations(NamedTuple):
    """A mixture of experts' widths for the activation formula: routed copies per token
    (top-k times the busiest member's load factor), the routed experts' activation input and
    output widths, the experts' count (for the router's probabilities) and the shared
    experts' widths (0 without)."""

    copies: float
    expert_in: int
    expert_out: int
    experts: int
    shared_in: int = 0
    shared_out: int = 0
    copies_share: float = 1.0
    """The share of its tensor group's token copies a member holds: etp / tp (1 when the
    experts are split over the whole tensor group)."""


ROUTER_STATE_BYTES = 4
"""The router keeps its E probabilities per token in fp32 for backward."""


def transformer_block_activation_bytes(seq: int, micro_batch: int, hidden: int, heads: int,
                                       kv_hidden: int, ffn_in: int, ffn_out: int, tensor: int,
                                       sequence_parallel: bool, recompute: str,
                                       flash_attention: bool, context: int = 1,
                                       moe: MoeActivations | None = None, memory: int = 0,
                                       relative: bool = False,
                                       fp32_kinds: frozenset[str] = frozenset(),
                                       hidden_dropout: bool = True,
                                       attention_dropout: bool = True,
                                       eager_norms: bool = False,
                                       eager_activation: bool = False) -> float:
    """Activation bytes one transformer block keeps for its backward, per micro-batch.

    Formula: (16-bit activations, 1-byte dropout masks; s seq, b micro-batch, h hidden, a heads,
    h_kv key/value width, f_in/f_out the MLP activation's input/output width, t tensor degree):
      kept whole on each member: 10·s·b·h (two norm inputs 4sbh, the attention and MLP inputs
        4sbh, two dropout masks 2sbh; 8·s·b·h without the hidden dropout, `hidden_dropout`
        false, whose sub-layer outputs join the stream as they are) — divided by t under
        sequence parallelism;
      split by t: 4·s·b·h + 4·s·b·h_kv (Q, K, V, the output projection's input) +
        2·s·b·f_in + 2·s·b·f_out (the MLP activation's input and output);
      the attention core: 5·a·s²·b (softmax output, its dropout mask and output), split by t;
        2·a·s²·b without the attention dropout (`attention_dropout` false: the second batched
        matmul reads the softmax output itself; `softmax_core_bytes_per_score`);
        4·a·s·b (FlashAttention's fp32 log-sum-exp) with flash attention; 0 with selective
        recomputation, which checkpoints either (Megatron-Core: the checkpoint keeps Q, K and
        V, counted below, and the output projection keeps O);
      full recomputation keeps only the block's input, 2·s·b·h (/t under sequence parallel);
      a mixture of experts (`moe`, k' = its copies per token) keeps, instead of the MLP's two
        split terms, the routed copies entering the experts and leaving them (2·2·s·b·k'·h,
        whole: every tensor-parallel member holds its tokens' copies; times etp / t with
        expert tensor parallelism etp < t), the experts'
        activation input and output 2·s·b·k'·(f_in + f_out)/t, the router's fp32
        probabilities 4·s·b·E, and the shared experts' 2·s·b·(f_in + f_out)/t;
      context parallelism (cp members) divides everything by cp (each keeps s/cp tokens);
      a Transformer-XL memory of m tokens (`memory`, keys s_k = s + m) widens what attention
        keeps to its s_k rows: the attention input (the memory and the segment concatenated)
        2·s_k·b·h instead of 2·s·b·h, K and V 4·s_k·b·h_kv, the core 5·a·s·s_k·b; relative
        positions (`relative`) keep the two biased query copies Q + u and Q + v for the two
        score products, 2·s·b·h more (split by t);
      a mixed-precision mode that runs kinds on float32 values (`fp32_kinds`,
        workload/transformer_kinds.AMP_FP32_KINDS) keeps what they save at 4 bytes, 2 more a
        value: the two norm inputs (norms in float32), + 4·s·b·h (/t under sequence
        parallelism); the softmax output of the unfused attention core (attn_softmax), +
        2·a·s·s_k·b/t (its dropped copy is cast to 16 bits for the second batched matmul, which
        keeps that copy; without the dropout the matmul keeps a 16-bit cast of the softmax
        output: + 4·a·s·s_k·b/t over the 16-bit core's 2·a·s·s_k·b); the MLP activation's input
        (mlp_act), + 2·s·b·f_in/t; the block input a checkpoint keeps (a float32 residual
        stream, residual_add), + 2·s·b·h (/t under sequence parallelism);
      RMSNorms run as PyTorch operations (`eager_norms`, TransformerShape.eager) keep the
        fp32 copy of their input (x², x·rsqrt) and their 16-bit normalized output (the gain's
        product) instead of the input: 4 bytes a value more for each of the two, + 8·s·b·h
        (/t under sequence parallelism) whatever the mixed-precision mode
        (transformer_kinds.rmsnorm; torchtitan's RMSNorm at 9dec370); a SwiGLU run op by op
        (`eager_activation`) keeps silu's output for the product's backward as well, one more
        f_out-wide value a row: + 2·s·b·f_out/t (the experts' and shared experts' likewise).
    For MHA with f = 4h this is Korthikanti et al.'s s·b·h·(34 + 5·a·s/h) without tensor
    parallelism, s·b·h·(10 + 24/t + 5·a·s/(h·t)) with it, and (34 + 5·a·s/h)/t with sequence
    parallelism.
    Units: tokens, samples, features, counts -> bytes.
    Source: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models", MLSys 2023, §4 (eq. 1-2) and §5 (selective recomputation); Dao 2023
    (FlashAttention-2 keeps the log-sum-exp only); Megatron-Core's MoE layer (the permuted
    tokens and the experts' activations saved for backward); Dai et al. 2019 and its
    reference code (mem_transformer.py) for the memory and the relative-position terms.
    """
    s, b, h = seq / max(1, context), micro_batch, hidden
    s_k = s + memory / max(1, context)
    t = max(1, tensor)
    block_input = _block_input_bytes(s, b, h, t, sequence_parallel)
    wide_input = block_input if "residual_add" in fp32_kinds else 0.0
    if recompute == "full":
        return block_input + wide_input
    if recompute == "op":
        return (per_op_checkpoint_bytes(s, b, h, heads, kv_hidden, ffn_in, t, sequence_parallel)
                + wide_input)
    wide_norms = (4 if fp32_kinds & {"layernorm", "rmsnorm"} else 0) + (8 if eager_norms else 0)
    masks = 2 if hidden_dropout else 0
    whole = ((6 + masks) * s + 2 * s_k + wide_norms * s) * b * h / (t if sequence_parallel else 1)
    silu = 2 if eager_activation else 0  # an eager SwiGLU's kept silu output, per f_out
    if moe is None:
        wide_act = 2 if "mlp_act" in fp32_kinds else 0
        mlp = ((2 + wide_act) * s * b * ffn_in + (2 + silu) * s * b * ffn_out) / t
    else:
        mlp = (4 * s * b * moe.copies * h * moe.copies_share
               + ROUTER_STATE_BYTES * s * b * moe.experts
               + (s * b * moe.copies * (2 * moe.expert_in + (2 + silu) * moe.expert_out)
                  + s * b * (2 * moe.shared_in + (2 + silu) * moe.shared_out)) / t)
    queries = (6 if relative else 4) * s * b * h
    split = (queries + 4 * s_k * b * kv_hidden) / t + mlp
    if recompute == "selective":
        core = 0.0
    elif flash_attention:
        core = _flash_stat_bytes(heads, s, b, t)
    else:
        core = softmax_core_bytes_per_score("attn_softmax" in fp32_kinds,
                                            attention_dropout) * heads * s * s_k * b / t
    return whole + split + core


def softmax_core_bytes_per_score(fp32_softmax: bool, dropout: bool) -> int:
    """Bytes an unfused attention core keeps per score value for its backward: the softmax
    output P for the softmax's backward (2, or 4 when the softmax runs in float32), and with
    the attention dropout its 1-byte mask and the dropped P the second batched matmul reads
    (16-bit: 2); without the dropout that matmul reads P itself, or, when P is float32, the
    16-bit copy autocast makes of it (2).
    Formula: 2 + 2·w + (3 if dropout else 2·w), w = 1 for a float32 softmax, else 0 (5, 7,
    2, 6). Units: flags -> bytes per score value.
    Source: Korthikanti et al. 2023 §4.1 (5·a·s² bytes with dropout); the fp32 copies as
    `transformer_block_activation_bytes` counts them."""
    wide = 2 if fp32_softmax else 0
    return 2 + wide + (3 if dropout else wide)


def per_op_checkpoint_bytes(seq: float, micro_batch: int, hidden: int, heads: int,
                            kv_hidden: int, ffn_in: int, tensor: int,
                            sequence_parallel: bool) -> float:
    """Activation bytes one dense block keeps under per-operation checkpointing (torchtitan's
    selective_ac_option op, model/stage.PER_OP_RECOMPUTE_SHARE), per micro-batch.

    Formula (16-bit values; s tokens, b samples, h hidden, a heads, h_kv key/value width, f_in
    the up projection's output width (2f gated), t tensor degree): what its save list keeps,
      the checkpoint's input, 2·s·b·h (/t under sequence parallelism);
      half of the matmuls' outputs, on average (every second one is recomputed, alternately):
        ½ · (2·s·b·(h + 2·h_kv + f_in)/t + 2 · 2·s·b·h), the column-parallel outputs split by
        t and the two row-parallel ones whole on each member before their reduction;
      the reduce-scatters' outputs under sequence parallelism (t > 1), 2 · 2·s·b·h/t;
      the attention kernel's output and fp32 log-sum-exp, 2·s·b·h/t + 4·a·s·b/t;
    nothing else (norms, RoPE, the activation and the residual adds are recomputed).
    Units: tokens, samples, features, counts -> bytes.
    Source: torchtitan v0.2.2 distributed/activation_checkpoint.py and models/llama3/infra/
    parallelize.py (_op_sac_save_list: mm, the SDPA kernels, reduce_scatter_tensor, max).
    """
    s, b, h, t = seq, micro_batch, hidden, max(1, tensor)
    block_input = _block_input_bytes(s, b, h, t, sequence_parallel)
    matmuls = (2 * s * b * (h + 2 * kv_hidden + ffn_in) / t + 2 * 2 * s * b * h) / 2
    scatters = 2 * 2 * s * b * h / t if sequence_parallel and t > 1 else 0.0
    attention = 2 * s * b * h / t + _flash_stat_bytes(heads, s, b, t)
    return block_input + matmuls + scatters + attention


def _block_input_bytes(seq: float, micro_batch: int, hidden: int, tensor: int,
                       sequence_parallel: bool) -> float:
    """The block input a checkpoint keeps, 2·s·b·h (16-bit), split by t under sequence
    parallelism."""
    return 2 * seq * micro_batch * hidden / (tensor if sequence_parallel else 1)


def _flash_stat_bytes(heads: int, seq: float, micro_batch: int, tensor: int) -> float:
    """FlashAttention's per-row log-sum-exp, STAT_BYTES·a·s·b, split by t with the heads."""
    return STAT_BYTES * heads * seq * micro_batch / tensor


def loss_bytes_per_logit(kernel: str, logit_bytes: int,
                         vocab_parallel: bool = False) -> tuple[float, float]:
    """(kept, transient) bytes per logit of the language-model loss computed by `kernel`
    (workload/transformer_kinds.py LOSS_KERNELS) on b = `logit_bytes` logits: what each
    micro-batch keeps from its loss's forward until its backward, and what the one being
    computed holds beyond that at its peak.

    inplace: kept 4 (the fp32 softmax); transient b where b < 4 (the b-byte logits beside
      their fp32 copy in the forward, the b-byte gradient beside the fp32 one in the
      backward), 0 at b = 4, where the cast returns the logits themselves.
      Source: megatron/core/tensor_parallel/cross_entropy.py (Megatron-LM d98e8a64):
      calculate_logits_max casts with .float(); the max is subtracted, exp taken
      (torch.exp(out=)) and the sum divided in place; save_for_backward keeps that tensor;
      the backward multiplies it in place and autograd casts the result to the logits' dtype.
      Its fused variant (fusions/fused_cross_entropy.py) keeps the same fp32 softmax.
    torch: kept 4 (the log-softmax); transient 8 (the backward's incoming gradient and its
      result, fp32 each, beside the kept log-softmax; the forward's b-byte logits and fp32
      cast take b + 4 <= 8 beside it).
      Source: torchtitan v0.2.2 components/loss.py (cross_entropy on pred.float(); train.py
      at 9dec370 deletes pred before backward); torch.nn.functional.cross_entropy is
      log_softmax, which saves its output, then nll_loss, whose backward writes a dense
      gradient.
    torch16: kept b (the log-softmax at the logits' width), transient 2b (the backward's
      incoming gradient and its result); torch's at b = 4. Source: as torch, with no cast.
    `vocab_parallel` (the logits split by the vocabulary over a tensor-parallel group, t > 1):
      torch's cross_entropy on such logits is its loss_parallel decomposition (torchtitan's
      default under tensor parallelism), whose passes are separate tensors:
      torch: kept 4; transient 12: the backward builds a zero gradient, exp of the kept
        log-softmax, their sum and its product with the incoming gradient, 4 bytes each, of
        which three are alive beside the kept one (the forward's b-byte logits, fp32 cast,
        shifted logits and their exp or the result, b + 12 <= 16 with the kept one).
      torch16: kept b; transient b + 12: the forward computes in fp32 (the decomposition's
        computation dtype) on a b-byte input: the input's fp32 copy, the shifted logits and
        the fp32 result, 4 each, beside the b-byte logits and the b-byte result it keeps
        (2b + 12); the backward's four passes run at b bytes (4b); torch's at b = 4.
      Source: torch.distributed.tensor.parallel.loss (_log_softmax, after torch._decomp's
      _log_softmax with the all-reduces inserted; _nll_loss_and_log_softmax_backward:
      zeros_like, then (grad_input + exp(x)) * grad_output); torchtitan 9dec370 train.py
      enables it when tp > 1 (training.disable_loss_parallel unset) and its
      parallelize_llama.py leaves the output layer's logits sharded (Shard(-1)). Its time
      is priced as torch's passes (transformer_kinds.loss_traffic_per_logit); the
      decomposition's extra passes over the member's logits are not.
    fused: kept b (the logits themselves; the per-row fp32 log-sum-exp, 1/V of them, is left
      out); transient b (their gradient, a new tensor).
      Source: flash-attn flash_attn/ops/triton/cross_entropy.py: save_for_backward(logits, lse,
      labels); the backward's dlogits = torch.empty_like(logits) unless inplace_backward.
    Units: bytes per value -> bytes per logit.
    """
    if kernel == "fused":
        return float(logit_bytes), float(logit_bytes)
    sixteen = kernel == "torch16" and logit_bytes < FP32_BYTES
    if vocab_parallel and kernel in ("torch", "torch16"):
        if sixteen:
            return float(logit_bytes), logit_bytes + 3.0 * FP32_BYTES
        return float(FP32_BYTES), 3.0 * FP32_BYTES
    if sixteen:
        return float(logit_bytes), 2.0 * logit_bytes
    if kernel in ("torch", "torch16"):
        return float(FP32_BYTES), 2.0 * FP32_BYTES
    return float(FP32_BYTES), float(logit_bytes if logit_bytes < FP32_BYTES else 0)


def loss_bytes(logits: float, held: float, kernel: str, logit_bytes: int,
               vocab_parallel: bool = False) -> float:
    """Memory the language-model loss takes on the device that computes it.

    Formula: L·(n·k + t): L logits per micro-batch on the member, n micro-batches held (each
    keeps k bytes per logit until its backward; in a 1F1B pipeline's last stage or without
    one, n = 1: each micro-batch's loss runs its backward right away), and the one being
    computed holds t more at its peak (k, t: `loss_bytes_per_logit`). The logits' own layer
    keeps nothing for its backward (a linear layer keeps its input), so this replaces that
    layer's output and the loss's output among the activations.
    Units: values, count, bytes per value -> bytes.
    Source: each kernel's code (`loss_bytes_per_logit`); the micro-batches held,
    model/schedule.in_flight_micro_batches.
    """
    kept, transient = loss_bytes_per_logit(kernel, logit_bytes, vocab_parallel)
    return logits * (held * kept + transient)


def recompute_peak_bytes(rerun_bytes: float, loss_peak_bytes: float) -> float:
    """Memory a device needs beyond what it keeps, while a checkpointed block runs its forward
    again in the backward pass (recompute full, selective or op).

    Formula: max(0, R − L): R what the block being recomputed holds for its backward, its
    activations as it would keep them without recomputation less what it keeps with it, for
    one micro-batch (the largest block kind the stage holds); L the loss's peak on the same
    device (`loss_bytes`), which is free by then: its backward runs first, so only the excess
    over it counts.
    Units: bytes -> bytes.
    Source: torch.utils.checkpoint (and Megatron-LM's CheckpointFunction): a checkpointed
    segment's backward re-runs its forward with grad enabled, so its tensors are saved as in a
    plain forward, and frees them with that segment's backward; blocks are recomputed one at
    a time, last first.
    """
    return max(0.0, rerun_bytes - loss_peak_bytes)


def gathered_unit_bytes(unit_params: float, param_bytes: float, grad_bytes: float,
                        gradient_values: float | None = None) -> tuple[float, float]:
    """(weights, gradients) a ZeRO-3 / FSDP member holds whole beyond its shards, at its peak
    in the backward pass, for units of at most `unit_params` parameters (its share of them).

    Formula: weights 2·U·b_p: the unit it computes and the next one, gathered ahead;
    gradients G·b_g, G = `gradient_values`, by default U: the unit's whole gradients before
    their reduce-scatter.
    Units: parameters, bytes per value, values -> bytes.
    Source: torch.distributed.fsdp.FullyShardedDataParallel, limit_all_gathers (default True):
    GPU memory from only two consecutive FSDP instances, the one computing and the next whose
    all-gather is prefetched; the backward's unsharded gradient is reduce-scattered after the
    unit's backward (PyTorch FSDP docs; FSDP2's fully_shard prefetches one unit ahead
    likewise). DeepSpeed's stage 3 (zero3_fetch 'buckets', the caller passes its largest
    all-gather as U: model/zero3_fetch.largest_gather) copies each gradient into a reduce
    bucket allocated whole, reduce_bucket_size values (stage3.py: contiguous_gradients, on by
    default), so G is that size whatever the model; its stage3_max_live_parameters (1e9) bound
    on whole parameters is not reached by the current call and the prefetched one.
    """
    gradients = unit_params if gradient_values is None else gradient_values
    return 2 * unit_params * param_bytes, gradients * grad_bytes


def sharded_state_parts(params: float, param_bytes: float, grad_bytes: float,
                        state_bytes_per_param: float, zero_stage: int,
                        replicas: int) -> tuple[MemoryPart, ...]:
    """Weights, gradients and optimizer state of one device holding `params` parameters of its
    tensor/pipeline shard, under ZeRO stage 0-3 over `replicas` data-parallel members.

    Formula: (Ψ params, d replicas; mixed-precision Adam 2 + 2 + 12 bytes) ZeRO-0 Ψ·(b_p + b_g
    + s); ZeRO-1 the state /d (4Ψ + 12Ψ/d); ZeRO-2 gradients and state /d (2Ψ + 14Ψ/d);
    ZeRO-3 everything /d (16Ψ/d). (ZeRO-2/3 with pp > 1 shard as ZeRO-1: the caller passes
    data_parallel.memory_zero_stage.)
    Units: parameters, bytes per value, count -> bytes.
    Source: Rajbhandari et al., "ZeRO", SC'20 §5.1 (Figure 1).
    """
    d = max(1, replicas)
    weights = params * param_bytes / (d if zero_stage >= 3 else 1)
    gradients = params * grad_bytes / (d if zero_stage >= 2 else 1)
    state = params * state_bytes_per_param / (d if zero_stage >= 1 else 1)
    return (MemoryPart("weights", weights), MemoryPart("gradients", gradients),
            MemoryPart("optimizer_state", state))
