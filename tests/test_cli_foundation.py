"""The `describe` and `predict` commands as a user runs them: real processes, exit codes, JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PREDICT = ["predict", "-w", "adam-imagenet22k", "-c", "adam-2014", "-P", "4", "-R", "8", "-S", "4",
           "-n", "32"]


def dnnscale(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_describe_json_totals() -> None:
    result = dnnscale("describe", "adam-imagenet22k", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["totals"]["fwd_macs"] == 1_988_031_872
    assert data["layers"][0]["name"] == "conv1" and data["layers"][0]["input_grad_flops"] == 0
    assert set(data["layers"][0]) >= {"name", "kind", "input_shape", "output_shape", "params",
                                      "fwd_flops", "input_grad_flops", "weight_grad_flops",
                                      "activation_values"}


def test_describe_table_mentions_connections() -> None:
    result = dnnscale("describe", "adam-imagenet22k")
    assert result.returncode == 0
    assert "1,988,031,872 forward multiply-adds" in result.stdout.replace("\n", " ")


def test_predict_json_matches_python_api() -> None:
    import dnnscale as api

    result = dnnscale(*PREDICT, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data) >= {"config", "throughput_samples_per_s", "step_time_s", "epoch_time_s",
                         "bottleneck", "breakdown_s", "utilization", "memory_bytes", "fits"}
    expected = api.predict("adam-imagenet22k", "adam-2014",
                           api.Config(partitions=4, replicas=8, ps_shards=4, minibatch=32))
    assert data["epoch_time_s"] == pytest.approx(expected.epoch_time_s, rel=1e-12)
    assert data["config"]["partitions"] == 4 and data["bottleneck"] == expected.bottleneck


def test_predict_config_file_with_flag_override(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("partitions: 2\nreplicas: 3\nps_shards: 2\nsync: ps-sync\nminibatch: 16\n")
    result = dnnscale("predict", "-w", "adam-cifar10", "-c", "adam-2014", "--config", str(path),
                      "-R", "5", "--json")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)["config"]
    assert (config["partitions"], config["replicas"], config["sync"]) == (2, 5, "ps-sync")


def test_predict_table() -> None:
    result = dnnscale(*PREDICT)
    assert result.returncode == 0
    for text in ("throughput", "time per epoch", "bottleneck", "memory per worker"):
        assert text in result.stdout


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


CLUSTER = ("machines: 8\nmachine: {cores: 2, memory: 8GB, memory_bandwidth: 10GB/s, "
           "flops_per_core: 5GFLOP/s, update_time_per_param: 1ns}\n")


@pytest.mark.parametrize("make_args, field", [
    (lambda t: ["predict", "-w", _write(t, "w.yaml", "layers: [\n"), "-c", "local"], "workload"),
    (lambda t: ["predict", "-w", _write(t, "w.yaml", "input_shape: [4]\nsamples_per_epoch: 3\n"
                                        "layers: [{kind: transformer}]\n"), "-c", "local"],
     "workload.layers[0].kind"),
    (lambda t: ["predict", "-w", "mlp", "-c",
                _write(t, "c.yaml", CLUSTER + "network: {bandwidth: -1}\n")],
     "cluster.network.bandwidth"),
    (lambda t: ["predict", "-w", "mlp", "-c",
                _write(t, "c.yaml", CLUSTER + "network: {bandwidth: 0Gbit/s}\n")],
     "cluster.network.bandwidth"),
    (lambda t: ["predict", "-w", "adam-cifar10", "-c", "local", "-P", "1", "-R", "64", "-S",
                "1"], "config"),  # 65 ranks: more than run --local starts (64)
    (lambda t: ["predict", "-w", "adam-cifar10", "-c", "adam-2014", "-P", "12", "-S", "1"],
     "--partitions"),
    (lambda t: ["predict", "-w", "mlp", "-c", "local", "--sync", "gossip"], "--sync"),
    (lambda t: ["describe", "no-such-net"], "workload"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, make_args, field) -> None:
    result = dnnscale(*make_args(tmp_path))
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {field}:")
    assert "Traceback" not in result.stderr


def test_predict_does_not_import_torch_and_answers_fast() -> None:
    code = ("import sys, time; t = time.perf_counter(); from dnnscale.cli import app; "
            "from typer.testing import CliRunner; r = CliRunner().invoke(app, %r); "
            "assert r.exit_code == 0, r.output; "
            "print('torch' in sys.modules, time.perf_counter() - t)" % (PREDICT + ["--json"],))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    torch_loaded, _seconds = result.stdout.split()
    assert torch_loaded == "False"
