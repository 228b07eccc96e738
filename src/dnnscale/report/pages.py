"""The three report pages: one plan (predict), the search (optimize), predicted vs measured
(validate). Each returns the HTML text; `write_html` writes it atomically."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from dnnscale.model.prediction import Prediction
from dnnscale.model.records import PartKind
from dnnscale.report.charts import (CurveSeries, ScatterPoint, bars_svg, curve_svg, memory_svg,
                                    scatter_svg, step_bar_svg, timeline_svg)
from dnnscale.report.explain import (breakdown_rows, epoch_text, human, memory_rows,
                                     memory_text, part_text, reserve_text, stage_label,
                                     utilization_text)
from dnnscale.report.page import band_html, figures, page, para, section, table
from dnnscale.report.timeline import step_timeline
from dnnscale.units import format_seconds, format_si


def _key_figures(prediction: Prediction, workload: Any, system: Any) -> list[tuple[str, str]]:
    items = [("time per step", format_seconds(prediction.step_time_s)),
             (f"time per epoch: {epoch_text(workload, prediction.plan)}",
              format_seconds(prediction.epoch_time_s)),
             ("throughput", f"{prediction.throughput_samples_per_s:,.1f} samples/s")]
    if prediction.tokens_per_s is not None:
        items.append(("tokens", f"{prediction.tokens_per_s:,.0f} tokens/s"))
    if prediction.mfu is not None:
        items.append(("MFU", f"{100 * prediction.mfu:.1f} %"))
    items += [_devices_figure(prediction, system), ("bottleneck", prediction.bottleneck),
              _fit_figure(prediction, system)]
    return items


def _on_accelerators(system: Any) -> bool:
    machine = getattr(system, "machine", None)
    return machine is not None and bool(machine.is_accelerator)


def _devices_figure(prediction: Prediction, system: Any) -> tuple[str, str]:
    """GPUs and the nodes they fill on an accelerator system, else machines (workers and
    parameter-server shards)."""
    plan = prediction.plan
    if _on_accelerators(system):
        per_node = max(1, system.devices_per_node)
        nodes = -(-plan.workers // per_node)
        return (f"GPUs ({nodes:,} node{'s' if nodes != 1 else ''} of {per_node})",
                f"{plan.workers:,}")
    if plan.ps_shards:
        return (f"machines ({plan.workers:,} workers + {plan.ps_shards:,} PS shards)",
                f"{plan.machines:,}")
    return "machines", f"{plan.machines:,}"


def _fit_figure(prediction: Prediction, system: Any) -> tuple[str, str]:
    """Fits or not, with the fullest device's need against its capacity and the reserve."""
    capacity = prediction.memory_capacity_bytes.get("worker")
    need = prediction.memory_of("worker")
    device = "GPU" if _on_accelerators(system) else "worker"
    of = (f"{format_si(need, 'B')} of {format_si(capacity, 'B')} per {device}, "
          if capacity else "")
    reserve = reserve_text(prediction, short=True)
    return f"fits in memory ({of}{reserve})", "yes" if prediction.fits else "NO"


