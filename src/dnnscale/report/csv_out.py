"""Ranked plans as CSV (`optimize --csv FILE`): one row per plan, SI units, the plan's shape
read from the typed plan so Adam's configurations and GPU plans share the columns; the GPU
plans' own columns (GPU_COLUMNS) are empty for Adam's configurations (docs/formats.md)."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

from dnnscale.model.prediction import Prediction
from dnnscale.plan.plan import ParameterServer

COLUMNS = ("rank", "plan", "machines", "tensor", "pipeline", "replicas", "ps_shards",
           "aggregation", "micro_batch", "accumulation", "push_every", "pull_every",
           "step_time_s", "epoch_time_s", "throughput_samples_per_s", "vs_best", "bottleneck",
           "fits", "memory_per_device_bytes", "memory_capacity_bytes")
GPU_COLUMNS = ("schedule", "virtual_stages", "zero_stage", "recompute", "sequence_parallel",
               "overlap_dp", "precision", "mfu", "tokens_per_s", "expert", "expert_tensor",
               "context", "cp_algorithm", "zero3_fetch", "overlap_tp", "overlap_pp",
               "grad_bytes", "grad_accumulation", "loss", "amp", "overlap_tp_method",
               "pp_scatter_gather")
"""A GPU plan's columns after COLUMNS: empty for Adam's configurations (tensor, pipeline and
replicas are the plan's tp, pp and dp; micro_batch and accumulation its batch). New columns
are appended, so a reader by position keeps working. expert_tensor is the routed experts'
tensor split (etp, tp unless set); zero3_fetch and cp_algorithm are written whatever the ZeRO
stage or cp degree (they price nothing below ZeRO-3 or at cp 1); overlap_pp is whether the
pipeline's sends overlap compute (the schedule's default where the plan leaves it unset);
grad_bytes is the bytes per value the gradients are stored and reduced in; grad_accumulation
how the micro-batches' gradients accumulate (fused, add or clip_add); loss the loss kernel;
amp how a 16-bit plan's memory-bound kernels run (half, autocast or tf-amp); overlap_tp_method
how an overlap of the tensor-parallel exchanges runs (userbuffers or micro_pipeline, written
whether or not the plan overlaps them); pp_scatter_gather whether each tensor member sends
1/tp of a pipeline stage's boundary tensor (Pipeline.scatter_gather)."""


def aggregation_name(prediction: Prediction) -> str:
    """'ps-async', 'ps-sync', 'allreduce' or 'zero1'..'zero3'."""
    aggregation = prediction.plan.data.aggregation
    if isinstance(aggregation, ParameterServer):
        return "ps-async" if aggregation.asynchronous else "ps-sync"
    return f"zero{aggregation.zero_stage}" if aggregation.zero_stage else "allreduce"


def ranked_csv(predictions: Sequence[Prediction]) -> str:
    """The CSV text, best first (rank 1); vs_best = epoch time / the first plan's."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS + GPU_COLUMNS)
    best = predictions[0].epoch_time_s if predictions else 1.0
    for rank, p in enumerate(predictions, start=1):
        plan = p.plan
        aggregation = plan.data.aggregation
        ps = isinstance(aggregation, ParameterServer)
        writer.writerow([rank, p.label(), plan.machines, plan.tensor.degree, plan.pipeline.stages,
                         plan.data.replicas, plan.ps_shards, aggregation_name(p),
                         plan.batch.micro_batch, plan.batch.accumulation,
                         aggregation.push_every if ps else "", aggregation.pull_every if ps else "",
                         repr(p.step_time_s), repr(p.epoch_time_s),
                         repr(p.throughput_samples_per_s), f"{p.epoch_time_s / best:.6g}",
                         p.bottleneck, p.fits, repr(p.memory_of("worker")),
                         repr(p.memory_capacity_bytes.get("worker", math.inf)),
                         *_gpu_cells(p)])
    return out.getvalue()


def _gpu_cells(p: Prediction) -> list[object]:
    """The GPU_COLUMNS of a GPU plan's prediction; empty cells for Adam's configurations."""
    plan = p.plan
    aggregation = plan.data.aggregation
    if p.config is not None or isinstance(aggregation, ParameterServer):
        return [""] * len(GPU_COLUMNS)
    return [plan.pipeline.schedule, plan.pipeline.virtual_stages, aggregation.zero_stage,
            plan.memory.recompute, plan.tensor.sequence_parallel, aggregation.overlap,
            plan.precision.compute, "" if p.mfu is None else repr(p.mfu),
            "" if p.tokens_per_s is None else repr(p.tokens_per_s), plan.expert.degree,
            plan.expert_tensor, plan.context.degree, plan.context.algorithm, aggregation.fetch,
            plan.tensor.overlap, plan.pipeline.overlaps_p2p,
            "" if plan.precision.grad_bytes is None else plan.precision.grad_bytes,
            plan.batch.grad_accumulation, plan.memory.loss, plan.precision.amp,
            plan.tensor.overlap_method, plan.pipeline.scatter_gather]


def write_ranked_csv(predictions: Sequence[Prediction], path: str, field: str = "--csv") -> None:
    """Write to `path` atomically, or to stdout for '-'."""
    text = ranked_csv(predictions)
    if path == "-":
        import sys

        sys.stdout.write(text)
        return
    from dnnscale.atomic import atomic_write_text

    atomic_write_text(path, text, field)
