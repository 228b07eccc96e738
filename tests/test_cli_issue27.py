"""Issue 27's CLI and docs: report -h lists the flags it passes on, no help renders an emoji,
optimize --csv has the GPU plans' columns, a plan file's `workload:` in predict --config,
predict -c local takes what run --local runs, the README's GPT-3 line overflows as it says, a
bare GPU preset is noted as one node, describe's activation units, and the network between
GPU nodes from the command line (a GPU cluster YAML and the inter-node flags), priced by hand.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from dnnscale.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
GPT = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=1000"
SMALL_GPT = "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})


def _commands() -> dict[str, object]:
    """Every command as `dnnscale a b` -> its click command."""
    found: dict[str, object] = {}

    def walk(command: object, path: str) -> None:
        found[path] = command
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "dnnscale")
    return found


# -- help ---------------------------------------------------------------------------------------

def test_report_help_lists_the_flags_it_passes_on() -> None:
    result = runner.invoke(app, ["report", "-h"], terminal_width=200)
    assert result.exit_code == 0, result.output
    text = result.output
    for flag in ("-w/--workload", "-c/--cluster", "-P/--partitions", "--tp", "--dp",
                 "-M/--machines", "--pareto", "--inter-node-bandwidth"):
        assert flag in text, flag
    assert "predict's own" in text and "optimize's own" in text
    listed = text[text.index("Flags passed on"):]
    for printing in ("--json", "--quiet", "--explain"):  # named only as refused
        assert listed.count(printing) == 1, printing


def test_optimize_and_predict_help_name_every_form_of_cluster_and_workload() -> None:
    commands = _commands()
    for name in ("dnnscale predict", "dnnscale optimize"):
        text = runner.invoke(app, [*name.split()[1:], "-h"], terminal_width=300).output
        helps = {param.opts[0]: param.help or "" for param in commands[name].params
                 if getattr(param, "opts", None)}
        assert "NAME:NODES" in helps["--cluster"], name
        assert "hf:" in helps["--workload"], name
        assert "NAME:NODES" in text and "hf:config.json" in text, name


EMOJI_NAME = re.compile(r":(\S+?):")


def test_no_help_text_renders_an_emoji() -> None:
    """rich replaces `:name:` by an emoji wherever `name` is one of its codes (`:factory:`
    was): no help text holds such a pair, and no command's -h output holds an emoji."""
    from rich._emoji_codes import EMOJI

    pictures = {value for value in EMOJI.values() if any(ord(ch) >= 0x1F000 for ch in value)}
    found = []
    for path, command in _commands().items():
        texts = [getattr(command, "help", None) or "", getattr(command, "short_help", None) or ""]
        texts += [getattr(param, "help", None) or "" for param in getattr(command, "params", [])]
        for text in texts:
            found += [f"{path}: :{m}:" for m in EMOJI_NAME.findall(text) if m.lower() in EMOJI]
        output = runner.invoke(app, [*path.split()[1:], "-h"], terminal_width=120).output
        found += [f"{path} -h: {ch!r}" for ch in set(output) if ord(ch) >= 0x1F000
                  or ch == "\ufe0f"]
        found += [f"{path} -h: {p!r}" for p in pictures if p in output]
    assert found == []


# -- optimize --csv --------------------------------------------------------------------------

