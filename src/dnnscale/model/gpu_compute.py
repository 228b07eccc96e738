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
curve applies; a MEMORY kind does no FLOPs on the device. Fused attention's η comes from its
kernel's published speed by sequence length and head dimension (system/attention_kernels.py)
where the device has no measured curve for it.

Precision per kernel: an FP8 plan runs FP8 only where the engine does (the kinds marked
fp8_gemm, Transformer Engine's Linear layers), plus the casts of their operands; every other
kernel runs in bf16 (`kernel_precision`).
"""

from __future__ import annotations

import math

from dnnscale.errors import InputError
from dnnscale.system.attention_kernels import kernel_figures
from dnnscale.system.device import Device
from dnnscale.system.gpu_profile import curve_key
from dnnscale.workload.kind_record import KernelClass, record_of
from dnnscale.workload.kinds import CONV_KINDS
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


def memory_pass_s(device: Device, bytes_moved: float) -> float:
    """Seconds of one memory-bound kernel that moves `bytes_moved` bytes on `device`:
    `kernel_time_s` without FLOPs, at the device's HBM efficiency for that size (1 without a
    curve); 0 for none. Units: bytes -> s."""
    if bytes_moved <= 0:
        return 0.0
    curve = device.memory_efficiency
    return kernel_time_s(0.0, bytes_moved, 1.0, 1.0, device.memory_bandwidth_bytes_per_s,
                         curve.at(bytes_moved) if curve else 1.0)


def peak_flops_per_s(device: Device, precision: str) -> float:
    """The device's dense peak for `precision`; InputError when it has no such unit."""
    peak = device.peak_flops_per_s.get(precision)
    if peak is None:
        known = ", ".join(sorted(device.peak_flops_per_s))
        raise InputError("plan.precision", f"{device.name or 'the device'} has no {precision} "
                         f"units (it has {known})")
    return peak


def efficiency(device: Device, kernel_class: str, flops: float, precision: str) -> float:
    """η of `kernel_class` at a call of `flops` FLOPs in `precision`: the class's curve in
    that precision (system/gpu_profile.curve_key: `class@precision`), else the class's, else
    the GEMM curve in that precision, else the GEMM one."""
    curves = device.efficiency
    curve = (curves.get(curve_key(kernel_class, precision)) or curves.get(kernel_class)
             or curves.get(curve_key("gemm", precision)) or curves["gemm"])
    return curve.at(flops)


FP8_HIGHER_PRECISION = "bf16"
"""What an FP8 plan runs outside its FP8 GEMMs: Transformer Engine's fp8_autocast changes only
its own Linear modules; attention, norms, the embedding and the output layer stay in the
autocast precision, bf16 (Transformer Engine user guide, 'Using FP8 with Transformer Engine';
Megatron keeps the first and last layers in bf16 too)."""

FP8_CAST_BYTES_PER_VALUE = 4
"""HBM bytes per value of one FP8 cast: the bf16 value read (2 B), the FP8 value and its FP8
transpose written (1 + 1 B; Hopper's FP8 GEMMs take only the TN layout, so the operand of the
other pass is cast transposed in the same kernel, which also takes the amax for the next
scaling factor). Source: Transformer Engine's fused cast_transpose kernels (fp8 Linear forward
casts its input and weight, backward its output gradient)."""


def reduces_bias_gradient(layer: Layer, precision: str) -> bool:
    """Whether `layer`'s backward forms its bias gradient in a kernel of its own: a GEMM layer
    with a bias (`hyper` bias) whose weights train, unless it runs in FP8.

    The engines that train biased linear layers outside Transformer Engine reduce the output
    gradient over its tokens in a separate kernel: PyTorch's autograd sums a broadcast bias's
    gradient (AddmmBackward0's `self` gradient through `sum_to`, as for every eager nn.Linear);
    Megatron-LM and Megatron-DeepSpeed's LinearWithGradAccumulationAndAsyncCommunication run
    `grad_output.sum(dim=0)`, and where they add the bias later (skip_bias_add into the fused
    bias-GeLU or bias-dropout-add) autograd sums that function's bias gradient the same way;
    TensorFlow runs BiasAddGrad. Transformer Engine fuses it (its FP8 cast-transpose-dbias
    kernel; in 16 bits the wgrad GEMM's cuBLASLt BGRADB epilogue): only its FP8 case is told
    apart, as `kernel_precision` tells it."""
    return (bool(layer.hyper.get("bias")) and record_of(layer).kernel is KernelClass.GEMM
            and layer.weight_grad_flops > 0 and kernel_precision(layer, precision) != "fp8")


