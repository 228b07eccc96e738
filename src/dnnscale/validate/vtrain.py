"""vTrain's published A100 measurements as validation rows: workload, plan and system per row.

The data (data/vtrain-megatron-a100/, MIT licence, see SOURCE.md there): GPT-style models
trained with Megatron-DeepSpeed on A100 nodes of 8 — 1,440 single-node rows (1-8 GPUs) and 109
multi-node rows (64-512 GPUs, 3.6B-175B parameters). Every row ran with full activation
checkpointing, no gradient bucketing and the 1F1B schedule, fp16 mixed precision with Adam
(vTrain's run configurations).
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass
from pathlib import Path

from dnnscale.errors import InputError
from dnnscale.plan.plan import (Batch, Collective, DataParallel, MemoryPolicy, ParallelPlan,
                                Pipeline, Precision, TensorSplit)
from dnnscale.system.gpu import gpu_system
from dnnscale.system.gpu_profile import GpuProfile
from dnnscale.system.system import System
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.workload import Workload

DATA = Path(__file__).resolve().parents[3] / "data" / "vtrain-megatron-a100"
NODE_PRESET = "vtrain-a100"
GPT2_VOCAB = 50257
"""vTrain's vocabulary (its config.py default): GPT-2's BPE."""
VOCAB_DIVISOR = 128
"""Megatron pads the vocabulary to a multiple of 128 · TP (--make-vocab-size-divisible-by)."""
FP16_MIXED = Precision("fp16", param_bytes=2, grad_bytes=2, optimizer_state_bytes=4,
                       activation_bytes=2, master_weights=True)
"""Megatron-DeepSpeed's fp16 training: fp16 weights, gradients (all-reduced in fp16) and
activations, an fp32 master copy and fp32 Adam state."""


@dataclass(frozen=True)
class Row:
    """One measured iteration: the model, the plan, and the time (s)."""

    source: str
    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq: int
    tensor: int
    data: int
    pipeline: int
    measured_s: float

    @property
    def model(self) -> tuple[int, int, int, int]:
        return self.hidden, self.heads, self.layers, self.seq

    @property
    def label(self) -> str:
        return (f"h{self.hidden} L{self.layers} GPUs {self.gpus}: TP{self.tensor} DP{self.data} "
                f"PP{self.pipeline} mb{self.micro_batch} GBS{self.global_batch}")


def _int(value: str) -> int:
    return int(float(value))


def load_rows(source: str, folder: Path = DATA) -> list[Row]:
    """'single' or 'multi': the rows of ground_truth_<source>.csv."""
    if source not in ("single", "multi"):
        raise InputError("source", f"must be 'single' or 'multi', got {source!r}")
    path = folder / f"ground_truth_{source}.csv"
    try:
        with path.open(encoding="utf-8-sig") as handle:
            records = list(csv.reader(handle))[1:]
    except OSError as exc:
        raise InputError("vtrain", f"cannot read {path}: {exc.strerror}") from None
    offset = 1 if source == "multi" else 0  # the multi file starts with a parameter count
    rows = []
    for record in records:
        r = record[offset:]
        rows.append(Row(source, _int(r[0]), _int(r[1]), _int(r[2]), _int(r[3]), _int(r[4]),
                        _int(r[5]), _int(r[6]), _int(r[7]), _int(r[8]), _int(r[9]),
                        float(r[10]) / 1000.0))
    return rows


def padded_vocab(tensor: int, vocab: int = GPT2_VOCAB) -> int:
    """Megatron's padded vocabulary: the next multiple of 128 · TP."""
    multiple = VOCAB_DIVISOR * tensor
    return math.ceil(vocab / multiple) * multiple


@functools.cache
def row_workload(hidden: int, heads: int, layers: int, seq: int, tensor: int) -> Workload:
    """Megatron's GPT (learned positions, LayerNorm, GeLU MLP of 4h, dropout, tied embedding)."""
    return transformer_workload(f"gpt-h{hidden}-L{layers}", layers=layers, hidden=hidden,
                                heads=heads, seq=seq, vocab=padded_vocab(tensor))


VTRAIN_GRAD_ACCUMULATION = "add"
"""How Megatron-DeepSpeed accumulates the rows' micro-batches: through autograd. Under the
DeepSpeed engine the weights have no main_grad for Megatron's fused accumulation to write into
(its ColumnParallelLinear's fused path writes weight.main_grad, which only Megatron's own DDP
creates), and since July 2023 (deepspeedai/Megatron-DeepSpeed 9e72d571, core/tensor_parallel/
layers.py: "TODO: temporary commented") the fused path is commented out and every weight
gradient is a plain matmul that autograd adds into .grad."""


VTRAIN_SCATTER_GATHER = True
"""How the rows' pipeline stages send: each tensor member 1/t of the boundary tensor, all-gathered
by the receivers. With pp > 1, Megatron-DeepSpeed's pretrain_gpt.py builds GPTModelPipe, run by
DeepSpeed's PipelineEngine, whose pipe_partitioned and grad_partitioned are on by default
(deepspeed/runtime/config.py) for dense models (GPTModelPipe asserts them off only with experts);
vTrain's configuration files set no pipeline option."""


def row_plan(row: Row) -> ParallelPlan:
    """The row's plan: Megatron TP, 1F1B PP with partitioned sends (VTRAIN_SCATTER_GATHER),
    plain all-reduce DP without bucketing, full recompute, fp16 mixed precision with Adam,
    gradients accumulated by autograd (VTRAIN_GRAD_ACCUMULATION)."""
    micro_batches = row.global_batch // (row.data * row.micro_batch)
    return ParallelPlan(tensor=TensorSplit(row.tensor, "megatron"),
                        pipeline=Pipeline(row.pipeline, "1f1b",
                                          scatter_gather=VTRAIN_SCATTER_GATHER),
                        data=DataParallel(row.data, Collective("ring", 0, overlap=False)),
                        batch=Batch(row.micro_batch, micro_batches, VTRAIN_GRAD_ACCUMULATION),
                        memory=MemoryPolicy("full"), precision=FP16_MIXED, optimizer="adam")


def row_system(row: Row, profile: GpuProfile | None) -> System:
    return gpu_system(NODE_PRESET, max(1, math.ceil(row.gpus / 8)), profile)


def predict_row(row: Row, profile: GpuProfile | None) -> float:
    """Predicted iteration time (s) of `row` with the GPU efficiency `profile`."""
    from dnnscale.model.predict import predict_plan

    workload = row_workload(row.hidden, row.heads, row.layers, row.seq, row.tensor)
    return predict_plan(workload, row_system(row, profile), row_plan(row)).step_time_s
