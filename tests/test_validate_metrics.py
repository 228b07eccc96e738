"""Validation arithmetic: error summaries, Kendall τ, regret, and the two baselines' fits."""

from __future__ import annotations

import pytest

from dnnscale.validate.baselines import OptimusBaseline, PaleoBaseline, RunFeatures
from dnnscale.validate.metrics import error_summary, kendall_tau, regret, relative_errors


def test_error_summary_by_hand() -> None:
    errors = relative_errors([110, 95, 100, 130], [100, 100, 100, 100])
    assert errors == pytest.approx([0.10, 0.05, 0.0, 0.30])
    summary = error_summary(errors)
    assert summary["median_relative_error"] == pytest.approx(0.075)
    # sorted 0, .05, .10, .30: the 90th percentile sits 0.7 of the way from .10 to .30
    assert summary["p90_relative_error"] == pytest.approx(0.24)
    assert summary["max_relative_error"] == pytest.approx(0.30)


def test_kendall_tau_and_regret() -> None:
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # one discordant pair out of six: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(4 / 6)
    assert regret(105.0, 100.0) == pytest.approx(0.05)


def _run(sync: str, replicas: int, shards: int, flops: float, nbytes: float) -> RunFeatures:
    return RunFeatures(sync=sync, replicas=replicas, ps_shards=shards, minibatch=8,
                       flops_per_worker=flops, bytes_per_worker=nbytes)


def test_paleo_recovers_its_own_law() -> None:
    # step = 2e-9 s/FLOP · F + 5e-8 s/byte · Q exactly
    runs = [_run("ps-sync", r, 1, f, q) for r, f, q in
            [(1, 1e9, 1e6), (2, 2e9, 4e6), (4, 5e8, 8e6), (2, 3e9, 2e6)]]
    measured = [r.samples_per_step / (2e-9 * r.flops_per_worker + 5e-8 * r.bytes_per_worker)
                for r in runs]
    model = PaleoBaseline.fit(runs, measured)
    assert model.seconds_per_flop == pytest.approx(2e-9, rel=1e-6)
    assert model.seconds_per_byte == pytest.approx(5e-8, rel=1e-6)
    assert model.throughput(runs[1]) == pytest.approx(measured[1], rel=1e-6)


def test_optimus_recovers_its_own_law() -> None:
    theta = (0.01, 0.002, 0.03, 0.001, 0.004)
    runs = [_run("ps-async", w, p, 1e9, 1e6) for w, p in [(1, 1), (2, 1), (4, 2), (3, 3), (6, 2)]]

    def law(run: RunFeatures) -> float:
        tau = (theta[0] + theta[1] * run.minibatch + theta[2] * run.replicas / run.ps_shards
               + theta[3] * run.replicas + theta[4] * run.ps_shards)
        return run.replicas * run.minibatch / tau

    model = OptimusBaseline.fit(runs, [law(r) for r in runs])
    unseen = _run("ps-async", 5, 4, 1e9, 1e6)
    assert model.throughput(unseen) == pytest.approx(law(unseen), rel=1e-6)


def test_reuse_reads_only_a_matching_earlier_run(tmp_path) -> None:
    import json

    from dnnscale.plan import Config
    from dnnscale.validate.measure import _recorded_summary

    config = Config(partitions=2, replicas=1, ps_shards=1, minibatch=8)
    summary = {"type": "summary", "config": config.to_dict(), "conv_split": {"conv1": "rows"},
               "measured_throughput_samples_per_s": 12.5}
    path = tmp_path / "c01-r1.jsonl"
    path.write_text(json.dumps({"type": "start", "rank": 0}) + "\n" + json.dumps(summary) + "\n")
    assert _recorded_summary(path, config, {"conv1": "rows"}) == summary
    assert _recorded_summary(path, config, {"conv1": "channels"}) is None     # other split
    assert _recorded_summary(path, Config(partitions=1, ps_shards=1, minibatch=8),
                             {"conv1": "rows"}) is None                      # other config
    assert _recorded_summary(tmp_path / "missing.jsonl", config, {}) is None
