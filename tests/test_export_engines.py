"""`export` for named plans, checked option by option against each engine's documented options.

Expected values are written out by hand from the plan and the workload's published shape; the
option names are the engines' own (docs/export.md gives each with its source file and line).
"""

from __future__ import annotations

import json

import pytest

from dnnscale.errors import InputError
from dnnscale.export.deepspeed import ds_config, export_deepspeed
from dnnscale.export.megatron import export_megatron
from dnnscale.export.torchtitan import export_torchtitan
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.workload import load_workload

# GPT-3 175B as Narayanan et al. (SC'21, Table 1) trained it: TP 8, PP 8, interleaved, on
# 768 GPUs (DP 12), global batch 1536.
GPT3_PLAN = dict(tp=8, pp=8, dp=12, micro_batch=1, global_batch=1536, schedule="interleaved",
                 virtual_stages=2, zero=1, recompute="selective", precision="bf16",
                 sequence_parallel=True, overlap_dp=True)
LLAMA70_PLAN = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, schedule="1f1b", zero=1,
                    recompute="full", precision="bf16", sequence_parallel=True,
                    overlap_dp=True, grad_bytes=4)
LLAMA8_PLAN = dict(tp=2, pp=1, dp=32, micro_batch=2, global_batch=256, zero=3,
                   recompute="selective", precision="fp8", sequence_parallel=True,
                   overlap_dp=True)


def shape_of(name: str):
    return load_workload(name).transformer


def lines(text: str) -> list[str]:
    return text.splitlines()


# --- Megatron-LM -----------------------------------------------------------------------------

def test_megatron_gpt3_interleaved_every_option() -> None:
    result = export_megatron(modern_plan_from_dict(GPT3_PLAN), shape_of("gpt3-175b"), "gpt3-175b")
    assert result.world_size == 8 * 8 * 12 == 768
    assert [f.name for f in result.files] == ["megatron.args"]
    assert lines(result.files[0].text) == [
        "--tensor-model-parallel-size 8",
        "--pipeline-model-parallel-size 8",
        "--num-layers-per-virtual-pipeline-stage 6",    # 96 layers / (8 stages · 2 chunks)
        "--sequence-parallel",
        "--micro-batch-size 1",
        "--global-batch-size 1536",                     # 128 micro-batches · 12 replicas
        "--use-distributed-optimizer",                  # ZeRO-1
        "--overlap-grad-reduce",
        "--recompute-granularity selective",
        "--recompute-modules core_attn",                # no --recompute-method: refused
        "--bf16",                                       # fp32 gradients, Megatron's default
        "--num-layers 96",
        "--hidden-size 12288",
        "--ffn-hidden-size 49152",                      # 4 · 12288
        "--num-attention-heads 96",
        "--seq-length 2048",
        "--max-position-embeddings 2048",
        "--vocab-size 50257",
        "--normalization LayerNorm",
        "--position-embedding-type learned_absolute",
    ]
    assert any("world size / (TP·PP)" in note for note in result.notes)


def test_megatron_llama_fsdp_fp8_model_flags() -> None:
    result = export_megatron(modern_plan_from_dict(LLAMA8_PLAN), shape_of("llama3-8b"),
                             "llama3-8b")
    flags = lines(result.files[0].text)
    # ZeRO-3 is Megatron-FSDP sharding optimizer state, gradients and parameters.
    for flag in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                 "--ckpt-format fsdp_dtensor", "--bf16", "--fp8-format hybrid",
                 "--group-query-attention", "--num-query-groups 8", "--swiglu",
                 "--normalization RMSNorm", "--position-embedding-type rope",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                 "--attention-dropout 0", "--hidden-dropout 0", "--ffn-hidden-size 14336",
                 "--seq-length 8192", "--max-position-embeddings 8192", "--vocab-size 128256",
                 "--rotary-base 500000"):                 # Llama 3's RoPE base
        assert flag in flags, flag
    assert "--use-distributed-optimizer" not in flags
    assert "--num-layers-per-virtual-pipeline-stage" not in result.files[0].text


