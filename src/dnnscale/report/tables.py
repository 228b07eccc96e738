"""Rich tables for `describe` and `predict` (human units only here, at the boundary)."""

from __future__ import annotations

from rich.table import Table

from dnnscale.model.prediction import Prediction
from dnnscale.units import format_seconds, format_si
from dnnscale.workload.workload import Workload


def _count(value: float) -> str:
    return format_si(value, "").strip() if value else "0"


def workload_table(workload: Workload) -> Table:
    table = Table(title=f"{workload.name}: input {list(workload.input_shape)}, "
                  f"{workload.samples_per_epoch:,} samples per epoch", title_justify="left")
    for header in ("layer", "kind", "output", "params", "fwd FLOP", "in-grad FLOP",
                   "w-grad FLOP", "activations"):
        table.add_column(header, justify="left" if header in ("layer", "kind", "output") else "right")
    for layer in workload.layers:
        table.add_row(layer.name, layer.kind, "x".join(map(str, layer.output_shape)),
                      _count(layer.params), _count(layer.fwd_flops), _count(layer.input_grad_flops),
                      _count(layer.weight_grad_flops), _count(layer.activation_values))
    table.add_section()
    table.add_row("total", "", "", _count(workload.params), _count(workload.fwd_flops),
                  _count(workload.input_grad_flops), _count(workload.weight_grad_flops),
                  _count(workload.activation_values))
    table.caption = (f"{workload.fwd_macs:,.0f} forward multiply-adds (connections) per sample; "
                     f"per-sample counts, 1 multiply-add = 2 FLOP")
    return table


def prediction_table(prediction: Prediction, workload_name: str, cluster_name: str) -> Table:
    table = Table(title=f"{workload_name} on {cluster_name}: {prediction.label()}",
                  title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("throughput", f"{prediction.throughput_samples_per_s:,.1f} samples/s")
    if prediction.tokens_per_s is not None:
        table.add_row("tokens", f"{prediction.tokens_per_s:,.0f} tokens/s")
    if prediction.mfu is not None:
        table.add_row("MFU", f"{100 * prediction.mfu:.1f} %")
    table.add_row("time per step", format_seconds(prediction.step_time_s))
    table.add_row("time per epoch", format_seconds(prediction.epoch_time_s))
    table.add_row("bottleneck", prediction.bottleneck)
    table.add_row("error band", prediction.error_band.text() if prediction.error_band else "-")
    add_breakdown_rows(table, prediction)
    table.add_row("fits in memory", "yes" if prediction.fits else "[red]NO[/red]")
    return table


def add_breakdown_rows(table: Table, prediction: Prediction) -> None:
    """The sections every prediction table shares: seconds per activity, utilisation, memory."""
    table.add_section()
    for name, seconds in prediction.breakdown_s.items():
        if name != "step":
            table.add_row(f"  {name.replace('_', ' ')}", format_seconds(seconds))
    table.add_section()
    for name, value in prediction.utilization.items():
        table.add_row(f"  utilization {name.replace('_', ' ')}", f"{100 * value:.1f} %")
    table.add_section()
    table.add_row("memory per worker", format_si(prediction.memory_bytes["worker"], "B"))
    if prediction.plan.data.uses_ps:
        table.add_row("memory per PS machine", format_si(prediction.memory_bytes["ps"], "B"))
    elif prediction.plan.tensor.rules == "megatron" or prediction.mfu is not None:
        for part in prediction.memory:
            table.add_row(f"  {part.name.replace('_', ' ')}", format_si(part.bytes, "B"))
