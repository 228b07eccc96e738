"""The exported Megatron-LM launch, run through Megatron-LM's own start-up checks (no GPU).

Megatron-LM's ``megatron/training`` (its parser and ``validate_args``) is not on PyPI: the
megatron-core wheel and sdist ship ``megatron/core`` only. So these tests run against a
checkout of NVIDIA/Megatron-LM named by ``DNNSCALE_MEGATRON_LM`` and skip without one, e.g.
(after ``git archive`` of it into /tmp/megatron-lm)::

    DNNSCALE_MEGATRON_LM=/tmp/megatron-lm pytest tests/test_export_megatron_validate.py

(docs/export.md records the commit checked and the outcome.) What runs, for each plan:

1. the exported torchrun script itself (``sh megatron-launch.sh``) with a stand-in ``torchrun``
   first on PATH that records its arguments and ``CUDA_DEVICE_MAX_CONNECTIONS``, so that the
   environment and the options checked are the ones the script launches with;
2. in one subprocess with the checkout on PYTHONPATH (and this interpreter's CPU torch), what
   ``pretrain_gpt.py`` does before it builds the model: ``parse_and_validate_args`` with its
   ``args_defaults`` (``parse_args`` on the recorded options after ``pretrain_gpt.py``,
   ``validate_args``, then ``set_global_variables``, which builds the NullTokenizer and the
   micro-batch calculator that checks global = micro · micro-batches · DP), then
   ``gpt_config_from_args`` (``TransformerConfig.__post_init__``: the recomputation rules, ...)
   and ``pretrain_cfg_container_from_args``. WORLD_SIZE is the script's nodes · GPUs per node,
   RANK 0.

Stubs, each only where the checks would otherwise need a GPU or Python 3.12 at import:

- ``get_device_arch_version`` (it reads ``torch.cuda.get_device_properties``) returns the
  compute capability's major of the GPU the case names: 8 (A100) unless a case says otherwise.
  validate_args keys the CUDA_DEVICE_MAX_CONNECTIONS assertion on it (< 10).
- Eight Triton kernel modules (megatron/core/ssm/ops/{common,mamba2}/*, megatron/core/
  transformer/moe/ops/paged_stash.py) import ``triton`` at top level; triton is not installed
  here (it is a GPU compiler) and nothing in the checks calls their kernels, so those modules
  are empty stand-ins whose every attribute is a no-op.
- Transformer Engine's fused RoPE kernels, which ``megatron/core/models/common/embeddings/
  rope_utils.py`` sets to None without TE (a CUDA package), are no-op stand-ins:
  ``TransformerConfig`` checks that they exist because RoPE fusion is on by default.
- ``typing.override`` (Python 3.12; Megatron-LM declares Python >= 3.12, this venv is 3.11) is
  an identity decorator. Every file under megatron/ compiles under 3.11.

Negative controls show the checks are live: the same GPT-3 options without the variable, and a
Megatron-FSDP plan with it set to 1, are refused by Megatron's own assertions.
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

from dnnscale.errors import InputError
from dnnscale.export.megatron import export_megatron
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.workload import load_workload

CHECKOUT = os.environ.get("DNNSCALE_MEGATRON_LM")
HAS_CHECKOUT = bool(CHECKOUT) and (Path(CHECKOUT) / "megatron/training/arguments.py").is_file()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAS_CHECKOUT, reason="set DNNSCALE_MEGATRON_LM to a Megatron-LM "
                       "checkout (megatron/training is not on PyPI; see the module docstring)"),
    pytest.mark.skipif(find_spec("torch") is None, reason="Megatron-LM's parser imports torch"),
]

# The plan `optimize -w gpt3-175b -c dgx-a100-80g:64 --global-batch 1536` chose at 5cc330f
# (the README's tour): TP 4, PP 4 interleaved with 4 chunks, DP 32, ZeRO-1, selective.
README_GPT3 = dict(tp=4, pp=4, dp=32, micro_batch=1, global_batch=1536, schedule="interleaved",
                   virtual_stages=4, zero=1, recompute="selective", precision="bf16",
                   sequence_parallel=True, overlap_dp=False, grad_bytes=2)
NARAYANAN_GPT3 = dict(tp=8, pp=8, dp=12, micro_batch=1, global_batch=1536,
                      schedule="interleaved", virtual_stages=2, zero=1, recompute="selective",
                      precision="bf16", sequence_parallel=True, overlap_dp=True)
LLAMA70_FULL = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, zero=1,
                    recompute="full", precision="bf16", sequence_parallel=True, overlap_dp=True,
                    grad_bytes=4)
LLAMA8_FSDP = dict(tp=2, pp=1, dp=32, micro_batch=2, global_batch=256, zero=3,
                   recompute="selective", precision="fp8", sequence_parallel=True,
                   overlap_dp=True)
GPT_ZERO2_FP16 = dict(tp=4, pp=1, dp=8, micro_batch=4, global_batch=64, zero=2,
                      recompute="full", precision="fp16", grad_bytes=4)
FP32_PIPELINE = dict(tp=1, pp=2, dp=2, micro_batch=1, global_batch=8, precision="fp32")
OVERLAPS = dict(tp=8, pp=4, dp=4, micro_batch=1, global_batch=512, schedule="interleaved",
                virtual_stages=2, zero=1, recompute="selective", precision="bf16",
                sequence_parallel=True, overlap_tp=True, overlap_pp=False)
HF_INTERLEAVED = dict(tp=4, pp=2, dp=2, micro_batch=2, global_batch=64, schedule="interleaved",
                      virtual_stages=2, zero=0, recompute="none", precision="bf16",
                      sequence_parallel=False)

# Hugging Face's config.json of Meta-Llama-3-8B (the keys dnnscale reads).
LLAMA3_8B_CONFIG = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                    "num_attention_heads": 32, "num_key_value_heads": 8,
                    "num_hidden_layers": 32, "vocab_size": 128256,
                    "max_position_embeddings": 8192, "rope_theta": 500000.0,
                    "tie_word_embeddings": False}

FAKE_TORCHRUN = """\
#!{python}
import json, os, sys
with open(os.environ["DNNSCALE_TORCHRUN_RECORD"], "w") as out:
    json.dump({{"argv": sys.argv[1:],
               "connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}}, out)
"""

MEGATRON_READER = """
    import importlib.abc, importlib.machinery, json, os, sys, typing

    KERNELS = {
        "megatron.core.ssm.ops.common.causal_conv1d_varlen",
        "megatron.core.ssm.ops.mamba2.batch_invariant_decode",
        "megatron.core.ssm.ops.mamba2.ssd_bmm", "megatron.core.ssm.ops.mamba2.ssd_chunk_scan",
        "megatron.core.ssm.ops.mamba2.ssd_chunk_state",
        "megatron.core.ssm.ops.mamba2.ssd_combined",
        "megatron.core.ssm.ops.mamba2.ssd_state_passing",
        "megatron.core.transformer.moe.ops.paged_stash"}

    class NoOp:
        def __call__(self, *args, **kwargs):  # a decorator returns what it decorates
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else NoOp()
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return NoOp()

    class KernelStandIns(importlib.abc.Loader, importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            return importlib.machinery.ModuleSpec(name, self) if name in KERNELS else None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            module.__getattr__ = NoOp().__getattr__

    sys.meta_path.insert(0, KernelStandIns())
    if not hasattr(typing, "override"):
        typing.override = lambda function: function

    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.training.arguments as arguments
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.training.argument_utils import (gpt_config_from_args,
                                                  pretrain_cfg_container_from_args)
    from megatron.training.global_vars import get_tokenizer, unset_global_variables

    for kernel in ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"):
        if getattr(rope_utils, kernel) is None:  # Transformer Engine's; a GPU package
            setattr(rope_utils, kernel, NoOp())

    results = []
    for case in json.load(open(sys.argv[1])):
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        if case["connections"] is not None:
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = case["connections"]
        os.environ["WORLD_SIZE"], os.environ["RANK"] = str(case["world"]), "0"
        arguments.get_device_arch_version = lambda: case["arch"]
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        try:  # as pretrain_gpt.py's __main__ does, up to building the model
            args = arguments.parse_and_validate_args(
                args_defaults={"tokenizer_type": "GPT2BPETokenizer"})
            model = gpt_config_from_args(args)
            pretrain_cfg_container_from_args(args, model)
        except (AssertionError, ValueError, RuntimeError, SystemExit) as exc:
            results.append({"error": f"{type(exc).__name__}: {exc}"})
            unset_global_variables()
            continue
        t = model.transformer
        results.append({
            "dp": args.data_parallel_size, "vpp": args.virtual_pipeline_model_parallel_size,
            "microbatches": get_num_microbatches(), "tokenizer": args.tokenizer_type,
            "vocab": get_tokenizer().vocab_size, "padded_vocab": args.padded_vocab_size,
            "recompute": [t.recompute_granularity, t.recompute_method,
                          t.recompute_num_layers, t.recompute_modules],
            "rotary_base": model.rotary_base, "sequence_parallel": t.sequence_parallel,
            "fsdp": args.use_megatron_fsdp, "distributed_optimizer": args.use_distributed_optimizer,
            "query_groups": t.num_query_groups, "ffn": t.ffn_hidden_size,
            "params_dtype": str(args.params_dtype), "fp8": t.fp8,
            "attention_backend": t.attention_backend.name,
            "tp_comm_overlap": bool(args.tp_comm_overlap),
            "overlap_p2p_comm": bool(args.overlap_p2p_comm)})
        unset_global_variables()
    print(json.dumps(results))
"""


def launched(tmp_path: Path, name: str, plan, workload: str) -> dict:
    """Run the exported torchrun script of `plan` (a plan mapping or a ParallelPlan) with the
    stand-in torchrun; what it was started with."""
    shape = load_workload(workload).transformer
    script = tmp_path / f"{name}.sh"
    plan = modern_plan_from_dict(plan) if isinstance(plan, dict) else plan
    script.write_text(export_megatron(plan, shape, workload,
                                      output_format="torchrun").files[0].text)
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
            "arch": 8}


def megatron_checks(tmp_path: Path, cases: list[dict]) -> list[dict]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": CHECKOUT or "", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(MEGATRON_READER), str(path)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_exported_launches_pass_megatron_validate_args(tmp_path) -> None:
    config = tmp_path / "Meta-Llama-3-8B" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(LLAMA3_8B_CONFIG))
    runs = [launched(tmp_path, name, plan, workload) for name, plan, workload in (
        ("readme", README_GPT3, "gpt3-175b"), ("narayanan", NARAYANAN_GPT3, "gpt3-175b"),
        ("llama70", LLAMA70_FULL, "llama3-70b"), ("llama8", LLAMA8_FSDP, "llama3-8b"),
        ("zero2", GPT_ZERO2_FP16, "gpt3-6.7b"), ("fp32", FP32_PIPELINE, "gpt3-125m"),
        ("hf", HF_INTERLEAVED, f"hf:{config}:flash=true"))]
    # The scripts' environment: =1 with TP > 1, unset under Megatron-FSDP, untouched otherwise.
    assert [run["connections"] for run in runs] == ["1", "1", "1", None, None, None, "1"]
    controls = [{**runs[0], "connections": None},           # TP 4 without the variable
                {**runs[3], "connections": "1"},            # Megatron-FSDP with it set to 1
                {**runs[0], "connections": None, "arch": 10}]   # Blackwell needs none
    readme, narayanan, llama70, llama8, zero2, fp32, hf, *refused = \
        megatron_checks(tmp_path, runs + controls)
    for result in (readme, narayanan, llama70, llama8, zero2, fp32, hf):
        assert "error" not in result, result
    # 512 GPUs / (TP 4 · PP 4) = DP 32; 1536 / (1 · 32) = 48 micro-batches; 96 layers over
    # 4 stages of 4 chunks; the NullTokenizer's 50,257 tokens padded to a multiple of 128 · TP.
    assert readme == {"dp": 32, "vpp": 4, "microbatches": 48, "tokenizer": "NullTokenizer",
                      "vocab": 50257, "padded_vocab": 50688,
                      "recompute": ["selective", None, None, ["core_attn"]],
                      "rotary_base": 10000, "sequence_parallel": True, "fsdp": False,
                      "distributed_optimizer": True, "query_groups": 96, "ffn": 49152,
                      "params_dtype": "torch.bfloat16", "fp8": None,
                      "attention_backend": "auto", "tp_comm_overlap": False,
                      "overlap_p2p_comm": True}
    assert (narayanan["dp"], narayanan["vpp"], narayanan["microbatches"]) == (12, 2, 128)
    assert llama70["recompute"] == ["full", "uniform", 1, ["core_attn"]]
    assert (llama70["rotary_base"], llama70["query_groups"], llama70["ffn"]) == (500000, 8, 28672)
    assert llama70["padded_vocab"] == 129024          # 128,256 up to a multiple of 128 · 8
    assert llama8["fsdp"] and llama8["fp8"] == "hybrid" and llama8["microbatches"] == 4  # 256/(2·32)
    assert zero2["fsdp"] and zero2["params_dtype"] == "torch.float16"
    assert (fp32["dp"], fp32["vpp"], fp32["params_dtype"]) == (2, None, "torch.float32")
    assert (hf["rotary_base"], hf["vpp"], hf["sequence_parallel"]) == (500000, 2, False)
    assert hf["attention_backend"] == "flash"                 # the workload's flash=true
    no_variable, fsdp_with_one, blackwell = refused
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in no_variable["error"]
    assert "FSDP requires CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset" in fsdp_with_one["error"]
    assert "error" not in blackwell


def test_overlap_options_pass_megatron_validate_args(tmp_path) -> None:
    """overlap_tp exports --tp-comm-overlap and overlap_pp false --no-overlap-p2p-communication;
    Megatron reads both (tp_comm_overlap on, overlap_p2p_comm off), and the default
    interleaved plan keeps its p2p overlap on. Negative control: Megatron asserts pp > 2 for an
    interleaved schedule without the overlap, the rule plan/engines.py states."""
    overlaps = launched(tmp_path, "overlaps", OVERLAPS, "gpt3-175b")
    default = launched(tmp_path, "default", {**OVERLAPS, "overlap_tp": False,
                                             "overlap_pp": None}, "gpt3-175b")
    argv = list(overlaps["argv"])
    argv[argv.index("--pipeline-model-parallel-size") + 1] = "2"   # same world: DP 8
    two_stages = {**overlaps, "argv": argv}
    on, off, refused = megatron_checks(tmp_path, [overlaps, default, two_stages])
    assert "error" not in on and "error" not in off, (on, off)
    assert (on["tp_comm_overlap"], on["overlap_p2p_comm"]) == (True, False)
    assert (off["tp_comm_overlap"], off["overlap_p2p_comm"]) == (False, True)
    assert "p2p communication overlap is disabled" in refused.get("error", ""), refused
    with pytest.raises(InputError) as caught:
        export_megatron(modern_plan_from_dict({**OVERLAPS, "pp": 2, "global_batch": 256}),
                        load_workload("gpt3-175b").transformer, "gpt3-175b")
    assert caught.value.field == "plan.overlap_pp"


def test_the_readme_winner_for_megatron_passes_validate_args(tmp_path) -> None:
    """The README's tour as it runs at HEAD: `optimize ... --engine megatron`'s own winner
    (not a copy of it), exported as a torchrun script, through Megatron's checks."""
    import dnnscale

    best = dnnscale.optimize("gpt3-175b", "dgx-a100-80g:64", global_batch=1536,
                             engine="megatron", curve=False).best
    run = launched(tmp_path, "winner", best.plan, "gpt3-175b")
    plan = best.plan
    fsdp = plan.data.aggregation.zero_stage >= 2
    assert run["connections"] == ("1" if plan.tensor.degree > 1 and not fsdp else None)
    (result,) = megatron_checks(tmp_path, [run])
    assert "error" not in result, result
    assert result["dp"] == plan.data.replicas
    assert result["microbatches"] == plan.batch.accumulation
