"""Transformer-XL as a transformer variant (issue 23): a recurrence memory of m cached hidden
states per block and relative positional encodings (Dai et al. 2019), counted by hand."""

from __future__ import annotations

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.model.memory import transformer_block_activation_bytes
from dnnscale.workload import load_workload, transformer_workload, zoo_workload
from dnnscale.workload.spec import save_workload_yaml

# NVIDIA DeepLearningExamples' Transformer-XL base for WikiText-103 (README's hyperparameter
# table, wt103_base.yaml): 16 layers, d_model 512, 8 heads of 64, d_inner 2048, tgt_len 192,
# mem_len 192; WikiText-103's 267,735-word vocabulary, priced as a full softmax.
L, H, A, F, S, M, V = 16, 512, 8, 2048, 192, 192, 267_735
BASE = (f"gpt:layers={L},hidden={H},heads={A},ffn={F},seq={S},memory={M},vocab={V},"
        "positional=relative,norm_position=post,tied=true")


def _by_name(workload):
    return {layer.name: layer for layer in workload.layers}


def test_a_block_with_memory_and_relative_positions_by_hand() -> None:
    w = _by_name(zoo_workload(BASE))
    k = S + M  # 384 keys per query
    qkv, scores = w["block0.attn_qkv"], w["block0.attn_scores"]
    softmax, context = w["block0.attn_softmax"], w["block0.attn_context"]
    # Q|K|V of the memory and the segment: 2·(s + m)·h·3h every phase
    assert qkv.output_shape == (k, 3 * H)
    assert qkv.fwd_flops == qkv.input_grad_flops == qkv.weight_grad_flops == 2 * k * H * 3 * H \
        == 603_979_776
    # two score products (content and relative position), each 2·s·(s + m)·h forward
    assert scores.output_shape == (A, S, k) and scores.params == H * H
    assert scores.fwd_flops == 2 * (2 * S * k * H) == 150_994_944
    assert scores.input_grad_flops == 2 * scores.fwd_flops and scores.weight_grad_flops == 0
    assert softmax.output_shape == (A, S, k)
    assert context.fwd_flops == 2 * S * k * H and context.input_grad_flops == 4 * S * k * H
    # bytes (b = 2): the relative term's extra traffic on top of the plain scores'
    b = 2
    plain_fwd = (S * H + k * H + A * S * k) * b
    assert scores.fwd_bytes == plain_fwd + (5 * S * H + 6 * A * S * k) * b
    plain_bwd = (A * S * k + 2 * (S * H + k * H)) * b
    assert scores.input_grad_bytes == plain_bwd + (5 * A * S * k + 5 * S * H) * b
    assert qkv.fwd_bytes == (k * H + k * 3 * H) * b + 2 * k * H * b
    # the reference code's unfused chain (masked_fill_, F.softmax, nn.Dropout), per score:
    # forward mask 2b + softmax 2b + dropout 2b + its 1-byte mask; backward dropout 2b + 1,
    # softmax 3b, mask 2b
    assert softmax.hyper["unfused"] is True
    assert softmax.fwd_bytes == (2 * b + 2 * b + 2 * b + 1) * A * S * k == 7_667_712
    assert softmax.input_grad_bytes == (2 * b + 1 + 3 * b + 2 * b) * A * S * k == 8_847_360


def test_parameters_and_forward_flops_by_hand() -> None:
    w = zoo_workload(BASE)
    block = (3 * H * H + 3 * H          # qkv (+ bias)
             + H * H                    # W_{k,R}, the relative-position projection
             + H * H + H                # output projection
             + H * F + F + F * H + H    # MLP
             + 2 * 2 * H)               # two layernorms
    # the tied table and u, v; the post-norm stack's norm after the embedding
    assert w.params == V * H + 2 * H + 2 * H + L * block == 191_714_816
    per_block_fwd = (2 * (S + M) * H * 3 * H + 2 * 2 * S * (S + M) * H + 2 * S * (S + M) * H
                     + 2 * S * H * H + 2 * 2 * S * H * F)
    assert w.fwd_flops == L * per_block_fwd + 2 * S * H * V


