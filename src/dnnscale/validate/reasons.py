"""Why a prediction is off: its parts against the runtime's per-phase timings.

The runtime times each worker step in phases (compute, partition_comm, ps_push, ps_pull,
allreduce; runtime/records.py); the model's parts are finer (waits, the PS's apply, the
update). `PHASES` maps each measured phase to the parts that land in it: a worker waiting for
the PS (ps_serve_wait, ps_wait, a synchronous shard's apply) is inside its pull, and the
worker's own update (its passes over the parameters, model/bookkeeping.py) is inside compute,
which the runtime times as the rest of the step (runtime/worker.py). The phase whose measured
seconds differ most from the predicted is the row's reason.
"""

from __future__ import annotations

from typing import Any

from dnnscale.model.records import Part

REASON_THRESHOLD = 0.15
"""Rows whose relative error exceeds this get a per-phase reason (the validation protocol)."""

PHASES: dict[str, tuple[Part, ...]] = {
    "compute": (Part.COMPUTE, Part.UPDATE, Part.EXCHANGE_CPU),
    "partition_comm": (Part.PARTITION_COMM,),
    "ps_push": (Part.PS_PUSH,),
    "ps_pull": (Part.PS_PULL, Part.PS_APPLY, Part.PS_SERVE_WAIT, Part.PS_WAIT),
    "allreduce": (Part.ALLREDUCE,),
}
"""{runtime phase (runtime/records.py): the model's parts timed inside it}."""


def phase_gaps(predicted_s: dict[str, float], measured_s: dict[str, float]) -> dict[str, tuple[float, float]]:
    """{measured phase: (predicted seconds, measured seconds)} per worker step, for every phase
    either side has, plus 'other': the step time neither accounts for."""
    gaps = {}
    for phase, parts in PHASES.items():
        predicted = sum(predicted_s.get(part, 0.0) for part in parts)
        measured = measured_s.get(phase, 0.0)
        if predicted or measured:
            gaps[phase] = (predicted, measured)
    step_p, step_m = predicted_s.get(Part.STEP, 0.0), measured_s.get("step", 0.0)
    gaps["other"] = (max(0.0, step_p - sum(p for p, _ in gaps.values())),
                     max(0.0, step_m - sum(m for _, m in gaps.values())))
    return gaps


def phase_reason(row: dict[str, Any]) -> str:
    """One line: the phase that separates prediction from measurement most, with both sides
    (seconds per worker step), e.g. 'ps_pull: predicted 0.026 s, measured 0.096 s (+0.070 s)'."""
    gaps = phase_gaps(row["predicted_breakdown_s"], row["measured"].get("per_phase_s", {}))
    phase, (predicted, measured) = max(gaps.items(), key=lambda item: abs(item[1][1] - item[1][0]))
    text = (f"{phase}: predicted {predicted:.3f} s, measured {measured:.3f} s "
            f"({measured - predicted:+.3f} s per step)")
    step_p = row["predicted_breakdown_s"].get(Part.STEP, 0.0)
    step_m = row["measured"].get("per_phase_s", {}).get("step", 0.0)
    if step_p and step_m:
        text += f"; step predicted {step_p:.3f} s, measured {step_m:.3f} s"
    return text
