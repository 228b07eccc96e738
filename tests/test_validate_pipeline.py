"""The validation pipeline end to end on a real (tiny) testbed: predict, run, compare, regret.

Checks the pipeline, not the accuracy (that is benchmarks/validate.sh). Needs root for the
testbed; skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.testbed.system import support_problem
from dnnscale.testbed.teardown import down

PROBLEM = support_problem()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None, reason=f"testbed unavailable: {PROBLEM}")]

GRID = """
workload: mlp:32-16-4
defaults: {minibatch: 8}
steps: 2
warmup: 1
repeats: 1
timeout: 60s
lr: 0.2
calibration:
  - {partitions: 1, replicas: 1, ps_shards: 1, sync: ps-sync}
  - {partitions: 1, replicas: 2, sync: allreduce}
configs:
  - {partitions: 2, replicas: 1, ps_shards: 1, sync: ps-async}
  - {partitions: 1, replicas: 2, ps_shards: 1, sync: ps-sync}
"""


@pytest.fixture()
def testbed() -> Iterator[str]:
    name = "v" + secrets.token_hex(2)
    try:
        result = CliRunner().invoke(app, ["testbed", "up", "--hosts", "3", "--rate", "1gbit",
                                          "--cpu", "0.3", "--name", name])
        assert result.exit_code == 0, result.output
        yield name
    finally:
        down(name)


@pytest.mark.timeout(240)
def test_quick_validation_end_to_end(testbed: str, tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["validate", "--testbed", testbed, "--configs", str(grid),
                                      "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    validated = [r for r in data["rows"] if r["set"] == "validation"]
    assert len(validated) == 2
    for row in data["rows"]:
        measured = row["measured"]["throughput_samples_per_s"]
        assert measured > 0 and row["predicted_throughput_samples_per_s"] > 0
        assert row["relative_error"] == pytest.approx(
            abs(row["predicted_throughput_samples_per_s"] - measured) / measured)
    summary = data["summary"]
    # the validated configurations and the optimizer's own choice, run like any other row
    chosen = [r for r in data["rows"] if r["set"] == "optimizer"]
    assert len(chosen) <= 1 and summary["configs"] == 2 + len(chosen)
    assert set(summary["baselines"]) == {"paleo", "optimus"}
    assert summary["regret"] >= 0.0          # the optimizer's choice was run and compared
    assert data["optimizer"]["machines"] == 3
    for name in ("table.md", "scatter.png", "curves.png"):
        assert (out / name).stat().st_size > 0
    assert (out / "scatter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(list((out / "runs").glob("*.jsonl"))) >= 4


def test_grid_rejects_overlapping_calibration(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("configs: [{partitions: 1, replicas: 1, ps_shards: 1}]\n"
                    "calibration: [{partitions: 1, replicas: 1, ps_shards: 1}]\n")
    result = CliRunner().invoke(app, ["validate", "--testbed", "x", "--configs", str(grid),
                                      "-o", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "grid.calibration" in result.output and "disjoint" in result.output
