"""ZeRO-3's granularity as a plan field (zero3_fetch): FSDP's blocks or DeepSpeed's buckets
(model/zero3_fetch.py), counted by hand, carried by plans, engines, export and the CLI."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import dnnscale
from dnnscale.errors import InputError
from dnnscale.export.deepspeed import ds_config, export_deepspeed
from dnnscale.model import predict_plan
from dnnscale.model.predict import plan_stage_costs
from dnnscale.model.zero3_fetch import (DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET,
                                        DEEPSPEED_REDUCE_BUCKET, TensorRun, bucket_calls,
                                        largest_gather, prefetch_calls, prefetch_groups,
                                        reduce_calls)
from dnnscale.plan import modern_plan_from_dict
from dnnscale.plan.engines import (engine_differences, plan_facts, priced_zero3_fetch,
                                   search_violation)
from dnnscale.plan.modern import check_parallel_plan, modern_plan_to_dict, plan_label
from dnnscale.plan.plan import Collective, DataParallel
from dnnscale.system import load_system
from dnnscale.workload import load_workload

M = 1_000_000


def shape_of(name: str):  # type: ignore[no-untyped-def]
    return load_workload(name).transformer


def test_deepspeeds_defaults_are_its_configs() -> None:
    # deepspeed/runtime/zero/config.py: stage3_param_persistence_threshold 1e5,
    # stage3_prefetch_bucket_size 5e7, reduce_bucket_size 5e8
    assert (DEEPSPEED_PERSISTENCE_THRESHOLD, DEEPSPEED_PREFETCH_BUCKET,
            DEEPSPEED_REDUCE_BUCKET) == (100_000, 50 * M, 500 * M)


def test_a_prefetch_takes_tensors_until_it_holds_a_bucket() -> None:
    # 30 + 30 reaches 50: one call; 20 + 20 + 20 one more; the 1,000-element norm stays whole
    assert prefetch_calls([30 * M, 30 * M, 1000, 20 * M, 20 * M, 20 * M]) == 2
    # a tensor past the bucket is a call of its own, and so is each after it
    assert prefetch_calls([453 * M, 151 * M, 604 * M, 604 * M]) == 4
    # a 10 M tensor then a 453 M one: the small one waits for the large one (one call)
    assert prefetch_calls([10 * M, 453 * M, 10 * M]) == 2
    assert prefetch_calls([1000, 99_999]) == 0                 # everything persists
    assert prefetch_calls([100_000]) == 1                      # the threshold is gathered
    assert prefetch_calls([30, 30, 30], threshold=1, bucket=50) == 2


def test_the_calls_hold_what_they_gathered() -> None:
    assert prefetch_groups([30 * M, 30 * M, 1000, 20 * M, 20 * M, 20 * M]) == [60 * M, 60 * M]
    assert prefetch_groups([10 * M, 453 * M, 10 * M]) == [463 * M, 10 * M]
    assert prefetch_groups([1000]) == []
    assert largest_gather(TensorRun((10 * M, 453 * M, 10 * M)), 1) == 463 * M
    assert largest_gather(TensorRun((1000,)), 1) == 0


def test_deepspeed_memory_holds_its_largest_call_and_its_reduce_bucket() -> None:
    """A ZeRO-3 member holds its shards plus, gathered whole, the call it computes with and the
    one prefetched after it, and its whole gradients before their reduce-scatter. FSDP's call
    is a block (GPT-3 175B: 1.812 G parameters); DeepSpeed's is its largest all-gather (the
    embedding's 642.7 M, tokens and positions), and its gradients go through a reduce bucket allocated whole, 5e8
    values in the reduction's precision (fp32 here: 2 GB), whatever the model: GPT 1.3B needs
    more under DeepSpeed than under FSDP (its block is 50 M)."""
    def memory(workload: str, gpus: int, fetch: str) -> dict[str, float]:
        plan = modern_plan_from_dict({"dp": gpus, "zero": 3, "micro_batch": 1,
                                      "global_batch": gpus, "recompute": "full",
                                      "zero3_fetch": fetch})
        prediction = predict_plan(load_workload(workload),
                                  load_system(f"dgx-a100-80g:{gpus // 8}"), plan)
        return {part.name: part.bytes for part in prediction.memory}

    psi = sum(layer.params for layer in load_workload("gpt3-175b").layers)
    big = memory("gpt3-175b", 1536, "buckets")
    assert big["weights"] == pytest.approx(2 * psi / 1536 + 2 * 642_723_840 * 2)
    assert big["gradients"] == pytest.approx(4 * psi / 1536 + 500_000_000 * 4)
    fsdp = memory("gpt3-175b", 1536, "blocks")
    assert fsdp["weights"] > big["weights"] + 4e9 and fsdp["gradients"] > big["gradients"]
    psi = sum(layer.params for layer in load_workload("gpt3-1.3b").layers)
    small = memory("gpt3-1.3b", 16, "buckets")
    assert small["gradients"] == pytest.approx(4 * psi / 16 + 500_000_000 * 4)
    assert small["gradients"] > memory("gpt3-1.3b", 16, "blocks")["gradients"] + 1e9


def test_a_reduce_bucket_is_sent_before_it_would_overflow() -> None:
    # gradients arrive in reverse: 3, then 2 (5, not past 5), then 1 (would be 6): send [3, 2]
    assert reduce_calls([1, 2, 3], bucket=5) == 2
    assert reduce_calls([6, 1], bucket=5) == 2                 # a gradient past the bucket
    assert reduce_calls([], bucket=5) == 0
    assert reduce_calls([5, 5, 5], bucket=5) == 3


def test_gpt3_175b_gathers_every_weight_on_its_own() -> None:
    """GPT-3 175B's tensors: the embedding (642.7 M, tokens and positions), then per block a
    norm (24,576: whole), Q|K|V 453.0 M, the projection 151.0 M, a norm, the MLP's 604.0 M and
    604.0 M, each past the 50 M bucket: 1 + 96 · 4 = 385 all-gathers per pass where FSDP runs
    97 (96 blocks and the root). The reduce buckets (500 M) close at every weight but the
    projection, which rides with the norm before it: 386 reduce-scatters. At tp = 8 each
    tensor is an eighth: Q|K|V 56.6 M (a call), the projection 18.9 M (it waits for the MLP's
    75.5 M: one call), the MLP's second 75.5 M: 1 + 96 · 3 = 289 gathers; a block's gradients
    are 226.5 M, two blocks to a 500 M bucket (a third's first gradient would overflow it):
    48 buckets, and the embedding's 80.3 M in a 49th."""
    workload, system = load_workload("gpt3-175b"), load_system("dgx-a100-80g:2")
    plan = modern_plan_from_dict({"dp": 16, "zero": 3, "micro_batch": 1, "global_batch": 16,
                                  "zero3_fetch": "buckets"})
    (stage,) = plan_stage_costs(workload, system, plan)
    assert stage.units == 97
    assert bucket_calls(stage.tensors, 1) == (385, 386)
    assert bucket_calls(stage.tensors, 8) == (289, 49)
    # at tp = 32 a block's four tensors (14.2 + 4.7 + 18.9 + 18.9 M) fill one bucket: the
    # embedding's 20.1 M takes the first block's first three, then each call takes a block's
    # last tensor and the next block's first three, and the last block's last goes alone:
    # 1 + 95 + 1 = 97; its gradients, 8.8 blocks to a bucket (56.6 M each): 12
    assert bucket_calls(stage.tensors, 32) == (97, 12)


def test_the_search_template_orders_the_same_tensors() -> None:
    workload, system = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:1")
    plan = modern_plan_from_dict({"pp": 2, "dp": 4, "zero": 3, "micro_batch": 1,
                                  "global_batch": 8, "zero3_fetch": "buckets"})
    by_layer = plan_stage_costs(workload, system, plan, per_layer=True)
    by_template = plan_stage_costs(workload, system, plan, per_layer=False)
    tensors = [[s.tensors.tensors(1) for s in stages] for stages in (by_layer, by_template)]
    assert tensors[0] == tensors[1]
    # stage 1: the embedding (107.1 M) alone, then a call per block (50.35 M): 13
    assert [bucket_calls(s.tensors, 1)[0] for s in by_template] == [13, 12]
    assert TensorRun((5,), (((1, 2), 2),), (7,)).tensors(1) == [5, 1, 2, 1, 2, 7]
    assert TensorRun((5, 0), (), (7,)).tensors(2) == [3, 4]  # split over tp, rounded up


def test_deepspeed_buckets_cost_more_where_weights_are_large() -> None:
    """At 1,536 GPUs, GPT-3 175B's 385 gathers per pass instead of 97 each pay the latency of
    a ring through the group, so the bucketed plan is slower; on a 1.3B model the gathers are
    as many and the reductions fewer (3 against 25), so it is not slower."""
    def step(workload: str, gpus: int, fetch: str) -> float:
        plan = modern_plan_from_dict({"dp": gpus, "zero": 3, "micro_batch": 1,
                                      "global_batch": gpus, "recompute": "full",
                                      "overlap_dp": True, "zero3_fetch": fetch})
        return predict_plan(load_workload(workload), load_system(f"dgx-a100-80g:{gpus // 8}"),
                            plan).step_time_s

    assert step("gpt3-175b", 1536, "buckets") > 1.1 * step("gpt3-175b", 1536, "blocks")
    assert step("gpt3-1.3b", 64, "buckets") <= step("gpt3-1.3b", 64, "blocks")


def test_the_plan_carries_zero3_fetch() -> None:
    plan = modern_plan_from_dict({"dp": 8, "zero": 3, "global_batch": 8,
                                  "zero3_fetch": "buckets"})
    assert plan.data.aggregation == Collective("ring", 3, False, "buckets")
    as_dict = modern_plan_to_dict(plan)
    assert as_dict["zero3_fetch"] == "buckets"
    assert modern_plan_from_dict(as_dict) == plan
    assert "zero3 ds-buckets" in plan_label(plan)
    # only ZeRO-3 plans write it (the field means nothing below)
    assert "zero3_fetch" not in modern_plan_to_dict(modern_plan_from_dict({"zero": 1}))
    assert modern_plan_to_dict(modern_plan_from_dict({"zero": 3}))["zero3_fetch"] == "blocks"


@pytest.mark.parametrize("fields, message", [
    ({"zero": 1, "zero3_fetch": "buckets"}, "applies to ZeRO-3 only (zero is 1)"),
    ({"zero": 3, "zero3_fetch": "modules"}, "must be one of blocks, buckets"),
    ({"zero": 3, "zero3_fetch": ["buckets"]}, "must be one of blocks, buckets"),
])
def test_a_bad_zero3_fetch_names_its_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)) as err:
        modern_plan_from_dict(fields)
    assert err.value.field == "plan.zero3_fetch"


