"""Train a transformer workload on one GPU and record each step (`dnnscale run --gpu`).

The model is the workload's own shape (runtime/gpt_model.py), the data synthetic token ids
(fixed micro-batches, drawn once from the seed, so the loss falls as the model memorises them),
the optimizer AdamW with clipping (runtime/gpu_optim.py). One step is `global_batch /
micro_batch` micro-batches, each a forward and a backward pass (gradients accumulate), then the
optimizer step. Each step is timed between two device synchronisations and written as a "step"
record of the CPU runtime's JSONL format (runtime/records.py; its communication phases are 0
here), and the run ends with the same "summary" record plus the GPU's facts.

Precisions: `bf16` (default) bf16 weights, gradients and activations with fp32 master weights
and AdamW state — what the model's `bf16` plan prices; `bf16` with `bf16_mode="autocast"` fp32
weights under torch.autocast(bfloat16), PyTorch's usual recipe, which the run records as the
plan's amp 'autocast' (its per-micro-batch weight casts are not in the model); `tf32` fp32 weights with TF32 matmuls; `fp32` plain fp32 (also what a
CPU run uses). Runs on a CPU device too (fp32 or tf32 only), which the tests use.
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from dnnscale.errors import InputError, require_int, require_positive, short_repr

PRECISIONS = ("bf16", "tf32", "fp32")
GRAD_BYTES = {"bf16": 2, "tf32": 4, "fp32": 4}
"""Bytes per gradient value the run keeps, per precision: the weights' own width (bf16
gradients accumulate in bf16 here; nothing is reduced on one GPU). The plan it records says so,
where the planner's default under bf16 is Megatron's fp32 gradients."""
BF16_MODES = ("master", "autocast")
RECOMPUTE = ("none", "full")
MAX_LR = 10.0
"""AdamW learning rates above this diverge at once (language models train at 1e-4 to 1e-2)."""
MAX_SEED = 2**63 - 1
"""torch.manual_seed takes a 64-bit seed; the data generator uses seed + 1."""
MAX_STEP_DATA_BYTES = 4 * 2**30
"""The synthetic token ids of one step (global batch · (seq + 1) int64 values) are drawn on the
host at once: at most 4 GiB of them."""


@dataclass(frozen=True)
class GpuTrainSpec:
    """What one single-device training run does."""

    workload: str
    micro_batch: int
    global_batch: int
    recompute: str = "none"
    precision: str = "bf16"
    bf16_mode: str = "master"
    steps: int = 10
    warmup: int = 3
    lr: float = 3e-4
    seed: int = 0

    def __post_init__(self) -> None:
        require_int("run.micro_batch", self.micro_batch)
        require_int("run.global_batch", self.global_batch)
        if self.global_batch % self.micro_batch:
            raise InputError("run.global_batch", f"{self.global_batch} is not a multiple of "
                             f"the micro-batch {self.micro_batch}")
        for field, value, allowed in (("run.recompute", self.recompute, RECOMPUTE),
                                      ("run.precision", self.precision, PRECISIONS),
                                      ("run.bf16_mode", self.bf16_mode, BF16_MODES)):
            if value not in allowed:
                raise InputError(field, f"must be one of {', '.join(allowed)} on one GPU, got "
                                 f"{short_repr(value)}")
        require_int("run.steps", self.steps)
        require_int("run.warmup", self.warmup, minimum=0)
        if self.warmup >= self.steps:
            raise InputError("run.warmup", f"must be less than --steps ({self.steps}), got "
                             f"{self.warmup}")
        require_positive("run.lr", self.lr)
        if self.lr > MAX_LR:
            raise InputError("run.lr", f"must be <= {MAX_LR:g} (AdamW diverges above), got "
                             f"{self.lr:g}")
        require_int("run.seed", self.seed, minimum=0, maximum=MAX_SEED - 1)

    @property
    def micro_batches(self) -> int:
        return self.global_batch // self.micro_batch

    def plan_dict(self) -> dict[str, Any]:
        """The plan this run executes, as `modern_plan_from_dict` reads it."""
        return single_gpu_plan(self.micro_batch, self.global_batch, self.recompute,
                               self.precision, self.bf16_mode)


RUN_GRAD_ACCUMULATION = "add"
"""How the run accumulates its micro-batches (plan/plan.py GRAD_ACCUMULATION): each
micro-batch's backward adds into .grad through autograd, the first after zero_grad's None
taking the new gradient as it is."""


RUN_LOSS = "torch"
"""How the run computes its loss (workload/transformer_kinds.py LOSS_KERNELS): torch's
cross_entropy on an fp32 cast of the logits (runtime/gpt_model.lm_loss)."""


def run_amp(precision: str, bf16_mode: str) -> str:
    """The mixed-precision mode the run's kernels run in (workload/transformer_kinds.py
    AMP_MODES): 'autocast' for bf16 under torch.autocast, else 'half' (bf16 weights, or a
    4-byte precision)."""
    return "autocast" if precision == "bf16" and bf16_mode == "autocast" else "half"


def run_grad_bytes(precision: str, bf16_mode: str) -> int | None:
    """Bytes per gradient value the run keeps: GRAD_BYTES, but 4 under autocast, whose
    gradients take the float32 weights' width."""
    if run_amp(precision, bf16_mode) == "autocast":
        return 4
    return GRAD_BYTES.get(precision)


