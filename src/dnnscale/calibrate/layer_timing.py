"""Measured forward+backward time of one layer as training runs it: an nn.Module under autograd.

This is the ground truth the compute accuracy benchmark compares predictions with, and what
calibration scales its per-phase kernel timings (ops.py) to: autograd decides which kernels run,
gradients land in fresh `.grad` tensors (set to None every step, as `optimizer.zero_grad()`
does), and the input needs a gradient only where the model says the layer computes one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from dnnscale.calibrate.timing import call_time_s
from dnnscale.workload.layer import Layer


def _module(layer: Layer) -> Callable[[torch.Tensor], torch.Tensor]:
    if layer.kind == "conv2d":
        assert layer.in_channels and layer.out_channels and layer.kernel
        return nn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel, layer.stride,
                         layer.padding, groups=layer.groups)
    if layer.kind == "linear":
        assert layer.in_features and layer.out_features
        return nn.Linear(layer.in_features, layer.out_features)
    if layer.kind in ("maxpool2d", "avgpool2d"):
        pool = nn.MaxPool2d if layer.kind == "maxpool2d" else nn.AvgPool2d
        return pool(layer.kernel, layer.stride, layer.padding)
    if layer.kind == "relu":
        return nn.ReLU()
    if layer.kind == "flatten":
        return nn.Flatten()
    raise ValueError(f"no module for layer kind {layer.kind!r}")


def train_step_fn(layer: Layer, batch: int) -> Callable[[], None]:
    """A callable doing one forward + backward of `layer` on a batch of `batch` samples."""
    needs_input_grad = layer.input_grad_flops > 0 or layer.input_grad_bytes > 0
    x = torch.randn(batch, *layer.input_shape, requires_grad=needs_input_grad)
    if layer.kind == "softmax_loss":
        target = torch.randint(0, layer.input_shape[0], (batch,))

        def loss_step() -> None:
            x.grad = None
            F.cross_entropy(x, target).backward()

        return loss_step
    module = _module(layer)
    params = list(module.parameters()) if isinstance(module, nn.Module) else []
    grad_out = torch.randn(batch, *layer.output_shape)

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        out = module(x)
        if out.requires_grad:
            out.backward(grad_out)

    return step


def forward_fn(layer: Layer, batch: int) -> Callable[[], None]:
    """A callable doing the training forward of `layer` (autograd records the graph)."""
    needs_input_grad = layer.input_grad_flops > 0 or layer.input_grad_bytes > 0
    x = torch.randn(batch, *layer.input_shape, requires_grad=needs_input_grad)
    if layer.kind == "softmax_loss":
        target = torch.randint(0, layer.input_shape[0], (batch,))

        def loss_forward() -> None:
            F.cross_entropy(x, target)

        return loss_forward
    module = _module(layer)

    def forward() -> None:
        module(x)

    return forward


def memory_bound_phase_s(layer: Layer, batch: int, samples: int,
                         sample_s: float) -> dict[str, float]:
    """Forward and input-gradient seconds of a memory-bound layer as training runs it:
    forward = t(forward), input_grad = t(forward + backward) − t(forward) (≥ 10 % of forward)."""
    forward_s = call_time_s(forward_fn(layer, batch), samples=samples, sample_s=sample_s)
    total_s = call_time_s(train_step_fn(layer, batch), samples=samples, sample_s=sample_s)
    return {"forward": forward_s, "input_grad": max(total_s - forward_s, 0.1 * forward_s)}


def measured_train_s(layer: Layer, batch: int, samples: int = 7, sample_s: float = 0.05,
                     clock: Callable[[], float] | None = None) -> float:
    """Seconds of one forward + backward of `layer` over a batch (one thread; timing.py's
    fastest sample, on this thread's CPU clock unless `clock` is given)."""
    extra = {"clock": clock} if clock is not None else {}
    return call_time_s(train_step_fn(layer, batch), samples=samples, sample_s=sample_s,
                       warmup=2, **extra)
