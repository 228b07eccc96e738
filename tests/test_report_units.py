"""The report's pieces without a browser: the pipeline schedule laid out by hand, the timeline
against the model's parts, every row explained (code and docs), axis ticks, CSV, pages."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dnnscale
from dnnscale.model.prediction import Prediction
from dnnscale.report import explain
from dnnscale.report.csv_out import COLUMNS, GPU_COLUMNS, ranked_csv
from dnnscale.report.pages import change_points, family, outliers, prediction_page
from dnnscale.report.pipeline_schedule import op_order, simulate
from dnnscale.report.svg import LogScale, duration_ticks, seconds_ticks
from dnnscale.report.timeline import step_timeline
from dnnscale.system import load_system
from dnnscale.workload import load_workload

DOCS = Path(__file__).resolve().parents[1] / "docs" / "report.md"
SMALL_GPT = "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000"


def _end(ops) -> float:
    return max(op.end_s for op in ops)


# ---------------------------------------------------------------- the pipeline schedule


def test_1f1b_equal_stages_takes_m_plus_p_minus_1_passes() -> None:
    """p = 4, m = 8, f = 1 s, b = 2 s: (m + p − 1)·(f + b) = 11 · 3 = 33 s (Narayanan SC'21
    §2.2), each device runs 2m = 16 passes, and device 0 warms up with p − 1 = 3 forwards."""
    ops = simulate("1f1b", 4, 8, 1, [1.0] * 4, [2.0] * 4)
    assert _end(ops) == pytest.approx(33.0)
    assert all(sum(op.device == d for op in ops) == 16 for d in range(4))
    first = [kind for kind, _, _ in op_order("1f1b", 0, 4, 8)][:5]
    assert first == ["F", "F", "F", "F", "B"]


def test_gpipe_runs_all_forwards_first() -> None:
    """GPipe with the same times also ends at (m + p − 1)·(f + b) = 33 s; its order is m
    forwards then m backwards on every device."""
    ops = simulate("gpipe", 4, 8, 1, [1.0] * 4, [2.0] * 4)
    assert _end(ops) == pytest.approx(33.0)
    order = op_order("gpipe", 2, 4, 8)
    assert [k for k, _, _ in order] == ["F"] * 8 + ["B"] * 8


def test_unequal_stages_by_hand() -> None:
    """p = 2, m = 2, f = (1, 2), b = (2, 4) under 1F1B. Device 0: F0 [0,1], F1 [1,2], B0 after
    device 1's B0; device 1: F0 [1,3], B0 [3,7], F1 [7,9], B1 [9,13]; device 0: B0 [7,9],
    B1 [13,15]. 15 s = the model's m·t_max + (Σt − t_max) = 2·6 + 3."""
    ops = simulate("1f1b", 2, 2, 1, [1.0, 2.0], [2.0, 4.0])
    spans = {(op.device, op.kind, op.micro_batch): (op.start_s, op.end_s) for op in ops}
    assert spans[(1, "F", 0)] == (1.0, 3.0)
    assert spans[(1, "B", 0)] == (3.0, 7.0)
    assert spans[(0, "B", 0)] == (7.0, 9.0)
    assert spans[(1, "F", 1)] == (7.0, 9.0)
    assert spans[(0, "B", 1)] == (13.0, 15.0)
    assert _end(ops) == 15.0


@pytest.mark.parametrize("v", [2, 4])
def test_interleaved_shrinks_the_bubble_by_v(v: int) -> None:
    """p = 4, m = 8, a device's micro-batch t = 3 s split into v chunks: (m + (p − 1)/v)·t =
    28.5 s for v = 2, 26.25 s for v = 4 (Narayanan SC'21 §2.2); every device runs m·v
    forwards, the first warming up with (p − 1)·2 + (v − 1)·p of them (then one more forward
    opens the steady state before the first backward)."""
    ops = simulate("interleaved", 4, 8, v, [1.0 / v] * 4, [2.0 / v] * 4)
    assert _end(ops) == pytest.approx((8 + 3 / v) * 3)
    assert sum(op.device == 0 and op.kind == "F" for op in ops) == 8 * v
    warmup = [k for k, _, _ in op_order("interleaved", 0, 4, 8, v)]
    assert warmup.index("B") == 3 * 2 + (v - 1) * 4 + 1


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), f=st.floats(0.1, 5), b=st.floats(0.1, 5),
       schedule=st.sampled_from(["1f1b", "gpipe"]))
