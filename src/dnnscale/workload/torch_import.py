"""Import a PyTorch model as a dnnscale `Workload`, without real memory or compute.

`from_torch(module, example_input_shapes)` builds (or copies) the model on the meta device,
runs one training step (forward, then backward from the sum of the outputs or from a loss)
under `torch_counting.CountingMode`, and turns the per-module counts into layers:

* each module that runs aten ops becomes one layer, in the order of its first forward op, named
  by its qualified name (ops run directly in the root's forward form a layer named after the
  root's class). A module called several times (a ReLU reused in a ResNet block) is one layer
  holding all its calls;
* modules that match a zoo kind exactly (``nn.Conv2d`` -> conv2d, in the model's memory
  layout: NCHW unless its convolutions' weights are channels_last, ``nn.Linear`` -> linear,
  ``nn.ReLU`` -> relu, ``nn.MaxPool2d`` -> maxpool2d, ``nn.AvgPool2d`` -> avgpool2d,
  ``nn.Flatten`` -> flatten, a cross-entropy loss on flat logits -> softmax_loss), are called
  once and whose input is the previous layer's output are built with the zoo's analytical
  formulas (`kinds.build_layer`), after checking that the counted FLOPs agree per phase; every
  other module is a `generic` layer carrying the counted FLOPs and bytes;
* counts are per sample: the step is traced at two batch sizes and each count is the slope
  between them, so parameter reads and weight-gradient writes (once per step, not per sample)
  drop out, as in the zoo's bytes convention (workload/kinds.py);
* the workload is a chain: a generic layer's `input_shape` is the previous layer's output, so
  the workload round-trips through YAML. Its own output shape is its module's (last) output;
* a layer's parameters are those of its module not owned by a descendant layer (so
  ``nn.MultiheadAttention`` owns its never-called ``out_proj``); shared parameters count once.

Unsupported: models whose Python code reads tensor values (data-dependent control flow,
``.item()``, ``.tolist()``, boolean masks whose size depends on values) and ops without a meta
kernel; both raise `InputError` saying so.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.kinds import build_layer
from dnnscale.workload.layer import Layer
from dnnscale.workload.torch_counting import CountingMode
from dnnscale.workload.torch_transformer import (AttentionCall, AttentionRecorder, LayerSpec,
                                                 position_table, transformer_specs)
from dnnscale.workload.workload import Workload, check_workload

PHASES = ("fwd", "input_grad", "weight_grad")
TRACE_BATCHES = (2, 4)
_DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16,
           "half": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
           "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
           "bool": torch.bool}
_LOSSES = ("cross_entropy",)
_F = TypeVar("_F", bound=Callable[..., Any])
_FLOP_RTOL = 1e-9
MAX_INPUTS = 64
"""Inputs a model may take (one shape each)."""
MAX_DIMS = 32
"""Dimensions of one input sample (torch allows 64 per tensor, batch included)."""
MAX_SAMPLE_VALUES = 1 << 40
"""Values of one input sample: the meta device allocates nothing, but a tensor's storage size
(batch · values · bytes) must stay within 64 bits, and a trillion values per sample is no
training sample."""
OUTSIDE = "(outside modules)"  # ops run outside every module (e.g. gradient accumulation)


@dataclass
class _ModuleCounts:
    """What one trace counted for one module (all batch-sized, not yet per sample)."""

    order: int
    last_output: tuple[int, ...] | None = None  # raw shape of its last forward op's output
    # (index in the step's op sequence, raw output shape) of each forward op
    forward_ops: list[tuple[int, tuple[int, ...] | None]] = field(default_factory=list)
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    bytes: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))


@dataclass
class _Trace:
    """One traced training step at batch size `batch`."""

    batch: int
    counts: dict[str, _ModuleCounts]
    calls: dict[str, int]
    input_shapes: dict[str, tuple[int, ...] | None]
    output_shapes: dict[str, tuple[int, ...] | None]
    attention: dict[str, list[AttentionCall]] = field(default_factory=dict)


def parse_dtype(name: str, field_name: str) -> torch.dtype:
    """A torch dtype from its name ('float32', 'int64', 'long', ...)."""
    key = name.strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise InputError(field_name, f"unknown dtype {short_repr(name)} (known: "
                         f"{', '.join(_DTYPES)})")
    return _DTYPES[key]


def _stdout_to_stderr(func: _F) -> _F:
    """Run `func` with the user's prints (a module's or factory's own `print`) sent to stderr:
    stdout holds only what dnnscale prints, one JSON document under --json."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with contextlib.redirect_stdout(sys.stderr):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@_stdout_to_stderr
