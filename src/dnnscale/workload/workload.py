"""A workload: an ordered list of layers, the sample shape, and the size of an epoch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dnnscale.errors import InputError, require_int
from dnnscale.workload import transformer_kinds  # noqa: F401  (registers the transformer kinds)
from dnnscale.workload.kinds import build_layer
from dnnscale.workload.layer import Layer
from dnnscale.workload.transformer_shape import TransformerShape


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
        """Values kept for backward per sample: the input plus every layer's output."""
        from math import prod

        return prod(self.input_shape) + sum(layer.activation_values for layer in self.layers)

    def totals(self) -> dict[str, float]:
        return {"params": self.params, "fwd_flops": self.fwd_flops, "fwd_macs": self.fwd_macs,
                "input_grad_flops": self.input_grad_flops,
                "weight_grad_flops": self.weight_grad_flops}


def build_workload(name: str, input_shape: Sequence[int], layer_specs: Sequence[Mapping[str, object]],
                   samples_per_epoch: int, bytes_per_value: int = 4,
                   description: str = "", transformer: TransformerShape | None = None) -> Workload:
    """Infer every layer's shapes and costs from the input shape and the layer specs.

    Each spec is a mapping with `kind`, an optional `name`, and the kind's hyper-parameters
    (e.g. ``{"kind": "conv2d", "out_channels": 64, "kernel": 5, "padding": 2}``).
    """
    if not isinstance(input_shape, (list, tuple)) or not input_shape or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in input_shape):
        raise InputError("workload.input_shape", f"must be a list of positive integers, got "
                         f"{input_shape!r}")
    require_int("workload.samples_per_epoch", samples_per_epoch)
    if bytes_per_value not in (1, 2, 4, 8):
        raise InputError("workload.bytes_per_value", f"must be 1, 2, 4 or 8, got {bytes_per_value!r}")
    if not layer_specs:
        raise InputError("workload.layers", "must list at least one layer")
    layers: list[Layer] = []
    shape = tuple(input_shape)
    seen_weights = False
    used_names: set[str] = set()
    for index, spec in enumerate(layer_specs):
        field = f"workload.layers[{index}]"
        if not isinstance(spec, Mapping) or "kind" not in spec:
            raise InputError(field, f"each layer needs a 'kind', got {spec!r}")
        hyper = {k: v for k, v in spec.items() if k not in ("kind", "name")}
        kind = str(spec["kind"])
        layer_name = str(spec.get("name") or f"{kind}{index + 1}")
        if layer_name in used_names:
            raise InputError(f"{field}.name", f"duplicate layer name {layer_name!r}")
        used_names.add(layer_name)
        layer = build_layer(kind, layer_name, shape, bytes_per_value, seen_weights, hyper, field)
        seen_weights = seen_weights or layer.has_weights
        layers.append(layer)
        shape = layer.output_shape
    return Workload(name=name, input_shape=tuple(input_shape), layers=tuple(layers),
                    samples_per_epoch=samples_per_epoch, bytes_per_value=bytes_per_value,
                    description=description, transformer=transformer)
