"""A biased linear layer's bias gradient is a reduction kernel of its own
(model/gpu_compute.reduces_bias_gradient): its bytes by hand, where a tensor split leaves the
output whole, FP8's fused case, and the workloads that have no attention biases."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.model.gpu_compute import memory_pass_s
from dnnscale.system import load_system
from dnnscale.workload import load_workload

SHAPE = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000"
PLAN = {"micro_batch": 8, "global_batch": 8, "precision": "bf16"}


def _layer(prediction, name: str):  # type: ignore[no-untyped-def]
    (cost,) = [layer for layer in prediction.layers if layer.name == name]
    return cost


def _pair(system: str, plan: dict[str, object], name: str, shape: str = SHAPE):  # type: ignore[no-untyped-def]
    biased = _layer(dnnscale.predict(shape, system, plan), name)
    plain = _layer(dnnscale.predict(shape + ",bias=false", system, plan), name)
    return biased, plain


def test_the_reduction_reads_the_output_gradient_once_by_hand() -> None:
    device = load_system("dgx-a100-80g:1").machine
    biased, plain = _pair("dgx-a100-80g:1", PLAN, "block0.attn_qkv")
    # 8 sequences x 128 tokens x 3·256 outputs, 2 bytes each
    assert 8 * 128 * 3 * 256 * 2 == 1_572_864
    assert biased.weight_grad_s - plain.weight_grad_s == pytest.approx(
        memory_pass_s(device, 1_572_864), rel=1e-9)
    # the GEMMs are the same; the reduction is one more kernel in the backward
    assert biased.forward_s == plain.forward_s and biased.input_grad_s == plain.input_grad_s
    assert biased.backward_launches == plain.backward_launches + 1
    assert biased.forward_launches == plain.forward_launches


def test_a_row_parallel_layer_reduces_its_whole_output() -> None:
    """Megatron adds a row-parallel layer's bias after the all-reduce, so each of the tp members
    reduces the whole output; under sequence parallelism 1/tp of it (after the reduce-scatter).
    A column-parallel layer reduces its own 1/tp of the outputs."""
    device = load_system("dgx-a100-80g:1").machine
    tp2 = {**PLAN, "tp": 2}
    whole = 8 * 128 * 256 * 2  # attn_out: 256 outputs a token, 524,288 bytes
    biased, plain = _pair("dgx-a100-80g:1", tp2, "block0.attn_out")
    assert biased.weight_grad_s - plain.weight_grad_s == pytest.approx(
        memory_pass_s(device, whole), rel=1e-9)
    biased, plain = _pair("dgx-a100-80g:1", {**tp2, "sequence_parallel": True},
                          "block0.attn_out")
    assert biased.weight_grad_s - plain.weight_grad_s == pytest.approx(
        memory_pass_s(device, whole / 2), rel=1e-9)
    biased, plain = _pair("dgx-a100-80g:1", tp2, "block0.mlp_up")
    assert biased.weight_grad_s - plain.weight_grad_s == pytest.approx(
        memory_pass_s(device, 8 * 128 * 1024 * 2 / 2), rel=1e-9)


def test_fp8_linears_fuse_it_and_the_head_in_bf16_does_not() -> None:
    """Transformer Engine's FP8 cast-transpose-dbias forms the bias gradient: no kernel of its
    own for the FP8 linears."""
    plan = {**PLAN, "precision": "fp8"}
    biased, plain = _pair("dgx-h100:1", plan, "block0.mlp_down")
    assert biased.weight_grad_s == pytest.approx(plain.weight_grad_s, rel=1e-12)
    assert biased.backward_launches == plain.backward_launches


def test_attention_bias_false_keeps_the_mlp_biases() -> None:
    h = 256
    workload = load_workload(SHAPE + ",attention_bias=false")
    layers = {layer.name: layer for layer in workload.layers}
    assert layers["block0.attn_qkv"].params == h * 3 * h
    assert layers["block0.attn_out"].params == h * h
    assert layers["block0.mlp_up"].params == h * 4 * h + 4 * h
    assert workload.transformer is not None and workload.transformer.attention_bias is False
    # unset, the attention's biases follow `bias`
    assert load_workload(SHAPE).transformer.attention_bias is True  # type: ignore[union-attr]
    assert load_workload(SHAPE + ",bias=false").transformer.attention_bias is False  # type: ignore[union-attr]
    biased, plain = _pair("dgx-a100-80g:1", PLAN, "block0.attn_qkv",
                          SHAPE + ",attention_bias=false")
    assert biased.weight_grad_s == pytest.approx(plain.weight_grad_s, rel=1e-12)


def test_a_bad_attention_bias_names_the_field() -> None:
    with pytest.raises(InputError, match="attention_bias"):
        load_workload(SHAPE + ",attention_bias=maybe")
    result = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "--workload",
                             SHAPE + ",attention_bias=2", "--cluster", "dgx-a100-80g:1"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "attention_bias" in result.stderr and "Traceback" not in result.stderr
