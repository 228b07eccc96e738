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
from dnnscale.plan.engines import elementwise_difference, plan_facts
from dnnscale.plan.plan import Collective, ParallelPlan
from dnnscale.plan.rules import check_plan_shape
from dnnscale.workload.transformer_shape import TransformerShape

MAX_WORLD = 1 << 18
"""GPUs an export may launch (tp · pp · dp · ep · cp): about twice the largest clusters built
(some 10^5 GPUs); more is a typing slip, not a cluster."""
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
    """GPUs the job needs: tp · pp · dp · ep · cp."""
    assumptions: tuple[str, ...] = field(default=())
    """What the plan's price took for granted that no flag shows (export/assumptions.py)."""


def zero_stage(plan: ParallelPlan) -> int:
    """The plan's ZeRO stage (0 for plain all-reduce)."""
    aggregation = plan.data.aggregation
    return aggregation.zero_stage if isinstance(aggregation, Collective) else 0


def overlaps_dp(plan: ParallelPlan) -> bool:
    """Whether the plan's data-parallel gradients overlap the backward pass."""
    aggregation = plan.data.aggregation
    return aggregation.overlap if isinstance(aggregation, Collective) else False


def mesh_product(plan: ParallelPlan) -> str:
    """The launch's process count as the plan's degrees multiply to it: 'tp·pp·dp = 8·8·12 =
    768', with ·ep and ·cp where they are above 1."""
    names, sizes = ["tp", "pp", "dp"], [plan.tensor.degree, plan.pipeline.stages,
                                        plan.data.replicas]
    for name, size in (("ep", plan.expert.degree), ("cp", plan.context.degree)):
        if size > 1:
            names.append(name)
            sizes.append(size)
    return f"{'·'.join(names)} = {'·'.join(map(str, sizes))} = {plan.workers}"


def engine_data_parallel(plan: ParallelPlan) -> str:
    """The data-parallel size the Megatron dialects derive (world / (TP·PP·CP)): dp, or
    'dp·ep = 1·8 = 8' with expert parallelism (the expert-parallel members take different
    samples, so the engine counts them as data parallel)."""
    size = plan.data.replicas * plan.expert.degree
    if plan.expert.degree == 1:
        return str(size)
    return f"dp·ep = {plan.data.replicas}·{plan.expert.degree} = {size}"


def expert_notes(plan: ParallelPlan, shape: TransformerShape, engine: str,
                 balancing: str) -> list[str]:
    """The notes of a mixture-of-experts export: the plan's expert_imbalance is the router's
    measured load, which no engine option sets (`balancing`: the engine's load-balancing
    setting, which shapes it); none for a dense model or ep = 1 (one member holds every
    expert)."""
    if not shape.is_moe or plan.expert.degree == 1:
        return []
    imbalance = plan.expert.imbalance
    priced = ("uniform routing (expert_imbalance 1)" if imbalance == 1 else
              f"the busiest expert-parallel member at {imbalance:g}× the mean routed tokens "
              f"(expert_imbalance)")
    return [f"the plan priced {priced}: that is the router's measured load, which no {engine} "
            f"option sets; the run's own routing decides it ({balancing}): measure it and "
            f"predict again with the measured expert_imbalance"]


def elementwise_notes(plan: ParallelPlan, shape: TransformerShape, engine: str) -> list[str]:
    """The note of an export whose engine runs the workload's element-wise code otherwise than
    it was priced (plan/engines.elementwise_difference); none where it runs as priced."""
    difference = elementwise_difference(engine, plan_facts(plan), shape)
    return [difference.message] if difference is not None else []


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
    if shape.memory or shape.positional == "relative":
        raise InputError("workload", f"{short_repr(workload)} is a Transformer-XL (a recurrence "
                         f"memory, relative positions); {engine} has no such attention")
    if not shape.causal or shape.norm_position != "pre":
        raise InputError("workload", f"{short_repr(workload)} is an encoder (bidirectional or "
                         f"post-norm); the export writes {engine}'s decoder (GPT/Llama) "
                         f"configuration")
    if shape.predictions:
        raise InputError("workload", f"{short_repr(workload)} runs its LM head on "
                         f"{shape.predictions} of {shape.seq} positions (predictions); "
                         f"{engine}'s decoder computes the loss on every token")
    check_plan_shape(plan, shape)
    if plan.workers > MAX_WORLD:
        raise InputError("plan.dp", f"{mesh_product(plan).rsplit(' = ', 1)[0]} = "
                         f"{plan.workers:,} GPUs; {engine} launches at most {MAX_WORLD:,} here "
                         f"(no cluster has that many)")
    if plan.samples_per_step > MAX_GLOBAL_BATCH:
        raise InputError("plan.global_batch", f"{plan.samples_per_step:,} samples per step; at "
                         f"most {MAX_GLOBAL_BATCH:,} (no {engine} run trains batches this large)")
    return shape


def args_text(flags: list[Flag]) -> str:
    """One option per line (``--flag value``), nothing else: ``$(cat FILE)`` or ``xargs`` pass
    it to the engine's script as it is."""
    return "".join(f"{name} {value}\n" if value is not None else f"{name}\n"
                   for name, value in flags)
