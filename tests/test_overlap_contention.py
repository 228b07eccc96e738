"""Overlapped collectives slow the compute beside them (κ = 18.9 %, Lee et al. 2025,
system/gpu.GPU_OVERLAP_SLOWDOWN), and ZeRO-3 / FSDP's prefetch overlaps each unit's gathers
with the forward and the backward (model/data_parallel.overlapped_traffic_s): by hand."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dnnscale.model import predict_plan
from dnnscale.model.data_parallel import overlapped_traffic_s
from dnnscale.model.network import exposed_with_contention_s, overlap_contention_s
from dnnscale.model.predict import plan_stage_costs
from dnnscale.plan import ParallelPlan, modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.system.gpu import GPU_OVERLAP_SLOWDOWN
from dnnscale.workload import load_workload

KAPPA = 0.189


def _plan(**fields: object) -> ParallelPlan:
    return modern_plan_from_dict({"tp": 1, "micro_batch": 1, "precision": "bf16", **fields})


def test_the_slowdown_and_its_price_by_hand() -> None:
    assert GPU_OVERLAP_SLOWDOWN == KAPPA
    assert load_system("dgx-a100-80g:1").machine.overlap_slowdown == KAPPA
    # 1 s of communication hidden under compute that runs 18.9 % slower: in that second the
    # compute does 1 / 1.189 s of its work, so it ends 1 − 1/1.189 = 0.158957 s later
    assert overlap_contention_s(1.0, KAPPA) == pytest.approx(0.18900 / 1.18900, rel=1e-12)
    assert overlap_contention_s(1.0, KAPPA) == pytest.approx(0.158957, abs=1e-6)
    # 2 s of communication of which 0.5 s outlasts the compute: 0.5 + 1.5 · 0.158957
    assert exposed_with_contention_s(2.0, 0.5, KAPPA) == pytest.approx(0.738436, abs=1e-6)
    assert overlap_contention_s(1.0, 0.0) == 0.0 == overlap_contention_s(0.0, KAPPA)
    # CPU machines (the testbed) have no such slowdown
    assert load_system("adam-2014").machine.overlap_slowdown == 0.0


def test_overlapped_traffic_by_phase_by_hand() -> None:
    """ZeRO-3 over 4 micro-batches in 10 units: forward gathers 4 × 0.2 s beside a 0.5 s
    forward: each max(0.02, 0.2 − 0.5 · 0.9) = 0.02 exposed; backward gathers and
    reduce-scatters 4 × (0.2 + 0.4) beside a 0.5 s backward: each max(0.06, 0.6 − 0.45) = 0.15;
    an after-step all-gather of 0.3 s is all exposed."""
    pieces = [("forward", 4, 0.8), ("backward", 4, 0.8), ("backward", 4, 1.6),
              ("after_step", 1, 0.3)]
    exposed, hidden = overlapped_traffic_s(pieces, 0.5, 0.5, 10)
    assert exposed == pytest.approx(4 * 0.02 + 4 * 0.15 + 0.3, rel=1e-12)
    assert hidden == pytest.approx(0.8 + 2.4 + 0.3 - exposed, rel=1e-12)
    # one chunk hides nothing
    assert overlapped_traffic_s(pieces, 0.5, 0.5, 1) == pytest.approx((3.5, 0.0))


@given(st.lists(st.tuples(st.sampled_from(["forward", "backward", "after_step"]),
                          st.integers(1, 16), st.floats(0.0, 100.0)), max_size=6),
       st.floats(0.0, 50.0), st.floats(0.0, 50.0), st.integers(1, 200))
def test_overlap_hides_at_most_the_communication(pieces, forward_s, backward_s, chunks) -> None:
    exposed, hidden = overlapped_traffic_s(pieces, forward_s, backward_s, chunks)
    total = sum(seconds for _, _, seconds in pieces)
    assert exposed >= -1e-9 and hidden >= -1e-9
    assert exposed + hidden == pytest.approx(total, rel=1e-9, abs=1e-9)
    # the contention never makes overlapping dearer than not overlapping
    assert exposed_with_contention_s(total, exposed, KAPPA) <= total + 1e-9


def test_zero3_prefetch_overlaps_forward_and_backward_by_hand() -> None:
    """gpt3-1.3b over 16 GPUs in 2 DGX A100 nodes, ZeRO-3, one micro-batch of 8: the 25 units'
    forward gathers (G) travel beside the forward (F), their backward re-gathers and the
    reduce-scatters (G + R) beside the backward (B); per phase max(c/25, c − T·24/25)
    exposed (the first unit's gather, the last unit's reduce-scatter), and the compute beside
    the hidden rest pays κ/(1 + κ) of it."""
    workload, system = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:2")
    fields = dict(dp=16, zero=3, global_batch=128, micro_batch=8)
    serial = predict_plan(workload, system, _plan(**fields))
    overlapped = predict_plan(workload, system, _plan(**fields, overlap_dp=True))
    (stage,) = plan_stage_costs(workload, system, _plan(**fields, overlap_dp=True))
    total = serial.breakdown_s["dp_comm"]
    units, f, b = 25, stage.forward_s, stage.input_grad_s + stage.weight_grad_s
    assert stage.units == units
    # the gathers move bf16 weights (2Ψ each) and the reduce-scatter fp32 gradients (4Ψ):
    # about a quarter of the serial time beside the forward, three quarters beside the
    # backward; each pass is far longer (F = 0.33 s against 0.07 s in all), so each phase
    # shows one unit's share, c/25, and the split between them does not matter:
    # exposed = total / 25
    assert f * (units - 1) / units > total and b * (units - 1) / units > total
    exposed = total / units
    expected = exposed + (total - exposed) * KAPPA / (1 + KAPPA)
    assert overlapped.breakdown_s["dp_comm"] == pytest.approx(expected, rel=1e-6)
    assert overlapped.step_time_s < serial.step_time_s
