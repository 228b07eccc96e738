"""Rich tables for `describe` and `predict` (human units only here, at the boundary)."""

from __future__ import annotations

from rich.table import Table

from dnnscale.model.error_band import MIN_ROWS, MeasuredRegime, band_text
from dnnscale.model.prediction import Prediction
from dnnscale.model.records import PartKind
from dnnscale.report.explain import (breakdown_rows, human, memory_text, part_text,
                                     stage_label, utilization_text)
from dnnscale.units import format_seconds, format_si
from dnnscale.workload.workload import Workload


def _count(value: float) -> str:
    return format_si(value, "").strip() if value else "0"


def workload_table(workload: Workload) -> Table:
    """Per-layer shapes, parameters, FLOPs per phase and activations, per sample."""
    from dnnscale.units import format_si

    table = Table(title=f"{workload.name}: input {list(workload.input_shape)}, "
                  f"{workload.samples_per_epoch:,} samples per epoch", title_justify="left")
    for header in ("layer", "kind", "output", "params", "fwd FLOP", "in-grad FLOP",
                   "w-grad FLOP", "activation values", "activation bytes"):
        table.add_column(header, justify="left" if header in ("layer", "kind", "output") else "right")
    width = workload.bytes_per_value
    for layer in workload.layers:
        table.add_row(layer.name, layer.kind, "x".join(map(str, layer.output_shape)),
                      _count(layer.params), _count(layer.fwd_flops), _count(layer.input_grad_flops),
                      _count(layer.weight_grad_flops), _count(layer.kept_values),
                      format_si(layer.kept_values * width, "B"))
    table.add_section()
    table.add_row("total", "", "", _count(workload.params), _count(workload.fwd_flops),
                  _count(workload.input_grad_flops), _count(workload.weight_grad_flops),
                  _count(workload.activation_values),
                  format_si(workload.activation_values * width, "B"))
    table.caption = (f"{workload.fwd_macs:,.0f} forward multiply-adds (connections) per sample; "
                     f"per-sample counts, 1 multiply-add = 2 FLOP; activation values are what "
                     f"each layer keeps for the backward, its output (0 for a layer run in place "
                     f"over its input; the total adds the input), their bytes at {width} B per "
                     f"value")
    return table


VALUE_WIDTH = 64
"""The widest a summary table's value column gets: a long value (an error band's reason) wraps
inside it instead of widening the table past the terminal."""


def add_value_column(table: Table) -> None:
    """The right-aligned value column of a summary table (predict's, optimize's)."""
    table.add_column("value", justify="right", max_width=VALUE_WIDTH)


def prediction_table(prediction: Prediction, workload_name: str, cluster_name: str,
                     epoch: str | None = None) -> Table:
    """The predict table; `epoch` says what an epoch is (explain.epoch_text)."""
    title = f"{workload_name} on {cluster_name}: {prediction.label()}"
    table = Table(title=title, title_justify="left", show_header=False, min_width=len(title))
    table.add_column("what")
    add_value_column(table)
    table.add_row("throughput", f"{prediction.throughput_samples_per_s:,.1f} samples/s")
    if prediction.tokens_per_s is not None:
        table.add_row("tokens", f"{prediction.tokens_per_s:,.0f} tokens/s")
    if prediction.mfu is not None:
        table.add_row("MFU", f"{100 * prediction.mfu:.1f} %")
    table.add_row("time per step", format_seconds(prediction.step_time_s))
    table.add_row("time per epoch", format_seconds(prediction.epoch_time_s))
    if epoch:
        table.add_row("  an epoch is", epoch)
    table.add_row("bottleneck", prediction.bottleneck)
    table.add_row("error band", band_text(prediction.error_band))
    add_breakdown_rows(table, prediction)
    table.add_row("fits in memory", "yes" if prediction.fits else "[red]NO[/red]")
    return table


