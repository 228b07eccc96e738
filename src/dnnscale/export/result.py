"""What an engine exporter returns, and the checks every engine shares.

An exporter maps each plan field to the engine's own option or refuses it with an
`InputError` naming the field and the engine. Where the engine always does one fixed thing
that the plan only prices differently (torchtitan reduces gradients in fp32 whatever
`grad_bytes` says), the export goes on and says so in a note: the run is the plan's, but its
time differs from the prediction in that one respect.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dnnscale.errors import InputError, short_repr
from dnnscale.plan.plan import Collective, ParallelPlan
from dnnscale.plan.rules import check_plan_shape
from dnnscale.workload.transformer_shape import TransformerShape

MAX_WORLD = 1 << 18
"""GPUs an export may launch (tp · pp · dp): about twice the largest clusters built (some 10^5
GPUs); more is a typing slip, not a cluster."""
MAX_GLOBAL_BATCH = 1 << 24
"""Samples per step an export may ask for: the largest published batches of language models
are of the order of 10^4 sequences, so 16,777,216 leaves three orders of magnitude."""

Flag = tuple[str, "str | None"]
"""A command-line option and its value (None for a switch such as ``--bf16``)."""


@dataclass(frozen=True)
class ExportFile:
    """One file of an export: its conventional name and its text."""

    name: str
    text: str


@dataclass(frozen=True)
class EngineExport:
    """An engine's launch configuration: its files (the first is the main one) and notes."""

    engine: str
    files: tuple[ExportFile, ...]
    notes: tuple[str, ...] = field(default=())
    world_size: int = 1
    """GPUs the job needs: tp · pp · dp."""


def zero_stage(plan: ParallelPlan) -> int:
    """The plan's ZeRO stage (0 for plain all-reduce)."""
    aggregation = plan.data.aggregation
    return aggregation.zero_stage if isinstance(aggregation, Collective) else 0


def overlaps_dp(plan: ParallelPlan) -> bool:
    """Whether the plan's data-parallel gradients overlap the backward pass."""
    aggregation = plan.data.aggregation
    return aggregation.overlap if isinstance(aggregation, Collective) else False


def with_kernel_note(result: EngineExport, shape: TransformerShape | None,
                     engine: str) -> EngineExport:
    """`result` with a note where the workload's fused attention kernel is one the engine does
    not run: every engine exported to runs FlashAttention-2 (Megatron's flash backend,
    Megatron-DeepSpeed's --use-flash-attn-v2, PyTorch's SDPA), so a plan priced with another
    kernel's speed will run at FlashAttention-2's."""
    if shape is None or not shape.flash_attention or shape.attention_kernel == "fa2":
        return result
    note = (f"the plan was priced with the {shape.attention_kernel} attention kernel; {engine} "
            f"runs FlashAttention-2, whose published speed differs: predict with "
            f"attention_kernel=fa2 for what {engine} will run")
    return replace(result, notes=(*result.notes, note))


def check_exportable(plan: ParallelPlan, shape: TransformerShape | None, workload: str,
                     engine: str) -> TransformerShape:
    """The checks each engine needs before its flags: a GPU plan, a decoder-only transformer
    workload, and heads and layers that the plan's split divides (plan/rules.py, as `predict`
    checks them: every engine splits heads over tensor-parallel ranks and whole layers over
    pipeline chunks)."""
    if not isinstance(plan.data.aggregation, Collective) or plan.tensor.rules != "megatron":
        raise InputError("plan", f"{engine} runs GPU plans (tp, pp, dp, ...); a Project Adam "
                         f"plan has no engine to export to")
    if shape is None:
        raise InputError("workload", f"{short_repr(workload)} is not a transformer; {engine} "
                         f"needs a transformer workload (a zoo name such as gpt3-175b or "
                         f"llama2-70b, or hf:config.json)")
    if not shape.causal or shape.norm_position != "pre":
        raise InputError("workload", f"{short_repr(workload)} is an encoder (bidirectional or "
                         f"post-norm); the export writes {engine}'s decoder (GPT/Llama) "
                         f"configuration")
    check_plan_shape(plan, shape)
    if plan.workers > MAX_WORLD:
        raise InputError("plan.dp", f"tp·pp·dp = {plan.workers:,} GPUs; {engine} launches at "
                         f"most {MAX_WORLD:,} here (no cluster has that many)")
    if plan.samples_per_step > MAX_GLOBAL_BATCH:
        raise InputError("plan.global_batch", f"{plan.samples_per_step:,} samples per step; at "
                         f"most {MAX_GLOBAL_BATCH:,} (no {engine} run trains batches this large)")
    return shape


def args_text(flags: list[Flag]) -> str:
    """One option per line (``--flag value``), nothing else: ``$(cat FILE)`` or ``xargs`` pass
    it to the engine's script as it is."""
    return "".join(f"{name} {value}\n" if value is not None else f"{name}\n"
                   for name, value in flags)
