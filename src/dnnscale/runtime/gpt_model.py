"""A GPT-style torch module built from a workload's `TransformerShape`, layer for layer.

The module follows the chain of workload/transformer.py, so what `dnnscale run --gpu` trains is
what the model prices: an embedding (token table, plus a learned position table and a token-
type table when the shape has them), L blocks (pre-norm: norm, fused Q|K|V projection,
attention, output projection, residual add, norm, MLP up, activation, MLP down, residual add;
post-norm puts each norm after its residual add), a final norm (pre-norm only), the logits
(tied to the token table or a separate matrix) and the cross-entropy loss. Attention is
`scaled_dot_product_attention` when the shape says `flash_attention` (one fused kernel, as the
`flash_attention` kind prices it), else the three unfused kernels the `attn_scores`,
`attn_softmax` and `attn_context` kinds price (Q·Kᵀ, masked softmax with dropout, P·V).

The functional pieces (`split_heads`, `attention`, `mlp_activation`, `lm_loss`, ...) are the
ones the GPU calibration times kernel by kernel (calibrate/gpu_kernels.py), so a calibrated
kernel is the kernel training runs. torch is imported by this module: import it only from the
runtime and the calibration. Works on torch 2.11 and later (nn.RMSNorm needs 2.4,
LayerNorm(bias=...) 2.1).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dnnscale.workload.transformer_shape import TransformerShape

DROPOUT_P = 0.1
"""Dropout probability when the shape has dropout (GPT-2/3 and BERT use 0.1)."""
INIT_STD = 0.02
"""Weights start N(0, 0.02²); residual output projections N(0, (0.02/√(2L))²) (Radford et al.
2019, GPT-2 §2.3)."""
ROPE_BASE = 10000.0
"""RoPE's θ base (Su et al. 2021, RoFormer §3.4.2)."""


# --- the functional pieces (shared with the calibration's kernels) ------------------------------


def split_heads(qkv: torch.Tensor, heads: int, kv_heads: int) -> tuple[torch.Tensor, ...]:
    """Q, K, V as (batch, heads, seq, head_dim) from the fused projection (batch, seq, h + 2·h_kv).

    Grouped-query attention (kv_heads < heads) repeats each K/V head heads/kv_heads times (the
    products run over all query heads, as the `attn_scores` kind counts them)."""
    batch, seq, width = qkv.shape
    head_dim = width // (heads + 2 * kv_heads)
    q, k, v = qkv.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), dim=-1)
    q = q.view(batch, seq, heads, head_dim).transpose(1, 2)
    k = k.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    v = v.view(batch, seq, kv_heads, head_dim).transpose(1, 2)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    return q, k, v


def merge_heads(out: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) -> (batch, seq, heads·head_dim)."""
    batch, heads, seq, head_dim = out.shape
    return out.transpose(1, 2).reshape(batch, seq, heads * head_dim)


def attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Q·Kᵀ/√d: (batch, heads, seq, seq). The scale is applied to Q (s·d values, not s²)."""
    return torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1))


