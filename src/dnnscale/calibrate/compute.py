"""Compute calibration: time every layer kind and phase on a grid of synthetic layers and fit
the rate curves the model evaluates.

The calibration set is a fixed grid of layer shapes chosen to span FLOPs per call from ~1e5 to
~3e9 and arithmetic intensities from ~1 to ~300 FLOP/byte (thin-input and wide convolutions,
large-kernel strided ones, small-batch and large-batch linear layers, pooling and element-wise
layers from kilobytes to tens of megabytes). It is deliberately not the zoo's layers, so the
accuracy benchmark tests prediction at sizes the fit did not see. `--quick` uses every third
shape and shorter timing samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dnnscale.calibrate.fit import fit_compute_memory, fit_separable
from dnnscale.system.curve import RateCurve
from dnnscale.workload.kinds import build_layer
from dnnscale.workload.layer import Layer

PHASES = ("forward", "input_grad", "weight_grad")
ADDITIVE_KINDS = ("linear",)
"""Kinds fitted as t = F/φ(F) + Q/β(Q) (fit.fit_compute_memory); the others as
r = φ(F)·η(F/Q) (fit.fit_separable). Measured on the development machine: a linear layer slows
down when its weights leave the caches (working-set size), a convolution when its arithmetic
intensity is low (thin inputs), whatever its size."""
BYTES_PER_VALUE = 4


@dataclass(frozen=True)
class GridShape:
    """One calibration layer: its kind, the input shape of one sample, hyper-parameters, batch."""

    kind: str
    input_shape: tuple[int, ...]
    hyper: dict[str, object]
    batch: int
    needs_input_grad: bool = True

    def layer(self) -> Layer:
        return build_layer(self.kind, f"cal_{self.kind}", self.input_shape, BYTES_PER_VALUE,
                           self.needs_input_grad, dict(self.hyper), "calibration")


def _conv(c_in: int, size: int, c_out: int, kernel: int, stride: int, batch: int) -> GridShape:
    # Thin-input convolutions (C_in <= 3) only occur as a network's first layer, which needs no
    # input gradient; their (very slow) input-gradient kernels are not measured.
    return GridShape("conv2d", (c_in, size, size), {"out_channels": c_out, "kernel": kernel,
                                                      "stride": stride, "padding": kernel // 2},
                     batch, needs_input_grad=c_in > 3)


# (C_in, H=W, C_out, kernel, stride, batch): thin inputs, wide layers, big strided kernels.
_CONV_GRID = [
    _conv(1, 24, 16, 3, 1, 16), _conv(1, 32, 48, 5, 1, 16), _conv(1, 20, 24, 7, 1, 64),
    _conv(3, 24, 32, 3, 1, 16), _conv(3, 40, 48, 5, 1, 16), _conv(3, 96, 48, 9, 4, 8),
    _conv(3, 160, 96, 11, 4, 4), _conv(8, 16, 16, 3, 1, 8), _conv(16, 20, 32, 5, 1, 32),
    _conv(24, 10, 48, 3, 1, 16), _conv(48, 12, 96, 3, 1, 8), _conv(48, 24, 96, 5, 1, 8),
    _conv(96, 8, 160, 3, 1, 16), _conv(96, 20, 128, 5, 1, 8), _conv(160, 10, 256, 3, 1, 8),
    _conv(256, 8, 320, 3, 1, 4), _conv(320, 16, 320, 3, 1, 4), _conv(40, 5, 64, 3, 1, 32),
    _conv(128, 4, 128, 3, 1, 16), _conv(200, 6, 160, 3, 1, 2),
    _conv(1, 36, 24, 5, 1, 16), _conv(3, 28, 80, 5, 1, 16), _conv(3, 64, 32, 3, 1, 8),
    _conv(3, 128, 64, 11, 4, 4),
]


def _linear(n_in: int, n_out: int, batch: int) -> GridShape:
    return GridShape("linear", (n_in,), {"out_features": n_out}, batch)


# (n_in, n_out, batch): tiny to large, batches 2..512 (intensity ≈ batch / 2 when weights dominate).
_LINEAR_GRID = [
    _linear(64, 16, 8), _linear(200, 24, 32), _linear(400, 400, 4), _linear(300, 120, 128),
    _linear(768, 256, 16), _linear(1500, 600, 2), _linear(640, 640, 64), _linear(2000, 500, 256),
    _linear(1200, 1500, 8), _linear(3000, 1800, 24), _linear(800, 3000, 96),
    _linear(6000, 3000, 2), _linear(5000, 2500, 12), _linear(2500, 2500, 512),
    _linear(12000, 2000, 6), _linear(1800, 6000, 40),
]


def _pool(kind: str, channels: int, size: int, kernel: int, stride: int, batch: int) -> GridShape:
    return GridShape(kind, (channels, size, size), {"kernel": kernel, "stride": stride}, batch)


_POOL_GRID = [
    _pool("maxpool2d", 8, 12, 2, 2, 4), _pool("maxpool2d", 16, 30, 3, 2, 8),
    _pool("maxpool2d", 24, 40, 2, 2, 16), _pool("maxpool2d", 48, 26, 3, 2, 16),
    _pool("maxpool2d", 64, 50, 3, 2, 8), _pool("maxpool2d", 96, 60, 2, 2, 16),
    _pool("maxpool2d", 40, 100, 3, 2, 8), _pool("maxpool2d", 32, 20, 2, 2, 32),
    _pool("maxpool2d", 128, 14, 3, 2, 16), _pool("maxpool2d", 48, 8, 3, 2, 16),
    _pool("avgpool2d", 16, 30, 3, 2, 8), _pool("avgpool2d", 64, 50, 2, 2, 8),
    _pool("avgpool2d", 96, 60, 3, 2, 16),
]

_ELEMENTWISE_GRID = [
    GridShape("relu", (values,), {}, batch) for values, batch in
    ((100, 4), (700, 16), (3000, 8), (9000, 8), (1500, 64), (6000, 32), (20_000, 16),
     (50_000, 32), (150_000, 16), (400_000, 16), (300_000, 64))
] + [
    GridShape("softmax_loss", (classes,), {}, batch) for classes, batch in
    ((4, 16), (30, 64), (200, 8), (1500, 16), (5000, 32), (20_000, 16), (40_000, 64))
]

GRID: dict[str, list[GridShape]] = {"conv2d": _CONV_GRID, "linear": _LINEAR_GRID,
                                    "pooling": _POOL_GRID, "elementwise": _ELEMENTWISE_GRID}


def calibration_grid(quick: bool = False, kinds: tuple[str, ...] | None = None) -> list[GridShape]:
    """The calibration shapes (every third under `quick`), optionally only some groups."""
    shapes = [shape for group, members in GRID.items() if kinds is None or group in kinds
              for shape in members]
    if quick:
        shapes = [shape for i, shape in enumerate(shapes) if i % 3 == 0 or _is_end(shape)]
    return shapes


def _is_end(shape: GridShape) -> bool:
    members = next(m for m in GRID.values() if shape in m)
    return shape in (members[1], members[-1])


@dataclass(frozen=True)
class CallWork:
    """What one call of a phase does: FLOPs, activation bytes, bytes incl. weights, and the
    bytes of the fresh tensor it returns (output, input gradient or weight gradient)."""

    flops: float
    activation_bytes: float
    total_bytes: float
    output_bytes: float = 0.0
    window_ratio: float | None = None
    """Pooling: stride area / window area (the model's feature for overlapping windows)."""

    @property
    def intensity_flop_per_byte(self) -> float:
        return self.flops / self.total_bytes if self.total_bytes > 0 else 0.0


def call_work(layer: Layer, phase: str, batch: int) -> CallWork:
    """FLOPs and bytes of one call, counted as model/replica.py's `_layer_compute` counts them."""
    flops = {"forward": layer.fwd_flops, "input_grad": layer.input_grad_flops,
             "weight_grad": layer.weight_grad_flops}[phase] * batch
    activation = {"forward": layer.fwd_bytes, "input_grad": layer.input_grad_bytes,
                  "weight_grad": layer.weight_grad_bytes}[phase] * batch
    output_values = {"forward": layer.activation_values * batch,
                     "input_grad": layer.input_values * batch, "weight_grad": layer.params}[phase]
    window_ratio = (layer.stride[0] * layer.stride[1] / (layer.kernel[0] * layer.kernel[1])
                    if layer.kernel and layer.stride and not layer.has_weights else None)
    return CallWork(flops, activation, activation + layer.params * BYTES_PER_VALUE,
                    output_values * BYTES_PER_VALUE, window_ratio)


@dataclass(frozen=True)
class PhaseSample:
    """One measurement: a grid layer's phase took `seconds` per call."""

    kind: str
    phase: str
    work: CallWork
    seconds: float


def measure_grid(shapes: list[GridShape], samples: int, sample_s: float,
                 advance: Callable[[str], None] = lambda _: None) -> Iterator[PhaseSample]:
    """Time every phase of every shape (torch, one thread); `advance(label)` after each shape.

    Compute kinds: each phase's ATen kernel is timed alone (calibrate/ops.py) and the phases are
    then scaled together so that they add up to one forward + backward as training runs it (an
    nn.Module under autograd, calibrate/layer_timing.py), which adds autograd's per-call work
    and the gradient hand-over. Memory-bound kinds, whose calls are short, are timed only as
    training runs them: forward, then forward + backward minus forward.
    """
    from dnnscale.calibrate.layer_timing import memory_bound_phase_s, train_step_fn
    from dnnscale.calibrate.ops import phase_ops
    from dnnscale.calibrate.timing import call_time_s

    for shape in shapes:
        layer = shape.layer()
        if layer.kind in ("conv2d", "linear"):
            times = {phase: call_time_s(fn, samples=samples, sample_s=sample_s)
                     for phase, fn in phase_ops(layer, shape.batch).items()}
            train_s = call_time_s(train_step_fn(layer, shape.batch), samples=samples,
                                  sample_s=sample_s)
            scale = train_s / sum(times.values())
            times = {phase: seconds * scale for phase, seconds in times.items()}
        else:
            times = memory_bound_phase_s(layer, shape.batch, samples, sample_s)
        for phase, seconds in times.items():
            yield PhaseSample(layer.kind, phase, call_work(layer, phase, shape.batch), seconds)
        advance(f"{shape.kind} {shape.input_shape}")


@dataclass(frozen=True)
class ComputeFit:
    """Fitted per-core curves: FLOP/s and intensity factors (compute kinds), bytes/s (others)."""

    flops_per_s: dict[str, RateCurve]
    intensity_factors: dict[str, RateCurve]
    bytes_per_s: dict[str, RateCurve]


def fit_compute(samples: list[PhaseSample], allocation: RateCurve | None = None) -> ComputeFit:
    """Fit one curve (or curve pair) per kind.phase from the measurements.

    The time to allocate each call's fresh output (`allocation`, bytes/s of page-fault overhead;
    see calibrate/memory.py) is taken off first, as the model adds it back per call.
    """
    groups: dict[str, list[PhaseSample]] = {}
    for sample in samples:
        groups.setdefault(f"{sample.kind}.{sample.phase}", []).append(sample)
    flops: dict[str, RateCurve] = {}
    factors: dict[str, RateCurve] = {}
    memory: dict[str, RateCurve] = {}
    for key, members in sorted(groups.items()):
        if members[0].work.flops > 0:
            seconds = [_compute_seconds(m, allocation) for m in members]
            if members[0].kind in ADDITIVE_KINDS:
                flops[key], memory[key] = fit_compute_memory(
                    [m.work.flops for m in members], [m.work.total_bytes for m in members],
                    seconds)
                continue
            curve, factor = fit_separable([m.work.flops for m in members],
                                          [m.work.flops / s for m, s in zip(members, seconds)],
                                          [m.work.intensity_flop_per_byte for m in members])
            flops[key] = curve
            if factor is not None:
                factors[key] = factor
        else:
            ratios = [m.work.window_ratio for m in members]
            seconds = [_compute_seconds(m, allocation) for m in members]
            curve, factor = fit_separable(
                [m.work.activation_bytes for m in members],
                [m.work.activation_bytes / s for m, s in zip(members, seconds)],
                ratios if all(r is not None for r in ratios) else None)  # type: ignore[arg-type]
            memory[key] = curve
            if factor is not None:
                factors[key] = factor
    return ComputeFit(flops, factors, memory)


def _compute_seconds(sample: PhaseSample, allocation: RateCurve | None) -> float:
    if allocation is None:
        return sample.seconds
    overhead_s = sample.work.output_bytes / allocation.at(sample.work.output_bytes)
    return max(sample.seconds - overhead_s, 0.2 * sample.seconds)