def test_equal_stages_match_the_models_formula(p: int, m: int, f: float, b: float,
                                               schedule: str) -> None:
    """For equal stages the laid-out schedule ends where the model's pipeline_time_s says."""
    from dnnscale.model.schedule import pipeline_time_s

    ops = simulate(schedule, p, m, 1, [f] * p, [b] * p)
    assert _end(ops) == pytest.approx(pipeline_time_s((f + b,) * p, m), rel=1e-9)
    # no device runs two passes at once, and every pass follows its input
    for d in range(p):
        mine = sorted((op for op in ops if op.device == d), key=lambda op: op.start_s)
        assert all(a.end_s <= c.start_s + 1e-12 for a, c in zip(mine, mine[1:]))


# ---------------------------------------------------------------- the timeline


def _adam(**flags) -> Prediction:
    config = dict(partitions=4, replicas=8, ps_shards=4, minibatch=32)
    config.update(flags)
    if config.get("sync") == "allreduce":
        config["ps_shards"] = 0
    return dnnscale.predict("adam-imagenet22k", "adam-2014", dnnscale.Config(**config))


@pytest.mark.parametrize("sync", ["ps-async", "ps-sync", "allreduce"])
def test_cpu_timeline_adds_up_to_the_step(sync: str) -> None:
    """Without overlap the worker's segments follow each other without gaps and end at the
    step time; each layer's forward appears once, in order, then the backward in reverse."""
    p = _adam(sync=sync)
    timeline = step_timeline(p, None, None)
    segments = timeline.segments
    assert all(s.lane == 0 for s in segments)
    for a, b in zip(segments, segments[1:]):
        assert b.start_s == pytest.approx(a.start_s + a.seconds, abs=1e-12)
    assert segments[-1].start_s + segments[-1].seconds == pytest.approx(p.step_time_s, rel=1e-9)
    forwards = [s.label.split()[0] for s in segments if s.name == "forward"]
    assert forwards == [c.name for c in p.layers if c.forward_s > 0]
    weight = [s.label.split()[0] for s in segments if s.name == "weight_grad"]
    assert weight == [c.name for c in reversed(p.layers) if c.weight_grad_s > 0]


def test_overlapped_plan_draws_network_beside_compute() -> None:
    p = _adam(sync="ps-async", overlap=True)
    timeline = step_timeline(p, None, None)
    assert len(timeline.lanes) == 2 and any("γ-norm" in note for note in timeline.notes)
    assert {s.name for s in timeline.segments if s.lane == 1} <= {"ps_push", "ps_pull",
                                                                 "ps_serve_wait"}


def _gpu(**plan):
    w, c = load_workload(SMALL_GPT), load_system("dgx-a100-80g:1")
    fields = dict(tp=2, pp=4, dp=1, micro_batch=1, global_batch=16)
    fields.update(plan)
    p = dnnscale.predict(w, c, fields)
    return p, w, c


