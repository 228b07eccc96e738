"""What every row of a prediction means: one sentence per step part, memory part, utilisation.

The text is written once here and read by `predict --explain`, the tables, the HTML report and
the test that checks docs/report.md lists every name. Each sentence says what the model counts
in that row (see docs/model.md for the formulas); a name the model emits without an entry here
fails tests/test_report_explain.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dnnscale.model.prediction import MemoryPart, Prediction, StepPart
from dnnscale.model.records import Part, PartKind
from dnnscale.model.stage import LayerCost
from dnnscale.plan.plan import ParallelPlan
from dnnscale.workload.workload import Workload

PART_TEXT: dict[Part, str] = {
    # the layers' work, per step on the most loaded worker (device) of the slowest stage
    Part.FORWARD: "computing every layer's forward pass on the worker's share of the layers "
                  "(the most loaded worker; on a pipeline, the slowest stage, all micro-batches)",
    Part.INPUT_GRAD: "backward pass: the gradient of each layer's input, passed to the layer "
                     "below (the first weighted layer needs none)",
    Part.WEIGHT_GRAD: "backward pass: the gradient of each layer's weights",
    Part.COMPUTE: "the sum of forward, input_grad and weight_grad (not a separate activity)",
    Part.RECOMPUTE: "forward work done again in the backward pass because activation "
                    "recomputation dropped those activations (--recompute selective or full)",
    Part.GRAD_ACCUMULATION: "joining each micro-batch's weight gradients to the step's: the "
                            "passes over the gradients that the plan's grad_accumulation "
                            "(fused, add or clip_add) streams through memory",
    # communication
    Part.PARTITION_COMM: "traffic between the P workers of one replica caused by splitting the "
                         "layers across them (activations gathered, input gradients reduced; "
                         "Adam's model parallelism)",
    Part.TP_COMM: "tensor-parallel collectives inside each layer (all-reduce, or all-gather and "
                  "reduce-scatter with sequence parallelism) among the TP group",
    Part.EP_COMM: "expert parallelism's all-to-alls: each MoE layer's routed tokens sent to "
                  "the members holding their experts (dispatch) and back (combine), forward "
                  "and backward, among the ep group; the busiest member's load sets the time",
    Part.CP_COMM: "context parallelism's exchange among the cp group: ring attention's K/V "
                  "block sends not hidden behind the attention compute, or the Ulysses "
                  "all-to-alls around it",
    Part.PP_COMM: "point-to-point sends between adjacent pipeline stages: activations forward, "
                  "input gradients backward, every micro-batch",
    Part.PS_PUSH: "the worker sending its share of the weight updates to the parameter-server "
                  "shards (one message per shard)",
    Part.PS_PULL: "the worker fetching its share of fresh weights from the parameter-server shards",
    Part.ALLREDUCE: "ring all-reduce of the gradients among the replicas holding the same "
                    "partition",
    Part.DP_COMM: "data-parallel traffic among the replicas (all-reduce, or ZeRO's "
                  "reduce-scatter and all-gather), the part not hidden behind the forward and "
                  "backward passes, plus the compute's slowdown beside the hidden part",
    # waits
    Part.PS_SERVE_WAIT: "the worker waiting for the busiest parameter-server shard, which serves "
                        "the replica's P workers one request at a time, beyond the worker's own "
                        "push and pull time",
    Part.PS_WAIT: "idle time imposed by the parameter servers' capacity (network or CPU): the "
                  "replicas together cannot go faster than the busiest shard serves them (R·n/X "
                  "minus the worker's own step)",
    Part.LAUNCH_WAIT: "the device idle while the host launches kernels: the step is host bound "
                      "where the launches take longer than the kernels",
    Part.SLOWEST_DEVICE: "every device waiting for the slowest of the plan's devices: identical "
                         "GPUs run at different speeds, and every collective waits for its "
                         "slowest member, so the compute and recompute take that much longer",
    Part.BUBBLE: "pipeline bubble: stages idle while the pipeline fills and drains "
                 "((p−1)/(v·m) of the ideal time for equal stages)",
    # updates
    Part.PS_APPLY: "the parameter-server shards applying all R replicas' updates while the "
                   "workers wait (synchronous SGD)",
    Part.UPDATE: "the worker applying the weight update to its own copy (all-reduce plans)",
    Part.EXCHANGE_CPU: "the CPU an overlapped parameter-server exchange takes from the worker's "
                       "own compute under a CPU quota (its network time stays hidden)",
    Part.OPTIMIZER_STEP: "the optimizer updating the device's weights (memory bound; its 1/d "
                         "shard under ZeRO)",
    Part.STEP: "the whole step: from one step's start to the next on one replica",
}

MEMORY_TEXT: dict[str, str] = {
    "weights": "the parameters the device holds (its share of the layers; 1/d of them under "
               "ZeRO-3)",
    "gradients": "the gradient buffer for those parameters (1/d under ZeRO-2 and -3)",
    "optimizer_state": "the optimizer's values per parameter (momentum; Adam's m and v; the fp32 "
                       "master copy under mixed precision; 1/d under ZeRO-1 and up)",
    "activations": "activations kept from the forward for the backward pass (the micro-batches "
                   "in flight on a pipeline; less with recomputation)",
    "loss": "the loss over the vocabulary on the last stage: what each micro-batch in flight "
            "keeps for its backward (its softmax, or the logits) and what the one being "
            "computed holds beyond that at its peak (--loss: how it is computed)",
    "reserve": "memory no tensor can use: the CUDA context, cuBLAS's workspace and NCCL's "
               "buffers for each parallel group (allocator fragmentation not counted)",
    "ps_weights": "the weights one parameter-server shard stores (ceil(W/S) parameters)",
    "ps_optimizer_state": "the optimizer state one parameter-server shard keeps",
}

UTILIZATION_TEXT: dict[str, str] = {
    "worker_compute": "fraction of the step the worker computes",
    "partition_network": "fraction of the step the worker's NIC moves partition traffic",
    "worker_ps_network": "fraction of the step the worker's NIC talks to the parameter servers",
    "ps_network": "load on the busiest parameter-server shard's NIC (1.0 = saturated)",
    "ps_cpu": "load on the busiest parameter-server shard's CPU (1.0 = saturated)",
    "allreduce_network": "fraction of the step in the gradient all-reduce",
    "compute": "fraction of the step the device computes (recomputation included)",
    "tp_network": "fraction of the step in tensor-parallel collectives",
    "pp_network": "fraction of the step in pipeline sends",
    "ep_network": "fraction of the step in expert parallelism's all-to-alls",
    "cp_network": "fraction of the step in context parallelism's exposed exchange",
    "dp_network": "fraction of the step in data-parallel communication",
}

def part_text(name: str) -> str:
    """The sentence for a step part (a plain fallback for a name without one)."""
    return PART_TEXT.get(name, "(no description yet)")


def memory_text(name: str) -> str:
    return MEMORY_TEXT.get(name, "(no description yet)")


def utilization_text(name: str) -> str:
    return UTILIZATION_TEXT.get(name, "(no description yet)")


def human(name: str) -> str:
    """'input_grad' -> 'input grad'."""
    return name.replace("_", " ")


@dataclass(frozen=True)
class BreakdownRow:
    """One row of the breakdown: a part, and how deep it is nested (a sum's parts are 1)."""

    part: StepPart
    depth: int

    @property
    def name(self) -> Part:
        return self.part.name


def breakdown_rows(prediction: Prediction) -> list[BreakdownRow]:
    """The step's parts in display order: each sum first with its parts nested under it, then
    the others; 'step' last. A part that belongs to a sum is shown only under it."""
    parts = prediction.parts
    by_name = {part.name: part for part in parts}
    inside = {name for part in parts if part.kind == PartKind.SUM for name in part.of}
    rows: list[BreakdownRow] = []
    for part in parts:
        if part.name in inside or part.kind == PartKind.TOTAL:
            continue
        rows.append(BreakdownRow(part, 0))
        if part.kind == PartKind.SUM:
            rows += [BreakdownRow(by_name[name], 1) for name in part.of if name in by_name]
    rows += [BreakdownRow(part, 0) for part in parts if part.kind == PartKind.TOTAL]
    return rows


def activities(prediction: Prediction) -> list[StepPart]:
    """The parts that are activities of their own (no sums, no total), in the model's order:
    they add up to the step unless the plan overlaps communication with computation."""
    return [part for part in prediction.parts
            if part.kind not in (PartKind.SUM, PartKind.TOTAL)]


def block_runs(blocks: Sequence[int]) -> list[tuple[int, int]]:
    """(first, last) of each run of consecutive block numbers, in order: a stage's chunks."""
    runs: list[tuple[int, int]] = []
    for block in sorted(set(blocks)):
        if runs and block == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], block)
        else:
            runs.append((block, block))
    return runs


