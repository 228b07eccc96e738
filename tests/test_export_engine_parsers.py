"""The exports fed to the engines' own parsers, where the engine installs here without a GPU.

- DeepSpeed 0.19.8 (requirements.txt): its `DeepSpeedConfig` reads each ds_config and checks
  train_batch_size = micro · accumulation · DP; its `add_config_arguments` parses the
  --deepspeed flags of the Megatron-DeepSpeed file.
- Megatron-DeepSpeed (not on PyPI; a checkout named by ``DNNSCALE_MEGATRON_DEEPSPEED``, with
  ``six`` and ``regex`` importable): its `parse_args` and `validate_args` on the exported flags,
  world size tp·pp·dp, with the accelerator DeepSpeed reports taken as "cuda" (its
  CUDA_DEVICE_MAX_CONNECTIONS check runs only there; imported first on the CPU one, so no apex)
  and a stand-in ``transformers`` module (imported for a tokenizer class the checks never
  build).
- torchtitan 0.2.2 (the ``engines`` extra: pip install -e '.[engines]'): its `ConfigManager`
  parses the TOML job config (and runs its config checks), its `ParallelDims` checks the degrees
  against the world size, `get_schedule_class` resolves the schedule, its
  `generate_llm_fqn_per_model_part` splits the layers over the pipeline stages, and its llama3
  `Transformer`, built on the meta device from the flavor's arguments, has the workload's
  widths and RoPE base. Two checks torchtitan runs inline (in `Trainer.__init__` and
  `build_pipeline_schedule`, not callable alone) are repeated as written there: the global
  batch is a multiple of local batch · DP, and the local batch of the pipeline micro-batch.

Megatron-LM's own validate_args runs in tests/test_export_megatron_validate.py.

Each engine runs in a subprocess: importing it takes seconds and changes process-wide state
(DeepSpeed picks an accelerator) that no other test should see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.util import find_spec
from pathlib import Path

import pytest

from dnnscale.export.deepspeed import export_deepspeed
from dnnscale.export.torchtitan import export_torchtitan
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.workload import load_workload

HAS_DEEPSPEED = find_spec("deepspeed") is not None
HAS_TORCHTITAN = find_spec("torchtitan") is not None and find_spec("triton") is not None


def run_python(code: str, *args: str, timeout: float = 240, env: dict | None = None) -> list:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                            capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


DEEPSPEED_READER = """
    import argparse, json, sys
    import deepspeed
    import deepspeed.runtime.config as ds_config

    class DataParallelGroup:  # what DeepSpeed asks Megatron's mpu for
        def __init__(self, size): self.size = size
        def get_data_parallel_world_size(self): return self.size

    # No process group in a test: DeepSpeedConfig asks for the rank only before it asks the
    # mpu for the data-parallel size.
    ds_config.dist.get_rank = lambda *a, **k: 0
    results = []
    for path, dp, args in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        try:
            c = ds_config.DeepSpeedConfig(path, mpu=DataParallelGroup(int(dp)))
        except AssertionError as exc:
            results.append({"error": str(exc)})
            continue
        parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
        known, _ = parser.parse_known_args(open(args).read().split())
        a = c.activation_checkpointing_config
        results.append({"train_batch_size": c.train_batch_size,
                        "micro": c.train_micro_batch_size_per_gpu,
                        "accumulation": c.gradient_accumulation_steps,
                        "zero_stage": int(c.zero_optimization_stage),
                        "overlap_comm": c.zero_config.overlap_comm,
                        "bf16": c.bfloat16_config.enabled, "fp16": c.float16_config.enabled,
                        "dynamic_loss_scale": bool(c.float16_config.enabled
                                                   and c.float16_config.loss_scale == 0),
                        "communication": str(c.communication_data_type),
                        "grad_accum": c.grad_accum_dtype,
                        "checkpointing": [a.partition_activations,
                                          a.contiguous_memory_optimization,
                                          a.cpu_checkpointing],
                        "deepspeed": known.deepspeed, "deepspeed_config": known.deepspeed_config})
    print(json.dumps(results))
