"""The exports fed to the engines' own parsers, where the engine installs here without a GPU.

- DeepSpeed 0.19.8 (requirements.txt): its `DeepSpeedConfig` reads the ds_config and checks
  train_batch_size = micro · accumulation · DP; its `add_config_arguments` parses the
  --deepspeed flags of the Megatron-DeepSpeed file.
- torchtitan 0.2.2 (the ``engines`` extra: pip install -e '.[engines]'): its `ConfigManager`
  parses the TOML job config, its `ParallelDims` checks the degrees against the world size, and
  its `generate_llm_fqn_per_model_part` splits the layers over the pipeline stages.

Megatron-LM's parser (megatron/training/arguments.py) is not on PyPI (the megatron-core wheel
has no megatron.training) and needs CUDA-only packages; test_export_engines.py checks its
flags against its documented options instead.

Each engine runs in a subprocess: importing it takes seconds and changes process-wide state
(DeepSpeed picks an accelerator) that no other test should see.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from importlib.util import find_spec

import pytest

from dnnscale.export.deepspeed import export_deepspeed
from dnnscale.export.torchtitan import export_torchtitan
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.workload import load_workload

HAS_DEEPSPEED = find_spec("deepspeed") is not None
HAS_TORCHTITAN = find_spec("torchtitan") is not None and find_spec("triton") is not None


def run_python(code: str, *args: str, timeout: float = 240) -> dict:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                            capture_output=True, text=True, timeout=timeout)
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
    for path, dp in zip(sys.argv[1::3], sys.argv[2::3]):
        try:
            c = ds_config.DeepSpeedConfig(path, mpu=DataParallelGroup(int(dp)))
        except AssertionError as exc:
            results.append({"error": str(exc)})
            continue
        results.append({"train_batch_size": c.train_batch_size,
                        "micro": c.train_micro_batch_size_per_gpu,
                        "accumulation": c.gradient_accumulation_steps,
                        "zero_stage": int(c.zero_optimization_stage),
                        "overlap_comm": c.zero_config.overlap_comm,
                        "bf16": c.bfloat16_config.enabled, "fp16": c.float16_config.enabled,
                        "communication": str(c.communication_data_type)})
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    flags = open(sys.argv[3]).read().split()
    known, _ = parser.parse_known_args(flags)
    print(json.dumps({"configs": results, "deepspeed": known.deepspeed,
                      "deepspeed_config": known.deepspeed_config}))
"""


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="DeepSpeed is not installed (requirements.txt "
                    "pins deepspeed==0.19.8)")
def test_deepspeed_reads_the_ds_config(tmp_path) -> None:
    plan = modern_plan_from_dict(dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512,
                                      zero=1, recompute="full", precision="bf16",
                                      sequence_parallel=True, overlap_dp=False, grad_bytes=4))
    config_path = tmp_path / "ds_config.json"
    result = export_deepspeed(plan, load_workload("llama3-70b").transformer, "llama3-70b",
                              config_name=str(config_path))
    config_path.write_text(result.files[0].text)
    args_path = tmp_path / "megatron-deepspeed.args"
    args_path.write_text(result.files[1].text)
    # The same file read with a data-parallel group of 3: 512 != 1 · 128 · 3, which DeepSpeed
    # must refuse (so the check above is DeepSpeed's, not a formality).
    seen = run_python(DEEPSPEED_READER, str(config_path), "4", str(args_path),
                      str(config_path), "3", str(args_path))
    good, wrong = seen["configs"]
    assert good == {"train_batch_size": 512, "micro": 1, "accumulation": 128, "zero_stage": 1,
                    "overlap_comm": False, "bf16": True, "fp16": False,
                    "communication": "torch.float32"}
    assert "512 != 1 * 128 * 3" in wrong["error"]
    assert seen["deepspeed"] is True and seen["deepspeed_config"] == str(config_path)


TORCHTITAN_READER = """
    import json, logging, sys
    logging.disable(logging.WARNING)
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

    results = []
    for path, world, layers in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
        c = ConfigManager().parse_args(["--job.config_file", path])
        p, t, a = c.parallelism, c.training, c.activation_checkpoint
        dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree,
                            dp_shard=p.data_parallel_shard_degree,
                            cp=p.context_parallel_degree, tp=p.tensor_parallel_degree,
                            pp=p.pipeline_parallel_degree, ep=1, etp=1, world_size=int(world))
        stages = None
        if p.pipeline_parallel_degree > 1:
            count = int(layers) // p.pipeline_parallel_layers_per_stage
            parts = generate_llm_fqn_per_model_part(
                count, int(layers), p.pipeline_parallel_first_stage_less_layers,
                p.pipeline_parallel_last_stage_less_layers)
            stages = [sum(name.startswith("layers.") for name in part) for part in parts]
        results.append({
            "model": [c.model.name, c.model.flavor, list(c.model.converters)],
            "batch": [t.local_batch_size, t.global_batch_size, t.seq_len],
            "precision": [t.mixed_precision_param, t.mixed_precision_reduce],
            "dp": [dims.dp_replicate, dims.dp_shard], "tp": dims.tp, "pp": dims.pp,
            "reshard": p.fsdp_reshard_after_forward,
            "schedule": p.pipeline_parallel_schedule,
            "microbatch": p.pipeline_parallel_microbatch_size,
            "ac": [a.mode, a.selective_ac_option], "stages": stages})
    print(json.dumps(results))
"""


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
    paths = []
    for name, plan, workload in (("fsdp", fsdp, "llama3-8b"), ("pp", pipeline, "llama3-70b")):
        path = tmp_path / f"{name}.toml"
        path.write_text(export_torchtitan(plan, load_workload(workload).transformer,
                                          workload).files[0].text)
        paths.append(path)
    seen = run_python(TORCHTITAN_READER, str(paths[0]), "64", "32", str(paths[1]), "64", "80")
    assert seen[0] == {"model": ["llama3", "8B", ["quantize.linear.float8"]],
                       "batch": [2, 256, 8192], "precision": ["bfloat16", "float32"],
                       "dp": [1, 32], "tp": 2, "pp": 1, "reshard": "always",
                       "schedule": "1F1B", "microbatch": 1, "ac": ["selective", "op"],
                       "stages": None}
    # 80 layers over 4 ranks × 2 virtual stages: 8 stages of 10 layers, the plan's split.
    assert seen[1] == {"model": ["llama3", "70B", []], "batch": [32, 64, 8192],
                       "precision": ["bfloat16", "float32"], "dp": [2, 1], "tp": 8, "pp": 4,
                       "reshard": "default", "schedule": "Interleaved1F1B", "microbatch": 1,
                       "ac": ["full", "2"], "stages": [10] * 8}