def bias_gradient_s(device: Device, output_values: float, bytes_per_value: float) -> float:
    """Seconds of one bias-gradient reduction (`reduces_bias_gradient`) over `output_values`
    values of an output gradient: one memory pass that reads them (its n_out-sized write is
    negligible). Units: values, bytes/value -> s."""
    return memory_pass_s(device, output_values * bytes_per_value)


def projection_shares(layer: Layer) -> tuple[float, ...]:
    """The shares of a GEMM layer's work that its separate projections run, one GEMM each
    (`hyper` projections, their output widths: a QKV layer's three Linear modules, a gated
    MLP's gate and up; workload/transformer_kinds.py), or (1.0,) for one fused GEMM."""
    widths = layer.hyper.get("projections")
    if not isinstance(widths, (list, tuple)) or len(widths) < 2:
        return (1.0,)
    total = float(sum(widths))
    return tuple(width / total for width in widths)


def input_gradient_sum_s(device: Device, projections: int, input_values: float,
                         bytes_per_value: float) -> float:
    """Seconds to sum the input gradients of `projections` separate projections of one input of
    `input_values` values: one kernel that reads the k gradients and writes their sum, (k + 1)
    values each. TensorFlow sums them so (AddN); PyTorch's eager autograd adds them pairwise
    (k − 1 kernels of 3 values each), which this lower bound does not tell apart.
    Units: values, bytes/value -> s."""
    if projections < 2:
        return 0.0
    return memory_pass_s(device, (projections + 1) * input_values * bytes_per_value)


def kernel_precision(layer: Layer, precision: str) -> str:
    """The precision `layer`'s kernels run in under a plan computing in `precision`: an FP8
    plan runs FP8 only in the kinds marked fp8_gemm, bf16 elsewhere."""
    if precision == "fp8" and not record_of(layer).fp8_gemm:
        return FP8_HIGHER_PRECISION
    return precision


FP8_CAST_KERNELS = (2, 1)
"""Cast kernels an FP8 GEMM layer launches per micro-batch: forward its input and its weights,
backward its output gradient (each one fused cast-transpose-amax kernel; FP8_CAST_BYTES_PER_VALUE
gives the source)."""


def fp8_cast_launches(layer: Layer, precision: str) -> tuple[int, int]:
    """(forward, backward) cast kernels `layer` launches under a plan computing in `precision`:
    FP8_CAST_KERNELS for a layer that runs in FP8 (`kernel_precision`), else none."""
    return FP8_CAST_KERNELS if kernel_precision(layer, precision) == "fp8" else (0, 0)


