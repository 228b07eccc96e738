"""One step of a plan laid out in time, per worker or pipeline stage, from the model's records.

Nothing here is measured or priced: the segments are the model's own quantities
(`Prediction.parts`, the per-layer `LayerCost`s, and for pipelines the per-stage micro-batch
times of `Prediction.step_record`, model/records.py), placed in the order the model adds
them. A one-stage CPU plan (Project Adam's P × R × S) is drawn layer by layer: the forward pass
with its partition traffic, the backward pass in reverse, then the parameter-server or
all-reduce parts. A GPU plan is drawn per pipeline stage as the schedule's micro-batches
(pipeline_schedule.py), then the data-parallel communication and the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.model.prediction import Prediction
from dnnscale.model.records import Part, PartKind, StepRecord
from dnnscale.report.explain import activities, stage_label
from dnnscale.report.pipeline_schedule import (FORWARD, interleaving_applies, simulate)
from dnnscale.system.system import System
from dnnscale.workload.workload import Workload

MAX_DRAWN_PASSES = 4096
"""Forward and backward passes a pipeline timeline draws at most: a step of more micro-batches
(a global batch of millions) is drawn for its first ones, which show the warm-up and the steady
state, and the note says how many the model prices."""

LANE_CHUNKS = 4
"""Chunks a lane label lists at most (an interleaved stage of more: the first, …, the last)."""

AFTER_STEP = (Part.PS_WAIT, Part.UPDATE)
"""Parts the model places after the overlapped part of a step (γ-norm plans)."""


@dataclass(frozen=True)
class Segment:
    """`seconds` of activity `name` (a step part's name) on lane `lane` from `start_s`;
    `pieces` divide it by part name when it holds several (a micro-batch's pass)."""

    lane: int
    start_s: float
    seconds: float
    name: str
    label: str
    pieces: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Timeline:
    """Lanes (workers or stages), their segments, the model's step time, marks and notes."""

    lanes: tuple[str, ...]
    segments: tuple[Segment, ...]
    step_s: float
    end_s: float
    marks: tuple[tuple[float, str], ...] = ()
    notes: tuple[str, ...] = ()


def _ms(seconds: float) -> str:
    from dnnscale.units import format_seconds

    return format_seconds(seconds)


def step_timeline(prediction: Prediction, workload: Workload | None = None,
                  system: System | None = None) -> Timeline:
    """The timeline of one step of `prediction`, from its records alone (`workload` and
    `system`, what it was made for, are not read: nothing is priced here)."""
    record = prediction.step_record
    if record is not None and record.by_stage:
        return _pipeline_timeline(prediction, record)
    return _layer_timeline(prediction)


def _sequential(prediction: Prediction) -> bool:
    """Whether the activities add up to the step (no γ-norm overlap)."""
    total = sum(part.seconds for part in activities(prediction))
    return abs(total - prediction.step_time_s) <= 1e-9 * max(1.0, prediction.step_time_s)


def _layer_timeline(prediction: Prediction) -> Timeline:
    """One worker (the most loaded of a replica), layer by layer, then the aggregation."""
    segments: list[Segment] = []
    t = 0.0

    def add(lane: int, seconds: float, name: str, label: str) -> None:
        nonlocal t
        if seconds > 0:
            segments.append(Segment(lane, t, seconds, name, f"{label}: {_ms(seconds)}"))
            t += seconds

    for layer in prediction.layers:
        add(0, layer.forward_s, Part.FORWARD, f"{layer.name} forward")
        add(0, layer.comm_forward_s, Part.PARTITION_COMM, f"{layer.name} partition traffic "
            "(forward)")
    for layer in reversed(prediction.layers):
        add(0, layer.comm_s - layer.comm_forward_s, Part.PARTITION_COMM,
            f"{layer.name} partition traffic (backward)")
        add(0, layer.input_grad_s, Part.INPUT_GRAD, f"{layer.name} input gradient")
        add(0, layer.weight_grad_s, Part.WEIGHT_GRAD, f"{layer.name} weight gradient")
    compute_end = t
    rest = [part for part in activities(prediction)
            if part.kind != PartKind.COMPUTE and part.name != Part.PARTITION_COMM]
    lanes = ("worker (the most loaded of its replica's)",)
    notes = ["Every replica's workers run alike; the model prices the most loaded one. The "
             "segments are the model's per-layer costs and step parts in the order it adds "
             "them, not a trace."]
    marks: tuple[tuple[float, str], ...] = ()
    if _sequential(prediction):
        for part in rest:
            add(0, part.seconds, part.name, part.name.replace("_", " "))
    else:
        lanes += ("worker network (overlapped)",)
        t = 0.0
        for part in rest:
            if part.name not in AFTER_STEP:
                add(1, part.seconds, part.name, part.name.replace("_", " "))
        after = [part for part in rest if part.name in AFTER_STEP]
        t = prediction.step_time_s - sum(part.seconds for part in after)
        for part in after:
            add(0, part.seconds, part.name, part.name.replace("_", " "))
        notes.append("The plan overlaps communication with computation: the model combines the "
                     "two with the cluster's γ-norm, so the lanes run side by side.")
        marks = ((compute_end, "compute ends"),)
    return Timeline(lanes, tuple(segments), prediction.step_time_s,
                    max(prediction.step_time_s, t), marks, tuple(notes))


def _pipeline_timeline(prediction: Prediction, record: StepRecord) -> Timeline:
    """Per pipeline stage: the schedule's forward and backward passes, then dp and optimizer,
    from the prediction's stage records (model/records.py)."""
    stages = record.stages
    p, m = len(stages), record.micro_batches
    schedule = record.schedule if p > 1 else "1f1b"
    chunks = record.virtual_stages
    v = chunks if schedule == "interleaved" and interleaving_applies(p, m, chunks) else 1
    pieces_f: list[tuple[tuple[str, float], ...]] = []
    pieces_b: list[tuple[tuple[str, float], ...]] = []
    for stage in stages:
        tp_forward = stage.tp_forward_s
        ep_forward, cp_forward = stage.ep_forward_s, stage.cp_forward_s
        forward = stage.forward_s + tp_forward + ep_forward + cp_forward
        backward = (stage.input_grad_s + stage.weight_grad_s + stage.tp_comm_s - tp_forward
                    + stage.ep_comm_s - ep_forward + stage.cp_comm_s - cp_forward)
        redo = stage.recompute_s
        device = forward + backward + redo + stage.grad_accumulation_s
        launch = stage.launch_wait_s
        slowest = stage.slowest_device_s
        share = forward / device if device > 0 else 0.5
        pp = stage.p2p_s
        pieces_f.append(tuple((name, seconds / v) for name, seconds in (
            (Part.FORWARD, stage.forward_s), (Part.TP_COMM, tp_forward),
            (Part.EP_COMM, ep_forward), (Part.CP_COMM, cp_forward),
            (Part.SLOWEST_DEVICE, slowest * share),
            (Part.LAUNCH_WAIT, launch * share), (Part.PP_COMM, pp / 2)) if seconds > 0))
        pieces_b.append(tuple((name, seconds / v) for name, seconds in (
            (Part.RECOMPUTE, redo), (Part.INPUT_GRAD, stage.input_grad_s),
            (Part.WEIGHT_GRAD, stage.weight_grad_s),
            (Part.GRAD_ACCUMULATION, stage.grad_accumulation_s),
            (Part.TP_COMM, stage.tp_comm_s - tp_forward),
            (Part.EP_COMM, stage.ep_comm_s - ep_forward),
            (Part.CP_COMM, stage.cp_comm_s - cp_forward),
            (Part.SLOWEST_DEVICE, slowest * (1 - share)),
            (Part.LAUNCH_WAIT, launch * (1 - share)), (Part.PP_COMM, pp / 2)) if seconds > 0))
    forward_s = [sum(s for _, s in pieces) for pieces in pieces_f]
    backward_s = [sum(s for _, s in pieces) for pieces in pieces_b]
    drawn_m = _drawn_micro_batches(p, m, v)
    if v > 1 and not interleaving_applies(p, drawn_m, chunks):
        drawn_m = _drawn_micro_batches(p, m, 1)  # too many passes to interleave: plain 1F1B
        pieces_f = [tuple((name, sec * v) for name, sec in pieces) for pieces in pieces_f]
        pieces_b = [tuple((name, sec * v) for name, sec in pieces) for pieces in pieces_b]
        forward_s, backward_s = [t * v for t in forward_s], [t * v for t in backward_s]
        v = 1
    ops = simulate(schedule, p, drawn_m, v, forward_s, backward_s)
    segments = []
    for op in ops:
        forward = op.kind == FORWARD
        chunk = f", chunk {op.chunk + 1}" if v > 1 else ""
        pieces = (pieces_f if forward else pieces_b)[op.device]
        detail = ", ".join(f"{name.replace('_', ' ')} {_ms(seconds)}" for name, seconds in pieces)
        segments.append(Segment(
            op.device, op.start_s, op.seconds, "forward" if forward else "backward",
            f"stage {op.device + 1}, micro-batch {op.micro_batch + 1}{chunk}: "
            f"{'forward' if forward else 'backward'} {_ms(op.seconds)} ({detail})", pieces))
    drawn_end = max(op.end_s for op in ops)
    model_end = record.pipeline_s
    cut = drawn_m < m
    start = drawn_end if cut else max(drawn_end, model_end)
    for name in (Part.DP_COMM, Part.OPTIMIZER_STEP):
        seconds = prediction.part(name)
        if seconds > 0:
            for lane in range(p):
                segments.append(Segment(lane, start, seconds, name,
                                        f"{name.replace('_', ' ')}: {_ms(seconds)} (the slowest "
                                        "stage's, as the model counts it)"))
            start += seconds
    lanes = tuple(stage_label(stage.index, stage.layers, p, LANE_CHUNKS)
                  for stage in stages)
    schedule_name = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B"}[schedule]
    notes = [f"The model's {schedule_name} schedule of {m} micro-batch{'es' if m != 1 else ''} "
             f"over {p} stage{'s' if p != 1 else ''}{f' with {v} chunks each' if v > 1 else ''}, "
             "laid out from its per-stage micro-batch times; not a trace. Each stage's tensor- "
             "and data-parallel peers run alike (the model prices the most loaded one)."]
    if cut:
        notes.append(f"Drawn: the first {drawn_m:,} of the step's {m:,} micro-batches (the rest "
                     f"repeat the steady state); the model prices all of them: the pipeline "
                     f"takes {_ms(model_end)}.")
    if chunks > 1 and v == 1 and not cut:
        notes.append(f"Interleaving needs the micro-batch count to be a multiple of the stages "
                     f"({m} of {p}): drawn as plain 1F1B.")
    if not cut and abs(drawn_end - model_end) > 0.005 * model_end:
        notes.append(f"The model prices the pipeline with the closed formula "
                     f"m·t_max + (Σt − t_max)/v = {_ms(model_end)}; the drawn schedule of the "
                     f"same micro-batch times ends at {_ms(drawn_end)}.")
    if not _sequential(prediction):
        notes.append("The plan overlaps communication with computation (γ-norm): the parts "
                     "drawn end to end exceed the step.")
    marks = () if cut else ((model_end, "pipeline ends (model)"),)
    return Timeline(lanes, tuple(segments), prediction.step_time_s, start, marks, tuple(notes))


def _drawn_micro_batches(stages: int, micro_batches: int, chunks: int) -> int:
    """How many of the step's micro-batches the timeline draws: all of them when their passes
    fit in MAX_DRAWN_PASSES, else as many as fit (a multiple of the stages, as interleaving
    needs, when that leaves at least one round)."""
    fit = max(1, MAX_DRAWN_PASSES // (2 * stages * chunks))
    if micro_batches <= fit:
        return micro_batches
    return fit - fit % stages if fit >= stages else fit
