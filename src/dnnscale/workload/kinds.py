"""Registry of layer kinds: shape inference and per-phase FLOPs and bytes, as pure functions.

Each kind is registered with `@register_kind(name, kernel=..., ...)` on a function
``build(name, input_shape, bytes_per_value, needs_input_grad, **hyper) -> Layer``, with the
kind's other facts (kernel class, split rules, recompute class: workload/kind_record.py, one
record per kind). Users extend the registry the same way; an unregistered kind is an error. FLOP formulas (1 multiply-add = 2 FLOP) match
torch.utils.flop_counter, so an imported PyTorch model counts exactly what the zoo counts.

Bytes per sample are what a phase reads and writes in activations (parameters, read once per
step, are not per sample and are costed separately); b is bytes per value, in/out the layer's
input/output values per sample:
  forward                                   (in + out) · b
  input gradient, conv/linear               (out + in) · b   (read grad_out, write grad_in)
  input gradient, pooling/activation/loss   (2·out + in) · b (also read a saved out-sized tensor)
  weight gradient, conv/linear              (in + out) · b   (read the saved input and grad_out)
Layers before the first weighted layer, and the first weighted layer's input gradient, are not
computed in training (nothing upstream needs a gradient), so they count 0 there.

The transformer kinds (embedding, norms, attention parts, MLP parts, logits, loss) live in
workload/transformer_kinds.py and register themselves here when `dnnscale.workload` is imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

from dnnscale.errors import MAX_COUNT, InputError, require_count, require_nonnegative, short_repr
from dnnscale.workload.kind_record import (LAYER_KINDS, KernelClass, LayerBuilder, LayerKind,
                                           Recompute, layer_kind)
from dnnscale.workload.layer import Layer

ADAM_SPLIT = {"adam": "neurons", "megatron": "replicated"}
"""Split rules of a kind Project Adam divides by its output neurons (features, channels or rows,
model/sharding.py) and Megatron has no split for (whole on every member)."""


def register_kind(name: str, *, kernel: KernelClass, splits: Mapping[str, str],
                  cpu_rate: str = "default", tensor_extent_key: str | None = None,
                  recompute: Recompute = Recompute.BLOCK, vector_gradients: bool = False,
                  fp8_gemm: bool = False, expert: bool = False,
                  expert_exchange: str | None = None) -> Callable[[LayerBuilder], LayerBuilder]:
    """Register the builder of kind `name` with the kind's facts (kind_record.LayerKind). The
    kernel class and the split rules are always stated; the rest default to their neutral
    value: the CPU device's default curve, no unit of Megatron split, recomputed only with its
    block, weight gradients formed where they are computed, no FP8 GEMM, not an expert."""

    def decorate(builder: LayerBuilder) -> LayerBuilder:
        LAYER_KINDS[name] = LayerKind(name, builder, kernel, cpu_rate, MappingProxyType(dict(splits)),
                                      tensor_extent_key, recompute, vector_gradients, fp8_gemm,
                                      expert, expert_exchange)
        return builder

    return decorate


def build_layer(kind: str, name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                needs_input_grad: bool, hyper: dict[str, object], field: str) -> Layer:
    """Build one layer of `kind` on `input_shape`; errors name `field`."""
    builder = layer_kind(kind, f"{field}.kind").build
    _check_fields(builder, kind, hyper, field)
    try:
        layer = builder(name=name, input_shape=tuple(input_shape),
                                  bytes_per_value=bytes_per_value,
                                  needs_input_grad=needs_input_grad, **hyper)
    except TypeError as exc:  # an unexpected or missing hyper-parameter
        raise InputError(field, f"bad fields for a {kind} layer: {short_repr(str(exc), 120)}") \
            from None
    check_layer(layer, field)
    # A kind may record its fields resolved (defaults filled in: transformer kinds do); those win.
    merged = {**hyper, **layer.hyper}
    if merged == layer.hyper:
        return layer
    return Layer(**{**layer.__dict__, "hyper": merged})


_BUILDER_ARGUMENTS = ("name", "input_shape", "bytes_per_value", "needs_input_grad")


def _check_fields(builder: LayerBuilder, kind: str, hyper: dict[str, object], field: str) -> None:
    """Unknown or missing hyper-parameters of a `kind` layer, named, before it is built."""
    import inspect

    parameters = inspect.signature(builder).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    known = [p for p in parameters if p not in _BUILDER_ARGUMENTS]
    unknown = sorted(str(key) for key in hyper if key not in known)
    if unknown:
        raise InputError(f"{field}.{unknown[0][:60]}", f"unknown field for a {kind} layer "
                         f"(known: {', '.join(known) or 'none'})")
    required = [p for p in known if parameters[p].default is inspect.Parameter.empty]
    missing = [p for p in required if p not in hyper]
    if missing:
        raise InputError(f"{field}.{missing[0]}", f"missing (a {kind} layer needs "
                         f"{', '.join(required)})")


def check_shape(shape: object, field: str, allow_scalar: bool = False) -> tuple[int, ...]:
    """A per-sample shape: positive integers (none for a scalar, where allowed) whose product,
    the values per sample, is at most MAX_COUNT."""
    if not isinstance(shape, (list, tuple)) or (not shape and not allow_scalar) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
        raise InputError(field, f"must be a list of positive integers, got {short_repr(shape)}")
    if math.prod(shape) > MAX_COUNT:
        raise InputError(field, f"{short_repr(list(shape))} holds more than {MAX_COUNT:,} values "
                         f"per sample")
    return tuple(shape)


def check_layer(layer: Layer, field: str) -> Layer:
    """Physical sanity of a built layer (any kind, however made): a registered kind, shapes as
    `check_shape`, parameters a count >= 0, FLOPs and bytes per phase finite and >= 0."""
    layer_kind(layer.kind, f"{field}.kind")
    check_shape(layer.input_shape, f"{field}.input_shape", allow_scalar=True)
    check_shape(layer.output_shape, f"{field}.output_shape", allow_scalar=True)
    require_count(f"{field}.params", layer.params)
    for name in ("fwd_flops", "input_grad_flops", "weight_grad_flops", "fwd_bytes",
                 "input_grad_bytes", "weight_grad_bytes"):
        require_nonnegative(f"{field}.{name}", getattr(layer, name))
    return layer


def _count(value: object, field: str, minimum: int = 1) -> int:
    """A layer's integer hyper-parameter (channels, features, groups) >= `minimum`."""
    return require_count(field, value, minimum)


