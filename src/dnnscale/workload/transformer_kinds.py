"""Transformer layer kinds: one kind per role in a block, so tensor-parallel rules can tell them
apart. Registered in the kinds registry (workload/kinds.py) when `dnnscale.workload` is imported.

One sample is one sequence of s tokens; every count is per sequence. Notation: h hidden, a
heads, k key/value heads (k = a for multi-head attention, k < a for grouped-query attention,
Ainslie et al. 2023), d = h/a head width, h_kv = k·d, f the MLP's inner width, V vocabulary,
b bytes per activation value (`Workload.bytes_per_value`; 2 for bf16), m the cached memory of
Transformer-XL (0 without one) and s_k = s + m the keys each query attends over.

Conventions as in workload/kinds.py: 1 multiply-add = 2 FLOP and bias adds, norms, softmax,
activations and dropout count 0 FLOP (torch.utils.flop_counter's convention: they are memory
bound and costed by bytes); bytes are activation traffic per sample (parameters, read once per
step, are costed elsewhere). A phase that is not computed (the input gradient of the embedding,
whose input is token ids, or of any layer before the first weighted one) counts 0. Token ids and
targets are int64 (8 bytes); a dropout mask is 1 byte per value (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", §4.1).

Shape keys. Every layer's `hyper` holds the model's shape, so the model never re-derives it:
``block`` (index from 0, None outside the blocks), ``role`` (the layer's place: attn_norm,
attn_qkv, attn_scores, attn_softmax, attn_context, flash_attention, attn_out, attn_residual,
mlp_norm, mlp_up, mlp_act, mlp_down, mlp_residual, embedding, embedding_norm, final_norm,
logits, cross_entropy), ``hidden``, ``heads``, ``kv_heads``, ``seq``, ``ffn``, ``vocab``,
``gated``, ``memory`` (kept only where it is not 0), plus the kind's own options (``bias``,
``causal``, ``dropout``, ``tied``, ``positional``, ``positions``, ``token_types``,
``relative``). A key the kind's formula does not need may be None (layers imported from
PyTorch know only their own module's sizes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dnnscale.errors import MAX_COUNT, InputError, short_repr
from dnnscale.workload.kind_record import LAYER_KINDS, KernelClass, Recompute
from dnnscale.workload.kinds import register_kind
from dnnscale.workload.layer import Layer
from dnnscale.workload.transformer_shape import ATTENTION_KERNELS, POSITIONALS

TOKEN_ID_BYTES = 8     # int64 token ids and targets
MASK_BYTES = 1         # a dropout mask value
STAT_BYTES = 4         # FlashAttention's per-row log-sum-exp is kept in fp32
FP32_BYTES = 4         # a float32 value (autocast's float32 ops)
SHAPE_KEYS = ("block", "role", "hidden", "heads", "kv_heads", "seq", "ffn", "vocab", "gated")
"""The shape keys every transformer layer's `hyper` holds."""
OPTIONAL_SHAPE_KEYS = ("memory", "predictions")
"""Shape keys a layer's `hyper` holds only where they are not 0 (a Transformer-XL's memory; the
positions the LM head runs on, TransformerShape.predictions)."""


# --- the formulas, one place each --------------------------------------------------------------


def token_linear_flops(seq: int, n_in: int, n_out: int) -> float:
    """FLOPs of one phase (forward, input gradient or weight gradient) of a linear layer applied
    to every token of a sequence.

    Formula: 2·s·n_in·n_out (a [s, n_in] x [n_in, n_out] matrix product; the backward's two
    products have the same size). Units: FLOP per sequence. Source: torch.utils.flop_counter's
    mm formula; Narayanan et al. SC'21 §5.1 count the transformer's linears the same way.
    """
    return 2.0 * seq * n_in * n_out


def attention_matmul_flops(seq: int, keys: int, hidden: int) -> float:
    """Forward FLOPs of one of attention's products over s queries and s_k keys: Q·Kᵀ (scores),
    P·V (context), or Transformer-XL's relative-position term (Q + v)·(W_{k,R} R)ᵀ.

    Formula: 2·s·s_k·h: a heads, each an [s, d] x [d, s_k] (or [s, s_k] x [s_k, d]) product,
    a·d = h; s_k = s without a memory (2·s²·h). The full s x s_k rectangle is counted even for
    causal attention: unfused kernels compute it and mask afterwards. Each product's backward
    is two products of the same size (the gradients of both operands), 4·s·s_k·h. Units: FLOP
    per sequence. Source: Narayanan et al. SC'21 §5.1 ("attention ... 4·B·s²·h" forward for
    both); grouped-query attention does not change it (K and V heads are shared, the products
    still run over all a query heads); Dai et al. 2019 §3.3 for the relative term, the same
    product shape.
    """
    return 2.0 * seq * keys * hidden