@pytest.mark.parametrize(("options", "wanted"), [
    ("", []),                                          # Megatron's defaults: 0.1 each
    (",attention_dropout=false", ["--attention-dropout 0"]),
    (",dropout=false,attention_dropout=true", ["--hidden-dropout 0"]),
    (",dropout=false", ["--attention-dropout 0", "--hidden-dropout 0"]),
])
def test_megatron_dropout_flags_follow_each_dropout(options: str, wanted: list[str]) -> None:
    plan = modern_plan_from_dict(dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8))
    shape = load_workload("gpt:layers=2,hidden=64,heads=4,seq=8,vocab=10" + options).transformer
    flags = lines(export_megatron(plan, shape, "tiny").files[0].text)
    assert [f for f in flags if "dropout" in f] == wanted


def test_megatron_zero2_and_full_recompute_and_fp16() -> None:
    plan = modern_plan_from_dict(dict(tp=4, pp=1, dp=8, micro_batch=4, global_batch=64, zero=2,
                                      recompute="full", precision="fp16", grad_bytes=4))
    flags = lines(export_megatron(plan, shape_of("gpt3-6.7b"), "gpt3-6.7b").files[0].text)
    assert "--data-parallel-sharding-strategy optim_grads" in flags
    assert flags[flags.index("--recompute-granularity full"):][:3] == [
        "--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    assert "--fp16" in flags and "--accumulate-allreduce-grads-in-fp32" in flags
    assert "--overlap-grad-reduce" not in flags and "--sequence-parallel" not in flags


def test_megatron_fp32_has_no_precision_flag() -> None:
    plan = modern_plan_from_dict(dict(tp=1, pp=2, dp=2, micro_batch=1, global_batch=8,
                                      precision="fp32"))
    flags = lines(export_megatron(plan, shape_of("gpt3-125m"), "gpt3-125m").files[0].text)
    assert not {"--bf16", "--fp16", "--grad-reduce-in-bf16"} & set(flags)
    assert flags[:4] == ["--tensor-model-parallel-size 1", "--pipeline-model-parallel-size 2",
                         "--micro-batch-size 1", "--global-batch-size 8"]


def test_megatron_torchrun_script() -> None:
    result = export_megatron(modern_plan_from_dict(GPT3_PLAN), shape_of("gpt3-175b"), "gpt3-175b",
                             output_format="torchrun", gpus_per_node=8)
    text = result.files[0].text
    assert text.startswith("#!/bin/sh\n")
    # TP 8 on A100s: Megatron asserts one hardware queue; exported before torchrun starts.
    assert "\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text
    assert text.index("export CUDA_DEVICE_MAX_CONNECTIONS=1") < text.index("torchrun ")
    assert ('\nDATA_ARGS=${DATA_ARGS:-"--mock-data --tokenizer-type NullTokenizer"}\n'
            in text)
    assert ('\nTRAIN_ARGS=${TRAIN_ARGS:-"--train-iters 50 --eval-iters 0 --lr 0.0001 '
            '--log-interval 1"}\n' in text)
    # 768 GPUs / 8 per node = 96 nodes.
    assert "torchrun --nnodes 96 --nproc-per-node 8 " in text
    assert "    pretrain_gpt.py \\\n    --tensor-model-parallel-size 8 \\\n" in text
    assert text.endswith("    --position-embedding-type learned_absolute \\\n"
                         "    $DATA_ARGS $TRAIN_ARGS\n")
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1 (the script exports it)" in note
               for note in result.notes)


