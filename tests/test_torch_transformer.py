"""PyTorch transformer modules imported as the transformer kinds (workload/torch_transformer.py).

Each mapped layer was built only after its analytical FLOPs matched the counted ones in every
phase, so the totals below are also the counted totals of tests/test_torch_import.py."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.workload.spec import workload_from_dict, workload_to_dict
from dnnscale.workload.torch_import import from_torch
from tests import torch_models as tm

T, D, L, VOCAB = 64, 256, 4, 2048  # tests.torch_models.GPT defaults


def _by_name(workload):
    return {layer.name: layer for layer in workload.layers}


def _gpt(**options):
    return from_torch(tm.small_gpt, (T,), input_dtypes="int64", **options)


def test_small_gpt_modules_become_transformer_kinds() -> None:
    """nn.Embedding (with the learned positions folded in), nn.LayerNorm, the sdpa attention
    module and the loss map to kinds; only linears, GELU and glue (residual adds) stay
    generic."""
    w = from_torch(tm.small_gpt, (T,), input_dtypes="int64", loss="cross_entropy")
    layers = _by_name(w)
    wte = layers["wte"]
    assert wte.kind == "embedding" and "wpe" not in layers
    assert (wte.hyper["positional"], wte.hyper["positions"]) == ("learned", T)
    assert wte.params == (VOCAB + T) * D
    for i in range(L):
        assert layers[f"blocks.{i}.ln1"].kind == layers[f"blocks.{i}.ln2"].kind == "layernorm"
        assert layers[f"blocks.{i}.ln1"].params == D  # bias=False
        assert [layers[f"blocks.{i}.attn.{part}"].kind for part in
                ("scores", "softmax", "context")] == ["attn_scores", "attn_softmax",
                                                      "attn_context"]
        assert layers[f"blocks.{i}.attn.scores"].hyper["block"] == i
        assert layers[f"blocks.{i}.attn.scores"].hyper["causal"] is True
        assert f"blocks.{i}.attn" not in layers
    assert layers["ln_f"].kind == "layernorm" and layers["loss"].kind == "cross_entropy"
    modules = dict(tm.small_gpt().named_modules())
    generic = {l.name for l in w.layers if l.kind == "generic"}
    for name in generic:
        assert name == "GPT" or isinstance(modules.get(name), (nn.Linear, nn.GELU)) or \
            name.count(".") == 1, name  # the root's add, linears, GELU, block glue
    assert not any(isinstance(modules.get(n), (nn.Embedding, nn.LayerNorm)) for n in generic)
    assert w.params == sum(p.numel() for p in tm.small_gpt().parameters())


def test_mapped_counts_equal_the_traced_counts() -> None:
    """Totals as counted by torch (tests/test_torch_import.py): forward 2·W·T + 4·T²·d·L with W
    the matmul weights, input grad 2·W·T + 8·T²·d·L, weight grad 2·W·T."""
    w = _gpt()
    model = tm.small_gpt()
    # every nn.Linear's weight, the head's too (tied to wte: one table, two products)
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    attention = 4 * T * T * D * L
    assert w.fwd_flops == 2 * matmul * T + attention
    assert w.input_grad_flops == 2 * matmul * T + 2 * attention
    assert w.weight_grad_flops == 2 * matmul * T


@pytest.mark.parametrize("need_weights", [False, True])
def test_multihead_attention_becomes_five_layers(need_weights: bool) -> None:
    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(32)
            self.mha = nn.MultiheadAttention(32, 4, batch_first=True, dropout=0.1)

        def forward(self, x):
            x = self.norm(x)
            return self.mha(x, x, x, need_weights=need_weights)[0]

    w = from_torch(Attention, (8, 32))
    assert [l.kind for l in w.layers] == ["layernorm", "attn_qkv", "attn_scores", "attn_softmax",
                                          "attn_context", "attn_out"]
    layers = _by_name(w)
    # in_proj 32·96 + 96, out_proj 32·32 + 32; attention dropout recorded.
    assert layers["mha.qkv"].params == 32 * 96 + 96 and layers["mha.out"].params == 32 * 32 + 32
    assert layers["mha.softmax"].hyper["dropout"] is True
    assert layers["mha.scores"].fwd_flops == 2 * 8 * 8 * 32


class _LlamaBlock(nn.Module):
    """RMSNorm, a fused Q|K|V projection for grouped-query attention (sdpa's enable_gqa), a
    SwiGLU MLP."""

    def __init__(self, width: int = 64, heads: int = 8, kv_heads: int = 2, ffn: int = 96) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, width // heads
        self.attn_norm = nn.RMSNorm(width)
        self.qkv = nn.Linear(width, width + 2 * kv_heads * self.d, bias=False)
        self.attn = _GQA(heads, kv_heads, self.d)
        self.out = nn.Linear(width, width, bias=False)
        self.mlp_norm = nn.RMSNorm(width)
        self.up = nn.Linear(width, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)

    def forward(self, x):
        x = x + self.out(self.attn(self.qkv(self.attn_norm(x))))
        gate, up = self.up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class _GQA(nn.Module):
    def __init__(self, heads: int, kv_heads: int, d: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, d

    def forward(self, qkv):
        b, t, _ = qkv.shape  # (B, T, h + 2·h_kv)
        q, k, v = qkv.split([self.heads * self.d, self.kv_heads * self.d,
                             self.kv_heads * self.d], dim=-1)
        q = q.view(b, t, self.heads, self.d).transpose(1, 2)     # (B, a, T, d)
        k = k.view(b, t, self.kv_heads, self.d).transpose(1, 2)  # (B, k, T, d)
        v = v.view(b, t, self.kv_heads, self.d).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return y.transpose(1, 2).reshape(b, t, self.heads * self.d)


class _Llama(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 64)
        self.layers = nn.ModuleList(_LlamaBlock() for _ in range(2))
        self.norm = nn.RMSNorm(64)
        self.lm_head = nn.Linear(64, 100, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def test_llama_style_model_with_rmsnorm_and_grouped_query_sdpa() -> None:
    """8 query heads, 2 KV heads of d = 8: Q|K|V is 64 + 2·16 = 96 wide; the scores run over
    the 8 query heads, 2·T²·h = 2·16²·64 forward FLOPs."""
    w = from_torch(_Llama, (16,), input_dtypes="int64")
    layers = _by_name(w)
    assert layers["embed"].kind == "embedding" and layers["embed"].hyper["positional"] == "none"
    assert layers["embed"].params == 100 * 64
    assert layers["layers.0.attn_norm"].kind == "rmsnorm" and layers["norm"].kind == "rmsnorm"
    scores = layers["layers.1.attn.scores"]
    assert scores.kind == "attn_scores" and scores.input_shape == (16, 96)
    assert (scores.hyper["heads"], scores.hyper["kv_heads"]) == (8, 2)
    assert scores.fwd_flops == 2 * 16 * 16 * 64
    assert w.params == sum(p.numel() for p in _Llama().parameters())


def test_flash_attention_option_fuses_each_attention() -> None:
    """With flash_attention=True each sdpa module is one flash_attention layer named after the
    module: causal forward 4·T²·d/2, backward 2.5x that, per block."""
    plain, flash = _gpt(), _gpt(flash_attention=True)
    layers = _by_name(flash)
    attention = layers["blocks.2.attn"]
    assert attention.kind == "flash_attention"
    assert (attention.fwd_flops, attention.input_grad_flops) == (2 * T * T * D, 5 * T * T * D)
    assert flash.fwd_flops == plain.fwd_flops - L * 4 * T * T * D + L * 2 * T * T * D
    mha = _by_name(from_torch(tm.small_gpt_mha, (T,), input_dtypes="int64",
                              flash_attention=True))
    assert mha["blocks.0.attn.mha.attention"].kind == "flash_attention"
    assert mha["blocks.0.attn.mha.attention"].hyper["causal"] is False  # no mask given


class _SeparateProjections(nn.Module):
    """Llama's Hugging Face layout: q, k, v projections as three modules. The chain then ends
    in v's output, not a fused Q|K|V tensor, so the attention stays generic."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(32, 32, bias=False) for _ in range(3))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 4, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, 32)


def test_attention_not_fed_by_a_fused_projection_stays_generic_with_its_counts() -> None:
    w = _by_name(from_torch(_SeparateProjections, (8, 32)))
    root = w["_SeparateProjections"]
    assert root.kind == "generic"
    assert root.fwd_flops == 4 * 8 * 8 * 32  # still counted: Q·Kᵀ and P·V


def test_imported_transformer_round_trips_through_yaml() -> None:
    w = from_torch(_Llama, (16,), input_dtypes="int64")
    back = workload_from_dict(workload_to_dict(w))
    assert back.layers == w.layers
    assert [l.hyper for l in back.layers] == [l.hyper for l in w.layers]


def test_cli_describe_torch_gpt() -> None:
    result = CliRunner().invoke(app, ["describe", "--torch", "tests.torch_models:small_gpt",
                                      "--input-shape", f"{T}:int64", "--json"])
    assert result.exit_code == 0, result.output
    kinds = {layer["name"]: layer["kind"] for layer in json.loads(result.stdout)["layers"]}
    assert kinds["wte"] == "embedding" and kinds["blocks.0.ln1"] == "layernorm"
    assert kinds["blocks.3.attn.context"] == "attn_context"


def test_attention_recorder_leaves_no_mode_active() -> None:
    _gpt()
    assert torch._C._len_torch_function_stack() == 0
    assert torch.empty(1).device.type == "cpu"
