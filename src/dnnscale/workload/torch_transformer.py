"""Which PyTorch transformer modules become which transformer kinds, for the torch importer.

* ``nn.Embedding`` on the chain's token ids -> `embedding`; a second ``nn.Embedding`` right after
  it that looks up the same rows for every sample (a learned position table, called on
  ``arange(T)``) is folded into it as ``positional: learned`` (the zoo's form);
* ``nn.LayerNorm`` / ``nn.RMSNorm`` over the last dim of a (T, h) input -> `layernorm` / `rmsnorm`;
* ``nn.MultiheadAttention`` (self-attention, packed in-projection) -> attn_qkv, attn_scores,
  attn_softmax, attn_context, attn_out, named ``<module>.qkv|scores|softmax|context|out``;
* a module whose own code calls ``F.scaled_dot_product_attention`` once, fed by a fused
  Q|K|V tensor (T, h + 2·h_kv) -> attn_scores, attn_softmax, attn_context (``<module>.scores``,
  ...), or with ``flash_attention=True`` one `flash_attention` layer named after the module;
* ``nn.CrossEntropyLoss`` on (T, V) logits -> `cross_entropy`.

The importer builds these with the analytical formulas only after checking that their FLOPs add
up to what was counted for the module in every phase, so the formulas and the trace must agree.
On the meta device sdpa runs its math form (two batched products and a softmax), which is what
the unfused kinds count; a FlashAttention kernel's count (causal halving, backward
recomputation) is the analytical `flash_attention_flops`, applied after that check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

LayerSpec = tuple[str, str, dict[str, object]]  # (layer name, kind, hyper)


@dataclass(frozen=True)
class AttentionCall:
    """One call of sdpa or of nn.MultiheadAttention's functional form, seen in forward."""

    module: str                            # the tracker's name of the running module
    query_shape: tuple[int, ...]
    key_shape: tuple[int, ...]
    causal: bool                           # is_causal, or any attention mask given
    dropout: bool                          # dropout_p > 0
    self_attention: bool                   # query, key and value are one tensor (MHA)


class AttentionRecorder(TorchFunctionMode):
    """Records `AttentionCall`s, attributed by `current_module()` (the counting mode's)."""

    def __init__(self, current_module: Any) -> None:
        super().__init__()
        self.current_module = current_module
        self.calls: list[AttentionCall] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k = args[0], args[1]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
            self.calls.append(AttentionCall(self.current_module(), tuple(q.shape),
                                            tuple(k.shape), bool(causal) or mask is not None,
                                            float(dropout) > 0, False))
        elif func is F.multi_head_attention_forward:
            q, k, v = args[0], args[1], args[2]
            dropout = kwargs.get("dropout_p", args[10] if len(args) > 10 else 0.0)
            training = kwargs.get("training", True)
            causal = bool(kwargs.get("is_causal", False)) or kwargs.get("attn_mask") is not None
            self.calls.append(AttentionCall(self.current_module(), tuple(q.shape),
                                            tuple(k.shape), causal,
                                            float(dropout) > 0 and bool(training),
                                            q is k and k is v))
        return func(*args, **kwargs)


def block_index(layer_name: str) -> int | None:
    """The block a layer belongs to: the first integer in its qualified name (``blocks.3.ln1``
    -> 3), None when there is none."""
    for part in layer_name.split("."):
        if part.isdigit():
            return int(part)
    return None


def _labels(layer_name: str, role: str | None = None) -> dict[str, object]:
    labels: dict[str, object] = {"block": block_index(layer_name)}
    if role is not None:
        labels["role"] = role
    return labels


def _attention(prefix: str, seq: int, hidden: int, heads: int, kv_heads: int, causal: bool,
               dropout: bool, flash: bool, flash_name: str) -> list[LayerSpec]:
    shape = {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "seq": seq}
    if flash:
        return [(flash_name, "flash_attention",
                 {**_labels(prefix, "flash_attention"), **shape, "causal": causal})]
    return [(f"{prefix}.scores", "attn_scores",
             {**_labels(prefix, "attn_scores"), **shape, "causal": causal}),
            (f"{prefix}.softmax", "attn_softmax",
             {**_labels(prefix, "attn_softmax"), **shape, "causal": causal, "dropout": dropout}),
            (f"{prefix}.context", "attn_context", {**_labels(prefix, "attn_context"), **shape})]