def stage_label(index: int, layers: Sequence[LayerCost], stages: int,
                most_chunks: int | None = None) -> str:
    """A pipeline stage by the layers the model gave it: 'stage 1: embedding + blocks 0–11',
    'stage 8: blocks 84–95 + 3 output layers'; an interleaved stage by its chunks, 'stage 1:
    embedding + blocks 0–5, 24–29, 48–53, 72–77' (each run of consecutive blocks is a chunk:
    model/schedule.py gives chunk c to device c mod p, so one device's chunks never touch).
    `most_chunks`: list at most that many chunks, the first ones and the last ('0–2, 12–14,
    …, 84–86'). A stage costed from block totals, without its layers: 'stage 2'; one stage:
    the device."""
    if stages == 1:
        return "device (the most loaded of its group)"
    if not layers:
        return f"stage {index + 1}"
    blocks = [layer.block for layer in layers if layer.block is not None]
    if not blocks:
        return f"stage {index + 1}: {layers[0].name}–{layers[-1].name}"
    first = next(i for i, layer in enumerate(layers) if layer.block is not None)
    before = list(dict.fromkeys(layer.kind for layer in layers[:first] if layer.block is None))
    after = [layer for layer in layers[first:] if layer.block is None]
    runs = [f"{a}–{b}" if b > a else f"{a}" for a, b in block_runs(blocks)]
    if most_chunks is not None and len(runs) > max(2, most_chunks):
        runs = runs[:most_chunks - 1] + ["…", runs[-1]]
    label = f"stage {index + 1}: " + "".join(f"{kind} + " for kind in before)
    label += f"block{'s' if len(set(blocks)) > 1 else ''} " + ", ".join(runs)
    if after:
        label += f" + {len(after)} output layer{'s' if len(after) > 1 else ''}"
    return label


