"""FP8 plans gather the FP8 linear layers' operands in FP8 (issue 23): Transformer Engine
and torchao cast before the sequence-parallel all-gathers, so those carry 1 byte a value; the
reduce-scatters carry the GEMMs' 16-bit outputs and gradients. Payloads by hand."""

from __future__ import annotations

import pytest

from dnnscale.model.megatron_rules import FP8_GATHER_BYTES_PER_VALUE, megatron_shard
from dnnscale.model.predict import predict_plan
from dnnscale.model.sharding import SplitContext
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from dnnscale.workload.transformer import transformer_workload

GPT = "gpt:layers=2,hidden=512,heads=8,seq=128,vocab=1000"


def _block(workload) -> dict:  # noqa: ANN001
    return {layer.kind: layer for layer in workload.layers if layer.hyper.get("block") == 0}


def _payloads(layer, fp8: bool) -> dict:  # noqa: ANN001
    context = SplitContext("tensor", True, 2, 2.0, True, 1.0, fp8)
    return {(e.operation, e.phase): e.payload_bytes
            for e in megatron_shard(layer, 4, context, True).events}


def test_fp8_gathers_carry_one_byte_a_value() -> None:
    """h = 512, s = 128, micro-batch 2: b·s·h = 131,072 values. Under FP8 the QKV projection's
    forward all-gather and the output projection's backward all-gather carry 131,072 B, their
    reduce-scatters 262,144 B (2 bytes); in bf16 every exchange carries 262,144 B."""
    assert FP8_GATHER_BYTES_PER_VALUE == 1
    block = _block(load_workload(GPT))
    qkv, out = _payloads(block["attn_qkv"], True), _payloads(block["attn_out"], True)
    assert qkv == {("allgather", "forward"): 131072, ("reduce_scatter", "backward"): 262144}
    assert out == {("reduce_scatter", "forward"): 262144, ("allgather", "backward"): 131072}
    assert set(_payloads(block["attn_qkv"], False).values()) == {262144}
    assert set(_payloads(block["mlp_down"], False).values()) == {262144}


def test_routed_experts_and_norms_keep_their_width() -> None:
    """The routed experts' gathers are the token dispatcher's, of the bf16 hidden states:
    top_k · b·s·h · 2 bytes = 2 · 2 · 128 · 512 · 2 = 524,288 B either way."""
    w = transformer_workload("moe", 2, 512, 8, 128, 1000, flash_attention=True, experts=4,
                             top_k=2)
    expert = _block(w)["expert_up"]
    assert _payloads(expert, True) == _payloads(expert, False)
    assert _payloads(expert, True)[("allgather", "forward")] == 524288


def test_fp8_plan_pays_less_tensor_parallel_time_than_bf16_exchanges_would() -> None:
    """Through predict: an FP8 plan's QKV projection moves (131,072 + 262,144) B of payload
    where a bf16 plan's moves 2 x 262,144 B; a ring all-gather and reduce-scatter move the
    same (n − 1)/n of their payload, so the bytes sent are 0.75 of bf16's, and the seconds
    fewer."""
    w, system = load_workload(GPT), load_system("dgx-h100:1")
    fields = dict(tp=4, micro_batch=2, global_batch=2, sequence_parallel=True)
    fp8 = predict_plan(w, system, modern_plan_from_dict({**fields, "precision": "fp8"}))
    bf16 = predict_plan(w, system, modern_plan_from_dict({**fields, "precision": "bf16"}))
    qkv8 = next(c for c in fp8.layers if c.kind == "attn_qkv")
    qkv16 = next(c for c in bf16.layers if c.kind == "attn_qkv")
    assert qkv8.comm_bytes == pytest.approx(0.75 * qkv16.comm_bytes, rel=1e-12)
    assert 0 < qkv8.comm_s < qkv16.comm_s
