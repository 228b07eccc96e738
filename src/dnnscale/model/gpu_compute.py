"""Compute time of a layer's phases on an accelerator (performance-model.md §9).

Each phase of a layer is one kernel (or none when it does no work). Its time on the device is
the roofline of its FLOPs at the achieved fraction of the device's peak for its precision, and
of its bytes at the achieved fraction of HBM bandwidth:

    t = max(F / (peak(precision) · η_class(F)), Q / (B_HBM · η_mem(Q)))

The host must also launch it; a stage's micro-batch takes the longer of its kernels' device time
and their launch time (compose.py), so small models are launch bound.

η are the device's calibrated size-dependent efficiency curves (system/gpu_profile.py): small
GEMMs run far below peak, which is why one efficiency constant fitted on small models is far
off on large ones. The kernel class in a layer kind's record (workload/kind_record.py) says which
curve applies; a MEMORY kind does no FLOPs on the device.
"""

from __future__ import annotations

from dnnscale.errors import InputError
from dnnscale.system.device import Device
from dnnscale.workload.kind_record import KernelClass, record_of
from dnnscale.workload.layer import Layer


def kernel_time_s(flops: float, bytes_moved: float, peak_flops_per_s: float,
                  flop_efficiency: float, memory_bandwidth_bytes_per_s: float,
                  memory_efficiency: float) -> float:
    """Time of one kernel on an accelerator.

    Formula: t = max(F / (peak · η_F), Q / (B · η_Q)); 0 for a kernel with no work.
    Units: FLOP, bytes, FLOP/s, fractions, bytes/s -> s.
    Source: the roofline (Williams et al., CACM 2009) with achieved efficiencies per kernel size
    (performance-model.md §9; Calculon, Isaev et al. SC'23, uses the same size-dependent form).
    """
    if flops <= 0 and bytes_moved <= 0:
        return 0.0
    compute_s = flops / (peak_flops_per_s * flop_efficiency) if flops > 0 else 0.0
    memory_s = (bytes_moved / (memory_bandwidth_bytes_per_s * memory_efficiency)
                if bytes_moved > 0 else 0.0)
    return max(compute_s, memory_s)


def peak_flops_per_s(device: Device, precision: str) -> float:
    """The device's dense peak for `precision`; InputError when it has no such unit."""
    peak = device.peak_flops_per_s.get(precision)
    if peak is None:
        known = ", ".join(sorted(device.peak_flops_per_s))
        raise InputError("plan.precision", f"{device.name or 'the device'} has no {precision} "
                         f"units (it has {known})")
    return peak


def efficiency(device: Device, kernel_class: str, flops: float) -> float:
    """η of `kernel_class` at a call of `flops` FLOPs (the class's curve, else the GEMM one)."""
    curve = device.efficiency.get(kernel_class) or device.efficiency["gemm"]
    return curve.at(flops)


def gpu_phase_times_s(layer: Layer, fraction: float, minibatch: int, device: Device,
                      precision: str, bytes_scale: float,
                      skip_weight_grad: bool = False) -> tuple[float, float, float]:
    """Forward, input-gradient and weight-gradient seconds of `fraction` of `layer` over a
    micro-batch of `minibatch` samples, each phase one kernel (`kernel_time_s`).

    `bytes_scale`: the plan's activation width over the workload's (bf16 workload, fp32 plan: 2).
    """
    peak = peak_flops_per_s(device, precision)
    kernel = record_of(layer).kernel
    kernel_class = None if kernel is KernelClass.MEMORY else kernel.value  # None: no FLOPs here
    memory_curve = device.memory_efficiency
    times = []
    for phase, flops, bytes_moved in (
            ("forward", layer.fwd_flops, layer.fwd_bytes),
            ("input_grad", layer.input_grad_flops, layer.input_grad_bytes),
            ("weight_grad", layer.weight_grad_flops, layer.weight_grad_bytes)):
        if phase == "weight_grad" and skip_weight_grad:
            times.append(0.0)
            continue
        work_flops = fraction * minibatch * flops if kernel_class else 0.0
        work_bytes = fraction * minibatch * bytes_moved * bytes_scale
        flop_eta = (efficiency(device, kernel_class, work_flops)
                    if kernel_class and work_flops > 0 else 1.0)
        memory_eta = memory_curve.at(work_bytes) if memory_curve and work_bytes > 0 else 1.0
        times.append(kernel_time_s(work_flops, work_bytes, peak, flop_eta,
                                   device.memory_bandwidth_bytes_per_s, memory_eta))
    return times[0], times[1], times[2]
