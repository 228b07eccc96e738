"""`export` of mixture-of-experts workloads and of expert- (ep) and context-parallel (cp) plans,
option by option, with each engine's limits, then fed to the engines' own parsers.

Expected values are written out by hand from the plan and the shapes; the option names are the
engines' own (docs/export.md, "Mixture of experts, ep and cp", gives each with its source file
and the commit checked). The workloads: a Mixtral-8x7B-like mixture (Jiang et al. 2024: 32
layers, hidden 4096, 32 heads, 8 key/value heads, 8 SwiGLU experts of width 14336, top-2,
vocabulary 32,000, RoPE base 10^6), at a training length of 4096 tokens; for context
parallelism Llama-3 8B (llama3-8b) with flash attention on, at its 8192 tokens.

The engines' own checks run where the engine is present, as tests/test_export_engine_parsers.py
and tests/test_export_megatron_validate.py run them (their readers and stand-ins reused), and
skip otherwise:

- Megatron-LM (``DNNSCALE_MEGATRON_LM``, a checkout): the exported torchrun scripts through
  ``parse_and_validate_args``, ``gpt_config_from_args`` and ``pretrain_cfg_container_from_args``,
  reading back the MoE and context-parallel fields of its TransformerConfig; one more stand-in:
  ``torch.cuda.get_device_capability`` answers the case's GPU (validate_args asks it for
  --moe-grouped-gemm).
- DeepSpeed 0.19.8: `DeepSpeedConfig` on each ds_config with a data-parallel group of dp · ep,
  and its `_get_expert_parallel_ranks` (a pure function) on the launch's world, TP, EP and PP.
- Megatron-DeepSpeed (``DNNSCALE_MEGATRON_DEEPSPEED``, a checkout, with six and regex):
  `parse_args` and `validate_args` on the exported flags.
- torchtitan 0.2.2: its `ConfigManager` parses each TOML, its `ParallelDims` builds the whole
  device mesh (dense, expert and data-loading meshes, with `_validate_meshes`) over a fake
  process group of the launch's world size, and its llama4 `Transformer`, built on the meta
  device from the flavor arguments the export's note gives, has the experts' widths.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from importlib.util import find_spec
from pathlib import Path

import pytest

from dnnscale.errors import InputError
from dnnscale.export.deepspeed import ds_config, export_deepspeed
from dnnscale.export.megatron import DATA_ARGS, TRAIN_ARGS, export_megatron
from dnnscale.export.plan_source import read_plan_source
from dnnscale.export.torchtitan import export_torchtitan, moe_flavor_args
from dnnscale.plan.engines import (engine_violation, plan_facts, require_engine,
                                   workload_differences, workload_violation)
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.workload import load_workload
from dnnscale.workload.transformer import transformer_workload
from tests.test_export_engine_parsers import (DEEPSPEED_READER, HAS_DEEPSPEED,
                                              HAS_MEGATRON_DEEPSPEED, HAS_TORCHTITAN,
                                              MEGATRON_DEEPSPEED, MEGATRON_DEEPSPEED_READER,
                                              run_python)
from tests.test_export_megatron_validate import (CHECKOUT, FAKE_TORCHRUN, HAS_CHECKOUT,
                                                 MEGATRON_READER)

MIXTRAL = transformer_workload(
    "mixtral-8x7b", 32, 4096, 32, 4096, 32000, ffn=14336, kv_heads=8, gated=True,
    norm="rmsnorm", positional="rope", tied_embeddings=False, bias=False, dropout=False,
    flash_attention=True, experts=8, top_k=2, rope_theta=1e6).transformer
# A variant with every MoE option in play: 16 experts of width 4096, top-1, one shared expert
# as wide as a routed one, tokens above 1.25x the mean dropped.
SWITCH = replace(MIXTRAL, experts=16, top_k=1, expert_ffn=4096, shared_ffn=4096,
                 capacity_factor=1.25)
LLAMA8 = replace(load_workload("llama3-8b").transformer, flash_attention=True)

# 32 GPUs: TP 2 × DP 2 × EP 8; 64 = 1 · 4 micro-batches · (2 · 8) sample-taking members.
EP_PLAN = dict(tp=2, pp=1, dp=2, ep=8, micro_batch=1, global_batch=64, zero=1,
               recompute="selective", precision="bf16", sequence_parallel=True, overlap_dp=True,
               grad_bytes=4)
EP_FSDP_PLAN = {**EP_PLAN, "zero": 2}            # torchtitan: ep borrows from FSDP2
# 32 GPUs: TP 2 × PP 2 × DP 2 × CP 4, ring attention; 16 = 1 · 8 · 2.
CP_PLAN = dict(tp=2, pp=2, dp=2, cp=4, micro_batch=1, global_batch=16, zero=1,
               precision="bf16", sequence_parallel=True)
# 8 GPUs: DP 2 × CP 4 by all-to-all (DeepSpeed-Ulysses), no tensor or pipeline split.
ULYSSES_PLAN = dict(tp=1, pp=1, dp=2, cp=4, cp_algorithm="alltoall", micro_batch=1,
                    global_batch=16, zero=1, precision="bf16")
# torchtitan: ring attention under FSDP2 (its CP always shards), 16 GPUs.
CP_FSDP_PLAN = dict(tp=2, pp=1, dp=2, cp=4, micro_batch=1, global_batch=16, zero=2,
                    precision="bf16", sequence_parallel=True, overlap_dp=True, grad_bytes=4)
# The SWITCH variant through a pipeline: 32 GPUs, TP 2 × PP 2 × EP 8.
SWITCH_PLAN = dict(tp=2, pp=2, dp=1, ep=8, micro_batch=1, global_batch=32, zero=1,
                   precision="bf16", sequence_parallel=True, expert_imbalance=1.5)

MIXTRAL_MODEL = [  # the model options Megatron-LM and Megatron-DeepSpeed share, in order
    "--num-layers 32", "--hidden-size 4096", "--ffn-hidden-size 14336",
    "--num-attention-heads 32", "--seq-length 4096", "--max-position-embeddings 4096",
    "--vocab-size 32000", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--attention-dropout 0", "--hidden-dropout 0"]
LLAMA8_MODEL = [
    "--num-layers 32", "--hidden-size 4096", "--ffn-hidden-size 14336",
    "--num-attention-heads 32", "--seq-length 8192", "--max-position-embeddings 8192",
    "--vocab-size 128256", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--attention-dropout 0", "--hidden-dropout 0"]
MEGATRON_LLAMA_TAIL = ["--group-query-attention", "--num-query-groups 8",
                       "--normalization RMSNorm", "--position-embedding-type rope"]
DEEPSPEED_LLAMA_TAIL = ["--num-key-value-heads 8", "--normalization rmsnorm",
                        "--use-rotary-position-embeddings", "--no-position-embedding"]


def plan_of(fields: dict):  # type: ignore[no-untyped-def]
    return modern_plan_from_dict(fields)


def lines(text: str) -> list[str]:
    return text.splitlines()


# --- Megatron-LM -----------------------------------------------------------------------------

def test_megatron_mixtral_ep8_every_option() -> None:
    result = export_megatron(plan_of(EP_PLAN), MIXTRAL, "mixtral-8x7b")
    assert result.world_size == 2 * 1 * 2 * 8 == 32
    assert lines(result.files[0].text) == [
        "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 1",
        "--sequence-parallel",
        "--expert-model-parallel-size 8",       # 8 experts, one per EP member
        "--micro-batch-size 1",
        "--global-batch-size 64",               # Megatron: 64 / (1 · DP 16) = 4 micro-batches
        "--use-distributed-optimizer", "--overlap-grad-reduce",
        "--recompute-granularity selective", "--recompute-modules core_attn",
        "--bf16",                               # 4-byte gradients: no --grad-reduce-in-bf16
        *MIXTRAL_MODEL, *MEGATRON_LLAMA_TAIL,
        "--rotary-base 1000000", "--attention-backend flash",
        "--num-experts 8", "--moe-router-topk 2",
        # experts as wide as --ffn-hidden-size: no --moe-ffn-hidden-size; dropless: no capacity
        "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall"]
    notes = " | ".join(result.notes)
    # Megatron's DP = world / (TP·PP) = 16: the EP members take different samples.
    assert "data-parallel size dp·ep = 2·8 = 16 is implied: launch tp·pp·dp·ep = 2·1·2·8 = 32" \
        in notes
    assert "uniform routing (expert_imbalance 1)" in notes and "--moe-aux-loss-coeff" in notes


def test_megatron_moe_options_of_the_variant() -> None:
    flags = lines(export_megatron(plan_of(SWITCH_PLAN), SWITCH, "switch").files[0].text)
    assert flags[flags.index("--num-experts 16"):] == [
        "--num-experts 16", "--moe-router-topk 1",
        "--moe-router-pre-softmax",             # TransformerConfig refuses top-1 without it
        "--moe-ffn-hidden-size 4096",           # routed width, not --ffn-hidden-size 14336
        "--moe-shared-expert-intermediate-size 4096",
        "--moe-expert-capacity-factor 1.25",    # dropped above it, not padded to it
        "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall"]
    assert "--ffn-hidden-size 14336" in flags and "--expert-model-parallel-size 8" in flags


def test_megatron_cp4_ring_and_alltoall() -> None:
    result = export_megatron(plan_of(CP_PLAN), LLAMA8, "llama3-8b")
    assert result.world_size == 2 * 2 * 2 * 4 == 32
    assert lines(result.files[0].text) == [
        "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2",
        "--sequence-parallel",
        "--context-parallel-size 4", "--cp-comm-type p2p",     # ring attention
        "--micro-batch-size 1", "--global-batch-size 16",
        "--use-distributed-optimizer", "--bf16",      # fp32 gradients: Megatron's default
        *LLAMA8_MODEL, *MEGATRON_LLAMA_TAIL,
        "--rotary-base 500000", "--attention-backend flash"]
    assert any("data-parallel size 2 is implied: launch tp·pp·dp·cp = 2·2·2·4 = 32 processes "
               "and Megatron-LM takes DP = world size / (TP·PP·CP)" in n for n in result.notes)
    flags = lines(export_megatron(plan_of(ULYSSES_PLAN), LLAMA8, "llama3-8b").files[0].text)
    assert flags[:4] == ["--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 1",
                         "--context-parallel-size 4", "--cp-comm-type a2a"]
    # a dense model has no expert options, even with cp
    assert not any(f.startswith(("--num-experts", "--expert-model", "--moe-")) for f in flags)


def test_megatron_launch_sets_the_connections_variable_for_cp() -> None:
    # CP alone (tp 1): Megatron's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 for it too
    result = export_megatron(plan_of(ULYSSES_PLAN), LLAMA8, "llama3-8b", output_format="torchrun")
    text = result.files[0].text
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text
    assert "World size 8 = TP 1 x PP 1 x DP 2 x CP 4" in text
    assert any("with tp or cp > 1" in note for note in result.notes)


def test_megatron_refusals() -> None:
    # The MoE layer raises in training with TP but no sequence parallelism.
    with pytest.raises(InputError) as caught:
        export_megatron(plan_of({**EP_PLAN, "sequence_parallel": False}), MIXTRAL, "mixtral")
    assert caught.value.field == "plan.sequence_parallel"
    assert "moe_layer.py" in caught.value.problem
    # Any --cp-comm-type: seq a multiple of 2 · cp (the all-to-all too; rules.py checks ring).
    odd = replace(LLAMA8, seq=8196)
    with pytest.raises(InputError) as caught:
        export_megatron(plan_of(ULYSSES_PLAN), odd, "odd")
    assert caught.value.field == "plan.cp" and "multiple of 2 × cp = 8" in caught.value.problem
    # ep on a dense model: the plan rules' refusal, before any engine's
    with pytest.raises(InputError) as caught:
        export_megatron(plan_of(EP_PLAN), LLAMA8, "llama3-8b")
    assert caught.value.field == "plan.ep"


# --- DeepSpeed (Megatron-DeepSpeed) ------------------------------------------------------------

def test_deepspeed_mixtral_ep8_every_option() -> None:
    result = export_deepspeed(plan_of(EP_PLAN), MIXTRAL, "mixtral-8x7b")
    assert json.loads(result.files[0].text) == {
        "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 4,           # 64 / (1 · DP 16)
        "zero_optimization": {"stage": 1, "overlap_comm": True}, "bf16": {"enabled": True},
        "communication_data_type": "fp32", "data_types": {"grad_accum_dtype": "fp32"}}
    assert lines(result.files[1].text) == [
        "--deepspeed", "--deepspeed_config ds_config.json", "--zero-stage 1",
        "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 1",
        "--no-pipeline-parallel", "--sequence-parallel",
        "--moe-expert-parallel-size 8",
        "--enable-expert-tensor-parallelism",       # the experts split over TP, as priced
        "--micro-batch-size 1", "--global-batch-size 64",
        "--recompute-granularity selective", "--bf16",
        *MIXTRAL_MODEL, *DEEPSPEED_LLAMA_TAIL,
        "--rotary-position-embeddings-theta 1000000", "--use-flash-attn-v2",
        "--num-experts 8",
        "--expert-interval 1",                      # every block (the default 2: every other)
        "--topk 2",
        "--disable-moe-token-dropping",             # dropless
        "--create-moe-param-group"]                 # ZeRO asserts a MoE parameter group
    notes = " | ".join(result.notes)
    assert "launch tp·pp·dp·ep = 2·1·2·8 = 32 processes" in notes
    assert "DP = world size / (TP·PP) = dp·ep = 2·8 = 16" in notes
    assert "--moe-loss-coeff" in notes


def test_deepspeed_moe_variant_through_a_pipeline() -> None:
    plan = plan_of(SWITCH_PLAN)
    result = export_deepspeed(plan, SWITCH, "switch")
    config = json.loads(result.files[0].text)
    # MoE with PP and TP > 1: Megatron-DeepSpeed's GPTModelPipe asserts both off
    assert config["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert ds_config(plan, SWITCH) == config
    # a dense model's plan priced whole sends (pp_scatter_gather false): written so
    assert ds_config(plan)["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    flags = lines(result.files[1].text)
    assert "--ffn-hidden-size 4096" in flags          # each expert is built from it
    assert flags[flags.index("--num-experts 16"):] == [
        "--num-experts 16", "--expert-interval 1", "--topk 1",
        "--mlp-type residual",                      # the shared expert, as wide as a routed one
        "--moe-train-capacity-factor 1.25", "--create-moe-param-group"]
    notes = " | ".join(result.notes)
    assert "busiest expert-parallel member at 1.5× the mean" in notes
    assert "pads every expert's tokens to its capacity (1.25× the mean" in notes


def test_deepspeed_ulysses_cp4() -> None:
    result = export_deepspeed(plan_of(ULYSSES_PLAN), LLAMA8, "llama3-8b")
    assert json.loads(result.files[0].text)["gradient_accumulation_steps"] == 8  # 16 / (1 · 2)
    assert lines(result.files[1].text) == [
        "--deepspeed", "--deepspeed_config ds_config.json", "--zero-stage 1",
        "--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 1",
        "--no-pipeline-parallel", "--ds-sequence-parallel-size 4",
        "--micro-batch-size 1", "--global-batch-size 16", "--bf16",
        *LLAMA8_MODEL, *DEEPSPEED_LLAMA_TAIL,
        "--rotary-position-embeddings-theta 500000", "--use-flash-attn-v2"]
    assert any("launch tp·pp·dp·cp = 1·1·2·4 = 8 processes (deepspeed or torchrun); DP = world "
               "size / (TP·PP·SP)" in note for note in result.notes)


@pytest.mark.parametrize("fields, shape, field, words", [
    (CP_PLAN, LLAMA8, "plan.cp_algorithm", "ring attention has no DeepSpeed option"),
    ({**ULYSSES_PLAN, "tp": 2}, LLAMA8, "plan.cp", "without tensor or pipeline parallelism"),
    ({**ULYSSES_PLAN, "ep": 8, "global_batch": 64}, MIXTRAL, "plan.ep", "Ulysses group"),
    ({**EP_PLAN, "zero": 3, "overlap_dp": False}, MIXTRAL, "plan.zero", "ZeRO-3"),
    (EP_PLAN, replace(MIXTRAL, shared_ffn=2 * 14336), "workload", "shared width of 28672"),
    # the plan rules refuse it for any engine (Megatron-DeepSpeed asserts it too)
    (ULYSSES_PLAN, replace(LLAMA8, seq=8194), "plan.cp", "seq 8194 is not a multiple of cp 4"),
])
def test_deepspeed_refusals(fields: dict, shape, field: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        export_deepspeed(plan_of(fields), shape, "w")
    assert caught.value.field == field and words in caught.value.problem, caught.value


# --- torchtitan --------------------------------------------------------------------------------

def toml_lines(text: str) -> list[str]:
    return [line for line in lines(text) if line and not line.startswith("#")]


def test_torchtitan_mixtral_ep8_every_key() -> None:
    result = export_torchtitan(plan_of(EP_FSDP_PLAN), MIXTRAL, "mixtral-8x7b")
    assert toml_lines(result.files[0].text)[2:] == [
        "[model]", 'name = "llama4"',                 # torchtitan's MoE decoder
        'flavor = "mixtral-8x7b"',
        "[training]", "local_batch_size = 1", "global_batch_size = 64", "seq_len = 4096",
        'mixed_precision_param = "bfloat16"', 'mixed_precision_reduce = "float32"',
        "[parallelism]", "data_parallel_replicate_degree = 1",
        "data_parallel_shard_degree = 16",            # dp · ep: ep borrows from it
        'fsdp_reshard_after_forward = "never"', "tensor_parallel_degree = 2",
        "pipeline_parallel_degree = 1",
        "expert_parallel_degree = 8",
        "expert_tensor_parallel_degree = 2",          # experts split over TP too, as priced
        "[activation_checkpoint]", 'mode = "selective"', 'selective_ac_option = "op"',
        # the workload priced fused element-wise kernels: only the compiler fuses them
        "[compile]", "enable = true", 'components = ["model"]']
    notes = " | ".join(result.notes)
    assert ("register a llama4 flavor named 'mixtral-8x7b' in torchtitan/models/llama4/"
            "__init__.py: TransformerModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, "
            "rope_theta=1000000.0, interleave_moe_layer_step=1, auto_scale_hidden_dim=False, "
            "multiple_of=14336, ffn_dim_multiplier=None, moe_args=MoEArgs(num_experts=8, "
            "num_shared_experts=0, top_k=2, score_func='softmax', route_norm=True))") in notes
    assert "launch tp·pp·dp·ep = 2·1·2·8 = 32 processes" in notes
    assert "load_balance_coeff" in notes


def test_torchtitan_flavor_arguments_of_fine_grained_experts() -> None:
    # 8 · 2048 / 3 = 5461 > 1408: a multiplier brings it to 1408 (rounded up to multiple_of)
    shape = replace(MIXTRAL, hidden=2048, heads=16, kv_heads=16, experts=64, top_k=6,
                    expert_ffn=1408, shared_ffn=2816)
    model, moe = moe_flavor_args(shape)
    assert model["multiple_of"] == 1408 and model["ffn_dim_multiplier"] == 1408 / 5461
    assert moe == {"num_experts": 64, "num_shared_experts": 2, "top_k": 6,
                   "score_func": "softmax", "route_norm": True}


def test_torchtitan_cp4_ring() -> None:
    result = export_torchtitan(plan_of(CP_FSDP_PLAN), LLAMA8, "llama3-8b")
    body = toml_lines(result.files[0].text)
    assert body[body.index("[parallelism]"):body.index("[activation_checkpoint]")] == [
        "[parallelism]", "data_parallel_replicate_degree = 1", "data_parallel_shard_degree = 2",
        'fsdp_reshard_after_forward = "never"', "tensor_parallel_degree = 2",
        "pipeline_parallel_degree = 1",
        "context_parallel_degree = 4",
        'context_parallel_rotate_method = "alltoall"']   # K/V passed to the next rank: a ring
    assert 'flavor = "8B"' in body and "global_batch_size = 16" in body


@pytest.mark.parametrize("fields, shape, field, words", [
    ({**CP_FSDP_PLAN, "cp_algorithm": "alltoall"}, LLAMA8, "plan.cp_algorithm",
     "no torchtitan option"),
    ({**CP_FSDP_PLAN, "tp": 1, "zero": 0, "overlap_dp": False}, LLAMA8, "plan.zero",
     "whenever cp > 1"),
    ({**EP_PLAN, "tp": 1, "zero": 0, "overlap_dp": False, "sequence_parallel": False},
     MIXTRAL, "plan.zero", "borrows ep from the FSDP2"),
    (EP_FSDP_PLAN, replace(MIXTRAL, capacity_factor=1.25), "workload", "dropless"),
    (EP_FSDP_PLAN, replace(MIXTRAL, shared_ffn=7168), "workload", "not a multiple"),
    (CP_FSDP_PLAN, replace(LLAMA8, seq=8200), "plan.cp", "tp × 2 × cp = 16"),
])
def test_torchtitan_refusals(fields: dict, shape, field: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        export_torchtitan(plan_of(fields), shape, "w")
    assert caught.value.field == field and words in caught.value.problem, caught.value


# --- the limits themselves (plan/engines.py) ----------------------------------------------------

def test_plan_facts_carry_ep_and_cp() -> None:
    facts = plan_facts(plan_of({**ULYSSES_PLAN, "dp": 1, "global_batch": 8, "zero": 2}))
    assert (facts.ep, facts.cp, facts.cp_algorithm) == (1, 4, "alltoall")
    assert facts.replicated              # one replica, but the cp members' gradients meet
    assert engine_violation("megatron", facts) is None      # Megatron runs both algorithms
    assert engine_violation("deepspeed", facts) is None
    assert engine_violation("torchtitan", facts).field == "cp_algorithm"
    # Workload limits need the shape; the dense model at 8192 tokens runs everywhere.
    assert all(workload_violation(e, facts, LLAMA8) is None for e in ("megatron", "deepspeed"))
    assert workload_differences("deepspeed", facts, LLAMA8) == ()
    # require_engine without a shape checks the plan only (the search's facts)
    require_engine("megatron", plan_of({**EP_PLAN, "sequence_parallel": False}))
    with pytest.raises(InputError) as caught:
        require_engine("torchtitan", plan_of(EP_FSDP_PLAN), shape=replace(MIXTRAL,
                                                                          capacity_factor=1.0))
    assert caught.value.field == "workload"


def test_predict_json_of_an_ep_plan_exports(tmp_path) -> None:
    plan = plan_of(SWITCH_PLAN)
    path = tmp_path / "pred.json"
    path.write_text(json.dumps({"config": None, "plan": plan.to_dict()}))
    source = read_plan_source(path)
    # global_batch = micro · accumulation · dp · ep, and the expert and context keys carried
    assert source.plan == plan and source.plan.samples_per_step == 32
    with_cp = plan_of(ULYSSES_PLAN).to_dict()
    path.write_text(json.dumps({"config": None, "plan": with_cp}))
    assert read_plan_source(path).plan.context.algorithm == "alltoall"


# --- the engines' own parsers -------------------------------------------------------------------

def torchrun_case(tmp_path: Path, name: str, plan, shape, arch: int = 8) -> dict:
    """The exported torchrun script of `plan` run with the stand-in torchrun (as
    test_export_megatron_validate's `launched` does, for a shape not in the zoo)."""
    script = tmp_path / f"{name}.sh"
    script.write_text(export_megatron(plan, shape, name, output_format="torchrun").files[0].text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(FAKE_TORCHRUN.format(python=sys.executable))
    torchrun.chmod(0o755)
    record = tmp_path / f"{name}.json"
    env = {key: value for key, value in os.environ.items()
           if key not in ("CUDA_DEVICE_MAX_CONNECTIONS", "DATA_ARGS", "TRAIN_ARGS")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", NODE_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
               DNNSCALE_TORCHRUN_RECORD=str(record))
    subprocess.run(["sh", str(script)], env=env, check=True, timeout=60)
    seen = json.loads(record.read_text())
    argv = seen["argv"]
    at = argv.index("pretrain_gpt.py")
    launcher = dict(zip(argv[:at:2], argv[1:at:2]))
    world = int(launcher["--nnodes"]) * int(launcher["--nproc-per-node"])
    return {"argv": argv[at + 1:], "world": world, "connections": seen["connections"],
            "arch": arch}


def _megatron_moe_reader() -> str:
    """MEGATRON_READER with the GPU capability answered (--moe-grouped-gemm asks it) and the
    TransformerConfig's expert and context-parallel fields read back."""
    anchor_loop = "    results = []\n"
    anchor_fields = '"attention_backend": t.attention_backend.name})'
    assert MEGATRON_READER.count(anchor_loop) == 1 and anchor_fields in MEGATRON_READER
    stub = ("    import torch\n"
            "    arch_of = {}\n"
            "    torch.cuda.get_device_capability = lambda *a, **k: (arch_of['now'], 0)\n")
    fields = ('"attention_backend": t.attention_backend.name, "experts": t.num_moe_experts, '
              '"topk": t.moe_router_topk, "pre_softmax": t.moe_router_pre_softmax, '
              '"ep": t.expert_model_parallel_size, "etp": t.expert_tensor_parallel_size, '
              '"moe_ffn": t.moe_ffn_hidden_size, '
              '"shared": t.moe_shared_expert_intermediate_size, '
              '"capacity": t.moe_expert_capacity_factor, '
              '"pad": t.moe_pad_expert_input_to_capacity, "drop": t.moe_token_drop_policy, '
              '"grouped": t.moe_grouped_gemm, "dispatcher": t.moe_token_dispatcher_type, '
              '"cp": t.context_parallel_size, "cp_comm": t.cp_comm_type})')
    reader = MEGATRON_READER.replace(anchor_loop, stub + anchor_loop)
    reader = reader.replace('        arguments.get_device_arch_version = lambda: case["arch"]\n',
                            '        arguments.get_device_arch_version = lambda: case["arch"]\n'
                            '        arch_of["now"] = case["arch"]\n')
    assert 'arch_of["now"] = case["arch"]' in reader
    return reader.replace(anchor_fields, fields)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CHECKOUT, reason="set DNNSCALE_MEGATRON_LM to a Megatron-LM "
                    "checkout (see tests/test_export_megatron_validate.py)")
@pytest.mark.skipif(find_spec("torch") is None, reason="Megatron-LM's parser imports torch")
def test_megatron_validate_args_on_moe_and_cp(tmp_path) -> None:
    runs = [torchrun_case(tmp_path, "mixtral", plan_of(EP_PLAN), MIXTRAL),
            torchrun_case(tmp_path, "switch", plan_of(SWITCH_PLAN), SWITCH),
            torchrun_case(tmp_path, "ring", plan_of(CP_PLAN), LLAMA8),
            torchrun_case(tmp_path, "a2a", plan_of(ULYSSES_PLAN), LLAMA8)]
    assert [run["connections"] for run in runs] == ["1", "1", "1", "1"]   # a2a: CP alone
    no_pre_softmax = [w for w in runs[1]["argv"] if w != "--moe-router-pre-softmax"]
    controls = [{**runs[1], "argv": no_pre_softmax},      # top-1 without pre-softmax
                {**runs[3], "connections": None}]         # CP without the variable
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(runs + controls))
    env = {**os.environ, "PYTHONPATH": CHECKOUT or "", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(_megatron_moe_reader()),
                             str(path)], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    mixtral, switch, ring, a2a, pre_softmax, connections = \
        json.loads(result.stdout.strip().splitlines()[-1])
    for seen in (mixtral, switch, ring, a2a):
        assert "error" not in seen, seen
    # 32 GPUs / (TP 2 · PP 1) = DP 16 = dp · ep; 64 / (1 · 16) = 4 micro-batches.
    assert (mixtral["dp"], mixtral["microbatches"]) == (16, 4)
    assert {k: mixtral[k] for k in ("experts", "topk", "ep", "etp", "moe_ffn", "shared",
                                    "capacity", "grouped", "dispatcher", "cp")} == {
        "experts": 8, "topk": 2, "ep": 8, "etp": 2, "moe_ffn": 14336, "shared": None,
        "capacity": None, "grouped": True, "dispatcher": "alltoall", "cp": 1}
    assert (mixtral["rotary_base"], mixtral["query_groups"]) == (1000000, 8)
    # 32 / (2 · 2) = DP 8 = dp · ep; 32 / (1 · 8) = 4 micro-batches; dropped, not padded.
    assert (switch["dp"], switch["microbatches"], switch["experts"], switch["topk"]) == \
        (8, 4, 16, 1)
    assert (switch["pre_softmax"], switch["moe_ffn"], switch["shared"], switch["ffn"]) == \
        (True, 4096, 4096, 14336)
    assert (switch["capacity"], switch["pad"], switch["drop"]) == (1.25, False, "probs")
    # 32 / (TP 2 · PP 2 · CP 4) = DP 2; 16 / (1 · 2) = 8 micro-batches.
    assert (ring["dp"], ring["microbatches"], ring["cp"], ring["cp_comm"]) == (2, 8, 4, "p2p")
    assert (a2a["dp"], a2a["microbatches"], a2a["cp"], a2a["cp_comm"]) == (2, 8, 4, "a2a")
    assert "Please use --moe-router-pre-softmax when topk is 1" in pre_softmax["error"]
    assert "tensor model parallelism or context parallelism require" in connections["error"]


