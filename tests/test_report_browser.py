"""The HTML report in a real browser: headless Chromium (the Debian package) loads each page
with no console error, exception, failed load or request beyond the file; the timeline, memory
bar and curve are there and drawn; a full-page screenshot is not blank.

Skips, saying why, where Chromium is not installed; .ci/run installs it, so CI runs these."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dnnscale
from dnnscale.report.explain import stage_label
from dnnscale.report.pages import change_points
from dnnscale.report.timeline import LANE_CHUNKS, step_timeline
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from tests.browser import Browser, find_chromium, picture_stats

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium is not installed (apt-get install chromium; .ci/run does)")

GPU_FLAGS = ["-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp", "8", "--pp", "8", "--dp", "8",
             "--global-batch", "1536", "--recompute", "full"]
TIGHT_FLAGS = ["-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp", "8", "--pp", "8", "--dp",
               "8", "--global-batch", "1536", "--schedule", "interleaved", "--virtual-stages",
               "4", "--recompute", "selective", "--grad-bytes", "2"]
"""An interleaved plan whose fullest stage needs 98.4 % of the GPU's memory (bf16 gradients,
the reserve included)."""

OVERLAPS_JS = """(selector => {
  const boxes = [];
  for (const chart of document.querySelectorAll(selector)) {
    const texts = [...chart.querySelectorAll('text')].filter(t => t.textContent.trim());
    boxes.push(texts.map(t => [t.textContent, t.getBoundingClientRect()]));
  }
  const out = [];
  for (const texts of boxes) {
    for (let i = 0; i < texts.length; i++) {
      for (let j = i + 1; j < texts.length; j++) {
        const [a, r] = texts[i], [b, q] = texts[j];
        const w = Math.min(r.right, q.right) - Math.max(r.left, q.left);
        const h = Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top);
        if (w > 0.5 && h > 0.5) out.push([a, b]);
      }
    }
  }
  return out;
})"""
"""(text, text) of every two labels of one chart whose boxes in the page intersect."""


def dnnscale_cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    return result


def _count(browser: Browser, selector: str) -> int:
    return int(browser.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length"))


def _drawn_width(browser: Browser, selector: str) -> float:
    return float(browser.evaluate(
        f"document.querySelector({json.dumps(selector)}).getBoundingClientRect().width"))


def _overlapping_labels(browser: Browser, selector: str) -> list[list[str]]:
    return list(browser.evaluate(f"{OVERLAPS_JS}({json.dumps(selector)})"))


def _boxes(browser: Browser, selector: str) -> list[dict[str, float]]:
    """Text and page box of each element matching `selector`."""
    return list(browser.evaluate(
        f"[...document.querySelectorAll({json.dumps(selector)})].map(e => {{"
        "const r = e.getBoundingClientRect(); return {text: e.textContent, left: r.left, "
        "right: r.right, top: r.top, bottom: r.bottom};})"))


def _check_page(browser: Browser, path: Path) -> None:
    report = browser.open(path)
    assert report.problems == [], report.problems
    assert report.requests == [path.resolve().as_uri()]  # nothing but the file itself
    png = browser.screenshot()
    width, height, inked = picture_stats(png)
    assert width == browser.width and height > 1500
    assert inked > 0.03, f"only {inked:.1%} of the screenshot is not white"


def test_report_of_make_runs_plan(tmp_path: Path) -> None:
    """`make run`'s job (adam-imagenet22k on adam-2014) as `dnnscale report`: one timeline
    segment per layer phase and step part the model gives, the worker's four memory parts, a
    curve per mode plus the overall best, the chosen plan, one dashed line per change point."""
    out = tmp_path / "report.html"
    dnnscale_cli("report", "-w", "adam-imagenet22k", "-c", "adam-2014", "-o", str(out))
    w, c = load_workload("adam-imagenet22k"), load_system("adam-2014")
    result = dnnscale.optimize(w, c)
    expected_segments = len(step_timeline(result.best, w, c).segments)
    with Browser() as browser:
        _check_page(browser, out)
        assert _count(browser, "svg.timeline .seg") == expected_segments > 20
        assert _count(browser, "svg.timeline .lane") == 1
        assert _count(browser, "svg.memory .mem-part") == len(result.best.memory) == 4
        assert _count(browser, "svg.curve .curve-line") == 1 + len(result.families) == 4
        assert _count(browser, "svg.curve .chosen") == 1
        assert _count(browser, "svg.curve .change-point") == len(change_points(
            [(p.machines, p.prediction) for p in result.curve]))
        assert _count(browser, "#top tbody tr") == len(result.top)
        for chart in ("svg.timeline", "svg.memory", "svg.curve", "svg.step-bar"):
            assert _drawn_width(browser, chart) > 600, chart
        assert _overlapping_labels(browser, "svg.chart") == []
        band = browser.evaluate("document.getElementById('error-band').textContent")
        figures = result.best.error_band  # the committed bands of its regime: none measured
        assert figures is not None and not figures.validated  # adam-2014 is uncalibrated
        assert "no validated band for this regime" in band and "uncalibrated here" in band


def test_gpu_report_draws_each_stage(tmp_path: Path) -> None:
    """GPT-3 175B, TP8 PP8 DP8, 1536 per step: 8 stage lanes, 192 micro-batches → 192 forward
    and 192 backward passes per stage in the full-step chart, then dp and optimizer parts;
    the memory chart has a bar of the GPU's six parts per stage (weights, gradients, optimizer
    state, activations, the block recomputed in the backward pass, reserve) and the loss on the
    last; no two labels overlap."""
    out = tmp_path / "gpu.html"
    dnnscale_cli("predict", *GPU_FLAGS, "--html", str(out), "-q")
    with Browser() as browser:
        _check_page(browser, out)
        first = "svg.timeline:first-of-type"
        assert _count(browser, f"{first} .lane") == 8
        assert _count(browser, f"{first} .seg[data-part=forward]") == 8 * 192
        assert _count(browser, f"{first} .seg[data-part=backward]") == 8 * 192
        assert _count(browser, f"{first} .seg[data-part=dp_comm]") == 8
        assert _count(browser, "svg.timeline") == 3  # the whole step, the fill, the drain
        assert _count(browser, "svg.memory .mem-part") == 8 * 6 + 1  # + the last's loss
        assert _count(browser, "svg.memory .mem-part[data-part=loss]") == 1
        assert _overlapping_labels(browser, "svg.chart") == []


def test_tight_memory_and_interleaved_stage_labels(tmp_path: Path) -> None:
    """TIGHT_FLAGS: GPT-3 175B (96 blocks) on 8 stages of 4 interleaved chunks each. The model
    (model/schedule.py) gives block b to chunk ⌊b·32/96⌋ = ⌊b/3⌋ and chunk c to stage c mod 8:
    stage d holds blocks 3d..3d+2, 24+3d.., 48+3d.., 72+3d..; the embedding goes with block 0,
    the final norm, logits and loss with block 95. The fullest stage (the first) needs 84.5 GB
    of the A100's 85.9 GB (bf16 gradients; 1.13 GB of it the reserve), so its total label ends
    where the capacity line is: the two labels must not overlap, nor the total label cross the
    line."""
    out = tmp_path / "tight.html"
    dnnscale_cli("predict", *TIGHT_FLAGS, "--html", str(out), "-q")
    prediction = dnnscale.predict(load_workload("gpt3-175b"), load_system("dgx-a100-80g:64"),
                                  {"tp": 8, "pp": 8, "dp": 8, "global_batch": 1536,
                                   "schedule": "interleaved", "virtual_stages": 4,
                                   "recompute": "selective", "grad_bytes": 2})
    capacity = prediction.memory_capacity_bytes["worker"]
    assert prediction.fits and prediction.memory_of("worker") > 0.95 * capacity
    expected = ["stage 1: embedding + blocks 0–2, 24–26, 48–50, 72–74",
                "stage 2: blocks 3–5, 27–29, 51–53, 75–77",
                "stage 3: blocks 6–8, 30–32, 54–56, 78–80",
                "stage 4: blocks 9–11, 33–35, 57–59, 81–83",
                "stage 5: blocks 12–14, 36–38, 60–62, 84–86",
                "stage 6: blocks 15–17, 39–41, 63–65, 87–89",
                "stage 7: blocks 18–20, 42–44, 66–68, 90–92",
                "stage 8: blocks 21–23, 45–47, 69–71, 93–95 + 3 output layers"]
    with Browser() as browser:
        _check_page(browser, out)
        # the memory chart: one bar per stage, the total and capacity labels apart
        assert _count(browser, "svg.memory .mem-part") == 8 * 6 + 1  # the last's loss
        totals = _boxes(browser, "svg.memory .bar-total")
        (cap,) = _boxes(browser, "svg.memory .capacity-label")
        (line,) = _boxes(browser, "svg.memory line.capacity")
        assert [t["text"] for t in totals][0] == "84.5 GB"
        for box in totals:
            apart = (box["right"] <= cap["left"] or box["left"] >= cap["right"]
                     or box["bottom"] <= cap["top"] or box["top"] >= cap["bottom"])
            assert apart, (box, cap)
            assert box["right"] <= line["left"] or box["left"] >= line["right"], (box, line)
        assert _overlapping_labels(browser, "svg.chart") == []
        # the timeline's lanes: each stage by its chunks, inside the chart
        lanes = _boxes(browser, "svg.timeline:first-of-type .lane-label")
        assert [lane["text"] for lane in lanes] == expected
        chart = _boxes(browser, "svg.timeline:first-of-type")[0]
        assert all(lane["left"] >= chart["left"] for lane in lanes)
        # the per-layer section: one list per stage, named alike, 1,156 layers in all
        summaries = browser.evaluate(
            "[...document.querySelectorAll('#layers details summary')].map(e => e.textContent)")
        assert [s.split(" — ")[0] for s in summaries] == expected
        assert _count(browser, "#layers tbody tr") == len(prediction.layers) == 1156
        assert "1,156 layers in 8 pipeline stages" in browser.evaluate(
            "document.getElementById('layers').textContent")
        # the cards: GPUs on nodes, what an epoch is, the memory and its reserve
        cards = browser.evaluate("[...document.querySelectorAll('#plan .figure')]"
                                 ".map(e => [e.querySelector('.k').textContent,"
                                 " e.querySelector('.v').textContent])")
        assert ["GPUs (64 nodes of 8)", "512"] in cards
        assert any(k == "time per epoch: 300 B tokens (146,484,375 sequences of 2,048 tokens)"
                   for k, _ in cards)
        assert ["fits in memory (84.5 GB of 85.9 GB per GPU, reserve included)",
                "yes"] in cards
        stage_rows = browser.evaluate("[...document.querySelectorAll('table.stage-memory "
                                      "tbody tr')].map(r => r.cells[0].textContent)")
        assert stage_rows == [expected[0] + " (fullest)", *expected[1:]]


def test_gpu_search_report_names_the_winners_stages(tmp_path: Path) -> None:
    """The GPU search's page (GPT-3 175B on 64 DGX A100 nodes): the chosen plan's lanes are
    its stages as stage_label names them from the model's layers (an interleaved winner by its
    chunks), and no two labels of any chart overlap (the curve's corner ticks among them)."""
    out = tmp_path / "search.html"
    dnnscale_cli("report", "-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--global-batch",
                 "1536", "-o", str(out))
    w, c = load_workload("gpt3-175b"), load_system("dgx-a100-80g:64")
    best = dnnscale.optimize(w, c, global_batch=1536).best
    stages = best.step_record.stages
    with Browser() as browser:
        _check_page(browser, out)
        lanes = _boxes(browser, "svg.timeline:first-of-type .lane-label")
        assert [lane["text"] for lane in lanes] == [
            stage_label(s.index, s.layers, len(stages), LANE_CHUNKS) for s in stages]
        assert _overlapping_labels(browser, "svg.chart") == []


def test_validation_report_labels_outliers(tmp_path: Path) -> None:
    """A validate folder's results.json: one point per configuration, the two off by more
    than 20 % labelled."""
    rows = [{"id": i, "set": "grid", "label": f"P=1 R={i} allreduce n=32", "machines": i,
             "config": {"sync": "allreduce"}, "predicted_throughput_samples_per_s": 100.0 * i,
             "measured": {"throughput_samples_per_s": 100.0 * i / (1 + e), "spread": 0.01,
                          "observed_bottleneck": "compute"},
             "relative_error": e, "predicted_bottleneck": "worker compute"}
            for i, e in zip(range(1, 7), (0.05, -0.02, 0.3, 0.1, -0.45, 0.0))]
    folder = tmp_path / "validation"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({
        "workload": "adam-cifar10", "testbed": "tb", "network": "100 Mbit/s", "repeats": 3,
        "steps": 20, "note": "synthetic", "rows": rows,
        "summary": {"configs": 6, "median_relative_error": 0.075, "p90_relative_error": 0.375,
                    "max_relative_error": 0.45, "kendall_tau": 1.0, "baselines": {}}}))
    out = tmp_path / "validation.html"
    dnnscale_cli("report", "--validation", str(folder), "-o", str(out))
    with Browser() as browser:
        report = browser.open(out)
        assert report.problems == [], report.problems
        assert _count(browser, "svg.scatter .scatter-point") == 6
        labels = browser.evaluate("[...document.querySelectorAll('svg.scatter .outlier-label')]"
                                  ".map(e => e.textContent)")
        assert sorted(labels) == ["3 P=1 R=3 allreduce n=32 (+30 %)",
                                  "5 P=1 R=5 allreduce n=32 (-45 %)"]


def test_the_checks_catch_a_broken_page(tmp_path: Path) -> None:
    """The harness is not blind: a console error, an uncaught exception and a missing local
    file are all reported, and a blank page's screenshot counts as blank."""
    broken = tmp_path / "broken.html"
    broken.write_text("<html><body><p>x</p><script>console.error('boom'); nothing();</script>"
                      "<img src='missing.png'></body></html>")
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body style='background:#fff'></body></html>")
    with Browser() as browser:
        problems = browser.open(broken).problems
        assert any("console.error: boom" in p for p in problems)
        assert any(p.startswith("exception:") and "nothing" in p for p in problems)
        assert any("missing.png" in p for p in problems)
        browser.open(blank)
        assert picture_stats(browser.screenshot(full_page=False))[2] < 0.001
