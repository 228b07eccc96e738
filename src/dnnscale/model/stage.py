"""Stage costs: one pipeline stage of one replica, split over a tensor group, per step.

The per-worker compute and split-caused communication of the most loaded member, layer by layer,
computed once per (tensor split, micro-batch) and reused by every aggregation (PS async, PS sync,
collectives) and by the optimizer. Under Project Adam's plans a replica is one stage and its P
workers are the tensor group.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import dnnscale.model.megatron_rules  # noqa: F401  (registers Megatron's sharding rules)
from dnnscale.model.collectives import collective_transfer, group_collective_time_s
from dnnscale.model.compute import cpu_phase_times_s
from dnnscale.model.gpu_compute import gpu_phase_times_s
from dnnscale.model.sharding import (PHASE_FORWARD, Shard, SplitContext, shard_layer, split_extent,
                                     split_schemes)
from dnnscale.system.system import System
from dnnscale.workload.layer import Layer
from dnnscale.workload.workload import Workload

ATTENTION_CORE = ("attn_scores", "attn_softmax", "attn_context")
"""What selective recomputation recomputes: the s²-sized part of attention (Korthikanti et al.
2022 §5)."""


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

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s


@dataclass(frozen=True)
class StageCosts:
    """Per-worker, per-step costs of one stage (most loaded worker, layer by layer)."""

    partitions: int
    minibatch: int
    layers: tuple[LayerCost, ...]
    params: int = 0
    """W_stage: parameters of the stage's layers (all of a replica's for one stage)."""

    @functools.cached_property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @functools.cached_property
    def input_grad_s(self) -> float:
        return sum(layer.input_grad_s for layer in self.layers)

    @functools.cached_property
    def weight_grad_s(self) -> float:
        return sum(layer.weight_grad_s for layer in self.layers)

    @functools.cached_property
    def compute_s(self) -> float:
        """T_comp: forward + both backward phases on the most loaded worker, per step."""
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @functools.cached_property
    def partition_bytes(self) -> float:
        return sum(layer.comm_bytes for layer in self.layers)

    @functools.cached_property
    def partition_s(self) -> float:
        """T_mp: time in split-caused (tensor-group) communication per step."""
        return sum(layer.comm_s for layer in self.layers)

    @functools.cached_property
    def replicated_params(self) -> int:
        """W_rep: parameters that every worker of the replica holds whole (stripe-split convs)."""
        return sum(layer.replicated_params for layer in self.layers)

    def stored_params(self, params: int) -> int:
        """Parameters the replica's P workers hold together, W + (P−1)·W_rep: what they push,
        pull, all-reduce and the shards store (every stripe worker keeps the whole kernel)."""
        return params + (self.partitions - 1) * self.replicated_params

    def launches(self, recompute: str) -> int:
        """Kernels the host launches per micro-batch: forward, backward and recomputed ones."""
        total = sum(layer.forward_launches + layer.backward_launches for layer in self.layers)
        if recompute == "full":
            total += sum(layer.forward_launches for layer in self.layers
                         if layer.block is not None)
        elif recompute == "selective":
            total += sum(layer.forward_launches for layer in self.layers
                         if layer.kind in ATTENTION_CORE)
        return total

    def recompute_s(self, recompute: str) -> float:
        """Forward work recomputed in the backward pass: 'full' every block layer's forward
        (with its tensor-parallel communication), 'selective' the attention core, else 0."""
        if recompute == "full":
            return sum(layer.forward_s + layer.comm_forward_s for layer in self.layers
                       if layer.block is not None)
        if recompute == "selective":
            return sum(layer.forward_s for layer in self.layers if layer.kind in ATTENTION_CORE)
        return 0.0


def _layer_cost(layer: Layer, shard: Shard, minibatch: int, system: System, degree: int,
                skip_weight_grad: bool, precision: str, bytes_scale: float) -> LayerCost:
    device = system.machine
    if device.is_accelerator:
        fwd, ing, wg = gpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         precision, bytes_scale, skip_weight_grad)
    else:
        fwd, ing, wg = cpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         skip_weight_grad)
    comm_bytes = comm_messages = comm_s = comm_forward_s = 0.0
    launches = [int(fwd > 0), int(ing > 0) + int(wg > 0)]
    library, topology = system.collective_library, system.topology
    for event in shard.events:
        launches[event.phase != PHASE_FORWARD] += 1
        transfer = collective_transfer(event.operation, library, event.payload_bytes,
                                       event.members)
        comm_bytes += transfer.bytes
        comm_messages += transfer.messages
        seconds = group_collective_time_s(event.operation, library, event.payload_bytes,
                                          event.members, 1, topology, system.collective_call_s)
        comm_s += seconds
        if event.phase == PHASE_FORWARD:
            comm_forward_s += seconds
    block = layer.hyper.get("block")
    return LayerCost(layer.name, layer.kind, shard.scheme, shard.work_fraction, fwd, ing, wg,
                     comm_bytes, comm_messages, comm_s, shard.replicated_params, comm_forward_s,
                     block if isinstance(block, int) else None, launches[0], launches[1])


def stage_costs(workload: Workload, system: System, partitions: int, minibatch: int,
                fc_protocol: str = "weights", rules: str = "adam",
                layer_indices: list[int] | None = None, precision: str = "fp32",
                sequence_parallel: bool = False, bytes_scale: float = 1.0) -> StageCosts:
    """Cost every layer (of one pipeline stage: `layer_indices`, default all) on the most
    loaded of P tensor-parallel members, each weighted layer under its cheapest valid split
    (sharding.py), with the split-caused communication on the tiers the group spans.

    A weighted layer's scheme is the valid one (at least one unit per worker) with the least
    compute + communication time; layers without weights follow the last weighted layer's split.
    With fc_protocol 'vectors' the FC weight gradients move to the PS. On accelerators the
    phases run in `precision`, activation bytes scaled by `bytes_scale`.
    """
    b = workload.bytes_per_value * bytes_scale
    costs: list[LayerCost] = []
    params = 0
    input_distributed = False
    current_scheme = "tensor" if rules == "megatron" else "features"
    chosen = set(layer_indices) if layer_indices is not None else None
    seen: dict[tuple[object, ...], LayerCost] = {}
    for index, layer in enumerate(workload.layers):
        if chosen is not None and index not in chosen:
            continue
        key = (layer.cost_key, current_scheme, input_distributed)
        known = seen.get(key)
        if known is not None:
            block = layer.hyper.get("block")
            costs.append(known._replace(name=layer.name,
                                        block=block if isinstance(block, int) else None))
            params += layer.params
            if layer.has_weights:
                current_scheme = known.scheme
                input_distributed = partitions > 1
            continue
        skip_weight_grad = fc_protocol == "vectors" and layer.kind == "linear"
        schemes = split_schemes(layer, rules)
        candidates = schemes if layer.has_weights else (
            (current_scheme,) if current_scheme in schemes else schemes[:1])
        context = SplitContext(current_scheme, input_distributed, minibatch, b, sequence_parallel)
        best: LayerCost | None = None
        for scheme in candidates:
            if (layer.has_weights and split_extent(layer, scheme) < partitions and partitions > 1
                    and len(candidates) > 1):
                continue  # invalid split: some worker would get nothing
            shard = shard_layer(rules, layer, scheme, partitions, context)
            cost = _layer_cost(layer, shard, minibatch, system, partitions, skip_weight_grad,
                               precision, bytes_scale)
            if best is None or cost.compute_s + cost.comm_s < best.compute_s + best.comm_s:
                best = cost
        if best is None:
            raise ValueError(f"layer {layer.name!r} cannot be split {partitions} ways")
        costs.append(best)
        seen[key] = best
        params += layer.params
        if layer.has_weights:
            current_scheme = best.scheme
            input_distributed = partitions > 1
    return StageCosts(partitions, minibatch, tuple(costs), params)