DS_CONFIG_READER = DEEPSPEED_READER.replace(
    '"deepspeed": known.deepspeed, "deepspeed_config": known.deepspeed_config})',
    '"deepspeed": known.deepspeed, "deepspeed_config": known.deepspeed_config, '
    '"pipeline": [c.pipeline["pipe_partitioned"], c.pipeline["grad_partitioned"]]})')

EXPERT_RANKS = """
    import json, sys
    from deepspeed.utils.groups import _get_expert_parallel_ranks
    out = []
    for world, tp, ep, pp in zip(*[iter(map(int, sys.argv[1:]))] * 4):
        try:
            groups, data_groups = _get_expert_parallel_ranks(world, tp, ep, pp)
            out.append([len(groups), sorted({len(g) for g in groups}), groups[0]])
        except AssertionError as exc:
            out.append({"error": str(exc)})
    print(json.dumps(out))
"""


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (requirements.txt "
                    "pins deepspeed==0.19.8)")
def test_deepspeed_reads_the_moe_and_ulysses_configs(tmp_path) -> None:
    argv = []
    for name, fields, shape in (("mixtral", EP_PLAN, MIXTRAL), ("switch", SWITCH_PLAN, SWITCH),
                                ("ulysses", ULYSSES_PLAN, LLAMA8)):
        plan = plan_of(fields)
        result = export_deepspeed(plan, shape, name, config_name=str(tmp_path / f"{name}.json"))
        (tmp_path / f"{name}.json").write_text(result.files[0].text)
        (tmp_path / f"{name}.args").write_text(result.files[1].text)
        # DeepSpeed's data-parallel group: Megatron-DeepSpeed's DP, dp · ep (not the cp members)
        argv += [str(tmp_path / f"{name}.json"), str(plan.data.replicas * plan.expert.degree),
                 str(tmp_path / f"{name}.args")]
    # control: the Mixtral config with DP = dp alone (the EP members left out) is refused
    mixtral, switch, ulysses, wrong = run_python(DS_CONFIG_READER, *argv, argv[0], "2", argv[2])
    assert (mixtral["train_batch_size"], mixtral["accumulation"], mixtral["overlap_comm"]) == \
        (64, 4, True)
    assert mixtral["pipeline"] == [True, True]           # DeepSpeed's defaults: no pipeline
    assert (switch["accumulation"], switch["pipeline"]) == (4, [False, False])
    assert (ulysses["train_batch_size"], ulysses["accumulation"]) == (16, 8)
    assert "64 != 1 * 4 * 2" in wrong["error"]
    # Expert groups over world / (TP·PP) ranks: 32 GPUs, TP 2 → 16 DP ranks in groups of 8;
    # with TP 2 × PP 2 (the variant) 8 DP ranks per stage, one group of 8 each.
    mixtral_ranks, switch_ranks, too_many = run_python(EXPERT_RANKS, "32", "2", "8", "1",
                                                       "32", "2", "8", "2", "32", "2", "32", "1")
    assert mixtral_ranks[:2] == [4, [8]] and mixtral_ranks[2] == list(range(0, 16, 2))
    assert switch_ranks[:2] == [4, [8]]
    assert "is not divisible by 32" in too_many["error"]