def transformer_specs(mod: nn.Module, layer_name: str, chain_shape: tuple[int, ...],
                      in_shape: tuple[int, ...] | None, calls: list[AttentionCall],
                      flash: bool) -> list[LayerSpec] | None:
    """The layers that stand for module `mod` (see the module docstring), or None.

    `chain_shape` is the previous layer's output, `in_shape` the module's first input (per
    sample), `calls` the attention calls its own code made in one forward."""
    kind = type(mod)
    if kind is nn.Embedding:
        if in_shape != chain_shape or len(chain_shape) != 1 or mod.max_norm is not None:
            return None
        return [(layer_name, "embedding", {**_labels(layer_name, "embedding"),
                                           "hidden": mod.embedding_dim,
                                           "vocab": mod.num_embeddings, "seq": chain_shape[0],
                                           "positional": "none"})]
    if kind in (nn.LayerNorm, getattr(nn, "RMSNorm", None)):
        if (in_shape != chain_shape or len(chain_shape) != 2 or not mod.elementwise_affine
                or tuple(mod.normalized_shape) != chain_shape[-1:]):
            return None
        hyper: dict[str, object] = {**_labels(layer_name), "hidden": chain_shape[1],
                                    "seq": chain_shape[0]}
        if kind is nn.LayerNorm:
            return [(layer_name, "layernorm", {**hyper, "bias": mod.bias is not None})]
        return [(layer_name, "rmsnorm", hyper)]
    if kind is nn.CrossEntropyLoss:
        if in_shape != chain_shape or len(chain_shape) != 2:
            return None
        return [(layer_name, "cross_entropy", {**_labels(layer_name, "cross_entropy"),
                                               "seq": chain_shape[0], "vocab": chain_shape[1]})]
    if kind is nn.MultiheadAttention:
        return _multihead(mod, layer_name, chain_shape, in_shape, calls, flash)
    return _sdpa_container(layer_name, chain_shape, calls, flash)


def _multihead(mod: nn.MultiheadAttention, layer_name: str, chain_shape: tuple[int, ...],
               in_shape: tuple[int, ...] | None, calls: list[AttentionCall],
               flash: bool) -> list[LayerSpec] | None:
    if (in_shape != chain_shape or len(chain_shape) != 2 or len(calls) != 1
            or not calls[0].self_attention or not mod._qkv_same_embed_dim
            or mod.bias_k is not None or mod.add_zero_attn
            or (mod.in_proj_bias is None) != (mod.out_proj.bias is None)):
        return None
    seq, hidden = chain_shape
    if hidden != mod.embed_dim:
        return None
    bias = mod.in_proj_bias is not None
    call = calls[0]
    shape = {"hidden": hidden, "heads": mod.num_heads, "kv_heads": mod.num_heads, "seq": seq}
    return ([(f"{layer_name}.qkv", "attn_qkv",
              {**_labels(layer_name, "attn_qkv"), **shape, "bias": bias})]
            + _attention(layer_name, seq, hidden, mod.num_heads, mod.num_heads, call.causal,
                         call.dropout, flash, f"{layer_name}.attention")
            + [(f"{layer_name}.out", "attn_out",
                {**_labels(layer_name, "attn_out"), **shape, "bias": bias})])


def _sdpa_container(layer_name: str, chain_shape: tuple[int, ...], calls: list[AttentionCall],
                    flash: bool) -> list[LayerSpec] | None:
    if len(calls) != 1 or calls[0].self_attention:
        return None
    call = calls[0]
    if len(call.query_shape) != 4 or len(call.key_shape) != 4:
        return None
    _, heads, seq, head_dim = call.query_shape
    _, kv_heads, seq_k, key_dim = call.key_shape
    if seq != seq_k or head_dim != key_dim or kv_heads < 1 or heads % kv_heads:
        return None
    hidden = heads * head_dim
    if chain_shape != (seq, hidden + 2 * kv_heads * head_dim):
        return None  # not fed by a fused Q|K|V projection: leave it generic
    return _attention(layer_name, seq, hidden, heads, kv_heads, call.causal, call.dropout, flash,
                      layer_name)


def position_table(mod: nn.Module | None, previous_hyper: dict[str, object],
                   batch_independent: bool) -> int | None:
    """Rows of a learned position table that `mod` is, to fold into the previous `embedding`
    layer (its hyper given), or None. `batch_independent`: the module's input and output do
    not grow with the batch (it looks up the same rows for every sample)."""
    if (type(mod) is not nn.Embedding or not batch_independent
            or previous_hyper.get("positional") != "none"
            or previous_hyper.get("positions") not in (0, None)
            or mod.embedding_dim != previous_hyper.get("hidden")
            or mod.num_embeddings < int(previous_hyper.get("seq") or 0) or mod.max_norm is not None):
        return None
    return int(mod.num_embeddings)