def test_a_plan_object_is_checked_too() -> None:
    plan = modern_plan_from_dict({"dp": 2, "zero": 3, "global_batch": 2})
    bad = plan.__class__(**{**plan.__dict__, "data": DataParallel(2, Collective(
        "ring", 3, False, "per-layer"))})
    with pytest.raises(InputError, match="must be one of blocks, buckets") as err:
        check_parallel_plan(bad)
    assert err.value.field == "plan.zero3_fetch"
    zero2 = plan.__class__(**{**plan.__dict__, "data": DataParallel(2, Collective(
        "ring", 2, False, "buckets"))})
    with pytest.raises(InputError, match="ZeRO-3 only") as err:
        check_parallel_plan(zero2)
    assert err.value.field == "plan.zero3_fetch"


def test_each_engine_prices_its_own_granularity() -> None:
    assert priced_zero3_fetch("deepspeed") == "buckets"
    assert priced_zero3_fetch("torchtitan") == priced_zero3_fetch("megatron") == "blocks"
    assert priced_zero3_fetch(None) == "blocks"
    blocks = plan_facts(modern_plan_from_dict({"dp": 8, "zero": 3, "global_batch": 8}))
    buckets = plan_facts(modern_plan_from_dict({"dp": 8, "zero": 3, "global_batch": 8,
                                                "zero3_fetch": "buckets"}))
    (deepspeed,) = engine_differences("deepspeed", blocks)
    assert deepspeed.field == "zero3_fetch" and "use zero3_fetch buckets" in deepspeed.message
    assert engine_differences("deepspeed", buckets) == ()
    assert engine_differences("torchtitan", buckets)[0].field == "zero3_fetch"
    assert search_violation("megatron", buckets) is not None
    # one replica gathers nothing: no difference to report
    alone = plan_facts(modern_plan_from_dict({"zero": 3}))
    assert engine_differences("deepspeed", alone) == ()