MDS_MOE_READER = MEGATRON_DEEPSPEED_READER.replace(
    '"params_dtype": str(args.params_dtype)})',
    '"params_dtype": str(args.params_dtype), "experts": args.num_experts, "topk": args.topk, '
    '"ep": args.moe_expert_parallel_size, "interval": args.expert_interval, '
    '"dropping": args.moe_token_dropping, "capacity": args.moe_train_capacity_factor, '
    '"mlp_type": args.mlp_type, "etp": args.enable_expert_tensor_parallelism, '
    '"moe_group": args.create_moe_param_group, "ffn": args.ffn_hidden_size, '
    '"sp": args.ds_sequence_parallel_size})')


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed")
@pytest.mark.skipif(find_spec("six") is None or find_spec("regex") is None,
                    reason="Megatron-DeepSpeed's imports need six and regex")
@pytest.mark.skipif(not HAS_MEGATRON_DEEPSPEED, reason="set DNNSCALE_MEGATRON_DEEPSPEED to a "
                    "Megatron-DeepSpeed checkout (it is not on PyPI)")
def test_megatron_deepspeed_validate_args_on_moe_and_ulysses(tmp_path) -> None:
    assert MDS_MOE_READER != MEGATRON_DEEPSPEED_READER
    argv = []
    for name, fields, shape in (("mixtral", EP_PLAN, MIXTRAL), ("switch", SWITCH_PLAN, SWITCH),
                                ("ulysses", ULYSSES_PLAN, LLAMA8)):
        plan = plan_of(fields)
        path = tmp_path / f"{name}.args"
        path.write_text(export_deepspeed(plan, shape, name).files[1].text)
        argv += [str(path), str(plan.workers), "1"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [MEGATRON_DEEPSPEED, os.environ.get("PYTHONPATH")]))}
    mixtral, switch, ulysses = run_python(MDS_MOE_READER, *argv, env=env)
    assert {k: mixtral[k] for k in ("dp", "experts", "topk", "ep", "interval", "dropping",
                                    "etp", "moe_group", "ffn", "sp")} == {
        "dp": 16, "experts": [8], "topk": 2, "ep": 8, "interval": 1, "dropping": False,
        "etp": True, "moe_group": True, "ffn": 14336, "sp": 1}
    assert (switch["dp"], switch["experts"], switch["topk"], switch["mlp_type"]) == \
        (8, [16], 1, "residual")
    assert (switch["dropping"], switch["capacity"], switch["ffn"], switch["pipeline"]) == \
        (True, 1.25, 4096, True)
    # 8 GPUs / (TP 1 · PP 1 · SP 4) = DP 2
    assert (ulysses["dp"], ulysses["sp"], ulysses["experts"]) == (2, 4, [1])


