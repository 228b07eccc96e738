"""Reading the plan `export` hands on: plan files, optimize's and predict's JSON, bad files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.export.plan_source import read_plan_source
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict

FIELDS = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, schedule="1f1b",
              virtual_stages=1, zero=1, recompute="full", precision="bf16",
              sequence_parallel=True, overlap_dp=True, grad_bytes=4, ep=1, cp=1,
              cp_algorithm="ring", expert_imbalance=1.0, overlap_tp=False,
              grad_accumulation="fused", loss="inplace")


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_plan_yaml_with_workload_key(tmp_path) -> None:
    text = "workload: llama3-70b\n" + "".join(f"{k}: {json.dumps(v)}\n" for k, v in FIELDS.items())
    source = read_plan_source(write(tmp_path, "plan.yaml", text))
    assert source.workload == "llama3-70b" and source.origin == "plan file"
    assert modern_plan_to_dict(source.plan) == FIELDS
    # 512 samples / (4 replicas · 1 per micro-batch) = 128 micro-batches per step.
    assert source.plan.batch.accumulation == 128


def test_plan_file_without_workload(tmp_path) -> None:
    source = read_plan_source(write(tmp_path, "plan.yaml", "tp: 2\ndp: 2\n"))
    assert source.workload is None and source.plan.tensor.degree == 2


def test_optimize_json_best_plan_fields(tmp_path) -> None:
    other = {**FIELDS, "tp": 4}
    data = {"workload": "llama3-70b", "cluster": "dgx-h100:16",
            "best": {"plan_fields": FIELDS, "prediction": {"plan": {}}},
            "top": [{"plan_fields": other}], "evaluated": 10, "search_time_s": 0.1}
    source = read_plan_source(write(tmp_path, "opt.json", json.dumps(data)))
    assert source.origin == "optimize JSON" and source.workload == "llama3-70b"
    assert modern_plan_to_dict(source.plan) == FIELDS    # the best, not the runners-up


def test_optimize_json_falls_back_to_the_prediction_plan(tmp_path) -> None:
    plan = modern_plan_from_dict(FIELDS)
    data = {"workload": "llama3-70b", "best": {"prediction": {"plan": plan.to_dict()}}}
    source = read_plan_source(write(tmp_path, "opt.json", json.dumps(data, indent=2)))
    assert source.plan == plan


def test_an_interleaved_plan_without_pipeline_overlap_reads_back(tmp_path) -> None:
    """overlap_pp false on the interleaved schedule (predict --no-overlap-pp) survives the
    round trip through predict --json; it was refused as a field the export does not carry."""
    plan = modern_plan_from_dict(dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8,
                                      schedule="interleaved", virtual_stages=2,
                                      overlap_pp=False))
    data = {"config": None, "plan": plan.to_dict(), "step_time_s": 1.5, "fits": True}
    source = read_plan_source(write(tmp_path, "pred.json", json.dumps(data)))
    assert source.plan == plan and source.plan.pipeline.overlap_p2p is False


def test_predict_json_with_tp_overlap_exports_in_real_processes(tmp_path) -> None:
    """`predict --overlap-tp --json`, then `export --to megatron`: the plan reads back with its
    overlap (it was refused, one line naming plan.plan.tensor.overlap) and the script asks
    Megatron-LM for it."""
    run = [sys.executable, "-m", "dnnscale"]
    predicted = subprocess.run([*run, "predict", "-w", "llama3-8b", "-c", "dgx-h100:2", "--tp",
                                "2", "--dp", "8", "--global-batch", "64", "--sequence-parallel",
                                "--overlap-tp", "--json"], capture_output=True, text=True,
                               timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    plan = write(tmp_path, "pred.json", predicted.stdout)
    script = tmp_path / "run.sh"
    exported = subprocess.run([*run, "export", str(plan), "-w", "llama3-8b", "--to",
                               "megatron", "-o", str(script)], capture_output=True, text=True,
                              timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert "--tp-comm-overlap" in script.read_text()


def test_predict_json(tmp_path) -> None:
    plan = modern_plan_from_dict(dict(tp=2, dp=4, micro_batch=2, global_batch=64, zero=1))
    data = {"config": None, "plan": plan.to_dict(), "step_time_s": 1.5, "fits": True}
    source = read_plan_source(write(tmp_path, "pred.json", json.dumps(data)))
    assert source.plan == plan and source.workload is None and source.origin == "predict JSON"
    assert source.plan.batch.accumulation == 8     # 64 / (4 · 2)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2, 4]), dp=st.integers(1, 16),
       micro=st.integers(1, 4), steps=st.integers(1, 8), zero=st.integers(0, 3),
       recompute=st.sampled_from(["none", "selective", "full"]),
       precision=st.sampled_from(["fp32", "tf32", "bf16", "fp16", "fp8"]),
       sp=st.booleans(), overlap=st.booleans(), overlap_tp=st.booleans(),
       buckets=st.booleans(), accumulation=st.sampled_from(["fused", "add", "clip_add"]),
       loss=st.sampled_from(["inplace", "torch", "torch16", "fused"]),
       amp=st.sampled_from(["half", "autocast", "tf-amp"]))
def test_to_dict_reads_back_to_the_same_plan(tp, pp, dp, micro, steps, zero, recompute,
                                             precision, sp, overlap, overlap_tp, buckets,
                                             accumulation, loss, amp) -> None:
    """Every field a GPU plan carries reads back from its to_dict() (predict --json's plan),
    the tp overlap, ZeRO-3's gathers, the accumulation, the loss and the mixed-precision mode
    (with its float32 weights) too."""
    zero = zero if pp == 1 else min(zero, 1)
    fields = dict(tp=tp, pp=pp, dp=dp, micro_batch=micro, global_batch=dp * micro * steps,
                  zero=zero, recompute=recompute, precision=precision, sequence_parallel=sp,
                  overlap_dp=overlap, overlap_tp=overlap_tp and sp and tp > 1,
                  zero3_fetch="buckets" if buckets and zero == 3 else "blocks",
                  grad_accumulation=accumulation, loss=loss,
                  amp=amp if precision in ("bf16", "fp16", "fp8") else "half")
    plan = modern_plan_from_dict(fields)
    from dnnscale.export.plan_source import _from_plan_dict

    assert _from_plan_dict(plan.to_dict(), "plan") == plan


@pytest.mark.parametrize("name, text, field, words", [
    ("plan.json", "{not json", "plan", "is not JSON"),
    ("plan.json", '{"tp": NaN}', "plan", "not JSON"),
    ("plan.yaml", "- 1\n- 2\n", "plan", "must hold a mapping"),
    ("plan.yaml", "partitions: 4\nreplicas: 2\n", "plan", "no GPU plan fields"),
    ("plan.yaml", "tp: 2\nbogus: 1\n", "plan.bogus", "unknown field"),
    ("plan.yaml", "tp: 2\nworkload: 7\n", "plan.workload", "must name a workload"),
    ("plan.yaml", "tp: 2\ndp: 3\nglobal_batch: 8\n", "plan.global_batch", "not a multiple"),
    ("opt.json", '{"best": 3}', "plan.best", "must be a mapping"),
    ("opt.json", '{"best": {"prediction": {}}}', "plan.best", "neither plan_fields"),
    ("opt.json", '{"best": {"plan_fields": {"tp": "eight"}}}', "plan.best.plan_fields.tp",
     "integer"),
])
def test_bad_plan_files_are_one_line_errors(tmp_path, name, text, field, words) -> None:
    with pytest.raises(InputError) as caught:
        read_plan_source(write(tmp_path, name, text))
    assert caught.value.field == field and words in caught.value.problem
    assert "\n" not in str(caught.value)


def test_parameter_server_prediction_is_refused(tmp_path) -> None:
    from dnnscale.plan import Config

    plan = Config(partitions=2, replicas=2, ps_shards=2, minibatch=8).to_plan()
    data = {"config": {}, "plan": plan.to_dict()}
    with pytest.raises(InputError, match="parameter-server"):
        read_plan_source(write(tmp_path, "pred.json", json.dumps(data)))


def test_missing_file_and_folder(tmp_path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_plan_source(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="is a folder"):
        read_plan_source(tmp_path)