def test_gpu_csv_has_the_gpu_plans_columns(tmp_path: Path) -> None:
    table = tmp_path / "gpu.csv"
    args = ["optimize", "-w", SMALL_GPT, "-c", "dgx-a100-80g:2", "--global-batch", "64",
            "--top", "3"]
    result = runner.invoke(app, [*args, "--csv", str(table), "-q"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert len(rows) == 3 == len(data["top"])
    for row, entry in zip(rows, data["top"]):
        prediction = entry["prediction"]
        plan = prediction["plan"]
        assert float(row["mfu"]) == prediction["mfu"]
        assert float(row["tokens_per_s"]) == prediction["tokens_per_s"]
        assert row["schedule"] == plan["pipeline"]["schedule"]
        assert int(row["virtual_stages"]) == plan["pipeline"]["virtual_stages"]
        assert int(row["zero_stage"]) == plan["data"]["aggregation"]["zero_stage"]
        assert row["recompute"] == plan["memory"]["recompute"]
        assert row["precision"] == plan["precision"]["compute"]
        assert row["sequence_parallel"] in ("True", "False")
        assert (int(row["tensor"]), int(row["pipeline"]), int(row["replicas"])) == (
            plan["tensor"]["degree"], plan["pipeline"]["stages"], plan["data"]["replicas"])
        assert int(row["micro_batch"]) == plan["batch"]["micro_batch"]
        assert float(row["memory_per_device_bytes"]) == prediction["memory_bytes"]["worker"]
        assert float(row["memory_capacity_bytes"]) == pytest.approx(85.9e9, rel=1e-3)


def test_adam_csv_leaves_the_gpu_columns_empty() -> None:
    result = runner.invoke(app, ["optimize", "-w", "adam-cifar10", "-c", "adam-2014", "-M", "16",
                                 "--top", "2", "--csv", "-"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.output)))
    assert len(rows) == 2
    for row in rows:
        assert all(row[column] == "" for column in ("schedule", "zero_stage", "mfu", "precision"))
        assert float(row["memory_per_device_bytes"]) > 0


# -- predict --config with workload: -----------------------------------------------------------

def _plan(tmp_path: Path, workload: str | None) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text((f"workload: {workload}\n" if workload else "")
                    + "tp: 1\npp: 1\ndp: 1\nmicro_batch: 1\nglobal_batch: 8\n")
    return str(path)


def test_predict_takes_a_plan_files_workload(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "gpt3-125m")
    alone = runner.invoke(app, ["predict", "--config", plan, "-c", "dgx-a100-80g:1", "--json"])
    assert alone.exit_code == 0, alone.output
    both = runner.invoke(app, ["predict", "--config", plan, "-w", "gpt3-125m", "-c",
                               "dgx-a100-80g:1", "--json"])
    assert both.exit_code == 0 and json.loads(both.output) == json.loads(alone.output)
    exported = runner.invoke(app, ["export", plan, "--to", "megatron", "-o",
                                   str(tmp_path / "m.args")])
    assert exported.exit_code == 0, exported.output  # export reads the same file


def test_predict_refuses_a_workload_that_contradicts_the_plan_file(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "gpt3-125m")
    result = cli("predict", "--config", plan, "-w", "gpt3-350m", "-c", "dgx-a100-80g:1")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: --workload: 'gpt3-350m' is workload 'gpt3-350m', "
                                    "but the --config plan file names 'gpt3-125m'")
    nothing = runner.invoke(app, ["predict", "--config", _plan(tmp_path, None), "-c",
                                  "dgx-a100-80g:1"])
    assert nothing.exit_code == 2 and "--workload: missing" in nothing.output
    (tmp_path / "bad.yaml").write_text("workload: [1]\ntp: 1\n")
    bad = runner.invoke(app, ["predict", "--config", str(tmp_path / "bad.yaml"), "-c",
                              "dgx-a100-80g:1"])
    assert bad.exit_code == 2 and "config.workload: must name a workload" in bad.output


# -- predict -c local and run --local ----------------------------------------------------------

