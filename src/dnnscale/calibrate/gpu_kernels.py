"""The kernels `dnnscale calibrate --gpu` times, each with the FLOPs and bytes the model prices.

A calibration shape (hidden, heads, seq, micro-batch, vocab) is built into a one-block
transformer workload (workload/transformer.py), and every phase of every layer of it becomes
one `Kernel`: its FLOPs and bytes are the layer's own (per sample, times the micro-batch, the
bytes rescaled to the measured precision as model/gpu_compute.py does), and its code is the
torch code that training runs for that layer and phase (the functional pieces of
runtime/gpt_model.py; the matrix products of a linear layer as autograd computes them:
Y = X·Wᵀ (+ b), dX = dY·W, dW = dYᵀ·X and db = Σ dY). So the achieved efficiency of a kernel,
F / (peak · t) or Q / (B · t), is exactly the η the model needs at that size. Besides the
layers: an HBM copy over sizes, the optimizer step of runtime/gpu_optim.py over parameter
counts, and a tiny kernel for the host's launch time.

Backward phases of layers without their own matrix products run through autograd on a graph
kept alive (`retain_graph`), so only the backward kernels are timed. torch is imported here:
only the calibration imports this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dnnscale.workload.kind_record import layer_kind
from dnnscale.runtime import gpt_model
from dnnscale.workload.layer import Layer

PHASES = ("forward", "input_grad", "weight_grad")
COMPUTE_CLASSES = ("gemm", "attention", "flash")
"""Kernel classes whose efficiency is over FLOPs (a kind's record: LayerKind.kernel)."""
MEMORY, EMBEDDING, OPTIMIZER, COPY, LAUNCH = "memory", "embedding", "optimizer", "copy", "launch"
OPTIMIZER_TENSORS = 100
"""The optimizer kernel's parameters are split into this many tensors, as many as an 8-block GPT
has (12 a block and 4 more), so the per-tensor work of a step is in the measurement."""


class Factory(Protocol):
    """What a kernel needs from the device layer to make its tensors."""

    device: Any
    dtype: Any

    def tensor(self, shape: tuple[int, ...], requires_grad: bool = False,
               dtype: Any = None) -> Any: ...

    def tokens(self, high: int, shape: tuple[int, ...]) -> Any: ...


Make = Callable[[Factory], Callable[[], object]]


@dataclass(frozen=True)
class Kernel:
    """One timed call: what it is (layer kind and phase, or copy / optimizer / launch), its
    kernel class (which efficiency curve it informs), its FLOPs and bytes, the precision."""

    kind: str
    phase: str
    kernel_class: str
    flops: float
    bytes_moved: float
    precision: str
    label: str
    make: Make = field(compare=False, repr=False)


# --- layers --------------------------------------------------------------------------------------


def _dims(layer: Layer, micro_batch: int) -> dict[str, Any]:
    """The kernel's sizes from the layer's shape keys; "p", the rows of its output, is the
    positions the LM head runs on for `lm_positions` and `cross_entropy`."""
    hyper = layer.hyper
    hidden, heads = hyper["hidden"], hyper["heads"]
    return {"b": micro_batch, "s": hyper["seq"], "p": layer.output_shape[0],
            "h": hidden, "a": heads,
            "k": hyper.get("kv_heads") or heads, "d": hidden // heads if heads else 0,
            "f": hyper.get("ffn"), "V": hyper.get("vocab"), "gated": bool(hyper.get("gated")),
            "bias": bool(hyper.get("bias")), "causal": bool(hyper.get("causal", True)),
            "dropout": gpt_model.DROPOUT_P if hyper.get("dropout") else 0.0}


def _linear(layer: Layer, phase: str, micro_batch: int) -> Make:
    """A linear layer's three products on (tokens, features) matrices, as autograd runs them
    (its rows per sample: the first of its output shape, the LM head's gathered positions);
    the forward adds the bias in the GEMM (addmm), the weight gradient is the GEMM alone."""
    tokens = micro_batch * int(layer.output_shape[0])
    n_in, n_out = int(layer.in_features or 0), int(layer.out_features or 0)
    bias = bool(layer.hyper.get("bias"))

    def make(f: Factory) -> Callable[[], object]:
        w = f.tensor((n_out, n_in))
        if phase == "forward":
            x, out = f.tensor((tokens, n_in)), f.tensor((tokens, n_out))
            if bias:
                b = f.tensor((n_out,))
                return lambda: torch.addmm(b, x, w.t(), out=out)
            return lambda: torch.mm(x, w.t(), out=out)
        dy = f.tensor((tokens, n_out))
        if phase == "input_grad":
            dx = f.tensor((tokens, n_in))
            return lambda: torch.mm(dy, w, out=dx)
        x, dw = f.tensor((tokens, n_in)), f.tensor((n_out, n_in))
        # the weight gradient's GEMM alone: the bias gradient is a reduction of its own, priced
        # as a memory pass (model/gpu_compute.reduces_bias_gradient)
        return lambda: torch.mm(dy.t(), x, out=dw)

    return make


def _graph(inputs: Callable[[Factory, dict[str, Any]], dict[str, Any]],
           forward: Callable[[dict[str, Any], dict[str, Any]], Any],
           targets: dict[str, tuple[str, ...]],
           extra_grad: bool = False) -> Callable[[Layer, str, int], Make]:
    """A kernel from a forward function of named inputs: the forward phase calls it; a
    backward phase runs autograd from its output to the inputs `targets[phase]` names (the
    forward graph made once and kept; names the inputs lack, such as the bias of a LayerNorm
    without one, are skipped). `extra_grad`: the backward also adds a second gradient
    of the output's shape (where the residual stream forks, its two gradients are summed)."""

    def kernel(layer: Layer, phase: str, micro_batch: int) -> Make:
        dims = _dims(layer, micro_batch)

        def make(f: Factory) -> Callable[[], object]:
            tensors = inputs(f, dims)
            if phase == "forward":
                return lambda: forward(tensors, dims)
            out = forward(tensors, dims)
            wanted = tuple(tensors[name] for name in targets[phase] if name in tensors)
            grad = f.tensor(tuple(out.shape)) if out.dim() else None
            if extra_grad:
                other = f.tensor(tuple(out.shape))
                return lambda: torch.add(torch.autograd.grad(out, wanted, grad,
                                                             retain_graph=True)[0], other)
            return lambda: torch.autograd.grad(out, wanted, grad, retain_graph=True)
        return make

    return kernel


def _norm_inputs(rms: bool) -> Callable[[Factory, dict[str, Any]], dict[str, Any]]:
    def inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
        tensors = {"x": f.tensor((d["b"], d["s"], d["h"]), True),
                   "w": f.tensor((d["h"],), True)}
        if d["bias"] and not rms:
            tensors["bias"] = f.tensor((d["h"],), True)
        return tensors
    return inputs


def _layernorm(t: dict[str, Any], d: dict[str, Any]) -> Any:
    return torch.nn.functional.layer_norm(t["x"], (d["h"],), t["w"], t.get("bias"))


def _rmsnorm(t: dict[str, Any], d: dict[str, Any]) -> Any:
    return torch.nn.functional.rms_norm(t["x"], (d["h"],), t["w"])


def _norm_targets(rms: bool) -> dict[str, tuple[str, ...]]:
    """grad_x alone, then the gain (and bias) gradients alone: the two kernels the layer kinds
    price as the input- and weight-gradient phases (torch launches each only when asked)."""
    weights = ("w",) if rms else ("w", "bias")
    return {"input_grad": ("x",), "weight_grad": weights}


def _heads(f: Factory, d: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: f.tensor((d["b"], d["a"], d["s"], d["d"]), True) for name in names}


def _embedding_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"ids": f.tokens(d["V"], (d["b"], d["s"])),
            "table": f.tensor((d["V"], d["h"]), True),
            "positions": f.tensor((d["s"], d["h"]), True)}


