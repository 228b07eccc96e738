"""Runtime pieces that need no processes: roles, splits, shard map, summary, input checks."""

from __future__ import annotations

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.plan import Config
from dnnscale.errors import InputError
from dnnscale.workload.splits import split_sizes
from dnnscale.runtime.layout import (ShardMap, partition_group_ranks, rank_roles,
                                     replica_group_ranks, split_offsets, world_size)
from dnnscale.runtime.netplan import (check_runnable, classes, partition_param_counts,
                                      weighted_schemes)
from dnnscale.runtime.records import summarize, worker_totals
from dnnscale.workload import build_workload, load_workload

TINY_CONV = [
    {"kind": "conv2d", "name": "c1", "out_channels": 6, "kernel": 3, "padding": 1},
    {"kind": "relu"}, {"kind": "maxpool2d", "kernel": 2}, {"kind": "flatten"},
    {"kind": "linear", "name": "fc", "out_features": 4}, {"kind": "softmax_loss"},
]


def test_split_sizes_by_hand() -> None:
    assert split_sizes(10, 3) == [4, 3, 3]
    assert split_sizes(4, 4) == [1, 1, 1, 1]
    assert split_offsets([4, 3, 3]) == [0, 4, 7]
    with pytest.raises(ValueError):
        split_sizes(2, 3)


def test_roles_and_groups() -> None:
    cfg = Config(partitions=2, replicas=3, ps_shards=2, sync="ps-async")
    roles = rank_roles(cfg)
    assert world_size(cfg) == 8 == len(roles)
    assert (roles[3].replica, roles[3].partition) == (1, 1)
    assert roles[6].kind == "ps" and roles[6].shard == 0 and roles[7].shard == 1
    assert partition_group_ranks(cfg, 2) == [4, 5]
    assert replica_group_ranks(cfg, 1) == [1, 3, 5]
    assert world_size(Config(partitions=2, replicas=2, sync="allreduce")) == 4
    assert roles[7].describe() == "parameter server (shard 1)"


@given(st.lists(st.integers(1, 50), min_size=1, max_size=5), st.integers(1, 8))
def test_shard_pieces_cover_every_parameter_once(sizes: list[int], shards: int) -> None:
    if shards > sum(sizes):
        with pytest.raises(InputError):
            ShardMap(sizes, shards)
        return
    shard_map = ShardMap(sizes, shards)
    owners: dict[int, int] = {}
    for partition, size in enumerate(sizes):
        covered = []
        for piece in shard_map.pieces_of_partition(partition):
            covered += range(piece.worker_start, piece.worker_start + piece.length)
            for k in range(piece.length):
                index = shard_map.partition_offsets[partition] + piece.worker_start + k
                assert index not in owners
                owners[index] = piece.shard
                assert shard_map.bounds[piece.shard][0] + piece.shard_start + k == index
        assert covered == list(range(size))
    assert all(shard_map.shard_of(i) == s for i, s in owners.items())
    assert sum(shard_map.shard_size(s) for s in range(shards)) == sum(sizes)


def test_partition_param_counts_by_hand() -> None:
    w = build_workload("t", [2, 4, 4], TINY_CONV, samples_per_epoch=10)
    # conv 6 channels over 2: 3·2·3·3 + 3 = 57 each; fc 6·2·2=24 -> 4 over 2: 2·24 + 2 = 50 each
    assert partition_param_counts(w, 2) == [107, 107]
    assert sum(partition_param_counts(w, 3)) == w.params
    # row stripes: every partition holds the whole conv kernel, 6·2·3·3 + 6 = 114
    rows = weighted_schemes(w, "rows")
    assert rows == {"c1": "rows", "fc": "features"}
    assert partition_param_counts(w, 2, rows) == [164, 164]
    with pytest.raises(InputError, match="run.conv_split"):
        weighted_schemes(w, "diagonal")
    assert classes(w) == 4


