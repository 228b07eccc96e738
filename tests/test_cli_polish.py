"""The command line as a new user meets it: --version, -h, completion, help for every flag,
tables at full width when piped (or --width), CSV of the ranked plans, the HTML flags, and a
light start-up."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from dnnscale import __version__
from dnnscale.cli import app

runner = CliRunner()
PREDICT = ["predict", "-w", "adam-imagenet22k", "-c", "adam-2014", "-P", "4", "-R", "8", "-S",
           "4", "-n", "32"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_version_and_short_help() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"dnnscale {__version__}"
    for args in (["-h"], ["predict", "-h"], ["optimize", "-h"], ["report", "-h"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "Usage" in result.output, args


def test_every_flag_of_every_command_has_help() -> None:
    root = typer.main.get_command(app)
    missing = []

    def walk(command, path: str) -> None:
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden \
                    and not (param.help or "").strip():
                missing.append(f"{path} {param.opts[0]}")
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "dnnscale")
    assert missing == []


def test_shell_completion_completes_commands_and_flags() -> None:
    """bash completion through the script's completion variable (click's protocol)."""
    script = Path(sys.executable).with_name("dnnscale")  # the installed entry point
    if not script.exists():
        pytest.skip(f"no installed dnnscale script beside {sys.executable}")
    env = {"_DNNSCALE_COMPLETE": "complete_bash", "COMP_WORDS": "dnnscale opt", "COMP_CWORD": "1"}
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.stdout.split() == ["optimize"]
    env.update(COMP_WORDS="dnnscale predict --expl", COMP_CWORD="2")
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, **env})
    assert result.stdout.split() == ["--explain"]
    assert "--show-completion" in runner.invoke(app, ["-h"]).output


def test_piped_tables_are_not_cut_to_80_columns() -> None:
    """Piped, the top-plans table keeps each plan on one line (at 80 columns rich wrapped
    'allreduce P=1 R=120 n=32' over two); --width 60 wraps it again."""
    env = {"COLUMNS": ""}
    wide = cli("optimize", "-w", "adam-imagenet22k", "-c", "adam-2014", env=env)
    assert wide.returncode == 0, wide.stderr
    lines = wide.stdout.splitlines()
    assert any("│ 1 │ allreduce P=1 R=120 n=32 │" in line for line in lines)
    assert max(len(line) for line in lines) > 80
    narrow = cli("--width", "60", "optimize", "-w", "adam-imagenet22k", "-c", "adam-2014",
                 env=env)
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 60


def test_predict_explain_layers_and_memory_parts() -> None:
    result = runner.invoke(app, [*PREDICT, "--explain", "--layers"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "compute (sum)" in text and "What each row means" in text
    assert "idle time imposed by the parameter servers' capacity" in text  # ps wait
    assert "Per layer, on the most loaded worker" in text and "conv5_pool" in text
    assert "memory per PS machine" in text and "ps weights" in text


def test_optimize_csv(tmp_path: Path) -> None:
    out = tmp_path / "top.csv"
    result = runner.invoke(app, ["optimize", "-w", "adam-cifar10", "-c", "adam-2014", "-M", "16",
                                 "--top", "3", "--csv", str(out), "-q"])
    assert result.exit_code == 0 and result.output == ""
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [int(r["rank"]) for r in rows] == [1, 2, 3]
    data = json.loads(runner.invoke(app, ["optimize", "-w", "adam-cifar10", "-c", "adam-2014",
                                          "-M", "16", "--top", "3", "--json"]).output)
    assert [float(r["epoch_time_s"]) for r in rows] == \
        [entry["prediction"]["epoch_time_s"] for entry in data["top"]]
    piped = runner.invoke(app, ["optimize", "-w", "adam-cifar10", "-c", "adam-2014", "-M", "16",
                                "--top", "2", "--csv", "-"])
    assert piped.output.splitlines()[0].startswith("rank,plan,machines")


def test_html_flags_write_pages(tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    result = runner.invoke(app, [*PREDICT, "--html", str(page), "-q"])
    assert result.exit_code == 0 and result.output == ""
    assert page.read_text().startswith("<!DOCTYPE html>")
    result = runner.invoke(app, [*PREDICT, "--html", str(tmp_path / "no" / "such.html")])
    assert result.exit_code == 2 and "--html" in result.output


def test_report_chooses_predict_or_optimize(tmp_path: Path) -> None:
    from dnnscale.report.commands import command_for

    root = typer.main.get_command(app)
    assert command_for(["-w", "x", "-P", "4"], root) == "predict"
    assert command_for(["--tp", "8", "--pp", "8", "--dp=8", "-w", "x"], root) == "predict"
    assert command_for(["--tp", "8", "--pp", "8", "--global-batch", "64"], root) == "optimize"
    assert command_for(["-w", "x", "--machines", "64", "-n", "16,32"], root) == "optimize"
    result = runner.invoke(app, ["report", "-w", "adam-cifar10", "-c", "adam-2014", "-P", "0",
                                 "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and "--partitions" in result.output
    assert not (tmp_path / "r.html").exists()


def test_help_does_not_load_heavy_modules() -> None:
    code = ("import sys; from dnnscale.cli import main; sys.argv = ['dnnscale', '--help'];\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('numpy', 'matplotlib', 'torch', 'scipy') "
            "if m in sys.modules), file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.stderr.strip().splitlines()[-1] == "[]"


def test_gpu_search_writes_its_report_and_csv(tmp_path: Path) -> None:
    """The GPU-plan search (a transformer on GPUs) gets the same --html and --csv: its chosen
    plan's timeline per stage, its curve over GPU counts, the best plan of each family."""
    page, table = tmp_path / "gpu.html", tmp_path / "gpu.csv"
    result = runner.invoke(app, ["optimize", "-w",
                                 "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000",
                                 "-c", "dgx-a100-80g:2", "--global-batch", "64", "--top", "3",
                                 "--html", str(page), "--csv", str(table), "-q"])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert 'class="chart curve"' in html and 'class="chart timeline"' in html
    assert 'id="families"' in html and "within 16 GPUs" in html
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert len(rows) == 3 and all(r["aggregation"].startswith(("allreduce", "zero")) for r in rows)
    assert float(rows[0]["step_time_s"]) <= float(rows[1]["step_time_s"])


def test_grad_bytes_sets_the_gradient_width_the_plan_stores_and_reduces() -> None:
    """--grad-bytes 4 (fp32, Megatron's default) against 2 (bf16): the gradients' memory is
    params × width, and the all-reduce moves twice as many bytes."""
    spec = "gpt:layers=4,hidden=256,heads=4,seq=512,vocab=1000"
    out = {}
    for width in (4, 2):
        done = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "-w", spec, "-c",
                               "dgx-a100-80g:1", "--dp", "8", "--micro-batch", "1",
                               "--global-batch", "8", "--precision", "bf16",
                               "--grad-bytes", str(width), "--json"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["plan"]["precision"]["grad_bytes"] == width
        memory = {part["name"]: part["bytes"] for part in data["memory_parts"]}
        params = memory["weights"] / 2                      # bf16 weights
        assert memory["gradients"] == params * width
        out[width] = next(p["seconds"] for p in data["parts"] if p["name"] == "dp_comm")
    assert out[4] > out[2] > 0