def test_optimize_for_deepspeed_prices_its_buckets() -> None:
    result = dnnscale.optimize("gpt3-1.3b", "dgx-a100-80g:2", global_batch=64, tp=1, pp=1,
                               zero=3, engine="deepspeed", curve=False, top=3)
    plans = [modern_plan_to_dict(entry.plan) for entry in result.top]
    assert plans and all(plan["zero3_fetch"] == "buckets" for plan in plans)
    plain = dnnscale.optimize("gpt3-1.3b", "dgx-a100-80g:2", global_batch=64, tp=1, pp=1,
                              zero=3, curve=False, top=3)
    assert all(modern_plan_to_dict(entry.plan)["zero3_fetch"] == "blocks"
               for entry in plain.top)


def test_the_deepspeed_export_writes_the_buckets_it_priced() -> None:
    plan = modern_plan_from_dict({"dp": 16, "micro_batch": 4, "global_batch": 128, "zero": 3,
                                  "precision": "bf16", "overlap_dp": True,
                                  "zero3_fetch": "buckets"})
    assert ds_config(plan)["zero_optimization"] == {
        "stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_param_persistence_threshold": 100_000, "reduce_bucket_size": 500_000_000}
    result = export_deepspeed(plan, shape_of("gpt3-1.3b"), "gpt3-1.3b")
    assert not any("zero3_fetch" in note for note in result.notes)
    fsdp = modern_plan_from_dict({**modern_plan_to_dict(plan), "zero3_fetch": "blocks"})
    result = export_deepspeed(fsdp, shape_of("gpt3-1.3b"), "gpt3-1.3b")
    assert any("use zero3_fetch buckets" in note for note in result.notes)


def test_predict_takes_zero3_fetch_on_the_command_line() -> None:
    base = [sys.executable, "-m", "dnnscale", "predict", "-w", "gpt3-1.3b", "-c",
            "dgx-a100-80g:2", "--dp", "16", "--micro-batch", "1", "--global-batch", "16"]
    done = subprocess.run(base + ["--zero", "3", "--zero3-fetch", "buckets", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"fetch": "buckets"' in done.stdout
    bad = subprocess.run(base + ["--zero", "2", "--zero3-fetch", "buckets"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip() == ("error: --zero3-fetch: zero3_fetch 'buckets' applies to "
                                  "ZeRO-3 only (zero is 2): stages 0-2 gather no sharded "
                                  "parameters")