NO_RESERVE_SHORT = "no reserve modelled"
NO_RESERVE = (f"{NO_RESERVE_SHORT}: the capacity is the device's whole memory (the CUDA "
              "context, framework workspaces and allocator fragmentation are not subtracted)")
"""What the report says while the model has no memory-reserve term (a 'reserve' memory part)."""

MOST_STAGE_ROWS = 8
"""Stages whose memory the report lists one by one; a deeper pipeline shows its first, its
fullest and its last stage."""


@dataclass(frozen=True)
class MemoryRow:
    """One device's memory as the report shows it: a role (worker, PS machine) or, on an
    accelerator pipeline, one stage's device; its parts are the model's records."""

    label: str
    role: str
    parts: tuple[MemoryPart, ...]
    fullest: bool = False
    stage: int | None = None
    """The pipeline stage's index (from 0), for a stage's row."""

    @property
    def bytes(self) -> float:
        return sum(part.bytes for part in self.parts)


def memory_rows(prediction: Prediction) -> list[MemoryRow]:
    """Per stage on an accelerator pipeline (every stage up to MOST_STAGE_ROWS, else the first,
    the fullest and the last), else per role; the fullest stage is the one `memory` reports."""
    by_stage = prediction.stage_memory
    if not by_stage:
        roles = dict.fromkeys(part.role for part in prediction.memory)
        return [MemoryRow("per worker" if role == "worker" else "per PS machine", role,
                          tuple(p for p in prediction.memory if p.role == role), True)
                for role in roles]
    fullest = next(i for i, parts in enumerate(by_stage) if parts == prediction.memory)
    shown = (range(len(by_stage)) if len(by_stage) <= MOST_STAGE_ROWS
             else sorted({0, fullest, len(by_stage) - 1}))
    if len(by_stage) == 1:
        return [MemoryRow("per device", "worker", by_stage[0], True, 0)]
    return [MemoryRow(f"stage {i + 1}" + (" (fullest)" if i == fullest else ""), "worker",
                      by_stage[i], i == fullest, i) for i in shown]


def reserve_text(prediction: Prediction, short: bool = False) -> str:
    """The memory reserve the model counts ('reserve' memory parts), or NO_RESERVE; `short`:
    the words before the colon only."""
    from dnnscale.units import format_si

    reserve = [part for part in prediction.memory if part.name == "reserve"]
    if not reserve:
        return NO_RESERVE_SHORT if short else NO_RESERVE
    if short:
        return "reserve included"
    return "reserve included: " + ", ".join(f"{part.role} {format_si(part.bytes, 'B')}"
                                            for part in reserve)


def count_words(value: float) -> str:
    """A large count as people write it: 300 B, 2 T, 146 M, 2,048."""
    for factor, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if value >= factor:
            return f"{value / factor:.3g} {suffix}"
    return f"{value:,.0f}"


def epoch_text(workload: Workload, plan: ParallelPlan) -> str:
    """What one epoch is for this workload: '300 B tokens (146,484,375 sequences of 2,048
    tokens)' for a transformer, '14,197,122 samples' otherwise; with Adam's cut-off f < 1,
    the f of them that end it."""
    samples = workload.samples_per_epoch
    cut = f"{plan.epoch_fraction:g} of " if plan.epoch_fraction < 1 else ""
    shape = workload.transformer
    if shape is None:
        return f"{cut}{samples:,} samples"
    tokens = shape.tokens_per_sample
    return (f"{cut}{count_words(samples * tokens)} tokens ({samples:,} sequences of "
            f"{tokens:,} tokens)")
