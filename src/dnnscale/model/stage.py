"""Stage costs: one pipeline stage of one replica, split over a tensor group, per step.

The per-worker compute and split-caused communication of the most loaded member, layer by layer,
computed once per (tensor split, micro-batch) and reused by every aggregation (PS async, PS sync,
collectives) and by the optimizer. Under Project Adam's plans a replica is one stage and its P
workers are the tensor group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import dnnscale.model.megatron_rules  # noqa: F401  (registers Megatron's sharding rules)
from dnnscale.model.collectives import collective_transfer, span_members
from dnnscale.model.compute import cpu_phase_times_s
from dnnscale.model.gpu_compute import fp8_cast_launches, gpu_phase_times_s
from dnnscale.model.quota import collective_after_compute_s
from dnnscale.model.sharding import PHASE_FORWARD, Shard, SplitContext, shard_layer
from dnnscale.plan.mesh import DeviceMesh, Placement, placement
from dnnscale.plan.rules import layer_splits_into
from dnnscale.system.system import System
from dnnscale.workload.kind_record import Recompute, layer_kind, record_of
from dnnscale.workload.layer import Layer
from dnnscale.workload.splits import split_extent, split_schemes
from dnnscale.workload.workload import Workload


class LayerCost(NamedTuple):
    """One layer's cost on the most loaded worker of a replica, per step."""

    name: str
    kind: str
    scheme: str
    work_fraction: float
    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    comm_bytes: float
    comm_messages: float
    comm_s: float
    replicated_params: int = 0
    """Parameters every worker holds whole (a stripe-split conv's kernel), else 0."""
    comm_forward_s: float = 0.0
    """The part of comm_s spent in the forward phase (recomputed with the forward)."""
    block: int | None = None
    forward_launches: int = 0
    """Kernels (compute and collectives) the host launches for the forward phase."""
    backward_launches: int = 0
    activation_values: float = 0.0
    """Work fraction × the layer's output values per sample: what this member keeps of it."""

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s


class StageTotals(NamedTuple):
    """Sums over a stage's layers that the composition and the memory model read; additive, so
    a stage of n identical blocks is n times one block's totals plus its other layers."""

    forward_s: float = 0.0
    input_grad_s: float = 0.0
    weight_grad_s: float = 0.0
    partition_s: float = 0.0
    partition_bytes: float = 0.0
    replicated_params: float = 0.0
    recompute_full_s: float = 0.0
    recompute_selective_s: float = 0.0
    launches: float = 0.0
    launches_full: float = 0.0
    launches_selective: float = 0.0
    activation_values: float = 0.0
    """Σ work fraction × output values per sample, every layer (Adam's memory model)."""
    outside_activation_values: float = 0.0
    """The same over the layers outside transformer blocks."""
    blocks: float = 0.0
    """Transformer blocks in the stage."""

    @classmethod
    def of(cls, layers: Sequence[LayerCost]) -> "StageTotals":
        totals = [0.0] * len(cls._fields)
        blocks = set()
        for layer in layers:
            in_block = layer.block is not None
            # selective recomputation recomputes the attention core (its record says so)
            attention = layer_kind(layer.kind).recompute is Recompute.ATTENTION_CORE
            for index, value in enumerate((
                    layer.forward_s, layer.input_grad_s, layer.weight_grad_s, layer.comm_s,
                    layer.comm_bytes, layer.replicated_params,
                    layer.forward_s + layer.comm_forward_s if in_block else 0.0,
                    layer.forward_s if attention else 0.0,
                    layer.forward_launches + layer.backward_launches,
                    layer.forward_launches if in_block else 0,
                    layer.forward_launches if attention else 0,
                    layer.activation_values,
                    0.0 if in_block else layer.activation_values)):
                totals[index] += value
            if in_block:
                blocks.add(layer.block)
        totals[-1] = float(len(blocks))
        return cls(*totals)

    def plus(self, other: "StageTotals", times: float = 1.0) -> "StageTotals":
        return StageTotals(*(a + times * b for a, b in zip(self, other)))