"""

DEEPSPEED_PLANS = {
    "llama70": (dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, zero=1,
                     recompute="full", precision="bf16", sequence_parallel=True,
                     overlap_dp=False, grad_bytes=4), "llama3-70b"),  # DeepSpeed: no overlap, pp > 1
    "zero3": (dict(tp=1, pp=1, dp=16, micro_batch=4, global_batch=128, zero=3,
                   precision="fp16", overlap_dp=True), "gpt3-1.3b"),
    "zero2": (dict(tp=2, pp=1, dp=8, micro_batch=2, global_batch=64, zero=2,
                   recompute="selective", precision="bf16", sequence_parallel=True,
                   overlap_dp=False, grad_bytes=2), "llama3-8b"),
    "ddp": (dict(tp=1, pp=2, dp=4, micro_batch=8, global_batch=64, precision="fp32"),
            "gpt3-125m"),
}


def deepspeed_exports(tmp_path) -> list[tuple]:
    """For each of DEEPSPEED_PLANS: the plan, its ds_config and Megatron-DeepSpeed flags
    written under tmp_path, and the export."""
    exports = []
    for name, (fields, workload) in DEEPSPEED_PLANS.items():
        plan = modern_plan_from_dict(fields)
        config_path = tmp_path / f"{name}.json"
        result = export_deepspeed(plan, load_workload(workload).transformer, workload,
                                  config_name=str(config_path))
        config_path.write_text(result.files[0].text)
        args_path = tmp_path / f"{name}.args"
        args_path.write_text(result.files[1].text)
        exports.append((plan, config_path, args_path, result))
    return exports


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (requirements.txt "
                    "pins deepspeed==0.19.8)")
def test_deepspeed_reads_the_ds_config(tmp_path) -> None:
    argv = [str(word) for plan, config_path, args_path, _ in deepspeed_exports(tmp_path)
            for word in (config_path, plan.data.replicas, args_path)]
    # The first file read with a data-parallel group of 3: 512 != 1 · 128 · 3, which DeepSpeed
    # must refuse (so the checks are DeepSpeed's, not a formality).
    llama70, zero3, zero2, ddp, wrong = run_python(DEEPSPEED_READER, *argv, argv[0], "3",
                                                   argv[2])
    assert llama70 == {"train_batch_size": 512, "micro": 1, "accumulation": 128, "zero_stage": 1,
                       "overlap_comm": False, "bf16": True, "fp16": False,
                       "dynamic_loss_scale": False, "communication": "torch.float32",
                       "grad_accum": "fp32", "checkpointing": [False, False, False], "deepspeed": True,
                       "deepspeed_config": str(tmp_path / "llama70.json")}
    # 128 = 4 · 2 · 16; fp16 with loss_scale 0 is dynamic loss scaling; 2-byte reduction.
    assert (zero3["accumulation"], zero3["zero_stage"], zero3["overlap_comm"]) == (2, 3, True)
    assert (zero3["fp16"], zero3["dynamic_loss_scale"], zero3["communication"]) == \
        (True, True, "torch.float16")
    # ZeRO-2 without overlap is written out: 64 = 2 · 4 · 8.
    assert (zero2["accumulation"], zero2["zero_stage"], zero2["overlap_comm"]) == (4, 2, False)
    assert (zero2["bf16"], zero2["communication"]) == (True, "torch.bfloat16")
    # 2-byte gradients: DeepSpeed's default, the model's dtype, accumulates them as priced
    assert zero2["grad_accum"] is None
    # fp32, plain all-reduce: 64 = 8 · 2 · 4.
    assert (ddp["accumulation"], ddp["zero_stage"], ddp["bf16"], ddp["fp16"]) == \
        (2, 0, False, False)
    assert "512 != 1 * 128 * 3" in wrong["error"]


MEGATRON_DEEPSPEED = os.environ.get("DNNSCALE_MEGATRON_DEEPSPEED")
HAS_MEGATRON_DEEPSPEED = (bool(MEGATRON_DEEPSPEED)
                          and (Path(MEGATRON_DEEPSPEED or ".") / "megatron/arguments.py").is_file())

MEGATRON_DEEPSPEED_READER = """
    import json, os, sys, types
    stand_in = types.ModuleType("transformers")   # for a tokenizer class never built here
    stand_in.AutoTokenizer = object
    sys.modules.setdefault("transformers", stand_in)
    import deepspeed
    import megatron.utils, megatron.arguments as arguments   # on DeepSpeed's CPU accelerator
    accelerator = type(deepspeed.accelerator.get_accelerator())
    accelerator.device_name = lambda self, device_index=None: "cuda"   # the GPUs it launches on

    results = []
    for path, world, connections in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        if connections != "-":
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
        os.environ["WORLD_SIZE"], os.environ["RANK"] = world, "0"
        sys.argv = ["pretrain_gpt.py", *open(path).read().split()]
        try:
            args = arguments.parse_args()
            arguments.validate_args(args)
        except (AssertionError, RuntimeError, SystemExit) as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
            continue
        results.append({"dp": args.data_parallel_size, "zero": args.zero_stage,
                        "sequence_parallel": args.sequence_parallel,
                        "rope_theta": (args.rope_theta if args.use_rotary_position_embeddings
                                       else None),
                        "checkpoint": args.checkpoint_activations,
                        "recompute": args.recompute_granularity,
                        "pipeline": not args.no_pipeline_parallel,
                        "kv_heads": args.num_key_value_heads,
                        "params_dtype": str(args.params_dtype)})
    print(json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed")
@pytest.mark.skipif(find_spec("six") is None or find_spec("regex") is None,
                    reason="Megatron-DeepSpeed's imports need six and regex")
@pytest.mark.skipif(not HAS_MEGATRON_DEEPSPEED, reason="set DNNSCALE_MEGATRON_DEEPSPEED to a "
                    "Megatron-DeepSpeed checkout (it is not on PyPI)")
def test_megatron_deepspeed_validate_args(tmp_path) -> None:
    argv = [str(word) for plan, _, args_path, result in deepspeed_exports(tmp_path)
            for word in (args_path, plan.workers,
                         "1" if any("CUDA_DEVICE_MAX_CONNECTIONS=1" in note
                                    for note in result.notes) else "-")]
    assert argv[2::3] == ["1", "-", "1", "-"]      # the notes ask for it with TP > 1 and SP
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [MEGATRON_DEEPSPEED, os.environ.get("PYTHONPATH")]))}
    # Control: llama70's flags (sequence parallel) launched without the variable.
    llama70, zero3, zero2, ddp, without = run_python(MEGATRON_DEEPSPEED_READER, *argv,
                                                     argv[0], argv[1], "-", env=env)
    assert llama70 == {"dp": 4, "zero": 1, "sequence_parallel": True, "rope_theta": 500000,
                       "checkpoint": True, "recompute": None, "pipeline": True,
                       "kv_heads": 8, "params_dtype": "torch.bfloat16"}
    assert zero3 == {"dp": 16, "zero": 3, "sequence_parallel": False, "rope_theta": None,
                     "checkpoint": False, "recompute": None, "pipeline": False,
                     "kv_heads": 16, "params_dtype": "torch.float16"}   # = its 16 heads
    assert (zero2["dp"], zero2["recompute"], zero2["sequence_parallel"]) == (8, "selective", True)
    assert (ddp["dp"], ddp["pipeline"], ddp["params_dtype"]) == (4, True, "torch.float32")
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in without["error"]


