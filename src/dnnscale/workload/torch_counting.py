"""Count FLOPs and bytes of every aten op of a PyTorch training step, per module and phase.

`CountingMode` is a small `TorchDispatchMode` that runs under
`torch.utils.module_tracker.ModuleTracker`. For each aten op it records:

* the module it belongs to: the most recently entered module among the tracker's `parents`
  (the innermost one running, in forward or in backward). Ops of a module that is not a leaf
  (e.g. the internals of ``nn.MultiheadAttention`` or a residual ``+`` in a block) belong to that
  module itself;
* its FLOPs, from torch's public formula table `torch.utils.flop_counter.flop_registry`
  (1 multiply-add = 2 FLOP), plus formulas for the CPU flash-attention ops the table lacks;
* the bytes it reads (distinct elements of its tensor arguments; an expanded tensor counts its
  stored elements only) and writes (its tensor outputs). Views move nothing.

After backward, `classify_weight_gradients` marks which backward outputs are parameter
gradients (they reach a parameter's ``.grad`` through views, copies and accumulation only), so
each backward op's FLOPs and bytes split into an input-gradient and a weight-gradient part.

Nothing here allocates: it is meant to run on the meta device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry
from torch.utils.module_tracker import ModuleTracker

# TorchDispatchMode is public API documented under torch.utils._python_dispatch.
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _flop_formulas() -> dict[Any, Callable[..., int]]:
    """torch's FLOP table plus the CPU flash-attention ops (same argument order as the CUDA
    flash op, so torch's own sdpa formulas apply: fwd 4·b·h·s_q·s_k·d, bwd 2.5x that)."""
    formulas: dict[Any, Callable[..., int]] = dict(flop_registry)
    extra = {
        "_scaled_dot_product_flash_attention_for_cpu": aten._scaled_dot_product_flash_attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward":
            aten._scaled_dot_product_flash_attention_backward,
    }
    for name, like in extra.items():
        packet = getattr(aten, name, None)
        if packet is not None and packet not in formulas and like in formulas:
            formulas[packet] = formulas[like]
    return formulas


FLOP_FORMULAS = _flop_formulas()

# Ops that only move a gradient toward a parameter's .grad: walked through when marking
# weight gradients.
_PLUMBING = {aten.clone, aten.copy_, aten._to_copy, aten.add, aten.add_, aten.detach,
             aten.alias, aten._unsafe_view, aten.view, aten.reshape, aten.contiguous}
# Ops that allocate without writing values.
_NO_BYTES = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty,
             aten.new_empty_strided}
_ONE_DTYPE_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.convolution}
"""Ops whose tensor operands a real device needs in one dtype; the meta device does not check
(an ``--input-shape 8:int64`` fed straight into an nn.Linear would trace, and then fail on any
real device)."""


def stored_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (stride-0 dims count once)."""
    values = math.prod(size for size, stride in zip(tensor.shape, tensor.stride()) if stride != 0)
    return values * tensor.element_size()


def _tensors(values: Iterable[Any]) -> list[torch.Tensor]:
    flat, _ = tree_flatten(list(values))
    return [value for value in flat if isinstance(value, torch.Tensor)]


def _is_view(func: Any) -> bool:
    """True for ops whose outputs alias an input without writing (views, detach, alias)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


@dataclass
class OpRecord:
    """One aten op: where it ran, its FLOPs and the bytes it moved."""

    op: str
    module: str
    backward: bool
    flops: float
    read_bytes: list[float]           # per tensor argument (distinct ones), 0 for views
    write_bytes: list[float]          # per tensor output, 0 for views
    input_ids: list[int]
    output_ids: list[int]
    plumbing: bool
    output_shapes: list[tuple[int, ...]] = field(default_factory=list)
    # For convolution_backward: (input-gradient FLOPs, weight-gradient FLOPs).
    flop_split: tuple[float, float] | None = None
    weight_outputs: set[int] = field(default_factory=set)  # indices into write_bytes

    def phase_costs(self) -> dict[str, tuple[float, float]]:
        """{phase: (FLOPs, bytes)} for phases 'fwd', 'input_grad', 'weight_grad'."""
        if not self.backward:
            return {"fwd": (self.flops, sum(self.read_bytes) + sum(self.write_bytes))}
        written = sum(self.write_bytes)
        weight_written = sum(self.write_bytes[i] for i in self.weight_outputs)
        input_written = written - weight_written
        reads = sum(self.read_bytes)
        if not self.weight_outputs:
            return {"input_grad": (self.flops, reads + written)}
        if input_written == 0:
            return {"weight_grad": (self.flops, reads + written)}
        if self.flop_split is not None:  # convolution_backward(grad_out, input, weight, ...)
            grad_out, inp, weight = (self.read_bytes + [0.0, 0.0, 0.0])[:3]
            return {"input_grad": (self.flop_split[0], grad_out + weight + input_written),
                    "weight_grad": (self.flop_split[1], grad_out + inp + weight_written)}
        # Another fused op writing both kinds (e.g. a norm's backward): its work is counted as
        # input gradient; only what it writes for the weights is weight gradient.
        return {"input_grad": (self.flops, reads + input_written),
                "weight_grad": (0.0, weight_written)}


