"""One model replica split over P workers: per-worker compute and partition traffic per step.

This is X_rep's ingredients, computed once per (P, n) and reused by every system-level
composition (PS async, PS sync, all-reduce) and by the optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from dnnscale.cluster.spec import MachineSpec, NetworkSpec
from dnnscale.model.compute import imbalance_fraction, phase_time_s
from dnnscale.model.network import ring_allreduce_time_s, transfer_time_s
from dnnscale.model.partition import layer_partition_traffic, split_schemes
from dnnscale.workload.layer import Layer
from dnnscale.workload.workload import Workload

_RATE_KIND = {"conv2d": "conv2d", "linear": "linear", "generic": "generic"}


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
class ReplicaCosts:
    """Per-worker, per-step costs of one replica (most loaded worker, layer by layer)."""

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
        """T_mp: time in partition communication per step."""
        return sum(layer.comm_s for layer in self.layers)

    @property
    def replicated_params(self) -> int:
        """W_rep: parameters that every worker of the replica holds whole (stripe-split convs)."""
        return sum(layer.replicated_params for layer in self.layers)

    def stored_params(self, params: int) -> int:
        """Parameters the replica's P workers hold together, W + (P−1)·W_rep: what they push,
        pull, all-reduce and the shards store (every stripe worker keeps the whole kernel)."""
        return params + (self.partitions - 1) * self.replicated_params


def _layer_compute(layer: Layer, fraction: float, minibatch: int, machine: MachineSpec,
                   skip_weight_grad: bool) -> tuple[float, float, float]:
    """Forward, input-gradient and weight-gradient seconds of `fraction` of `layer` over a
    minibatch, each max(F / φ, Q / β) (model/compute.py).

    φ is the machine's FLOP/s for one call of F FLOPs at arithmetic intensity I = F / Q_call,
    where Q_call adds the layer's weights (read by forward and input-gradient, written by
    weight-gradient) to its activation bytes; β is the kind's calibrated bytes/s for a call of Q
    bytes, or the memory bandwidth (MachineSpec.memory_bytes_per_s). Every phase that does work
    adds the calibrated cost of allocating the fresh tensor it returns (output, input gradient,
    weight gradient; MachineSpec.allocation_s), 0 when uncalibrated. Calibrated linear layers use
    the additive form t = F / φ(F) + Q / β(Q) instead of the max (calibrate/fit.py).
    """
    rate_kind = _RATE_KIND.get(layer.kind, "default")
    # Pooling: stride area / window area (1 for non-overlapping windows, less when they overlap).
    window_ratio = (layer.stride[0] * layer.stride[1] / (layer.kernel[0] * layer.kernel[1])
                    if layer.kernel and layer.stride and not layer.has_weights else None)
    values = layer.input_values + layer.activation_values
    bytes_per_value = layer.fwd_bytes / values if values and layer.fwd_bytes else 4.0
    weight_bytes = fraction * layer.params * bytes_per_value
    times = []
    outputs_bytes = (fraction * minibatch * layer.activation_values * bytes_per_value,
                     fraction * minibatch * layer.input_values * bytes_per_value, weight_bytes)
    for phase, flops, bytes_moved, output_bytes in (
            ("forward", layer.fwd_flops, layer.fwd_bytes, outputs_bytes[0]),
            ("input_grad", layer.input_grad_flops, layer.input_grad_bytes, outputs_bytes[1]),
            ("weight_grad", layer.weight_grad_flops, layer.weight_grad_bytes, outputs_bytes[2])):
        if phase == "weight_grad" and skip_weight_grad:
            times.append(0.0)
            continue
        work_flops = fraction * minibatch * flops
        work_bytes = fraction * minibatch * bytes_moved
        call_bytes = work_bytes + weight_bytes
        if work_flops > 0 and machine.has_bytes_curve(rate_kind, phase):
            # Calibrated compute kind: t = F / φ(F) + Q / β(Q) + allocation (additive roofline).
            times.append(work_flops / machine.flops_per_s(rate_kind, phase, work_flops)
                         + call_bytes / machine.memory_bytes_per_s(rate_kind, phase, call_bytes)
                         + machine.allocation_s(output_bytes))
            continue
        rate = 1.0
        allocation_s = machine.allocation_s(output_bytes) if work_flops + work_bytes > 0 else 0.0
        if work_flops > 0:
            intensity = work_flops / call_bytes if call_bytes > 0 else None
            rate = machine.flops_per_s(rate_kind, phase, work_flops, intensity)
        bandwidth = (machine.memory_bytes_per_s(layer.kind, phase, work_bytes, window_ratio)
                     if work_bytes > 0 else machine.memory_bandwidth_bytes_per_s)
        times.append(phase_time_s(work_flops, work_bytes, rate, bandwidth) + allocation_s)
    return times[0], times[1], times[2]


def replica_costs(workload: Workload, machine: MachineSpec, network: NetworkSpec,
                  partitions: int, minibatch: int, fc_protocol: str = "weights") -> ReplicaCosts:
    """Cost every layer on the most loaded of P workers and pick each conv layer's cheaper split.

    A weighted layer's scheme is the valid one (at least one unit per worker) with the least
    compute + communication time; layers without weights follow the last weighted layer's split.
    Only a weighted layer whose input is distributed (anything after the first weighted layer)
    exchanges activations. A stripe-split conv keeps its whole kernel on every worker, so its
    weight gradients are all-reduced inside the replica (and its parameters are pushed, pulled
    and stored P times: see ReplicaCosts.stored_params). With fc_protocol 'vectors' the FC weight
    gradients move to the PS.
    """
    b = workload.bytes_per_value
    costs: list[LayerCost] = []
    input_distributed = False
    current_scheme = "features"
    for layer in workload.layers:
        skip_weight_grad = fc_protocol == "vectors" and layer.kind == "linear"
        candidates = split_schemes(layer) if layer.has_weights else (
            (current_scheme,) if current_scheme in split_schemes(layer) else split_schemes(layer)[:1])
        best: LayerCost | None = None
        for scheme in candidates:
            extent = layer.split_extent(scheme)
            if layer.has_weights and extent < partitions and partitions > 1 and len(candidates) > 1:
                continue  # invalid split: some worker would get nothing
            fraction = imbalance_fraction(extent, partitions)
            fwd, ing, wg = _layer_compute(layer, fraction, minibatch, machine, skip_weight_grad)
            comm_bytes, messages = (layer_partition_traffic(layer, scheme, partitions, b, minibatch,
                                                            input_scheme=current_scheme)
                                    if input_distributed else (0.0, 0.0))
            comm_s = transfer_time_s(comm_bytes, messages, network.bandwidth_bytes_per_s,
                                     network.latency_s)
            replicated = layer.params if (scheme == "rows" and layer.has_weights
                                          and partitions > 1) else 0
            if replicated:
                # Every stripe holds the whole kernel: its weight gradients are summed over the
                # replica's P workers each step (a ring all-reduce inside the replica).
                kernel_bytes = replicated * b
                comm_bytes += 2 * (partitions - 1) / partitions * kernel_bytes
                messages += 2 * (partitions - 1)
                comm_s += ring_allreduce_time_s(partitions, kernel_bytes,
                                                network.bandwidth_bytes_per_s, network.latency_s)
            cost = LayerCost(layer.name, layer.kind, scheme, fraction, fwd, ing, wg, comm_bytes,
                             messages, comm_s, replicated)
            if best is None or cost.compute_s + cost.comm_s < best.compute_s + best.comm_s:
                best = cost
        if best is None:
            raise ValueError(f"layer {layer.name!r} cannot be split {partitions} ways")
        costs.append(best)
        if layer.has_weights:
            current_scheme = best.scheme
            input_distributed = partitions > 1
    return ReplicaCosts(partitions, minibatch, tuple(costs))
