"""A device: one CPU machine (its cores) or one accelerator, with its achieved compute rates.

Compute rates are per core and per (layer kind, phase), each a `RateCurve` over the FLOPs of one
call; lookup goes from the most specific key to the least: ``linear.weight_grad``, ``linear``,
``default``. Memory-bound layers (pooling, activations, loss) are costed by bytes over the
machine's memory bandwidth, or over a calibrated per-kind bytes/s curve (``relu.forward``,
``maxpool2d``, ...) over the bytes of one call where a hardware profile gives one. A calibrated
profile may also give, per compute kind and phase, an intensity factor η(I): a RateCurve over
FLOP per byte moved by the call that multiplies the FLOP/s curve (see calibrate/fit.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dnnscale.system.curve import RateCurve

PHASES = ("forward", "input_grad", "weight_grad")


@dataclass(frozen=True)
class Device:
    """One device type: a CPU machine (a worker or a parameter server) or one accelerator."""

    cores: float
    memory_bytes: float
    memory_bandwidth_bytes_per_s: float
    flops_per_s_per_core: dict[str, RateCurve]
    update_s_per_param: float
    """Seconds for this machine to apply one parameter's update (w -= lr·g), all cores."""
    bytes_per_s_per_core: dict[str, RateCurve] = field(default_factory=dict)
    """Calibrated bytes/s of memory-bound kinds per core, over the bytes of one call."""
    intensity_factors: dict[str, RateCurve] = field(default_factory=dict)
    """Calibrated η(I) per compute kind(.phase): FLOP/s multiplier over FLOP per byte."""
    allocation_bytes_per_s_per_core: RateCurve | None = None
    """Calibrated cost of a fresh output tensor (page faults), bytes/s over its size."""
    kind: str = "cpu"
    """'cpu' (a machine of `cores` cores, rates per core) or 'gpu' (one accelerator)."""
    name: str = ""
    peak_flops_per_s: dict[str, float] = field(default_factory=dict)
    """Accelerators: dense peak FLOP/s per precision (fp32, tf32, bf16, fp16, fp8), spec sheet."""
    efficiency: dict[str, RateCurve] = field(default_factory=dict)
    """Accelerators: achieved fraction of peak per kernel class (gemm, attention, ...), a curve
    over the FLOPs of one call."""
    memory_efficiency: RateCurve | None = None
    """Accelerators: achieved fraction of HBM bandwidth, a curve over the bytes of one call."""
    launch_s: float = 0.0
    """Accelerators: host time to launch one kernel (framework and driver); a micro-batch takes
    at least its kernels' launch time, however small the kernels (eager execution)."""
    launch_contention: float = 0.0
    """Accelerators: extra host time per launch for each other training process on the node
    (they share the host's CPUs): launch time × (1 + c · (processes − 1))."""

    pipeline_step_s: float = 0.0
    """Accelerators: host time the pipeline engine spends per micro-batch and stage on its own
    schedule (send/receive bookkeeping, buffers), beyond the kernels it launches."""
    speed_spread: float = 0.0
    """Accelerators: σ, the standard deviation of ln(speed) across devices of this type (the
    same SKU runs at different clocks under power management); a synchronous step runs at its
    slowest device's pace (model/stragglers.slowest_device_factor). 0: all alike."""
    overlap_slowdown: float = 0.0
    """Accelerators: κ, how much longer compute takes while a collective runs beside it on the
    same device (the collective's kernels take SMs and memory bandwidth); the compute under an
    overlapped collective pays κ/(1 + κ) of the collective's hidden time
    (model/network.overlap_contention_s). 0: no contention."""

    def launch_time_s(self, processes_per_node: int) -> float:
        """Host time per kernel launch with `processes_per_node` training processes."""
        return self.launch_s * (1 + self.launch_contention * max(0, processes_per_node - 1))

    @property
    def is_accelerator(self) -> bool:
        return self.kind == "gpu"

    def allocation_s(self, size_bytes: float) -> float:
        """Seconds to allocate a fresh tensor of `size_bytes` beyond writing it (0 unless
        calibrated): size / (rate(size) · cores)."""
        if self.allocation_bytes_per_s_per_core is None or size_bytes <= 0:
            return 0.0
        return size_bytes / (self.allocation_bytes_per_s_per_core.at(size_bytes) * self.cores)

    def flops_per_s(self, kind: str, phase: str, size_flop: float,
                    intensity_flop_per_byte: float | None = None) -> float:
        """Achieved FLOP/s of the whole machine for a call of `size_flop` FLOPs.

        Formula: φ_kind.phase(F) · η_kind.phase(I) · cores, η = 1 where no factor is known or no
        intensity I (FLOP per byte the call moves) is given.
        """
        curves = self.flops_per_s_per_core
        curve = curves.get(f"{kind}.{phase}") or curves.get(kind) or curves["default"]
        rate = curve.at(size_flop) * self.cores
        factors = self.intensity_factors
        factor = factors.get(f"{kind}.{phase}") or factors.get(kind)
        if factor is not None and intensity_flop_per_byte is not None:
            rate *= factor.at(intensity_flop_per_byte)
        return rate

    def has_bytes_curve(self, kind: str, phase: str) -> bool:
        """Whether a calibrated bytes/s curve exists for `kind`.`phase` (or `kind`)."""
        curves = self.bytes_per_s_per_core
        return f"{kind}.{phase}" in curves or kind in curves

    def memory_bytes_per_s(self, kind: str, phase: str, size_bytes: float,
                           window_ratio: float | None = None) -> float:
        """Achieved bytes/s of a memory-bound call of `size_bytes` bytes: the kind's calibrated
        curve times cores (times its factor η at `window_ratio`, stride area over kernel area, for
        pooling), else the machine's memory bandwidth."""
        curves = self.bytes_per_s_per_core
        curve = curves.get(f"{kind}.{phase}") or curves.get(kind)
        if curve is None:
            return self.memory_bandwidth_bytes_per_s
        rate = curve.at(size_bytes) * self.cores
        factor = self.intensity_factors.get(f"{kind}.{phase}") or self.intensity_factors.get(kind)
        if factor is not None and window_ratio is not None:
            rate *= factor.at(window_ratio)
        return rate



def device_family(name: str) -> str:
    """A GPU model without its memory size: 'A100-SXM4-80GB' -> 'A100-SXM4' (the same chip in
    either size); a name that does not end in '-<size>GB' is its own family."""
    head, _, tail = name.rpartition("-")
    return head if head and re.fullmatch(r"[0-9]+GB", tail) else name