def test_check_runnable_names_the_field() -> None:
    w = build_workload("t", [2, 4, 4], TINY_CONV, samples_per_epoch=10)
    with pytest.raises(InputError, match="config.partitions"):
        check_runnable(w, Config(partitions=5, sync="allreduce"))
    with pytest.raises(InputError, match="config.ps_shards"):
        check_runnable(load_workload("mlp:4-2"), Config(ps_shards=11))
    with pytest.raises(InputError, match="do not fit the 2 output rows"):
        check_runnable(w, Config(partitions=3, sync="allreduce"), weighted_schemes(w, "rows"))
    # Adam's vector protocol and overlap run since issue 18; overlap only with a PS
    check_runnable(w, Config(fc_protocol="vectors", overlap=True))
    with pytest.raises(InputError, match="config.overlap"):
        check_runnable(w, Config(overlap=True, sync="allreduce"))
    generic = build_workload("g", [4], [{"kind": "generic", "output_shape": [3], "fwd_flops": 24}],
                             10)
    with pytest.raises(InputError, match=r"layers\[0\].kind"):
        check_runnable(generic, Config())


def test_worker_totals_and_summary_by_hand() -> None:
    steps = [{"type": "step", "rank": 0, "replica": 0, "partition": 0, "step": s,
              "loss": 2.0 - 0.5 * s, "samples": 10, "t_start_s": 10.0 + s, "t_end_s": 10.5 + s,
              "step_s": 0.5, "compute_s": 0.3, "partition_comm_s": 0.1, "ps_push_s": 0.05,
              "ps_pull_s": 0.05, "allreduce_s": 0.0} for s in range(3)]
    totals = worker_totals(steps, warmup=1)
    # timed steps 1 and 2: window 11.0 .. 12.5 = 1.5 s, 20 samples
    assert totals["window_s"] == pytest.approx(1.5) and totals["timed_samples"] == 20
    other = {**totals, "rank": 1, "replica": 1, "window_s": 0.5}
    summary = summarize([totals, other], config={}, workload="w", hosts=["a", "b"],
                        torch_version="x", steps=3, warmup=1, shards=[])
    assert summary["measured_throughput_samples_per_s"] == pytest.approx(20 / 1.5 + 20 / 0.5)
    assert summary["loss_first"] == 2.0 and summary["loss_last"] == 1.0
    assert summary["per_phase_s"]["compute"] == pytest.approx(0.3)
    assert summary["per_phase_s"]["step"] == pytest.approx(0.5)


def test_run_cli_rejects_bad_input() -> None:
    runner = CliRunner()
    base = ["run", "--workload", "mlp:8-4", "-P", "1", "-R", "1", "--sync", "allreduce"]
    result = runner.invoke(app, base)
    assert result.exit_code == 2 and "--local" in result.output
    result = runner.invoke(app, base + ["--local", "--steps", "3", "--warmup", "3"])
    assert result.exit_code == 2 and "--warmup" in result.output
    result = runner.invoke(app, base + ["--local", "--rank-from-env"])
    assert result.exit_code == 2
    result = runner.invoke(app, ["run", "--workload", "mlp:8-4", "-P", "9", "--local"])
    assert result.exit_code == 2 and "--partitions" in result.output


def test_missing_testbed_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", "--workload", "mlp:8-4", "--sync", "allreduce",
                                      "--testbed", str(tmp_path / "tb.yaml")])
    assert result.exit_code == 2 and "testbed" in result.output.lower()
    if find_spec("dnnscale.testbed.describe") is None:
        assert "run.testbed" in result.output


def test_cli_import_stays_free_of_torch() -> None:
    code = ("import sys, dnnscale.cli, dnnscale.runtime.commands, dnnscale.runtime.launch; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_conv_split_model_follows_the_predictor() -> None:
    from dnnscale.system import load_system
    from dnnscale.model.stage import stage_costs
    from dnnscale.runtime.commands import _conv_split

    w, c, cfg = load_workload("adam-cifar10"), load_system("adam-2014"), Config(partitions=2,
                                                                                 minibatch=4)
    expected = {layer.name: layer.scheme for layer in
                stage_costs(w, c, 2, 4).layers if layer.kind == "conv2d"}
    assert _conv_split("model", "adam-2014", w, cfg) == expected
    assert set(expected) == {"conv1", "conv2", "conv3"}
    with pytest.raises(InputError, match="--cluster"):
        _conv_split("model", None, w, cfg)
    with pytest.raises(InputError, match="--cluster"):
        _conv_split("rows", "adam-2014", w, cfg)