TORCHTITAN_READER = """
    import json, logging, sys
    logging.disable(logging.WARNING)
    import torch
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.model import Transformer

    results = []
    for path, world, layers in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        c = ConfigManager().parse_args(["--job.config_file", path])
        p, t, a = c.parallelism, c.training, c.activation_checkpoint
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                            dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                            pp=p.pipeline_parallel_degree, ep=1, etp=1, world_size=int(world))
        # Trainer.__init__'s batch check (torchtitan/train.py), as written there.
        batch_degree = dims.dp_replicate * dims.dp_shard
        assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0
        accumulation = t.global_batch_size // (t.local_batch_size * batch_degree)
        stages = microbatches = None
        if p.pipeline_parallel_degree > 1:
            get_schedule_class(p.pipeline_parallel_schedule)
            # build_pipeline_schedule's check (distributed/pipeline_parallel.py), as written.
            assert t.local_batch_size % p.pipeline_parallel_microbatch_size == 0
            microbatches = t.local_batch_size // p.pipeline_parallel_microbatch_size
            count = int(layers) // p.pipeline_parallel_layers_per_stage
            parts = generate_llm_fqn_per_model_part(
                count, int(layers), p.pipeline_parallel_first_stage_less_layers,
                p.pipeline_parallel_last_stage_less_layers)
            stages = [sum(name.startswith("layers.") for name in part) for part in parts]
        model = None
        if c.model.flavor in llama3_args:
            with torch.device("meta"):
                net = Transformer(llama3_args[c.model.flavor])
            block = net.layers["0"]
            model = {"layers": len(net.layers), "dim": net.model_args.dim,
                     "heads": net.model_args.n_heads, "kv_heads": net.model_args.n_kv_heads,
                     "ffn": block.feed_forward.w1.out_features,
                     "rope_theta": net.model_args.rope_theta}
        results.append({
            "model": [c.model.name, c.model.flavor, list(c.model.converters)],
            "batch": [t.local_batch_size, t.global_batch_size, t.seq_len],
            "precision": [t.mixed_precision_param, t.mixed_precision_reduce],
            "dp": [dims.dp_replicate, dims.dp_shard], "tp": dims.tp, "pp": dims.pp,
            "reshard": p.fsdp_reshard_after_forward,
            "schedule": p.pipeline_parallel_schedule,
            "microbatch": p.pipeline_parallel_microbatch_size,
            "ac": [a.mode, a.selective_ac_option], "stages": stages,
            "accumulation": accumulation, "microbatches": microbatches, "shape": model})
    print(json.dumps(results))
"""