def fp8_cast_bytes(layer: Layer, fraction: float, minibatch: int,
                   weight_fraction: float | None = None) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the FP8 casts of `fraction` of an fp8_gemm `layer` over
    a micro-batch of `minibatch` samples; the member holds `weight_fraction` of its weights
    (default `fraction`; less where the work is also split by tokens or experts are split
    over ep: model/stage.py).

    Formula: forward (m·X + W)·4 B: the input X (values per sample) and the weights W cast
    and transposed; backward m·Y·4 B: the output gradient. `fraction` scales all three (a
    column-parallel rank casts its whole input, so at tp > 1 this is a lower bound). The
    weights are cast once per micro-batch, as llm-foundry's and Hugging Face's Transformer
    Engine paths do (Megatron can keep the FP8 weights of the first micro-batch).
    Units: bytes. Source: FP8_CAST_BYTES_PER_VALUE.
    """
    weights = fraction if weight_fraction is None else weight_fraction
    forward = (fraction * minibatch * layer.input_values + weights * layer.params) \
        * FP8_CAST_BYTES_PER_VALUE
    backward = fraction * minibatch * layer.activation_values * FP8_CAST_BYTES_PER_VALUE
    return float(forward), float(backward)


TRANSPOSES_PER_CALL = 2
"""Layout transposes one NCHW convolution call on Tensor Cores runs: its activation operand in
(NCHW to NHWC) and its activation result back, or in backward both activation operands in
(`conv_transpose_s`)."""


def on_tensor_cores(device: Device, precision: str) -> bool:
    """Whether `device` multiplies `precision` on Tensor Cores: its peak in that precision is
    more than twice its fp32 rate (CUDA cores run fp16 at most as paired FMAs, twice fp32,
    as P100 does; Tensor Cores run it 8x and more: presets/devices.yaml's peak_flops)."""
    peak = device.peak_flops_per_s
    return peak.get(precision, 0.0) > 2 * peak.get("fp32", math.inf)


def transposes_layout(layer: Layer, precision: str, device: Device) -> bool:
    """Whether `layer` pays cuDNN's layout transposes: a convolution kept in NCHW
    (conv2d's `layout`) whose kernels run on Tensor Cores."""
    return (layer.kind in CONV_KINDS and layer.hyper.get("layout") == "nchw"
            and on_tensor_cores(device, kernel_precision(layer, precision)))


def conv_operand_values(layer: Layer) -> tuple[int, int]:
    """(input, output) activation values per sample of a convolution: a projection shortcut
    reads its block's input (shortcut_conv2d's `block_input`), not the chain's value."""
    block_input = layer.hyper.get("block_input")
    inputs = (math.prod(block_input) if isinstance(block_input, (list, tuple))
              else layer.input_values)
    return inputs, layer.activation_values


def conv_transpose_s(layer: Layer, fraction: float, minibatch: int, device: Device,
                     bytes_scale: float) -> float:
    """Seconds of the layout transposes of one NCHW convolution call on Tensor Cores, over
    `fraction` of `layer` and a micro-batch of `minibatch` samples: each phase (forward, input
    gradient, weight gradient) transposes one input-sized and one output-sized activation
    tensor (forward X in and Y back; input gradient dY in and dX back; weight gradient X and
    dY in), each a memory-bound kernel reading and writing it once.

    Formula: t = Σ over the two tensors of memory_pass_s(2·v·m·f·b), v the tensor's values
    per sample (`conv_operand_values`), b the activation bytes per value (the conv's forward
    bytes over its in + out values, times `bytes_scale`). The filter's own transpose (its
    parameters, once per call) is left out: under 1 % of the activations' at ResNet-50's
    batch sizes. Units: s.
    Source: NVIDIA's Deep Learning Performance Guide, 'Convolutional Layers User's Guide', §
    'Tensor Layouts In Memory: NCHW vs NHWC' (Tensor Core convolutions run in NHWC; NCHW data
    is transposed before and after); onnxruntime PR #17200's profile of a CUDA NCHW network
    (an NCHW-to-NHWC and an NHWC-to-NCHW kernel around every convolution, gone in NHWC).
    """
    inputs, outputs = conv_operand_values(layer)
    bytes_per_value = layer.fwd_bytes / (inputs + outputs) * bytes_scale
    return sum(memory_pass_s(device, 2.0 * values * minibatch * fraction * bytes_per_value)
               for values in (inputs, outputs))


def flash_efficiency(device: Device, layer: Layer,
                     kernel_shape: tuple[int, bool] | None = None) -> float | None:
    """η of a `flash_attention` layer from its kernel's published speed on `device`'s family
    (system/attention_kernels.py): at its head dimension, mask and sequence length, or at the
    (sequence length, causal) of `kernel_shape` where the kernel runs on blocks of the
    sequence (ring attention, model/context_parallel.py). None where the device has a
    measured `flash` curve of its own, or no figure is published for it."""
    if "flash" in device.efficiency:
        return None
    figures = kernel_figures(str(layer.hyper.get("attention_kernel") or "fa2"), device.name)
    if figures is None or not device.peak_flops_per_s.get(figures.precision):
        return None
    hidden, heads, seq = (layer.hyper.get(key) for key in ("hidden", "heads", "seq"))
    if not (isinstance(hidden, int) and isinstance(heads, int) and isinstance(seq, int)):
        return None
    causal = bool(layer.hyper.get("causal"))
    if kernel_shape is not None:
        seq, causal = kernel_shape
    speed = figures.achieved_flops_per_s(hidden // heads, causal, seq)
    return speed / device.peak_flops_per_s[figures.precision]


def gpu_phase_times_s(layer: Layer, fraction: float, minibatch: int, device: Device,
                      precision: str, bytes_scale: float,
                      skip_weight_grad: bool = False, calls: int = 1,
                      kernel_shape: tuple[int, bool] | None = None,
                      weight_fraction: float | None = None) -> tuple[float, float, float]:
    """Forward, input-gradient and weight-gradient seconds of `fraction` of `layer` over a
    micro-batch of `minibatch` samples, each phase one kernel (`kernel_time_s`), in the
    precision `kernel_precision` gives; an FP8 GEMM adds its casts (`fp8_cast_bytes`, memory
    bound) to its forward and input-gradient phases, and an NCHW convolution on Tensor Cores
    its layout transposes to each phase that runs (`conv_transpose_s`). A flash_attention
    layer's η is its kernel's published speed (`flash_efficiency`) where the device has no
    measured curve. A GEMM layer with separate projections (`projection_shares`) runs one GEMM
    per projection in each phase, each at the η of its own FLOPs and reading the whole input.

    `bytes_scale`: the plan's activation width over the workload's (bf16 workload, fp32 plan: 2).
    `calls`: GEMMs of equal size a phase runs (a member's local experts,
    model/expert_parallel.py): η is the curve's at one call's FLOPs, F / calls.
    `kernel_shape`: the fused attention kernel's (sequence length, causal) where it is not the
    layer's own (`flash_efficiency`). `weight_fraction`: the share of the layer's weights the
    member holds, for the FP8 weight cast (`fp8_cast_bytes`).
    """
    runs_in = kernel_precision(layer, precision)
    peak = peak_flops_per_s(device, runs_in)
    kernel = record_of(layer).kernel
    kernel_class = None if kernel is KernelClass.MEMORY else kernel.value  # None: no FLOPs here
    fixed_eta = (flash_efficiency(device, layer, kernel_shape) if kernel is KernelClass.FLASH
                 else None)
    memory_curve = device.memory_efficiency
    casts = (fp8_cast_bytes(layer, fraction, minibatch, weight_fraction) if runs_in == "fp8"
             else (0.0, 0.0))
    cast_s = tuple(memory_pass_s(device, q) for q in casts)
    shares = projection_shares(layer) if kernel_class == KernelClass.GEMM.value else (1.0,)
    n_in, n_out = layer.in_features or 0, layer.out_features or 0
    input_part = n_in / (n_in + n_out) if len(shares) > 1 and n_in + n_out > 0 else 0.0
    times = []
    for phase, flops, bytes_moved in (
            ("forward", layer.fwd_flops, layer.fwd_bytes),
            ("input_grad", layer.input_grad_flops, layer.input_grad_bytes),
            ("weight_grad", layer.weight_grad_flops, layer.weight_grad_bytes)):
        if phase == "weight_grad" and skip_weight_grad:
            times.append(0.0)
            continue
        phase_s = 0.0
        for share in shares:  # one GEMM per projection: each reads the whole input
            work_flops = share * fraction * minibatch * flops if kernel_class else 0.0
            work_bytes = ((input_part + (1.0 - input_part) * share)
                          * fraction * minibatch * bytes_moved * bytes_scale)
            flop_eta = (fixed_eta if fixed_eta is not None else
                        efficiency(device, kernel_class, work_flops / max(1, calls), runs_in)
                        if kernel_class and work_flops > 0 else 1.0)
            memory_eta = memory_curve.at(work_bytes) if memory_curve and work_bytes > 0 else 1.0
            phase_s += kernel_time_s(work_flops, work_bytes, peak, flop_eta,
                                     device.memory_bandwidth_bytes_per_s, memory_eta)
        times.append(phase_s)
    # The output gradient is cast once for both backward GEMMs: in the first phase that runs.
    backward = 1 if times[1] > 0 else 2 if times[2] > 0 else None
    if backward is not None:
        times[backward] += cast_s[1]
    if transposes_layout(layer, precision, device):  # every call that runs transposes
        transpose_s = conv_transpose_s(layer, fraction, minibatch, device, bytes_scale)
        times = [t + transpose_s if t > 0 else 0.0 for t in times]
    return times[0] + cast_s[0], times[1], times[2]