@dataclass(frozen=True)
class StageCosts:
    """Per-worker, per-micro-batch costs of one stage (most loaded tensor-parallel member).

    `layers` holds every layer's cost when the stage was costed layer by layer (predict); the
    optimizer's search builds stages from one block's totals times the blocks they hold and
    leaves it empty. `boundary_values`: values per sample the stage's last layer hands on (a
    pipeline boundary's activation for workloads without a transformer shape).
    """

    partitions: int
    minibatch: int
    layers: tuple[LayerCost, ...]
    params: int = 0
    """W_stage: parameters of the stage's layers (all of a replica's for one stage)."""
    totals: StageTotals = StageTotals()
    """The sums the composition reads: StageTotals.of(layers) when costed layer by layer."""
    boundary_values: int = 0

    @property
    def forward_s(self) -> float:
        return self.totals.forward_s

    @property
    def input_grad_s(self) -> float:
        return self.totals.input_grad_s

    @property
    def weight_grad_s(self) -> float:
        return self.totals.weight_grad_s

    @property
    def compute_s(self) -> float:
        """T_comp: forward + both backward phases on the most loaded worker."""
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def partition_bytes(self) -> float:
        return self.totals.partition_bytes

    @property
    def partition_s(self) -> float:
        """T_mp: time in split-caused (tensor-group) communication."""
        return self.totals.partition_s

    @property
    def replicated_params(self) -> int:
        """W_rep: parameters that every worker of the replica holds whole (stripe-split convs,
        Megatron's norms)."""
        return int(self.totals.replicated_params)

    @property
    def blocks(self) -> int:
        return int(self.totals.blocks)

    def stored_params(self, params: int) -> int:
        """Parameters the replica's P workers hold together, W + (P−1)·W_rep: what they push,
        pull, all-reduce and the shards store (every stripe worker keeps the whole kernel)."""
        return params + (self.partitions - 1) * self.replicated_params

    def launches(self, recompute: str) -> int:
        """Kernels the host launches per micro-batch: forward, backward and recomputed ones."""
        extra = {"full": self.totals.launches_full,
                 "selective": self.totals.launches_selective}.get(recompute, 0.0)
        return int(self.totals.launches + extra)

    def recompute_s(self, recompute: str) -> float:
        """Forward work recomputed in the backward pass: 'full' every block layer's forward
        (with its tensor-parallel communication), 'selective' the attention core, else 0."""
        return {"full": self.totals.recompute_full_s,
                "selective": self.totals.recompute_selective_s}.get(recompute, 0.0)


def _layer_cost(layer: Layer, shard: Shard, minibatch: int, system: System, placed: Placement,
                skip_weight_grad: bool, precision: str, bytes_scale: float) -> LayerCost:
    """One layer's phases on its shard, and each of the shard's events on the group of the
    event's mesh dimension (its `members` placed by `placed`)."""
    device = system.machine
    if device.is_accelerator:
        fwd, ing, wg = gpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         precision, bytes_scale, skip_weight_grad)
    else:
        fwd, ing, wg = cpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         skip_weight_grad)
    comm_bytes = comm_messages = comm_s = comm_forward_s = 0.0
    casts = fp8_cast_launches(layer, precision) if device.is_accelerator else (0, 0)
    launches = [int(fwd > 0) + casts[0], int(ing > 0) + int(wg > 0) + casts[1]]
    library, topology = system.collective_library, system.topology
    for event in shard.events:
        launches[event.phase != PHASE_FORWARD] += 1
        transfer = collective_transfer(event.operation, library, event.payload_bytes,
                                       event.members)
        comm_bytes += transfer.bytes
        comm_messages += transfer.messages
        span = placed[event.dimension].span_of(span_members(event.operation, event.members))
        seconds = collective_after_compute_s(system, event.operation, event.payload_bytes, span,
                                             topology)
        comm_s += seconds
        if event.phase == PHASE_FORWARD:
            comm_forward_s += seconds
    block = layer.hyper.get("block")
    return LayerCost(layer.name, layer.kind, shard.scheme, shard.work_fraction, fwd, ing, wg,
                     comm_bytes, comm_messages, comm_s, shard.replicated_params, comm_forward_s,
                     block if isinstance(block, int) else None, launches[0], launches[1],
                     shard.work_fraction * layer.activation_values)


_State = tuple[str, bool]
"""The state entering a layer: the last weighted layer's scheme, whether the input is
distributed over the tensor group."""

_Path = tuple[LayerCost, "_Path | None"]
"""A chain of layer costs as a linked list, last layer first (extending one is O(1))."""


