"""Partitioned pipeline sends (Pipeline.scatter_gather, plan field pp_scatter_gather).

By hand, on one DGX A100 node (the stages' sends cross NVLink: 231 GB/s, 0.6 µs a hop) with
SMALL_GPT's boundary tensor of s·h·b = 128·256·1 values × 2 bytes = 65,536 B:

- whole (Megatron-Core without sequence parallelism): 65,536 / 231e9 + 0.6e-6 = 0.883706 µs;
- tp = 2 under sequence parallelism, each member sends its s/t half: 32,768 / 231e9 + 0.6e-6 =
  0.741853 µs;
- tp = 2 with scatter_gather: the same half, then an all-gather of 65,536 B over the two
  members on NVLink, a ring of one step carrying 32,768 B. NCCL runs it on LL (half the link, the
  fastest hop): 32,768 / (0.5 · 231e9) + 0.6e-6 = 0.883706 µs, against LL128's 32,768 /
  (0.92 · 231e9) + 1.9e-6 = 2.054 µs and Simple's 3.542 µs; plus the collective's call cost
  (the A100 preset's 3.273413 µs). Total 0.741853 + 0.883706 + 3.273413 = 4.898972 µs;
- both (DeepSpeed partitions the s/t a member holds under sequence parallelism again): a
  quarter on the wire, 16,384 / 231e9 + 0.6e-6 = 0.670926 µs, then an all-gather of 32,768 B:
  16,384 / (0.5 · 231e9) + 0.6e-6 = 0.741853 µs, plus the call: 4.686192 µs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.export.deepspeed import ds_config, export_deepspeed
from dnnscale.model.compose import StepContext
from dnnscale.model.stage import StageCosts, StageTotals
from dnnscale.optimize.modern import groups_of, make_modern_space
from dnnscale.plan.engines import (engine_differences, plan_facts, priced_pp_scatter_gather,
                                   workload_violation)
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict, plan_label
from dnnscale.system import load_system
from dnnscale.validate.vtrain import load_rows, row_plan
from dnnscale.workload import load_workload
from dnnscale.workload.transformer import transformer_workload
from tests.test_export_engine_parsers import HAS_DEEPSPEED, run_python
from tests.test_export_moe_cp import DS_CONFIG_READER

SMALL_GPT = "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000"
NVLINK_BYTES_PER_S, NVLINK_HOP_S = 231e9, 0.6e-6
CALL_S = 3.273412844457286e-6
WHOLE_S = 65_536 / NVLINK_BYTES_PER_S + NVLINK_HOP_S
HALF_S = 32_768 / NVLINK_BYTES_PER_S + NVLINK_HOP_S
GATHER_S = 32_768 / (0.5 * NVLINK_BYTES_PER_S) + NVLINK_HOP_S


def _p2p_s(**fields) -> tuple[float, ...]:
    plan = modern_plan_from_dict({"pp": 2, "dp": 1, "micro_batch": 1, "global_batch": 4,
                                  **fields})
    stage = StageCosts(1, 1, (), 1000, StageTotals(forward_s=1e-3, input_grad_s=2e-3,
                                                   weight_grad_s=1e-3), 0)
    system = load_system("dgx-a100-80g:1")
    assert system.collective_call_s == CALL_S
    return StepContext(load_workload(SMALL_GPT), system, plan, (stage, stage)).p2p_s


def test_whole_halved_and_gathered_sends_by_hand() -> None:
    assert _p2p_s(tp=2) == pytest.approx((WHOLE_S, WHOLE_S), rel=1e-12)
    assert WHOLE_S == pytest.approx(0.883706e-6, rel=1e-6)
    assert _p2p_s(tp=2, sequence_parallel=True) == pytest.approx((HALF_S,) * 2, rel=1e-12)
    assert HALF_S == pytest.approx(0.741853e-6, rel=1e-6)
    gathered = HALF_S + GATHER_S + CALL_S
    assert gathered == pytest.approx(4.898972e-6, rel=1e-6)
    assert _p2p_s(tp=2, pp_scatter_gather=True) == pytest.approx((gathered,) * 2, rel=1e-12)
    # under sequence parallelism a member holds s/t, and partitions that again
    both = (16_384 / NVLINK_BYTES_PER_S + NVLINK_HOP_S
            + 16_384 / (0.5 * NVLINK_BYTES_PER_S) + NVLINK_HOP_S + CALL_S)
    assert both == pytest.approx(4.686192e-6, rel=1e-6)
    assert _p2p_s(tp=2, sequence_parallel=True, pp_scatter_gather=True) == \
        pytest.approx((both,) * 2, rel=1e-12)
    # one tensor member: the whole tensor whatever the flag
    assert _p2p_s(tp=1, pp_scatter_gather=True) == pytest.approx((WHOLE_S,) * 2, rel=1e-12)


def test_between_nodes_the_wire_shrinks_t_fold() -> None:
    """tp 8 × pp 2 on two DGX A100 nodes: each stage a node, the sends on HDR InfiniBand (24 GB/s,
    2.7 µs); a micro-batch of 4 sequences is 4 · 65,536 = 262,144 B. Whole: 262,144 / 24e9 +
    2.7e-6 = 13.6227 µs; partitioned, the wire carries 32,768 B (4.0653 µs) and the step's
    pp_comm shrinks with it, the gather staying on NVLink."""
    system = load_system("dgx-a100-80g:2")
    whole = dnnscale.predict(load_workload(SMALL_GPT), system,
                             dict(tp=8, pp=2, dp=1, micro_batch=4, global_batch=16))
    split = dnnscale.predict(load_workload(SMALL_GPT), system,
                             dict(tp=8, pp=2, dp=1, micro_batch=4, global_batch=16,
                                  pp_scatter_gather=True))
    m = 4
    assert whole.breakdown_s["pp_comm"] == pytest.approx(m * (262_144 / 24e9 + 2.7e-6),
                                                         rel=1e-9)
    wire = 32_768 / 24e9 + 2.7e-6
    assert wire == pytest.approx(4.0653e-6, rel=1e-4)
    gather = split.breakdown_s["pp_comm"] / m - wire
    assert 0 < gather < 262_144 / 231e9 + 8 * 3.4e-6 + CALL_S  # bounded by a Simple ring
    assert split.breakdown_s["pp_comm"] < whole.breakdown_s["pp_comm"]
    assert split.step_time_s < whole.step_time_s


def test_plan_field_round_trip_and_bad_values() -> None:
    plan = modern_plan_from_dict({"tp": 2, "pp": 2, "pp_scatter_gather": True})
    assert plan.pipeline.scatter_gather is True
    assert modern_plan_to_dict(plan)["pp_scatter_gather"] is True
    assert modern_plan_from_dict(modern_plan_to_dict(plan)) == plan
    assert "pp_scatter_gather" not in modern_plan_to_dict(modern_plan_from_dict({"pp": 2}))
    assert plan_label(plan).endswith("pp-scatter-gather")
    for bad in ("yes", 1, [True]):
        with pytest.raises(InputError, match=r"plan\.pp_scatter_gather"):
            modern_plan_from_dict({"pp": 2, "pp_scatter_gather": bad})


def test_engines_megatron_differs_deepspeed_moe_refuses() -> None:
    dense = modern_plan_from_dict({"tp": 2, "pp": 2, "dp": 2, "pp_scatter_gather": True})
    found = engine_differences("megatron", plan_facts(dense))
    assert [v.field for v in found] == ["pp_scatter_gather"]
    assert "get_tensor_shapes" in found[0].message
    with_sp = modern_plan_from_dict({"tp": 2, "pp": 2, "dp": 2, "pp_scatter_gather": True,
                                     "sequence_parallel": True})
    assert "pp_scatter_gather" in [v.field for v in
                                   engine_differences("megatron", plan_facts(with_sp))]
    titan = engine_differences("torchtitan", plan_facts(with_sp))
    assert [v.message for v in titan if v.field == "pp_scatter_gather"] == [
        "torchtitan's pipeline stages (torch.distributed.pipelining) send each member's local "
        "output whole (s/tp of the sequence under its sequence parallelism); the plan priced "
        "1/tp of it sent and all-gathered: use pp_scatter_gather false"]
    whole = modern_plan_from_dict({"tp": 2, "pp": 2, "dp": 2})
    assert "pp_scatter_gather" not in [v.field for v in
                                       engine_differences("megatron", plan_facts(whole))]
    assert "pp_scatter_gather" not in [v.field for v in
                                       engine_differences("deepspeed", plan_facts(dense))]
    moe = transformer_workload("moe", 4, 256, 8, 128, 1000, experts=4, top_k=2).transformer
    assert moe is not None
    refused = workload_violation("deepspeed", plan_facts(dense), moe)
    assert refused is not None and refused.field == "pp_scatter_gather"
    assert (priced_pp_scatter_gather("deepspeed", None), priced_pp_scatter_gather("deepspeed", moe),
            priced_pp_scatter_gather("megatron", None), priced_pp_scatter_gather(None, None)) == \
        (True, False, False, False)


def test_deepspeed_config_writes_what_the_plan_priced() -> None:
    partitioned = modern_plan_from_dict({"tp": 2, "pp": 2, "pp_scatter_gather": True})
    assert ds_config(partitioned)["pipeline"] == {"pipe_partitioned": True,
                                                  "grad_partitioned": True}
    assert ds_config(modern_plan_from_dict({"tp": 2, "pp": 2}))["pipeline"] == {
        "pipe_partitioned": False, "grad_partitioned": False}
    assert "pipeline" not in ds_config(modern_plan_from_dict({"tp": 1, "pp": 2}))


def test_the_deepspeed_search_prices_partitioned_sends() -> None:
    workload, system = load_workload(SMALL_GPT), load_system("dgx-a100-80g:2")
    space = make_modern_space(workload, system, 16, engine="deepspeed")
    assert space.pp_scatter_gather is True
    plans = [group.plan(space, 1) for group in groups_of(space, workload)]
    assert plans and all(plan.pipeline.scatter_gather for plan in plans)
    assert make_modern_space(workload, system, 16).pp_scatter_gather is False


def test_vtrain_rows_run_deepspeeds_partitioned_sends() -> None:
    assert all(row_plan(row).pipeline.scatter_gather for row in load_rows("multi")[:3])


def test_cli_flag_and_bad_yaml(tmp_path) -> None:
    run = [sys.executable, "-m", "dnnscale", "predict", "-w", SMALL_GPT, "-c", "dgx-a100-80g:2",
           "--tp", "8", "--pp", "2", "--micro-batch", "4", "--global-batch", "16", "--json"]
    whole = json.loads(subprocess.run(run, capture_output=True, text=True, timeout=120,
                                      check=True).stdout)
    split = json.loads(subprocess.run(run + ["--pp-scatter-gather"], capture_output=True,
                                      text=True, timeout=120, check=True).stdout)
    assert split["breakdown_s"]["pp_comm"] < whole["breakdown_s"]["pp_comm"]
    bad = tmp_path / "plan.yaml"
    bad.write_text("tp: 2\npp: 2\npp_scatter_gather: maybe\n")
    done = subprocess.run([sys.executable, "-m", "dnnscale", "predict", "-w", SMALL_GPT, "-c",
                           "dgx-a100-80g:1", "--config", str(bad)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "pp_scatter_gather" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (requirements.txt "
                    "pins deepspeed==0.19.8)")
def test_deepspeed_reads_the_partitioned_pipeline(tmp_path) -> None:
    """DeepSpeed's own config parser reads the export's pipeline keys as the plan priced them
    (its defaults are both true)."""
    shape = load_workload(SMALL_GPT).transformer
    argv = []
    for name, extra in (("whole", {}), ("split", {"pp_scatter_gather": True})):
        plan = modern_plan_from_dict({"tp": 2, "pp": 2, "dp": 2, "micro_batch": 1,
                                      "global_batch": 8, "zero": 1, **extra})
        result = export_deepspeed(plan, shape, "gpt", config_name=str(tmp_path / f"{name}.json"))
        (tmp_path / f"{name}.json").write_text(result.files[0].text)
        (tmp_path / f"{name}.args").write_text(result.files[1].text)
        argv += [str(tmp_path / f"{name}.json"), "2", str(tmp_path / f"{name}.args")]
    whole, split = run_python(DS_CONFIG_READER, *argv)
    assert (whole["pipeline"], split["pipeline"]) == ([False, False], [True, True])
