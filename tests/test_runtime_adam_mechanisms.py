"""Overlapped transfers and the epoch cut-off, run for real: the loss falls, the staleness of
the pulled weights stays within its stated bound, the cut-off ends the epoch and is recorded;
and what the runtime refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dnnscale.errors import InputError
from dnnscale.plan import Config
from dnnscale.runtime.netplan import check_runnable
from dnnscale.runtime.records import log_spread, read_records
from dnnscale.runtime.worker import EpochCutoff
from dnnscale.workload import load_workload
from tests.test_runtime_modes import STEPS, check_run, run_cli


def _steps(records: list[dict], rank: int) -> list[dict]:
    return [r for r in records if r["type"] == "step" and r["rank"] == rank]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_overlapped_async_staleness_is_bounded(tmp_path: Path) -> None:
    """ps-async, pulls every 2 steps, overlap on: every step's weights come from a pull issued
    at most 2·k_pull = 4 steps earlier, and later than k_pull = 2 for some step (without
    overlap the bound is k_pull: the pull after step t lands before step t+1)."""
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "1", "-R", "2", "-S", "2", "--sync", "ps-async",
                      "--pull-every", "2", "-n", "16", "--steps", str(STEPS), "--lr", "0.2",
                      "--overlap", "--local", "-o", str(out)])
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    check_run(records, workers=2)
    for rank in (0, 1):
        steps = _steps(records, rank)
        lags = [r["step"] - r["pulled_at_step"] for r in steps]
        assert max(lags) <= 4 and max(lags) > 2, lags
        # Pushes every step, pulls after steps 1, 3, 5, ...: the exchange begun after step 1
        # is waited for (and its pull applied) at the end of step 2, so steps 3 and 4 compute
        # with the pull after step 1 (without overlap: steps 2 and 3).
        assert [r["pulled_at_step"] for r in steps[:8]] == [-1, -1, -1, 1, 1, 3, 3, 5]
        assert all(r["ps_exchange_s"] > 0 for r in steps[1:])
    for shard in (r for r in records if r["type"] == "ps"):
        assert shard["pushes_by_rank"] == {"0": STEPS, "1": STEPS}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_overlap_the_pull_lands_before_the_next_step(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "1", "-R", "1", "-S", "1", "--sync", "ps-async",
                      "--pull-every", "2", "-n", "16", "--steps", "8", "--lr", "0.2", "--local",
                      "-o", str(out)])
    assert result.returncode == 0, result.stderr
    assert [r["pulled_at_step"] for r in _steps(read_records(out), 0)] == \
        [-1, -1, 1, 1, 3, 3, 5, 5]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_overlapped_sync_parameter_server_trains(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "2", "-R", "2", "-S", "1", "--sync", "ps-sync",
                      "-n", "16", "--steps", str(STEPS), "--lr", "0.2", "--overlap",
                      "--fc-protocol", "vectors", "--local", "-o", str(out)])
    assert result.returncode == 0, result.stderr
    records = read_records(out)
    check_run(records, workers=4)
    (shard,) = [r for r in records if r["type"] == "ps"]
    assert shard["updates_applied"] == STEPS  # every step's R pushes were summed and applied


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_epoch_cut_off_ends_the_epoch_and_is_recorded(tmp_path: Path) -> None:
    """R = 3, 24 steps of which 4 warm-up, f = 0.5: the epoch is ceil(0.5 · 3 · 20) = 30
    replica-steps; each replica stops after the step in which it learns the count reached 30,
    so the replicas did 30 to 32 timed steps together, and at least one (all, if they run
    equally fast) fewer than its 20."""
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "1", "-R", "3", "-S", "1", "--sync", "ps-async",
                      "-n", "16", "--steps", str(STEPS), "--warmup", "4", "--lr", "0.2",
                      "--epoch-fraction", "0.5", "--local", "-o", str(out), "--json"])
    assert result.returncode == 0, result.stderr
    epoch = json.loads(result.stdout)["epoch"]
    assert epoch["cut_off"] and epoch["target_steps"] == 30 and epoch["samples"] == 30 * 16
    done = epoch["steps_by_replica"]
    assert 30 <= sum(done.values()) <= 32 and min(done.values()) < 20
    assert epoch["epoch_time_s"] > 0
    assert epoch["throughput_samples_per_s"] == pytest.approx(480 / epoch["epoch_time_s"])
    records = read_records(out)
    steps = [r for r in records if r["type"] == "step"]
    for replica in range(3):
        mine = [r for r in steps if r["replica"] == replica]
        assert len(mine) == 4 + done[str(replica)]
        assert not any(r["epoch_over"] for r in mine[:-1])
        assert mine[-1]["epoch_over"] or len(mine) == STEPS  # cut off, or done with its share
        assert mine[-1]["epoch_target_steps"] == 30
    losses = [r["loss"] for r in steps if r["replica"] == int(max(done, key=done.get))]
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    counts = sorted(r["epoch_steps_done"] for r in steps if r["epoch_steps_done"] is not None)
    assert counts == list(range(1, len(counts) + 1))  # one atomic count per timed step
    assert records[-1]["type"] == "summary"


class _Store:
    """The store's add/set/get, in memory (what torch.distributed's TCPStore offers)."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    def add(self, key: str, amount: int) -> int:
        self.values[key] = int(self.values.get(key, 0)) + amount  # type: ignore[arg-type]
        return int(self.values[key])  # type: ignore[arg-type]

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return str(self.values[key]).encode()


def test_cut_off_counts_timed_steps_and_tells_the_partitions() -> None:
    """Two replicas of P = 2, 5 steps with 1 warm-up, f = 0.5: target ceil(0.5·2·4) = 4."""
    config = Config(partitions=2, replicas=2, ps_shards=1, epoch_fraction=0.5)
    store = _Store()
    leaders = [EpochCutoff.for_run(config, 5, 1, r, 0, store) for r in (0, 1)]
    follower = EpochCutoff.for_run(config, 5, 1, 1, 1, store)
    assert leaders[0] is not None and leaders[1] is not None and follower is not None
    assert leaders[0].target == 4
    assert leaders[0].after_step(0) == (False, None)  # warm-up: not counted
    assert [leaders[0].after_step(1), leaders[1].after_step(1), leaders[0].after_step(2)] == \
        [(False, 1), (False, 2), (False, 3)]
    assert leaders[1].after_step(2) == (True, 4)
    assert follower.after_step(1) == (False, None) and follower.after_step(2) == (True, None)
    assert EpochCutoff.for_run(Config(replicas=2, epoch_fraction=1.0), 5, 1, 0, 0, store) is None


def test_what_the_runtime_refuses() -> None:
    workload = load_workload("mlp:32-16-4")
    with pytest.raises(InputError, match="config.overlap"):
        check_runnable(workload, Config(replicas=2, ps_shards=0, sync="allreduce", overlap=True))
    with pytest.raises(InputError, match="config.epoch_fraction"):
        check_runnable(workload, Config(replicas=2, sync="ps-sync", epoch_fraction=0.8))
    check_runnable(workload, Config(replicas=2, fc_protocol="vectors", overlap=True,
                                    epoch_fraction=0.8))


def test_log_spread_by_hand() -> None:
    """ln 1 = 0 and ln e = 1: mean 1/2, sample variance 2·(1/2)² / 1 = 1/2."""
    assert log_spread([1.0, 2.718281828459045]) == pytest.approx(0.5 ** 0.5)
    assert log_spread([3.0]) == 0.0
