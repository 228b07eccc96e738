"""Build a transformer workload (GPT, Llama, BERT shapes) as a chain of fine-grained layers.

Layers, in order (pre-norm; kinds in workload/transformer_kinds.py):

    embedding                                      (embedding_norm first when post-norm)
    block{i}.attn_norm      layernorm | rmsnorm    (after attn_residual when post-norm)
    block{i}.attn_qkv
    block{i}.attn_scores, block{i}.attn_softmax, block{i}.attn_context   or block{i}.flash_attention
    block{i}.attn_out
    block{i}.attn_residual  residual_add
    block{i}.mlp_norm       layernorm | rmsnorm    (after mlp_residual when post-norm)
    block{i}.mlp_up, block{i}.mlp_act, block{i}.mlp_down
      or, with experts (workload/moe_kinds.py): block{i}.moe_router, block{i}.moe_dispatch,
      block{i}.expert_up, block{i}.expert_act, block{i}.expert_down, block{i}.moe_combine,
      then the shared experts (mlp_up/act/down kinds, roles shared_up/act/down) if any
    block{i}.mlp_residual   residual_add
    final_norm              layernorm | rmsnorm    (pre-norm only)
    lm_positions                                   (with `predictions`: the head's positions)
    logits
    cross_entropy

Each layer's name is its role (``block{i}.<role>`` inside block i, counted from 0).
"""

from __future__ import annotations

import math
from dataclasses import replace

from dnnscale.errors import InputError
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import MAX_LAYERS, Workload, build_workload

DEFAULT_SAMPLES_PER_EPOCH = 1_000_000