def flash_attention_flops(seq: int, hidden: int, causal: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs of a fused FlashAttention kernel.

    Formula: forward 4·s²·h, halved with a causal mask (the kernel skips the masked blocks);
    backward 2.5 x forward: 5 products (S = Q·Kᵀ recomputed from Q, K and the saved per-row
    log-sum-exp, then dV, dP, dQ, dK) against the forward's 2. Units: FLOP per sequence.
    Source: Dao 2023, "FlashAttention-2", §4.1 (the FLOP count used for its benchmarks: 4 ·
    seqlen² · head dim · heads forward, /2 when causal, x2.5 backward because of recomputation);
    Dao et al. 2022, "FlashAttention", §3.1 (the backward recomputes S and P instead of reading
    an s x s tensor).
    """
    forward = 4.0 * seq * seq * hidden / (2.0 if causal else 1.0)
    return forward, 2.5 * forward


# --- shape keys ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dims:
    s: int
    h: int | None
    a: int | None
    k: int | None
    f: int | None
    V: int | None
    gated: bool
    m: int = 0
    p: int = 0

    @property
    def keys(self) -> int:
        """s_k = s + m."""
        return self.s + self.m

    @property
    def predicted(self) -> int:
        """The positions per sequence the LM head runs on: p, or all s."""
        return self.p or self.s

    @property
    def h_kv(self) -> int:
        assert self.h is not None and self.a is not None and self.k is not None
        return self.k * (self.h // self.a)


def _positive(name: str, key: str, value: object, required: bool) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        problem = "missing" if value is None else \
            f"must be an integer in [1, {MAX_COUNT:,}], got {short_repr(value)}"
        raise InputError(f"layers.{name}.{key}", problem)
    return value


def _count(name: str, key: str, value: object) -> int:
    """`value` as an integer in [0, MAX_COUNT] (0: none), else InputError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise InputError(f"layers.{name}.{key}", f"must be an integer in [0, {MAX_COUNT:,}], "
                         f"got {short_repr(value)}")
    return value


def _dims(kind: str, name: str, shape: dict[str, object], needs: tuple[str, ...]
          ) -> tuple[_Dims, dict[str, object]]:
    """Validate the shape keys of a `kind` layer; `needs` are the keys its formula uses.

    Returns the dimensions and the layer's hyper dict (every shape key, kv_heads resolved)."""
    unknown = sorted(set(shape) - {*SHAPE_KEYS, *OPTIONAL_SHAPE_KEYS})
    if unknown:
        raise InputError(f"layers.{name}.{unknown[0]}", f"unknown field for a {kind} layer")
    h = _positive(name, "hidden", shape.get("hidden"), "hidden" in needs)
    a = _positive(name, "heads", shape.get("heads"), "heads" in needs)
    k = _positive(name, "kv_heads", shape.get("kv_heads"), False)
    k = a if k is None else k
    s = _positive(name, "seq", shape.get("seq"), True)
    f = _positive(name, "ffn", shape.get("ffn"), "ffn" in needs)
    V = _positive(name, "vocab", shape.get("vocab"), "vocab" in needs)
    gated = shape.get("gated", False)
    if not isinstance(gated, bool):
        raise InputError(f"layers.{name}.gated", f"must be true or false, got {short_repr(gated)}")
    if h is not None and a is not None and h % a:
        raise InputError(f"layers.{name}.heads", f"{a} heads do not divide hidden size {h}")
    if a is not None and k is not None and a % k:
        raise InputError(f"layers.{name}.kv_heads", f"{k} key/value heads do not divide {a} "
                         f"heads")
    memory = _count(name, "memory", shape.get("memory", 0))
    predictions = shape.get("predictions", 0)
    if (isinstance(predictions, bool) or not isinstance(predictions, int)
            or not 0 <= predictions <= (s or 0)):
        raise InputError(f"layers.{name}.predictions", f"must be an integer in [0, seq = {s}], "
                         f"got {short_repr(predictions)}")
    block = shape.get("block")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 0):
        raise InputError(f"layers.{name}.block", f"must be an integer >= 0 or null, got {short_repr(block)}")
    hyper: dict[str, object] = {"block": block, "role": str(shape.get("role") or kind),
                                "hidden": h, "heads": a, "kv_heads": k, "seq": s, "ffn": f,
                                "vocab": V, "gated": gated}
    if memory:
        hyper["memory"] = memory
    if predictions:
        hyper["predictions"] = predictions
    assert s is not None
    return _Dims(s=s, h=h, a=a, k=k, f=f, V=V, gated=gated, m=memory, p=predictions), hyper


def _flag(name: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"layers.{name}.{key}", f"must be true or false, got {short_repr(value)}")
    return value


def _expect(kind: str, name: str, input_shape: tuple[int, ...],
            expected: tuple[int, ...], meaning: str) -> None:
    if tuple(input_shape) != expected:
        raise InputError(f"layers.{name}", f"a {kind} layer here needs a {meaning} input of shape "
                         f"{list(expected)}, got {list(input_shape)}")


def _layer(kind: str, name: str, input_shape: tuple[int, ...], output_shape: tuple[int, ...],
           params: int, flops: tuple[float, float, float], moved: tuple[float, float, float],
           needs_input_grad: bool, hyper: dict[str, object], in_features: int | None = None,
           out_features: int | None = None) -> Layer:
    fwd, input_grad, weight_grad = flops
    fwd_bytes, input_grad_bytes, weight_grad_bytes = moved
    if not needs_input_grad:
        input_grad, input_grad_bytes = 0.0, 0.0
    return Layer(name=name, kind=kind, input_shape=tuple(input_shape), output_shape=output_shape,
                 params=params, fwd_flops=fwd, input_grad_flops=input_grad,
                 weight_grad_flops=weight_grad, fwd_bytes=fwd_bytes,
                 input_grad_bytes=input_grad_bytes, weight_grad_bytes=weight_grad_bytes,
                 in_features=in_features, out_features=out_features, hyper=hyper)


def _token_linear(kind: str, name: str, input_shape: tuple[int, ...], b: int,
                  needs_input_grad: bool, dims: _Dims, hyper: dict[str, object], n_in: int,
                  n_out: int, bias: bool, weights: bool = True, tokens: int | None = None,
                  extra_forward_bytes: float = 0.0) -> Layer:
    """A linear n_in -> n_out on each of the s tokens of its (s, n_in) input, or on `tokens`
    rows (the s tokens and a memory's): FLOPs `token_linear_flops` per phase; bytes as the
    `linear` kind (per phase (t·n_in + t·n_out)·b for t rows, plus `extra_forward_bytes`
    forward); params n_in·n_out (0 when the weight is another layer's, see `logits`) + n_out
    bias."""
    s = dims.s
    rows = s if tokens is None else tokens
    _expect(kind, name, input_shape, (s, n_in), f"(seq, {n_in})")
    hyper["bias"] = _flag(name, "bias", bias)
    flops = token_linear_flops(rows, n_in, n_out)
    moved = float((rows * n_in + rows * n_out) * b)
    params = (n_in * n_out if weights else 0) + (n_out if bias else 0)
    return _layer(kind, name, input_shape, (rows, n_out), params, (flops, flops, flops),
                  (moved + extra_forward_bytes, moved, moved), needs_input_grad, hyper,
                  in_features=n_in, out_features=n_out)


# --- the kinds -----------------------------------------------------------------------------------


def megatron(rule: str) -> dict[str, str]:
    """A transformer kind's split rules: Megatron's `rule` (model/megatron_rules.py: column,
    row, local, vocab_embedding, vocab_loss, replicated) and Adam's neuron split (the output's
    features), what a tensor split under Adam's rules does to it."""
    return {"megatron": rule, "adam": "neurons"}


