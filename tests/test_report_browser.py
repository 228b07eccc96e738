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
from dnnscale.report.pages import change_points
from dnnscale.report.timeline import step_timeline
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from tests.browser import Browser, find_chromium, picture_stats

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium is not installed (apt-get install chromium; .ci/run does)")

GPU_FLAGS = ["-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp", "8", "--pp", "8", "--dp", "8",
             "--global-batch", "1536", "--recompute", "full"]


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
        band = browser.evaluate("document.getElementById('error-band').textContent")
        figures = result.best.error_band  # the committed bands of its regime: none measured
        assert figures is not None and not figures.validated  # adam-2014 is uncalibrated
        assert "no validated band for this regime" in band and "uncalibrated here" in band


def test_gpu_report_draws_each_stage(tmp_path: Path) -> None:
    """GPT-3 175B, TP8 PP8 DP8, 1536 per step: 8 stage lanes, 192 micro-batches → 192 forward
    and 192 backward passes per stage in the full-step chart, then dp and optimizer parts;
    the memory bar has the GPU's four parts."""
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
        assert _count(browser, "svg.memory .mem-part") == 4


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
