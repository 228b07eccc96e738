"""The torch network of one worker: its vertical slice of a Workload (see netplan.py).

An activation inside a replica is either replicated (every worker holds all of it), split along
dim 1 (channels or features, after a channel- or feature-split layer) or split along dim 2
(rows, after a stripe-split conv layer). Moving between these goes through autograd Functions on
the replica's process group:

- `GatherSplit` (forward all_gather along dim 1 or 2; backward reduce_scatter of the input
  gradient, to which every worker's part of the next layer contributes), before a layer that
  needs the whole input;
- `HaloExchange` (forward: each worker receives from its neighbours the rows of its input stripe
  it does not hold; backward: those rows' gradients go back to their owners and are added), before
  a stripe-split conv or a pooling layer on a row-split input;
- `GatherReplicated` (the logits before the loss, which every worker then computes identically;
  backward keeps the worker's own slice of the identical gradient).

Stripe-split conv layers hold the whole kernel on every worker; their weight gradients are summed
over the replica's workers (`sync_shared_grads`). All partition traffic adds its wall time to
`PartitionComm.seconds`, which the step timer reads.

Weights: the full layer is initialised from a per-layer seed and each worker keeps its slice, so
P = 1 with the same seed is exactly the unpartitioned network.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dnnscale.workload.splits import split_extent, split_sizes, stripe_rows
from dnnscale.runtime.layout import split_offsets
from dnnscale.runtime.netplan import layer_has_bias, weighted_scheme_of, weighted_schemes
from dnnscale.workload import Workload
from dnnscale.workload.layer import Layer

Range = tuple[int, int]


@dataclass
class PartitionComm:
    """A worker's place in its replica: the process group (None when P = 1), its index, P, the
    global ranks of the group's members, and the seconds spent in partition traffic since the
    last reset."""

    group: Any
    index: int
    parts: int
    ranks: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _pad_dim(tensor: torch.Tensor, dim: int, width: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if not missing:
        return tensor.contiguous()
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor, tensor.new_zeros(shape)], dim).contiguous()


def _padded_all_gather(local: torch.Tensor, sizes: list[int], dim: int,
                       comm: PartitionComm) -> torch.Tensor:
    """all_gather parts of unequal width along `dim` (padded to the widest), concatenated."""
    padded = _pad_dim(local, dim, max(sizes))
    chunks = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(chunks, padded, group=comm.group)
    return torch.cat([chunk.narrow(dim, 0, size) for chunk, size in zip(chunks, sizes)], dim)


class GatherSplit(torch.autograd.Function):
    """Forward: all_gather the split activation. Backward: reduce_scatter the input gradient."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, sizes: list[int], dim: int,  # type: ignore[override]
                comm: PartitionComm) -> torch.Tensor:
        ctx.sizes, ctx.dim, ctx.comm = sizes, dim, comm
        start = time.perf_counter()
        full = _padded_all_gather(local, sizes, dim, comm)
        comm.seconds += time.perf_counter() - start
        return full

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        sizes, dim, comm = ctx.sizes, ctx.dim, ctx.comm
        start = time.perf_counter()
        chunks = [_pad_dim(chunk, dim, max(sizes)) for chunk in torch.split(grad_full, sizes, dim)]
        mine = torch.empty_like(chunks[comm.index])
        dist.reduce_scatter(mine, chunks, group=comm.group)
        comm.seconds += time.perf_counter() - start
        return mine.narrow(dim, 0, sizes[comm.index]), None, None, None


class GatherReplicated(torch.autograd.Function):
    """Forward: all_gather the split logits. Backward: every worker holds the same gradient of
    the (identically computed) loss, so each keeps its own slice without communicating."""

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, sizes: list[int],  # type: ignore[override]
                comm: PartitionComm) -> torch.Tensor:
        ctx.sizes, ctx.comm = sizes, comm
        start = time.perf_counter()
        full = _padded_all_gather(local, sizes, 1, comm)
        comm.seconds += time.perf_counter() - start
        return full

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        offset = split_offsets(ctx.sizes)[ctx.comm.index]
        return grad_full.narrow(1, offset, ctx.sizes[ctx.comm.index]), None, None


