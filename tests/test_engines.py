"""Engine limits (plan/engines.py), one rule at a time with its reason; ZeRO-2/3 with a pipeline
priced as torch.distributed.pipelining runs it; `optimize --engine X` then `export --to X` for
the README's GPT-3 example, as a user runs them (real processes); the search space's switches
(--zero 0,1, --sequence-parallel, --overlap-dp)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dnnscale.cli import app
from dnnscale.errors import InputError
from dnnscale.model.data_parallel import memory_zero_stage, zero_traffic
from dnnscale.model.memory import sharded_state_parts
from dnnscale.model.predict import predict_plan
from dnnscale.plan.engines import (ENGINES, engine_differences, engine_violation, plan_facts,
                                   require_engine, runnable_engines, search_violation)
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload

BASE = dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8, precision="bf16")
README = ("-w", "gpt3-175b", "-c", "dgx-a100-80g:64", "--global-batch", "1536")


def facts(**change: object):  # type: ignore[no-untyped-def]
    return plan_facts(modern_plan_from_dict({**BASE, **change}))


def why(engine: str, **change: object) -> tuple[str, str] | None:
    violation = engine_violation(engine, facts(**change))
    return None if violation is None else (violation.field, violation.message)


# --- each limit, with its reason ---------------------------------------------------------------

@pytest.mark.parametrize("engine, change, field, words", [
    ("megatron", dict(schedule="gpipe"), "schedule", "has no GPipe schedule"),
    ("megatron", dict(precision="tf32"), "precision", "no TF32 option"),
    ("megatron", dict(precision="fp32", grad_bytes=2), "grad_bytes",
     "reduces fp32 gradients in fp32 (4 bytes), got 2"),
    ("megatron", dict(zero=2), "zero", "within one pipeline stage only"),
    ("megatron", dict(zero=3), "zero", "(ZeRO-3, Megatron-FSDP)"),
    ("deepspeed", dict(schedule="interleaved", virtual_stages=2), "schedule",
     "runs one schedule, 1F1B (its TrainSchedule); interleaved has no DeepSpeed option"),
    ("deepspeed", dict(schedule="gpipe"), "schedule", "gpipe has no DeepSpeed option"),
    ("deepspeed", dict(zero=2), "zero", "got ZeRO-2 with pp = 2"),
    ("deepspeed", dict(zero=3), "zero", "ZeRO-0 or ZeRO-1 only"),
    ("deepspeed", dict(zero=1, overlap_dp=True), "overlap_dp",
     "reduces gradients after the last micro-batch"),
    ("deepspeed", dict(pp=1, zero=0, overlap_dp=True), "overlap_dp", "only under ZeRO"),
    ("deepspeed", dict(precision="tf32"), "precision", "no TF32 option"),
    ("torchtitan", dict(zero=1), "zero", "no ZeRO-1"),
    ("torchtitan", dict(zero=0), "zero", "with tp 2 × pp 2 use zero 2 or 3"),
    ("torchtitan", dict(precision="fp16"), "precision", "fp16 has no torchtitan option"),
    ("torchtitan", dict(precision="tf32"), "precision", "no TF32 option"),
    ("megatron", dict(grad_bytes=1), "grad_bytes", "1-byte gradient reduction has no "
                                                   "Megatron-LM option"),
    ("deepspeed", dict(grad_bytes=1), "grad_bytes", "no DeepSpeed option"),
    ("torchtitan", dict(zero=2, grad_bytes=1), "grad_bytes", "no torchtitan option"),
])
def test_each_limit_names_its_field_and_reason(engine: str, change: dict[str, object],
                                                field: str, words: str) -> None:
    found = why(engine, **change)
    assert found is not None and found[0] == field and words in found[1], found
    # export refuses the same plan with the same words, naming plan.FIELD
    with pytest.raises(InputError) as caught:
        require_engine(engine, modern_plan_from_dict({**BASE, **change}))
    assert caught.value.field == f"plan.{field}" and words in caught.value.problem


@pytest.mark.parametrize("engine, change", [
    ("megatron", dict(schedule="interleaved", virtual_stages=2, zero=1, overlap_dp=True)),
    ("megatron", dict(pp=1, zero=3)),                 # Megatron-FSDP without a pipeline
    ("megatron", dict(pp=1, schedule="gpipe")),       # no pipeline, no schedule to refuse
    ("deepspeed", dict(zero=1)),                      # ZeRO-1 with a pipeline
    ("deepspeed", dict(pp=1, zero=3, overlap_dp=True)),
    ("deepspeed", dict(pp=1, schedule="gpipe")),        # no pipeline, no schedule to refuse
    ("torchtitan", dict(zero=2)),                     # FSDP2 + TP + PP
    ("torchtitan", dict(zero=3, schedule="gpipe")),
    ("torchtitan", dict(tp=1, pp=1, dp=8, zero=0)),   # DDP alone
    ("torchtitan", dict(dp=1, global_batch=4, zero=0)),  # one replica: no DDP at all
])
def test_what_each_engine_runs(engine: str, change: dict[str, object]) -> None:
    assert why(engine, **change) is None


def test_torchtitan_runs_some_plans_otherwise_than_priced() -> None:
    notes = engine_differences("torchtitan", facts(zero=2, grad_bytes=2))
    # the plans here run several micro-batches, priced with Megatron's fused accumulation
    # ... and Megatron's in-place loss, where torchtitan runs torch's cross_entropy
    assert [n.field for n in notes] == ["grad_bytes", "overlap_dp", "sequence_parallel",
                                        "grad_accumulation", "loss"]
    assert "2x the data-parallel bytes" in notes[0].message   # 4 bytes reduced / 2 priced
    # bf16 plans price fp32 gradients by default (Megatron's), as torchtitan reduces them
    assert [n.field for n in engine_differences("torchtitan", facts(zero=2))] == \
        ["overlap_dp", "sequence_parallel", "grad_accumulation", "loss"]
    assert engine_differences("torchtitan", facts(zero=2, grad_bytes=4, overlap_dp=True,
                                                  sequence_parallel=True,
                                                  grad_accumulation="add", loss="torch")) == ()
    # one replica reduces nothing; tp = 1 has no norms to shard
    assert engine_differences("torchtitan", facts(tp=1, dp=1, global_batch=4, zero=2,
                                                  grad_accumulation="add", loss="torch")) == ()
    assert engine_differences("megatron", facts(zero=1)) == ()
    assert engine_differences("deepspeed", facts(zero=1, grad_accumulation="add")) == ()
    assert [n.field for n in engine_differences("deepspeed", facts(zero=1))] == \
        ["grad_accumulation"]
    # the search leaves out what an engine cannot run, then what it runs otherwise
    assert search_violation("torchtitan", facts(zero=1)).field == "zero"
    assert search_violation("torchtitan", facts(zero=2, grad_bytes=2)).field == "grad_bytes"
    assert search_violation("torchtitan", facts(zero=2)).field == "overlap_dp"
    assert search_violation("megatron", facts(zero=1)) is None


def test_deepspeed_without_zero_is_priced_with_16_bit_gradients() -> None:
    """DeepSpeed keeps a 16-bit model's gradients in its own dtype without ZeRO (it refuses
    fp32 accumulation there), so `optimize --engine deepspeed` prices its ZeRO-0 plans at
    2 bytes a gradient; under ZeRO 1-3 the export asks for fp32 and the search keeps
    Megatron's 4."""
    import dnnscale
    from dnnscale.plan.engines import priced_grad_bytes

    for compute in ("bf16", "fp8", "fp16"):
        assert priced_grad_bytes("deepspeed", 0, compute) == 2
    assert priced_grad_bytes("deepspeed", 0, "fp32") is None
    assert [priced_grad_bytes("deepspeed", zero, "bf16") for zero in (1, 2, 3)] == [None] * 3
    assert [priced_grad_bytes("torchtitan", zero, "bf16") for zero in range(4)] == [4] * 4
    assert priced_grad_bytes("megatron", 0, "bf16") is None
    assert priced_grad_bytes(None, 0, "bf16") is None
    # a ZeRO-0 plan priced at 4 bytes runs otherwise on DeepSpeed: the search leaves it out
    assert search_violation("deepspeed", facts(tp=1, pp=1, dp=8, zero=0)).field == "grad_bytes"
    assert search_violation("deepspeed", facts(tp=1, pp=1, dp=8, zero=0, grad_bytes=2,
                                               grad_accumulation="add")) is None
    result = dnnscale.optimize("gpt3-1.3b", "dgx-a100-80g:1", global_batch=64, tp=1, pp=1,
                               zero=[0, 1], engine="deepspeed", curve=False, top=6)
    widths = {(entry.plan.data.aggregation.zero_stage, entry.plan.precision.grad_bytes)
              for entry in result.top}
    assert widths == {(0, 2), (1, 4)}
    for entry in result.top:
        parts = {part.name: part.bytes for part in entry.memory}
        # by hand: bf16 weights are 2 bytes a parameter; the whole gradient buffer of a ZeRO-0
        # member 2 bytes too, of a ZeRO-1 member (whole gradients, sharded state) 4
        width = entry.plan.precision.grad_bytes
        assert parts["gradients"] == parts["weights"] * width / 2
    # the Megatron search prices fp32 gradients at every stage
    megatron = dnnscale.optimize("gpt3-1.3b", "dgx-a100-80g:1", global_batch=64, tp=1, pp=1,
                                 zero=[0, 1], engine="megatron", curve=False, top=6)
    assert {entry.plan.precision.grad_bytes for entry in megatron.top} == {4}