def _embedding(t: dict[str, Any], d: dict[str, Any]) -> Any:
    F = torch.nn.functional
    rows = torch.arange(d["s"], device=t["ids"].device)
    return F.embedding(t["ids"], t["table"]) + F.embedding(rows, t["positions"])


def _qkv_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"qkv": f.tensor((d["b"], d["s"], d["h"] + 2 * d["k"] * d["d"]), True)}


def _flash(t: dict[str, Any], d: dict[str, Any]) -> Any:
    q, k, v = gpt_model.split_heads(t["qkv"], d["a"], d["k"])
    out = gpt_model.attention(q, k, v, d["causal"], d["dropout"], fused=True)
    return gpt_model.merge_heads(out)


def _stream_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"stream": f.tensor((d["b"], d["s"], d["h"]), True),
            "branch": f.tensor((d["b"], d["s"], d["h"]), True)}


def _act_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"x": f.tensor((d["b"], d["s"], d["f"] * (2 if d["gated"] else 1)), True)}


def _loss_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"logits": f.tensor((d["b"], d["p"], d["V"]), True),
            "targets": f.tokens(d["V"], (d["b"], d["p"]))}


def _positions_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"x": f.tensor((d["b"], d["s"], d["h"]), True)}


def _positions(t: dict[str, Any], d: dict[str, Any]) -> Any:
    positions = gpt_model.prediction_positions(d["s"], d["p"], t["x"].device)
    return gpt_model.gather_positions(t["x"], positions)


def _softmax_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"scores": f.tensor((d["b"], d["a"], d["s"], d["s"]), True)}


def _context_inputs(f: Factory, d: dict[str, Any]) -> dict[str, Any]:
    return {"probs": f.tensor((d["b"], d["a"], d["s"], d["s"]), True),
            **_heads(f, d, "v")}