@pytest.mark.parametrize("schedule, v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
def test_pipeline_timeline_has_every_micro_batch(schedule: str, v: int) -> None:
    """m = 16 micro-batches over p = 4 stages: each lane holds m·v forward and m·v backward
    passes; the data-parallel and optimizer parts follow the pipeline and the drawing ends
    at the model's step time (within the drawn schedule's difference from the formula)."""
    p, w, c = _gpu(schedule=schedule, virtual_stages=v)
    timeline = step_timeline(p, w, c)
    assert len(timeline.lanes) == 4
    for lane in range(4):
        kinds = [s.name for s in timeline.segments if s.lane == lane]
        assert kinds.count("forward") == 16 * v and kinds.count("backward") == 16 * v
    model_end = timeline.marks[0][0]
    tail = p.part("dp_comm") + p.part("optimizer_step")
    assert timeline.end_s == pytest.approx(max(model_end, timeline.end_s - tail) + tail)
    assert timeline.step_s == p.step_time_s
    # the pieces of one pass are the model's per-micro-batch costs: they sum to the pass
    for segment in timeline.segments:
        if segment.pieces:
            assert sum(s for _, s in segment.pieces) == pytest.approx(segment.seconds)


# ---------------------------------------------------------------- every row explained


def _predictions() -> list[Prediction]:
    out = [_adam(sync=s) for s in ("ps-async", "ps-sync", "allreduce")]
    out.append(_adam(sync="ps-async", overlap=True))
    out.append(_gpu()[0])
    out.append(_gpu(pp=1, tp=1, dp=8, zero=3, recompute="selective", global_batch=64)[0])
    return out


def test_every_part_the_model_emits_is_explained() -> None:
    for p in _predictions():
        for part in p.parts:
            assert part.name in explain.PART_TEXT, part.name
        for part in p.memory:
            assert part.name in explain.MEMORY_TEXT, part.name
        for name in p.utilization:
            assert name in explain.UTILIZATION_TEXT, name


def test_docs_explain_every_row() -> None:
    """docs/report.md has a table row for each part, memory part and utilisation name."""
    text = DOCS.read_text()
    for name in (*explain.PART_TEXT, *explain.MEMORY_TEXT, *explain.UTILIZATION_TEXT):
        assert re.search(rf"^\| `{re.escape(name)}` \|", text, re.M), name


def test_breakdown_nests_a_sums_parts_under_it() -> None:
    rows = explain.breakdown_rows(_adam())
    names = [(r.name, r.depth) for r in rows]
    assert names[:4] == [("compute", 0), ("forward", 1), ("input_grad", 1), ("weight_grad", 1)]
    assert names[-1] == ("step", 0)
    assert sum(1 for name, _ in names if name == "forward") == 1


# ---------------------------------------------------------------- axes, CSV, pages


def test_duration_ticks_are_round_times() -> None:
    """From 3 h to 14 d: 6 h, 12 h, 1 d, 2 d, 5 d, 10 d (3 h itself is a round value too)."""
    assert duration_ticks(3 * 3600, 14 * 86400) == [3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 86400.0,
                                                   2 * 86400.0, 5 * 86400.0, 10 * 86400.0]
    assert [label for _, label in seconds_ticks(0, 62)] == ["0", "10 s", "20 s", "30 s", "40 s",
                                                            "50 s", "60 s"]
    assert [label for _, label in seconds_ticks(0, 0.004)][:3] == ["0", "0.5 ms", "1.0 ms"]


def test_log_axis_labels_1_2_5_on_short_ranges() -> None:
    labelled, _ = LogScale(1, 120, 0, 100).ticks()
    assert labelled == [1, 2, 5, 10, 20, 50, 100]
    labelled, minor = LogScale(1, 1e6, 0, 100).ticks()
    assert labelled == [1, 10, 100, 1000, 10_000, 100_000, 1e6] and 2 in minor


def test_ranked_csv_rows() -> None:
    result = dnnscale.optimize("adam-cifar10", "adam-2014", machines=16, top=3, curve=False)
    rows = list(csv.DictReader(io.StringIO(ranked_csv(result.top))))
    assert tuple(rows[0]) == COLUMNS + GPU_COLUMNS and len(rows) == 3
    assert all(row[name] == "" for row in rows for name in GPU_COLUMNS)  # Adam rows
    for rank, (row, p) in enumerate(zip(rows, result.top), start=1):
        assert int(row["rank"]) == rank and row["plan"] == p.label()
        assert float(row["epoch_time_s"]) == p.epoch_time_s  # repr round-trips exactly
        assert int(row["machines"]) == p.config.machines
        assert int(row["tensor"]) == p.config.partitions
        assert int(row["replicas"]) == p.config.replicas
    assert float(rows[0]["vs_best"]) == 1.0


def test_ranked_csv_writes_every_plan_field_of_a_gpu_plan() -> None:
    """The GPU columns carry the plan's ep, etp, cp and its algorithm, ZeRO-3's fetch, the tp
    and pp overlaps (with the tp overlap's method) and the gradient width as the plan holds them; a plan that leaves etp,
    overlap_pp and grad_bytes unset reads tp, the schedule's default and the default width."""
    w = load_workload("gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000,flash=true,"
                      "experts=4,top_k=2")
    c = load_system("dgx-a100-80g:2")
    set_ = dnnscale.predict(w, c, dict(
        tp=2, pp=1, dp=2, ep=2, etp=1, cp=2, cp_algorithm="alltoall", zero=3,
        zero3_fetch="buckets", overlap_tp=True, overlap_tp_method="micro_pipeline",
        overlap_pp=False, grad_bytes=2,
        sequence_parallel=True, micro_batch=1, global_batch=16, precision="bf16",
        amp="autocast"))
    unset = dnnscale.predict(w, c, dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=16,
                                        schedule="interleaved", virtual_stages=2,
                                        pp_scatter_gather=True))
    rows = list(csv.DictReader(io.StringIO(ranked_csv([set_, unset]))))
    picked = ("expert", "expert_tensor", "context", "cp_algorithm", "zero3_fetch", "overlap_tp",
              "overlap_pp", "grad_bytes", "grad_accumulation", "loss", "amp", "overlap_tp_method",
              "pp_scatter_gather")
    assert tuple(rows[0])[-len(picked):] == picked  # appended after the older columns
    assert [rows[0][k] for k in picked] == ["2", "1", "2", "alltoall", "buckets", "True",
                                            "False", "2", "fused", "inplace", "autocast",
                                            "micro_pipeline", "False"]
    # interleaved on 2 stages overlaps its sends by default (Pipeline.overlaps_p2p); bf16
    # gradients default to fp32, Megatron's width (plan/modern.py)
    assert [rows[1][k] for k in picked] == ["1", "2", "1", "ring", "blocks", "False", "True",
                                            "4", "fused", "inplace", "half", "userbuffers",
                                            "True"]


