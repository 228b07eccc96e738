"""benchmarks/gpu_check.py: the grid, its disjointness from the calibration, the accuracy
summary, and the whole flow as a CPU dry run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from dnnscale.calibrate.gpu import GpuCalibrationPlan
from dnnscale.calibrate.gpu_grid import (H200_GRID, TINY_GRID, GridConfig, accuracy,
                                         check_disjoint, markdown_table, row)
from dnnscale.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def test_grid_has_twelve_varied_single_gpu_configurations():
    assert len(H200_GRID) >= 12 and len(TINY_GRID) >= 12
    for field in ("hidden", "layers", "seq", "micro_batch", "recompute"):
        assert len({getattr(c, field) for c in H200_GRID}) >= 2, field
    assert len({c.label for c in H200_GRID}) == len(H200_GRID)
    assert any(c.global_batch > c.micro_batch for c in H200_GRID)     # accumulation too


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_grid_is_disjoint_from_the_calibration(mode):
    check_disjoint(H200_GRID, GpuCalibrationPlan.make(mode))
    check_disjoint(TINY_GRID, GpuCalibrationPlan.make("tiny"))


def test_a_grid_sharing_a_calibration_shape_is_refused():
    with pytest.raises(InputError, match=r"hidden sizes \[1280\]"):
        check_disjoint([GridConfig(1280, 10, 2, 1024, 1, 1)], GpuCalibrationPlan.make("quick"))


def test_grid_predictions_fit_an_h200():
    from dnnscale.calibrate.gpu_grid import predict_config

    for config in H200_GRID:
        prediction = predict_config(config, None, "hgx-h200", "bf16")
        assert prediction.fits and 1e-3 < prediction.step_time_s < 0.5, config.label


def test_accuracy_by_hand():
    config = GridConfig(768, 12, 2, 1024, 1, 1)
    # measured 100 ms each; predicted 101, 98, 110 ms: errors 1 %, 2 %, 10 %
    rows = [row(config, {"step_time_s": 0.1}, p, 0.12) for p in (0.101, 0.098, 0.110)]
    rows.append(row(config, None, 0.1, 0.1, "skipped: budget"))
    stats = accuracy(rows)
    assert stats["configurations"] == 4 and stats["measured"] == 3
    assert stats["median_relative_error"] == pytest.approx(0.02)
    assert stats["max_relative_error"] == pytest.approx(0.10)
    assert stats["kernel_only"]["median_relative_error"] == pytest.approx(0.2)
    assert stats["meets_target"] is False            # 3 < 12 configurations
    twelve = accuracy([row(config, {"step_time_s": 0.1}, 0.104, 0.1)] * 12)
    assert twelve["meets_target"] is True            # 4 % each: median and max under 5 / 12 %
    table = markdown_table(rows, "# t")
    assert "| 1 | h768 L2 s1024 b1x1 |" in table and "+1.0 %" in table and "-2.0 %" in table
    assert "skipped: budget" in table


def test_the_script_is_one_bash_command():
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "PYTHONPATH" in text and "timeout --signal=INT" in text


@pytest.mark.slow
def test_dry_run_writes_the_results(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" /
                                                  "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    threads = torch.get_num_threads()
    try:
        assert module.main(["--dry-run", "--out", str(tmp_path), "--steps", "3",
                            "--warmup", "1"]) == 0
    finally:
        torch.set_num_threads(threads)   # the dry run times on one thread
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] and summary["dry_run"] and summary["measured"] == 12
    assert summary["device_preset"] == "H200-SXM-141GB" and summary["node_preset"] == "hgx-h200"
    assert {"median_relative_error", "p90_relative_error", "max_relative_error",
            "kernel_only", "date", "device_name", "torch_version"} <= set(summary)
    from dnnscale.system.gpu_profile import load_gpu_profile

    profile = load_gpu_profile(tmp_path / "profile.yaml")
    assert "step_fit" in profile.extra
    assert (tmp_path / "table.md").read_text().count("\n| ") >= 13
    steps = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert sum(r["type"] == "summary" for r in steps) == 12
