"""Computation cost formulas (performance-model.md §1): the time of each phase of a layer."""

from __future__ import annotations

import math

from dnnscale.system.device import Device
from dnnscale.workload.kind_record import record_of
from dnnscale.workload.layer import Layer


def phase_time_s(flops: float, bytes_moved: float, flops_per_s: float,
                 memory_bandwidth_bytes_per_s: float) -> float:
    """Time of one phase of one layer on one worker.

    Formula: t = max(F / φ, Q / β_mem)   (roofline: compute bound or memory bound)
    Units: F in FLOP, Q in bytes, φ in FLOP/s, β_mem in bytes/s -> seconds.
    Source: performance-model.md §1; Williams et al., "Roofline", CACM 2009.
    """
    compute_s = flops / flops_per_s if flops > 0 else 0.0
    memory_s = bytes_moved / memory_bandwidth_bytes_per_s if bytes_moved > 0 else 0.0
    return max(compute_s, memory_s)


def imbalance_fraction(extent: int, partitions: int) -> float:
    """Share of a layer's work done by the most loaded of P workers.

    Formula: ceil(E / P) / E for E units (neurons, rows or channels) split over P workers
    (a 10-neuron layer on 4 workers: 3/10, not 1/4).
    Units: dimensionless.
    Source: performance-model.md §1 (vertical partitioning, Yan et al. KDD 2015).
    """
    if partitions <= 1 or extent <= 0:
        return 1.0
    return math.ceil(extent / partitions) / extent


def cpu_phase_times_s(layer: Layer, fraction: float, minibatch: int, machine: Device,
                      skip_weight_grad: bool) -> tuple[float, float, float]:
    """Forward, input-gradient and weight-gradient seconds of `fraction` of `layer` over a
    minibatch, each max(F / φ, Q / β) (phase_time_s) on a CPU device.

    φ is the machine's FLOP/s, on the rate curve the kind's record names (LayerKind.cpu_rate),
    for one call of F FLOPs at arithmetic intensity I = F / Q_call,
    where Q_call adds the layer's weights (read by forward and input-gradient, written by
    weight-gradient) to its activation bytes; β is the kind's calibrated bytes/s for a call of Q
    bytes, or the memory bandwidth (Device.memory_bytes_per_s). Every phase that does work
    adds the calibrated cost of allocating the fresh tensor it returns (output, input gradient,
    weight gradient; Device.allocation_s), 0 when uncalibrated. Calibrated linear layers use
    the additive form t = F / φ(F) + Q / β(Q) instead of the max (calibrate/fit.py).
    """
    rate_kind = record_of(layer).cpu_rate
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