def _options(layer: Layer, state: _State, pinned: str | None, partitions: int, minibatch: int,
             system: System, placed: Placement, rules: str, fc_protocol: str, precision: str,
             bytes_scale: float, bytes_per_value: float, sequence_parallel: bool
             ) -> tuple[tuple[_State, LayerCost, float], ...]:
    """Each way to cost `layer` entering in `state`: (the state after it, its cost, its
    compute + communication seconds). A weighted layer takes each valid scheme (`pinned`
    only, when given) and leaves its scheme behind; a layer without weights follows the state."""
    current_scheme, input_distributed = state
    valid = split_schemes(layer, rules)
    if pinned is not None and pinned not in valid:
        raise ValueError(f"layer {layer.name!r} has no split {pinned!r} (one of {valid})")
    candidates = ((pinned,) if pinned is not None else valid) if layer.has_weights else (
        (current_scheme,) if current_scheme in valid else valid[:1])
    context = SplitContext(current_scheme, input_distributed, minibatch, bytes_per_value,
                           sequence_parallel)
    skip_weight_grad = fc_protocol == "vectors" and record_of(layer).vector_gradients
    options = []
    for scheme in candidates:
        if (layer.has_weights and split_extent(layer, scheme) < partitions and partitions > 1
                and len(valid) > 1):
            continue  # invalid split: some worker would get nothing
        if (not layer.has_weights and scheme == "rows" and partitions > 1
                and layer_splits_into(layer, "rows", partitions) is not None):
            continue  # a pooling layer on stripes with fewer rows than workers (runtime/netplan)
        shard = shard_layer(rules, layer, scheme, partitions, context)
        cost = _layer_cost(layer, shard, minibatch, system, placed, skip_weight_grad,
                           precision, bytes_scale)
        after = (scheme, partitions > 1) if layer.has_weights else state
        options.append((after, cost, cost.compute_s + cost.comm_s))
    return tuple(options)


def _cheapest_per_state(paths: list[tuple[_State, float, _Path | None]]
                        ) -> list[tuple[_State, float, _Path | None]]:
    """The cheapest of `paths` into each state (of equal ones the first)."""
    cheapest: dict[_State, tuple[_State, float, _Path | None]] = {}
    for entry in paths:
        known = cheapest.get(entry[0])
        if known is None or entry[1] < known[1]:
            cheapest[entry[0]] = entry
    return list(cheapest.values())


def stage_costs(workload: Workload, system: System, partitions: int, minibatch: int,
                fc_protocol: str = "weights", rules: str = "adam",
                layer_indices: list[int] | None = None, precision: str = "fp32",
                sequence_parallel: bool = False, bytes_scale: float = 1.0,
                schemes: Mapping[str, str] | None = None) -> StageCosts:
    """Cost every layer (of one pipeline stage: `layer_indices`, default all) on the most
    loaded of P tensor-parallel members, each weighted layer under a valid split (sharding.py),
    with the split-caused communication on the tiers the group spans.

    The splits are an exact shortest path over the layer chain (Viterbi): the state entering a
    layer is (the last weighted layer's scheme, whether the input is distributed); a layer's
    cost under a scheme given that state is its compute + communication time in seconds, the
    transition traffic included (shard_layer prices it from the SplitContext of the incoming
    state), and the chain with the least Σ (compute_s + comm_s) wins — not each layer's own
    cheapest scheme, which ignores the traffic its choice forces on the next layer (issue 24).
    A weighted layer's schemes are its valid ones (at least one unit per worker); layers
    without weights follow the last weighted layer's split and keep the state. Of equal chains
    the one found first wins (workload/splits.split_schemes order). Each (layer cost key, state) is
    priced once, so a stack of identical blocks costs one block. With fc_protocol 'vectors'
    the FC weight gradients move to the PS. On accelerators the phases run in `precision`,
    activation bytes scaled by `bytes_scale`. `schemes` (layer name -> scheme) pins the named
    weighted layers' splits (the path is then the cheapest among those that keep them).
    """
    b = workload.bytes_per_value * bytes_scale
    params = 0
    chosen = set(layer_indices) if layer_indices is not None else None
    memo: dict[tuple[object, ...], tuple[tuple[_State, LayerCost, float], ...]] = {}
    # The tensor group is the mesh's innermost dimension: its placement needs only its size.
    placed = placement(DeviceMesh.of(tp=partitions), system.topology)
    start: _State = ("tensor" if rules == "megatron" else "features", False)
    frontier: list[tuple[_State, float, _Path | None]] = [(start, 0.0, None)]
    last_index = -1
    for index, layer in enumerate(workload.layers):
        if chosen is not None and index not in chosen:
            continue
        last_index = index
        params += layer.params
        block = layer.hyper.get("block")
        block_id = block if isinstance(block, int) else None
        pinned = schemes.get(layer.name) if schemes is not None and layer.has_weights else None
        extended: list[tuple[_State, float, _Path | None]] = []
        for state, total, path in frontier:
            key = (layer.cost_key, state, pinned)
            options = memo.get(key)
            if options is None:
                options = memo[key] = _options(layer, state, pinned, partitions, minibatch,
                                               system, placed, rules, fc_protocol, precision,
                                               bytes_scale, b, sequence_parallel)
            for after, cost, seconds in options:
                if cost.name != layer.name or cost.block != block_id:
                    cost = cost._replace(name=layer.name, block=block_id)
                extended.append((after, total + seconds, (cost, path)))
        if not extended:
            raise ValueError(f"layer {layer.name!r} cannot be split {partitions} ways")
        frontier = extended if len(extended) == 1 else _cheapest_per_state(extended)
    best = min(frontier, key=lambda entry: entry[1])[2]
    costs: list[LayerCost] = []
    while best is not None:
        costs.append(best[0])
        best = best[1]
    costs.reverse()
    last = workload.layers[last_index] if last_index >= 0 else workload.layers[-1]
    return StageCosts(partitions, minibatch, tuple(costs), params, StageTotals.of(costs),
                      boundary_values=last.activation_values)