def masked_softmax(scores: torch.Tensor, causal: bool, dropout_p: float) -> torch.Tensor:
    """Softmax over the last axis with the causal mask (upper triangle at −∞), then dropout."""
    if causal:
        seq = scores.shape[-1]
        mask = torch.ones(seq, seq, dtype=torch.bool, device=scores.device).triu_(1)
        scores = scores.masked_fill(mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return F.dropout(probs, dropout_p) if dropout_p > 0 else probs


def attention_context(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """P·V: (batch, heads, seq, head_dim)."""
    return torch.matmul(probs, v)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              dropout_p: float, fused: bool) -> torch.Tensor:
    """Attention of (batch, heads, seq, head_dim) tensors: one fused
    `scaled_dot_product_attention` kernel, or scores, masked softmax and context unfused."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
    return attention_context(masked_softmax(attention_scores(q, k), causal, dropout_p), v)


def mlp_activation(x: torch.Tensor, gated: bool) -> torch.Tensor:
    """GeLU (tanh form, GPT-2's), or SwiGLU silu(gate)·up of the fused (…, 2f) projection."""
    if gated:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(x, approximate="tanh")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (…, V) logits against (…) token ids, on an fp32 cast of the
    logits as torchtitan computes it (the plan's loss 'torch', which prices this)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def prediction_positions(seq: int, predictions: int, device: torch.device) -> torch.Tensor:
    """The positions the LM head runs on in a run on synthetic tokens (TransformerShape's
    `predictions`): `predictions` of the `seq`, evenly spaced; which ones does not change the
    cost."""
    return torch.arange(predictions, device=device) * (seq // predictions)


def gather_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The rows of (…, s, h) hidden states at `positions` (the `lm_positions` kind)."""
    return x.index_select(-2, positions)


def residual(stream: torch.Tensor, branch: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """stream + dropout(branch) (the `residual_add` kind)."""
    return stream + (F.dropout(branch, dropout_p) if dropout_p > 0 else branch)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on (batch, heads, seq, head_dim): pairs (x₁, x₂) of the two halves rotated by the
    position's angles (Su et al. 2021, RoFormer eq. 34, in the half-split layout)."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def rope_tables(seq: int, head_dim: int, device: Any, dtype: Any) -> tuple[torch.Tensor, ...]:
    """cos and sin of position·θ_i, θ_i = base^(−2i/d), each (seq, head_dim/2)."""
    inv = ROPE_BASE ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
                        / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class OpByOpRMSNorm(nn.Module):
    """An RMSNorm run as separate PyTorch operations in fp32 between two casts
    (TransformerShape.eager, the passes transformer_kinds.rmsnorm prices)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        scale = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * scale).type_as(x) * self.weight


def make_norm(shape: TransformerShape) -> nn.Module:
    if shape.norm == "rmsnorm":
        return OpByOpRMSNorm(shape.hidden) if shape.eager else nn.RMSNorm(shape.hidden)
    return nn.LayerNorm(shape.hidden, bias=shape.bias)


# --- the module ----------------------------------------------------------------------------------


class Block(nn.Module):
    """One transformer block (workload/transformer.py `_block_specs`)."""

    def __init__(self, shape: TransformerShape, dropout_p: float,
                 attention_dropout_p: float) -> None:
        super().__init__()
        self.shape, self.dropout_p = shape, dropout_p
        self.attention_dropout_p = attention_dropout_p
        h = shape.hidden
        self.attn_norm = make_norm(shape)
        self.attn_qkv = nn.Linear(h, h + 2 * shape.kv_hidden, bias=bool(shape.attention_bias))
        self.attn_out = nn.Linear(h, h, bias=bool(shape.attention_bias))
        self.mlp_norm = make_norm(shape)
        self.mlp_up = nn.Linear(h, shape.ffn * (2 if shape.gated else 1), bias=shape.bias)
        self.mlp_down = nn.Linear(shape.ffn, h, bias=shape.bias)

    def _attention(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None) -> torch.Tensor:
        shape = self.shape
        q, k, v = split_heads(self.attn_qkv(x), shape.heads, shape.kv_heads)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        out = attention(q, k, v, shape.causal, self.attention_dropout_p, shape.flash_attention)
        return self.attn_out(merge_heads(out))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_down(mlp_activation(self.mlp_up(x), self.shape.gated))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None = None
                ) -> torch.Tensor:
        p = self.dropout_p
        if self.shape.norm_position == "post":
            x = self.attn_norm(residual(x, self._attention(x, rope), p))
            return self.mlp_norm(residual(x, self._mlp(x), p))
        x = residual(x, self._attention(self.attn_norm(x), rope), p)
        return residual(x, self._mlp(self.mlp_norm(x)), p)


class GptModel(nn.Module):
    """The workload's transformer; `forward(tokens, targets)` returns the mean loss.

    `recompute=True` checkpoints every block (its activations are recomputed in the backward
    pass: the plan's `recompute: full`)."""

    def __init__(self, shape: TransformerShape, recompute: bool = False) -> None:
        super().__init__()
        self.shape, self.recompute = shape, recompute
        self.dropout_p = DROPOUT_P if shape.dropout else 0.0
        self.attention_dropout_p = DROPOUT_P if shape.drops_attention else 0.0
        h = shape.hidden
        self.token_table = nn.Embedding(shape.vocab, h)
        self.position_table = nn.Embedding(shape.positions, h) if shape.positions else None
        self.type_table = nn.Embedding(shape.token_types, h) if shape.token_types else None
        post = shape.norm_position == "post"
        self.embedding_norm = make_norm(shape) if post else None
        self.blocks = nn.ModuleList(Block(shape, self.dropout_p, self.attention_dropout_p)
                                    for _ in range(shape.layers))
        self.final_norm = None if post else make_norm(shape)
        self.head = None if shape.tied_embeddings else nn.Linear(h, shape.vocab, bias=False)
        self._initialise()

    def _initialise(self) -> None:
        residual_std = INIT_STD / math.sqrt(2 * self.shape.layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn_out", "mlp_down")) else INIT_STD
                nn.init.normal_(module.weight, 0.0, std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_table(tokens)
        seq = tokens.shape[-1]
        if self.position_table is not None:
            x = x + self.position_table(torch.arange(seq, device=tokens.device))
        if self.type_table is not None:
            x = x + self.type_table(torch.zeros_like(tokens))
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return F.dropout(x, self.dropout_p) if self.dropout_p > 0 else x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.head is not None:
            return self.head(x)
        return F.linear(x, self.token_table.weight)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        rope = None
        if self.shape.positional == "rope":
            rope = rope_tables(tokens.shape[-1], self.shape.head_dim, x.device, x.dtype)
        for block in self.blocks:
            if self.recompute and torch.is_grad_enabled():
                x = checkpoint(block, x, rope, use_reentrant=False)
            else:
                x = block(x, rope)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.shape.predictions:  # the LM head on the masked positions only
            positions = prediction_positions(tokens.shape[-1], self.shape.predictions, x.device)
            x, targets = gather_positions(x, positions), targets.index_select(-1, positions)
        return lm_loss(self.logits(x), targets)


def parameter_count(module: nn.Module) -> int:
    """Parameters of `module`, a shared (tied) tensor counted once."""
    return sum(p.numel() for p in module.parameters())