def _memory_sections(prediction: Prediction) -> list[str]:
    """The memory chart, the parts of the fullest device, each shown stage's split, the
    capacity and the reserve."""
    rows = memory_rows(prediction)
    fullest = next(row for row in rows if row.fullest) if prediction.stage_memory else None
    part_rows = [[(fullest.label if fullest is not None else
                   "worker" if p.role == "worker" else "PS machine"), human(p.name),
                  format_si(p.bytes, "B"), memory_text(p.name)] for p in prediction.memory]
    out = [memory_svg(prediction),
           table(["device", "part", "bytes", "what it is"], part_rows, numeric=(2,))]
    if len(prediction.stage_memory) > 1:
        names = list(dict.fromkeys(p.name for row in rows for p in row.parts))
        capacity = prediction.memory_capacity_bytes.get("worker")
        record = prediction.step_record
        stages = record.stages if record is not None else ()

        def named(row: Any) -> str:
            if row.stage is None or row.stage >= len(stages):
                return str(row.label)
            label = stage_label(row.stage, stages[row.stage].layers, len(stages))
            return label + (" (fullest)" if row.fullest else "")

        stage_rows = [[named(row), *(format_si(sum(p.bytes for p in row.parts if p.name == n),
                                              "B") for n in names),
                       format_si(row.bytes, "B"),
                       f"{100 * row.bytes / capacity:.1f} %" if capacity else "—"]
                      for row in rows]
        every = len(prediction.stage_memory)
        which = ("every stage" if len(rows) == every
                 else f"the first, the fullest and the last of the {every} stages")
        out += [para(f"Memory of one device per pipeline stage ({which}): the stages hold "
                     "different layers and keep different numbers of micro-batches in flight."),
                table(["stage", *map(human, names), "total", "of capacity"], stage_rows,
                      numeric=tuple(range(1, len(names) + 3)), css="stage-memory",
                      row_classes=["best" if row.fullest else "" for row in rows])]
    capacity_text = ", ".join(f"{role}: {format_si(value, 'B')}"
                              for role, value in prediction.memory_capacity_bytes.items())
    out.append(para(f"Capacity per device: {capacity_text}; {reserve_text(prediction)}."))
    return out


def _layer_section(prediction: Prediction) -> str:
    """Per-layer costs: per pipeline stage (each on its most loaded device) when the step
    has stages with their layers, else the one most loaded worker's."""
    headers = ["layer", "kind", "split", "work share", "forward", "input grad", "weight grad",
               "comm bytes", "comm"]

    def rows(layers: Any) -> list[list[str]]:
        return [[c.name, c.kind, c.scheme, f"{c.work_fraction:.3g}",
                 format_seconds(c.forward_s), format_seconds(c.input_grad_s),
                 format_seconds(c.weight_grad_s), format_si(c.comm_bytes, "B"),
                 format_seconds(c.comm_s)] for c in layers]

    def block(summary: str, layer_rows: list[list[str]]) -> str:
        return (f"<details{' open' if len(layer_rows) <= 40 else ''}><summary>"
                f"{escape(summary)}</summary>"
                + table(headers, layer_rows, numeric=(3, 4, 5, 6, 7, 8)) + "</details>")

    record = prediction.step_record
    stages = record.stages if record is not None and record.by_stage else ()
    if len(stages) > 1 and all(stage.layers for stage in stages):
        total = sum(len(stage.layers) for stage in stages)
        return section("layers", "Per-layer costs", para(
            f"{total:,} layers in {len(stages)} pipeline stages; each stage's layers on its "
            "most loaded device (one member of its tensor-parallel group), per micro-batch."),
            *(block(f"{stage_label(stage.index, stage.layers, len(stages))} — "
                    f"{len(stage.layers):,} layers", rows(stage.layers)) for stage in stages))
    return section("layers", "Per-layer costs", block(
        f"{len(prediction.layers):,} layers on the most loaded worker, per micro-batch",
        rows(prediction.layers)))


