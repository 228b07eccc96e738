"""plan/rules.py, the one module of validity rules (issue 24): each rule by hand (accepted and
rejected, the error naming the field), loading and the search calling the same rules, and the
`--pp 7` regression: the optimizer never returns a plan that `predict` rejects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.optimize import optimize
from dnnscale.optimize.modern import (groups_of, make_modern_space, optimize_modern,
                                      replica_choices)
from dnnscale.plan import Config, check_config, check_modern_plan, check_plan
from dnnscale.plan import rules
from dnnscale.plan.config import config_from_dict
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload

SMALL = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512"
GPT125 = load_workload("gpt3-125m").transformer      # 12 layers, 12 heads, 12 key/value heads
LLAMA8 = load_workload("llama3-8b").transformer      # 32 layers, 32 heads, 8 key/value heads
A100 = load_system("dgx-a100-80g:1")                 # 8 GPUs, no fp8 units


def _field(violation: rules.Violation | None, where: str = "plan") -> str | None:
    return None if violation is None else violation.error(where).field


# --- each Megatron rule, by hand ---------------------------------------------------------------

def test_tensor_divides_heads() -> None:
    assert rules.tensor_divides_heads(4, GPT125) is None             # 12 % 4 = 0
    bad = rules.tensor_divides_heads(8, GPT125)                      # 12 % 8 = 4
    assert _field(bad) == "plan.tp" and "12 attention heads" in bad.message
    assert rules.tensor_divides_heads(8, LLAMA8) is None             # 32 % 8 = 8 % 8 = 0
    gqa = rules.tensor_divides_heads(16, LLAMA8)                     # 32 % 16 = 0, 8 % 16 = 8
    assert _field(gqa) == "plan.tp" and "8 key/value heads" in gqa.message


def test_pipeline_divides_layers() -> None:
    assert rules.pipeline_divides_layers(4, 1, 12) is None
    assert rules.pipeline_divides_layers(2, 3, 12) is None           # 2 · 3 = 6 divides 12
    seven = rules.pipeline_divides_layers(7, 1, 12)
    assert _field(seven) == "plan.pp" and seven.message == "12 layers do not divide into 7 stages"
    chunks = rules.pipeline_divides_layers(2, 4, 12)                  # 2 · 4 = 8 does not
    assert chunks is not None and chunks.message.endswith("2 stages × 4 chunks")
    assert rules.pipeline_within_layers(4, 4) is None
    assert _field(rules.pipeline_within_layers(5, 4)) == "plan.pp"


def test_batch_rules() -> None:
    assert rules.batch_divides(12, 3, 2) is None                     # 3 · 2 = 6 divides 12
    assert _field(rules.batch_divides(8, 3, 1), "config") == "config.global_batch"
    # interleaved: m = 48 / (2 · 3) = 8 micro-batches, a multiple of pp = 4 but not of pp = 3
    assert rules.batch_violation(48, 2, 3, "interleaved", 4) is None
    assert _field(rules.batch_violation(48, 2, 3, "interleaved", 3)) == "plan.global_batch"
    assert rules.batch_violation(48, 2, 3, "1f1b", 3) is None
    assert _field(rules.batch_violation(48, 5, 3, "1f1b", 1)) == "plan.global_batch"


def test_schedule_and_zero_rules() -> None:
    assert rules.schedule_virtual_stages("gpipe", 4, 1) is None
    assert _field(rules.schedule_virtual_stages("1f1b", 2, 2)) == "plan.virtual_stages"
    assert _field(rules.schedule_virtual_stages("interleaved", 1, 2)) == "plan.schedule"
    assert _field(rules.schedule_virtual_stages("interleaved", 2, 1)) == "plan.schedule"
    assert rules.schedule_virtual_stages("interleaved", 2, 2) is None
    # a group's rules together: interleaved 3 stages × 2 chunks = 6 divides 12
    assert rules.schedule_violation(3, "interleaved", 2, 12) is None
    assert _field(rules.schedule_violation(3, "interleaved", 2, 13)) == "plan.pp"
    assert _field(rules.schedule_violation(5, "1f1b", 1, 12)) == "plan.pp"
    # ZeRO-2/3 with a pipeline is a plan like any other (which engines run it: plan/engines.py)
    assert not hasattr(rules, "zero_with_pipeline")


def test_device_rules() -> None:
    assert rules.precision_on_device("bf16", A100) is None
    fp8 = rules.precision_on_device("fp8", A100)
    assert _field(fp8) == "plan.precision" and "has no fp8 units" in fp8.message
    assert rules.precision_on_device("fp8", load_system("dgx-h100:1")) is None
    assert rules.devices_within_system(2, 2, 2, A100) is None            # 8 of 8 GPUs
    whole = rules.devices_within_system(2, 2, 3, A100)                   # 12 > 8
    assert _field(whole) == "plan" and "needs 12 devices" in whole.message


def test_sequence_parallel_splits_only_a_tensor_group() -> None:
    assert rules.sequence_parallel_splits(True, 2)
    assert not rules.sequence_parallel_splits(True, 1)
    assert not rules.sequence_parallel_splits(False, 8)


# --- Adam's rules, by hand ---------------------------------------------------------------------

def test_adam_rules() -> None:
    mnist = load_workload("adam-mnist")                  # conv1: 32 channels × 28 rows
    conv1 = mnist.layers[0]
    assert rules.layer_splits_into(conv1, "channels", 32) is None
    wide = rules.layer_splits_into(conv1, "channels", 33)
    assert _field(wide, "config") == "config.partitions" and "at most 32 units" in wide.message
    rows = rules.layer_splits_into(conv1, "rows", 29)
    assert rows is not None and "29 stripes do not fit the 28 output rows" in rows.message
    assert rules.minibatch_within_epoch(60000, mnist) is None
    assert _field(rules.minibatch_within_epoch(60001, mnist), "config") == "config.minibatch"
    assert rules.shards_within_params(4, 4) is None
    assert _field(rules.shards_within_params(5, 4), "config") == "config.ps_shards"
    assert rules.ps_shards_for_sync("allreduce", 0) is None
    assert rules.ps_shards_for_sync("ps-sync", 1) is None
    assert _field(rules.ps_shards_for_sync("allreduce", 1), "config") == "config.ps_shards"
    assert _field(rules.ps_shards_for_sync("ps-async", 0), "config") == "config.ps_shards"
    assert rules.protocol_needs_ps("vectors", "ps-async") is None
    assert _field(rules.protocol_needs_ps("vectors", "allreduce"), "c") == "c.fc_protocol"


# --- loading calls the same rules --------------------------------------------------------------

@pytest.mark.parametrize("fields, field", [
    (dict(dp=3, global_batch=8), "plan.global_batch"),
    (dict(pp=2, schedule="1f1b", virtual_stages=2), "plan.virtual_stages"),
    (dict(pp=1, schedule="interleaved", virtual_stages=2), "plan.schedule"),
    (dict(pp=4, schedule="interleaved", virtual_stages=2, global_batch=6), "plan.global_batch"),
])
def test_loading_names_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as caught:
        modern_plan_from_dict(fields)
    assert caught.value.field == field


def test_check_plan_needs_the_workload_and_system() -> None:
    w = load_workload("gpt3-125m")
    check_modern_plan(modern_plan_from_dict(dict(tp=4, pp=2, dp=1)), w, A100)
    for fields, field in ((dict(pp=7), "plan.pp"), (dict(tp=8), "plan.tp"),
                          (dict(tp=4, pp=2, dp=2), "plan"), (dict(precision="fp8"),
                                                             "plan.precision")):
        with pytest.raises(InputError) as caught:
            check_plan(modern_plan_from_dict(fields), w, A100)
        assert caught.value.field == field
    for data, field in ((dict(sync="allreduce", ps_shards=2), "config.ps_shards"),
                        (dict(sync="allreduce", fc_protocol="vectors"), "config.fc_protocol")):
        with pytest.raises(InputError) as caught:
            config_from_dict(data)
        assert caught.value.field == field
    with pytest.raises(InputError) as caught:
        check_config(Config(minibatch=60001), load_workload("adam-mnist"), load_system("adam-2014"))
    assert caught.value.field == "config.minibatch"


# --- the search space: user choices the rules reject -------------------------------------------

def test_user_pp_that_does_not_divide_the_layers_is_an_error() -> None:
    w = load_workload("gpt3-125m")
    with pytest.raises(InputError) as caught:
        make_modern_space(w, A100, 8, pipeline=(1, 7))
    assert caught.value.field == "pp" and "12 layers do not divide into 7 stages" in str(caught.value)
    with pytest.raises(InputError) as caught:
        make_modern_space(w, A100, 8, tensor=(8,))
    assert caught.value.field == "tp"


def test_cli_optimize_pp_7_is_a_one_line_error_and_zero_0_is_allowed() -> None:
    """The regression of issue 24: `--pp 7` on a 12-layer model used to return TP1 PP7 DP1."""
    runner = CliRunner()
    bad = runner.invoke(app, ["optimize", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1",
                              "--pp", "7", "--global-batch", "8", "--json"])
    assert bad.exit_code == 2 and "pp: 12 layers do not divide into 7 stages" in bad.output
    good = runner.invoke(app, ["optimize", "-w", SMALL, "-c", "dgx-a100-80g:1", "--zero", "0",
                               "--global-batch", "8", "--json"])
    assert good.exit_code == 0, good.output
    assert '"zero": 0' in good.output and '"zero": 1' not in good.output


def _accepted(plan, workload, system) -> None:  # type: ignore[no-untyped-def]
    """What `predict` applies: loading the plan's fields again, and the workload/system rules."""
    again = modern_plan_from_dict(modern_plan_to_dict(plan))
    check_modern_plan(again, workload, system)