def single_gpu_plan(micro_batch: int, global_batch: int, recompute: str, precision: str,
                    bf16_mode: str = "master") -> dict[str, Any]:
    """The plan fields of one-GPU training (tp = pp = dp = 1), as `modern_plan_from_dict`
    reads them: the run's gradient width (`run_grad_bytes`), its accumulation
    (RUN_GRAD_ACCUMULATION), its loss (RUN_LOSS) and its mixed-precision mode (`run_amp`)
    too, so that a prediction of the plan prices what the run does."""
    grad = run_grad_bytes(precision, bf16_mode)
    amp = run_amp(precision, bf16_mode)
    return {"tp": 1, "pp": 1, "dp": 1, "micro_batch": micro_batch, "global_batch": global_batch,
            "recompute": recompute, "precision": precision,
            **({"grad_bytes": grad} if grad is not None else {}),
            "grad_accumulation": RUN_GRAD_ACCUMULATION, "loss": RUN_LOSS,
            **({"amp": amp} if amp != "half" else {})}


def check_step_data(spec: GpuTrainSpec, shape: Any) -> None:
    """The step's synthetic token ids fit in MAX_STEP_DATA_BYTES (checked before any work)."""
    size = spec.global_batch * (shape.seq + 1) * 8
    if size > MAX_STEP_DATA_BYTES:
        raise InputError("plan.global_batch", f"{spec.global_batch:,} samples of "
                         f"{shape.seq + 1:,} token ids are {size / 2**30:,.1f} GiB of data per "
                         f"step; at most {MAX_STEP_DATA_BYTES / 2**30:.0f} GiB")


def transformer_shape(workload: Any, field: str = "workload") -> Any:
    """The workload's TransformerShape; InputError when it has none (a CNN, an imported net)."""
    shape = getattr(workload, "transformer", None)
    if shape is None:
        raise InputError(field, f"{workload.name!r} is not a transformer workload (run --gpu "
                         f"trains zoo transformers and gpt:... names)")
    if shape.memory or shape.positional == "relative":
        raise InputError(field, f"{workload.name!r} is a Transformer-XL (a recurrence memory, "
                         f"relative positions): priced, but run --gpu builds GPT blocks only")
    return shape


@contextlib.contextmanager
def matmul_precision(device: Any, precision: str) -> Iterator[None]:
    """TF32 matmuls on for `tf32`, off otherwise, restored afterwards."""
    import torch

    if device.type != "cuda":
        yield
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = \
        precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def build(spec: GpuTrainSpec, shape: Any, device: Any) -> tuple[Any, Any, Callable[[], Any]]:
    """The module, its optimizer and the autocast context factory of `spec` on `device`."""
    import torch

    from dnnscale.runtime.gpt_model import GptModel
    from dnnscale.runtime.gpu_optim import MasterAdamW, PlainAdamW

    if spec.precision == "bf16" and device.type == "cpu":
        raise InputError("run.precision", "bf16 runs need a GPU; on the CPU use fp32")
    torch.manual_seed(spec.seed)
    with device:  # weights made and initialised where they train (a 1B model in a second)
        model = GptModel(shape, recompute=spec.recompute == "full")
    autocast: Callable[[], Any] = contextlib.nullcontext
    if spec.precision == "bf16" and spec.bf16_mode == "master":
        model.to(torch.bfloat16)
        optimizer: Any = MasterAdamW(model.parameters(), spec.lr)
    else:
        optimizer = PlainAdamW(model.parameters(), spec.lr)
        if spec.precision == "bf16":
            def autocast() -> Any:
                return torch.autocast(device.type, dtype=torch.bfloat16)
    return model, optimizer, autocast