def test_families_and_change_points() -> None:
    """A family is the plan without its replica and shard counts; a change point is a budget
    whose best plan's family differs from the budget before."""
    a = _adam(sync="ps-async", partitions=2, replicas=5, ps_shards=3)
    b = _adam(sync="ps-async", partitions=2, replicas=7, ps_shards=1)
    c = _adam(sync="allreduce", partitions=1, replicas=9)
    assert family(a) == family(b) == "ps-async P=2 n=32"
    assert family(c) == "allreduce P=1 n=32"
    assert family(_gpu()[0]) == "TP2 PP4 mb1 1f1b bf16"
    points = [(4, a), (5, b), (9, c), (10, c), (12, a)]
    assert change_points(points) == [(9, "allreduce P=1 n=32"), (12, "ps-async P=2 n=32")]


def test_outliers_are_the_worst_over_20_percent() -> None:
    rows = [{"id": i, "relative_error": e} for i, e in enumerate([0.05, -0.3, 0.25, 0.5, 0.1])]
    assert outliers(rows) == {"1", "2", "3"}
    assert outliers(rows, count=1) == {"3"}


def test_error_band_shown_when_present_and_said_missing_otherwise() -> None:
    p = _adam()
    page = prediction_page(p, load_workload("adam-imagenet22k"), load_system("adam-2014"))
    band = p.error_band.to_dict()  # the committed bands (model/data/error_bands.json)
    assert band["median_relative_error"] is None  # adam-2014 is uncalibrated: no testbed band
    assert "no validated band for this regime" in page
    assert "calibration (calibrated there, uncalibrated here)" in page
    original = Prediction.to_dict
    for missing in (None, {**band, "median_relative_error": None, "reason": "no rows"}):
        with mock.patch.object(Prediction, "to_dict", lambda self, m=missing, **kw:
                               {**original(self, **kw), "error_band": m}):
            page = prediction_page(p, load_workload("adam-imagenet22k"),
                                   load_system("adam-2014"))
        assert "no validated band for this regime" in page
    assert "(no rows)" in page
    band = {"median_relative_error": 0.12, "p90_relative_error": 0.3, "source": "testbed grid"}
    with mock.patch.object(Prediction, "to_dict",
                           lambda self, **kw: {**original(self, **kw), "error_band": band}):
        page = prediction_page(p, load_workload("adam-imagenet22k"), load_system("adam-2014"))
    assert "median ±12.0 %, p90 ±30.0 % — testbed grid" in page
    assert "no validated band" not in page