class CountingMode(TorchDispatchMode):
    """Record an `OpRecord` per aten op, attributed through a `ModuleTracker`.

    Keeps references to every tensor it sees so that tensor ids stay unique while it lives
    (cheap on the meta device). Set `active = False` to let ops pass uncounted.
    """

    def __init__(self, tracker: ModuleTracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.records: list[OpRecord] = []
        self.active = True
        self._stack: list[str] = []
        self._keep: list[torch.Tensor] = []
        self._producer: dict[int, tuple[int, int]] = {}  # tensor id -> (record, output index)

    def current_module(self) -> str:
        """The innermost running module ('Global' when none), newest first on ties."""
        parents = self.tracker.parents
        self._stack = [name for name in self._stack if name in parents]
        new = sorted((name for name in parents if name not in self._stack),
                     key=lambda name: name.count("."))
        self._stack.extend(new)
        for name in reversed(self._stack):
            if name != "Global":
                return name
        return "Global"

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in _ONE_DTYPE_OPS:
            dtypes = sorted({str(t.dtype) for t in _tensors([args, kwargs])})
            if len(dtypes) > 1:
                raise RuntimeError(f"{func.overloadpacket} got operands of {' and '.join(dtypes)}"
                                   f"; a real device needs one dtype (is an integer input fed "
                                   f"to a floating-point layer? give token ids to an "
                                   f"embedding)")
        out = func(*args, **kwargs)
        if not self.active:
            return out
        packet = func.overloadpacket
        inputs = _tensors([args, kwargs])
        outputs = _tensors([out])
        view = _is_view(func)
        flops = 0.0
        split = None
        formula = FLOP_FORMULAS.get(packet)
        if formula is not None:
            flops = float(formula(*args, **kwargs, out_val=out))
            if packet is aten.convolution_backward:
                mask = list(args[-1])
                only_input = [mask[0], False, False]
                only_weight = [False, mask[1], False]
                split = (float(formula(*args[:-1], only_input, out_val=out)),
                         float(formula(*args[:-1], only_weight, out_val=out)))
        distinct: dict[int, torch.Tensor] = {}
        for tensor in inputs:
            distinct.setdefault(id(tensor), tensor)
        read_ids = set(distinct)
        if packet is aten.copy_ and inputs:  # the destination is written, not read
            read_ids.discard(id(args[0]))
        no_bytes = view or packet in _NO_BYTES
        record = OpRecord(
            op=str(packet), module=self.current_module(), backward=self.tracker.is_bw,
            flops=flops,
            read_bytes=[0.0 if no_bytes or key not in read_ids else float(stored_bytes(t))
                        for key, t in distinct.items()],
            write_bytes=[0.0 if no_bytes else float(t.numel() * t.element_size())
                         for t in outputs],
            input_ids=list(distinct), output_ids=[id(t) for t in outputs],
            plumbing=view or packet in _PLUMBING, flop_split=split,
            output_shapes=[tuple(t.shape) for t in outputs])
        index = len(self.records)
        self.records.append(record)
        self._keep.extend(outputs)
        for position, tensor in enumerate(outputs):  # the latest writer (in-place ops too)
            self._producer[id(tensor)] = (index, position)
        return out

    def classify_weight_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Mark the backward outputs that become parameter gradients (see module docstring)."""
        pending = [id(p.grad) for p in parameters if p.grad is not None]
        seen: set[int] = set()
        while pending:
            tensor_id = pending.pop()
            if tensor_id in seen or tensor_id not in self._producer:
                continue
            seen.add(tensor_id)
            index, position = self._producer[tensor_id]
            record = self.records[index]
            if not record.backward:
                continue
            record.weight_outputs.add(position)
            if record.plumbing:
                pending.extend(record.input_ids)

    def release(self) -> None:
        """Drop the tensor references kept for id stability."""
        self._keep.clear()
        self._producer.clear()