def test_the_gpt3_plan_of_narayanan_runs_on_megatron_only() -> None:
    plan = modern_plan_from_dict(dict(tp=8, pp=8, dp=12, micro_batch=1, global_batch=1536,
                                      schedule="interleaved", virtual_stages=2, zero=1,
                                      recompute="selective", sequence_parallel=True,
                                      overlap_dp=True))
    found = runnable_engines(plan)
    assert list(found) == list(ENGINES) and found["megatron"] is None
    assert found["deepspeed"].field == "schedule" and found["torchtitan"].field == "zero"


# --- ZeRO-2/3 with a pipeline, priced as torch.distributed.pipelining runs it -------------------

def test_pipelined_zero_traffic_and_memory_by_hand() -> None:
    g, p, m = 6e9, 3e9, 8          # gradient bytes, parameter bytes, micro-batches
    # ZeRO-1/2 gather the updated parameters after the optimizer step (not under a backward)
    B, F, A = "backward", "forward", "after_step"
    assert zero_traffic(0, g, p, m) == (("allreduce", g, 1, B, 1),)
    assert zero_traffic(1, g, p, m) == (("reduce_scatter", g, 1, B, 1),
                                        ("allgather", p, 1, A, 1))
    assert zero_traffic(2, g, p, m) == (("reduce_scatter", g, 8, B, 1),
                                        ("allgather", p, 1, A, 1))
    assert zero_traffic(2, g, p, m, pipelined=True) == (("reduce_scatter", g, 1, B, 1),
                                                        ("allgather", p, 1, A, 1))
    # ZeRO-3: the first forward and each of the m backwards gather; one reduce-scatter; each
    # in as many collectives as the stage has FSDP units (here 25), ZeRO-1/2 in one
    assert zero_traffic(3, g, p, m, pipelined=True, units=25) == (
        ("allgather", p, 1, F, 25), ("allgather", p, 8, B, 25), ("reduce_scatter", g, 1, B, 25))
    # without a pipeline every micro-batch gathers in its forward and again in its backward
    assert zero_traffic(3, g, p, m, units=25) == (("allgather", p, 8, F, 25),
                                                  ("allgather", p, 8, B, 25),
                                                  ("reduce_scatter", g, 8, B, 25))
    assert all(t.calls == 1 for z in (0, 1, 2) for t in zero_traffic(z, g, p, m, units=25))
    assert [memory_zero_stage(z, 2) for z in range(4)] == [0, 1, 1, 1]
    assert [memory_zero_stage(z, 1) for z in range(4)] == [0, 1, 2, 3]
    # Ψ = 1e9 over d = 4 with ZeRO-1's sharding: 2Ψ + 2Ψ + 12Ψ/4 = 7e9 bytes
    parts = sharded_state_parts(1e9, 2, 2, 12, memory_zero_stage(3, 2), 4)
    assert [p.bytes for p in parts] == [2e9, 2e9, 3e9]