def plan_sections(prediction: Prediction, workload: Any, system: Any) -> list[str]:
    """The sections every page with a plan shows, in this order: figures, step parts,
    timeline, memory, utilisation, per-layer costs (when the prediction has them)."""
    overflow = "" if prediction.fits else para(f"Does not fit: {prediction.overflow()}",
                                               "band none")
    out = [section("plan", f"Plan: {prediction.label()}",
                   figures(_key_figures(prediction, workload, system)),
                   band_html(prediction.to_dict().get("error_band")), overflow)]
    rows, classes = [], []
    for row in breakdown_rows(prediction):
        part = row.part
        share = part.seconds / prediction.step_time_s if prediction.step_time_s else 0.0
        rows.append([human(part.name), format_seconds(part.seconds), f"{100 * share:.1f} %",
                     part_text(part.name)])
        classes.append("total" if part.kind == PartKind.TOTAL else f"depth{row.depth}")
    out.append(section(
        "step", "Where a step's time goes", step_bar_svg(prediction),
        table(["part", "seconds", "of the step", "what it is"], rows, numeric=(1, 2),
              row_classes=classes)))
    timeline = step_timeline(prediction, workload, system)
    zooms = []
    if prediction.by_stage and len(timeline.segments) > 60:
        span = _fill_window(timeline)
        zooms = [para(f"The pipeline filling: the first {format_seconds(span)}."),
                 timeline_svg(timeline, window=(0.0, span)),
                 para(f"The pipeline draining, then the data-parallel communication and the "
                      f"optimizer step: the last {format_seconds(span)}."),
                 timeline_svg(timeline, window=(timeline.end_s - span, timeline.end_s))]
    out.append(section("timeline", "One step in time, per worker or stage",
                       timeline_svg(timeline), *(para(note) for note in timeline.notes),
                       *zooms))
    out.append(section("memory", "Memory per device", *_memory_sections(prediction)))
    util = list(prediction.utilization.items())
    out.append(section("utilization", "Busy fraction of each resource", bars_svg(util),
                       table(["resource", "busy", "what it is"],
                             [[human(n), f"{100 * v:.1f} %", utilization_text(n)]
                              for n, v in util], numeric=(1,))))
    if prediction.layers:
        out.append(_layer_section(prediction))
    return out


def _fill_window(timeline: Any) -> float:
    """A span that shows a pipeline's warm-up: 2·p of its longest micro-batch passes, and
    what follows the pipeline at the end (at most the whole step)."""
    longest = max(segment.seconds for segment in timeline.segments
                  if segment.name in ("forward", "backward"))
    after = sum(segment.seconds for segment in timeline.segments
                if segment.name not in ("forward", "backward") and segment.lane == 0)
    return min(timeline.end_s, 2 * len(timeline.lanes) * longest + after)


def prediction_page(prediction: Prediction, workload: Any, system: Any) -> str:
    """The report of one plan."""
    return page(f"{workload.name} on {system.name}", f"Predicted by dnnscale: {prediction.label()}",
                plan_sections(prediction, workload, system))


def family(prediction: Prediction) -> str:
    """A plan without its replica and shard counts: what the curve's change points name."""
    config = prediction.config
    if config is not None:
        text = f"{config.sync} P={config.partitions} n={config.minibatch}"
        if config.uses_ps and (config.push_every, config.pull_every) != (1, 1):
            text += f" k={config.push_every}/{config.pull_every}"
        return text
    return " ".join(token for token in prediction.label().split()
                    if not token.startswith(("DP", "GBS", "R=", "S=")))


def change_points(points: Sequence[tuple[int, Prediction]]) -> list[tuple[int, str]]:
    """(budget, new family) wherever the best plan's family differs from the budget before;
    `points`: (budget, best plan) along the curve."""
    out, previous = [], None
    for budget, prediction in points:
        current = family(prediction)
        if previous is not None and current != previous:
            out.append((budget, current))
        previous = current
    return out


@dataclass(frozen=True)
class SearchView:
    """What a search's page shows beside its chosen plan (build.py makes one per search)."""

    title: str
    best: Prediction
    explanation: Sequence[str]
    search_note: str
    series: Sequence[CurveSeries]
    chosen: tuple[int, float, str] | None
    changes: Sequence[tuple[int, str]]
    x_label: str
    y_label: str
    curve_note: str
    top_headers: Sequence[str]
    top_rows: Sequence[Sequence[Any]]
    top_note: str
    extra: Sequence[str] = ()
    """Further sections (HTML), after the top plans."""