def default_ffn(hidden: int, gated: bool) -> int:
    """The MLP's inner width when none is given.

    Formula: 4·h (Vaswani et al. 2017; GPT-2/3, BERT); gated (SwiGLU): 2/3 of 4·h, rounded up
    to a multiple of 256, 256·⌈⌊8·h/3⌋/256⌉, which keeps the MLP's parameters near 8·h² (Llama's
    reference code, Touvron et al. 2023; 11008 for h = 4096). Units: features.
    """
    if not gated:
        return 4 * hidden
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def transformer_workload(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int,
                         ffn: int | None = None, kv_heads: int | None = None,
                         gated: bool = False, norm: str = "layernorm",
                         flash_attention: bool = False, tied_embeddings: bool = True,
                         causal: bool = True, positional: str = "learned",
                         samples_per_epoch: int = DEFAULT_SAMPLES_PER_EPOCH, *,
                         positions: int | None = None, token_types: int = 0,
                         norm_position: str = "pre", bias: bool = True,
                         attention_bias: bool | None = None,
                         separate_projections: bool = False, dropout: bool = True,
                         attention_dropout: bool | None = None,
                         rope_theta: float | None = None, attention_kernel: str = "fa2",
                         eager: bool = False, experts: int = 0, top_k: int = 0,
                         expert_ffn: int = 0, shared_ffn: int = 0,
                         capacity_factor: float | None = None,
                         dense_blocks: tuple[int, ...] = (), memory: int = 0,
                         predictions: int = 0, metrics: int = 0, bytes_per_value: int = 2,
                         description: str = "") -> Workload:
    """A transformer as a `Workload` whose `transformer` field summarises its shape.

    `ffn` defaults to `default_ffn`, `kv_heads` to `heads` (multi-head attention), `positions`
    (rows of a learned position table) to `seq`. `bias` adds biases to every linear and norm,
    `attention_bias` to the attention's projections (None: as `bias`),
    `separate_projections` runs Q, K, V (and a gated MLP's gate and up) as separate GEMMs,
    `dropout` the hidden (residual) dropouts, `attention_dropout` the attention probabilities'
    (None: as `dropout`), `rope_theta` RoPE's base (None: 10,000), `eager` the
    element-wise code run op by op (RMSNorms, a gated activation, RoPE; TransformerShape).
    `experts` > 0 makes every block's MLP a mixture of experts (TransformerShape), except the
    blocks listed in `dense_blocks`. `memory` > 0 (with `positional="relative"`) makes it a
    Transformer-XL (TransformerShape): each block attends over its cached memory too.
    `predictions` > 0 runs the LM head on that many positions per sequence (a masked language
    model's masked positions, gathered by an `lm_positions` layer; TransformerShape).
    `metrics` > 0 recomputes the loss that many times per micro-batch for training metrics
    (Composer's train metrics; TransformerShape).
    One sample is one sequence of `seq` tokens; `bytes_per_value` 2 (bf16 activations; the
    model rescales for other precisions). Bad values raise `InputError` naming
    ``transformer.<field>``.
    """
    shape = TransformerShape(
        layers=layers, hidden=hidden, heads=heads,
        kv_heads=heads if kv_heads is None else kv_heads,
        ffn=default_ffn(hidden, gated) if ffn is None and isinstance(hidden, int) else ffn,
        vocab=vocab, seq=seq, gated=gated, norm=norm, flash_attention=flash_attention,
        tied_embeddings=tied_embeddings, causal=causal, positional=positional,
        positions=(seq if positional == "learned" else 0) if positions is None else positions,
        token_types=token_types, norm_position=norm_position, bias=bias,
        attention_bias=attention_bias, separate_projections=separate_projections,
        dropout=dropout,
        attention_dropout=attention_dropout, rope_theta=rope_theta,
        attention_kernel=attention_kernel, eager=eager, experts=experts, top_k=top_k,
        expert_ffn=expert_ffn, shared_ffn=shared_ffn, capacity_factor=capacity_factor,
        dense_blocks=dense_blocks, memory=memory, predictions=predictions, metrics=metrics)
    # Blocks of one kind (MoE or dense MLP) differ only in their names and `block` index: build
    # the chain with the first block of each kind once (through build_workload, as a YAML file
    # of it would be) and copy its layers for the rest.
    prefix, suffix = _prefix_specs(shape), _suffix_specs(shape)
    dense = set(shape.dense_blocks)

    def moe(block: int) -> bool:  # the kind of a block (is_moe_block, by a set)
        return shape.is_moe and block not in dense

    # the first block of each kind: of a dense model block 0, of a mixture the first MoE block
    # and the first dense one (dense_blocks leave at least one MoE block)
    first_moe = next(i for i in range(shape.layers) if i not in dense)
    firsts = {moe(i): i for i in sorted({first_moe, *shape.dense_blocks[:1]})}
    specs = {kind: _block_specs(shape, i) for kind, i in firsts.items()}
    count = {True: shape.moe_blocks, False: shape.layers - shape.moe_blocks}
    total = len(prefix) + len(suffix) + sum(len(specs[kind]) * count[kind] for kind in specs)
    if total > MAX_LAYERS:  # checked before the copies are made
        raise InputError("transformer.layers", f"{shape.layers:,} blocks make {total:,} layers; "
                         f"the limit is {MAX_LAYERS:,}")
    one = build_workload(name, [seq], prefix + [s for kind in firsts for s in specs[kind]]
                         + suffix, samples_per_epoch, bytes_per_value, description,
                         transformer=shape)
    head, tail = one.layers[:len(prefix)], one.layers[len(one.layers) - len(suffix):]
    kinds, at = {}, len(prefix)
    for kind in firsts:  # the built first blocks, in order
        kinds[kind], at = one.layers[at:at + len(specs[kind])], at + len(specs[kind])
    blocks = [layer if i == firsts[moe(i)] else
              layer.relabelled(f"block{i}.{layer.hyper['role']}", {**layer.hyper, "block": i})
              for i in range(shape.layers) for layer in kinds[moe(i)]]
    return replace(one, layers=(*head, *blocks, *tail))


def transformer_layer_specs(shape: TransformerShape) -> list[dict[str, object]]:
    """The layer specs (kind, name and fields, as in a workload YAML) of `shape`'s chain."""
    blocks = [spec for i in range(shape.layers) for spec in _block_specs(shape, i)]
    return _prefix_specs(shape) + blocks + _suffix_specs(shape)


def _spec(shape: TransformerShape, kind: str, role: str, block: int | None,
          **options: object) -> dict[str, object]:
    name = role if block is None else f"block{block}.{role}"
    memory = {"memory": shape.memory} if shape.memory else {}
    return {"kind": kind, "name": name, "block": block, "role": role, "hidden": shape.hidden,
            "heads": shape.heads, "kv_heads": shape.kv_heads, "seq": shape.seq,
            "ffn": shape.ffn, "vocab": shape.vocab, "gated": shape.gated, **memory, **options}


def _separate(shape: TransformerShape) -> dict[str, object]:
    """The projection layers' option for `separate_projections` (none when fused)."""
    return {"separate": True} if shape.separate_projections else {}


def _norm(shape: TransformerShape, role: str, block: int | None) -> dict[str, object]:
    options: dict[str, object] = {"bias": shape.bias} if shape.norm == "layernorm" else {}
    if shape.eager_norms:
        options["eager"] = True
    return _spec(shape, shape.norm, role, block, **options)