def load_factory(spec: str) -> Callable[[], nn.Module]:
    """Resolve ``package.module:factory`` to a callable (a function or an nn.Module class)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InputError("--torch", f"expected package.module:factory, got {short_repr(spec)}")
    if os.getcwd() not in sys.path and "" not in sys.path:  # like `python -m`: cwd first
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError("--torch", f"cannot import {short_repr(module_name)}: "
                         f"{_one_line(exc)}") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module failed to load
        raise InputError("--torch", f"importing {short_repr(module_name)} failed: "
                         f"{type(exc).__name__}: {_one_line(exc)}") from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InputError("--torch", f"{short_repr(module_name)} has no attribute "
                             f"{short_repr(attr)}") from None
        except Exception as exc:  # noqa: BLE001 - a module __getattr__ that fails
            raise InputError("--torch", f"reading {short_repr(attr)} of {short_repr(module_name)} "
                             f"failed: "
                             f"{type(exc).__name__}: {_one_line(exc)}") from None
    if not callable(target):
        raise InputError("--torch", f"{short_repr(spec)} is not callable")
    return target


def _one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's message on one line, cut to `limit` characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_input_shapes(text: str) -> tuple[list[tuple[int, ...]], list[torch.dtype]]:
    """Parse ``3,224,224`` or ``64:int64`` or ``3,32,32;10`` (inputs separated by ';', each
    optionally ending in ':dtype') into shapes and dtypes (default: the default float dtype)."""
    shapes, dtypes = [], []
    parts = text.split(";")
    if len(parts) > MAX_INPUTS:
        raise InputError("--input-shape", f"{len(parts):,} inputs; at most {MAX_INPUTS}")
    for part in parts:
        dims, _, dtype = part.strip().partition(":")
        try:
            shape = tuple(int(v) for v in dims.split(",") if v.strip())
        except ValueError:
            shape = ()
        if not shape or any(v < 1 for v in shape):
            raise InputError("--input-shape", f"expected comma-separated positive integers "
                             f"per input (e.g. 3,224,224 or 128:int64), got "
                             f"{short_repr(part.strip())}")
        _check_size(shape, "--input-shape")
        shapes.append(shape)
        dtypes.append(parse_dtype(dtype, "--input-shape") if dtype
                      else torch.get_default_dtype())
    return shapes, dtypes


def _check_size(shape: tuple[int, ...], field_name: str) -> None:
    """At most MAX_DIMS dimensions and MAX_SAMPLE_VALUES values per sample."""
    if len(shape) > MAX_DIMS:
        raise InputError(field_name, f"{len(shape)} dimensions per sample; at most {MAX_DIMS}")
    if math.prod(shape) > MAX_SAMPLE_VALUES:
        raise InputError(field_name, f"{short_repr(list(shape))} is {math.prod(shape):.3g} "
                         f"values per sample; at most {MAX_SAMPLE_VALUES:.3g}")


def _normalise_shapes(example_input_shapes: Any) -> list[tuple[int, ...]]:
    shapes = example_input_shapes
    if isinstance(shapes, (list, tuple)) and shapes and all(
            isinstance(v, int) and not isinstance(v, bool) for v in shapes):
        shapes = [shapes]
    if not isinstance(shapes, (list, tuple)) or not shapes:
        raise InputError("input_shape", f"expected a shape or a list of shapes, got "
                         f"{short_repr(example_input_shapes)}")
    if len(shapes) > MAX_INPUTS:
        raise InputError("input_shape", f"{len(shapes):,} inputs; at most {MAX_INPUTS}")
    result = []
    for shape in shapes:
        if not isinstance(shape, (list, tuple)) or not shape or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape):
            raise InputError("input_shape", f"each input shape must list positive integers "
                             f"(per sample, without the batch), got {short_repr(shape)}")
        _check_size(tuple(shape), "input_shape")
        result.append(tuple(shape))
    return result


def _normalise_dtypes(input_dtypes: Any, count: int) -> list[torch.dtype]:
    if input_dtypes is None:
        return [torch.get_default_dtype()] * count
    if isinstance(input_dtypes, (str, torch.dtype)):
        input_dtypes = [input_dtypes] * count
    if len(input_dtypes) != count:
        raise InputError("input_dtypes", f"gives {len(input_dtypes)} dtypes for {count} inputs")
    return [d if isinstance(d, torch.dtype) else parse_dtype(str(d), "input_dtypes")
            for d in input_dtypes]


def _meta_model(module: nn.Module | Callable[[], nn.Module]) -> tuple[nn.Module, bool]:
    """The model on the meta device, and whether it is the caller's own object (already meta)."""
    if not isinstance(module, nn.Module):
        try:
            with torch.device("meta"):
                built = module()
        except InputError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's factory failed
            raise InputError("torch", f"the factory raised {type(exc).__name__}: "
                             f"{_one_line(exc)}") from None
        if not isinstance(built, nn.Module):
            raise InputError("torch", f"the factory returned {type(built).__name__}, not an "
                             f"nn.Module")
        return built.to("meta"), False
    return module, True