TORCHTITAN_MESH_READER = """
    import json, logging, sys
    logging.disable(logging.WARNING)
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.llama4.model.args import TransformerModelArgs
    from torchtitan.models.llama4.model.model import Transformer
    from torchtitan.models.moe import MoEArgs

    path, world, flavor = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    c = ConfigManager().parse_args(["--job.config_file", path])
    p, t = c.parallelism, c.training
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                        dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                        tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=world)
    dims.build_mesh()                      # builds every mesh and runs _validate_meshes
    batch_degree = dims.dp_replicate * dims.dp_shard   # Trainer.__init__'s check, as written
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0
    assert t.seq_len % dims.seq_len_divisor == 0       # parallelize's assertion, as written
    experts = None
    if flavor:
        model, moe = flavor
        with torch.device("meta"):
            net = Transformer(TransformerModelArgs(**model, moe_args=MoEArgs(**moe)))
        block = net.layers["0"]
        experts = {"moe_layers": sum(b.moe_enabled for b in net.layers.values()),
                   "w1": list(block.moe.experts.w1.shape), "top_k": block.moe.router.top_k,
                   "shared": block.moe.shared_experts is not None,
                   "kv_heads": net.model_args.n_kv_heads}
    print(json.dumps({"model": [c.model.name, c.model.flavor],
                      "meshes": {name: mesh.size() for name, mesh in dims._meshes.items()},
                      "fsdp": dims.fsdp_enabled,
                      "accumulation": t.global_batch_size // (t.local_batch_size
                                                              * batch_degree),
                      "cp": [p.context_parallel_rotate_method,
                             p.context_parallel_load_balancer],
                      "experts": experts}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCHTITAN, reason="torchtitan is not installed (the 'engines' "
                    "extra: pip install -e '.[engines]' pins torchtitan==0.2.2 and triton)")
def test_torchtitan_builds_the_ep_and_cp_meshes(tmp_path) -> None:
    cases = []
    for name, fields, shape in (("mixtral", {**EP_FSDP_PLAN, "cp": 2, "pp": 2,
                                              "global_batch": 32}, MIXTRAL),
                                ("ring", CP_FSDP_PLAN, LLAMA8)):
        plan = plan_of(fields)
        path = tmp_path / f"{name}.toml"
        path.write_text(export_torchtitan(plan, shape, name).files[0].text)
        flavor = list(moe_flavor_args(shape)) if shape.is_moe else None
        cases.append(run_python(TORCHTITAN_MESH_READER, str(path), str(plan.workers),
                                json.dumps(flavor)))
    mixtral, ring = cases
    # 128 GPUs: PP 2 × DP 2 × EP 8 × CP 2 × TP 2. torchtitan's batch = dp · ep = 16, its FSDP
    # mesh dp · ep · cp = 32 (the plan's dense replicas), the experts' FSDP dp · cp = 4.
    assert mixtral["meshes"] == {"pp": 2, "batch": 16, "loss": 32, "dp_replicate": 1,
                                 "fsdp": 32, "cp": 2, "tp": 2, "ep": 8, "efsdp": 4, "etp": 2}
    # with a pipeline one local batch holds the step's 32 / 16 = 2 micro-batches: 1 step
    assert mixtral["model"] == ["llama4", "mixtral"] and mixtral["accumulation"] == 1
    assert mixtral["experts"] == {"moe_layers": 32, "w1": [8, 14336, 4096], "top_k": 2,
                                  "shared": False, "kv_heads": 8}
    assert mixtral["cp"] == ["alltoall", "headtail"]
    assert ring["meshes"]["fsdp"] == 8 and ring["meshes"]["cp"] == 4 and ring["fsdp"]
    assert ring["model"] == ["llama3", "8B"] and ring["accumulation"] == 8
