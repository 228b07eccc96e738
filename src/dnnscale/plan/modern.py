"""Megatron-style plans from flags or YAML: tensor × pipeline × data parallelism, micro-batches,
schedule, ZeRO, recomputation and precision — the fields `--tp --pp --dp --micro-batch
--global-batch --schedule --virtual-stages --zero --recompute --precision` set.

Plan YAML (and `optimize --json`'s plans, `export`'s input) use these names::

    tp: 8               # tensor-parallel degree (Megatron column/row split)
    pp: 8               # pipeline stages
    dp: 8               # data-parallel replicas
    micro_batch: 1      # samples (sequences) per micro-batch
    global_batch: 1536  # samples per step: dp × micro_batch × micro-batches
    schedule: 1f1b      # gpipe | 1f1b | interleaved
    virtual_stages: 1   # chunks per device with the interleaved schedule
    zero: 0             # ZeRO stage 0-3 (3 = FSDP)
    recompute: full     # none | selective | full
    precision: bf16     # fp32 | tf32 | bf16 | fp16 | fp8
    sequence_parallel: false
    overlap_dp: false   # data-parallel gradients overlap the backward pass in buckets
    grad_bytes: 2       # bytes per gradient value all-reduced (default: the precision's)
"""

from __future__ import annotations

from typing import Any

from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.plan.plan import (RECOMPUTE, SCHEDULES, Batch, Collective, DataParallel,
                                MemoryPolicy, ParallelPlan, Pipeline, Precision, TensorSplit)
from dnnscale.plan.rules import (batch_divides, interleaved_micro_batches, require,
                                 schedule_virtual_stages, zero_with_pipeline)

PRECISION_PRESETS = {
    "fp32": Precision("fp32", 4, 4, 4, 4, False),
    "tf32": Precision("tf32", 4, 4, 4, 4, False),
    "bf16": Precision("bf16", 2, 2, 4, 2, True),
    "fp16": Precision("fp16", 2, 2, 4, 2, True),
    "fp8": Precision("fp8", 2, 2, 4, 2, True),
}
"""Bytes per value of (parameters, gradients, optimizer-state values, activations) and the fp32
master copy, per precision: mixed precision keeps 16-bit weights, gradients and activations
with fp32 Adam state and master weights (Micikevicius et al. 2018; Rajbhandari et al. SC'20:
2 + 2 + 12 bytes per parameter); fp8 computes the GEMMs in fp8 and keeps bf16 weights
(Transformer Engine)."""

MODERN_FIELDS = ("tp", "pp", "dp", "micro_batch", "global_batch", "schedule", "virtual_stages",
                 "zero", "recompute", "precision", "sequence_parallel", "overlap_dp",
                 "grad_bytes")
MAX_DEGREE = 1 << 20


def is_modern(data: dict[str, Any]) -> bool:
    """Whether a plan mapping uses the Megatron-style fields (rather than Adam's)."""
    return any(key in data for key in ("tp", "pp", "dp", "micro_batch", "global_batch",
                                       "schedule", "zero", "recompute", "precision"))


def _choice(data: dict[str, Any], key: str, allowed: tuple[str, ...], default: str,
            where: str) -> str:
    value = data.get(key, default)
    if value not in allowed:
        raise InputError(f"{where}.{key}", f"must be one of {', '.join(allowed)}, got "
                         f"{short_repr(value)}")
    return str(value)


def _flag(data: dict[str, Any], key: str, where: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"{where}.{key}", f"must be true or false, got {short_repr(value)}")
    return value