def _flag(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(field, f"must be true or false, got {short_repr(value)}")
    return value


def _pair(value: object, field: str, minimum: int = 1) -> tuple[int, int]:
    """An integer or a pair of integers (height, width), each in [minimum, MAX_COUNT]."""
    if isinstance(value, int) and not isinstance(value, bool):
        pair = (value, value)
    elif isinstance(value, (list, tuple)) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        pair = (int(value[0]), int(value[1]))
    else:
        raise InputError(field, f"must be an integer or a pair of integers, got "
                         f"{short_repr(value)}")
    if min(pair) < minimum or max(pair) > MAX_COUNT:
        raise InputError(field, f"must be >= {minimum}" + (f" and <= {MAX_COUNT:,}" if max(pair)
                         > MAX_COUNT else "") + f", got {short_repr(value)}")
    return pair


def _activation_bytes(in_values: int, out_values: int, b: int) -> tuple[float, float, float]:
    return (in_values + out_values) * b, (2 * out_values + in_values) * b, 0.0


def _need_3d(input_shape: tuple[int, ...], kind: str, name: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise InputError(f"layers.{name}", f"a {kind} layer needs a (channels, height, width) "
                         f"input, got shape {list(input_shape)}")
    c, h, w = input_shape
    return c, h, w


CONV_LAYOUTS = ("nhwc", "nchw")
"""Activation layouts a convolution may be run in (conv2d's `layout`)."""
CONV_KINDS = ("conv2d", "shortcut_conv2d")
"""The kinds that are convolutions (cuDNN's convolution calls on a GPU), and take `layout`."""


def _layout(value: object, field: str) -> str:
    """A convolution's `layout`, one of CONV_LAYOUTS."""
    if value not in CONV_LAYOUTS:
        raise InputError(field, f"must be one of {', '.join(CONV_LAYOUTS)}, got "
                         f"{short_repr(value)}")
    return str(value)


def _conv_output(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _conv(kind: str, name: str, input_shape: tuple[int, int, int], bytes_per_value: int,
          needs_input_grad: bool, out_channels: int, kernel: object, stride: object,
          padding: object, groups: int, bias: bool) -> Layer:
    """A 2-D convolution of `input_shape` (channels, height, width): the counts of `conv2d`'s
    docstring, the one place they are computed (conv2d and shortcut_conv2d)."""
    c_in, h_in, w_in = input_shape
    kh, kw = _pair(kernel, f"layers.{name}.kernel")
    sh, sw = _pair(stride, f"layers.{name}.stride")
    ph, pw = _pair(padding, f"layers.{name}.padding", minimum=0)
    _count(out_channels, f"layers.{name}.out_channels")
    _count(groups, f"layers.{name}.groups")
    _flag(bias, f"layers.{name}.bias")
    if c_in % groups or out_channels % groups:
        raise InputError(f"layers.{name}.groups", f"channels {c_in}->{out_channels} are not "
                         f"divisible into {groups} groups")
    h_out, w_out = _conv_output(h_in, kh, sh, ph), _conv_output(w_in, kw, sw, pw)
    if h_out < 1 or w_out < 1:
        raise InputError(f"layers.{name}.kernel", f"kernel {kh}x{kw} does not fit the "
                         f"{h_in}x{w_in} input")
    macs = out_channels * h_out * w_out * kh * kw * c_in // groups
    params = out_channels * (c_in // groups) * kh * kw + (out_channels if bias else 0)
    in_values, out_values = c_in * h_in * w_in, out_channels * h_out * w_out
    b = bytes_per_value
    return Layer(name=name, kind=kind, input_shape=(c_in, h_in, w_in),
                 output_shape=(out_channels, h_out, w_out), params=params,
                 fwd_flops=2.0 * macs, input_grad_flops=2.0 * macs if needs_input_grad else 0.0,
                 weight_grad_flops=2.0 * macs,
                 fwd_bytes=(in_values + out_values) * b,
                 input_grad_bytes=(in_values + out_values) * b if needs_input_grad else 0.0,
                 weight_grad_bytes=(in_values + out_values) * b,
                 in_channels=c_in, out_channels=out_channels, kernel=(kh, kw), stride=(sh, sw),
                 padding=(ph, pw), groups=groups)


@register_kind("conv2d", kernel=KernelClass.GEMM, splits=ADAM_SPLIT, cpu_rate="conv2d")
def conv2d(name: str, input_shape: tuple[int, ...], bytes_per_value: int, needs_input_grad: bool,
           out_channels: int, kernel: object, stride: object = 1, padding: object = 0,
           groups: int = 1, bias: bool = True, layout: str = "nhwc") -> Layer:
    """2-D convolution C_in -> C_out, kernel K_h x K_w, output H x W.

    FLOPs per sample (fwd = input-grad = weight-grad): 2·C_out·H·W·K_h·K_w·C_in/groups
    (torch.utils.flop_counter.conv_flop_count). Params: C_out·C_in/groups·K_h·K_w (+ C_out bias).
    `layout`: the memory layout the framework keeps its activations in, 'nhwc' (channels last:
    what Tensor Core convolutions take) or 'nchw' (PyTorch's and MXNet's default), whose
    Tensor Core convolutions pay cuDNN's layout transposes (model/gpu_compute.py,
    `conv_transpose_s`).
    """
    _layout(layout, f"layers.{name}.layout")
    return _conv("conv2d", name, _need_3d(input_shape, "conv2d", name), bytes_per_value,
                 needs_input_grad, out_channels, kernel, stride, padding, groups, bias)


@register_kind("shortcut_conv2d", kernel=KernelClass.GEMM, splits=ADAM_SPLIT, cpu_rate="conv2d")
def shortcut_conv2d(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                    needs_input_grad: bool, block_input: object, stride: object = 1,
                    kernel: object = 1, bias: bool = False, layout: str = "nhwc") -> Layer:
    """The projection shortcut of a residual block (He et al. 2016, §3.3 option B): a
    convolution of the block's input, a branch beside the chain. It reads `block_input`
    (channels, height, width), not the chain's value, and its output must have the chain's
    shape, the main branch's output it is added to (`shortcut_add`); the chain's value passes
    on (its input and output shapes are the chain's). Padding 0, one group.

    Formula: `conv2d`'s on the block input: FLOPs per sample 2·C_out·H·W·K_h·K_w·C_in per phase
    (H x W its output); bytes per phase (C_in·H_in·W_in + C_out·H·W)·b. Its input gradient is
    also where the block's input forks (the main branch's first conv reads it too): the two
    gradients are summed there, read 2 and write 1, + 3·C_in·H_in·W_in·b. Params
    C_out·C_in·K_h·K_w (+ C_out bias). Source: torch.utils.flop_counter.conv_flop_count; the
    fork's sum is autograd's accumulation of a tensor's gradients (one add kernel).
    Under Project Adam's model-parallel splits its re-gather and stripe traffic are priced on
    the chain's shape (model/sharding.py), not the block input it reads.
    """
    _layout(layout, f"layers.{name}.layout")
    shape = check_shape(block_input, f"layers.{name}.block_input")
    if len(shape) != 3:
        raise InputError(f"layers.{name}.block_input", f"must be (channels, height, width), got "
                         f"{list(shape)}")
    out = _need_3d(input_shape, "shortcut_conv2d", name)
    conv = _conv("shortcut_conv2d", name, (shape[0], shape[1], shape[2]), bytes_per_value,
                 needs_input_grad, out[0], kernel, stride, 0, 1, bias)
    if conv.output_shape != out:
        raise InputError(f"layers.{name}.block_input", f"the shortcut of {list(shape)} gives "
                         f"{list(conv.output_shape)}, not the main branch's {list(out)}")
    fork = 3.0 * math.prod(shape) * bytes_per_value if needs_input_grad else 0.0
    return replace(conv, input_shape=out, input_grad_bytes=conv.input_grad_bytes + fork,
                   hyper={"block_input": list(shape), "bias": bias, "layout": layout})


@register_kind("linear", kernel=KernelClass.GEMM, splits=ADAM_SPLIT, cpu_rate="linear",
               vector_gradients=True)
def linear(name: str, input_shape: tuple[int, ...], bytes_per_value: int, needs_input_grad: bool,
           out_features: int, bias: bool = True) -> Layer:
    """Fully connected layer n_in -> n_out.

    FLOPs per sample (fwd = input-grad = weight-grad): 2·n_in·n_out (torch mm/addmm formula).
    Params: n_in·n_out (+ n_out bias).
    """
    if len(input_shape) != 1:
        raise InputError(f"layers.{name}", f"a linear layer needs a flat input, got shape "
                         f"{list(input_shape)} (add a flatten layer before it)")
    n_in = input_shape[0]
    _count(out_features, f"layers.{name}.out_features")
    _flag(bias, f"layers.{name}.bias")
    macs = n_in * out_features
    b = bytes_per_value
    return Layer(name=name, kind="linear", input_shape=(n_in,), output_shape=(out_features,),
                 params=n_in * out_features + (out_features if bias else 0),
                 fwd_flops=2.0 * macs, input_grad_flops=2.0 * macs if needs_input_grad else 0.0,
                 weight_grad_flops=2.0 * macs,
                 fwd_bytes=(n_in + out_features) * b,
                 input_grad_bytes=(n_in + out_features) * b if needs_input_grad else 0.0,
                 weight_grad_bytes=(n_in + out_features) * b,
                 in_features=n_in, out_features=out_features)


def _pool(kind: str, name: str, input_shape: tuple[int, ...], bytes_per_value: int,
          needs_input_grad: bool, kernel: object, stride: object, padding: object) -> Layer:
    c, h_in, w_in = _need_3d(input_shape, kind, name)
    kh, kw = _pair(kernel, f"layers.{name}.kernel")
    sh, sw = _pair(kernel if stride is None else stride, f"layers.{name}.stride")
    ph, pw = _pair(padding, f"layers.{name}.padding", minimum=0)
    if 2 * ph > kh or 2 * pw > kw:  # PyTorch's rule: the padding is at most half the window
        raise InputError(f"layers.{name}.padding", f"must be at most half the kernel "
                         f"{kh}x{kw}, got {ph}x{pw}")
    h_out, w_out = _conv_output(h_in, kh, sh, ph), _conv_output(w_in, kw, sw, pw)
    if h_out < 1 or w_out < 1:
        raise InputError(f"layers.{name}.kernel", f"pool {kh}x{kw} does not fit the "
                         f"{h_in}x{w_in} input")
    fwd, bwd, _ = _activation_bytes(c * h_in * w_in, c * h_out * w_out, bytes_per_value)
    return Layer(name=name, kind=kind, input_shape=(c, h_in, w_in), output_shape=(c, h_out, w_out),
                 params=0, fwd_flops=0.0, input_grad_flops=0.0, weight_grad_flops=0.0,
                 fwd_bytes=fwd, input_grad_bytes=bwd if needs_input_grad else 0.0,
                 weight_grad_bytes=0.0, in_channels=c, out_channels=c, kernel=(kh, kw),
                 stride=(sh, sw), padding=(ph, pw))


@register_kind("maxpool2d", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def maxpool2d(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool, kernel: object, stride: object = None,
              padding: object = 0) -> Layer:
    """Max pooling: 0 FLOP (memory bound), bytes as in the module docstring."""
    return _pool("maxpool2d", name, input_shape, bytes_per_value, needs_input_grad, kernel,
                 stride, padding)


@register_kind("avgpool2d", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def avgpool2d(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
              needs_input_grad: bool, kernel: object, stride: object = None,
              padding: object = 0) -> Layer:
    """Average pooling: 0 FLOP (memory bound), bytes as in the module docstring."""
    return _pool("avgpool2d", name, input_shape, bytes_per_value, needs_input_grad, kernel,
                 stride, padding)


def _elementwise(kind: str, name: str, input_shape: tuple[int, ...], output_shape: tuple[int, ...],
                 bytes_per_value: int, needs_input_grad: bool, moves_data: bool = True) -> Layer:
    values = math.prod(input_shape)
    fwd, bwd, _ = _activation_bytes(values, values, bytes_per_value)
    channels = input_shape[0] if len(input_shape) == 3 else None
    return Layer(name=name, kind=kind, input_shape=input_shape, output_shape=output_shape,
                 params=0, fwd_flops=0.0, input_grad_flops=0.0, weight_grad_flops=0.0,
                 fwd_bytes=fwd if moves_data else 0.0,
                 input_grad_bytes=bwd if (needs_input_grad and moves_data) else 0.0,
                 weight_grad_bytes=0.0, in_channels=channels, out_channels=channels)


@register_kind("relu", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def relu(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
         needs_input_grad: bool, inplace: bool = False) -> Layer:
    """Element-wise ReLU: 0 FLOP, memory bound. `inplace`: it overwrites its input (PyTorch's
    nn.ReLU(inplace=True)): the same bytes, but no buffer of its own (Layer.kept_values); its
    backward reads the output it kept there."""
    _flag(inplace, f"layers.{name}.inplace")
    return _elementwise("relu", name, input_shape, input_shape, bytes_per_value, needs_input_grad)


BN_BYTES_PER_VALUE = {"none": (3, 5), "relu": (3, 7), "add_relu": (4, 8)}
"""Values of the norm's size a training batch norm reads and writes per value of its input,
(forward, input gradient), by `fuse`:
  none      forward: a statistics pass reads x, a pass reads x and writes y (3); input
            gradient: a reduction reads dy and x, a pass reads dy and x and writes dx (5).
  relu      forward as none, the ReLU applied as y is written (3); input gradient: both
            passes also read y, from which the ReLU's gradient is taken (3 + 4 = 7).
  add_relu  forward also reads the addend z (4); input gradient as relu, and the pass also
            writes dz, the addend's gradient (3 + 5 = 8).
Source: cuDNN's cudnnBatchNormalizationForwardTrainingEx / BackwardEx with bnOps
CUDNN_BATCHNORM_OPS_BN_ACTIVATION and _BN_ADD_ACTIVATION (forward takes x and the addend z and
writes y; backward takes x, y and dy and writes dx and dz), which MXNet's BatchNorm with
act_type relu and BatchNormAddRelu run on NHWC data."""
BN_FUSIONS = tuple(BN_BYTES_PER_VALUE)
"""What a batch norm may run in its own kernels (batchnorm2d's `fuse`): nothing more, the ReLU
after it, or a residual block's add and the ReLU after that."""


def _bn_fusion(value: object, field: str) -> str:
    """A batch norm's `fuse`, one of BN_FUSIONS."""
    if value not in BN_FUSIONS:
        raise InputError(field, f"must be one of {', '.join(BN_FUSIONS)}, got "
                         f"{short_repr(value)}")
    return str(value)


@register_kind("batchnorm2d", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def batchnorm2d(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                needs_input_grad: bool, fuse: str = "none") -> Layer:
    """Batch normalization in training (Ioffe & Szegedy 2015) over each of C channels of a
    (C, H, W) input: the batch's mean and variance per channel, then y = γ·x̂ + β.

    Formula: 0 FLOP (memory bound; torch.utils.flop_counter counts none). Params 2·C (γ, β;
    the running statistics are buffers). Bytes per sample, v = C·H·W values, two kernels a
    phase: BN_BYTES_PER_VALUE[fuse] · v · b for the forward and the input gradient, which also
    yields γ's and β's gradients (weight gradient 0); where nothing upstream needs an input
    gradient, only the reduction runs (2·v·b, 3·v·b fused, which also reads y) as the weight
    gradient. Units: bytes per sample. Source: PyTorch's CUDA batch norm, two kernels a phase
    (aten/src/ATen/native/cuda/Normalization.cu{,h}: batch_norm_stats then batch_norm_elemt
    forward, batch_norm_backward_reduce then batch_norm_backward_elemt backward).

    `fuse`: 'none' (default; the ReLU and the residual add after it are layers of their own),
    'relu' (the ReLU after it runs in its kernels: write no `relu` layer after it) or
    'add_relu' (a residual block's add and the ReLU after it run in its kernels: the block's
    `shortcut_add` takes `fused: true`, and no `relu` follows), as MXNet runs ResNet with
    --fuse-bn-relu and --fuse-bn-add-relu (BN_BYTES_PER_VALUE).
    """
    c, h, w = _need_3d(input_shape, "batchnorm2d", name)
    fused = _bn_fusion(fuse, f"layers.{name}.fuse")
    values, b = c * h * w, bytes_per_value
    forward, backward = BN_BYTES_PER_VALUE[fused]
    reduction = 2 if fused == "none" else 3
    return Layer(name=name, kind="batchnorm2d", input_shape=(c, h, w), output_shape=(c, h, w),
                 params=2 * c, fwd_flops=0.0, input_grad_flops=0.0, weight_grad_flops=0.0,
                 fwd_bytes=float(forward * values * b),
                 input_grad_bytes=float(backward * values * b) if needs_input_grad else 0.0,
                 weight_grad_bytes=0.0 if needs_input_grad else float(reduction * values * b),
                 in_channels=c, out_channels=c)


@register_kind("shortcut_add", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def shortcut_add(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool, identity: bool = True, fused: bool = False,
                 inplace: bool = False) -> Layer:
    """A residual block's add (He et al. 2016): the chain's value plus the other branch, of
    the same (C, H, W) shape, from outside the chain: the block's input itself (`identity`,
    an identity shortcut) or, after a projection (`shortcut_conv2d` and its norm in the
    chain), the main branch's output.

    Formula: 0 FLOP (memory bound). Bytes per sample, v = C·H·W: forward reads both and writes
    the sum, 3·v·b. Input gradient: the add passes its output gradient to both branches
    unchanged (no kernel); with an identity shortcut the block's input forks (the main
    branch's first conv and this add read it), so its two gradients are summed, read 2 and
    write 1, 3·v·b, counted here; 0 after a projection, whose conv counts its fork. Units:
    bytes per sample. Source: autograd's AddBackward returns the gradient as it is and
    accumulates the gradients of a tensor used twice with one add kernel.

    `fused`: the add (and the ReLU after it) runs in the block's last batch norm
    (batchnorm2d's fuse: add_relu, which counts its bytes): forward 0 here; the identity
    fork's sum remains. `inplace`: the sum is written over the chain's value (`out +=
    residual`, DeepLearningExamples' and torchvision's bottleneck): the same bytes, no buffer of
    its own (Layer.kept_values); neither input is needed for the backward.
    """
    _flag(inplace, f"layers.{name}.inplace")
    c, h, w = _need_3d(input_shape, "shortcut_add", name)
    values, b = c * h * w, bytes_per_value
    fork = 3.0 * values * b if _flag(identity, f"layers.{name}.identity") else 0.0
    forward = 0.0 if _flag(fused, f"layers.{name}.fused") else 3.0 * values * b
    return Layer(name=name, kind="shortcut_add", input_shape=(c, h, w), output_shape=(c, h, w),
                 params=0, fwd_flops=0.0, input_grad_flops=0.0, weight_grad_flops=0.0,
                 fwd_bytes=forward, input_grad_bytes=fork if needs_input_grad else 0.0,
                 weight_grad_bytes=0.0, in_channels=c, out_channels=c)


@register_kind("flatten", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def flatten(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
            needs_input_grad: bool) -> Layer:
    """Flatten (C, H, W) -> (C·H·W,): a view, no FLOPs and no bytes moved."""
    return _elementwise("flatten", name, input_shape, (math.prod(input_shape),), bytes_per_value,
                        needs_input_grad, moves_data=False)


@register_kind("softmax_loss", kernel=KernelClass.MEMORY, splits=ADAM_SPLIT)
def softmax_loss(name: str, input_shape: tuple[int, ...], bytes_per_value: int,
                 needs_input_grad: bool) -> Layer:
    """Softmax + cross-entropy loss over a flat input: 0 FLOP, memory bound; outputs the
    per-class probabilities (same shape as the input)."""
    if len(input_shape) != 1:
        raise InputError(f"layers.{name}", f"softmax_loss needs a flat input, got shape "
                         f"{list(input_shape)}")
    return _elementwise("softmax_loss", name, input_shape, input_shape, bytes_per_value,
                        needs_input_grad)


@register_kind("generic", kernel=KernelClass.GEMM, splits=ADAM_SPLIT, cpu_rate="generic")
def generic(name: str, input_shape: tuple[int, ...], bytes_per_value: int, needs_input_grad: bool,
            output_shape: list[int], params: int = 0, fwd_flops: float = 0.0,
            input_grad_flops: float = 0.0, weight_grad_flops: float = 0.0,
            fwd_bytes: float = 0.0, input_grad_bytes: float = 0.0,
            weight_grad_bytes: float = 0.0) -> Layer:
    """A layer whose costs were measured or counted elsewhere (e.g. a PyTorch import).

    Nothing is derived: every count is given. It is split by features (its flattened output).
    Shapes are positive integers (an empty shape is a scalar), params a count >= 0, FLOPs and
    bytes finite numbers >= 0.
    """
    out_shape = check_shape(output_shape, f"layers.{name}.output_shape", allow_scalar=True)
    require_count(f"layers.{name}.params", params)
    for field, value in (("fwd_flops", fwd_flops), ("input_grad_flops", input_grad_flops),
                         ("weight_grad_flops", weight_grad_flops), ("fwd_bytes", fwd_bytes),
                         ("input_grad_bytes", input_grad_bytes),
                         ("weight_grad_bytes", weight_grad_bytes)):
        require_nonnegative(f"layers.{name}.{field}", value)
    return Layer(name=name, kind="generic", input_shape=input_shape,
                 output_shape=out_shape, params=int(params),
                 fwd_flops=float(fwd_flops),
                 input_grad_flops=float(input_grad_flops) if needs_input_grad else 0.0,
                 weight_grad_flops=float(weight_grad_flops), fwd_bytes=float(fwd_bytes),
                 input_grad_bytes=float(input_grad_bytes) if needs_input_grad else 0.0,
                 weight_grad_bytes=float(weight_grad_bytes))
