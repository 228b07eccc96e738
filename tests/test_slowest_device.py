"""A synchronous step waits for its slowest device (model/stragglers.slowest_device_factor,
the `slowest_device` part), checked by hand."""

from __future__ import annotations

import math

import pytest

import dnnscale
from dnnscale.model.stragglers import slowest_device_factor, top_normal_score
from dnnscale.system.gpu import GPU_SPEED_SPREAD, gpu_system

SPEC = "gpt:layers=4,hidden=1024,heads=16,seq=1024,vocab=32000"


def test_the_spread_is_the_published_variation_over_a_normal_whisker_span() -> None:
    # Sinha et al. SC'22: 8 % = 4 IQR / median; 4 IQR = 4 x 1.349 sigma = 5.396 sigma
    assert GPU_SPEED_SPREAD == pytest.approx(0.014826, rel=1e-4)
    assert gpu_system("dgx-a100-80g", 1).machine.speed_spread == GPU_SPEED_SPREAD


def test_the_factor_by_hand() -> None:
    assert slowest_device_factor(1, 0.0148) == 1.0
    assert slowest_device_factor(512, 0.0) == 1.0
    assert top_normal_score(1) == 0.0
    # Blom: Phi^-1((64 - 0.375) / 64.25) = Phi^-1(0.990272) = 2.3367; e^(0.014826 x 2.3367)
    assert top_normal_score(64) == pytest.approx(2.3367, abs=1e-4)
    assert slowest_device_factor(64, GPU_SPEED_SPREAD) == pytest.approx(1.03525, abs=1e-5)
    # 8 devices: Phi^-1(7.625 / 8.25 = 0.924242) = 1.4342 -> 1.02149
    assert slowest_device_factor(8, GPU_SPEED_SPREAD) == pytest.approx(1.02149, abs=1e-5)
    # more devices wait longer
    factors = [slowest_device_factor(n, GPU_SPEED_SPREAD) for n in (2, 8, 64, 512, 16384)]
    assert factors == sorted(factors) and len(set(factors)) == len(factors)


def test_a_gpu_step_pays_its_slowest_device_on_compute_and_recompute() -> None:
    plan = {"tp": 2, "pp": 2, "dp": 16, "micro_batch": 1, "global_batch": 64,
            "recompute": "full", "precision": "bf16"}
    p = dnnscale.predict(SPEC, "dgx-a100-80g:8", plan)
    parts = p.breakdown_s
    g = math.exp(GPU_SPEED_SPREAD * top_normal_score(64))
    # the slowest stage's compute and recompute, (g - 1) more; the step holds it
    assert parts["slowest_device"] == pytest.approx(
        (g - 1) * (parts["compute"] + parts["recompute"]), rel=1e-9)
    assert parts["slowest_device"] > 0
    one = dnnscale.predict(SPEC, "dgx-a100-80g:1", {**plan, "dp": 1, "global_batch": 4})
    assert one.breakdown_s["slowest_device"] == pytest.approx(
        (slowest_device_factor(4, GPU_SPEED_SPREAD) - 1)
        * (one.breakdown_s["compute"] + one.breakdown_s["recompute"]), rel=1e-9)
    single = dnnscale.predict(SPEC, "dgx-a100-80g:1", {
        "tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 1, "precision": "bf16"})
    assert single.breakdown_s["slowest_device"] == 0.0
