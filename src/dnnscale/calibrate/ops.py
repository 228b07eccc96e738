"""The tensor operations of one layer and one training phase, as callables to time.

`phase_ops(layer, batch)` builds random tensors for a batch of `batch` samples of a
`dnnscale.workload.Layer` and returns, per phase it computes in training (forward,
input_grad, weight_grad), a zero-argument callable that runs exactly that phase's ATen kernel(s)
— the same kernels autograd calls — so each phase can be timed on its own. Layers are described
by the same `Layer` records the model costs, which keeps what is measured and what is predicted
in step. Imports torch: only calibration and benchmarks use this module.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from dnnscale.workload.layer import Layer

PhaseOps = dict[str, Callable[[], object]]
MEMORY_BOUND_KINDS = ("maxpool2d", "avgpool2d", "relu", "softmax_loss")
COMPUTE_KINDS = ("conv2d", "linear")


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32)


def phase_ops(layer: Layer, batch: int) -> PhaseOps:
    """Callables for the phases of `layer` that cost anything, on a batch of `batch` samples.

    A phase with 0 FLOPs and 0 bytes in the layer record (e.g. the first weighted layer's input
    gradient) is left out, as training does not run it either.
    """
    builders = {"conv2d": _conv_ops, "linear": _linear_ops, "maxpool2d": _maxpool_ops,
                "avgpool2d": _avgpool_ops, "relu": _relu_ops, "softmax_loss": _softmax_loss_ops}
    if layer.kind not in builders:
        raise ValueError(f"no calibration kernel for layer kind {layer.kind!r}")
    ops = builders[layer.kind](layer, batch)
    needed = {"forward": layer.fwd_flops + layer.fwd_bytes,
              "input_grad": layer.input_grad_flops + layer.input_grad_bytes,
              "weight_grad": layer.weight_grad_flops + layer.weight_grad_bytes}
    return {phase: fn for phase, fn in ops.items() if needed[phase] > 0}


def _conv_ops(layer: Layer, batch: int) -> PhaseOps:
    assert layer.kernel and layer.stride and layer.padding and layer.out_channels
    c_in, h, w = layer.input_shape
    x = _randn(batch, c_in, h, w)                                   # (n, C_in, H, W)
    weight = _randn(layer.out_channels, c_in // layer.groups, *layer.kernel)
    bias = _randn(layer.out_channels)
    stride, padding, groups = layer.stride, layer.padding, layer.groups
    out = F.conv2d(x, weight, bias, stride, padding, 1, groups)     # (n, C_out, H_out, W_out)
    grad_out = torch.randn_like(out)
    conv_backward = torch.ops.aten.convolution_backward

    def backward(mask: list[bool]) -> Callable[[], object]:
        return lambda: conv_backward(grad_out, x, weight, [layer.out_channels], list(stride),
                                     list(padding), [1, 1], False, [0, 0], groups, mask)

    return {"forward": lambda: F.conv2d(x, weight, bias, stride, padding, 1, groups),
            "input_grad": backward([True, False, False]),
            "weight_grad": backward([False, True, True])}


def _linear_ops(layer: Layer, batch: int) -> PhaseOps:
    n_in, n_out = layer.input_shape[0], layer.output_shape[0]
    x, weight, bias = _randn(batch, n_in), _randn(n_out, n_in), _randn(n_out)   # (n, in), (out, in)
    grad_out = _randn(batch, n_out)                                             # (n, out)

    def weight_grad() -> object:
        return grad_out.t().mm(x), grad_out.sum(0)                  # (out, in), (out,)

    return {"forward": lambda: F.linear(x, weight, bias),
            "input_grad": lambda: grad_out.mm(weight),              # (n, in)
            "weight_grad": weight_grad}


def _pool_geometry(layer: Layer) -> tuple[list[int], list[int], list[int]]:
    assert layer.kernel and layer.stride and layer.padding
    return list(layer.kernel), list(layer.stride), list(layer.padding)


def _maxpool_ops(layer: Layer, batch: int) -> PhaseOps:
    kernel, stride, padding = _pool_geometry(layer)
    x = _randn(batch, *layer.input_shape)
    out, indices = F.max_pool2d_with_indices(x, kernel, stride, padding)
    grad_out = torch.randn_like(out)
    pool_backward = torch.ops.aten.max_pool2d_with_indices_backward
    return {"forward": lambda: F.max_pool2d_with_indices(x, kernel, stride, padding),
            "input_grad": lambda: pool_backward(grad_out, x, kernel, stride, padding, [1, 1],
                                                False, indices)}


def _avgpool_ops(layer: Layer, batch: int) -> PhaseOps:
    kernel, stride, padding = _pool_geometry(layer)
    x = _randn(batch, *layer.input_shape)
    grad_out = torch.randn_like(F.avg_pool2d(x, kernel, stride, padding))
    pool_backward = torch.ops.aten.avg_pool2d_backward
    return {"forward": lambda: F.avg_pool2d(x, kernel, stride, padding),
            "input_grad": lambda: pool_backward(grad_out, x, kernel, stride, padding, False, True,
                                                None)}


def _relu_ops(layer: Layer, batch: int) -> PhaseOps:
    x = _randn(batch, *layer.input_shape)
    out = torch.relu(x)
    grad_out = torch.randn_like(out)
    threshold_backward = torch.ops.aten.threshold_backward
    return {"forward": lambda: torch.relu(x),
            "input_grad": lambda: threshold_backward(grad_out, out, 0)}


def _softmax_loss_ops(layer: Layer, batch: int) -> PhaseOps:
    classes = layer.input_shape[0]
    logits = _randn(batch, classes)                                 # (n, classes)
    target = torch.randint(0, classes, (batch,))
    log_probs = F.log_softmax(logits, 1)
    grad_loss = torch.ones(())
    nll_backward = torch.ops.aten.nll_loss_backward
    softmax_backward = torch.ops.aten._log_softmax_backward_data

    def forward() -> object:
        return F.nll_loss(F.log_softmax(logits, 1), target)

    def input_grad() -> object:
        grad_log_probs = nll_backward(grad_loss, log_probs, target, None, 1, -100, grad_loss)
        return softmax_backward(grad_log_probs, log_probs, 1, torch.float32)

    return {"forward": forward, "input_grad": input_grad}