def test_predict_on_local_takes_what_run_local_runs() -> None:
    from dnnscale.runtime.commands import MAX_LOCAL_RANKS
    from dnnscale.system import load_system

    assert load_system("local").machines == MAX_LOCAL_RANKS
    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("dnnscale run ")
                and "--local" in line)
    words = shlex.split(line.split("#")[0])[2:]
    plan = [w for w in words if w not in ("--local", "--steps", "20")]
    result = runner.invoke(app, ["predict", *plan, "-c", "local", "--json"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    assert (config["partitions"], config["replicas"], config["ps_shards"]) == (2, 2, 1)
    # 5 ranks at half a core each on 2 cores: said, on stderr
    assert result.stderr == ("note: 5 ranks share local's 2 cores, but each is priced at 0.5 "
                             "core (as if 4 did): the prediction is optimistic\n")
    four = runner.invoke(app, ["predict", "-w", "adam-cifar10", "-P", "1", "-R", "3", "-S", "1",
                               "-c", "local", "--json"])
    assert four.exit_code == 0 and four.stderr == ""


def test_optimize_on_local_defaults_to_the_ranks_its_cores_hold() -> None:
    from dnnscale.system import load_system

    local = load_system("local")
    assert (local.machines_on_host, local.default_budget) == (4, 4)
    assert load_system("adam-2014").default_budget == load_system("adam-2014").machines
    data = json.loads(runner.invoke(app, ["optimize", "-w", "adam-mnist", "-c", "local",
                                          "--json"]).stdout)
    assert max(point["machines"] for point in data["curve"]) == 4


# -- the README's GPT-3 lines ------------------------------------------------------------------

def _readme_command(marker: str) -> list[str]:
    lines = (ROOT / "README.md").read_text().splitlines()
    for i, line in enumerate(lines):
        if marker in line:
            start = i - 1 if lines[i - 1].rstrip().endswith("\\") else i
            text = " ".join(part.split("#")[0].rstrip().rstrip("\\") for part in
                            lines[start:i + 1])
            return shlex.split(text)[1:]
    raise AssertionError(f"no README line with {marker!r}")


def test_readme_gpt3_lines_show_what_they_say() -> None:
    over = runner.invoke(app, [*_readme_command("# says which memory overflows"), "--json"])
    assert over.exit_code == 0, over.output
    data = json.loads(over.output)
    assert data["fits"] is False
    parts = {p["name"]: p["bytes"] for p in data["memory_parts"] if p["role"] == "worker"}
    assert max(parts, key=parts.get) == "activations"
    assert f"activations {parts['activations'] / 1e9:.0f} GB" in (ROOT / "README.md").read_text()
    fits = runner.invoke(app, [*_readme_command("# fits: "), "--json"])
    assert fits.exit_code == 0 and json.loads(fits.output)["fits"] is True


# -- a bare GPU preset -----------------------------------------------------------------------

def test_a_bare_gpu_preset_is_noted_as_one_node() -> None:
    result = cli("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g", "--global-batch", "8",
                 "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plan"]["data"]["replicas"] == 1
    assert "note: dgx-a100-80g means 1 node (8 GPUs); write dgx-a100-80g:N for N nodes" \
        in result.stderr
    counted = cli("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--global-batch", "8",
                  "--json")
    assert counted.returncode == 0 and "note:" not in counted.stderr
    quiet = cli("optimize", "-w", "gpt3-125m", "-c", "dgx-a100-80g", "--global-batch", "8",
                "--csv", "-", "-q")
    assert quiet.returncode == 0 and quiet.stderr == ""
    failing = runner.invoke(app, ["predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g", "--tp",
                                  "5", "--json"])  # the error line alone, no note
    assert failing.exit_code == 2 and failing.stderr.startswith("error: --tp")
    assert failing.stderr.count("\n") == 1


# -- describe ----------------------------------------------------------------------------------

def test_describe_gives_activation_units() -> None:
    table = runner.invoke(app, ["describe", "adam-cifar10"], terminal_width=200)
    assert table.exit_code == 0
    assert "activation values" in table.output and "activation bytes" in table.output
    assert "per sample" in table.output and "4 B per" in table.output
    data = json.loads(runner.invoke(app, ["describe", "gpt3-125m", "--json"]).output)
    assert data["bytes_per_value"] == 2
    for layer in data["layers"]:
        assert layer["activation_bytes"] == 2 * layer["activation_values"]
    assert data["totals"]["activation_bytes"] == 2 * data["totals"]["activation_values"]


# -- the network between GPU nodes ----------------------------------------------------------

PLAN = ["--tp", "8", "--dp", "2", "--global-batch", "4"]
"""TP inside each node, DP across the two nodes: one GPU per node in each DP group, so its
all-reduce runs on the inter-node tier alone."""


def _step(*extra: str, cluster: str = "dgx-a100-80g:2") -> dict:
    result = runner.invoke(app, ["predict", "-w", GPT, "-c", cluster, *PLAN, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_slower_network_lengthens_the_dp_all_reduce_by_hand() -> None:
    """Ring all-reduce of x bytes among g = 2: 2(g-1)/g·x = x bytes at each GPU's share of
    the NICs (8 ports / 8 GPUs) times the profile's inter-node efficiency e; e from the
    preset's own 200 Gbit/s port. 200 -> 50 Gbit/s adds x/(e·6.25 GB/s) - x/(e·25 GB/s)."""
    from dnnscale.system import load_system

    e = load_system("dgx-a100-80g:2").network.bandwidth_bytes_per_s / 25e9
    base, slow = _step(), _step("--inter-node-bandwidth", "50Gbit/s")
    x = base["memory_bytes"]["gradients"]  # bf16 gradients of one GPU's shard, no ZeRO
    added = x / (e * 6.25e9) - x / (e * 25e9)
    assert slow["breakdown_s"]["dp_comm"] - base["breakdown_s"]["dp_comm"] == \
        pytest.approx(added, rel=1e-9)
    assert slow["step_time_s"] - base["step_time_s"] == pytest.approx(added, rel=1e-9)
    assert base["breakdown_s"]["tp_comm"] == slow["breakdown_s"]["tp_comm"]  # NVLink: unchanged
    # Half the ports is half each GPU's share: the same as half the line rate.
    halved = _step("--nics-per-node", "4", "--inter-node-bandwidth", "100Gbit/s")
    assert halved["step_time_s"] == pytest.approx(slow["step_time_s"], rel=1e-12)


def test_latency_adds_two_hops_per_ring_step() -> None:
    """A ring all-reduce among 2 sends 2(g-1) = 2 messages: +10 us per hop adds 20 us."""
    base = _step("--inter-node-latency", "2.7us")
    later = _step("--inter-node-latency", "12.7us")
    assert later["breakdown_s"]["dp_comm"] - base["breakdown_s"]["dp_comm"] == \
        pytest.approx(2 * 10e-6, rel=1e-6)
    assert base["step_time_s"] == _step()["step_time_s"]  # ib-hdr's own 2.7 us


def test_gpu_cluster_yaml_matches_the_flags_and_the_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("name: two-a100-nodes\nnode: dgx-a100-80g\nnodes: 2\n"
                    "inter_node: {bandwidth: 50Gbit/s, latency: 12.7us}\n")
    from_file = _step(cluster=str(path))
    flags = _step("--inter-node-bandwidth", "50Gbit/s", "--inter-node-latency", "12.7us")
    assert from_file["step_time_s"] == flags["step_time_s"]
    over = _step("--inter-node-bandwidth", "200Gbit/s", "--inter-node-latency", "2.7us",
                 cluster=str(path))
    assert over["step_time_s"] == _step()["step_time_s"]
    roce = _step("--interconnect", "roce-200")  # same rate, 0.2 us more per hop
    assert roce["breakdown_s"]["dp_comm"] - _step()["breakdown_s"]["dp_comm"] == \
        pytest.approx(2 * 0.2e-6, rel=1e-6)
    table = runner.invoke(app, ["predict", "-w", GPT, "-c", str(path), *PLAN],
                          terminal_width=200)
    assert table.exit_code == 0 and "on two-a100-nodes" in table.output
    searched = runner.invoke(app, ["optimize", "-w", GPT, "-c", str(path), "--global-batch",
                                   "8", "--inter-node-bandwidth", "25Gbit/s", "--json"])
    assert searched.exit_code == 0, searched.output


@pytest.mark.parametrize("args, line", [
    (["-c", "adam-2014", "--inter-node-bandwidth", "1Gbit/s"],
     "error: --inter-node-bandwidth: applies to GPU clusters"),
    (["-c", "dgx-a100-80g:2", "--inter-node-bandwidth", "-1Gbit/s"],
     "error: --inter-node-bandwidth: cannot read '-1Gbit/s' as a bandwidth"),
    (["-c", "dgx-a100-80g:2", "--inter-node-bandwidth", "0"],
     "error: --inter-node-bandwidth: must be > 0"),
    (["-c", "dgx-a100-80g:2", "--inter-node-latency", "3GB"],
     "error: --inter-node-latency: unknown unit"),
    (["-c", "dgx-a100-80g:2", "--nics-per-node", "0"], "error: --nics-per-node: must be >= 1"),
    (["-c", "dgx-a100-80g:2", "--interconnect", "nvlink3-nvswitch"],
     "error: --interconnect: must be one of eth-100-tcp"),
])
def test_bad_network_flags_are_one_line_exit_2(args: list[str], line: str) -> None:
    result = runner.invoke(app, ["predict", "-w", GPT, *args, "--json"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(line) and result.output.count("\n") == 1


def test_predict_says_what_an_epoch_is_and_wraps_a_long_band() -> None:
    """The console table: the epoch row says it means 300 B tokens (GPT-3's 146,484,375
    sequences of 2,048 tokens: 300e9 / 2048 = 146,484,375), and an unvalidated regime's long
    reason wraps inside the value column (VALUE_WIDTH) instead of widening the table."""
    from dnnscale.report.tables import VALUE_WIDTH

    result = cli("predict", "-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--tp", "8", "--pp", "8",
                 "--dp", "8", "--global-batch", "1536", "--zero", "1", "--recompute", "selective")
    assert result.returncode == 0, result.stderr
    assert re.search(r"an epoch is\s+│\s+300 B tokens \(146,484,375 sequences of 2,048 tokens\)",
                     result.stdout)
    assert "no validated band for this regime" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("│")]
    assert rows and max(len(line) for line in rows) <= VALUE_WIDTH + 40
