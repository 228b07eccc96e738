"""A workload: an ordered list of layers, the sample shape, and the size of an epoch."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.workload import transformer_kinds  # noqa: F401  (registers the transformer kinds)
from dnnscale.workload import moe_kinds  # noqa: F401  (registers the mixture-of-experts kinds)
from dnnscale.workload.kinds import build_layer, check_layer, check_shape
from dnnscale.workload.layer import Layer
from dnnscale.workload.transformer_shape import TransformerShape

HALF = ("half", 0)
"""Workload.amp of a workload whose every layer is built at its own width."""
MAX_LAYERS = 10_000
"""The most layers a workload may have (a 100-block transformer imported op by op has ~2,000).
At 10,000 layers predict takes under a second and optimize about 20 s on a 2-core machine."""


@dataclass(frozen=True)
class Workload:
    """What is trained: layers in order (a chain), per-sample shapes, samples per epoch."""

    name: str
    input_shape: tuple[int, ...]
    layers: tuple[Layer, ...]
    samples_per_epoch: int
    bytes_per_value: int = 4
    description: str = ""
    # The shape summary of a transformer workload (None for CNNs, MLPs and imported models).
    transformer: TransformerShape | None = None
    amp: tuple[str, int] = HALF
    """The mixed-precision mode and activation width its layers are priced at (`with_amp`;
    HALF: every layer at bytes_per_value)."""

    @functools.cached_property
    def outside_block_indices(self) -> tuple[int, ...]:
        """The indices of the layers outside the transformer blocks (no integer `block` in
        their hyper-parameters: embeddings, the final norm, the output layer and loss), once
        per workload (the search asks for them at every stage template)."""
        return tuple(i for i, layer in enumerate(self.layers)
                     if not isinstance(layer.hyper.get("block"), int))

    @functools.cached_property
    def _loss_variants(self) -> dict[str, "Workload"]:
        """`with_loss`'s workloads, one per loss kernel asked for."""
        return {}

    def with_loss(self, loss: str) -> "Workload":
        """This workload with its `cross_entropy` layers computed by the `loss` kernel
        (transformer_kinds.LOSS_KERNELS; their traffic): itself where they already are, or
        where it has none; built once per kernel. A plan's `loss` prices its step on it."""
        known = self._loss_variants.get(loss)
        if known is None:
            layers = tuple(_with_loss(layer, loss, self.bytes_per_value)
                           for layer in self.layers)
            same = all(new is old for new, old in zip(layers, self.layers))
            known = self if same else replace(self, layers=layers)
            self._loss_variants[loss] = known
        return known

    @functools.cached_property
    def _amp_variants(self) -> dict[tuple[str, int], "Workload"]:
        """`with_amp`'s workloads, one per (mode, activation width) asked for."""
        return {}

    def with_amp(self, amp: str, activation_bytes: int) -> "Workload":
        """This workload with the kinds `amp` runs on float32 values
        (transformer_kinds.AMP_FP32_KINDS) rebuilt at 4 bytes a value, for a plan whose
        activations are `activation_bytes` wide (the model scales every layer's traffic by
        activation_bytes / bytes_per_value, model/predict.plan_stage_costs, so they are built
        at 4 · bytes_per_value / activation_bytes), and the kinds an earlier mode widened
        rebuilt at its own width; itself where it is priced so already ('half', 4-byte
        activations and a workload with none of those kinds are all priced as 'half'). A
        plan's `amp` prices its step on it; built once per (mode, width)."""
        wide = transformer_kinds.AMP_FP32_KINDS[amp]
        key = ((amp, activation_bytes) if wide and activation_bytes < transformer_kinds.FP32_BYTES
               else HALF)
        if key == self.amp:
            return self
        known = self._amp_variants.get(key)
        if known is None:
            wide = transformer_kinds.AMP_FP32_KINDS[key[0]]
            touched = wide | transformer_kinds.AMP_FP32_KINDS[self.amp[0]]
            width = (transformer_kinds.FP32_BYTES * self.bytes_per_value // activation_bytes
                     if wide else self.bytes_per_value)
            layers = tuple(
                _rebuilt(layer, width if layer.kind in wide else self.bytes_per_value)
                if layer.kind in touched else layer for layer in self.layers)
            known = replace(self, layers=layers, amp=key)
            self._amp_variants[key] = known
        return known

    def as_run(self, loss: str, amp: str, activation_bytes: int) -> "Workload":
        """This workload as a plan runs it: its loss layers computed by the `loss` kernel
        (`with_loss`) and the kinds the mixed-precision mode `amp` runs in float32 at 4 bytes a
        value for `activation_bytes`-wide activations (`with_amp`). predict and the search
        both price on it."""
        return self.with_loss(loss).with_amp(amp, activation_bytes)

    @property
    def params(self) -> int:
        """W: parameters (weights + biases) of the whole model."""
        return sum(layer.params for layer in self.layers)

    @property
    def fwd_flops(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @property
    def fwd_macs(self) -> float:
        """Forward multiply-adds per sample: Project Adam's 'connections'."""
        return self.fwd_flops / 2

    @property
    def input_grad_flops(self) -> float:
        return sum(layer.input_grad_flops for layer in self.layers)

    @property
    def weight_grad_flops(self) -> float:
        return sum(layer.weight_grad_flops for layer in self.layers)

    @property
    def activation_values(self) -> int:
        """Values kept for backward per sample: the input plus every layer's own output buffer
        (Layer.kept_values: 0 for a layer run in place)."""
        from math import prod

        return prod(self.input_shape) + sum(layer.kept_values for layer in self.layers)

    def totals(self) -> dict[str, float]:
        return {"params": self.params, "fwd_flops": self.fwd_flops, "fwd_macs": self.fwd_macs,
                "input_grad_flops": self.input_grad_flops,
                "weight_grad_flops": self.weight_grad_flops}


def _with_loss(layer: Layer, loss: str, bytes_per_value: int) -> Layer:
    """`layer` rebuilt with the `loss` kernel if it is a `cross_entropy` layer computed by
    another (its hyper-parameters as built, the kernel replaced), else `layer` itself."""
    if layer.kind != "cross_entropy" or layer.hyper.get("loss", "inplace") == loss:
        return layer
    return _rebuilt(layer, bytes_per_value, {**layer.hyper, "loss": loss})


def _rebuilt(layer: Layer, bytes_per_value: int,
             hyper: Mapping[str, object] | None = None) -> Layer:
    """`layer` rebuilt at `bytes_per_value` bytes a value with `hyper` (default: its
    hyper-parameters as built)."""
    return build_layer(layer.kind, layer.name, layer.input_shape, bytes_per_value,
                       layer.input_grad_bytes > 0, dict(layer.hyper if hyper is None else hyper),
                       f"layers.{layer.name}")


def build_workload(name: str, input_shape: Sequence[int], layer_specs: Sequence[Mapping[str, object]],
                   samples_per_epoch: int, bytes_per_value: int = 4,
                   description: str = "", transformer: TransformerShape | None = None) -> Workload:
    """Infer every layer's shapes and costs from the input shape and the layer specs.

    Each spec is a mapping with `kind`, an optional `name`, and the kind's hyper-parameters
    (e.g. ``{"kind": "conv2d", "out_channels": 64, "kernel": 5, "padding": 2}``).
    """
    _check_top(input_shape, samples_per_epoch, bytes_per_value, layer_specs)
    layers: list[Layer] = []
    shape = tuple(input_shape)
    seen_weights = False
    used_names: set[str] = set()
    for index, spec in enumerate(layer_specs):
        field = f"workload.layers[{index}]"
        if not isinstance(spec, Mapping) or "kind" not in spec:
            raise InputError(field, f"each layer needs a 'kind', got {short_repr(spec)}")
        hyper = {k: v for k, v in spec.items() if k not in ("kind", "name")}
        kind = str(spec["kind"])
        layer_name = str(spec.get("name") or f"{kind}{index + 1}")
        if layer_name in used_names:
            raise InputError(f"{field}.name", f"duplicate layer name {short_repr(layer_name)}")
        used_names.add(layer_name)
        layer = build_layer(kind, layer_name, shape, bytes_per_value, seen_weights, hyper, field)
        seen_weights = seen_weights or layer.has_weights
        layers.append(layer)
        shape = layer.output_shape
    _check_work(layers)
    return Workload(name=name, input_shape=tuple(input_shape), layers=tuple(layers),
                    samples_per_epoch=samples_per_epoch, bytes_per_value=bytes_per_value,
                    description=description, transformer=transformer)


def _check_work(layers: Sequence[Layer]) -> None:
    """A step must cost something: some layer computes or moves data (else a step takes no
    time and the throughput is infinite)."""
    if not any(layer.train_flops > 0 or layer.fwd_bytes + layer.input_grad_bytes
               + layer.weight_grad_bytes > 0 for layer in layers):
        raise InputError("workload.layers", "no layer computes or moves any data (e.g. only "
                         "flatten layers): a step would take no time")


def _check_top(input_shape: object, samples_per_epoch: object, bytes_per_value: object,
               layers: object) -> None:
    """The workload-wide fields: a per-sample shape, a sample count, a value size, 1 to
    MAX_LAYERS layers."""
    check_shape(input_shape, "workload.input_shape")
    require_int("workload.samples_per_epoch", samples_per_epoch)
    if isinstance(bytes_per_value, bool) or bytes_per_value not in (1, 2, 4, 8):
        raise InputError("workload.bytes_per_value", f"must be 1, 2, 4 or 8, got "
                         f"{short_repr(bytes_per_value)}")
    if not isinstance(layers, (list, tuple)) or not layers:
        raise InputError("workload.layers", "must list at least one layer")
    if len(layers) > MAX_LAYERS:
        raise InputError("workload.layers", f"{len(layers):,} layers; the limit is "
                         f"{MAX_LAYERS:,}")


def check_workload(workload: object) -> Workload:
    """Re-validate a Workload object (e.g. one a Python caller built or changed) by the rules
    YAML workloads obey: the workload-wide fields, every layer's physical sanity, and shapes
    that chain (each layer's input is the previous layer's output). Returns the workload."""
    if not isinstance(workload, Workload):
        raise InputError("workload", f"must be a Workload, got {type(workload).__name__}")
    _check_top(workload.input_shape, workload.samples_per_epoch, workload.bytes_per_value,
               workload.layers)
    shape = tuple(workload.input_shape)
    for index, layer in enumerate(workload.layers):
        field = f"workload.layers[{index}]"
        if not isinstance(layer, Layer):
            raise InputError(field, f"must be a Layer, got {type(layer).__name__}")
        check_layer(layer, field)
        if tuple(layer.input_shape) != shape:
            raise InputError(f"{field}.input_shape", f"{list(layer.input_shape)} does not "
                             f"follow the previous output {list(shape)}")
        shape = tuple(layer.output_shape)
    _check_work(workload.layers)
    _check_transformer(workload)
    return workload


def _check_transformer(workload: Workload) -> None:
    """A transformer's shape summary is a TransformerShape whose layer count is the number of
    blocks its layers hold (the pipeline rules divide that count)."""
    summary = workload.transformer
    if summary is None:
        return
    if not isinstance(summary, TransformerShape):
        raise InputError("workload.transformer", f"must be a TransformerShape or None, got "
                         f"{short_repr(summary)}")
    blocks = {layer.hyper.get("block") for layer in workload.layers} - {None}
    if blocks and len(blocks) != summary.layers:
        raise InputError("workload.transformer.layers", f"{summary.layers} but the workload's "
                         f"layers hold {len(blocks)} blocks")
