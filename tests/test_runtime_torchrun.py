"""The multi-machine recipe of docs/runtime.md, run as two torchrun "nodes" on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.runtime.launch import free_port
from dnnscale.runtime.records import SUMMARY_KEYS, read_records

BIN = Path(sys.executable).parent
STEPS = 20


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_two_torchrun_nodes_on_loopback(tmp_path: Path) -> None:
    port = free_port("127.0.0.1")
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    nodes = []
    try:
        for node in (0, 1):
            command = [str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1",
                       "--node-rank", str(node), "--master-addr", "127.0.0.1",
                       "--master-port", str(port), "--no-python", str(BIN / "dnnscale"), "run",
                       "-w", "mlp:32-16-4", "-P", "1", "-R", "2", "--sync", "allreduce",
                       "-n", "16", "--steps", str(STEPS), "--lr", "0.2", "--timeout", "30",
                       "--rank-from-env", "-o", str(tmp_path / f"node{node}.jsonl"), "--json"]
            nodes.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env, start_new_session=True))
        outputs = [node.communicate(timeout=75) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    summary = json.loads(outputs[0][0])
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["loss_last"] < summary["loss_first"]
    assert summary["per_phase_s"]["allreduce"] > 0
    assert outputs[1][0].strip() == ""  # only rank 0 prints the summary
    for node in (0, 1):
        records = read_records(tmp_path / f"node{node}.jsonl")
        steps = [r for r in records if r["type"] == "step"]
        assert [r["rank"] for r in steps] == [node] * STEPS
    assert read_records(tmp_path / "node0.jsonl")[-1]["type"] == "summary"