BUILDERS: dict[str, Callable[[Layer, str, int], Make]] = {
    **{kind: _linear for kind in ("attn_qkv", "attn_out", "mlp_up", "mlp_down", "logits")},
    "embedding": _graph(_embedding_inputs, _embedding, {"weight_grad": ("table", "positions")}),
    "layernorm": _graph(_norm_inputs(False), _layernorm, _norm_targets(False)),
    "rmsnorm": _graph(_norm_inputs(True), _rmsnorm, _norm_targets(True)),
    "attn_scores": _graph(lambda f, d: _heads(f, d, "q", "k"),
                          lambda t, d: gpt_model.attention_scores(t["q"], t["k"]),
                          {"input_grad": ("q", "k")}),
    "attn_softmax": _graph(_softmax_inputs,
                           lambda t, d: gpt_model.masked_softmax(t["scores"], d["causal"],
                                                                 d["dropout"]),
                           {"input_grad": ("scores",)}),
    "attn_context": _graph(_context_inputs,
                           lambda t, d: gpt_model.attention_context(t["probs"], t["v"]),
                           {"input_grad": ("probs", "v")}),
    "flash_attention": _graph(_qkv_inputs, _flash, {"input_grad": ("qkv",)}),
    "residual_add": _graph(_stream_inputs,
                           lambda t, d: gpt_model.residual(t["stream"], t["branch"],
                                                           d["dropout"]),
                           {"input_grad": ("branch",)}, extra_grad=True),
    "mlp_act": _graph(_act_inputs, lambda t, d: gpt_model.mlp_activation(t["x"], d["gated"]),
                      {"input_grad": ("x",)}),
    "lm_positions": _graph(_positions_inputs, _positions, {"input_grad": ("x",)}),
    "cross_entropy": _graph(_loss_inputs,
                            lambda t, d: gpt_model.lm_loss(t["logits"], t["targets"]),
                            {"input_grad": ("logits",)}),
}
"""Layer kind -> the kernel of one of its phases."""


def kernel_class(kind: str) -> str:
    """The efficiency curve a layer kind's kernels inform (memory for FLOP-free kinds; the
    embedding's gather and dense-gradient scatter are kept apart, see gpu.py)."""
    if kind == "embedding":
        return EMBEDDING
    return layer_kind(kind).kernel.value


def layer_kernels(layer: Layer, micro_batch: int, precision: str, bytes_scale: float,
                  label: str) -> list[Kernel]:
    """A Kernel per phase of `layer` that has work, over a micro-batch of `micro_batch`."""
    builder = BUILDERS.get(layer.kind)
    if builder is None:
        raise ValueError(f"no calibration kernel for layer kind {layer.kind!r}")
    kernels = []
    cls = kernel_class(layer.kind)
    for phase, flops, moved in (
            ("forward", layer.fwd_flops, layer.fwd_bytes),
            ("input_grad", layer.input_grad_flops, layer.input_grad_bytes),
            ("weight_grad", layer.weight_grad_flops, layer.weight_grad_bytes)):
        if flops <= 0 and moved <= 0:
            continue
        work_flops = micro_batch * flops if cls in COMPUTE_CLASSES else 0.0
        kernels.append(Kernel(layer.kind, phase, cls, work_flops,
                              micro_batch * moved * bytes_scale, precision,
                              f"{layer.kind}.{phase} {label}",
                              builder(layer, phase, micro_batch)))
    return kernels


# --- copy, optimizer, launch ---------------------------------------------------------------------


def copy_kernel(elements: int, precision: str, bytes_per_value: int) -> Kernel:
    """dst.copy_(src) of `elements` values: reads and writes each once, 2·n·b bytes."""

    def make(f: Factory) -> Callable[[], object]:
        src, dst = f.tensor((elements,)), f.tensor((elements,))
        return lambda: dst.copy_(src)

    return Kernel(COPY, "-", MEMORY, 0.0, 2.0 * elements * bytes_per_value, precision,
                  f"copy n={elements}", make)


def optimizer_kernel(params: int, precision: str, step_bytes: float, master: bool) -> Kernel:
    """One optimizer step (runtime/gpu_optim.py) over `params` parameters in OPTIMIZER_TENSORS
    tensors with their gradients; `step_bytes` is what the model says it moves."""

    def make(f: Factory) -> Callable[[], object]:
        from dnnscale.runtime.gpu_optim import MasterAdamW, PlainAdamW

        dtype = torch.bfloat16 if master else f.dtype
        sizes = [params // OPTIMIZER_TENSORS] * OPTIMIZER_TENSORS
        sizes[-1] += params - sum(sizes)
        tensors = [torch.nn.Parameter(f.tensor((n,), dtype=dtype)) for n in sizes]
        optimizer = (MasterAdamW if master else PlainAdamW)(tensors)
        for p in tensors:
            p.grad = f.tensor((p.numel(),), dtype=dtype) * 1e-3
        return optimizer.step

    return Kernel(OPTIMIZER, "step", OPTIMIZER, 0.0, step_bytes, precision,
                  f"optimizer params={params}", make)


def launch_kernel(precision: str) -> Kernel:
    """A one-value in-place add: its host time per call is the cost of launching a kernel."""

    def make(f: Factory) -> Callable[[], object]:
        x = f.tensor((1,))
        return lambda: x.add_(1.0)

    return Kernel(LAUNCH, "-", LAUNCH, 0.0, 0.0, precision, "launch", make)