@pytest.mark.parametrize("plan, lines_wanted, note_words", [
    # TP 8 without FSDP: Megatron-LM asserts =1 before Blackwell.
    (dict(tp=8, pp=1, dp=1, zero=1), ["export CUDA_DEVICE_MAX_CONNECTIONS=1"],
     "CUDA_DEVICE_MAX_CONNECTIONS=1"),
    # Megatron-FSDP (ZeRO-3) asserts it is not 1, with or without TP.
    (dict(tp=2, pp=1, dp=4, zero=3), ["unset CUDA_DEVICE_MAX_CONNECTIONS"],
     "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1"),
    (dict(tp=1, pp=1, dp=8, zero=2), ["unset CUDA_DEVICE_MAX_CONNECTIONS"],
     "Megatron-FSDP (zero 2/3) asserts it is not 1"),
    # TP 1 without FSDP: Megatron checks nothing, the script leaves the variable alone.
    (dict(tp=1, pp=2, dp=4, zero=1), [], None),
])
def test_megatron_launch_environment(plan, lines_wanted, note_words) -> None:
    result = export_megatron(modern_plan_from_dict({**plan, "micro_batch": 1}),
                             shape_of("llama3-8b"), "llama3-8b", output_format="torchrun")
    environment = [line for line in lines(result.files[0].text)
                   if "CUDA_DEVICE_MAX_CONNECTIONS" in line and not line.startswith("#")]
    assert environment == lines_wanted
    notes = [note for note in result.notes if "CUDA_DEVICE_MAX_CONNECTIONS" in note]
    assert [note_words in note for note in notes] == ([True] if note_words else [])
    args = export_megatron(modern_plan_from_dict({**plan, "micro_batch": 1}),
                           shape_of("llama3-8b"), "llama3-8b")
    assert "CUDA" not in args.files[0].text          # the args file holds options only
    assert [note_words in note for note in args.notes
            if "CUDA_DEVICE_MAX_CONNECTIONS" in note] == ([True] if note_words else [])