def search_page(view: SearchView, workload: Any, system: Any) -> str:
    """The search's report: the chosen plan's sections, why it wins, the curve, the top plans."""
    head = [section("why", "Why this plan", "<ul>" + "".join(
        f"<li>{escape(line)}</li>" for line in view.explanation) + "</ul>",
        para(view.search_note))]
    curve_notes = [para(view.curve_note)]
    if view.changes:
        curve_notes.append(table(["line", "from budget", "best plan family"],
                                 [[i, m, f] for i, (m, f) in enumerate(view.changes, start=1)],
                                 numeric=(0, 1)))
    tail = [section("curve", "Scalability curve",
                    curve_svg(view.series, view.chosen, view.changes, x_label=view.x_label,
                              y_label=view.y_label), *curve_notes),
            section("top", f"Top {len(view.top_rows)} plans",
                    table(view.top_headers, view.top_rows,
                          numeric=tuple(range(2, len(view.top_headers) - 1)) + (0,),
                          row_classes=["best"]), para(view.top_note))]
    plan = plan_sections(view.best, workload, system)
    return page(view.title, f"Chosen by dnnscale: {view.best.label()}",
                plan[:1] + head + plan[1:4] + tail + plan[4:] + list(view.extra))


def outliers(rows: Sequence[Mapping[str, Any]], count: int = 5,
             threshold: float = 0.2) -> set[str]:
    """Ids of the rows whose |relative error| exceeds `threshold`, at most `count`, worst
    first."""
    scored = sorted(((abs(row.get("relative_error") or 0.0), str(row["id"])) for row in rows),
                    reverse=True)
    return {ident for error, ident in scored[:count] if error > threshold}


def validation_page(result: Mapping[str, Any]) -> str:
    """Predicted vs measured of a `dnnscale validate` run (its results.json)."""
    rows = [row for row in result["rows"] if row.get("set") != "calibration"
            and _positive(row.get("measured", {}).get("throughput_samples_per_s"))
            and _positive(row.get("predicted_throughput_samples_per_s"))]
    marked = outliers(rows)
    points = [ScatterPoint(f"{row['id']} {row['label']}",
                           row["measured"]["throughput_samples_per_s"],
                           row["predicted_throughput_samples_per_s"], row["config"]["sync"],
                           str(row["id"]) in marked) for row in rows]
    summary = result["summary"]
    pct = _pct
    figures_html = figures([("configurations", str(summary.get("configs", len(rows)))),
                            ("median error", pct(summary.get("median_relative_error"))),
                            ("p90 error", pct(summary.get("p90_relative_error"))),
                            ("max error", pct(summary.get("max_relative_error"))),
                            ("Kendall τ", _number(summary.get("kendall_tau")))])
    table_rows = [[row["id"], row["label"], row["machines"],
                   f"{row['predicted_throughput_samples_per_s']:,.1f}",
                   f"{row['measured']['throughput_samples_per_s']:,.1f}",
                   pct(row.get("relative_error")), row.get("predicted_bottleneck", ""),
                   row["measured"].get("observed_bottleneck", "")] for row in rows]
    classes = ["best" if str(row["id"]) in marked else "" for row in rows]
    sections = [section("summary", "Summary", figures_html, para(str(result.get("note", "")))),
                section("scatter", "Predicted vs measured throughput", scatter_svg(points),
                        para("Dashed: prediction = measurement; grey band: ±10 %. Labelled in "
                             "red: the configurations off by more than 20 % (at most five, "
                             "worst first).")),
                section("rows", "Every configuration", table(
                    ["id", "configuration", "machines", "predicted samples/s",
                     "measured samples/s", "error", "bottleneck predicted", "observed"],
                    table_rows, numeric=(2, 3, 4, 5), row_classes=classes))]
    return page(f"Validation: {result.get('workload', '?')} on testbed "
                f"{result.get('testbed', '?')}", f"Network {result.get('network', '?')}; "
                f"{result.get('repeats', '?')} repeats of {result.get('steps', '?')} steps",
                sections)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value == value and 0 < value < float("inf")


def _number(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and value == value else "—"


def _pct(value: float | None) -> str:
    return "—" if value is None or value != value else f"{100 * value:.1f} %"


def write_html(text: str, path: str | Path, field: str = "--html") -> Path:
    """Write the page atomically (an existing file stays until the new one is whole)."""
    from dnnscale.atomic import atomic_write_text

    out = Path(path)
    atomic_write_text(out, text, field)
    return out