def _overlap(a: Range, b: Range) -> Range | None:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def _exchange(sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]],
              group: Any) -> None:
    works = [dist.irecv(buffer, src, group=group) for src, buffer in recvs]
    works += [dist.isend(tensor.contiguous(), dst, group=group) for dst, tensor in sends]
    for work in works:
        work.wait()


class HaloExchange(torch.autograd.Function):
    """Rows `needed[me]` of a row-split activation whose worker q holds rows `held[q]` (dim 2).

    Forward: receive the missing rows from the workers that hold them, send them the rows they
    need. Backward: send the gradient of borrowed rows back to their owners; add what comes back.
    """

    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, held: list[Range],  # type: ignore[override]
                needed: list[Range], comm: PartitionComm) -> torch.Tensor:
        me = comm.index
        ctx.held, ctx.needed, ctx.comm = held, needed, comm
        start = time.perf_counter()
        lo = needed[me][0]
        slab = local.new_zeros((*local.shape[:2], needed[me][1] - lo, local.shape[3]))
        sends, recvs = [], []
        for q in range(comm.parts):
            give = _overlap(held[me], needed[q])
            take = _overlap(held[q], needed[me])
            if q == me:
                if take is not None:
                    slab[:, :, take[0] - lo:take[1] - lo] = \
                        local[:, :, take[0] - held[me][0]:take[1] - held[me][0]]
                continue
            if give is not None:
                sends.append((comm.ranks[q], local[:, :, give[0] - held[me][0]:
                                                   give[1] - held[me][0]]))
            if take is not None:
                recvs.append((comm.ranks[q], slab[:, :, take[0] - lo:take[1] - lo]))
        buffers = [(src, torch.empty_like(view)) for src, view in recvs]
        _exchange(sends, buffers, comm.group)
        for (_, view), (_, buffer) in zip(recvs, buffers):
            view.copy_(buffer)
        comm.seconds += time.perf_counter() - start
        return slab

    @staticmethod
    def backward(ctx: Any, grad_slab: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        held, needed, comm = ctx.held, ctx.needed, ctx.comm
        me = comm.index
        start = time.perf_counter()
        lo, base = needed[me][0], held[me][0]
        grad = grad_slab.new_zeros((*grad_slab.shape[:2], held[me][1] - base, grad_slab.shape[3]))
        sends, recvs = [], []
        for q in range(comm.parts):
            give = _overlap(held[me], needed[q])  # rows q borrowed from me: their grads return
            take = _overlap(held[q], needed[me])
            if q == me:
                if take is not None:
                    grad[:, :, take[0] - base:take[1] - base] += \
                        grad_slab[:, :, take[0] - lo:take[1] - lo]
                continue
            if take is not None:
                sends.append((comm.ranks[q], grad_slab[:, :, take[0] - lo:take[1] - lo]))
            if give is not None:
                recvs.append((comm.ranks[q], give))
        buffers = [(src, grad.new_empty((*grad.shape[:2], rows[1] - rows[0], grad.shape[3])))
                   for src, rows in recvs]
        _exchange(sends, buffers, comm.group)
        for (_, rows), (_, buffer) in zip(recvs, buffers):
            grad[:, :, rows[0] - base:rows[1] - base] += buffer
        comm.seconds += time.perf_counter() - start
        return grad, None, None, None


class _CapturedLinear(torch.autograd.Function):
    """y = x·Wᵀ + b that records its input and its output's gradient on `module` and computes
    no weight gradient (Adam's vector protocol: the parameter server forms δᵀ·a itself)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None, module: "VectorLinear") -> torch.Tensor:
        ctx.save_for_backward(weight)
        ctx.module = module
        module.captured_input = x.detach()
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        ctx.module.captured_error = grad_out.detach()
        grad_x = grad_out @ weight if ctx.needs_input_grad[0] else None
        return grad_x, None, None, None


class VectorLinear(nn.Linear):
    """nn.Linear that, with `capture` on, records (input a, output error δ) of each step and
    leaves its weight and bias gradients unset (None): the vector protocol pushes a and δ."""

    capture = False
    captured_input: torch.Tensor | None = None
    captured_error: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.capture:
            return super().forward(x)
        return _CapturedLinear.apply(x, self.weight, self.bias, self)


def _full_layer(layer: Layer) -> nn.Module:
    if layer.kind == "conv2d":
        return nn.Conv2d(layer.input_shape[0], layer.output_shape[0], layer.kernel,
                         stride=layer.stride, padding=layer.padding, groups=layer.groups,
                         bias=layer_has_bias(layer))
    return nn.Linear(layer.input_shape[0], layer.output_shape[0], bias=layer_has_bias(layer))


def _seeded_full_layer(layer: Layer, index: int, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed * 100_003 + index)
        return _full_layer(layer)


def _sliced_layer(layer: Layer, index: int, seed: int, start: int, size: int) -> nn.Module:
    """The worker's slice [start, start+size) of the layer's outputs, cut from the full layer
    initialised with torch's default init under a per-layer seed."""
    full = _seeded_full_layer(layer, index, seed)
    if layer.kind == "conv2d":
        part: nn.Module = nn.Conv2d(layer.input_shape[0], size, layer.kernel, stride=layer.stride,
                                    padding=layer.padding, groups=layer.groups,
                                    bias=layer_has_bias(layer))
    else:
        part = VectorLinear(layer.input_shape[0], size, bias=layer_has_bias(layer))
    with torch.no_grad():
        part.weight.copy_(full.weight[start:start + size])
        if layer_has_bias(layer):
            part.bias.copy_(full.bias[start:start + size])
    return part


def _unweighted(layer: Layer) -> nn.Module:
    if layer.kind == "relu":
        return nn.ReLU()
    if layer.kind == "flatten":
        return nn.Flatten(1)
    if layer.kind == "maxpool2d":
        return nn.MaxPool2d(layer.kernel, stride=layer.stride, padding=layer.padding)
    if layer.kind == "avgpool2d":
        return nn.AvgPool2d(layer.kernel, stride=layer.stride, padding=layer.padding)
    raise ValueError(f"no module for layer kind {layer.kind!r}")


class Stripe(nn.Module):
    """A conv or pooling layer applied to an input stripe: adds the stripe's share of the
    layer's row padding explicitly (−inf for max pooling) and keeps the column padding."""

    def __init__(self, layer: Layer, module: nn.Module, top: int, bottom: int) -> None:
        super().__init__()
        self.inner, self.top, self.bottom = module, top, bottom
        self.fill = -math.inf if layer.kind == "maxpool2d" else 0.0
        module.padding = (0, layer.padding[1] if layer.padding else 0)  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.top or self.bottom:
            x = F.pad(x, (0, 0, self.top, self.bottom), value=self.fill)
        return self.inner(x)


class _Op(nn.Module):
    """A parameter-free step of the plan: a gather, halo exchange or final gather."""

    def __init__(self, kind: str, comm: PartitionComm, **args: Any) -> None:
        super().__init__()
        self.kind, self.comm, self.args = kind, comm, args

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.args
        if self.kind == "gather":
            return GatherSplit.apply(x, a["sizes"], a["dim"], self.comm)
        if self.kind == "halo":
            return HaloExchange.apply(x, a["held"], a["needed"], self.comm)
        if self.kind == "slice_rows":
            return x[:, :, a["rows"][0]:a["rows"][1]]
        return GatherReplicated.apply(x, a["sizes"], self.comm)


class PartitionedNet(nn.Module):
    """One worker's part of the workload's network; forward returns the full logits (B, C).

    `schemes` maps each weighted layer's name to 'channels', 'rows' (conv2d) or 'features'
    (linear); see netplan.weighted_schemes.
    """

    def __init__(self, workload: Workload, comm: PartitionComm, seed: int,
                 schemes: dict[str, str] | None = None) -> None:
        super().__init__()
        self.comm = comm
        schemes = schemes or weighted_schemes(workload, "channels")
        steps: list[nn.Module] = []
        self.shared: list[nn.Parameter] = []  # whole-kernel params of stripe-split layers
        self.linears: dict[str, VectorLinear] = {}  # FC layers by name (vector protocol)
        parts, me = comm.parts, comm.index
        # state: ("whole", None) | ("dim1", sizes) | ("rows", [ranges of every worker])
        state: tuple[str, Any] = ("whole", None)

        def need_whole() -> None:
            nonlocal state
            if state[0] == "dim1":
                steps.append(_Op("gather", comm, sizes=state[1], dim=1))
            elif state[0] == "rows":
                sizes = [hi - lo for lo, hi in state[1]]
                steps.append(_Op("gather", comm, sizes=sizes, dim=2))
            state = ("whole", None)

        for index, layer in enumerate(workload.layers):
            if layer.kind == "softmax_loss":
                continue
            scheme = schemes.get(layer.name) if layer.has_weights else None
            windowed = layer.kind in ("conv2d", "maxpool2d", "avgpool2d")
            if parts > 1 and (scheme == "rows" or (windowed and not layer.has_weights
                                                    and state[0] == "rows")):
                out_ranges = [(o, o + n) for o, n in zip(
                    split_offsets(split_sizes(split_extent(layer, "rows"), parts)),
                    split_sizes(split_extent(layer, "rows"), parts))]
                reads = [stripe_rows(layer, r) for r in out_ranges]
                if state[0] == "rows":
                    steps.append(_Op("halo", comm, held=state[1],
                                     needed=[rows for rows, _, _ in reads]))
                else:
                    need_whole()
                    steps.append(_Op("slice_rows", comm, rows=reads[me][0]))
                if layer.has_weights:
                    module = _seeded_full_layer(layer, index, seed)
                    self.shared += list(module.parameters())
                else:
                    module = _unweighted(layer)
                steps.append(Stripe(layer, module, reads[me][1], reads[me][2]))
                state = ("rows", out_ranges)
            elif layer.has_weights:
                need_whole()
                sizes = split_sizes(split_extent(layer, weighted_scheme_of(layer)), parts)
                start = split_offsets(sizes)[me]
                module = _sliced_layer(layer, index, seed, start, sizes[me])
                if isinstance(module, VectorLinear):
                    self.linears[layer.name] = module
                steps.append(module)
                state = ("dim1", sizes) if parts > 1 else ("whole", None)
            else:
                if layer.kind == "flatten":
                    if state[0] == "rows":
                        need_whole()
                    elif state[0] == "dim1":
                        spatial = math.prod(layer.input_shape[1:])
                        state = ("dim1", [width * spatial for width in state[1]])
                steps.append(_unweighted(layer))
        if state[0] == "rows":
            need_whole()
        if state[0] == "dim1":
            steps.append(_Op("final", comm, sizes=state[1]))
        self.steps = nn.ModuleList(steps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            x = step(x)
        return x.flatten(1)

    def capture_vectors(self, on: bool = True) -> None:
        """Record every FC layer's input and output error per step instead of its weight
        gradients (Adam's vector protocol); see `vectors`."""
        for module in self.linears.values():
            module.capture = on

    def vectors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """The last step's (input a, output error δ) of every FC layer, by layer name."""
        out = {}
        for name, module in self.linears.items():
            if module.captured_input is None or module.captured_error is None:
                raise RuntimeError(f"layer {name!r}: no vectors captured (run a backward pass)")
            out[name] = (module.captured_input, module.captured_error)
        return out

    def sync_shared_grads(self) -> None:
        """Sum the weight gradients of stripe-split layers over the replica's workers."""
        if not self.shared or self.comm.parts == 1:
            return
        start = time.perf_counter()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.shared]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.comm.group)
        offset = 0
        for p in self.shared:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        self.comm.seconds += time.perf_counter() - start
