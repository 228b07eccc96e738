"""Adam's FC vector protocol in the runtime: what a worker packs for each shard, the gradient the
shard rebuilds from it (by hand, and against autograd), and real runs: the updates equal the
weight protocol's, the loss falls, and the shards receive exactly the values the model prices."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.model.vectors import flat_layout, vector_traffic
from dnnscale.runtime.layout import ShardMap
from dnnscale.runtime.network import VectorLinear
from dnnscale.runtime.records import read_records
from dnnscale.runtime.vector_protocol import pack, payload_length, piece_segments, unpack_gradient
from dnnscale.workload import build_workload, load_workload
from tests.test_runtime_modes import STEPS, check_run, run_cli


def _fc(n_in: int, n_out: int, bias: bool = True):
    return build_workload("fc", [n_in], [{"kind": "linear", "name": "fc", "out_features": n_out,
                                          "bias": bias}], samples_per_epoch=100)


def test_pack_and_unpack_by_hand() -> None:
    """Linear 3 -> 2 with bias (8 parameters: W row-major, then b) on 2 shards of 4.

    a = [[1, 2, 3], [4, 5, 6]], δ = [[1, 0], [0, 1]] (2 samples): δᵀ·a = [[1, 2, 3], [4, 5, 6]],
    Σδ = [1, 1], so the weight protocol pushes [1, 2, 3, 4] to shard 0 and [5, 6, 1, 1] to 1.
    Shard 0 holds W[0, :] and W[1, 0]: rows 0-1 (two rows: all 3 columns), 2·(2 + 3) = 10
    values. Shard 1 holds W[1, 1:3] and b: errors of rows 0-1 (the bias needs both), columns
    1-2 of row 1, 2·(2 + 2) = 8 values.
    """
    workload = _fc(3, 2)
    regions = flat_layout(workload, 1)
    shard_map = ShardMap([8], 2)
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    delta = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    unused = torch.full((8,), 99.0)  # the FC entries of the flat gradient are never read
    expected = {0: ([1, 0, 0, 1, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4]),
                1: ([1, 0, 0, 1, 2, 3, 5, 6], [5, 6, 1, 1])}
    for piece in shard_map.pieces_of_partition(0):
        segments = piece_segments(regions, shard_map, piece)
        payload = pack(segments, unused[piece.worker_start:piece.worker_start + piece.length],
                       {"fc": (a, delta)})
        sent, grad = expected[piece.shard]
        assert payload.tolist() == sent
        assert payload_length(segments, 2) == len(sent)
        assert unpack_gradient(segments, payload, 2, piece.length).tolist() == grad
    loads = vector_traffic(regions, 2, 1).shards
    assert [load.vector_values_per_sample for load in loads] == [5, 4]
    assert [load.blocks for load in loads] == [[(2, 3)], [(1, 2)]]


def _autograd_and_vectors(n_in: int, n_out: int, samples: int, seed: int):
    torch.manual_seed(seed)
    plain = torch.nn.Linear(n_in, n_out)
    captured = VectorLinear(n_in, n_out)
    captured.load_state_dict(plain.state_dict())
    captured.capture = True
    x = torch.randn(samples, n_in)
    target = torch.randn(samples, n_out)
    for module in (plain, captured):
        torch.nn.functional.mse_loss(module(x), target).backward()
    flat = torch.cat([plain.weight.grad.reshape(-1), plain.bias.grad])
    assert captured.weight.grad is None and captured.bias.grad is None
    return flat, {"fc": (captured.captured_input, captured.captured_error)}


@settings(max_examples=60, deadline=None)
@given(n_in=st.integers(1, 9), n_out=st.integers(1, 7), samples=st.integers(1, 5),
       shards=st.integers(1, 12), seed=st.integers(0, 1000))
def test_rebuilt_gradient_equals_autograd(n_in: int, n_out: int, samples: int, shards: int,
                                          seed: int) -> None:
    """Whatever the shard boundaries, the shards rebuild autograd's weight and bias gradients."""
    flat, vectors = _autograd_and_vectors(n_in, n_out, samples, seed)
    total = flat.numel()
    if shards > total:
        return
    regions = flat_layout(_fc(n_in, n_out), 1)
    shard_map = ShardMap([total], shards)
    rebuilt = torch.empty(total)
    for piece in shard_map.pieces_of_partition(0):
        segments = piece_segments(regions, shard_map, piece)
        payload = pack(segments, flat[piece.worker_start:piece.worker_start + piece.length],
                       vectors)
        assert payload.numel() == payload_length(segments, samples)
        rebuilt[piece.worker_start:piece.worker_start + piece.length] = unpack_gradient(
            segments, payload, samples, piece.length)
    assert torch.allclose(rebuilt, flat, rtol=1e-5, atol=1e-6)