def test_without_memory_keys_are_the_segment_and_plain_shapes_are_unchanged() -> None:
    rel = _by_name(zoo_workload("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,"
                                "positional=relative"))
    assert rel["block0.attn_scores"].output_shape == (4, 16, 16)
    assert rel["block0.attn_scores"].fwd_flops == 2 * 2 * 16 * 16 * 64
    plain = _by_name(zoo_workload("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,"
                                  "positional=none"))
    assert plain["block0.attn_scores"].fwd_flops == 2 * 16 * 16 * 64
    assert "memory" not in plain["block0.attn_qkv"].hyper
    assert "relative" not in plain["block0.attn_scores"].hyper
    # only Transformer-XL's code runs the attention's mask, softmax and dropout unfused
    assert "unfused" not in plain["block0.attn_softmax"].hyper
    assert rel["block0.attn_softmax"].hyper["unfused"] is True
    fused, unfused = plain["block0.attn_softmax"], rel["block0.attn_softmax"]
    values = 4 * 16 * 16   # a · s · s_k, b = 2 (bf16)
    assert fused.fwd_bytes == (2 * 2 + 2 + 1) * values      # 3b + 1
    assert fused.input_grad_bytes == (3 * 2 + 1) * values   # 3b + 1
    assert unfused.fwd_bytes - fused.fwd_bytes == 3 * 2 * values
    assert unfused.input_grad_bytes - fused.input_grad_bytes == 4 * 2 * values


@pytest.mark.parametrize("keys, field, words", [
    ("memory=8", "workload.gpt.memory", "relative positions"),
    ("memory=8,positional=relative,flash=true", "workload.gpt.flash", "fused"),
    ("memory=-1,positional=relative", "workload.gpt.memory", "integer"),
    ("memory=x,positional=relative", "workload.gpt.memory", "integer"),
    ("positional=relative,flash=true", "workload.gpt.flash", "fused"),
    ("norm_position=middle", "workload.gpt.norm_position", "pre, post"),
])
def test_bad_transformer_xl_keys_name_their_key(keys, field, words) -> None:
    with pytest.raises(InputError) as info:
        zoo_workload(f"gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,{keys}")
    assert info.value.field == field and words in info.value.problem
    assert "\n" not in str(info.value)


def test_a_memory_layer_built_alone_is_checked() -> None:
    with pytest.raises(InputError) as info:
        transformer_workload("x", 2, 64, 4, 16, 100, memory=8, positional="learned")
    assert info.value.field == "transformer.memory"
    from dnnscale.workload import build_workload

    with pytest.raises(InputError) as info:
        build_workload("f", [24, 192], [{"kind": "flash_attention", "hidden": 64, "heads": 4,
                                         "seq": 16, "memory": 8}], samples_per_epoch=1)
    assert info.value.field.endswith("memory")


def test_activation_memory_with_a_memory_by_hand() -> None:
    s, m, b, h, a = 192, 192, 4, 512, 8
    k = s + m
    got = transformer_block_activation_bytes(s, b, h, a, h, F, F, 1, False, "none", False,
                                             memory=m, relative=True)
    whole = (8 * s + 2 * k) * b * h
    split = 6 * s * b * h + 4 * k * b * h + 2 * s * b * F + 2 * s * b * F
    assert got == whole + split + 5 * a * s * k * b
    # without a memory and relative positions it is Korthikanti et al.'s s·b·h·(34 + 5·a·s/h)
    plain = transformer_block_activation_bytes(s, b, h, a, h, 4 * h, 4 * h, 1, False, "none",
                                               False)
    assert plain == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_transformer_xl_predicts_round_trips_and_is_not_exported(tmp_path) -> None:
    plan = {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 32, "global_batch": 256,
            "precision": "fp16"}
    prediction = dnnscale.predict(BASE, "dgx-a100-40g:1", plan)
    assert prediction.fits and prediction.throughput_samples_per_s > 0
    workload = zoo_workload(BASE)
    path = tmp_path / "xl.yaml"
    save_workload_yaml(workload, path)
    again = load_workload(path)
    assert again.layers == workload.layers and again.transformer == workload.transformer
    from dnnscale.export.result import check_exportable
    from dnnscale.plan.modern import modern_plan_from_dict

    with pytest.raises(InputError) as info:
        check_exportable(modern_plan_from_dict(plan), workload.transformer, BASE, "megatron")
    assert info.value.field == "workload" and "Transformer-XL" in info.value.problem
