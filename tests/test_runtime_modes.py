"""`dnnscale run --local` in every sync mode: the loss falls, records are complete, and the
asynchronous parameter server's shards changed and heard from every worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dnnscale.runtime.records import SUMMARY_KEYS, read_records

DNNSCALE = str(Path(sys.executable).parent / "dnnscale")
STEPS = 24


def run_cli(args: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DNNSCALE, "run", *args], capture_output=True, text=True,
                          timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"})


def assert_all_exited(records: list[dict[str, Any]]) -> None:
    for record in records:
        if record["type"] == "start":
            with pytest.raises(ProcessLookupError):
                os.kill(record["pid"], 0)


def check_run(records: list[dict[str, Any]], workers: int) -> None:
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == STEPS * workers
    for rank in range(workers):
        losses = [r["loss"] for r in steps if r["rank"] == rank]
        assert len(losses) == STEPS
        first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
        assert last < 0.8 * first, (rank, losses)
    for record in steps:
        parts = sum(record[k] for k in ("compute_s", "partition_comm_s", "ps_push_s", "ps_pull_s",
                                        "allreduce_s"))
        assert parts == pytest.approx(record["step_s"], rel=1e-6, abs=1e-9)
    assert records[-1]["type"] == "summary"
    assert_all_exited(records)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_allreduce_with_partitions_and_replicas(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "2", "-R", "2", "--sync", "allreduce", "-n", "16",
                      "--steps", str(STEPS), "--warmup", "4", "--lr", "0.2", "--local",
                      "-o", str(out), "--json"])
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["steps"] == STEPS and summary["measured_throughput_samples_per_s"] > 0
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["per_phase_s"]["partition_comm"] > 0 and summary["per_phase_s"]["allreduce"] > 0
    assert summary["per_phase_s"]["ps_push"] == 0
    records = read_records(out)
    check_run(records, workers=4)
    assert records[-1] == {**summary, "type": "summary"}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_async_parameter_server(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "1", "-R", "2", "-S", "2", "--sync", "ps-async",
                      "--push-every", "2", "--pull-every", "3", "-n", "16",
                      "--steps", str(STEPS), "--lr", "0.2", "--local", "-o", str(out)])
    assert result.returncode == 0, result.stderr
    assert "samples/s" in result.stdout
    records = read_records(out)
    check_run(records, workers=2)
    shards = [r for r in records if r["type"] == "ps"]
    assert sorted(r["shard"] for r in shards) == [0, 1]
    for shard in shards:
        assert shard["param_change_l2"] > 0
        # every worker pushed every second step to every shard
        assert shard["pushes_by_rank"] == {"0": STEPS // 2, "1": STEPS // 2}
        assert shard["updates_applied"] == STEPS  # async: each push applied as it came
        assert shard["pulls"] == 2 * (STEPS // 3)


TINY_CONV = """\
name: tinyconv
input_shape: [2, 8, 8]
samples_per_epoch: 1000
layers:
  - {kind: conv2d, out_channels: 6, kernel: 3, padding: 1}
  - {kind: relu}
  - {kind: maxpool2d, kernel: 2}
  - {kind: conv2d, out_channels: 5, kernel: 3, padding: 1}
  - {kind: relu}
  - {kind: avgpool2d, kernel: 2}
  - {kind: flatten}
  - {kind: linear, out_features: 7}
  - {kind: relu}
  - {kind: linear, out_features: 4}
  - {kind: softmax_loss}
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_sync_parameter_server_with_a_striped_conv_net(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    (tmp_path / "tinyconv.yaml").write_text(TINY_CONV)
    result = run_cli(["-w", str(tmp_path / "tinyconv.yaml"), "-P", "2", "-R", "1", "-S", "1",
                      "--sync", "ps-sync", "--conv-split", "rows", "-n", "16",
                      "--steps", str(STEPS), "--lr", "1.0", "--local", "-o", str(out)])
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    check_run(records, workers=2)
    (shard,) = [r for r in records if r["type"] == "ps"]
    assert shard["pushes_by_rank"] == {"0": STEPS, "1": STEPS}
    assert shard["updates_applied"] == STEPS  # one update per step, after both pieces arrived
    assert shard["param_change_l2"] > 0
