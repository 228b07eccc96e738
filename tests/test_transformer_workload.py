"""Transformer workloads: the kinds' counts by hand, Narayanan et al.'s FLOP equation, published
parameter counts, GQA and SwiGLU shapes, flash attention, zoo names and the YAML round trip."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.workload import build_workload, load_workload, zoo_workload
from dnnscale.workload.spec import save_workload_yaml, workload_from_dict, workload_to_dict
from dnnscale.workload.transformer import (default_ffn, transformer_layer_specs,
                                           transformer_workload)
from dnnscale.workload.transformer_kinds import SHAPE_KEYS, TRANSFORMER_KINDS, rmsnorm, rope
from dnnscale.workload.transformer_shape import TransformerShape


def _by_name(workload):
    return {layer.name: layer for layer in workload.layers}


def _tiny(**options):
    """L = 2, h = 8, a = 2 (d = 4), s = 4, V = 10, f = 4h = 32; bf16 (b = 2)."""
    return transformer_workload("tiny", 2, 8, 2, 4, 10, **options)


# --- a tiny GPT, by hand -------------------------------------------------------------------------


def test_tiny_gpt_layer_names_and_kinds() -> None:
    w = _tiny()
    block = ["attn_norm", "attn_qkv", "attn_scores", "attn_softmax", "attn_context", "attn_out",
             "attn_residual", "mlp_norm", "mlp_up", "mlp_act", "mlp_down", "mlp_residual"]
    assert [l.name for l in w.layers] == (["embedding"] + [f"block0.{r}" for r in block]
                                          + [f"block1.{r}" for r in block]
                                          + ["final_norm", "logits", "cross_entropy"])
    assert [l.kind for l in w.layers[1:13]] == [
        "layernorm", "attn_qkv", "attn_scores", "attn_softmax", "attn_context", "attn_out",
        "residual_add", "layernorm", "mlp_up", "mlp_act", "mlp_down", "residual_add"]
    assert w.bytes_per_value == 2 and w.input_shape == (4,)
    assert w.transformer.tokens_per_sample == 4 and w.transformer.head_dim == 4


def test_tiny_gpt_params_by_hand() -> None:
    """embedding (V + s)·h = (10 + 4)·8 = 112; per block: 2 norms 2·2h = 32, qkv 8·24 + 24 = 216,
    out 8·8 + 8 = 72, up 8·32 + 32 = 288, down 32·8 + 8 = 264 -> 872 (= 12h² + 13h =
    768 + 104); final norm 16; tied logits 0. Total 112 + 2·872 + 16 = 1872."""
    expected = {"embedding": 112, "block0.attn_norm": 16, "block0.attn_qkv": 216,
                "block0.attn_out": 72, "block0.mlp_norm": 16, "block0.mlp_up": 288,
                "block0.mlp_down": 264, "final_norm": 16, "logits": 0}
    w = _by_name(_tiny())
    assert {name: w[name].params for name in expected} == expected
    assert _tiny().params == 1872


def test_tiny_gpt_flops_by_hand() -> None:
    """Per sequence (s = 4): qkv 2·4·8·24 = 1536, scores and context 2·s²·h = 2·16·8 = 256
    forward and 512 backward each, out 2·4·8·8 = 512, up and down 2·4·8·32 = 2048, logits
    2·4·8·10 = 640 in every phase. Forward per block 1536 + 256 + 256 + 512 + 2048 + 2048 =
    6656 (= 24·s·h² + 4·s²·h = 6144 + 512); input grad per block 7168, weight grad 6144."""
    w = _tiny()
    layers = _by_name(w)
    assert layers["block1.attn_qkv"].fwd_flops == 1536
    assert layers["block1.attn_scores"].fwd_flops == 256
    assert layers["block1.attn_scores"].input_grad_flops == 512
    assert layers["block1.attn_scores"].weight_grad_flops == 0
    assert layers["block1.attn_context"].input_grad_flops == 512
    assert layers["block1.attn_out"].weight_grad_flops == 512
    assert layers["block1.mlp_down"].input_grad_flops == 2048
    assert layers["logits"].weight_grad_flops == 640  # tied: the shared table still gets it
    assert layers["block0.attn_softmax"].fwd_flops == layers["block0.mlp_act"].fwd_flops == 0
    assert w.fwd_flops == 2 * 6656 + 640
    assert w.input_grad_flops == 2 * 7168 + 640
    assert w.weight_grad_flops == 2 * 6144 + 640
    assert layers["embedding"].input_grad_flops == 0  # its input is token ids


def test_tiny_gpt_bytes_by_hand() -> None:
    """b = 2, s·h = 32 values, a·s² = 32 score values, one dropout mask byte per value.

    embedding (2 tables): s·8 + 2·s·h·b + s·h·b = 32 + 128 + 64 = 224; weight grad s·8 + s·h·b +
    2·2·s·h·b = 32 + 64 + 256 = 352. layernorm (2·32 + 2·4)·2 = 144 forward, (3·32 + 2·4)·2 =
    208 input grad, and the gain/bias kernel (2·32 + 2·4)·2 = 144 weight grad. qkv
    (32 + 96)·2 = 256 per phase. scores (32 + 32 + 32)·2 = 192 forward,
    (32 + 2·4·(8 + 8))·2 = 320 backward. softmax + dropout 2·32·2 + 3·32 = 224 forward,
    3·32·2 + 32 = 224 backward. residual add 3·32·2 + 32 = 224 forward, 192 + 5·32 = 352
    backward. GeLU on s·f = 128: 2·128·2 = 512 and 3·128·2 = 768. Loss (Megatron's in-place
    kernel) 4·10·(2 + 36) + 4·8 = 1552 forward, 4·10·(12 + 2) + 4·8 = 592 backward.
    """
    w = _by_name(_tiny())
    assert (w["embedding"].fwd_bytes, w["embedding"].weight_grad_bytes) == (224, 352)
    assert (w["block0.attn_norm"].fwd_bytes, w["block0.attn_norm"].input_grad_bytes) == (144, 208)
    assert w["block0.attn_norm"].weight_grad_bytes == 144
    assert w["block0.attn_qkv"].weight_grad_bytes == 256
    assert (w["block0.attn_scores"].fwd_bytes, w["block0.attn_scores"].input_grad_bytes) == \
        (192, 320)
    assert (w["block0.attn_softmax"].fwd_bytes, w["block0.attn_softmax"].input_grad_bytes) == \
        (224, 224)
    assert (w["block0.attn_context"].fwd_bytes, w["block0.attn_context"].input_grad_bytes) == \
        (192, 320)
    assert (w["block0.attn_residual"].fwd_bytes, w["block0.attn_residual"].input_grad_bytes) == \
        (224, 352)
    assert (w["block0.mlp_act"].fwd_bytes, w["block0.mlp_act"].input_grad_bytes) == (512, 768)
    assert (w["cross_entropy"].fwd_bytes, w["cross_entropy"].input_grad_bytes) == (1552, 592)


def test_tiny_gpt_shapes_and_hyper() -> None:
    w = _by_name(_tiny())
    assert w["embedding"].output_shape == (4, 8)
    assert w["block0.attn_qkv"].output_shape == (4, 24)
    assert w["block0.attn_scores"].output_shape == (2, 4, 4)
    assert w["block0.attn_context"].output_shape == (4, 8)
    assert w["block0.mlp_up"].output_shape == (4, 32)
    assert w["logits"].output_shape == (4, 10)
    for layer in w.values():
        assert set(SHAPE_KEYS) <= set(layer.hyper), layer.name
        assert (layer.hyper["hidden"], layer.hyper["heads"], layer.hyper["kv_heads"],
                layer.hyper["seq"], layer.hyper["ffn"], layer.hyper["vocab"],
                layer.hyper["gated"]) == (8, 2, 2, 4, 32, 10, False)
    assert w["block1.mlp_residual"].hyper["block"] == 1
    assert w["block1.mlp_residual"].hyper["role"] == "mlp_residual"
    assert w["logits"].hyper["block"] is None and w["logits"].hyper["tied"] is True
    assert w["block0.attn_qkv"].in_features == 8 and w["block0.attn_qkv"].out_features == 24


def test_no_dropout_and_untied_and_no_bias() -> None:
    """Without dropout the softmax moves 2·32·2 = 128 B forward and 3·32·2 = 192 B backward and
    the residual add 3·32·2 = 192 B each way; untied logits hold V·h = 80 parameters; without
    biases a block holds 12h² + 2h (norm gains) = 784."""
    w = _by_name(_tiny(dropout=False, tied_embeddings=False, bias=False))
    assert (w["block0.attn_softmax"].fwd_bytes, w["block0.attn_softmax"].input_grad_bytes) == \
        (128, 192)
    assert w["block0.attn_residual"].fwd_bytes == w["block0.attn_residual"].input_grad_bytes == 192
    assert w["logits"].params == 80
    block = sum(l.params for l in w.values() if l.hyper["block"] == 0)
    assert block == 12 * 64 + 2 * 8


# --- Narayanan et al. SC'21, eq. 3 ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt3-175b", "gpt3-1.3b", "gpt3-13b"])
def test_gpt_flops_match_narayanan_equation_3(name: str) -> None:
    """Narayanan et al. SC'21 eq. 3, per iteration of B sequences with full recomputation:
    96·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)): per block 24·B·s·h² + 4·B·s²·h forward, counted 4
    times (forward, recomputed forward, backward = 2x forward), plus the logits 2·B·s·h·V 3
    times. Without recomputation the blocks count 3 times: 72·B·s·L·h²·(1 + s/(6h) +
    V/(12·L·h)). Here B = 1.

    What the equation leaves out — biases, norms, softmax, dropout, residual adds, the
    embedding gather, the loss — counts 0 FLOP in our convention (torch's), so the match is
    exact up to float rounding (rel 1e-12); only the matrix products carry FLOPs."""
    w = zoo_workload(name)
    t = w.transformer
    s, L, h, V = t.seq, t.layers, t.hidden, t.vocab
    no_recompute = 72 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert w.fwd_flops + w.input_grad_flops + w.weight_grad_flops == \
        pytest.approx(no_recompute, rel=1e-12)
    recompute = 96 * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    block_forward = sum(l.fwd_flops for l in w.layers if l.hyper["block"] is not None)
    assert w.fwd_flops + w.input_grad_flops + w.weight_grad_flops + block_forward == \
        pytest.approx(recompute, rel=1e-12)


def test_gqa_swiglu_block_flops_generalise_the_equation() -> None:
    """Llama-3-8B (h = 4096, 32 heads of 128, 8 KV heads so h_kv = 1024, SwiGLU f = 14336,
    s = 8192): forward per block 2·s·(h·(h + 2·h_kv) + h² + 3·h·f) + 2·s²·h — the zoo's Llama
    runs fused causal attention, whose kernel skips the masked half of the 4·s²·h."""
    w = zoo_workload("llama3-8b")
    s, h, h_kv, f = 8192, 4096, 1024, 14336
    block = 2 * s * (h * (h + 2 * h_kv) + h * h + 3 * h * f) + 2 * s * s * h
    assert sum(l.fwd_flops for l in w.layers if l.hyper["block"] == 5) == block
    assert w.fwd_flops == 32 * block + 2 * s * h * 128256


# --- published parameter counts ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "published", "rel"), [
    # Narayanan et al. SC'21 Table 1 / the usual 174.6 B: our count is 174,604,259,328.
    ("gpt3-175b", 174.6e9, 1e-3),
    ("llama2-7b", 6.74e9, 1e-3),    # HF count 6,738,415,616
    ("llama2-13b", 13.02e9, 1e-3),  # 13,015,864,320
    ("llama2-70b", 68.98e9, 1e-3),  # 68,976,648,192
    ("llama3-8b", 8.03e9, 1e-3),    # 8,030,261,248
    ("llama3-70b", 70.55e9, 1e-3),  # 70,553,706,496
    # BERT-Large: HF BertForPreTraining 336.2 M adds the pooler (1.05 M) and the MLM head's
    # transform + decoder bias (1.08 M) to our 334.09 M encoder: -0.6 %; Devlin et al.'s "340M"
    # is rounded: -1.7 %.
    ("bert-large", 336e6, 0.01),
    ("bert-large", 340e6, 0.02),
])
def test_published_parameter_counts(name: str, published: float, rel: float) -> None:
    assert zoo_workload(name).params == pytest.approx(published, rel=rel)


def test_exact_parameter_counts() -> None:
    """GPT-3 175B: 96·(12h² + 13h) + (V + s)·h + 2h with h = 12288, V = 50257, s = 2048.
    Llama-2-7B: 32·(4h² + 3·h·11008 + 2h) + 2·V·h + h with h = 4096, V = 32000 (untied).
    BERT-Large: 24·(12h² + 13h) + (30522 + 512 + 2)·h + 2h (embedding LayerNorm), h = 1024."""
    h = 12288
    assert zoo_workload("gpt3-175b").params == 96 * (12 * h * h + 13 * h) + (50257 + 2048) * h \
        + 2 * h == 174_604_259_328
    h = 4096
    assert zoo_workload("llama2-7b").params == \
        32 * (4 * h * h + 3 * h * 11008 + 2 * h) + 2 * 32000 * h + h == 6_738_415_616
    h = 1024
    assert zoo_workload("bert-large").params == \
        24 * (12 * h * h + 13 * h) + (30522 + 512 + 2) * h + 2 * h == 334_092_288


@pytest.mark.parametrize(("name", "nominal"), [
    ("gpt3-125m", 125e6), ("gpt3-350m", 350e6), ("gpt3-760m", 760e6), ("gpt3-1.3b", 1.3e9),
    ("gpt3-2.7b", 2.7e9), ("gpt3-6.7b", 6.7e9), ("gpt3-13b", 13e9)])
def test_gpt3_family_matches_its_rounded_names(name: str, nominal: float) -> None:
    """Brown et al. Table 2.1 names the models by rounded sizes: within 2 % (355.9 M is the
    farthest, 1.7 % above "350M")."""
    assert zoo_workload(name).params == pytest.approx(nominal, rel=0.02)


# --- GQA, SwiGLU, RMSNorm, BERT ------------------------------------------------------------------


def test_llama2_70b_grouped_query_attention_shapes() -> None:
    """64 query heads of 128, 8 KV heads: Q|K|V is 8192 + 2·8·128 = 10240 wide; the zoo's
    Llama runs fused attention (one layer from Q|K|V to the 8192-wide context); unfused, the
    scores are per query head (64, s, s)."""
    w = _by_name(zoo_workload("llama2-70b"))
    qkv = w["block0.attn_qkv"]
    assert qkv.output_shape == (4096, 10240) and qkv.params == 8192 * 10240
    assert w["block0.flash_attention"].input_shape == (4096, 10240)
    assert w["block0.flash_attention"].output_shape == (4096, 8192)
    assert "block0.attn_scores" not in w
    assert qkv.hyper["kv_heads"] == 8 and qkv.hyper["heads"] == 64
    unfused = _by_name(transformer_workload("u", 1, 8192, 64, 4096, 32000, ffn=28672,
                                            kv_heads=8, gated=True, norm="rmsnorm",
                                            positional="rope", bias=False))
    assert unfused["block0.attn_scores"].input_shape == (4096, 10240)
    assert unfused["block0.attn_scores"].output_shape == (64, 4096, 4096)


def test_swiglu_and_rmsnorm_shapes() -> None:
    """Gated MLP with f = 12 on h = 8: up h -> 2f = 24 (params 192), SwiGLU 24 -> 12 moving
    3·s·f·b = 3·4·12·2 = 288 B forward and 5·s·f·b = 480 B backward, down 12 -> 8 (96).
    RMSNorm has h = 8 gains and moves (2·s·h + s)·b = (64 + 4)·2 = 136 B forward."""
    w = _by_name(transformer_workload("g", 1, 8, 4, 4, 10, ffn=12, kv_heads=2, gated=True,
                                      norm="rmsnorm", positional="rope", bias=False))
    assert w["block0.mlp_up"].output_shape == (4, 24) and w["block0.mlp_up"].params == 192
    act = w["block0.mlp_act"]
    assert (act.input_shape, act.output_shape) == ((4, 24), (4, 12))
    assert (act.fwd_bytes, act.input_grad_bytes) == (288, 480)
    assert w["block0.mlp_down"].params == 96
    assert w["block0.attn_norm"].kind == "rmsnorm" and w["block0.attn_norm"].params == 8
    assert w["block0.attn_norm"].fwd_bytes == 136
    # 2 KV heads of d = 2: Q|K|V 8 + 2·4 = 16 wide.
    assert w["block0.attn_qkv"].output_shape == (4, 16)
    assert w["embedding"].params == 10 * 8  # RoPE: no position table


def test_default_ffn() -> None:
    """4h; gated 256·⌈⌊8h/3⌋/256⌉: Llama-2-7B's 11008 for h = 4096 and 13824 for h = 5120."""
    assert default_ffn(1024, False) == 4096
    assert default_ffn(4096, True) == 11008
    assert default_ffn(5120, True) == 13824


def test_bert_large_is_post_norm_and_bidirectional() -> None:
    w = zoo_workload("bert-large")
    names = [l.name for l in w.layers]
    assert names[:2] == ["embedding", "embedding_norm"]
    assert names[2:14] == [f"block0.{r}" for r in (
        "attn_qkv", "attn_scores", "attn_softmax", "attn_context", "attn_out", "attn_residual",
        "attn_norm", "mlp_up", "mlp_act", "mlp_down", "mlp_residual", "mlp_norm")]
    assert "final_norm" not in names and names[-2:] == ["logits", "cross_entropy"]
    assert w.transformer.causal is False
    assert _by_name(w)["block3.attn_scores"].hyper["causal"] is False
    assert _by_name(w)["embedding"].params == (30522 + 512 + 2) * 1024


# --- flash attention -----------------------------------------------------------------------------


def test_flash_attention_replaces_the_three_attention_layers() -> None:
    """FlashAttention-2's count: forward 4·s²·h = 4·16·8 = 512, halved when causal (256);
    backward 2.5x (640), including the recomputed Q·Kᵀ. Bytes without an s x s tensor: forward
    (2·s·h + 2·s·h_kv)·b + 4·a·s = (64 + 64)·2 + 32 = 288; backward (4·32 + 4·32)·2 + 32 = 544."""
    w = _by_name(_tiny(flash_attention=True))
    flash = w["block0.flash_attention"]
    assert "block0.attn_scores" not in w and "block0.attn_softmax" not in w
    assert (flash.input_shape, flash.output_shape) == ((4, 24), (4, 8))
    assert (flash.fwd_flops, flash.input_grad_flops, flash.weight_grad_flops) == (256, 640, 0)
    assert (flash.fwd_bytes, flash.input_grad_bytes) == (288, 544)
    bidirectional = _by_name(_tiny(flash_attention=True, causal=False))["block0.flash_attention"]
    assert (bidirectional.fwd_flops, bidirectional.input_grad_flops) == (512, 1280)


def test_flash_attention_moves_no_s_squared_bytes() -> None:
    """At s = 2048 the unfused softmax alone moves (2·b + b + 1)·a·s² bytes; flash moves only
    O(s·h)."""
    plain = _by_name(zoo_workload("gpt3-1.3b"))
    flash = _by_name(zoo_workload("gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=50257,"
                                  "flash=true"))
    s, h, a = 2048, 2048, 16
    assert plain["block0.attn_softmax"].fwd_bytes == (2 * 2 + 2 + 1) * a * s * s
    assert flash["block0.flash_attention"].fwd_bytes == (2 * s * h + 2 * s * h) * 2 + 4 * a * s


# --- the fast builder, YAML and names ------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt3-125m", "llama3-8b", "bert-large"])
def test_copied_blocks_equal_a_full_build_and_yaml_round_trips(name: str, tmp_path) -> None:
    """The builder copies block 0's layers for the other blocks; a full build from the specs
    and a YAML round trip give the same layers, hyper dicts and shape summary."""
    w = zoo_workload(name)
    full = build_workload(w.name, list(w.input_shape), transformer_layer_specs(w.transformer),
                          w.samples_per_epoch, w.bytes_per_value, w.description,
                          transformer=w.transformer)
    assert full == w
    assert [l.hyper for l in full.layers] == [l.hyper for l in w.layers]
    path = tmp_path / "w.yaml"
    save_workload_yaml(w, path)
    again = load_workload(path)
    assert again == w and [l.hyper for l in again.layers] == [l.hyper for l in w.layers]


def test_every_transformer_kind_is_registered_and_used() -> None:
    used = {l.kind for name in ("gpt3-125m", "llama2-7b", "bert-large")
            for l in zoo_workload(name).layers}
    used |= {l.kind for l in _tiny(flash_attention=True).layers}
    assert used == set(TRANSFORMER_KINDS)


def test_parametric_gpt_name() -> None:
    w = zoo_workload("gpt:layers=24,hidden=1024,heads=16,seq=1024,vocab=51200")
    t = w.transformer
    assert (t.layers, t.hidden, t.heads, t.seq, t.vocab, t.ffn) == (24, 1024, 16, 1024, 51200,
                                                                   4096)
    # 24·(12h² + 13h) + (51200 + 1024)·h + 2h
    assert w.params == 24 * (12 * 1024**2 + 13 * 1024) + (51200 + 1024) * 1024 + 2 * 1024
    g = zoo_workload("gpt:layers=2,hidden=64,heads=8,kv_heads=2,seq=32,vocab=100,gated=true,"
                     "norm=rmsnorm,positional=rope,tied=false,flash=yes,samples=5")
    assert g.transformer.kv_heads == 2 and g.transformer.flash_attention
    assert g.transformer.ffn == default_ffn(64, True) and g.samples_per_epoch == 5


@pytest.mark.parametrize(("name", "field"), [
    ("gpt:layers=2,hidden=64,heads=5,seq=8,vocab=10", "workload.gpt.heads"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8", "workload.gpt.vocab"),
    ("gpt:layers=two,hidden=64,heads=4,seq=8,vocab=10", "workload.gpt.layers"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,depth=3", "workload.gpt.depth"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,flash=maybe", "workload.gpt.flash"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,tied=0,kv_heads=3", "workload.gpt.kv_heads"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,norm=batchnorm", "workload.gpt.norm"),
    ("gpt:layers=0,hidden=64,heads=4,seq=8,vocab=10", "workload.gpt.layers"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,samples=0", "workload.gpt.samples"),
    ("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,positions=4", "workload.gpt.positions"),
])
def test_parametric_gpt_errors_name_the_key(name: str, field: str) -> None:
    with pytest.raises(InputError) as info:
        zoo_workload(name)
    assert info.value.field == field


def test_bad_yaml_fields_name_the_field() -> None:
    data = workload_to_dict(_tiny())
    data["layers"][2]["heads"] = 3  # 3 heads do not divide 8
    with pytest.raises(InputError, match=r"layers\.block0\.attn_qkv\.heads"):
        workload_from_dict(data)
    data = workload_to_dict(_tiny())
    data["layers"][2]["colour"] = "red"
    with pytest.raises(InputError, match="colour"):
        workload_from_dict(data)
    data = workload_to_dict(_tiny())
    data["transformer"]["norm"] = "batchnorm"
    with pytest.raises(InputError, match=r"transformer\.norm"):
        workload_from_dict(data)
    data = workload_to_dict(_tiny())
    del data["layers"][2]  # the norm's (4, 8) output no longer fits the scores' Q|K|V input
    with pytest.raises(InputError, match="block0.attn_scores"):
        workload_from_dict(data)


def test_gpt_name_with_token_types_is_the_zoo_bert() -> None:
    """token_types is a gpt: key (BERT's segment table): with post-norm it names the zoo's
    BERT-Large, 334,092,288 parameters (2 more rows of 1024 than without)."""
    base = ("gpt:layers=24,hidden=1024,heads=16,seq=512,vocab=30522,causal=false,"
            "positions=512,norm_position=post,predictions=80")
    bert = zoo_workload(base + ",token_types=2")
    assert bert.transformer == zoo_workload("bert-large").transformer
    assert bert.params == 334_092_288 == zoo_workload(base).params + 2 * 1024
    with pytest.raises(InputError) as info:
        zoo_workload(base + ",token_types=-1")
    assert info.value.field == "workload.gpt.token_types"


def test_attention_dropout_round_trips_and_is_checked(tmp_path) -> None:
    """The attention dropout is a field of its own: unset it follows the hidden dropout, set it
    stays apart; a YAML round trip keeps it; a non-bool is refused, naming the field."""
    assert _tiny(dropout=False).transformer.attention_dropout is False
    apart = _tiny(attention_dropout=False)
    assert (apart.transformer.dropout, apart.transformer.attention_dropout) == (True, False)
    path = tmp_path / "apart.yaml"
    save_workload_yaml(apart, path)
    again = load_workload(path)
    assert again == apart and again.transformer.attention_dropout is False
    data = workload_to_dict(apart)
    data["transformer"]["attention_dropout"] = "no"
    with pytest.raises(InputError, match=r"transformer\.attention_dropout"):
        workload_from_dict(data)
    with pytest.raises(InputError) as info:
        zoo_workload("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,attention_dropout=maybe")
    assert info.value.field == "workload.gpt.attention_dropout"


def test_shape_summary_validation() -> None:
    with pytest.raises(InputError, match="transformer.kv_heads"):
        TransformerShape(layers=1, hidden=8, heads=4, kv_heads=3, ffn=32, vocab=10, seq=4)
    with pytest.raises(InputError, match="transformer.positions"):
        TransformerShape(layers=1, hidden=8, heads=4, kv_heads=4, ffn=32, vocab=10, seq=4,
                         positions=2)
    t = TransformerShape(layers=1, hidden=8, heads=4, kv_heads=2, ffn=32, vocab=10, seq=4,
                         positions=4)
    assert (t.tokens_per_sample, t.head_dim, t.kv_hidden) == (4, 2, 4)
    with pytest.raises(InputError, match="transformer.rope_theta: only RoPE positions"):
        TransformerShape(layers=1, hidden=8, heads=4, kv_heads=4, ffn=32, vocab=10, seq=4,
                         positions=4, rope_theta=500000.0)
    for bad in (True, 1, float("nan"), "1e4"):
        with pytest.raises(InputError, match="transformer.rope_theta: must be a number"):
            TransformerShape(layers=1, hidden=8, heads=4, kv_heads=4, ffn=32, vocab=10, seq=4,
                             positional="rope", rope_theta=bad)
    rope = TransformerShape(layers=1, hidden=8, heads=4, kv_heads=4, ffn=32, vocab=10, seq=4,
                            positional="rope", rope_theta=500000)
    assert rope.rotary_base == 500000.0


@settings(max_examples=40, deadline=None)
@given(layers=st.integers(1, 3), heads=st.sampled_from([1, 2, 4, 8]),
       head_dim=st.integers(1, 8), group=st.sampled_from([1, 2, 4]), seq=st.integers(1, 16),
       vocab=st.integers(2, 50), ffn=st.integers(1, 40), gated=st.booleans(),
       flash=st.booleans(), causal=st.booleans())
def test_invariants(layers, heads, head_dim, group, seq, vocab, ffn, gated, flash,
                    causal) -> None:
    """For any shape: the chain closes, weight-gradient FLOPs equal the forward FLOPs of the
    weighted layers, attention's backward is 2x (2.5x flash) its forward, and FLOPs grow
    linearly with the tokens except attention's s² part."""
    kv_heads = max(1, heads // group)
    hidden = heads * head_dim
    w = transformer_workload("p", layers, hidden, heads, seq, vocab, ffn=ffn, kv_heads=kv_heads,
                             gated=gated, flash_attention=flash, causal=causal)
    for before, after in zip(w.layers, w.layers[1:]):
        assert before.output_shape == after.input_shape
    linears = [l for l in w.layers if l.in_features is not None]
    assert w.weight_grad_flops == sum(l.fwd_flops for l in linears)
    attention = [l for l in w.layers if l.kind in ("attn_scores", "attn_context",
                                                   "flash_attention")]
    ratio = 2.5 if flash else 2.0
    assert math.isclose(sum(l.input_grad_flops for l in attention),
                        ratio * sum(l.fwd_flops for l in attention))
    expected_attention = layers * (4 * seq * seq * hidden / (2 if flash and causal else 1))
    assert math.isclose(sum(l.fwd_flops for l in attention), expected_attention)
    assert all(l.fwd_flops >= 0 and l.fwd_bytes > 0 for l in w.layers)


def test_the_layers_outside_the_blocks_are_found_once() -> None:
    """The embedding first, then after the blocks the final norm, the output layer and the loss:
    the indices a stage template prices beside its blocks (model/stage.stage_template)."""
    from dnnscale.workload import load_workload

    workload = load_workload("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100")
    outside = workload.outside_block_indices
    assert [workload.layers[i].kind for i in outside] == \
        ["embedding", "layernorm", "logits", "cross_entropy"]
    assert outside[0] == 0 and outside[1:] == tuple(range(len(workload.layers) - 3,
                                                          len(workload.layers)))
    assert workload.outside_block_indices is outside           # computed once


def test_norm_gain_gradient_kernel_is_priced_as_its_own_memory_pass() -> None:
    """A layernorm's weight-gradient phase on a GPU is one memory pass of its (2·s·h + 2·s)·b
    bytes per sample times the micro-batch (model/gpu_compute.memory_pass_s), and an RMSNorm's
    of (2·s·h + s)·b: the gain (and bias) reduction torch and Apex run after grad_x."""
    from dnnscale.model.gpu_compute import memory_pass_s
    from dnnscale.model.predict import predict_plan
    from dnnscale.plan.modern import modern_plan_from_dict
    from dnnscale.system.load import load_system

    system = load_system("dgx-a100-80g:1")
    plan = modern_plan_from_dict({"tp": 1, "pp": 1, "dp": 1, "micro_batch": 4,
                                  "global_batch": 4, "precision": "bf16"})
    for spec, stats in (("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000", 2),
                        ("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000,norm=rmsnorm", 1)):
        prediction = predict_plan(load_workload(spec), system, plan, per_layer=True)
        norm = next(c for c in prediction.layers if c.name == "block1.attn_norm")
        moved = 4 * (2 * 128 * 256 + stats * 128) * 2
        assert norm.weight_grad_s == pytest.approx(memory_pass_s(system.machine, moved))
        assert norm.weight_grad_s > 0 and norm.input_grad_s > norm.weight_grad_s


def test_eager_rmsnorm_bytes_by_hand(tmp_path) -> None:
    """eager prices an RMSNorm op by op: s = 4 tokens of h = 8, b = 2: forward
    (2·6 + 20 + 4)·32 + 24·4 = 1,248 B (the fused kernel's (2·32 + 4)·2 = 136); input gradient
    (4 + 12 + 68)·32 + 96 = 2,784 B; the gain's gradient 8·32 = 256 B. At b = 4 the casts
    vanish (.float() returns x): forward 28·32 + 96 = 992, input 76·32 + 96 = 2,528, gain
    16·32 = 512. A YAML round trip keeps the field; a non-bool is refused, naming the field;
    a LayerNorm and a GeLU price the same either way (one kernel each in eager torch)."""
    eager = _tiny(norm="rmsnorm", eager=True)
    fused = _tiny(norm="rmsnorm")
    norm = next(layer for layer in eager.layers if layer.kind == "rmsnorm")
    assert (norm.fwd_bytes, norm.input_grad_bytes, norm.weight_grad_bytes) == (1248, 2784, 256)
    assert norm.hyper["eager"] is True and norm.params == 8
    plain = next(layer for layer in fused.layers if layer.kind == "rmsnorm")
    assert plain.fwd_bytes == 136 and "eager" not in plain.hyper
    wide = rmsnorm("norm", (4, 8), 4, True, eager=True, hidden=8, seq=4)
    assert (wide.fwd_bytes, wide.input_grad_bytes, wide.weight_grad_bytes) == (992, 2528, 512)
    # every other layer is the same
    assert [(a.kind, a.fwd_bytes) for a in eager.layers if a.kind != "rmsnorm"] == \
        [(a.kind, a.fwd_bytes) for a in fused.layers if a.kind != "rmsnorm"]
    path = tmp_path / "eager.yaml"
    save_workload_yaml(eager, path)
    assert load_workload(path) == eager
    plain_gpt = _tiny(eager=True)  # LayerNorm and GeLU
    assert [(a.kind, a.fwd_bytes, a.input_grad_bytes) for a in plain_gpt.layers] == \
        [(a.kind, a.fwd_bytes, a.input_grad_bytes) for a in _tiny().layers]
    with pytest.raises(InputError, match=r"transformer\.eager"):
        _tiny(eager="yes")
    with pytest.raises(InputError) as info:
        zoo_workload("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10,eager=python")
    assert info.value.field == "workload.gpt.eager"
    named = zoo_workload("gpt:layers=2,hidden=8,heads=2,seq=4,vocab=10,norm=rmsnorm,"
                         "eager=true")
    assert named.transformer is not None and named.transformer.eager is True


def test_eager_swiglu_bytes_by_hand() -> None:
    """eager runs a gated activation as silu, then the product: s = 4 rows of f = 32 at b = 2,
    forward 5·32·4·2 = 1,280 B (fused 3·…: 768), input gradient 9·… = 2,304 B (fused 1,280);
    the experts' activation on s·k = 8 rows likewise (2,560 and 4,608 B); a GeLU's is the same
    either way."""
    gated = dict(norm="rmsnorm", gated=True, ffn=32)
    act = next(a for a in _tiny(**gated, eager=True).layers if a.kind == "mlp_act")
    fused = next(a for a in _tiny(**gated).layers if a.kind == "mlp_act")
    assert (act.fwd_bytes, act.input_grad_bytes) == (1280, 2304)
    assert (fused.fwd_bytes, fused.input_grad_bytes) == (768, 1280)
    assert act.hyper["eager"] is True and "eager" not in fused.hyper
    moe = _tiny(**gated, eager=True, experts=4, top_k=2)
    expert = next(a for a in moe.layers if a.kind == "expert_act")
    assert (expert.fwd_bytes, expert.input_grad_bytes) == (2560, 4608)
    gelu = next(a for a in _tiny(eager=True).layers if a.kind == "mlp_act")
    assert (gelu.fwd_bytes, gelu.input_grad_bytes) == (2 * 32 * 4 * 2, 3 * 32 * 4 * 2)


def test_rope_bytes_by_hand() -> None:
    """positional=rope adds a `rope` layer after each block's Q|K|V projection: s = 4 tokens,
    h = 8, kv_heads 1 of 2 heads (h_kv = 4): Q and K are 12 values a token, 48 in all; fused
    2b = 4 bytes a value each way, 192 B; eager (fp32 through complex numbers) 2·6 + 8 = 20 at
    b = 2, 960 B each way, and 8 at b = 4 (no casts). V passes untouched; no parameters; other
    positionals have no such layer."""
    shape = dict(norm="rmsnorm", positional="rope", kv_heads=1)
    fused = next(a for a in _tiny(**shape).layers if a.kind == "rope")
    assert (fused.fwd_bytes, fused.input_grad_bytes, fused.params) == (192, 192, 0)
    assert fused.input_shape == fused.output_shape == (4, 16)
    eager = next(a for a in _tiny(**shape, eager=True).layers if a.kind == "rope")
    assert (eager.fwd_bytes, eager.input_grad_bytes) == (960, 960)
    assert eager.hyper["eager"] is True
    wide = rope("rope", (4, 16), 4, True, eager=True, hidden=8, heads=2, kv_heads=1, seq=4)
    assert (wide.fwd_bytes, wide.input_grad_bytes) == (8 * 48, 8 * 48)
    kinds = [a.kind for a in _tiny(**shape).layers]
    assert kinds.count("rope") == 2 and kinds[kinds.index("rope") - 1] == "attn_qkv"
    assert "rope" not in {a.kind for a in _tiny().layers}


def test_an_eager_moe_round_trips(tmp_path) -> None:
    """Every layer eager changes (the norms, RoPE, the experts' activation) keeps its flag
    through a YAML file."""
    w = zoo_workload("gpt:layers=2,hidden=64,heads=4,kv_heads=2,seq=8,vocab=10,norm=rmsnorm,"
                     "gated=true,positional=rope,eager=true,experts=4,top_k=2")
    path = tmp_path / "eager-moe.yaml"
    save_workload_yaml(w, path)
    again = load_workload(path)
    assert again == w
    flagged = {layer.kind for layer in again.layers if layer.hyper.get("eager")}
    assert flagged == {"rmsnorm", "rope", "expert_act"}