def _shards(records):
    return sorted((r for r in records if r["type"] == "ps"), key=lambda r: r["shard"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_vector_protocol_updates_equal_the_weight_protocol(tmp_path) -> None:
    """P = 1, R = 1, k_pull = 1: the worker's weights are the shards' after every step, so the
    two protocols train the same trajectory: equal losses and equal shard updates (1e-5)."""
    runs = {}
    for protocol in ("weights", "vectors"):
        out = tmp_path / f"{protocol}.jsonl"
        result = run_cli(["-w", "mlp:32-16-4", "-P", "1", "-R", "1", "-S", "2", "--sync",
                          "ps-async", "-n", "8", "--steps", "3", "--warmup", "0", "--lr", "0.2",
                          "--fc-protocol", protocol, "--local", "-o", str(out)])
        assert result.returncode == 0, result.stderr
        runs[protocol] = read_records(out)
    losses = {p: [r["loss"] for r in recs if r["type"] == "step"] for p, recs in runs.items()}
    assert losses["vectors"] == pytest.approx(losses["weights"], rel=1e-5)
    for weights, vectors in zip(_shards(runs["weights"]), _shards(runs["vectors"])):
        assert vectors["param_change_l2"] == pytest.approx(weights["param_change_l2"], rel=1e-5)
        assert weights["param_change_l2"] > 0
    # 596 parameters on 2 shards of 298 (fc1 32->16 is 528 of them, fc2 16->4 the other 68):
    # shard 0 gets fc1 rows 0-9 (10 errors + 32 inputs), shard 1 fc1 rows 9-15 with all 16
    # biases (16 errors + 32 inputs) and all of fc2 (4 + 16): per push of 8 samples 8·42 = 336
    # and 8·68 = 544 values, against 298 gradients each under the weight protocol.
    assert [s["values_received"] for s in _shards(runs["weights"])] == [3 * 298, 3 * 298]
    assert [s["values_received"] for s in _shards(runs["vectors"])] == [3 * 336, 3 * 544]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_vector_protocol_trains_with_partitions_and_replicas(tmp_path) -> None:
    """P = 2, R = 2, S = 2, pushes every 2 steps: the loss falls, and every shard received the
    values model/vectors.py prices (per push: its dense gradients + n·k_push·vector values)."""
    out = tmp_path / "run.jsonl"
    result = run_cli(["-w", "mlp:32-16-4", "-P", "2", "-R", "2", "-S", "2", "--sync", "ps-async",
                      "--push-every", "2", "-n", "16", "--steps", str(STEPS), "--lr", "0.2",
                      "--fc-protocol", "vectors", "--local", "-o", str(out), "--json"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["config"]["fc_protocol"] == "vectors"
    records = read_records(out)
    check_run(records, workers=4)
    loads = vector_traffic(flat_layout(load_workload("mlp:32-16-4"), 2), 2, 2).shards
    pushes = STEPS // 2 * 2  # per shard: every replica's pushes
    for shard, load in zip(_shards(records), loads):
        assert shard["values_received"] == pushes * (load.dense_params
                                                     + 16 * 2 * load.vector_values_per_sample)
        assert shard["param_change_l2"] > 0