def _eager_act(shape: TransformerShape) -> dict[str, object]:
    """A gated activation's `eager` option where the shape runs op by op."""
    return {"eager": True} if shape.eager_activation else {}


def _prefix_specs(shape: TransformerShape) -> list[dict[str, object]]:
    specs = [_spec(shape, "embedding", "embedding", None, positional=shape.positional,
                   positions=shape.positions, token_types=shape.token_types)]
    if shape.norm_position == "post":
        specs.append(_norm(shape, "embedding_norm", None))
    return specs


def _block_specs(shape: TransformerShape, i: int) -> list[dict[str, object]]:
    post = shape.norm_position == "post"
    specs = [] if post else [_norm(shape, "attn_norm", i)]
    specs.append(_spec(shape, "attn_qkv", "attn_qkv", i, bias=shape.attention_bias,
                       **_separate(shape)))
    if shape.positional == "rope":
        specs.append(_spec(shape, "rope", "rope", i, **({"eager": True} if shape.eager else {})))
    if shape.flash_attention:
        specs.append(_spec(shape, "flash_attention", "flash_attention", i, causal=shape.causal,
                           attention_kernel=shape.attention_kernel))
    else:
        # relative positions are Transformer-XL's, priced as its reference code runs them
        # (transformer_kinds: attn_scores' relative terms, attn_softmax's unfused chain)
        relative = shape.positional == "relative"
        specs += [_spec(shape, "attn_scores", "attn_scores", i, causal=shape.causal,
                        **({"relative": True} if relative else {})),
                  _spec(shape, "attn_softmax", "attn_softmax", i, causal=shape.causal,
                        dropout=shape.drops_attention,
                        **({"unfused": True} if relative else {})),
                  _spec(shape, "attn_context", "attn_context", i)]
    specs += [_spec(shape, "attn_out", "attn_out", i, bias=shape.attention_bias),
              _spec(shape, "residual_add", "attn_residual", i, dropout=shape.dropout),
              _norm(shape, "attn_norm" if post else "mlp_norm", i)]
    specs += _moe_specs(shape, i) if shape.is_moe_block(i) else [
        _spec(shape, "mlp_up", "mlp_up", i, bias=shape.bias, **_separate(shape)),
        _spec(shape, "mlp_act", "mlp_act", i, **_eager_act(shape)),
        _spec(shape, "mlp_down", "mlp_down", i, bias=shape.bias)]
    specs.append(_spec(shape, "residual_add", "mlp_residual", i, dropout=shape.dropout))
    if post:
        specs.append(_norm(shape, "mlp_norm", i))
    return specs


def _moe_specs(shape: TransformerShape, i: int) -> list[dict[str, object]]:
    """A block's mixture of experts: router, dispatch, the routed experts' MLP (at their own
    width), combine, then the shared experts as a dense MLP of width `shared_ffn`."""
    moe = {"experts": shape.experts, "top_k": shape.top_k,
           "capacity_factor": shape.capacity_factor}
    expert = {**moe, "ffn": shape.routed_ffn}
    specs = [_spec(shape, "moe_router", "moe_router", i, **moe),
             _spec(shape, "moe_dispatch", "moe_dispatch", i, **moe),
             _spec(shape, "expert_up", "expert_up", i, bias=shape.bias, **expert),
             _spec(shape, "expert_act", "expert_act", i, **expert, **_eager_act(shape)),
             _spec(shape, "expert_down", "expert_down", i, bias=shape.bias, **expert),
             _spec(shape, "moe_combine", "moe_combine", i, **moe)]
    if shape.shared_ffn:
        shared = {"ffn": shape.shared_ffn}
        specs += [_spec(shape, "mlp_up", "shared_up", i, bias=shape.bias, **shared),
                  _spec(shape, "mlp_act", "shared_act", i, **shared, **_eager_act(shape)),
                  _spec(shape, "mlp_down", "shared_down", i, bias=shape.bias, **shared)]
    return specs


def _suffix_specs(shape: TransformerShape) -> list[dict[str, object]]:
    specs = [] if shape.norm_position == "post" else [_norm(shape, "final_norm", None)]
    head: dict[str, object] = {"predictions": shape.predictions} if shape.predictions else {}
    if shape.predictions:
        specs.append(_spec(shape, "lm_positions", "lm_positions", None, **head))
    return specs + [_spec(shape, "logits", "logits", None, tied=shape.tied_embeddings,
                          bias=False, **head),
                    _spec(shape, "cross_entropy", "cross_entropy", None, **head,
                          **({"metrics": shape.metrics} if shape.metrics else {}))]
