"""Ranked plans as CSV (`optimize --csv FILE`): one row per plan, SI units, the plan's shape
read from the typed plan so Adam's configurations and GPU plans share the columns."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from dnnscale.model.prediction import Prediction
from dnnscale.plan.plan import ParameterServer

COLUMNS = ("rank", "plan", "machines", "tensor", "pipeline", "replicas", "ps_shards",
           "aggregation", "micro_batch", "accumulation", "push_every", "pull_every",
           "step_time_s", "epoch_time_s", "throughput_samples_per_s", "vs_best", "bottleneck",
           "fits")


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
    writer.writerow(COLUMNS)
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
                         p.bottleneck, p.fits])
    return out.getvalue()


def write_ranked_csv(predictions: Sequence[Prediction], path: str, field: str = "--csv") -> None:
    """Write to `path` atomically, or to stdout for '-'."""
    text = ranked_csv(predictions)
    if path == "-":
        import sys

        sys.stdout.write(text)
        return
    from dnnscale.atomic import atomic_write_text

    atomic_write_text(path, text, field)