def add_breakdown_rows(table: Table, prediction: Prediction) -> None:
    """The sections every prediction table shares: seconds per activity (a sum's parts nested
    under it), utilisation, memory per device with its parts."""
    table.add_section()
    for row in breakdown_rows(prediction):
        if row.part.kind == PartKind.TOTAL:
            continue
        label = human(row.name) + (" (sum)" if row.part.kind == PartKind.SUM else "")
        table.add_row(f"{'    ' if row.depth else '  '}{label}", format_seconds(row.part.seconds))
    table.add_section()
    for name, value in prediction.utilization.items():
        table.add_row(f"  utilization {human(name)}", f"{100 * value:.1f} %")
    table.add_section()
    for role, heading in (("worker", "memory per worker"), ("ps", "memory per PS machine")):
        parts = [part for part in prediction.memory if part.role == role]
        if not parts:
            continue
        capacity = prediction.memory_capacity_bytes.get(role)
        of = f" of {format_si(capacity, 'B')}" if capacity else ""
        table.add_row(heading, f"{format_si(prediction.memory_of(role), 'B')}{of}")
        for part in parts:
            table.add_row(f"  {human(part.name)}", format_si(part.bytes, "B"))


def layer_table(prediction: Prediction) -> Table:
    """Per-layer costs (per micro-batch): split, work share, seconds per phase, split-caused
    communication; on the most loaded worker, or per pipeline stage (each stage's layers on its
    most loaded device, under the stage's name) when the step has stages with their layers."""
    record = prediction.step_record
    stages = record.stages if record is not None and record.by_stage else ()
    staged = len(stages) > 1 and all(stage.layers for stage in stages)
    title = ("Per layer, each pipeline stage's on its most loaded device (per micro-batch)"
             if staged else "Per layer, on the most loaded worker (per micro-batch)")
    table = Table(title=title, title_justify="left")
    if staged:
        table.add_column("stage", justify="right")
        table.caption = "; ".join(stage_label(stage.index, stage.layers, len(stages))
                                  for stage in stages)
    for header in ("layer", "kind", "split", "share", "forward", "input grad", "weight grad",
                   "comm bytes", "comm"):
        table.add_column(header, justify="left" if header in ("layer", "kind", "split")
                         else "right")
    groups = ([(str(stage.index + 1), stage.layers) for stage in stages] if staged
              else [("", prediction.layers)])
    for stage_number, layers in groups:
        for cost in layers:
            cells = [cost.name, cost.kind, cost.scheme, f"{cost.work_fraction:.3g}",
                     format_seconds(cost.forward_s), format_seconds(cost.input_grad_s),
                     format_seconds(cost.weight_grad_s), format_si(cost.comm_bytes, "B"),
                     format_seconds(cost.comm_s)]
            table.add_row(*([stage_number] if staged else []), *cells)
        if staged:
            table.add_section()
    return table


def explain_table(prediction: Prediction) -> Table:
    """Every row of the breakdown, utilisation and memory with what it means."""
    table = Table(title="What each row means", title_justify="left")
    table.add_column("row")
    table.add_column("value", justify="right")
    table.add_column("what it is", max_width=76)
    for row in breakdown_rows(prediction):
        share = row.part.seconds / prediction.step_time_s if prediction.step_time_s else 0.0
        table.add_row(("  " if row.depth else "") + human(row.name),
                      f"{format_seconds(row.part.seconds)} ({100 * share:.0f} %)",
                      part_text(row.name))
    table.add_section()
    for name, value in prediction.utilization.items():
        table.add_row(f"utilization {human(name)}", f"{100 * value:.1f} %", utilization_text(name))
    table.add_section()
    for part in prediction.memory:
        where = "" if part.role == "worker" else " (PS)"
        table.add_row(f"{human(part.name)}{where}", format_si(part.bytes, "B"),
                      memory_text(part.name))
    return table


def bands_table(regimes: list[MeasuredRegime]) -> Table:
    """`dnnscale bands`: per measured regime its rows, the median, p90 and max relative error
    of their predictions, whether that is a band, and whose measurements they are."""
    table = Table(title="Measured error per regime (the bands predictions carry)")
    for name, justify in (("regime", "left"), ("rows", "right"), ("median", "right"),
                          ("p90", "right"), ("max", "right"), ("band", "left"),
                          ("measured by", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in regimes:
        table.add_row(r.regime.label, f"{r.rows:,}", f"{100 * r.median_relative_error:.1f} %",
                      f"{100 * r.p90_relative_error:.1f} %",
                      f"{100 * r.max_relative_error:.1f} %",
                      "yes" if r.validated else f"no (< {MIN_ROWS} rows)", r.name or r.source)
    return table