@settings(max_examples=40, deadline=None)
@given(tp=st.lists(st.integers(1, 8), min_size=1, max_size=3),
       pp=st.lists(st.integers(1, 6), min_size=1, max_size=3),
       mb=st.lists(st.integers(1, 8), min_size=1, max_size=3),
       zero=st.lists(st.integers(0, 3), min_size=1, max_size=2),
       global_batch=st.sampled_from([6, 8, 12, 16]), nodes=st.sampled_from([1, 2]))
def test_every_plan_of_the_space_is_one_predict_accepts(tp: list[int], pp: list[int],
                                                       mb: list[int], zero: list[int],
                                                       global_batch: int, nodes: int) -> None:
    """Any user choices, valid or not: the space is an InputError, or each of its plans (every
    group at every data-parallel degree the search may take) passes predict's rules."""
    w = load_workload(SMALL)                       # 4 layers, 4 heads
    system = load_system(f"dgx-a100-80g:{nodes}")
    try:
        space = make_modern_space(w, system, global_batch, tensor=tp, pipeline=pp,
                                  micro_batch=mb, zero=zero)
    except InputError as error:
        assert error.field in ("tp", "pp", "micro_batch", "zero", "schedules")
        if error.field == "tp":
            assert any(4 % t for t in tp)
        elif error.field == "pp":
            assert any(4 % p for p in pp)
        elif error.field == "micro_batch":  # one that divides no batch is in no plan
            assert any(global_batch % b for b in mb)
        else:  # every combination left open breaks a rule (ZeRO-2/3 with a pipeline)
            assert min(zero) >= 2 and min(pp) > 1
        return
    for group in groups_of(space, w):
        for replicas in replica_choices(group, space, system.machines):
            _accepted(group.plan(space, replicas), w, system)