def synthetic_batches(shape: Any, spec: GpuTrainSpec, device: Any) -> tuple[Any, Any]:
    """Token ids and next-token targets, (micro-batches, micro_batch, seq) each, from the seed."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed + 1)
    ids = torch.randint(0, shape.vocab, (spec.micro_batches, spec.micro_batch, shape.seq + 1),
                        generator=generator)
    ids = ids.to(device)
    return ids[..., :-1].contiguous(), ids[..., 1:].contiguous()


def train_gpu(spec: GpuTrainSpec, workload: Any, device: Any, emit: Callable[[dict[str, Any]],
              None] = lambda record: None) -> dict[str, Any]:
    """Train `workload` under `spec` on `device` (a torch.device); `emit` receives each step
    record as it is made. Returns the summary record."""
    import torch

    from dnnscale.runtime.cuda import synchronize
    from dnnscale.runtime.records import summarize, worker_totals

    shape = transformer_shape(workload)
    with matmul_precision(device, spec.precision):
        model, optimizer, autocast = build(spec, shape, device)
        inputs, targets = synthetic_batches(shape, spec, device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        records = []
        for step in range(spec.steps):
            synchronize(device)
            start = time.perf_counter()
            total = torch.zeros((), device=device)
            for i in range(spec.micro_batches):
                with autocast():
                    loss = model(inputs[i], targets[i])
                (loss / spec.micro_batches).backward()
                total += loss.detach().float()
            optimizer.step()
            optimizer.zero_grad()
            loss_value = float(total) / spec.micro_batches
            synchronize(device)
            end = time.perf_counter()
            record = step_record(step, loss_value, spec, shape.seq, start, end, device)
            emit(record)
            records.append(record)
    summary = summarize([worker_totals(records, spec.warmup)], config=spec.plan_dict(),
                        workload=spec.workload, hosts=[platform.node()],
                        torch_version=str(torch.__version__), steps=spec.steps, warmup=spec.warmup,
                        shards=[])
    timed = [r["step_s"] for r in records if r["step"] >= spec.warmup]
    summary.update(gpu_facts(device), runtime="gpu", spec=asdict(spec),
                   step_time_s=statistics.median(timed), step_times_s=timed,
                   tokens_per_s=spec.global_batch * shape.seq / statistics.median(timed),
                   peak_memory_bytes=(torch.cuda.max_memory_allocated(device)
                                      if device.type == "cuda" else None))
    return summary


def step_record(step: int, loss: float, spec: GpuTrainSpec, seq: int, start: float, end: float,
                device: Any) -> dict[str, Any]:
    """A "step" record of runtime/records.py's format: all of the step is compute on one GPU."""
    return {"type": "step", "rank": 0, "role": "worker", "replica": 0, "partition": 0,
            "step": step, "loss": loss, "samples": spec.global_batch,
            "tokens": spec.global_batch * seq, "t_start_s": start, "t_end_s": end,
            "step_s": end - start, "compute_s": end - start, "partition_comm_s": 0.0,
            "ps_push_s": 0.0, "ps_pull_s": 0.0, "allreduce_s": 0.0, "device": str(device)}


def gpu_facts(device: Any) -> dict[str, Any]:
    """The device's name and the CUDA version (plain "cpu" off the GPU)."""
    import torch

    if device.type != "cuda":
        return {"device": str(device), "device_name": platform.processor() or "cpu",
                "cuda_version": None}
    return {"device": str(device), "device_name": torch.cuda.get_device_name(device),
            "cuda_version": torch.version.cuda}
