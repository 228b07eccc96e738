"""Separate projections (TransformerShape.separate_projections): Q, K and V as three GEMMs and a
gated MLP's gate and up as two, each at the efficiency of its own size, reading the whole input,
and their input gradients summed by one more kernel (model/gpu_compute.projection_shares,
input_gradient_sum_s). By hand on a small grouped-query model."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dnnscale
from dnnscale.model.gpu_compute import efficiency, kernel_time_s, memory_pass_s
from dnnscale.system import load_system
from dnnscale.workload import load_workload

# 4 heads of 64, 2 key/value heads: h = 256, h_kv = 128; gated MLP f = 768
SHAPE = "gpt:layers=2,hidden=256,heads=4,kv_heads=2,ffn=768,seq=128,vocab=1000,gated=true"
SEPARATE = SHAPE + ",separate_projections=true"
PLAN = {"micro_batch": 8, "global_batch": 8, "precision": "bf16"}
SYSTEM = "dgx-a100-80g:1"


def _layers(spec: str) -> dict:
    return {layer.kind: layer for layer in load_workload(spec).layers
            if layer.hyper.get("block") == 0}


def _cost(spec: str, name: str, plan: dict[str, object] = PLAN):  # type: ignore[no-untyped-def]
    (cost,) = [c for c in dnnscale.predict(spec, SYSTEM, plan).layers if c.name == name]
    return cost


def test_the_workload_names_each_projection_and_counts_the_same() -> None:
    fused, separate = _layers(SHAPE), _layers(SEPARATE)
    assert separate["attn_qkv"].hyper["projections"] == [256, 128, 128]
    assert separate["mlp_up"].hyper["projections"] == [768, 768]
    assert "projections" not in fused["attn_qkv"].hyper
    for kind in ("attn_qkv", "mlp_up"):
        assert separate[kind].params == fused[kind].params
        assert separate[kind].fwd_flops == fused[kind].fwd_flops
    # a GeLU MLP's first linear is one projection either way
    plain = _layers("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1000,"
                    "separate_projections=true")
    assert "projections" not in plain["mlp_up"].hyper
    assert load_workload(SEPARATE).transformer.separate_projections is True  # type: ignore[union-attr]


def test_three_gemms_each_at_its_own_size_by_hand() -> None:
    """8 x 128 = 1,024 tokens. Q: 2·1024·256·256 = 134,217,728 FLOP, reading 1,024 x 256 and
    writing 1,024 x 256 values, 1,048,576 bytes; K and V: 67,108,864 FLOP and 786,432 bytes."""
    device = load_system(SYSTEM).machine
    peak, bandwidth = device.peak_flops_per_s["bf16"], device.memory_bandwidth_bytes_per_s
    curve = device.memory_efficiency

    def gemm_s(flops: float, moved: float) -> float:
        return kernel_time_s(flops, moved, peak, efficiency(device, "gemm", flops, "bf16"),
                             bandwidth, curve.at(moved) if curve else 1.0)

    assert 2 * 1024 * 256 * 256 == 134_217_728 and (1024 * 256 + 1024 * 256) * 2 == 1_048_576
    assert 2 * 1024 * 256 * 128 == 67_108_864 and (1024 * 256 + 1024 * 128) * 2 == 786_432
    expected = gemm_s(134_217_728, 1_048_576) + 2 * gemm_s(67_108_864, 786_432)
    separate = _cost(SEPARATE, "block0.attn_qkv")
    fused = _cost(SHAPE, "block0.attn_qkv")
    assert separate.forward_s == pytest.approx(expected, rel=1e-9)
    assert fused.forward_s == pytest.approx(gemm_s(268_435_456, 1_572_864), rel=1e-9)
    assert separate.forward_s > fused.forward_s  # smaller GEMMs run further from the peak
    # the input gradient: the same three GEMMs, then one kernel reading the three input
    # gradients and writing their sum, (3 + 1) x 1,024 x 256 x 2 = 2,097,152 bytes
    assert separate.input_grad_s - separate.forward_s == pytest.approx(
        memory_pass_s(device, 2_097_152), rel=1e-9)
    # launches: 3 GEMMs forward; backward 3 + 3 GEMMs, 3 bias reductions and the sum
    assert (separate.forward_launches, separate.backward_launches) == (3, 10)
    assert (fused.forward_launches, fused.backward_launches) == (1, 3)


def test_a_column_split_sums_the_whole_input_gradient() -> None:
    """At tp 2 each member runs half of each projection, but its input (and the sum of the input
    gradients, before the all-reduce) is whole: 2,097,152 bytes again."""
    device = load_system(SYSTEM).machine
    split = _cost(SEPARATE, "block0.attn_qkv", {**PLAN, "tp": 2})
    assert split.input_grad_s - split.forward_s == pytest.approx(
        memory_pass_s(device, 2_097_152), rel=1e-9)


def test_gate_and_up_are_two_gemms() -> None:
    device = load_system(SYSTEM).machine
    up = _cost(SEPARATE, "block0.mlp_up")
    # the sum of the two input gradients: (2 + 1) x 1,024 x 256 x 2 bytes
    assert up.input_grad_s - up.forward_s == pytest.approx(
        memory_pass_s(device, 3 * 1024 * 256 * 2), rel=1e-9)
    assert up.forward_launches == 2


def test_the_step_costs_more_and_a_bad_value_exits_2() -> None:
    fused = dnnscale.predict(SHAPE, SYSTEM, PLAN)
    separate = dnnscale.predict(SEPARATE, SYSTEM, PLAN)
    assert separate.step_time_s > fused.step_time_s
    result = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "--workload",
                             SHAPE + ",separate_projections=sometimes", "--cluster", SYSTEM],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "separate_projections" in result.stderr and "Traceback" not in result.stderr


def test_exports_say_the_projections_were_priced_separate() -> None:
    from dnnscale.export.assumptions import SEPARATE_PROJECTIONS_TEXT, plan_assumptions
    from dnnscale.plan.modern import modern_plan_from_dict

    plan = modern_plan_from_dict({"micro_batch": 8, "global_batch": 8})
    assert SEPARATE_PROJECTIONS_TEXT in plan_assumptions(
        plan, load_workload(SEPARATE).transformer)
    assert SEPARATE_PROJECTIONS_TEXT not in plan_assumptions(
        plan, load_workload(SHAPE).transformer)