def homogeneous_blocks(workload: Workload) -> list[int] | None:
    """Indices of block 0's layers when every transformer block is a copy of it (same costs,
    layer for layer), else None."""
    by_block: dict[int, list[int]] = {}
    for index, layer in enumerate(workload.layers):
        block = layer.hyper.get("block")
        if isinstance(block, int):
            by_block.setdefault(block, []).append(index)
    if not by_block:
        return None
    first = by_block[min(by_block)]
    keys = [workload.layers[i].cost_key for i in first]
    for indices in by_block.values():
        if [workload.layers[i].cost_key for i in indices] != keys:
            return None
    return first


@dataclass(frozen=True)
class PipelineLayout:
    """What each pipeline device holds: its number of (identical) blocks, its other layers, and
    its last layer (the boundary) — computed once per (workload, stages, virtual stages)."""

    block: tuple[int, ...]
    """Indices of block 0's layers (every block costs the same)."""
    blocks: tuple[int, ...]
    others: tuple[tuple[int, ...], ...]
    last: tuple[int, ...]


def pipeline_layout(workload: Workload, assignment: list[list[int]]) -> PipelineLayout | None:
    """The layout of `assignment` (schedule.stage_layers), or None when blocks differ."""
    block = homogeneous_blocks(workload)
    if block is None:
        return None
    layers = workload.layers
    blocks, others = [], []
    for indices in assignment:
        held = {layers[i].hyper["block"] for i in indices
                if isinstance(layers[i].hyper.get("block"), int)}
        blocks.append(len(held))
        others.append(tuple(i for i in indices if not isinstance(layers[i].hyper.get("block"),
                                                                 int)))
    return PipelineLayout(tuple(block), tuple(blocks), tuple(others),
                          tuple(indices[-1] for indices in assignment))


@dataclass(frozen=True)
class StageTemplate:
    """One split and micro-batch priced once: block 0's totals and parameters, and the cost of
    every layer outside the blocks."""

    partitions: int
    minibatch: int
    block_totals: StageTotals
    block_params: int
    outside: dict[int, LayerCost]


def stage_template(workload: Workload, system: System, partitions: int, minibatch: int,
                   block: tuple[int, ...], rules: str = "megatron", precision: str = "fp32",
                   sequence_parallel: bool = False, bytes_scale: float = 1.0) -> StageTemplate:
    outside = [i for i, layer in enumerate(workload.layers)
               if not isinstance(layer.hyper.get("block"), int)]
    indices = sorted(outside + list(block))
    costed = stage_costs(workload, system, partitions, minibatch, "weights", rules, indices,
                         precision=precision, sequence_parallel=sequence_parallel,
                         bytes_scale=bytes_scale)
    cost_of = dict(zip(indices, costed.layers))
    return StageTemplate(partitions, minibatch, StageTotals.of([cost_of[i] for i in block]),
                         sum(workload.layers[i].params for i in block),
                         {i: cost_of[i] for i in outside})


def stages_from_template(workload: Workload, template: StageTemplate,
                         layout: PipelineLayout) -> tuple[StageCosts, ...]:
    """Each device's StageCosts: its blocks times the block's totals plus its other layers
    (devices that hold the same kind of stage share one record)."""
    stages = []
    made: dict[tuple[int, tuple[int, ...], int], StageCosts] = {}
    for blocks, others, last in zip(layout.blocks, layout.others, layout.last):
        boundary = workload.layers[last].activation_values
        key = (blocks, others, boundary)
        stage = made.get(key)
        if stage is None:
            totals = StageTotals.of([template.outside[i] for i in others]).plus(
                template.block_totals, blocks)
            params = (template.block_params * blocks
                      + sum(workload.layers[i].params for i in others))
            stage = made[key] = StageCosts(template.partitions, template.minibatch, (), params,
                                           totals, boundary)
        stages.append(stage)
    return tuple(stages)
