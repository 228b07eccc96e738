"""Calibration with torch: the phase kernels, the network ranks, and `dnnscale calibrate`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from dnnscale.calibrate.compute import GridShape, call_work, calibration_grid  # noqa: E402
from dnnscale.calibrate.network import measure_allreduce, measure_p2p  # noqa: E402
from dnnscale.calibrate.ops import phase_ops  # noqa: E402
from dnnscale.system.profile import load_profile  # noqa: E402
from dnnscale.runtime.placement import local_placements  # noqa: E402


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_phase_kernels_compute_the_right_shapes() -> None:
    torch.set_num_threads(1)
    conv = GridShape("conv2d", (4, 6, 6), {"out_channels": 5, "kernel": 3, "padding": 1}, 2).layer()
    ops = phase_ops(conv, 2)
    assert set(ops) == {"forward", "input_grad", "weight_grad"}
    assert ops["forward"]().shape == (2, 5, 6, 6)
    grad_input, _, _ = ops["input_grad"]()
    assert grad_input.shape == (2, 4, 6, 6)
    _, grad_weight, grad_bias = ops["weight_grad"]()
    assert grad_weight.shape == (5, 4, 3, 3) and grad_bias.shape == (5,)
    first = GridShape("conv2d", (1, 6, 6), {"out_channels": 5, "kernel": 3}, 2,
                      needs_input_grad=False).layer()
    assert set(phase_ops(first, 2)) == {"forward", "weight_grad"}   # a first layer's phases
    pool = GridShape("maxpool2d", (3, 8, 8), {"kernel": 2, "stride": 2}, 2).layer()
    assert phase_ops(pool, 2)["input_grad"]().shape == (2, 3, 8, 8)


def test_call_work_counts_like_the_model() -> None:
    linear = GridShape("linear", (10,), {"out_features": 4}, 3).layer()
    work = call_work(linear, "weight_grad", 3)
    assert work.flops == 3 * 2 * 10 * 4                   # 240 FLOP
    assert work.activation_bytes == 3 * (10 + 4) * 4      # 168 B
    assert work.total_bytes == 168 + (10 * 4 + 4) * 4     # + 44 parameters
    assert work.output_bytes == 44 * 4


def test_quick_grid_keeps_every_required_phase() -> None:
    shapes = calibration_grid(quick=True)
    phases = {(s.kind, p) for s in shapes for p in phase_ops(s.layer(), 1)
              if s.kind in ("conv2d", "linear")}
    assert phases == {(k, p) for k in ("conv2d", "linear")
                      for p in ("forward", "input_grad", "weight_grad")}


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_local_network_measurement_over_loopback() -> None:
    fit = measure_p2p(local_placements(2), [8, 65_536, 2**20], quick=True)
    assert len(fit.points) == 3 and all(t > 0 for _, t in fit.points)
    assert fit.bandwidth_bytes_per_s > 1e7 and fit.latency_s >= 0
    reduce = measure_allreduce(local_placements(2), [4096, 2**20], quick=True)
    assert reduce.peers == 2 and reduce.bandwidth_bytes_per_s > 1e7


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_halo_exchange_over_loopback_moves_the_runtimes_rows() -> None:
    """netbench `halo` runs runtime/network.HaloExchange among 3 ranks (the middle one has two
    neighbours): the points carry the bytes each neighbour gets, and the fit is the registry's
    'halo' for two neighbours."""
    from dnnscale.calibrate.network import measure_halo_exchange

    fit = measure_halo_exchange(local_placements(3), sizes=[1024, 262_144], quick=True)
    assert (fit.operation, fit.peers) == ("halo", 2)
    assert sorted({x for x, _ in fit.points}) == [1024.0, 262_144.0]
    assert len(fit.points) == 4 and all(t > 0 for _, t in fit.points)   # forward and backward
    assert fit.bandwidth_bytes_per_s > 1e6 and fit.latency_s >= 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_collective_cpu_over_loopback() -> None:
    """netbench `cpu` times the runtime's partition collectives in CPU seconds: every
    operation gets a fit with non-negative terms from two sizes."""
    from dnnscale.calibrate.network import measure_collective_cpu

    fits = measure_collective_cpu(local_placements(2), sizes=[1024, 262_144], quick=True)
    assert [f[0] for f in fits] == ["allgather", "reduce_scatter", "halo", "allreduce",
                                    "ps_push_pull"]
    for operation, a, b, points in fits:
        assert a >= 0 and b >= 0 and all(c > 0 for _, c in points), operation
        assert len(points) == (4 if operation == "halo" else 2)


@pytest.mark.timeout(60)
def test_network_rank_failure_is_reported_and_cleaned_up() -> None:
    from dnnscale.calibrate import network

    with pytest.raises(RuntimeError, match="rank 0 failed"):
        network.run_ranks(local_placements(2), "p2p", [-5], 1, timeout_s=50)


@pytest.mark.slow
@pytest.mark.timeout(260)
def test_calibrate_quick_end_to_end(tmp_path) -> None:
    profile_path = tmp_path / "profile.yaml"
    result = _run("calibrate", "--local", "--quick", "-o", str(profile_path), "--kinds",
                  "conv2d,linear", "--allreduce-peers", "2", timeout=250)
    assert result.returncode == 0, result.stderr
    profile = load_profile(profile_path)
    assert profile.network is not None and profile.allreduce[0].peers == 2
    # the overlap and straggler benchmarks (issue 18): one size x two compute tasks, 2 replicas
    assert profile.overlap is not None and len(profile.overlap.points) == 2
    assert profile.overlap.gamma >= 1
    assert profile.stragglers is not None and len(profile.stragglers.mean_step_s) == 2
    assert profile.torch_version == torch.__version__ and profile.machine["cores"] >= 1
    assert profile.calibration["quick"] is True
    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: here\nmachines: 2\nmachine: {cores: 1, memory: 4GB}\nnetwork: {}\n"
                       f"profile: {profile_path.name}\n")
    predicted = _run("predict", "-w", "adam-mnist", "-c", str(cluster), "-P", "1", "-R", "2",
                     "-S", "0", "--sync", "allreduce", "-n", "32", "--json")
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(predicted.stdout)["throughput_samples_per_s"] > 0


@pytest.mark.parametrize("args, field", [
    (["calibrate", "-o", "x.yaml"], "calibrate: give exactly one of --local, --testbed FILE or --gpu"),
    (["calibrate", "--local", "--kinds", "pooling", "-o", "x.yaml"], "--kinds: must include"),
    (["calibrate", "--local", "--allreduce-peers", "1", "-o", "x.yaml"], "--allreduce-peers"),
])
def test_calibrate_bad_flags_exit_2(args, field) -> None:
    result = _run(*args, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {field}")


def test_testbed_that_does_not_exist_fails_clearly(tmp_path) -> None:
    result = _run("calibrate", "--testbed", str(tmp_path / "tb.yaml"), "--quick", "-o",
                  str(tmp_path / "p.yaml"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1
    if importlib.util.find_spec("dnnscale.testbed.describe") is None:
        assert result.stderr.startswith("error: --testbed: the testbed stage")
    assert not (tmp_path / "p.yaml").exists()