def _sample_shape(small: tuple[int, ...] | None, large: tuple[int, ...] | None,
                  batch: int) -> tuple[int, ...] | None:
    """One sample's shape from the same tensor traced at two batch sizes: dims that grew
    with the batch are divided by it (B -> dropped, B·T -> T); the others are kept."""
    if small is None or large is None or len(small) != len(large):
        return None
    result = []
    for a, b in zip(small, large):
        if a == b:
            result.append(a)
        elif a % batch == 0 and a // batch > 1:
            result.append(a // batch)
    return tuple(result)


def _first_tensor(value: Any) -> torch.Tensor | None:
    flat, _ = tree_flatten(value)
    return next((v for v in flat if isinstance(v, torch.Tensor)), None)


def _unsupported(exc: BaseException, where: str) -> InputError:
    text = _one_line(exc)
    lowered = text.lower()
    place = f" (in module {where})" if where and where != "Global" else ""
    if "meta" in lowered and any(word in lowered for word in (
            "item", "data-dependent", "data dependent", "copy out", "nonzero", "bool value",
            "cannot be called on meta", "value of a meta")):
        return InputError("torch", f"data-dependent Python control flow or value access is not "
                          f"supported{place}: the model is traced on the meta device, where "
                          f"tensors have shapes but no values ({text})")
    if "meta" in lowered and ("could not run" in lowered or "not implemented" in lowered):
        return InputError("torch", f"an operator has no meta-device implementation{place}; "
                          f"it cannot be traced without real memory ({text})")
    return InputError("torch", f"tracing the model failed{place}: {type(exc).__name__}: {text}")


def _trace(model: nn.Module, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
           shapes: list[tuple[int, ...]], dtypes: list[torch.dtype], batch: int,
           loss: str | None, names: dict[str, str]) -> _Trace:
    """Run one training step at `batch` on the meta device and count it per module."""
    try:
        inputs = [torch.empty((batch, *shape), dtype=dtype, device="meta")
                  for shape, dtype in zip(shapes, dtypes)]
    except RuntimeError as exc:  # a storage size past 64 bits
        raise InputError("input_shape", f"no tensor of batch {batch} has these shapes: "
                         f"{_one_line(exc)}") from None
    calls: dict[int, int] = {}
    in_shapes: dict[int, tuple[int, ...] | None] = {}
    out_shapes: dict[int, tuple[int, ...] | None] = {}
    modules: dict[int, nn.Module] = {}

    def pre_hook(mod: nn.Module, args: Any) -> None:
        key = id(mod)
        modules[key] = mod
        calls[key] = calls.get(key, 0) + 1
        tensor = _first_tensor(args)
        in_shapes.setdefault(key, None if tensor is None else tuple(tensor.shape))

    def post_hook(mod: nn.Module, args: Any, output: Any) -> None:
        tensor = _first_tensor(output)
        out_shapes[id(mod)] = None if tensor is None else tuple(tensor.shape)

    loss_module = nn.CrossEntropyLoss() if loss == "cross_entropy" else None
    pre = nn.modules.module.register_module_forward_pre_hook(pre_hook)
    post = nn.modules.module.register_module_forward_hook(post_hook)
    tracker = ModuleTracker()
    mode = CountingMode(tracker)
    recorder = AttentionRecorder(mode.current_module)
    try:
        with tracker, mode:
            try:
                with recorder:
                    output = torch.func.functional_call(model, {**params, **buffers},
                                                        tuple(inputs))
                if loss_module is not None:
                    logits = _first_tensor(output)
                    if logits is None or not logits.is_floating_point():
                        raise InputError("loss", "the model returned no floating-point logits")
                    flat = logits.reshape(-1, logits.shape[-1])
                    target = torch.empty(flat.shape[0], dtype=torch.int64, device="meta")
                    output = loss_module(flat, target)
            except InputError:
                raise
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's model failed
                raise _unsupported(exc, mode.current_module()) from None
            mode.active = False  # the seed for backward is not part of the model
            flat_out, _ = tree_flatten(output)
            seeds = [t.float().sum() for t in flat_out
                     if isinstance(t, torch.Tensor) and t.requires_grad]
            if not seeds:
                raise InputError("torch", "no model output requires grad: nothing to train")
            seed = torch.stack(seeds).sum()
            mode.active = True
            try:
                seed.backward()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - e.g. a custom backward
                raise _unsupported(exc, mode.current_module()) from None
            mode.classify_weight_gradients(params.values())
    finally:
        pre.remove()
        post.remove()
        for tensor in params.values():
            tensor.grad = None

    tracker_names = dict(names)
    if loss_module is not None:
        tracker_names[type(loss_module).__name__] = "loss"
    counts: dict[str, _ModuleCounts] = {}
    for index, record in enumerate(mode.records):
        name = tracker_names.get(record.module, OUTSIDE)
        if name not in counts and record.backward:
            name = OUTSIDE  # backward of a module with no forward op: keep it counted
        entry = counts.get(name)
        if entry is None:
            entry = counts[name] = _ModuleCounts(order=len(counts))
        if not record.backward:
            first = record.output_shapes[0] if record.output_shapes else None
            entry.forward_ops.append((index, first))
            if first is not None:
                entry.last_output = first
        for phase, (flops, moved) in record.phase_costs().items():
            entry.flops[phase] += flops
            entry.bytes[phase] += moved
    mode.release()

    by_name: dict[str, nn.Module] = {}
    module_names = {id(m): n for n, m in model.named_modules()}
    if loss_module is not None:
        module_names[id(loss_module)] = "loss"
    for key, mod in modules.items():
        fqn = module_names.get(key)
        if fqn is not None:
            by_name["(root)" if fqn == "" else fqn] = mod
    root_label = tracker_names.get(type(model).__name__, "(root)")

    def label(fqn: str) -> str:
        return root_label if fqn == "(root)" else fqn

    attention: dict[str, list[AttentionCall]] = {}
    for call in recorder.calls:
        attention.setdefault(tracker_names.get(call.module, OUTSIDE), []).append(call)
    return _Trace(batch=batch, counts=counts,
                  calls={label(n): calls[id(m)] for n, m in by_name.items()},
                  input_shapes={label(n): in_shapes.get(id(m)) for n, m in by_name.items()},
                  output_shapes={label(n): out_shapes.get(id(m)) for n, m in by_name.items()},
                  attention=attention)


def _tracker_names(model: nn.Module) -> dict[str, str]:
    """ModuleTracker's names (root class name + '.' + qualified name) -> layer names."""
    root = type(model).__name__
    names = {root: root}
    for fqn, _ in model.named_modules(remove_duplicate=False):
        if fqn:
            names[f"{root}.{fqn}"] = fqn
    return names


def memory_layout(model: nn.Module) -> str:
    """The layout `model` keeps its convolutions' activations in: 'nhwc' where a Conv2d's
    weight is in channels_last and not plain contiguous (``model.to(memory_format=
    torch.channels_last)``; convolutions then return channels_last outputs), else PyTorch's
    default, 'nchw'. A 1x1 filter is both, so it alone decides nothing."""
    for mod in model.modules():
        weight = getattr(mod, "weight", None)
        if (isinstance(mod, nn.Conv2d) and isinstance(weight, torch.Tensor) and weight.dim() == 4
                and weight.is_contiguous(memory_format=torch.channels_last)
                and not weight.is_contiguous()):
            return "nhwc"
    return "nchw"


def _zoo_spec(mod: nn.Module, kind_input: tuple[int, ...],
              layout: str = "nchw") -> tuple[str, dict[str, object]] | None:
    """(kind, hyper) when `mod` is exactly a zoo kind, else None; a convolution in the model's
    `layout` (`memory_layout`)."""
    kind = type(mod)
    if kind is nn.Conv2d:
        if (mod.dilation != (1, 1) or isinstance(mod.padding, str)
                or mod.padding_mode != "zeros"):
            return None
        return "conv2d", {"out_channels": mod.out_channels, "kernel": list(mod.kernel_size),
                          "stride": list(mod.stride), "padding": list(mod.padding),
                          "groups": mod.groups, "bias": mod.bias is not None,
                          "layout": layout}
    if kind is nn.Linear:
        return "linear", {"out_features": mod.out_features, "bias": mod.bias is not None}
    if kind is nn.ReLU:
        return "relu", {}
    if kind in (nn.MaxPool2d, nn.AvgPool2d):
        if mod.ceil_mode or (kind is nn.MaxPool2d and (mod.dilation not in (1, (1, 1))
                                                       or mod.return_indices)):
            return None
        if kind is nn.AvgPool2d and mod.divisor_override is not None:
            return None
        stride = mod.stride if mod.stride is not None else mod.kernel_size
        as_list = (lambda v: list(v) if isinstance(v, (tuple, list)) else v)
        return ("maxpool2d" if kind is nn.MaxPool2d else "avgpool2d",
                {"kernel": as_list(mod.kernel_size), "stride": as_list(stride),
                 "padding": as_list(mod.padding)})
    if kind is nn.Flatten:
        if mod.start_dim != 1 or mod.end_dim != -1 or len(kind_input) < 1:
            return None
        return "flatten", {}
    if kind is nn.CrossEntropyLoss and len(kind_input) == 1:
        return "softmax_loss", {}
    return None


def _layer_params(model: nn.Module, layer_names: list[str], root_label: str) -> dict[str, int]:
    """Parameters per layer: each unique parameter goes to the nearest enclosing layer."""
    result = dict.fromkeys(layer_names, 0)
    for fqn, param in model.named_parameters():  # shared parameters are listed once
        path = fqn.rsplit(".", 1)[0] if "." in fqn else ""
        owner = None
        while True:
            label = path if path else root_label
            if label in result:
                owner = label
                break
            if not path:
                break
            path = path.rsplit(".", 1)[0] if "." in path else ""
        result[owner if owner is not None else layer_names[0]] += param.numel()
    return result


@_stdout_to_stderr
def from_torch(module: nn.Module | Callable[[], nn.Module],
               example_input_shapes: Sequence[int] | Sequence[Sequence[int]],
               name: str | None = None, samples_per_epoch: int = 1_000_000,
               input_dtypes: Any = None, loss: str | None = None,
               flash_attention: bool = False) -> Workload:
    """Import a PyTorch model (or a zero-argument factory of one) as a `Workload`.

    `example_input_shapes`: the shape of one sample of the model's input, without the batch
    (``(3, 224, 224)``), or a list of such shapes for a model with several inputs.
    `input_dtypes`: one dtype (or name) per input, default the default float dtype; token ids
    need ``"int64"``. `loss`: None (backward from the sum of the outputs) or
    ``"cross_entropy"`` (adds a loss layer over the last dim of the first output).
    `flash_attention`: attention found in the model (``nn.MultiheadAttention``,
    ``F.scaled_dot_product_attention``) becomes one fused `flash_attention` layer instead of
    scores + softmax + context (see workload/torch_transformer.py).
    A factory is called under ``torch.device("meta")``; a module whose parameters live
    elsewhere is traced with meta copies of them, and is left unchanged.
    """
    shapes = _normalise_shapes(example_input_shapes)
    dtypes = _normalise_dtypes(input_dtypes, len(shapes))
    if loss is not None and loss not in _LOSSES:
        raise InputError("loss", f"unknown loss {loss!r} (known: {', '.join(_LOSSES)})")
    if isinstance(samples_per_epoch, bool) or not isinstance(samples_per_epoch, int) \
            or samples_per_epoch < 1:
        raise InputError("samples_per_epoch", f"must be an integer >= 1, got "
                         f"{samples_per_epoch!r}")
    model, own = _meta_model(module)
    copies: dict[int, torch.Tensor] = {}  # one meta copy per tensor, so ties stay tied

    def meta(tensor: torch.Tensor, grad: bool) -> torch.Tensor:
        if tensor.device.type == "meta":
            return tensor
        if id(tensor) not in copies:
            copy = torch.empty_like(tensor, device="meta")
            copies[id(tensor)] = copy.requires_grad_(tensor.requires_grad) if grad else copy
        return copies[id(tensor)]

    params = {n: meta(p, True) for n, p in model.named_parameters(remove_duplicate=False)}
    buffers = {n: meta(b, False) for n, b in model.named_buffers(remove_duplicate=False)}
    if own and all(p.device.type == "meta" for p in model.parameters()):
        saved_grads = {n: p.grad for n, p in params.items()}
    else:
        saved_grads = {}
    modes = {m: m.training for m in model.modules()}
    model.train()
    names = _tracker_names(model)
    try:
        traces = [_trace(model, params, buffers, shapes, dtypes, batch, loss, names)
                  for batch in TRACE_BATCHES]
    finally:
        for mod, training in modes.items():
            mod.training = training
        for n, grad in saved_grads.items():
            params[n].grad = grad
    return _build_workload(model, traces, shapes, dtypes, name, samples_per_epoch,
                           flash_attention)


def _layer_order(small: _Trace, large: _Trace) -> list[str]:
    """Layer names in the order of each module's first forward op whose output grows with the
    batch (its first op when none does). So a root that first builds per-step values (the
    positions of ``arange(T)``) comes after the token embedding it adds them to."""

    def key(name: str) -> tuple[int, int]:
        ops_small, ops_large = small.counts[name].forward_ops, large.counts[name].forward_ops
        for (index, a), (_, b) in zip(ops_small, ops_large):
            if a != b:
                return index, 0
        if ops_small:
            return ops_small[0][0], 0
        return 1 << 62, small.counts[name].order  # only backward ops: after every forward op

    return sorted(small.counts, key=key)


def _build_chain(specs: list[LayerSpec], chain_shape: tuple[int, ...], bytes_per_value: int,
                 seen_weights: bool, field_name: str) -> list[Layer] | None:
    """Build `specs` in a chain from `chain_shape`; None when a kind rejects its input."""
    layers: list[Layer] = []
    for layer_name, kind, hyper in specs:
        try:
            layer = build_layer(kind, layer_name, chain_shape, bytes_per_value, seen_weights,
                                hyper, field_name)
        except InputError:
            return None
        layers.append(layer)
        seen_weights = seen_weights or layer.has_weights
        chain_shape = layer.output_shape
    return layers


def _flops_agree(layers: list[Layer], flops: dict[str, float]) -> bool:
    counted = (flops["fwd"], flops["input_grad"], flops["weight_grad"])
    analytical = (sum(layer.fwd_flops for layer in layers),
                  sum(layer.input_grad_flops for layer in layers),
                  sum(layer.weight_grad_flops for layer in layers))
    return all(math.isclose(a, b, rel_tol=_FLOP_RTOL, abs_tol=1e-6)
               for a, b in zip(counted, analytical))


def _build_workload(model: nn.Module, traces: list[_Trace], shapes: list[tuple[int, ...]],
                    dtypes: list[torch.dtype], name: str | None,
                    samples_per_epoch: int, flash_attention: bool = False) -> Workload:
    small, large = traces
    for trace in traces:  # what runs outside modules is usually per step (AccumulateGrad)
        trace.counts.setdefault(OUTSIDE, _ModuleCounts(order=len(trace.counts)))
    first_ops = sorted(small.counts, key=lambda n: small.counts[n].order)
    if first_ops != sorted(large.counts, key=lambda n: large.counts[n].order):
        raise InputError("torch", "the model runs different modules at different batch sizes; "
                         "batch-dependent control flow is not supported")
    order = _layer_order(small, large)
    step = large.batch - small.batch
    layout = memory_layout(model)

    def per_sample(layer: str, table: str, phase: str) -> float:
        a = getattr(small.counts[layer], table)[phase]
        b = getattr(large.counts[layer], table)[phase]
        return max(0.0, (b - a) / step)

    if not any(per_sample(OUTSIDE, table, phase) for table in ("flops", "bytes")
               for phase in PHASES):
        order.remove(OUTSIDE)
    if not order:
        raise InputError("torch", "the model ran no operators")

    floats = [p for p in model.parameters() if p.is_floating_point()]
    bytes_per_value = floats[0].element_size() if floats else 4
    root_label = type(model).__name__
    params = _layer_params(model, order, root_label)
    named = dict(model.named_modules())
    chain_shape = shapes[0]
    seen_weights = False
    layers: list[Layer] = []
    for layer_name in order:
        flops = {p: per_sample(layer_name, "flops", p) for p in PHASES}
        moved = {p: per_sample(layer_name, "bytes", p) for p in PHASES}
        mod = named.get(layer_name) if layer_name != root_label else model
        if mod is not None and next(mod.children(), None) is None:  # a leaf: its output
            out_shape = _sample_shape(small.output_shapes.get(layer_name),
                                      large.output_shapes.get(layer_name), small.batch)
        else:  # glue ops of a container (a residual add): what its last op produced
            out_shape = _sample_shape(small.counts[layer_name].last_output,
                                      large.counts[layer_name].last_output, small.batch)
        in_shape = _sample_shape(small.input_shapes.get(layer_name),
                                 large.input_shapes.get(layer_name), small.batch)
        if out_shape is None:
            out_shape = chain_shape
        field_name = f"torch.{layer_name}"
        if layer_name == "loss":
            mod = nn.CrossEntropyLoss()
        once = mod is not None and small.calls.get(layer_name, 1) == 1
        if once and layers and layers[-1].kind == "embedding" and not any(flops.values()):
            rows = position_table(mod, layers[-1].hyper, small.input_shapes.get(layer_name)
                                  == large.input_shapes.get(layer_name)
                                  and small.output_shapes.get(layer_name)
                                  == large.output_shapes.get(layer_name))
            merged = None if rows is None else _build_chain(
                [(layers[-1].name, "embedding",
                  {**layers[-1].hyper, "positional": "learned", "positions": rows})],
                layers[-1].input_shape, bytes_per_value, False, field_name)
            if merged is not None and merged[0].params == layers[-1].params + params[layer_name]:
                layers[-1] = merged[0]  # a learned position table: folded into the embedding
                continue
        candidates = None
        if once:
            zoo = _zoo_spec(mod, chain_shape, layout) if in_shape == chain_shape else None
            specs = ([(layer_name, zoo[0], zoo[1])] if zoo is not None else transformer_specs(
                mod, layer_name, chain_shape, in_shape, small.attention.get(layer_name, []),
                flash_attention))
            if specs:
                candidates = _build_chain(specs, chain_shape, bytes_per_value, seen_weights,
                                          field_name)
        if candidates is not None:
            last = candidates[-1]
            fits = (last.kind in ("softmax_loss", "cross_entropy")
                    or last.output_shape == tuple(out_shape))
            if not (fits and sum(c.params for c in candidates) == params[layer_name]
                    and _flops_agree(_as_counted(candidates, specs, chain_shape,
                                                 bytes_per_value, seen_weights, field_name),
                                     flops)):
                candidates = None
        if candidates is None:
            hyper = {"output_shape": list(out_shape), "params": params[layer_name],
                     "fwd_flops": flops["fwd"], "input_grad_flops": flops["input_grad"],
                     "weight_grad_flops": flops["weight_grad"], "fwd_bytes": moved["fwd"],
                     "input_grad_bytes": moved["input_grad"],
                     "weight_grad_bytes": moved["weight_grad"]}
            candidates = [build_layer("generic", layer_name, chain_shape, bytes_per_value,
                                      seen_weights, hyper, field_name)]
        for layer in candidates:
            layers.append(layer)
            seen_weights = seen_weights or layer.has_weights
            chain_shape = layer.output_shape
    return check_workload(Workload(name=name or type(model).__name__, input_shape=shapes[0],
                    layers=tuple(layers), samples_per_epoch=samples_per_epoch,
                    bytes_per_value=bytes_per_value,
                    description=f"imported from PyTorch {type(model).__name__} with input "
                                f"shapes {[list(s) for s in shapes]} "
                                f"({', '.join(str(d).removeprefix('torch.') for d in dtypes)})"))


def _as_counted(candidates: list[Layer], specs: list[LayerSpec], chain_shape: tuple[int, ...],
                bytes_per_value: int, seen_weights: bool, field_name: str) -> list[Layer]:
    """The layers whose FLOPs the trace counted: a flash_attention layer stands for the
    unfused scores + softmax + context that the meta device runs (see torch_transformer.py)."""
    if not any(layer.kind == "flash_attention" for layer in candidates):
        return candidates
    unfused: list[LayerSpec] = []
    for layer_name, kind, hyper in specs:
        if kind != "flash_attention":
            unfused.append((layer_name, kind, hyper))
            continue
        shape = {k: hyper[k] for k in ("hidden", "heads", "kv_heads", "seq")}
        unfused += [(f"{layer_name}.scores", "attn_scores", shape),
                    (f"{layer_name}.softmax", "attn_softmax", shape),
                    (f"{layer_name}.context", "attn_context", shape)]
    return _build_chain(unfused, chain_shape, bytes_per_value, seen_weights, field_name) or []