def modern_plan_from_dict(data: dict[str, Any], where: str = "plan") -> ParallelPlan:
    """Validate a mapping of MODERN_FIELDS into a ParallelPlan (Megatron rules, Adam optimizer);
    the rules that need no workload are plan/rules.py's, the ones `predict` and the search use.

    global_batch defaults to dp × micro_batch (one micro-batch per step); it must be a multiple
    of dp × micro_batch.
    """
    unknown = sorted(set(data) - set(MODERN_FIELDS))
    if unknown:
        raise InputError(f"{where}.{unknown[0]}", f"unknown field (known: "
                         f"{', '.join(MODERN_FIELDS)})")
    values = {k: v for k, v in data.items() if v is not None}
    tp = require_int(f"{where}.tp", values.get("tp", 1), maximum=MAX_DEGREE)
    pp = require_int(f"{where}.pp", values.get("pp", 1), maximum=MAX_DEGREE)
    dp = require_int(f"{where}.dp", values.get("dp", 1), maximum=MAX_DEGREE)
    micro = require_int(f"{where}.micro_batch", values.get("micro_batch", 1))
    global_batch = require_int(f"{where}.global_batch", values.get("global_batch", dp * micro))
    require(batch_divides(global_batch, dp, micro), where)
    micro_batches = global_batch // (dp * micro)
    schedule = _choice(values, "schedule", SCHEDULES, "1f1b", where)
    virtual = require_int(f"{where}.virtual_stages", values.get("virtual_stages", 1),
                          maximum=1024)
    require(schedule_virtual_stages(schedule, pp, virtual), where)
    require(interleaved_micro_batches(schedule, micro_batches, pp), where)
    zero = require_int(f"{where}.zero", values.get("zero", 0), minimum=0, maximum=3)
    require(zero_with_pipeline(zero, pp), where)
    recompute = _choice(values, "recompute", RECOMPUTE, "none", where)
    precision = PRECISION_PRESETS[_choice(values, "precision", tuple(PRECISION_PRESETS), "bf16",
                                          where)]
    if "grad_bytes" in values:
        grad = require_int(f"{where}.grad_bytes", values["grad_bytes"], maximum=8)
        if grad not in (1, 2, 4):
            raise InputError(f"{where}.grad_bytes", f"must be 1, 2 or 4, got {grad}")
        precision = Precision(precision.compute, precision.param_bytes, grad,
                              precision.optimizer_state_bytes, precision.activation_bytes,
                              precision.master_weights)
    return ParallelPlan(
        tensor=TensorSplit(tp, "megatron", _flag(values, "sequence_parallel", where)),
        pipeline=Pipeline(pp, schedule, virtual),
        data=DataParallel(dp, Collective("ring", zero, _flag(values, "overlap_dp", where))),
        batch=Batch(micro, micro_batches), memory=MemoryPolicy(recompute), precision=precision,
        optimizer="adam")


def modern_plan_to_dict(plan: ParallelPlan) -> dict[str, Any]:
    """The plan as MODERN_FIELDS (the inverse of modern_plan_from_dict)."""
    aggregation = plan.data.aggregation
    zero = aggregation.zero_stage if isinstance(aggregation, Collective) else 0
    overlap = aggregation.overlap if isinstance(aggregation, Collective) else False
    return {"tp": plan.tensor.degree, "pp": plan.pipeline.stages, "dp": plan.data.replicas,
            "micro_batch": plan.batch.micro_batch, "global_batch": plan.samples_per_step,
            "schedule": plan.pipeline.schedule, "virtual_stages": plan.pipeline.virtual_stages,
            "zero": zero, "recompute": plan.memory.recompute,
            "precision": plan.precision.compute,
            "sequence_parallel": plan.tensor.sequence_parallel, "overlap_dp": overlap,
            "grad_bytes": plan.precision.grad_bytes}


def plan_label(plan: ParallelPlan) -> str:
    d = modern_plan_to_dict(plan)
    extras = [f"zero{d['zero']}" if d["zero"] else "", d["recompute"] if d["recompute"] != "none"
              else "", "sp" if d["sequence_parallel"] else "",
              f"v{d['virtual_stages']}" if d["virtual_stages"] > 1 else ""]
    return (f"TP{d['tp']} PP{d['pp']} DP{d['dp']} mb{d['micro_batch']} GBS{d['global_batch']} "
            f"{d['schedule']} {d['precision']}" + "".join(f" {e}" for e in extras if e))
