"""benchmarks/moe_context.py: the public ep / cp measurements, re-predicted, and the peak memory
torchtitan's tables print, set against the model's fullest device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "benchmarks" / "moe_context.py"
DATA = ROOT / "benchmarks" / "data" / "moe_context_measurements.yaml"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCHMARK), "--out", str(tmp_path / "out"),
                           *args], capture_output=True, text=True, timeout=110)


@pytest.mark.timeout(120)
def test_memory_readings_are_scored_against_the_fullest_device(tmp_path: Path) -> None:
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    scored = [r for r in summary["rows"] if "memory_relative_error" in r]
    # torchtitan's tables print Memory(GiB) for each row: Table 2 (Llama 3.1 8B, CP) and
    # Table 6 (405B, CP), then the dense rows of Tables 1, 3, 4 and 5
    cp_rows = [f"torchtitan-{m}-cp{c}-{k}k" for m in ("8b", "405b")
               for c, k in ((1, 32), (2, 64), (4, 128), (8, 256))]
    dense_rows = ["torchtitan-8b-fsdp8-8k", "torchtitan-8b-fsdp128-8k", "torchtitan-70b-2d",
                  "torchtitan-70b-2d-asynctp", "torchtitan-405b-3d-1f1b"]
    assert [r["id"] for r in scored] == cp_rows + dense_rows
    assert [r["measured_memory_gib"] for r in scored] == [83.9, 84.2, 84.0, 84.5,
                                                         75.3, 75.9, 77.1, 84.9,
                                                         82.4, 67.0, 71.9, 67.6, 82.5]
    assert {r["id"] for r in summary["rows"] if r["role"] == "dense"} == set(dense_rows)
    assert summary["groups"]["dense"]["rows"] == 5
    for r in scored:
        assert r["memory_ratio"] == pytest.approx(r["predicted_memory_gib"]
                                                  / r["measured_memory_gib"])
        assert r["memory_relative_error"] == pytest.approx(abs(r["memory_ratio"] - 1))
    memory = summary["memory"]
    assert memory["rows"] == 13
    assert memory["median_relative_error"] <= memory["max_relative_error"]
    assert "Peak memory: 13 rows" in (tmp_path / "out" / "summary.md").read_text()


@pytest.mark.timeout(60)
def test_a_dense_row_with_context_parallelism_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load(DATA.read_text())
    row = next(r for r in data["rows"] if r["role"] == "dense")
    data["rows"] = [dict(row, plan={**row["plan"], "cp": 2, "dp": row["plan"]["dp"] // 2})]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    done = _run(tmp_path, "--data", str(bad))
    assert done.returncode == 2 and "a dense row has ep = cp = 1" in done.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["84", -1, True, 1e9])
def test_a_bad_memory_reading_is_refused_in_one_line(tmp_path: Path, value: object) -> None:
    data = yaml.safe_load(DATA.read_text())
    data["rows"] = [dict(data["rows"][-1], measured_memory_gib=value)]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    done = _run(tmp_path, "--data", str(bad))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "measured_memory_gib" in done.stderr and "--data" in done.stderr