def test_predict_prices_zero3_with_a_pipeline() -> None:
    w, c = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:1")
    common = dict(tp=1, pp=2, dp=4, micro_batch=1, global_batch=16)
    one, three = (predict_plan(w, c, modern_plan_from_dict({**common, "zero": z}))
                  for z in (1, 3))

    def state(prediction):  # type: ignore[no-untyped-def]
        return {k: v for k, v in prediction.memory_bytes.items()
                if k in ("weights", "gradients", "optimizer_state")}

    assert state(three) == state(one)   # whole weights and gradients at the peak
    # ZeRO-3 gathers the stage's weights m + 1 = 5 times, ZeRO-1 once: more data-parallel time
    assert three.step_time_s > one.step_time_s
    # without a pipeline ZeRO-3 shards the weights: 1/8 of ZeRO-0's over 8 replicas, plus two
    # of its largest unit gathered whole (the root unit's 107,124,736 bf16 parameters: see
    # test_zero3_holds_the_largest_unit_gathered_twice_and_its_gradients_once)
    flat = {z: predict_plan(w, c, modern_plan_from_dict({**common, "pp": 1, "dp": 8, "zero": z}))
            for z in (0, 3)}
    assert flat[3].memory_bytes["weights"] == pytest.approx(
        flat[0].memory_bytes["weights"] / 8 + 2 * 107_124_736 * 2)