def test_the_optimizer_returns_only_plans_predict_accepts() -> None:
    w = load_workload(SMALL)
    system = load_system("dgx-a100-80g:2")
    space = make_modern_space(w, system, 16, pipeline=(1, 2, 4), micro_batch=(1, 2, 4, 16))
    result = optimize_modern(w, system, space, top=5, pareto=True, curve=True)
    returned = (list(result.top) + [p.prediction for p in result.curve] + list(result.pareto)
                + list(result.families.values()))
    assert len(returned) > 5
    for prediction in returned:
        _accepted(prediction.plan, w, system)


def test_adams_optimizer_returns_only_configs_predict_accepts() -> None:
    w, system = load_workload("adam-mnist"), load_system("adam-2014")
    result = optimize(w, system, machines=12, top=5)
    sized = system.with_machines(12)
    returned = [result.best, *result.top, *result.families.values(),
                *(point.prediction for point in result.curve)]
    assert len(returned) > 5
    for prediction in returned:
        config = prediction.config
        assert config is not None and config.machines <= 12
        check_config(config, w, sized)


def test_issue_26_rules_name_their_field() -> None:
    """A global batch beyond one epoch, a parameter server on accelerators, a parameter server
    in a Megatron-style plan: each a Violation naming the plan field, None when it holds."""
    few = load_workload("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=100,samples=64")
    assert rules.global_batch_within_epoch(64, few) is None
    assert _field(rules.global_batch_within_epoch(65, few)) == "plan.global_batch"
    gpu, cpu = load_system("dgx-a100-80g:1"), load_system("adam-2014")
    assert rules.parameter_server_on_device(True, cpu) is None
    assert rules.parameter_server_on_device(False, gpu) is None
    assert _field(rules.parameter_server_on_device(True, gpu)) == "plan.data.aggregation"
    assert _field(rules.parameter_server_on_device(True, gpu, "sync"), "config") == "config.sync"
    assert rules.megatron_aggregation(False) is None
    assert _field(rules.megatron_aggregation(True)) == "plan.data.aggregation"
