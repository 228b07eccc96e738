"""`dnnscale run --gpu`: train a transformer workload on one GPU (runtime/gpu_train.py).

Called by runtime/commands.py once it sees --gpu. Cheap to import (no torch): torch loads when
the run starts. The plan comes from --config (a GPU plan YAML) and the GPU plan flags; it must
be one device (tp = pp = dp = 1), recompute none or full, precision bf16, tf32 or fp32.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any, Optional

from dnnscale.errors import CommandFailed, InputError, short_repr

NOT_RUN = (("sequence_parallel", False, "with no tensor split to spread the norms over"),
           ("overlap_dp", False, "with no data-parallel reduction to overlap"),
           ("schedule", "1f1b", "with no pipeline to schedule"))
"""Plan fields one-GPU training has nothing to do with: a value other than the default would
be ignored, so it is refused (the run records the plan it trains)."""


def gpu_spec(workload: str, config: Optional[Path], plan_flags: dict[str, Any],
             **run: Any) -> Any:
    """The GpuTrainSpec of a --config plan file and the flags given (flags win)."""
    from dnnscale.plan.modern import modern_plan_from_dict
    from dnnscale.runtime.gpu_train import (RUN_GRAD_ACCUMULATION, RUN_LOSS, GpuTrainSpec,
                                            run_amp, run_grad_bytes)
    from dnnscale.workload.transformer_kinds import AMP_NAMES
    from dnnscale.yamlio import load_yaml_file

    data: dict[str, Any] = load_yaml_file(config, "config") if config else {}
    if not isinstance(data, dict):
        raise InputError("config", "must be a mapping of plan fields")
    data = {**data, **{k: v for k, v in plan_flags.items() if v is not None}}
    data.setdefault("micro_batch", 1)
    data.setdefault("precision", "bf16")
    bf16_mode = str(run.get("bf16_mode", "master"))
    run_grad = run_grad_bytes(str(data["precision"]), bf16_mode)
    if run_grad is not None:
        data.setdefault("grad_bytes", run_grad)
    data.setdefault("grad_accumulation", RUN_GRAD_ACCUMULATION)
    data.setdefault("loss", RUN_LOSS)
    amp = run_amp(str(data["precision"]), bf16_mode)
    if amp != "half":
        data.setdefault("amp", amp)
    plan = modern_plan_from_dict(data)  # the plan's own validation, fields named as there
    for key, one in (("tp", 1), ("pp", 1), ("dp", 1), ("zero", 0)):
        if data.get(key, one) != one:
            raise InputError(f"plan.{key}", f"run --gpu trains on one GPU: must be {one}, got "
                             f"{data[key]}")
    for key, none, why in NOT_RUN:
        if data.get(key, none) not in (none, None):
            raise InputError(f"plan.{key}", f"run --gpu trains on one GPU, {why}: must be "
                             f"{str(none).lower()} or left out, got {data[key]!r}")
    if run_grad is not None and plan.precision.grad_bytes != run_grad:
        raise InputError("plan.grad_bytes", f"run --gpu keeps {plan.precision.compute}'s "
                         f"{run_grad}-byte gradients (there is no reduction to widen or "
                         f"narrow), got {plan.precision.grad_bytes}")
    if plan.batch.grad_accumulation != RUN_GRAD_ACCUMULATION:
        raise InputError("plan.grad_accumulation", f"run --gpu accumulates its micro-batches "
                         f"through autograd ({RUN_GRAD_ACCUMULATION}), got "
                         f"{plan.batch.grad_accumulation}")
    if plan.memory.loss != RUN_LOSS:
        raise InputError("plan.loss", f"run --gpu computes its loss with torch's cross_entropy "
                         f"on an fp32 cast of the logits ({RUN_LOSS}), got {plan.memory.loss}")
    if plan.precision.amp != amp:
        raise InputError("plan.amp", f"run --gpu runs {AMP_NAMES[amp]} (amp {amp}: "
                         f"--precision {data['precision']} --bf16-mode {bf16_mode}), got "
                         f"{plan.precision.amp}")
    return GpuTrainSpec(workload=workload, micro_batch=plan.batch.micro_batch,
                        global_batch=plan.batch.micro_batch * plan.batch.accumulation,
                        recompute=plan.memory.recompute, precision=str(data["precision"]),
                        **run)


def run_gpu(spec: Any, device_text: str, output: Optional[Path], as_json: bool) -> None:
    """Check the workload and the device, train, write the records, print the summary."""
    from dnnscale.runtime.cuda import cuda_device
    from dnnscale.runtime.gpu_train import check_step_data, transformer_shape

    workload = _load(spec.workload)
    check_step_data(spec, transformer_shape(workload, "--workload"))
    if output is not None:
        from dnnscale.atomic import check_output_path

        check_output_path(output, "--output")
    device = cuda_device(device_text)
    if output is None:
        summary = _train(spec, workload, device, None)
    else:
        from dnnscale.atomic import atomic_output

        with atomic_output(output, "--output", partial=True) as temp:
            summary = _train(spec, workload, device, temp)
    print_summary(summary, as_json)


def _load(name: str) -> Any:
    """The workload `-w` names, its errors naming --workload (what the user typed)."""
    from dnnscale.workload import load_workload
    from dnnscale.workload.source import is_factory_spec

    if is_factory_spec(name):
        raise InputError("--workload", f"{short_repr(name)}: run --gpu trains transformer "
                         f"workloads (zoo names, gpt:..., hf:config.json), not a PyTorch module")
    try:
        return load_workload(name)
    except InputError as exc:
        if exc.field not in ("workload", "--hf-config"):
            raise
        raise InputError("--workload", exc.problem) from None


def _train(spec: Any, workload: Any, device: Any, path: Optional[Path]) -> dict[str, Any]:
    import torch

    from dnnscale.runtime.cuda import failure_reason
    from dnnscale.runtime.gpu_train import train_gpu
    from dnnscale.runtime.records import JsonlWriter

    writer = JsonlWriter(path) if path is not None else None
    try:
        if writer is not None:
            writer.write({"type": "start", "rank": 0, "role": "worker", "replica": 0,
                          "partition": 0, "pid": os.getpid(), "host": platform.node(),
                          "time_unix_s": time.time()})
        try:
            summary = train_gpu(spec, workload, device,
                                writer.write if writer is not None else lambda record: None)
        except torch.cuda.OutOfMemoryError as exc:
            raise CommandFailed(f"run --gpu: {failure_reason(exc)} on {device}") from None
        if writer is not None:
            writer.write(summary)
        return summary
    finally:
        if writer is not None:
            writer.close()


def print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        from dnnscale.jsonout import print_json

        print_json(summary)
        return
    print(f"{summary['workload']}: {summary['steps']} steps on {summary['device_name']} "
          f"({summary['device']}), step {summary['step_time_s'] * 1e3:.2f} ms (median after "
          f"{summary['warmup']} warm-up), {summary['tokens_per_s']:,.0f} tokens/s, "
          f"{summary['measured_throughput_samples_per_s']:.2f} samples/s, loss "
          f"{summary['loss_first']:.4f} -> {summary['loss_last']:.4f}")
