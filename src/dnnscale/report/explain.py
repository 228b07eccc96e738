"""What every row of a prediction means: one sentence per step part, memory part, utilisation.

The text is written once here and read by `predict --explain`, the tables, the HTML report and
the test that checks docs/report.md lists every name. Each sentence says what the model counts
in that row (see docs/model.md for the formulas); a name the model emits without an entry here
fails tests/test_report_explain.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.model.prediction import Prediction, StepPart
from dnnscale.model.records import Part, PartKind

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
    # communication
    Part.PARTITION_COMM: "traffic between the P workers of one replica caused by splitting the "
                         "layers across them (activations gathered, input gradients reduced; "
                         "Adam's model parallelism)",
    Part.TP_COMM: "tensor-parallel collectives inside each layer (all-reduce, or all-gather and "
                  "reduce-scatter with sequence parallelism) among the TP group",
    Part.PP_COMM: "point-to-point sends between adjacent pipeline stages: activations forward, "
                  "input gradients backward, every micro-batch",
    Part.PS_PUSH: "the worker sending its share of the weight updates to the parameter-server "
                  "shards (one message per shard)",
    Part.PS_PULL: "the worker fetching its share of fresh weights from the parameter-server shards",
    Part.ALLREDUCE: "ring all-reduce of the gradients among the replicas holding the same "
                    "partition",
    Part.DP_COMM: "data-parallel gradient traffic among the replicas (all-reduce, or ZeRO's "
                  "reduce-scatter and all-gather), the part not hidden behind the backward pass",
    # waits
    Part.PS_SERVE_WAIT: "the worker waiting for the busiest parameter-server shard, which serves "
                        "the replica's P workers one request at a time, beyond the worker's own "
                        "push and pull time",
    Part.PS_WAIT: "idle time imposed by the parameter servers' capacity (network or CPU): the "
                  "replicas together cannot go faster than the busiest shard serves them (R·n/X "
                  "minus the worker's own step)",
    Part.LAUNCH_WAIT: "the device idle while the host launches kernels: the step is host bound "
                      "where the launches take longer than the kernels",
    Part.BUBBLE: "pipeline bubble: stages idle while the pipeline fills and drains "
                 "((p−1)/(v·m) of the ideal time for equal stages)",
    # updates
    Part.PS_APPLY: "the parameter-server shards applying all R replicas' updates while the "
                   "workers wait (synchronous SGD)",
    Part.UPDATE: "the worker applying the weight update to its own copy (all-reduce plans)",
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
