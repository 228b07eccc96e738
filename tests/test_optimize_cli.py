"""`dnnscale optimize` on the command line: JSON, tables, plot, errors (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.optimize import optimize

runner = CliRunner()
BASE = ["optimize", "-w", "adam-mnist", "-c", "adam-2014"]


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, BASE + args + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_matches_the_python_api() -> None:
    data = _json(["-M", "24", "--top", "3"])
    api = optimize("adam-mnist", "adam-2014", machines=24, top=3)
    assert data["best"]["config"] == api.best.config.to_dict()
    assert data["best"]["prediction"]["epoch_time_s"] == api.best.epoch_time_s
    assert [entry["config"] for entry in data["top"]] == [p.config.to_dict() for p in api.top]
    assert [p["machines"] for p in data["curve"]] == list(range(1, 25))
    assert data["curve"][0]["speedup"] == 1.0
    assert data["evaluated"] > 0 and data["search_time_s"] > 0 and data["machines"] == 24


def test_choices_of_minibatch_and_intervals_are_searched() -> None:
    data = _json(["-M", "16", "--modes", "ps-async", "--minibatch", "16,64",
                  "--push-every", "1,3", "--pull-every", "2", "--top", "20"])
    configs = [entry["config"] for entry in data["top"]]
    assert {c["minibatch"] for c in configs} == {16, 64}
    assert {c["push_every"] for c in configs} == {1, 3} and {c["pull_every"] for c in configs} == {2}
    assert {c["sync"] for c in configs} == {"ps-async"}


def test_exhaustive_flag_gives_the_same_answer() -> None:
    fast = _json(["-M", "12"])
    slow = _json(["-M", "12", "--exhaustive"])
    assert slow["method"] == "exhaustive" and fast["method"] == "fast"
    assert abs(fast["best"]["prediction"]["epoch_time_s"]
               - slow["best"]["prediction"]["epoch_time_s"]) <= 1e-9 * slow["best"]["prediction"]["epoch_time_s"]
    assert [p["epoch_time_s"] for p in fast["curve"]] == [p["epoch_time_s"] for p in slow["curve"]]


def test_table_output_and_plot(tmp_path) -> None:
    plot = tmp_path / "curve.png"
    result = runner.invoke(app, BASE + ["-M", "300", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    for text in ("Fastest plan", "Why it wins", "bottleneck", "Top 5", "Scalability curve",
                 "configurations evaluated", "curve plot written"):
        assert text in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_errors_exit_2_with_one_line() -> None:
    for args, field in ((["--modes", "ps-async,bogus"], "--modes"),
                        (["--minibatch", "16,abc"], "--minibatch"),
                        (["--push-every", "0"], "--push-every"),
                        (["--optimizer", "lion"], "--optimizer"),
                        (["--machines", "0"], "--machines"),
                        (["--fc-protocol", "vectors", "--modes", "allreduce"], "--modes")):
        result = runner.invoke(app, BASE + args)
        assert result.exit_code == 2, (args, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), (args, lines)


def test_budget_too_small_is_exit_2(tmp_path) -> None:
    cluster = tmp_path / "small.yaml"
    cluster.write_text("name: small\nmachines: 8\nmachine:\n  cores: 1\n  memory: 20MB\n"
                       "  memory_bandwidth: 10GB/s\n  flops_per_core:\n    default: 1GFLOP/s\n"
                       "  update_time_per_param: 1ns\nnetwork:\n  bandwidth: 1GB/s\n"
                       "  latency: 10us\n")
    # adam-mnist needs P >= 2 within 20 MB per worker, and a PS machine beside the replica.
    result = runner.invoke(app, ["optimize", "-w", "adam-mnist", "-c", str(cluster), "-M", "2",
                                 "--modes", "ps-async"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "error: --machines: 2 machines are too few: the model needs at least 2 machines per "
        "replica to fit in worker memory and 1 parameter-server machine to hold the weights, so "
        "at least 3 machines")
    result = runner.invoke(app, ["optimize", "-w", "adam-mnist", "-c", str(cluster), "-M", "3",
                                 "--modes", "ps-async", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["best"]["config"]["partitions"] == 2


def test_cli_import_stays_light() -> None:
    code = ("import sys, dnnscale.cli, dnnscale.optimize.commands; "
            "print(sorted(m for m in ('torch', 'matplotlib', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    assert "torch" not in out.stdout and "matplotlib" not in out.stdout
