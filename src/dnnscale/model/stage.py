"""Stage costs: one pipeline stage of one replica, split over a tensor group, per step.

The per-worker compute and split-caused communication of the most loaded member, layer by layer,
computed once per (tensor split, micro-batch) and reused by every aggregation (PS async, PS sync,
collectives) and by the optimizer. Under Project Adam's plans a replica is one stage and its P
workers are the tensor group.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.model.collectives import collective_time_s, collective_transfer
from dnnscale.model.compute import cpu_phase_times_s
from dnnscale.model.sharding import Shard, SplitContext, shard_layer, split_extent, split_schemes
from dnnscale.system.system import System
from dnnscale.system.topology import LinkTier, group_span
from dnnscale.workload.layer import Layer
from dnnscale.workload.workload import Workload


@dataclass(frozen=True)
class LayerCost:
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

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s


@dataclass(frozen=True)
class StageCosts:
    """Per-worker, per-step costs of one stage (most loaded worker, layer by layer)."""

    partitions: int
    minibatch: int
    layers: tuple[LayerCost, ...]

    @property
    def forward_s(self) -> float:
        return sum(layer.forward_s for layer in self.layers)

    @property
    def input_grad_s(self) -> float:
        return sum(layer.input_grad_s for layer in self.layers)

    @property
    def weight_grad_s(self) -> float:
        return sum(layer.weight_grad_s for layer in self.layers)

    @property
    def compute_s(self) -> float:
        """T_comp: forward + both backward phases on the most loaded worker, per step."""
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def partition_bytes(self) -> float:
        return sum(layer.comm_bytes for layer in self.layers)

    @property
    def partition_s(self) -> float:
        """T_mp: time in split-caused (tensor-group) communication per step."""
        return sum(layer.comm_s for layer in self.layers)

    @property
    def replicated_params(self) -> int:
        """W_rep: parameters that every worker of the replica holds whole (stripe-split convs)."""
        return sum(layer.replicated_params for layer in self.layers)

    def stored_params(self, params: int) -> int:
        """Parameters the replica's P workers hold together, W + (P−1)·W_rep: what they push,
        pull, all-reduce and the shards store (every stripe worker keeps the whole kernel)."""
        return params + (self.partitions - 1) * self.replicated_params


def _layer_cost(layer: Layer, shard: Shard, minibatch: int, system: System, tier: LinkTier,
                skip_weight_grad: bool) -> LayerCost:
    fwd, ing, wg = cpu_phase_times_s(layer, shard.work_fraction, minibatch, system.machine,
                                     skip_weight_grad)
    comm_bytes = comm_messages = comm_s = 0.0
    library = system.collective_library
    for event in shard.events:
        transfer = collective_transfer(event.operation, library, event.payload_bytes,
                                       event.members)
        comm_bytes += transfer.bytes
        comm_messages += transfer.messages
        comm_s += collective_time_s(event.operation, library, event.payload_bytes,
                                    event.members, tier)
    return LayerCost(layer.name, layer.kind, shard.scheme, shard.work_fraction, fwd, ing, wg,
                     comm_bytes, comm_messages, comm_s, shard.replicated_params)


def stage_costs(workload: Workload, system: System, partitions: int, minibatch: int,
                fc_protocol: str = "weights", rules: str = "adam") -> StageCosts:
    """Cost every layer on the most loaded of P workers, each weighted layer under its cheapest
    valid split (sharding.py), and the split-caused communication on the tier the group spans.

    A weighted layer's scheme is the valid one (at least one unit per worker) with the least
    compute + communication time; layers without weights follow the last weighted layer's split.
    With fc_protocol 'vectors' the FC weight gradients move to the PS.
    """
    b = workload.bytes_per_value
    tier = system.topology.tier(group_span(partitions, 1, system.devices_per_node))
    costs: list[LayerCost] = []
    input_distributed = False
    current_scheme = "features"
    for layer in workload.layers:
        skip_weight_grad = fc_protocol == "vectors" and layer.kind == "linear"
        schemes = split_schemes(layer, rules)
        candidates = schemes if layer.has_weights else (
            (current_scheme,) if current_scheme in schemes else schemes[:1])
        context = SplitContext(current_scheme, input_distributed, minibatch, b)
        best: LayerCost | None = None
        for scheme in candidates:
            if (layer.has_weights and split_extent(layer, scheme) < partitions and partitions > 1
                    and len(candidates) > 1):
                continue  # invalid split: some worker would get nothing
            shard = shard_layer(rules, layer, scheme, partitions, context)
            cost = _layer_cost(layer, shard, minibatch, system, tier, skip_weight_grad)
            if best is None or cost.compute_s + cost.comm_s < best.compute_s + best.comm_s:
                best = cost
        if best is None:
            raise ValueError(f"layer {layer.name!r} cannot be split {partitions} ways")
        costs.append(best)
        if layer.has_weights:
            current_scheme = best.scheme
            input_distributed = partitions > 1
    return StageCosts(partitions, minibatch, tuple(costs))