def test_page_is_self_contained() -> None:
    p, w, c = _gpu()
    page = prediction_page(p, w, c)
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page
    assert page.count('class="chart timeline"') >= 1 and 'class="chart memory"' in page


def test_curve_png_marks_changes_and_the_chosen_plan(tmp_path: Path) -> None:
    from dnnscale.report.curve_plot import plot_result_curve

    result = dnnscale.optimize("adam-cifar10", "adam-2014", machines=24)
    out = plot_result_curve(result, tmp_path / "curve.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_plots_name_what_they_show(tmp_path: Path) -> None:
    """Titles carry the workload, testbed and network; machine counts are whole numbers."""
    from dnnscale.validate import report as validation

    rows = [{"id": i, "set": "grid", "config": {"sync": "allreduce"}, "machines": m,
             "predicted_throughput_samples_per_s": 10.0 * m,
             "measured": {"throughput_samples_per_s": 9.0 * m}} for i, m in enumerate((1, 2, 3))]
    result = {"workload": "adam-cifar10", "testbed": "tb", "network": "100 Mbit/s", "rows": rows}
    figures = []
    with mock.patch.object(validation, "_save", lambda figure, path: figures.append(figure)):
        validation.plot(result, tmp_path)
    scatter, curves = (figure.axes[0] for figure in figures)
    for axis in (scatter, curves):
        assert "adam-cifar10 on testbed tb (100 Mbit/s)" in axis.get_title()
    curves.figure.canvas.draw()
    ticks = [t for t in curves.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_report_of_a_missing_validation_folder_is_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dnnscale.cli import app

    result = CliRunner().invoke(app, ["report", "--validation", str(tmp_path / "none"), "-o",
                                      str(tmp_path / "v.html")])
    assert result.exit_code == 2 and "--validation" in result.output
    (tmp_path / "results.json").write_text('{"rows": 3}')
    result = CliRunner().invoke(app, ["report", "--validation", str(tmp_path), "-o",
                                      str(tmp_path / "v.html")])
    assert result.exit_code == 2 and "results.json of dnnscale validate" in result.output


# ---------------------------------------------------------------- stages, memory, epoch


def test_interleaved_stages_are_named_by_their_chunks() -> None:
    """GPT-3 175B (96 blocks) on p = 4 stages of v = 4 chunks: model/schedule.py gives block b
    to chunk ⌊b·16/96⌋ = ⌊b/6⌋ and chunk c to stage c mod 4, so stage d holds blocks 6d..6d+5,
    24+6d.., 48+6d.., 72+6d..; the embedding goes with block 0, the final norm, logits and
    loss (3 layers) with block 95. Without interleaving a stage is one run of 24 blocks."""
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:64")
    fields = dict(tp=8, pp=4, dp=16, global_batch=1536)
    p = dnnscale.predict(w, c, dict(fields, schedule="interleaved", virtual_stages=4))
    assert [explain.stage_label(s.index, s.layers, 4) for s in p.step_record.stages] == [
        "stage 1: embedding + blocks 0–5, 24–29, 48–53, 72–77",
        "stage 2: blocks 6–11, 30–35, 54–59, 78–83",
        "stage 3: blocks 12–17, 36–41, 60–65, 84–89",
        "stage 4: blocks 18–23, 42–47, 66–71, 90–95 + 3 output layers"]
    timeline = step_timeline(p, w, c)
    assert timeline.lanes[0] == "stage 1: embedding + blocks 0–5, 24–29, 48–53, 72–77"
    plain = dnnscale.predict(w, c, fields)
    assert [explain.stage_label(s.index, s.layers, 4) for s in plain.step_record.stages] == [
        "stage 1: embedding + blocks 0–23", "stage 2: blocks 24–47", "stage 3: blocks 48–71",
        "stage 4: blocks 72–95 + 3 output layers"]


def _layer(name: str, kind: str, block: int | None):
    from dnnscale.model.stage import LayerCost

    return LayerCost(name, kind, "", 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, block=block)


def test_stage_label_by_hand() -> None:
    """Chunks of 3 blocks 12 apart (8 chunks, as p = 4 stages of v = 8 chunks of 96 blocks
    would give stage 1); listed whole, or the first three, '…' and the last; a lone block is
    'block 5'; a stage without blocks names its first and last layer."""
    blocks = [b for start in range(0, 96, 12) for b in range(start, start + 3)]
    layers = [_layer("embedding", "embedding", None)] + [
        _layer(f"b{b}.{part}", "linear", b) for b in blocks for part in ("qkv", "mlp")]
    assert explain.block_runs(blocks)[:3] == [(0, 2), (12, 14), (24, 26)]
    assert explain.stage_label(0, layers, 4) == (
        "stage 1: embedding + blocks 0–2, 12–14, 24–26, 36–38, 48–50, 60–62, 72–74, 84–86")
    assert explain.stage_label(0, layers, 4, most_chunks=4) == (
        "stage 1: embedding + blocks 0–2, 12–14, 24–26, …, 84–86")
    assert explain.stage_label(2, [_layer("b5.qkv", "linear", 5),
                                   _layer("norm", "layernorm", None)], 4) == (
        "stage 3: block 5 + 1 output layer")
    assert explain.stage_label(1, [_layer("conv1", "conv", None),
                                   _layer("fc", "linear", None)], 2) == "stage 2: conv1–fc"
    assert explain.stage_label(1, (), 2) == "stage 2"


def test_memory_per_stage_is_the_models_and_the_fullest_is_reported() -> None:
    """Every stage's memory parts come from the model (Prediction.stage_memory); `memory` is
    the fullest of them (1F1B: the first stage keeps the most micro-batches in flight). A
    pipeline of 16 stages is shown by its first, fullest and last stage; one of 4 by all."""
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:64")
    deep = dnnscale.predict(w, c, dict(tp=8, pp=16, dp=4, global_batch=1536,
                                       recompute="selective"))
    assert len(deep.stage_memory) == 16
    totals = [sum(part.bytes for part in parts) for parts in deep.stage_memory]
    assert deep.memory_of("worker") == max(totals) == totals[0]
    assert totals[0] > totals[-1]
    rows = explain.memory_rows(deep)
    assert [row.label for row in rows] == ["stage 1 (fullest)", "stage 16"]
    assert rows[0].parts == deep.memory and rows[1].parts == deep.stage_memory[15]
    small, _, _ = _gpu()
    assert [row.label for row in explain.memory_rows(small)] == [
        "stage 1 (fullest)", "stage 2", "stage 3", "stage 4"]
    cpu = _adam()
    assert cpu.stage_memory == () and [r.label for r in explain.memory_rows(cpu)] == [
        "per worker", "per PS machine"]
    assert explain.reserve_text(cpu) == explain.NO_RESERVE


def test_an_epoch_says_what_it_is() -> None:
    """GPT-3's epoch is its 300 B training tokens: 146,484,375 sequences of 2,048 tokens."""
    from dnnscale.plan.plan import ParallelPlan

    plan = ParallelPlan()
    assert explain.epoch_text(load_workload("gpt3-175b"), plan) == (
        "300 B tokens (146,484,375 sequences of 2,048 tokens)")
    cnn = load_workload("adam-imagenet22k")
    assert explain.epoch_text(cnn, plan) == f"{cnn.samples_per_epoch:,} samples"
    assert explain.count_words(15e12) == "15 T" and explain.count_words(2048) == "2,048"
