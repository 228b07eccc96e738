"""Training metrics that recompute the loss every micro-batch (TransformerShape.metrics): the
bytes of llm-foundry's two Composer train metrics, by hand, and where they show."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dnnscale
from dnnscale.model.gpu_compute import memory_pass_s
from dnnscale.system import load_system
from dnnscale.workload import load_workload

SHAPE = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100"


def _loss(spec: str):  # type: ignore[no-untyped-def]
    (layer,) = [layer for layer in load_workload(spec).layers if layer.kind == "cross_entropy"]
    return layer


def test_each_metric_casts_and_log_softmaxes_every_logit_by_hand() -> None:
    s, V, b = 16, 100, 2
    plain, two = _loss(SHAPE), _loss(SHAPE + ",metrics=2")
    # the loss itself, Megatron's in-place kernel by default: the cast (2 + 4 bytes a logit),
    # the max (4), the in-place subtraction, exp and division (8 each), the sum (4); the targets
    assert plain.fwd_bytes == s * V * (b + 4 + 4 + 8 + 8 + 4 + 8) + s * 8 == 60_928
    # each metric under autocast: the bf16 logits cast to a float32 copy (2 + 4 bytes a logit),
    # its log-softmax in float32 (4 + 4), the targets (8 a row); forward only
    assert two.fwd_bytes - plain.fwd_bytes == 2 * (s * V * (2 + 4 + 4 + 4) + s * 8) == 45_056
    assert two.input_grad_bytes == plain.input_grad_bytes
    assert two.weight_grad_bytes == plain.weight_grad_bytes == 0
    assert two.hyper["metrics"] == 2 and "metrics" not in plain.hyper
    assert two.fwd_flops == plain.fwd_flops == 0


def test_llm_foundrys_metrics_cost_their_bytes_in_the_step() -> None:
    """MPT-125m's two metrics on one A100-40GB micro-batch of 26 x 2048 tokens: 2 x 2048 x 26 x
    50,368 logits x 14 bytes (+ the targets) through HBM, once per micro-batch."""
    mpt = ("gpt:layers=12,hidden=768,heads=12,seq=2048,vocab=50368,positional=none,"
           "flash=true,attention_kernel=triton,tied=true,bias=false")
    plan = {"dp": 8, "zero": 3, "micro_batch": 26, "global_batch": 26 * 8 * 3,
            "precision": "bf16", "grad_bytes": 2, "overlap_dp": True, "grad_accumulation": "add",
            "loss": "fused"}
    without = dnnscale.predict(mpt, "dgx-a100-40g:1", plan)
    metered = dnnscale.predict(mpt + ",metrics=2", "dgx-a100-40g:1", plan)
    device = load_system("dgx-a100-40g:1").machine
    tokens = 26 * 2048
    loss = 26 * (2048 * 50368 * 2 + 2048 * 8)       # the fused loss's forward: a logit read
    metrics = 26 * 2 * (2048 * 50368 * 14 + 2048 * 8)    # and of the two metrics beside it
    # one memory-bound kernel per micro-batch moves both (at HBM's efficiency for its size)
    per_micro_batch = memory_pass_s(device, loss + metrics) - memory_pass_s(device, loss)
    assert tokens == 53_248
    # three micro-batches a step; the loss's forward kernel grows by the metrics' bytes
    assert metered.breakdown_s["forward"] - without.breakdown_s["forward"] == pytest.approx(
        3 * per_micro_batch, rel=1e-9)
    assert metered.step_time_s > without.step_time_s


@pytest.mark.parametrize("value", ["-1", "x", "1.5", "true"])
def test_a_bad_count_is_one_line_and_exit_2(value: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "-w",
                           f"{SHAPE},metrics={value}", "-c", "dgx-a100-80g:1", "--dp", "1",
                           "--micro-batch", "1", "--global-batch", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "workload.gpt.metrics" in done.stderr and "Traceback" not in done.stderr