@register_kind("embedding", kernel=KernelClass.MEMORY, splits=megatron("vocab_embedding"))
def embedding(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool, positional: str = "none", positions: int = 0,
              token_types: int = 0, **shape: object) -> Layer:
    """Token lookup in a V x h table (s ids -> s x h), plus a learned position table
    (`positional: learned`, `positions` rows, GPT-2/3, BERT) and a token-type table (BERT's
    segments, `token_types` rows) added in the same pass. RoPE positions have no table
    (`positional: rope`; the rotation, memory bound, is not counted); nor have Transformer-XL's
    relative positions (`positional: relative`: the sinusoids are computed, their projections
    are each block's, attn_scores), whose two bias vectors u and v, shared by all blocks (Dai et
    al. 2019 §3.3), are counted here: 2·h more params.

    Params: (V + positions + token_types)·h (+ 2·h relative). FLOPs: 0 (a gather; the backward scatter-adds
    rows). Bytes, with r tables: forward s·8 (ids) + r·s·h·b (rows read) + s·h·b (written);
    weight gradient s·8 + s·h·b (read grad_out) + 2·r·s·h·b (read-modify-write the touched
    rows of each gradient table); no input gradient (the input is ids).
    """
    dims, hyper = _dims("embedding", name, shape, ("hidden", "vocab"))
    s, h, V = dims.s, dims.h, dims.V
    assert h is not None and V is not None
    _expect("embedding", name, input_shape, (s,), "(seq,) token-id")
    if positional not in POSITIONALS:
        raise InputError(f"layers.{name}.positional", f"must be one of {', '.join(POSITIONALS)}, "
                         f"got {short_repr(positional)}")
    for key, value in (("positions", positions), ("token_types", token_types)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise InputError(f"layers.{name}.{key}", f"must be an integer in [0, {MAX_COUNT:,}], "
                             f"got {short_repr(value)}")
    if positional == "learned" and positions < s:
        raise InputError(f"layers.{name}.positions", f"a learned position table needs at least "
                         f"seq = {s} rows, got {positions}")
    if positional != "learned" and positions:
        raise InputError(f"layers.{name}.positions", "only a learned position table has rows")
    hyper.update(positional=positional, positions=positions, token_types=token_types)
    b = bytes_per_value
    tables = 1 + (positions > 0) + (token_types > 0)
    fwd = s * TOKEN_ID_BYTES + tables * s * h * b + s * h * b
    wgrad = s * TOKEN_ID_BYTES + s * h * b + 2 * tables * s * h * b
    biases = 2 * h if positional == "relative" else 0
    return _layer("embedding", name, (s,), (s, h), (V + positions + token_types) * h + biases,
                  (0.0, 0.0, 0.0), (float(fwd), 0.0, float(wgrad)), False, hyper)


def _norm(kind: str, name: str, input_shape: tuple[int, ...], b: int, needs_input_grad: bool,
          shape: dict[str, object], gains: int, stats: int,
          options: dict[str, object] | None = None) -> Layer:
    dims, hyper = _dims(kind, name, shape, ("hidden",))
    hyper.update(options or {})
    s, h = dims.s, dims.h
    assert h is not None
    _expect(kind, name, input_shape, (s, h), "(seq, hidden)")
    if hyper.get("eager"):
        moved = _eager_rmsnorm_bytes(s, h, b)
    else:
        # forward reads x, writes y; the gain kernel reads grad_y and x: the same bytes, with
        # the statistics; grad_x reads grad_y and x and writes grad_x (`_layer` drops it when
        # not needed)
        fwd = float((2 * s * h + stats * s) * b)
        moved = (fwd, float((3 * s * h + stats * s) * b), fwd)
    return _layer(kind, name, (s, h), (s, h), gains * h, (0.0, 0.0, 0.0), moved,
                  needs_input_grad, hyper)


def _eager_rmsnorm_bytes(s: int, h: int, b: int) -> tuple[float, float, float]:
    """(forward, input-gradient, weight-gradient) bytes of an RMSNorm run op by op
    (`rmsnorm`'s `eager` gives the passes)."""
    cast = b + FP32_BYTES if b < FP32_BYTES else 0
    return (float((2 * cast + 20 + 2 * b) * s * h + 24 * s),
            float((2 * b + 2 * cast + 68) * s * h + 24 * s), float(4 * b * s * h))


@register_kind("layernorm", kernel=KernelClass.MEMORY, splits=megatron("replicated"))
def layernorm(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool, bias: bool = True, **shape: object) -> Layer:
    """LayerNorm over h for each token (Ba et al. 2016): memory bound, 0 FLOP.

    Params 2h (gain and bias; h with `bias: false`). Bytes: forward reads x (s·h) and writes y
    (s·h) plus the mean and 1/std kept for backward (2 per token): (2·s·h + 2·s)·b; input
    gradient reads grad_y, x and the statistics and writes grad_x, (3·s·h + 2·s)·b; weight
    gradient: the gain (and bias) gradients are a column reduction in a second kernel that
    reads grad_y, x and the statistics again, (2·s·h + 2·s)·b (its h-sized write is per step).
    Source: torch's layer_norm_backward_cuda (aten/src/ATen/native/cuda/layer_norm_kernel.cu)
    runs layer_norm_grad_input_kernel for grad_x, then GammaBetaBackward for the gain and bias;
    Apex's fused LayerNorm (Megatron) likewise cuComputeGradInput, then
    cuComputePartGradGammaBeta over grad_y and x. Not distinguished: Transformer Engine's
    normalization backward forms partial gain gradients inside its input-gradient kernel.
    """
    has_bias = _flag(name, "bias", bias)
    return _norm("layernorm", name, input_shape, bytes_per_value, needs_input_grad, shape,
                 2 if has_bias else 1, 2, {"bias": has_bias})


@register_kind("rmsnorm", kernel=KernelClass.MEMORY, splits=megatron("replicated"))
def rmsnorm(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
            needs_input_grad: bool, eager: bool = False, **shape: object) -> Layer:
    """RMSNorm over h for each token (Zhang & Sennrich 2019; Llama): memory bound, 0 FLOP.

    Params h (a gain). Bytes as `layernorm` with one statistic per token (1/rms): forward
    (2·s·h + s)·b, input gradient (3·s·h + s)·b, weight gradient (the gain's column reduction,
    its own kernel as in `layernorm`) (2·s·h + s)·b.

    `eager`: the norm as PyTorch code writes it, run op by op (torchtitan's RMSNorm at 9dec370,
    ``self._norm(x.float()).type_as(x) * self.weight``; Hugging Face's LlamaRMSNorm does the
    same passes), each op reading its inputs and writing its output once, in fp32 between the
    casts (4 bytes a value; c = b + 4 a cast, 0 at b = 4, where .float() returns x itself):
      forward: the cast c, x² 8, the row mean 4, x·rsqrt 8, the cast back c, the gain 2b:
        (2c + 20 + 2b)·s·h (36 at b = 2), + 24·s for the per-token mean, eps add and rsqrt;
      input gradient (autograd's formulas): the gain's product 2b, the cast's c, the
        product's two gradients g·rsqrt 8 and g·x 12 with its row sum 4, the mean's expanded
        gradient 4, the square's (pow_backward: x¹ copied 8, times 2 8, times the gradient 12)
        28, the two gradients of x summed 12, the cast back c: (2b + 2c + 68)·s·h (84 at
        b = 2), + 24·s;
      weight gradient: the gradient times the normalized values and their column sum, 4b·s·h.
    Launches are counted as the fused kernel's (each op here is one large, bandwidth-bound
    kernel at training sizes).
    Source: torchtitan 9dec370 torchtitan/models/norms.py (RMSNorm); PyTorch's autograd
    formulas (tools/autograd/derivatives.yaml: mul, pow_backward, mean, to).
    """
    return _norm("rmsnorm", name, input_shape, bytes_per_value, needs_input_grad, shape, 1, 1,
                 {"eager": True} if _flag(name, "eager", eager) else None)


@register_kind("attn_qkv", kernel=KernelClass.GEMM, splits=megatron("column"),
               tensor_extent_key="kv_heads", fp8_gemm=True)
def attn_qkv(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
             needs_input_grad: bool, bias: bool = True, separate: bool = False,
             **shape: object) -> Layer:
    """The fused Q, K, V projection h -> h + 2·h_kv (3h for multi-head attention; grouped-query
    attention shares each K/V head among a/k query heads). Megatron splits it by heads
    (column parallel, Shoeybi et al. 2019 §3).

    FLOPs per phase 2·s·h·(h + 2·h_kv) (`token_linear_flops`); params h·(h + 2·h_kv) + bias.
    With a memory of m cached hidden states (Transformer-XL) it projects the concatenation of
    the memory and the segment, s_k = s + m rows, to an (s_k, h + 2·h_kv) Q|K|V: FLOPs per
    phase 2·s_k·h·(h + 2·h_kv), and the concatenation's copy, 2·s_k·h·b, forward. The
    reference implementations (kimiyoung/transformer-xl and NVIDIA DeepLearningExamples'
    mem_transformer.py: qkv_net applied to cat([mems, w])) project all s_k rows, the memory's
    queries too, and form the input gradient of the whole concatenation, of which the memory's
    rows are dropped (the stop-gradient): so all three phases run on s_k rows.

    `separate`: Q, K and V are three Linear modules (BERT's reference code and its PyTorch and
    Hugging Face ports, torchtitan's wq / wk / wv): `projections` [h, h_kv, h_kv], the output
    widths of the three GEMMs each phase runs (model/gpu_compute.projection_shares); the counts
    are the fused projection's.
    """
    dims, hyper = _dims("attn_qkv", name, shape, ("hidden", "heads"))
    assert dims.h is not None
    if _flag(name, "separate", separate):
        hyper["projections"] = [dims.h, dims.h_kv, dims.h_kv]
    concatenation = 2.0 * dims.keys * dims.h * bytes_per_value if dims.m else 0.0
    return _token_linear("attn_qkv", name, input_shape, bytes_per_value, needs_input_grad, dims,
                         hyper, dims.h, dims.h + 2 * dims.h_kv, bias, tokens=dims.keys,
                         extra_forward_bytes=concatenation)


def _qkv_input(kind: str, name: str, input_shape: tuple[int, ...], dims: _Dims) -> None:
    assert dims.h is not None
    _expect(kind, name, input_shape, (dims.keys, dims.h + 2 * dims.h_kv),
            "(seq + memory, hidden + 2·kv_hidden) Q|K|V")


@register_kind("rope", kernel=KernelClass.MEMORY, splits=megatron("local"),
               tensor_extent_key="heads")
def rope(name: str, input_shape: tuple[int, ...], bytes_per_value: int, needs_input_grad: bool,
         eager: bool = False, **shape: object) -> Layer:
    """Rotary position embedding (Su et al. 2021, RoFormer): Q and K rotated by position,
    (s, h + 2·h_kv) Q|K|V -> the same (V passes untouched). Memory bound, 0 FLOP (its three
    multiply-adds a value are left out, as the norms' arithmetic is). No weights.

    Bytes per value of Q and K (h + h_kv a token; the cos and sin tables, s·d values shared
    by the micro-batch's samples, are left out): fused (one kernel each way: Megatron-Core's
    and Transformer Engine's fused RoPE, torch.compile) forward reads and writes it, 2b; its
    input gradient is the inverse rotation of the gradient, 2b. `eager` (torchtitan's
    apply_rotary_emb at 9dec370 run op by op: the values cast to fp32, viewed as complex
    pairs, multiplied by the complex frequencies, cast back): forward the cast c, the
    product 8, the cast back c; the input gradient the same three passes (the product's
    gradient is the gradient times the conjugate frequencies): 2c + 8 each way, c = b + 4
    (0 at b = 4). Hugging Face's rotate_half form (two products, a negated half, a
    concatenation and a sum) moves 10b, the same 20 bytes at b = 2.
    Source: torchtitan/models/llama/model.py (apply_rotary_emb) at 9dec370; RoPE is applied
    to Q and K only (Su et al. 2021 §3.4).
    """
    dims, hyper = _dims("rope", name, shape, ("hidden", "heads"))
    _qkv_input("rope", name, input_shape, dims)
    assert dims.h is not None
    if _flag(name, "eager", eager):
        hyper["eager"] = True
    b = bytes_per_value
    cast = b + FP32_BYTES if b < FP32_BYTES else 0
    per_value = 2 * cast + 2 * FP32_BYTES if eager else 2 * b
    moved = float(per_value * dims.s * (dims.h + dims.h_kv))
    return _layer("rope", name, input_shape, tuple(input_shape), 0, (0.0, 0.0, 0.0),
                  (moved, moved, 0.0), needs_input_grad, hyper)


@register_kind("attn_scores", kernel=KernelClass.ATTENTION, splits=megatron("local"),
               tensor_extent_key="heads", recompute=Recompute.ATTENTION_CORE)
def attn_scores(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                needs_input_grad: bool, causal: bool = True, relative: bool = False,
                **shape: object) -> Layer:
    """Scores S = Q·Kᵀ/√d per head: (s_k, h + 2·h_kv) Q|K|V -> (a, s, s_k), the s queries
    over the s_k = s + m keys (s_k = s without a memory). No weights.

    FLOPs: forward 2·s·s_k·h (`attention_matmul_flops`), input gradient 4·s·s_k·h (dQ = dS·K
    and dK = dSᵀ·Q), weight gradient 0. The scaling and the causal mask are memory bound and
    fused. Bytes: forward reads Q and K, writes S: (s·h + s_k·h_kv + a·s·s_k)·b; input gradient
    reads dS, Q, K and writes dQ, dK: (a·s·s_k + 2·(s·h + s_k·h_kv))·b.

    `relative` (Transformer-XL's relative positions, Dai et al. 2019 §3.3, terms (a)-(d) as its
    reference code computes them): S = ((Q + u)·Kᵀ + shift((Q + v)·(W_{k,R} R)ᵀ))/√d, R the
    s_k sinusoid position vectors (shared by the micro-batch's samples), W_{k,R} this block's
    h x h weights, u and v bias vectors shared by all blocks (counted at the embedding).
      Params: h² (W_{k,R}).
      FLOPs: forward 2 x 2·s·s_k·h (the two products); input gradient 2 x 4·s·s_k·h (dQ and dK
        of the first, dQ and d(W_{k,R} R) of the second). The projection W_{k,R} R itself,
        2·s_k·h² forward and 2·s_k·h² for W_{k,R}'s gradient, runs once per micro-batch on the
        shared R, not once per sample: per sample it is that over the micro-batch, which a
        workload (counts per sample) does not know; it is not counted (at the published rows'
        micro-batches of 4 to 32 it is 0.4-3 % of a block's FLOPs).
      Bytes, on top of the plain scores': forward + (5·s·h + 6·a·s·s_k)·b (the u and v adds
        read Q and write two copies, 4·s·h; the second product reads Q + v, s·h, and writes
        its scores, a·s·s_k; the shift copies them, 2·a·s·s_k; the add-and-scale reads both
        score tensors and writes S, 3·a·s·s_k, where the plain scores write S directly);
        input gradient + (5·a·s·s_k + 5·s·h)·b (the add-and-scale's backward reads dS and
        writes the scores' gradient, 2·a·s·s_k; the shift's backward copies it back, 2·a·s·s_k;
        the second product reads it and Q + v, a·s·s_k + s·h, and writes dQ, s·h; the two dQ
        are summed, 3·s·h).
    Source: mem_transformer.py's RelPartialLearnableMultiHeadAttn (kimiyoung/transformer-xl,
    NVIDIA DeepLearningExamples' PyTorch Transformer-XL).
    """
    dims, hyper = _dims("attn_scores", name, shape, ("hidden", "heads"))
    _qkv_input("attn_scores", name, input_shape, dims)
    hyper["causal"] = _flag(name, "causal", causal)
    if _flag(name, "relative", relative):
        hyper["relative"] = True
    s, s_k, h, a, h_kv = dims.s, dims.keys, dims.h, dims.a, dims.h_kv
    assert h is not None and a is not None
    products = 2 if relative else 1
    fwd = products * attention_matmul_flops(s, s_k, h)
    b, scores = bytes_per_value, a * s * s_k
    moved = [float((s * h + s_k * h_kv + scores) * b),
             float((scores + 2 * (s * h + s_k * h_kv)) * b), 0.0]
    if relative:
        moved[0] += (5 * s * h + 6 * scores) * b
        moved[1] += (5 * scores + 5 * s * h) * b
    return _layer("attn_scores", name, input_shape, (a, s, s_k), h * h if relative else 0,
                  (fwd, 2 * fwd, 0.0), (moved[0], moved[1], moved[2]), needs_input_grad, hyper)


@register_kind("attn_softmax", kernel=KernelClass.MEMORY, splits=megatron("local"),
               tensor_extent_key="heads", recompute=Recompute.ATTENTION_CORE)
def attn_softmax(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, causal: bool = True, dropout: bool = True,
                 unfused: bool = False, **shape: object) -> Layer:
    """Softmax over each of the a·s score rows, then attention dropout: (a, s, s_k) ->
    (a, s, s_k) (s_k = s without a memory). Memory bound, 0 FLOP (Megatron fuses mask, scale
    and softmax in one kernel).

    Bytes: forward reads S and writes P, (2·a·s·s_k)·b; with dropout it also writes the
    dropped P and the mask, + (b + 1)·a·s·s_k. Input gradient reads dP' and P and writes dS,
    3·a·s·s_k·b, + a·s·s_k (the mask) with dropout. (Korthikanti et al. 2022 §4.1 keep P, the
    mask and the dropped P for backward: 5·a·s² bytes per block in bf16.)

    `unfused`: the causal mask, the softmax and the dropout run as three kernels, as
    Transformer-XL's reference code runs them (mem_transformer.py's
    RelPartialLearnableMultiHeadAttn: attn_score.masked_fill_, F.softmax, nn.Dropout, eager):
    the mask reads and writes S in place, 2·b, and its backward reads and writes dS, 2·b; the
    dropout reads P again, b, and its backward writes dP for the softmax's backward to read,
    2·b. Per score value: forward 2b (mask, if causal) + 2b + (2b + 1) (dropout) = 6b + 1,
    input gradient (2b + 1) + 3b + 2b = 7b + 1, where the fused kernels move 3b + 1 and 3b + 1.
    The saved tensors are the same (P and the mask), so its memory is.
    """
    dims, hyper = _dims("attn_softmax", name, shape, ("heads",))
    s, a = dims.s, dims.a
    assert a is not None
    _expect("attn_softmax", name, input_shape, (a, s, dims.keys), "(heads, seq, seq + memory) "
            "score")
    hyper["causal"] = _flag(name, "causal", causal)
    hyper["dropout"] = _flag(name, "dropout", dropout)
    if _flag(name, "unfused", unfused):
        hyper["unfused"] = True
    b, values = bytes_per_value, a * s * dims.keys
    if unfused:
        mask = 2 * b if causal else 0
        fwd = (mask + 2 * b + (2 * b + MASK_BYTES if dropout else 0)) * values
        bwd = ((2 * b + MASK_BYTES if dropout else 0) + 3 * b + mask) * values
    else:
        fwd = 2 * values * b + ((b + MASK_BYTES) * values if dropout else 0)
        bwd = 3 * values * b + (MASK_BYTES * values if dropout else 0)
    return _layer("attn_softmax", name, input_shape, (a, s, dims.keys), 0, (0.0, 0.0, 0.0),
                  (float(fwd), float(bwd), 0.0), needs_input_grad, hyper)


@register_kind("attn_context", kernel=KernelClass.ATTENTION, splits=megatron("local"),
               tensor_extent_key="heads", recompute=Recompute.ATTENTION_CORE)
def attn_context(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, **shape: object) -> Layer:
    """Context O = P·V per head, heads concatenated: (a, s, s_k) probabilities -> (s, h) (s_k =
    s without a memory). V comes from the Q|K|V projection (outside the chain). No weights.

    FLOPs: forward 2·s·s_k·h (`attention_matmul_flops`), input gradient 4·s·s_k·h (dP = dO·Vᵀ
    and dV = Pᵀ·dO), weight gradient 0. Bytes: forward reads P and V, writes O:
    (a·s·s_k + s_k·h_kv + s·h)·b; input gradient reads dO, P, V and writes dP, dV:
    (2·a·s·s_k + s·h + 2·s_k·h_kv)·b.
    """
    dims, hyper = _dims("attn_context", name, shape, ("hidden", "heads"))
    s, s_k, h, a, h_kv = dims.s, dims.keys, dims.h, dims.a, dims.h_kv
    assert h is not None and a is not None
    _expect("attn_context", name, input_shape, (a, s, s_k), "(heads, seq, seq + memory) "
            "probability")
    fwd = attention_matmul_flops(s, s_k, h)
    b = bytes_per_value
    moved = (float((a * s * s_k + s_k * h_kv + s * h) * b),
             float((2 * a * s * s_k + s * h + 2 * s_k * h_kv) * b), 0.0)
    return _layer("attn_context", name, input_shape, (s, h), 0, (fwd, 2 * fwd, 0.0), moved,
                  needs_input_grad, hyper)


@register_kind("flash_attention", kernel=KernelClass.FLASH, splits=megatron("local"),
               tensor_extent_key="heads", recompute=Recompute.ATTENTION_CORE)
def flash_attention(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                    needs_input_grad: bool, causal: bool = True,
                    attention_kernel: str = "fa2", **shape: object) -> Layer:
    """Fused attention (FlashAttention-2): Q|K|V (s, h + 2·h_kv) -> O (s, h), replacing
    attn_scores + attn_softmax + attn_context. No weights. `attention_kernel`
    (ATTENTION_KERNELS) is the implementation that runs it: it changes no count, only the
    kernel's published speed (system/attention_kernels.py).

    FLOPs: `flash_attention_flops`: forward 4·s²·h (/2 causal); input gradient 2.5 x forward,
    which includes recomputing S = Q·Kᵀ (one forward product); weight gradient 0.
    Bytes: no s x s tensor reaches HBM. Forward reads Q, K, V and writes O and the per-row
    log-sum-exp (a·s values, fp32): (2·s·h + 2·s·h_kv)·b + 4·a·s; input gradient reads Q, K,
    V, O, dO and the log-sum-exp and writes dQ, dK, dV: (4·s·h + 4·s·h_kv)·b + 4·a·s. Each
    tensor is counted once: the K/V tiles re-read for every block of queries (FlashAttention's
    Θ(s²·d²/M) HBM accesses, Dao et al. 2022 Theorem 2) are assumed to hit the L2 cache.
    Selective recomputation runs its forward again in the backward pass, as Megatron-Core does
    (its checkpoint of the core attention wraps the fused kernel, Recompute.ATTENTION_CORE);
    Megatron-DeepSpeed and torchtitan keep its outputs instead (plan/engines.py says so).
    """
    dims, hyper = _dims("flash_attention", name, shape, ("hidden", "heads"))
    if dims.m:
        raise InputError(f"layers.{name}.memory", "fused attention over a recurrence memory is "
                         "not priced: use attn_scores, attn_softmax and attn_context")
    _qkv_input("flash_attention", name, input_shape, dims)
    hyper["causal"] = _flag(name, "causal", causal)
    if attention_kernel not in ATTENTION_KERNELS:
        raise InputError(f"layers.{name}.attention_kernel", f"must be one of "
                         f"{', '.join(ATTENTION_KERNELS)}, got {short_repr(attention_kernel)}")
    hyper["attention_kernel"] = attention_kernel
    s, h, a, h_kv = dims.s, dims.h, dims.a, dims.h_kv
    assert h is not None and a is not None
    fwd, bwd = flash_attention_flops(s, h, causal)
    b = bytes_per_value
    moved = (float((2 * s * h + 2 * s * h_kv) * b + STAT_BYTES * a * s),
             float((4 * s * h + 4 * s * h_kv) * b + STAT_BYTES * a * s), 0.0)
    return _layer("flash_attention", name, input_shape, (s, h), 0, (fwd, bwd, 0.0), moved,
                  needs_input_grad, hyper)


@register_kind("attn_out", kernel=KernelClass.GEMM, splits=megatron("row"),
               tensor_extent_key="heads", fp8_gemm=True)
def attn_out(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
             needs_input_grad: bool, bias: bool = True, **shape: object) -> Layer:
    """Attention's output projection h -> h; Megatron splits it by rows (row parallel, its
    all-reduce follows). FLOPs per phase 2·s·h²; params h² + bias."""
    dims, hyper = _dims("attn_out", name, shape, ("hidden",))
    assert dims.h is not None
    return _token_linear("attn_out", name, input_shape, bytes_per_value, needs_input_grad, dims,
                         hyper, dims.h, dims.h, bias)


@register_kind("residual_add", kernel=KernelClass.MEMORY, splits=megatron("replicated"))
def residual_add(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, dropout: bool = True, **shape: object) -> Layer:
    """Dropout on a sub-layer's output, then the residual add (Megatron's fused bias-dropout-
    add): (s, h) -> (s, h); the skip input is the block's stream, outside the chain. 0 FLOP.

    Bytes: forward reads the branch and the skip and writes the sum, 3·s·h·b, + s·h mask bytes
    with dropout. Input gradient: where the stream forks, its two gradients are summed (read 2,
    write 1: 3·s·h·b); with dropout the branch's gradient also goes through the mask, + (2·b +
    1)·s·h.
    """
    dims, hyper = _dims("residual_add", name, shape, ("hidden",))
    s, h = dims.s, dims.h
    assert h is not None
    _expect("residual_add", name, input_shape, (s, h), "(seq, hidden)")
    hyper["dropout"] = _flag(name, "dropout", dropout)
    b, values = bytes_per_value, s * h
    fwd = 3 * values * b + (MASK_BYTES * values if dropout else 0)
    bwd = 3 * values * b + ((2 * b + MASK_BYTES) * values if dropout else 0)
    return _layer("residual_add", name, (s, h), (s, h), 0, (0.0, 0.0, 0.0),
                  (float(fwd), float(bwd), 0.0), needs_input_grad, hyper)


def _mlp_inner(dims: _Dims) -> int:
    assert dims.f is not None
    return 2 * dims.f if dims.gated else dims.f


@register_kind("mlp_up", kernel=KernelClass.GEMM, splits=megatron("column"),
               tensor_extent_key="ffn", fp8_gemm=True)
def mlp_up(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
           needs_input_grad: bool, bias: bool = True, separate: bool = False,
           **shape: object) -> Layer:
    """The MLP's first linear, h -> f, or h -> 2f (gate and up projections fused) when `gated`
    (SwiGLU, Shazeer 2020; Llama); column parallel. FLOPs per phase 2·s·h·f (x2 gated);
    params h·f (x2 gated) + bias. `separate` with `gated`: the gate and up projections are two
    Linear modules (torchtitan's w1 and w3, Hugging Face's gate_proj and up_proj):
    `projections` [f, f] (as `attn_qkv`)."""
    dims, hyper = _dims("mlp_up", name, shape, ("hidden", "ffn"))
    assert dims.h is not None and dims.f is not None
    if _flag(name, "separate", separate) and dims.gated:
        hyper["projections"] = [dims.f, dims.f]
    return _token_linear("mlp_up", name, input_shape, bytes_per_value, needs_input_grad, dims,
                         hyper, dims.h, _mlp_inner(dims), bias)


def activation_values_per_row(f: int, gated: bool, eager: bool) -> tuple[int, int]:
    """(forward, input-gradient) values an MLP activation moves per row of f outputs.

    GeLU: forward reads and writes f, 2f; input gradient reads grad and x and writes grad_x,
    3f (one kernel each, fused or eager: torch's gelu). SwiGLU silu(gate)·up, fused: forward
    reads 2f and writes f, 3f; input gradient reads grad and both inputs and writes their
    gradients, 5f. SwiGLU op by op (`eager`, ``F.silu(w1(x)) * w3(x)`` as torchtitan and
    Hugging Face's LlamaMLP write it): forward silu 2f, the product 3f, 5f; input gradient the
    product's two gradients 3f each, silu's 3f, 9f.
    Units: features -> values."""
    if not gated:
        return 2 * f, 3 * f
    return (5 * f, 9 * f) if eager else (3 * f, 5 * f)


@register_kind("mlp_act", kernel=KernelClass.MEMORY, splits=megatron("local"),
               tensor_extent_key="ffn")
def mlp_act(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
            needs_input_grad: bool, eager: bool = False, **shape: object) -> Layer:
    """The MLP's activation: GeLU (s, f) -> (s, f), or SwiGLU silu(gate)·up (s, 2f) -> (s, f)
    when `gated`. Memory bound, 0 FLOP. Bytes: s·b times `activation_values_per_row` (`eager`:
    a SwiGLU run op by op)."""
    dims, hyper = _dims("mlp_act", name, shape, ("ffn",))
    s, f = dims.s, dims.f
    assert f is not None
    _expect("mlp_act", name, input_shape, (s, _mlp_inner(dims)), "(seq, ffn x 2 if gated)")
    if _flag(name, "eager", eager) and dims.gated:
        hyper["eager"] = True
    forward, backward = activation_values_per_row(f, dims.gated, bool(hyper.get("eager")))
    b = bytes_per_value
    return _layer("mlp_act", name, input_shape, (s, f), 0, (0.0, 0.0, 0.0),
                  (float(forward * s * b), float(backward * s * b), 0.0), needs_input_grad,
                  hyper)


@register_kind("mlp_down", kernel=KernelClass.GEMM, splits=megatron("row"),
               tensor_extent_key="ffn", fp8_gemm=True)
def mlp_down(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
             needs_input_grad: bool, bias: bool = True, **shape: object) -> Layer:
    """The MLP's second linear f -> h; row parallel. FLOPs per phase 2·s·f·h; params f·h +
    bias."""
    dims, hyper = _dims("mlp_down", name, shape, ("hidden", "ffn"))
    assert dims.h is not None and dims.f is not None
    return _token_linear("mlp_down", name, input_shape, bytes_per_value, needs_input_grad, dims,
                         hyper, dims.f, dims.h, bias)


@register_kind("lm_positions", kernel=KernelClass.MEMORY, splits=megatron("replicated"))
def lm_positions(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, **shape: object) -> Layer:
    """The p positions of each sequence the LM head runs on (`predictions`, a masked language
    model's masked tokens), gathered from the s hidden states: (s, h) -> (p, h). No weights,
    0 FLOP.

    Bytes: forward reads the p rows and their indices and writes them, 2·p·h·b + p·8; input
    gradient writes zeros over the s rows and adds the p rows' gradients into theirs (reads
    them, reads and writes the rows they land on), (s·h + 3·p·h)·b + p·8. Source: PyTorch's
    index_select and its backward (index_add_ into zeros), as DeepLearningExamples' BERT
    gathers its labelled positions; TensorFlow's gather_indexes in BERT's reference code moves
    the same.
    """
    dims, hyper = _dims("lm_positions", name, shape, ("hidden",))
    s, h, p = dims.s, dims.h, dims.p
    assert h is not None
    if not p:
        raise InputError(f"layers.{name}.predictions", "missing: the positions per sequence "
                         "the LM head runs on (1 to seq)")
    _expect("lm_positions", name, input_shape, (s, h), "(seq, hidden)")
    b = bytes_per_value
    forward = float(2 * p * h * b + p * TOKEN_ID_BYTES)
    backward = float((s * h + 3 * p * h) * b + p * TOKEN_ID_BYTES)
    return _layer("lm_positions", name, (s, h), (p, h), 0, (0.0, 0.0, 0.0),
                  (forward, backward, 0.0), needs_input_grad, hyper)


@register_kind("logits", kernel=KernelClass.GEMM, splits=megatron("column"))
def logits(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
           needs_input_grad: bool, tied: bool = True, bias: bool = False,
           **shape: object) -> Layer:
    """The output projection h -> V (the "LM head"); Megatron splits it by vocabulary.

    FLOPs per phase 2·s·h·V, or 2·p·h·V on the p positions of `predictions` (its input is
    then `lm_positions`' (p, h)). Params: V·h when untied; with `tied: true` the weight is the
    embedding's table (Press & Wolf 2017; GPT-2/3, BERT), counted once, at the embedding, so
    this layer holds 0 (its weight gradient is still computed, and summed into the table's).
    Optional bias V (BERT's decoder).
    """
    dims, hyper = _dims("logits", name, shape, ("hidden", "vocab"))
    assert dims.h is not None and dims.V is not None
    hyper["tied"] = _flag(name, "tied", tied)
    rows = replace(dims, s=dims.predicted, m=0) if dims.p else dims
    return _token_linear("logits", name, input_shape, bytes_per_value, needs_input_grad, rows,
                         hyper, dims.h, dims.V, bias, weights=not tied)


LOSS_KERNELS = ("inplace", "torch", "torch16", "fused")
"""How the language-model loss (softmax cross-entropy over the vocabulary) is computed: its
traffic (`loss_traffic_per_logit`) and its memory (model/memory.loss_bytes). 'inplace',
Megatron's vocabulary-parallel cross-entropy (Megatron-LM, Megatron-DeepSpeed: an fp32 copy of
the logits turned into the softmax in place and kept, the gradient written over it); 'torch',
torch's cross_entropy on an fp32 cast of the logits (torchtitan, Hugging Face under autocast:
log-softmax kept in fp32; TensorFlow 1 BERT's log-softmax under TF-AMP moves the same);
'torch16', the same on 16-bit logits as they are, with no cast (a model run in 16 bits without
autocast: apex's O2 in DeepLearningExamples' Transformer-XL, model.half() in its PyTorch
BERT); 'fused', a kernel that keeps the 16-bit logits and
writes their gradient beside them (flash-attn's cross_entropy, llm-foundry's default
loss_fn)."""


LOSS_KERNEL_NAMES = {"inplace": "Megatron's vocabulary-parallel cross-entropy",
                     "torch": "torch's cross_entropy on an fp32 cast",
                     "torch16": "torch's cross_entropy on the 16-bit logits as they are",
                     "fused": "a fused cross-entropy kernel"}
"""What each of LOSS_KERNELS is, in words (engine differences, export assumptions)."""


AMP_MODES = ("half", "autocast", "tf-amp")
"""How a 16-bit plan's memory-bound kernels run (a plan's `amp`; AMP_FP32_KINDS lists the
kinds each runs on float32 values):

'half': the model itself is cast to 16 bits, every kernel reads and writes 16-bit values
  (Megatron-LM, Megatron-DeepSpeed, DeepSpeed, torchtitan's FSDP2 with bf16 parameters, apex
  O2, DeepLearningExamples' PyTorch BERT, whose default --allreduce_post_accumulation_fp16
  runs model.half() with autocast off: run_pretraining.py at 729963dd).
'autocast': torch.autocast over float32 weights (PyTorch's usual recipe; Hugging Face's
  fp16/bf16 flags, Lightning's 16-mixed, `run --gpu --bf16-mode autocast`). Its CUDA op lists
  (torch.amp's autocast op reference) run linear, matmul and the convolutions in 16 bits and
  layer_norm, softmax and log_softmax in float32; an op on neither list runs in its inputs'
  widest type. So the embedding's float32 table gives a float32 residual stream, each residual
  add of a 16-bit branch to it stays float32, and the norms read and write it in float32; the
  attention softmax writes float32 probabilities; the MLP's activation, fed by a linear, runs
  in 16 bits.
'tf-amp': TensorFlow's automatic mixed-precision graph rewrite (TF-AMP, DeepLearningExamples'
  TensorFlow 1 BERT with --amp). Its lists (tensorflow/core/grappler/optimizers/
  auto_mixed_precision_lists.h, NVIDIA/tensorflow 0936b2e6) put MatMul and BatchMatMul on the
  white list (16 bits), Mean, Pow, Softmax and the log-softmax losses on the black list
  (float32), Add, Mul, Sub, Tanh and BiasAdd on the gray list and Gather and Reshape on the
  clear list; its second pass paints every gray and clear op downstream of a black one black
  until a white op (PropagateBlackFwdThroughClearAndGray). BERT's layer norm takes a Mean, its
  GELU a Pow (modeling.py gelu: tf.pow(x, 3)), its attention a Softmax: the norms, the
  residual adds behind them, the GELU chain, the softmax and its dropout all run in float32.
  An activation on the clear list (Relu) would not; this mode prices BERT's.
Priced: each listed kind's traffic at 4 bytes a value (Workload.with_amp), a value read from a
16-bit GEMM priced as a float32 one; the casts between the widths are taken to be fused into
the kernels beside them (DeepLearningExamples runs its PyTorch BERT under TorchScript's fuser
and its TensorFlow BERT under XLA), not priced as passes of their own. Its memory:
model/memory.transformer_block_activation_bytes. CNN kinds are not listed: autocast runs batch
norm and ReLU in 16 bits (neither is on its float32 list) and TF-AMP puts FusedBatchNormV3 on
the gray and Relu on the clear list."""

AMP_FP32_KINDS: dict[str, frozenset[str]] = {
    "half": frozenset(),
    "autocast": frozenset({"embedding", "layernorm", "rmsnorm", "residual_add", "attn_softmax",
                           "lm_positions"}),
    "tf-amp": frozenset({"embedding", "layernorm", "rmsnorm", "residual_add", "attn_softmax",
                         "mlp_act", "lm_positions"}),
}
"""The memory-bound kinds each of AMP_MODES runs on float32 values (see AMP_MODES)."""

AMP_NAMES = {"half": "the model cast to 16 bits",
             "autocast": "torch.autocast over float32 weights",
             "tf-amp": "TensorFlow's automatic mixed-precision graph rewrite"}
"""What each of AMP_MODES is, in words (engine differences, export assumptions)."""


def loss_traffic_per_logit(loss: str, logit_bytes: int) -> tuple[float, float]:
    """(forward, input-gradient) bytes each kernel of the `loss` moves per logit of b =
    `logit_bytes` bytes, each reading its inputs and writing its outputs once; c = b + 4, the
    cast to fp32 reading b and writing 4, or 0 for 4-byte logits (the cast returns them).

    inplace: forward c + 32: the max reads 4, the max subtracted in place 8, exp in place 8,
      the sum reads 4, the division in place 8; backward 8 + c': the gradient multiplied in
      place 8, autograd's cast back to b, c' = 4 + b (0 at b = 4).
      Source: megatron/core/tensor_parallel/cross_entropy.py (Megatron-LM d98e8a64),
      calculate_logits_max, calculate_predicted_logits, calculate_cross_entropy_loss,
      calculate_gradients; Megatron-DeepSpeed's (4efb479d) subtracts into a new tensor, the
      same bytes.
    torch: forward c + 8: log-softmax reads 4 and writes 4 (nll_loss reads one per row);
      backward 4 + 12 + c': nll_loss's backward writes a dense fp32 gradient 4, log-softmax's
      backward reads it and its output and writes the result 12, the cast back c'.
      Source: torch.nn.functional.cross_entropy (log_softmax, then nll_loss); torchtitan
      v0.2.2 components/loss.py casts with .float().
    torch16: the same passes at b bytes with no cast: forward 2b, backward 4b (torch at
      b = 4). Source: as torch; apex's O2 runs the model's outputs in fp16 and patches no
      function (DeepLearningExamples' Transformer-XL, train.py --amp_mode O2 at f838cf32).
    fused: forward b (one read of the logits; the per-row loss and log-sum-exp are left out);
      backward 2b (the logits read, their gradient written).
      Source: flash-attn flash_attn/ops/triton/cross_entropy.py, cross_entropy_fwd_kernel and
      cross_entropy_bwd_kernel.
    Units: bytes per value -> bytes per logit.
    """
    if loss == "fused":
        return float(logit_bytes), 2.0 * logit_bytes
    if loss == "torch16" and logit_bytes < FP32_BYTES:
        return 2.0 * logit_bytes, 4.0 * logit_bytes
    cast = logit_bytes + FP32_BYTES if logit_bytes < FP32_BYTES else 0
    if loss in ("torch", "torch16"):
        return float(cast + 2 * FP32_BYTES), float(FP32_BYTES + 3 * FP32_BYTES + cast)
    return float(cast + 8 * FP32_BYTES), float(2 * FP32_BYTES + cast)


@register_kind("cross_entropy", kernel=KernelClass.MEMORY, splits=megatron("vocab_loss"))
def cross_entropy(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                  needs_input_grad: bool, metrics: int = 0, loss: str = "inplace",
                  **shape: object) -> Layer:
    """Softmax + cross-entropy loss over V logits for each of s tokens (or the p positions of
    `predictions`): (s, V) -> (s, V). Memory bound, 0 FLOP.

    Bytes: what the `loss` kernel (LOSS_KERNELS; a plan's `loss` sets it,
    Workload.with_loss) moves per logit, `loss_traffic_per_logit`, over the s·V logits, and
    the s targets, 8 bytes each, read in each phase (p for s with `predictions`).

    `metrics`: training metrics that compute the loss again over the same logits after every
    micro-batch, without gradients (TransformerShape.metrics; Composer's LanguageCrossEntropy
    and LanguagePerplexity, each a torch CrossEntropyLoss with reduction 'sum'). Under
    autocast cross_entropy runs in float32 (torch.amp's CUDA float32 list): each is the
    'torch' kernel's forward, + metrics · (s·V·(b + 12) + s·8) (s·V·8 with 4-byte logits).
    Priced at the workload's activation width.
    """
    dims, hyper = _dims("cross_entropy", name, shape, ("vocab",))
    s, V = dims.predicted, dims.V
    assert V is not None
    _expect("cross_entropy", name, input_shape, (s, V), "(seq, vocab) logit")
    metric = _count(name, "metrics", metrics)
    if metric:
        hyper["metrics"] = metric
    if not isinstance(loss, str) or loss not in LOSS_KERNELS:
        raise InputError(f"layers.{name}.loss", f"must be one of {', '.join(LOSS_KERNELS)}, "
                         f"got {short_repr(loss)}")
    if loss != "inplace":
        hyper["loss"] = loss
    forward, backward = loss_traffic_per_logit(loss, bytes_per_value)
    targets = s * TOKEN_ID_BYTES
    metric_bytes = metric * (s * V * loss_traffic_per_logit("torch", bytes_per_value)[0]
                             + targets)
    return _layer("cross_entropy", name, (s, V), (s, V), 0, (0.0, 0.0, 0.0),
                  (float(s * V * forward + targets + metric_bytes),
                   float(s * V * backward + targets), 0.0), needs_input_grad, hyper)


TRANSFORMER_KINDS = tuple(name for name, record in LAYER_KINDS.items()
                          if record.build.__module__ == __name__)
"""The kinds this module registers, in registry order."""
