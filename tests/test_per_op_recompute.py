"""Per-operation checkpointing (`recompute: op`, torchtitan's selective_ac_option op): what it
runs again and what it keeps, by hand; which engines run it; the search and the export."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dnnscale.errors import InputError
from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.model.memory import per_op_checkpoint_bytes, transformer_block_activation_bytes
from dnnscale.model.predict import predict_plan
from dnnscale.model.stage import per_op_recompute_share
from dnnscale.plan.engines import engine_differences, engine_violation, plan_facts
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload
from dnnscale.workload.kind_record import KernelClass, record_of
from dnnscale.workload.transformer import transformer_workload

LLAMA_TINY = transformer_workload("llama-tiny", 2, 256, 4, 512, 1024, ffn=704, kv_heads=2,
                                  gated=True, norm="rmsnorm", positional="rope",
                                  flash_attention=True, bias=False, dropout=False)
ONE_GPU = dict(tp=1, pp=1, dp=1, micro_batch=2, global_batch=4, precision="bf16")


def test_kept_bytes_by_hand() -> None:
    """A Llama-3-8B block (h 4096, 32 heads, h_kv 1024, f 14336 gated), s 2048, b 1, t 1:
    input 16,777,216 + half the matmuls' outputs ½·(2·2048·(4096 + 2048 + 28672) + 2·2·2048·4096)
    = 88,080,384 + O 16,777,216 + log-sum-exp 4·32·2048 = 262,144: 121,896,960 bytes; with
    t 2 and sequence parallelism: input 8,388,608 + ½·(71,303,168 + 33,554,432) = 52,428,800 +
    scatters 16,777,216 + O 8,388,608 + 131,072 = 86,114,304."""
    s, b, h, a, h_kv, f_in = 2048, 1, 4096, 32, 1024, 2 * 14336
    assert per_op_checkpoint_bytes(s, b, h, a, h_kv, f_in, 1, False) == 121_896_960
    assert per_op_checkpoint_bytes(s, b, h, a, h_kv, f_in, 2, True) == 86_114_304
    common = dict(seq=s, micro_batch=b, hidden=h, heads=a, kv_hidden=h_kv, ffn_in=f_in,
                  ffn_out=14336, tensor=1, sequence_parallel=False, flash_attention=True)
    # between full recomputation and none, as the trade says
    kept = {rc: transformer_block_activation_bytes(recompute=rc, **common)
            for rc in ("none", "op", "full")}
    assert kept["op"] == 121_896_960
    assert kept["full"] < kept["op"] < kept["none"]


def test_recomputed_seconds_by_the_registry() -> None:
    """One H100, 2 micro-batches: per micro-batch, half of each block GEMM's forward, all of
    each memory-bound block layer's, none of the flash kernel's and nothing outside the blocks
    (the embedding, the head) is run again."""
    system = load_system("dgx-h100:1")
    expected = 0.0
    for layer in LLAMA_TINY.layers:
        if layer.hyper.get("block") is None:
            continue
        forward = gpu_phase_times_s(layer, 1.0, 2, system.machine, "bf16", 1.0)[0]
        share = {KernelClass.GEMM: 0.5, KernelClass.FLASH: 0.0}.get(record_of(layer).kernel, 1.0)
        assert per_op_recompute_share(record_of(layer).kernel) == share
        expected += share * forward
    assert expected > 0
    prediction = predict_plan(LLAMA_TINY, system,
                              modern_plan_from_dict({**ONE_GPU, "recompute": "op"}))
    assert prediction.breakdown_s["recompute"] == pytest.approx(2 * expected)
    steps = {rc: predict_plan(LLAMA_TINY, system, modern_plan_from_dict(
        {**ONE_GPU, "recompute": rc})).step_time_s for rc in ("none", "op", "full")}
    assert steps["none"] < steps["op"] < steps["full"]


def test_all_gathers_run_again_reduce_scatters_do_not() -> None:
    """TP 2 with sequence parallelism on one node: the column layers' forward all-gathers are
    run again (their whole forward exchange), the row layers' reduce-scatters are kept."""
    system = load_system("dgx-h100:1")
    plan = modern_plan_from_dict({**ONE_GPU, "tp": 2, "sequence_parallel": True,
                                  "recompute": "op"})
    record = predict_plan(LLAMA_TINY, system, plan).step_record
    assert record is not None
    layers = {cost.name: cost for cost in record.stages[0].layers}
    for name in ("block0.attn_qkv", "block0.mlp_up"):
        assert layers[name].comm_forward_s > 0
        assert layers[name].comm_forward_rerun_s == layers[name].comm_forward_s
    for name in ("block0.attn_out", "block0.mlp_down"):
        assert layers[name].comm_forward_s > 0 and layers[name].comm_forward_rerun_s == 0.0


