"""`dnnscale export` as a user runs it: a real process, its files, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app

PLAN_YAML = ("tp: 8\npp: 8\ndp: 12\nmicro_batch: 1\nglobal_batch: 1536\nschedule: interleaved\n"
             "virtual_stages: 2\nzero: 1\nrecompute: selective\nprecision: bf16\n"
             "sequence_parallel: true\noverlap_dp: true\n")


def dnnscale(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN_YAML)
    return path


def test_megatron_args_on_stdout_notes_on_stderr(plan_file) -> None:
    result = dnnscale("export", str(plan_file), "--to", "megatron", "-w", "gpt3-175b")
    assert result.returncode == 0, result.stderr
    flags = result.stdout.splitlines()
    assert flags[:3] == ["--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 8",
                         "--num-layers-per-virtual-pipeline-stage 6"]   # 96 / (8 · 2)
    assert "--global-batch-size 1536" in flags and "--num-layers 96" in flags
    assert all(line.startswith("--") for line in flags)   # nothing but flags: $(cat FILE)
    assert "note: data-parallel size 12 is implied" in result.stderr


def test_from_optimize_json_writes_the_file(tmp_path) -> None:
    fields = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, zero=1, recompute="full",
                  precision="bf16", sequence_parallel=True, overlap_dp=False, grad_bytes=4)
    opt = tmp_path / "opt.json"
    opt.write_text(json.dumps({"workload": "llama3-70b", "cluster": "dgx-h100:16",
                               "best": {"plan_fields": fields, "prediction": {}}, "top": []}))
    out = tmp_path / "cfg" / "ds.json"
    out.parent.mkdir()
    result = dnnscale("export", str(opt), "--to", "deepspeed", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote {out}",
                                          f"wrote {out.parent / 'ds.megatron-deepspeed.args'}"]
    config = json.loads(out.read_text())
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (512, 128)
    args = (out.parent / "ds.megatron-deepspeed.args").read_text().splitlines()
    assert f"--deepspeed_config {out}" in args and "--num-key-value-heads 8" in args


def test_json_envelope_and_torchtitan(tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("workload: llama3-8b\ntp: 2\ndp: 4\nmicro_batch: 2\nglobal_batch: 16\n"
                    "zero: 3\n")
    result = dnnscale("export", str(path), "--to", "torchtitan", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["engine"] == "torchtitan" and data["world_size"] == 8 and data["written"] == []
    assert [f["name"] for f in data["files"]] == ["torchtitan.toml"]
    assert 'data_parallel_shard_degree = 4' in data["files"][0]["text"]
    assert result.stderr == ""   # the notes are in the JSON


def test_predict_json_round_trip(tmp_path) -> None:
    predicted = dnnscale("predict", "-w", "gpt3-1.3b", "-c", "dgx-a100-80g:1", "--tp", "2",
                         "--dp", "4", "--micro-batch", "2", "--global-batch", "64", "--zero",
                         "1", "--json")
    assert predicted.returncode == 0, predicted.stderr
    path = tmp_path / "pred.json"
    path.write_text(predicted.stdout)
    result = dnnscale("export", str(path), "--to", "megatron", "-w", "gpt3-1.3b")
    assert result.returncode == 0, result.stderr
    flags = result.stdout.splitlines()
    assert "--tensor-model-parallel-size 2" in flags and "--global-batch-size 64" in flags
    assert "--use-distributed-optimizer" in flags


@pytest.mark.parametrize("args, field", [
    (["--to", "megatron"], "--workload"),                                  # no workload
    (["--to", "jax", "-w", "gpt3-175b"], "--to"),
    (["--to", "deepspeed", "-w", "gpt3-175b"], "plan.schedule"),          # interleaved
    (["--to", "torchtitan", "-w", "gpt3-175b"], "plan.zero"),             # ZeRO-1
    (["--to", "megatron", "-w", "no-such-model"], "--workload"),
    (["--to", "megatron", "-w", "adam-mnist"], "--workload"),             # not a transformer
    (["--to", "deepspeed", "-w", "gpt3-175b", "--format", "torchrun"], "--format"),
    (["--to", "megatron", "-w", "gpt3-175b", "--gpus-per-node", "8"], "--gpus-per-node"),
    (["--to", "megatron", "-w", "gpt3-175b", "--format", "yaml"], "--format"),
    (["--to", "megatron", "-w", "gpt3-175b", "-o", "/no/such/folder/x.args"], "--output"),
])
def test_bad_input_is_one_line_and_exit_2(plan_file, args, field) -> None:
    result = CliRunner().invoke(app, ["export", str(plan_file), *args])   # in-process: faster
    assert result.exit_code == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), result.stderr
    assert result.stdout == ""


def test_missing_and_odd_plan_files(tmp_path) -> None:
    missing = dnnscale("export", str(tmp_path / "nope.yaml"), "--to", "megatron", "-w",
                       "gpt3-175b")
    assert missing.returncode == 2 and missing.stderr.startswith("error: plan: cannot read")
    odd = tmp_path / "odd.json"
    odd.write_text('{"best": {"plan_fields": {"tp": 8, "pp": 8, "dp": 2, "zero": 3}}}')
    result = dnnscale("export", str(odd), "--to", "megatron", "-w", "gpt3-175b")
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: plan.zero: Megatron-LM shards gradients (ZeRO-3, "
                                     "Megatron-FSDP) within one pipeline stage only (its FSDP "
                                     "adapter refuses pp > 1); use zero 0 or 1 with a pipeline")


def test_workload_mismatch_is_refused(tmp_path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("workload: llama3-8b\ntp: 2\n")
    result = dnnscale("export", str(path), "--to", "megatron", "-w", "llama3-70b")
    assert result.returncode == 2 and "the plan file names 'llama3-8b'" in result.stderr


def test_torchrun_script_output(plan_file, tmp_path) -> None:
    out = tmp_path / "launch.sh"
    result = dnnscale("export", str(plan_file), "--to", "megatron", "-w", "gpt3-175b",
                      "--format", "torchrun", "--gpus-per-node", "4", "-o", str(out))
    assert result.returncode == 0, result.stderr
    # 768 GPUs / 4 per node = 192 nodes.
    assert "torchrun --nnodes 192 --nproc-per-node 4 " in out.read_text()
    bad = dnnscale("export", str(plan_file), "--to", "megatron", "-w", "gpt3-175b",
                   "--format", "torchrun", "--gpus-per-node", "7")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --gpus-per-node: the "
                                                         "Megatron-LM job needs tp·pp·dp = 768")


def test_from_a_real_optimize_run(tmp_path) -> None:
    searched = dnnscale("optimize", "-w", "gpt3-1.3b", "-c", "dgx-a100-80g:2", "--global-batch",
                        "256", "--json", timeout=300)
    assert searched.returncode == 0, searched.stderr
    path = tmp_path / "opt.json"
    path.write_text(searched.stdout)
    best = json.loads(searched.stdout)["best"]["plan_fields"]
    result = dnnscale("export", str(path), "--to", "megatron")   # the workload from the JSON
    assert result.returncode == 0, result.stderr
    flags = result.stdout.splitlines()
    assert f"--tensor-model-parallel-size {best['tp']}" in flags
    assert f"--pipeline-model-parallel-size {best['pp']}" in flags
    assert f"--micro-batch-size {best['micro_batch']}" in flags
    assert "--global-batch-size 256" in flags and "--num-layers 24" in flags


def test_workload_yaml_given_for_a_file_that_names_it(tmp_path) -> None:
    from dnnscale.export import export_plan
    from dnnscale.workload import load_workload
    from dnnscale.workload.spec import save_workload_yaml

    yaml_path = tmp_path / "w.yaml"
    save_workload_yaml(load_workload("gpt3-125m"), yaml_path, "--output")
    plan = tmp_path / "plan.yaml"
    plan.write_text("workload: gpt3-125m\ntp: 2\ndp: 2\n")   # as optimize names it
    flags = export_plan(plan, "megatron", str(yaml_path)).files[0].text.splitlines()
    assert "--num-layers 12" in flags and "--hidden-size 768" in flags


def test_a_plan_priced_with_another_attention_kernel_says_so(tmp_path) -> None:
    """The engines run FlashAttention-2; a workload priced with the Triton kernel gets a note
    (and an fa2 workload none)."""
    spec = "gpt:layers=4,hidden=256,heads=4,seq=512,vocab=1000,flash=true"
    path = tmp_path / "plan.yaml"
    path.write_text("tp: 2\ndp: 4\nmicro_batch: 1\nglobal_batch: 8\n")
    for kernel, expected in (("triton", True), ("fa2", False)):
        result = dnnscale("export", str(path), "--to", "megatron", "-w",
                          f"{spec},attention_kernel={kernel}", "--json")
        assert result.returncode == 0, result.stderr
        notes = json.loads(result.stdout)["notes"]
        assert any("priced with the triton attention kernel" in n for n in notes) is expected
        assert "--attention-backend flash" in json.loads(result.stdout)["files"][0]["text"]