def test_megatron_torchrun_script_runs_with_the_environment(tmp_path) -> None:
    """The script as sh runs it: a stand-in torchrun records what it was started with."""
    import os
    import subprocess
    import sys

    script = tmp_path / "launch.sh"
    script.write_text(export_megatron(modern_plan_from_dict(LLAMA70_PLAN), shape_of("llama3-70b"),
                                      "llama3-70b", output_format="torchrun").files[0].text)
    (tmp_path / "torchrun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "print(json.dumps([sys.argv[1:], os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS')]))\n")
    (tmp_path / "torchrun").chmod(0o755)
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATA_ARGS", "TRAIN_ARGS", "CUDA_DEVICE_MAX_CONNECTIONS")}
    env.update(PATH=f"{tmp_path}{os.pathsep}{env.get('PATH', '')}", NODE_RANK="3",
               MASTER_ADDR="10.0.0.1", MASTER_PORT="6000")

    def run(**extra: str) -> tuple[list[str], str]:
        out = subprocess.run(["sh", str(script)], env={**env, **extra}, check=True,
                             capture_output=True, text=True, timeout=60).stdout
        return json.loads(out)

    argv, connections = run()
    assert connections == "1"
    # 128 GPUs = 16 nodes of 8; the node's rank and the rendezvous come from the environment.
    assert argv[:11] == ["--nnodes", "16", "--nproc-per-node", "8", "--node-rank", "3",
                         "--master-addr", "10.0.0.1", "--master-port", "6000", "pretrain_gpt.py"]
    assert argv[-11:] == ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters",
                          "50", "--eval-iters", "0", "--lr", "0.0001", "--log-interval", "1"]
    argv, _ = run(DATA_ARGS="--data-path /data/corpus_text_document --tokenizer-type "
                            "HuggingFaceTokenizer --tokenizer-model /models/llama3",
                  TRAIN_ARGS="--train-samples 1000 --lr 3e-4")
    assert argv[-10:] == ["--data-path", "/data/corpus_text_document", "--tokenizer-type",
                          "HuggingFaceTokenizer", "--tokenizer-model", "/models/llama3",
                          "--train-samples", "1000", "--lr", "3e-4"]
    assert "--mock-data" not in argv


def test_megatron_padded_vocabulary_note() -> None:
    # 128,256 is a multiple of 128 but not of 128 · 8 = 1024: Megatron builds 126 · 1024 rows.
    result = export_megatron(modern_plan_from_dict(LLAMA70_PLAN), shape_of("llama3-70b"),
                             "llama3-70b")
    assert any("129,024 embedding and output rows where the plan priced 128,256" in note
               for note in result.notes)
    # 50,257 with TP 1: up to 393 · 128 = 50,304.
    gpt = export_megatron(modern_plan_from_dict(dict(dp=2, micro_batch=1)), shape_of("gpt3-125m"),
                          "gpt3-125m")
    assert any("50,304 embedding" in note for note in gpt.notes)


def small_llama(tmp_path, rope_theta: float):
    """The shape of a two-layer Llama config.json with this RoPE base (hf: import)."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 512,
                                  "num_attention_heads": 8, "num_hidden_layers": 2,
                                  "vocab_size": 1000, "max_position_embeddings": 256,
                                  "rope_theta": rope_theta}))
    return load_workload(f"hf:{config}").transformer


def test_megatron_rotary_base_of_each_rope_model(tmp_path) -> None:
    plan = modern_plan_from_dict(dict(tp=1, pp=1, dp=2, micro_batch=1))
    llama2 = lines(export_megatron(plan, shape_of("llama2-7b"), "llama2-7b").files[0].text)
    assert "--rotary-base 10000" in llama2                        # Llama 2 keeps RoFormer's
    gpt = lines(export_megatron(plan, shape_of("gpt3-125m"), "gpt3-125m").files[0].text)
    assert not any(flag.startswith("--rotary-base") for flag in gpt)   # learned positions
    hf = small_llama(tmp_path, 1000000.0)
    assert "--rotary-base 1000000" in lines(export_megatron(plan, hf, "hf").files[0].text)
    odd = load_workload("gpt:layers=2,hidden=64,heads=4,seq=16,vocab=100,positional=rope,"
                        "rope_theta=20000").transformer
    assert "--rotary-base 20000" in lines(export_megatron(plan, odd, "odd").files[0].text)


def test_megatron_refuses_a_fractional_rotary_base(tmp_path) -> None:
    shape = small_llama(tmp_path, 10000.5)
    plan = modern_plan_from_dict(dict(dp=2, micro_batch=1))
    for exporter, engine in ((export_megatron, "Megatron-LM"), (export_deepspeed, "DeepSpeed")):
        with pytest.raises(InputError) as caught:
            exporter(plan, shape, "hf")
        assert caught.value.field == "transformer.rope_theta"
        assert f"{engine} takes RoPE's base as an integer, got 10000.5" in caught.value.problem


def test_gpipe_without_a_pipeline_is_not_refused() -> None:
    plan = modern_plan_from_dict(dict(tp=2, pp=1, dp=2, schedule="gpipe"))
    assert export_megatron(plan, shape_of("gpt3-1.3b"), "gpt3-1.3b").files


# --- DeepSpeed -------------------------------------------------------------------------------

# DeepSpeed's pipeline engine reduces gradients after the last micro-batch: no overlap with pp > 1
LLAMA70_DEEPSPEED = {**LLAMA70_PLAN, "overlap_dp": False}


def test_deepspeed_llama70b_config_and_megatron_deepspeed_flags() -> None:
    result = export_deepspeed(modern_plan_from_dict(LLAMA70_DEEPSPEED), shape_of("llama3-70b"),
                              "llama3-70b")
    assert [f.name for f in result.files] == ["ds_config.json", "megatron-deepspeed.args"]
    config = json.loads(result.files[0].text)
    assert config == {
        "train_batch_size": 512,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 128,        # 512 / (1 · 4 replicas)
        "zero_optimization": {"stage": 1, "overlap_comm": False},
        "bf16": {"enabled": True},
        "communication_data_type": "fp32",         # grad_bytes 4
        "data_types": {"grad_accum_dtype": "fp32"},  # accumulated as priced (ZeRO-1)
        "activation_checkpointing": {"partition_activations": False,
                                     "contiguous_memory_optimization": False,
                                     "cpu_checkpointing": False},
        # the plan priced each member's own s/t of the sequence sent whole (pp_scatter_gather
        # false); DeepSpeed's defaults would partition it again
        "pipeline": {"pipe_partitioned": False, "grad_partitioned": False},
    }
    assert lines(result.files[1].text) == [
        "--deepspeed", "--deepspeed_config ds_config.json", "--zero-stage 1",
        "--tensor-model-parallel-size 8", "--pipeline-model-parallel-size 4",
        "--sequence-parallel", "--micro-batch-size 1", "--global-batch-size 512",
        "--checkpoint-activations", "--checkpoint-num-layers 1",
        "--deepspeed-activation-checkpointing", "--bf16",
        "--num-layers 80", "--hidden-size 8192", "--ffn-hidden-size 28672",
        "--num-attention-heads 64", "--seq-length 8192", "--max-position-embeddings 8192",
        "--vocab-size 128256", "--swiglu", "--untie-embeddings-and-output-weights",
        "--disable-bias-linear", "--attention-dropout 0", "--hidden-dropout 0",
        "--num-key-value-heads 8", "--normalization rmsnorm",
        "--use-rotary-position-embeddings", "--no-position-embedding",
        "--rotary-position-embeddings-theta 500000",
        "--use-flash-attn-v2"]                      # the zoo's Llama runs fused attention
    # --sequence-parallel: Megatron-DeepSpeed raises at start without the variable.
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1" in note and "--sequence-parallel" in note
               for note in result.notes)


def test_deepspeed_without_pipeline_zero3_fp16() -> None:
    plan = modern_plan_from_dict(dict(tp=1, pp=1, dp=16, micro_batch=4, global_batch=128,
                                      zero=3, precision="fp16", overlap_dp=True))
    config = ds_config(plan)
    assert config["gradient_accumulation_steps"] == 2          # 128 / (4 · 16)
    # the buckets DeepSpeed's stage 3 runs, as the model prices them (model/zero3_fetch.py)
    assert config["zero_optimization"] == {
        "stage": 3, "overlap_comm": True, "stage3_prefetch_bucket_size": 50_000_000,
        "stage3_param_persistence_threshold": 100_000, "reduce_bucket_size": 500_000_000}
    assert config["fp16"] == {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    assert config["communication_data_type"] == "fp16" and "bf16" not in config
    result = export_deepspeed(plan, shape_of("gpt3-1.3b"), "gpt3-1.3b")
    flags = lines(result.files[1].text)
    assert "--no-pipeline-parallel" in flags and "--fp16" in flags and "--zero-stage 3" in flags
    assert not any("CUDA_DEVICE_MAX_CONNECTIONS" in note for note in result.notes)  # tp = 1


def test_deepspeed_zero0_fp32() -> None:
    config = ds_config(modern_plan_from_dict(dict(dp=4, micro_batch=8, global_batch=32,
                                                  precision="fp32")))
    assert config == {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8,
                      "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0},
                      "communication_data_type": "fp32"}


def test_deepspeed_config_name_in_flags() -> None:
    result = export_deepspeed(modern_plan_from_dict(LLAMA70_DEEPSPEED), shape_of("llama3-70b"),
                              "llama3-70b", config_name="cfg/run1.json")
    assert result.files[0].name == "cfg/run1.json"
    assert "--deepspeed_config cfg/run1.json" in lines(result.files[1].text)


# --- torchtitan ------------------------------------------------------------------------------

def toml_tables(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)


def test_torchtitan_llama3_8b_fsdp_fp8() -> None:
    result = export_torchtitan(modern_plan_from_dict(LLAMA8_PLAN), shape_of("llama3-8b"),
                               "llama3-8b")
    tables = toml_tables(result.files[0].text)
    assert tables["model"] == {"name": "llama3", "flavor": "8B",
                               "converters": ["quantize.linear.float8"]}
    assert tables["training"] == {"local_batch_size": 2, "global_batch_size": 256,
                                  "seq_len": 8192, "mixed_precision_param": "bfloat16",
                                  "mixed_precision_reduce": "float32"}
    # 256 / (2 · 32) = 4 gradient-accumulation steps, which torchtitan derives itself.
    assert tables["parallelism"] == {"data_parallel_replicate_degree": 1,
                                     "data_parallel_shard_degree": 32,
                                     "fsdp_reshard_after_forward": "always",   # ZeRO-3
                                     "tensor_parallel_degree": 2,
                                     "pipeline_parallel_degree": 1}
    assert tables["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    # fp8 plans price Megatron's fp32 gradients, which torchtitan reduces too: no note; a plan
    # of 2-byte gradients runs otherwise than priced, and the export says so
    assert not any("float32" in note for note in result.notes)
    narrow = export_torchtitan(modern_plan_from_dict({**LLAMA8_PLAN, "grad_bytes": 2}),
                               shape_of("llama3-8b"), "llama3-8b")
    assert any("float32" in note for note in narrow.notes)


def test_torchtitan_llama3_70b_interleaved_pipeline_fsdp() -> None:
    # torchtitan's DDP runs only alone, so with TP and PP the two replicas shard (FSDP2 + TP + PP)
    plan = modern_plan_from_dict(dict(tp=8, pp=4, dp=2, micro_batch=1, global_batch=64,
                                      schedule="interleaved", virtual_stages=2, zero=2,
                                      recompute="full", precision="bf16",
                                      sequence_parallel=True, overlap_dp=True, grad_bytes=4))
    result = export_torchtitan(plan, shape_of("llama3-70b"), "llama3-70b")
    tables = toml_tables(result.files[0].text)
    assert tables["model"] == {"name": "llama3", "flavor": "70B"}
    # 64 / (1 · 2) = 32 micro-batches per step, all in one local batch the pipeline splits.
    assert tables["training"]["local_batch_size"] == 32
    assert tables["training"]["global_batch_size"] == 64
    assert tables["parallelism"] == {"data_parallel_replicate_degree": 1,
                                     "data_parallel_shard_degree": 2,
                                     "fsdp_reshard_after_forward": "never",    # ZeRO-2
                                     "tensor_parallel_degree": 8,
                                     "pipeline_parallel_degree": 4,
                                     "pipeline_parallel_schedule": "Interleaved1F1B",
                                     "pipeline_parallel_microbatch_size": 1,
                                     "pipeline_parallel_layers_per_stage": 10,   # 80 / (4 · 2)
                                     "pipeline_parallel_first_stage_less_layers": 0,
                                     "pipeline_parallel_last_stage_less_layers": 0}
    assert tables["activation_checkpoint"] == {"mode": "full"}
    assert not any("float32" in note for note in result.notes)


def test_torchtitan_gpipe_zero2_fp32_and_unregistered_shapes() -> None:
    plan = modern_plan_from_dict(dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, zero=2,
                                      precision="fp32"))
    result = export_torchtitan(plan, shape_of("gpt3-1.3b"), "gpt3-1.3b")
    tables = toml_tables(result.files[0].text)
    assert tables["parallelism"]["fsdp_reshard_after_forward"] == "never"     # ZeRO-2
    assert tables["training"]["mixed_precision_param"] == "float32"
    assert tables["model"] == {"name": "llama3", "flavor": "gpt3-1.3b"}
    assert any("no model for gpt3-1.3b" in note for note in result.notes)
    gpipe = modern_plan_from_dict(dict(tp=1, pp=4, dp=1, micro_batch=1, global_batch=8,
                                       schedule="gpipe"))
    llama = export_torchtitan(gpipe, shape_of("llama2-7b"), "llama2-7b")
    tables = toml_tables(llama.files[0].text)
    assert tables["parallelism"]["pipeline_parallel_schedule"] == "GPipe"
    assert tables["parallelism"]["pipeline_parallel_layers_per_stage"] == 8    # 32 / 4
    assert tables["training"]["local_batch_size"] == 8                        # 8 micro-batches
    assert any("register one named 'llama2-7b'" in note and "rope_theta=10000" in note
               for note in llama.notes)


def test_torchtitan_flavor_needs_llama3s_rope_base() -> None:
    # Llama 3 8B's dimensions with Llama 2's RoPE base are not torchtitan's 8B flavor.
    shape = load_workload("gpt:layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=8192,"
                          "vocab=128256,gated=true,norm=rmsnorm,positional=rope,tied=false,"
                          "bias=false,rope_theta=10000").transformer
    result = export_torchtitan(modern_plan_from_dict(dict(dp=8, micro_batch=1)), shape, "mine")
    assert toml_tables(result.files[0].text)["model"]["flavor"] == "mine"
    assert any("rope_theta=10000" in note for note in result.notes)


# --- refusals, every engine ------------------------------------------------------------------

MEGATRON_BASE = dict(tp=2, pp=2, dp=2, micro_batch=1, global_batch=8)
DEEPSPEED_BASE = {**MEGATRON_BASE, "zero": 1}
TORCHTITAN_BASE = dict(tp=2, pp=1, dp=4, micro_batch=1, global_batch=8, zero=2)


@pytest.mark.parametrize("exporter, engine, base, change, field, words", [
    (export_megatron, "Megatron-LM", MEGATRON_BASE, dict(schedule="gpipe"), "plan.schedule",
     "no GPipe"),
    (export_megatron, "Megatron-LM", MEGATRON_BASE, dict(precision="tf32"), "plan.precision",
     "no TF32"),
    (export_megatron, "Megatron-LM", MEGATRON_BASE, dict(grad_bytes=1), "plan.grad_bytes",
     "1-byte"),
    (export_megatron, "Megatron-LM", MEGATRON_BASE, dict(precision="fp32", grad_bytes=2),
     "plan.grad_bytes", "fp32"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(schedule="interleaved",
                                                         virtual_stages=2), "plan.schedule",
     "1F1B"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(schedule="gpipe"), "plan.schedule",
     "1F1B"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(pp=1, zero=0, overlap_dp=True),
     "plan.overlap_dp", "only under ZeRO"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(overlap_dp=True), "plan.overlap_dp",
     "after the last micro-batch"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(zero=2), "plan.zero",
     "ZeRO-0 or ZeRO-1 only"),
    (export_megatron, "Megatron-LM", MEGATRON_BASE, dict(zero=3), "plan.zero",
     "one pipeline stage only"),
    (export_torchtitan, "torchtitan", TORCHTITAN_BASE, dict(zero=0), "plan.zero",
     "DDP (zero 0) runs only as the sole parallelism"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(precision="tf32"), "plan.precision",
     "no TF32"),
    (export_deepspeed, "DeepSpeed", DEEPSPEED_BASE, dict(grad_bytes=1), "plan.grad_bytes",
     "1-byte"),
    (export_torchtitan, "torchtitan", TORCHTITAN_BASE, dict(zero=1), "plan.zero", "no ZeRO-1"),
    (export_torchtitan, "torchtitan", TORCHTITAN_BASE, dict(precision="fp16"), "plan.precision",
     "fp16"),
    (export_torchtitan, "torchtitan", TORCHTITAN_BASE, dict(precision="tf32"), "plan.precision",
     "no TF32"),
    (export_torchtitan, "torchtitan", TORCHTITAN_BASE, dict(grad_bytes=1), "plan.grad_bytes",
     "1-byte"),
])
def test_refusals_name_the_field_and_the_engine(exporter, engine, base, change, field,
                                                words) -> None:
    with pytest.raises(InputError) as caught:
        exporter(modern_plan_from_dict({**base, **change}), shape_of("llama3-8b"), "llama3-8b")
    assert caught.value.field == field
    assert engine in caught.value.problem and words in caught.value.problem
    assert "\n" not in str(caught.value)


# --- shared checks ---------------------------------------------------------------------------

@pytest.mark.parametrize("exporter", [export_megatron, export_deepspeed, export_torchtitan])
def test_every_engine_refuses_what_it_cannot_split(exporter) -> None:
    plan = modern_plan_from_dict(dict(tp=16, dp=2, micro_batch=1))
    with pytest.raises(InputError) as caught:   # llama3-8b has 8 key/value heads
        exporter(plan, shape_of("llama3-8b"), "llama3-8b")
    assert caught.value.field == "plan.tp" and "8 key/value heads" in caught.value.problem
    three = modern_plan_from_dict(dict(pp=3, dp=1, micro_batch=1))   # 32 layers
    with pytest.raises(InputError, match="32 layers do not divide into 3 stages"):
        exporter(three, shape_of("llama3-8b"), "llama3-8b")
    with pytest.raises(InputError, match="not a transformer"):
        exporter(three, load_workload("adam-mnist").transformer, "adam-mnist")
    with pytest.raises(InputError, match="encoder"):
        exporter(modern_plan_from_dict(dict(dp=2)), shape_of("bert-large"), "bert-large")