# --- the README's GPT-3 example, as a user runs it ---------------------------------------------

def dnnscale(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("engine", ENGINES)
def test_optimize_for_an_engine_then_export_to_it(engine: str, tmp_path: Path) -> None:
    searched = dnnscale("optimize", *README, "--engine", engine, "--json")
    assert searched.returncode == 0, searched.stderr
    best = tmp_path / "best.json"
    best.write_text(searched.stdout)
    data = json.loads(searched.stdout)
    assert data["engine"] == engine and engine in data["engines"]
    assert engine not in data["engine_notes"]    # the plan runs as it was priced
    exported = dnnscale("export", str(best), "--to", engine, "-o", str(tmp_path / "out"),
                        timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert (tmp_path / "out").read_text()


@pytest.mark.timeout(900)
def test_engine_agnostic_winner_says_which_engines_run_it(tmp_path: Path) -> None:
    searched = dnnscale("optimize", *README, "--json")
    assert searched.returncode == 0, searched.stderr
    best = tmp_path / "best.json"
    best.write_text(searched.stdout)
    data = json.loads(searched.stdout)
    assert data["engine"] is None
    assert sorted(data["engines"] + list(data["engines_refused"])) == sorted(ENGINES)
    for engine in ENGINES:   # export agrees with the list, refusing with the reason it gave
        exported = dnnscale("export", str(best), "--to", engine, "-o", str(tmp_path / engine),
                            timeout=120)
        if engine in data["engines"]:
            assert exported.returncode == 0, exported.stderr
        else:
            assert exported.returncode == 2
            assert exported.stderr.strip() == f"error: {data['engines_refused'][engine]}"


# --- the space's switches ----------------------------------------------------------------------

SMALL = ("-w", "gpt3-1.3b", "-c", "dgx-a100-80g:1", "--global-batch", "64")


def optimize_json(*flags: str) -> dict:  # type: ignore[type-arg]
    result = CliRunner().invoke(app, ["optimize", *SMALL, *flags, "--json"])
    assert result.exit_code == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def top_fields(data: dict, key: str) -> set:  # type: ignore[type-arg]
    return {p["plan_fields"][key] for p in data["top"]}


def test_zero_0_1_is_searched() -> None:
    both = optimize_json("--zero", "0,1", "--top", "8")
    assert top_fields(both, "zero") <= {0, 1}
    assert top_fields(optimize_json("--zero", "0", "--top", "8"), "zero") == {0}


def test_sequence_parallel_and_overlap_switches() -> None:
    default = optimize_json("--zero", "0,1", "--top", "8")   # both searched: the top 8 hold both
    assert top_fields(default, "sequence_parallel") == {False, True}
    assert top_fields(default, "overlap_dp") == {False, True}
    off = optimize_json("--zero", "0,1", "--sequence-parallel", "off", "--top", "8")
    assert top_fields(off, "sequence_parallel") == {False}
    sp_on = optimize_json("--zero", "0,1", "--sequence-parallel", "on", "--top", "8")
    # on: every tp > 1 plan shards its norms; tp = 1 plans stay (sequence parallelism splits
    # nothing there), without it
    assert {(p["plan_fields"]["tp"] > 1, p["plan_fields"]["sequence_parallel"])
            for p in sp_on["top"]} == {(False, False), (True, True)}
    on = optimize_json("--zero", "0,1", "--overlap-dp", "on", "--top", "8")
    assert top_fields(on, "overlap_dp") == {True}
    for flag in ("--overlap-dp", "--sequence-parallel"):
        bad = CliRunner().invoke(app, ["optimize", *SMALL, flag, "sometimes"])
        assert bad.exit_code == 2 and bad.stderr.startswith(f"error: {flag}: must be on, off")


def test_zero1_and_2_gather_the_parameters_after_the_step_where_nothing_hides_it() -> None:
    # gpt3-1.3b, dp 16 over two DGX A100 nodes, one micro-batch of 8, fp16 (2-byte gradients
    # and parameters, so the reduce-scatter and the all-gather move the same bytes: each is half
    # of ZeRO-0's all-reduce, T). With --overlap-dp the gradients' traffic travels in
    # k = ceil(2Ψ / 25 MB) buckets under a backward far longer than it (exposed: T_rs / k), and
    # the backward it hides under runs κ = 18.9 % slower (Lee et al. 2025): the hidden
    # T_rs·(k − 1)/k costs κ/(1 + κ) of itself; ZeRO-1/2's all-gather of the updated
    # parameters follows the optimizer step: all exposed.
    w, c = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:2")

    def dp_comm_s(zero: int, overlap: bool) -> float:
        plan = modern_plan_from_dict({"dp": 16, "micro_batch": 8, "global_batch": 128,
                                      "zero": zero, "overlap_dp": overlap,
                                      "precision": "fp16"})
        return predict_plan(w, c, plan).part("dp_comm")

    buckets = math.ceil(2 * w.params / 25e6)
    contention = 0.189 / 1.189

    def overlapped(comm_s: float) -> float:
        return comm_s / buckets + comm_s * (buckets - 1) / buckets * contention

    all_reduce_s, zero1_s = dp_comm_s(0, False), dp_comm_s(1, False)
    assert zero1_s == pytest.approx(all_reduce_s, rel=1e-3)     # RS + AG: an all-reduce's bytes
    assert dp_comm_s(0, True) == pytest.approx(overlapped(all_reduce_s), rel=1e-9)
    for zero in (1, 2):
        assert dp_comm_s(zero, True) == pytest.approx(overlapped(zero1_s / 2) + zero1_s / 2,
                                                      rel=1e-9)


def test_zero3_holds_the_largest_unit_gathered_twice_and_its_gradients_once() -> None:
    # gpt3-1.3b: 24 blocks of 12h² + 13h = 50,358,272 parameters (h = 2048); the root unit
    # (token and position embeddings (50,257 + 2,048)·h, tied output, final norm 2h) holds
    # 107,124,736, the largest unit. W = 24 blocks + root = 1,315,723,264. ZeRO-3 over 8, bf16
    # weights and Megatron's fp32 gradients: shards W·2/8 and W·4/8, plus two units gathered
    # (the one computing and the next, FSDP's limit_all_gathers) and one unit's gradients.
    w, c = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:1")
    unit, total = 107_124_736, 1_315_723_264
    assert w.params == total
    memory = predict_plan(w, c, modern_plan_from_dict(
        {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero": 3,
         "precision": "bf16"})).memory_bytes
    assert memory["weights"] == pytest.approx(total * 2 / 8 + 2 * unit * 2)
    assert memory["gradients"] == pytest.approx(total * 4 / 8 + unit * 4)
    assert memory["optimizer_state"] == pytest.approx(total * 12 / 8)
    zero2 = predict_plan(w, c, modern_plan_from_dict(
        {"dp": 8, "micro_batch": 1, "global_batch": 8, "zero": 2,
         "precision": "bf16"})).memory_bytes
    assert zero2["weights"] == pytest.approx(total * 2)       # no units: the weights are whole
    assert zero2["gradients"] == pytest.approx(total * 4 / 8)