def shape_facts(workload: str) -> dict:
    shape = load_workload(workload).transformer
    return {"layers": shape.layers, "dim": shape.hidden, "heads": shape.heads,
            "kv_heads": shape.kv_heads, "ffn": shape.ffn, "rope_theta": shape.rotary_base}


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TORCHTITAN, reason="torchtitan is not installed (the 'engines' "
                    "extra: pip install -e '.[engines]' pins torchtitan==0.2.2 and triton)")
def test_torchtitan_reads_the_job_config(tmp_path) -> None:
    fsdp = modern_plan_from_dict(dict(tp=2, pp=1, dp=32, micro_batch=2, global_batch=256,
                                      zero=3, recompute="selective", precision="fp8",
                                      sequence_parallel=True, overlap_dp=True))
    pipeline = modern_plan_from_dict(dict(tp=8, pp=4, dp=2, micro_batch=1, global_batch=64,
                                          schedule="interleaved", virtual_stages=2,
                                          recompute="full", precision="bf16",
                                          sequence_parallel=True, overlap_dp=True))
    gpipe = modern_plan_from_dict(dict(tp=1, pp=4, dp=2, micro_batch=2, global_batch=32,
                                       schedule="gpipe", zero=0, precision="fp32"))
    paths = []
    for name, plan, workload in (("fsdp", fsdp, "llama3-8b"), ("pp", pipeline, "llama3-70b"),
                                 ("gpipe", gpipe, "llama2-7b")):
        path = tmp_path / f"{name}.toml"
        path.write_text(export_torchtitan(plan, load_workload(workload).transformer,
                                          workload).files[0].text)
        paths.append(path)
    seen = run_python(TORCHTITAN_READER, str(paths[0]), "64", "32", str(paths[1]), "64", "80",
                      str(paths[2]), "8", "32")
    # 256 / (2 · 32) = 4 gradient-accumulation steps, which torchtitan derives itself.
    assert seen[0] == {"model": ["llama3", "8B", ["quantize.linear.float8"]],
                       "batch": [2, 256, 8192], "precision": ["bfloat16", "float32"],
                       "dp": [1, 32], "tp": 2, "pp": 1, "reshard": "always",
                       "schedule": "1F1B", "microbatch": 1, "ac": ["selective", "op"],
                       "stages": None, "accumulation": 4, "microbatches": None,
                       "shape": shape_facts("llama3-8b")}
    # 80 layers over 4 ranks × 2 virtual stages: 8 stages of 10 layers, the plan's split; one
    # local batch of 32 = the step's 32 micro-batches of 1.
    assert seen[1] == {"model": ["llama3", "70B", []], "batch": [32, 64, 8192],
                       "precision": ["bfloat16", "float32"], "dp": [2, 1], "tp": 8, "pp": 4,
                       "reshard": "default", "schedule": "Interleaved1F1B", "microbatch": 1,
                       "ac": ["full", "2"], "stages": [10] * 8, "accumulation": 1,
                       "microbatches": 32, "shape": shape_facts("llama3-70b")}
    # Llama 2 7B is no llama3 flavor (the note asks to register one); 32 / (2 · 2) = 8
    # micro-batches of 2 in one local batch of 16, 4 stages of 8 layers, DDP.
    assert seen[2]["model"] == ["llama3", "llama2-7b", []] and seen[2]["shape"] is None
    assert (seen[2]["batch"], seen[2]["microbatches"], seen[2]["stages"]) == \
        ([16, 32, 4096], 8, [8] * 4)
    assert (seen[2]["schedule"], seen[2]["dp"], seen[2]["precision"]) == \
        ("GPipe", [2, 1], ["float32", "float32"])