def test_only_torchtitan_runs_it() -> None:
    """Megatron and DeepSpeed refuse op naming recompute; torchtitan runs it as priced (no
    recompute difference) and runs selective as op (a difference advising op)."""
    op = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "op"}))
    selective = plan_facts(modern_plan_from_dict({**ONE_GPU, "recompute": "selective"}))
    for engine in ("megatron", "deepspeed"):
        violation = engine_violation(engine, op)
        assert violation is not None and violation.field == "recompute"
        assert "per-operation" in violation.message
    assert engine_violation("torchtitan", op) is None
    assert "recompute" not in {d.field for d in engine_differences("torchtitan", op)}
    [advice] = [d for d in engine_differences("torchtitan", selective) if d.field == "recompute"]
    assert advice.message.endswith("use recompute op")


def test_shapes_it_is_not_priced_for_are_refused() -> None:
    """Unfused attention and mixtures of experts: an InputError naming recompute."""
    system = load_system("dgx-h100:1")
    plain = transformer_workload("plain", 2, 256, 4, 512, 1024)
    from dnnscale.plan.rules import check_modern_plan
    for workload, words in ((plain, "flash=true"), (load_workload("mixtral-8x7b"), "dense")):
        with pytest.raises(InputError) as caught:
            check_modern_plan(modern_plan_from_dict({**ONE_GPU, "recompute": "op"}), workload,
                              system)
        assert caught.value.field == "plan.recompute" and words in caught.value.problem


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=600)


def test_search_and_export_in_real_processes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`optimize --engine torchtitan` searches none, op and full (selective left out);
    `--recompute op` alone ranks op plans, whose torchtitan export is selective/op with no
    recompute note; Megatron refuses the same plan in one line, exit 2."""
    base = ("optimize", "-w", "llama3-8b", "-c", "dgx-h100:2", "--global-batch", "64",
            "--engine", "torchtitan", "--json")
    ranked = _cli(*base, "--recompute", "op")
    assert ranked.returncode == 0, ranked.stderr
    result = json.loads(ranked.stdout)
    assert {e["plan_fields"]["recompute"] for e in result["top"]} == {"op"}
    best = tmp_path / "best.json"
    best.write_text(ranked.stdout)
    exported = _cli("export", str(best), "--to", "torchtitan", "-o",
                    str(tmp_path / "torchtitan.toml"))
    assert exported.returncode == 0, exported.stderr
    toml = (tmp_path / "torchtitan.toml").read_text()
    assert 'mode = "selective"' in toml and 'selective_ac_option = "op"' in toml
    assert "use recompute op" not in exported.stderr
    assert "assumes: per-operation checkpointing:" in exported.stderr
    refused = _cli("export", str(best), "--to", "megatron")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "per-operation" in refused.stderr and "Traceback" not in refused.stderr
    everything = _cli(*base)
    assert everything.returncode == 0, everything.stderr
    assert "selective" not in {e["plan_fields"]["recompute"]
                               for e in json.loads(everything.stdout)["top"]}
