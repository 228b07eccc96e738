"""How far a layer can be split: its split schemes and the units each divides (layer facts).

These are facts of the layer, not prices: the plan's validity rules (plan/rules.py), the sharding
rules (model/sharding.py) and the runtime (runtime/netplan.py) all read them from here.

Project Adam's rules ('adam', performance-model.md §2): conv2d (any 3-D output) splits by output
channels or output rows (horizontal stripes), every 1-D layer by output features. Megatron's
rules ('megatron') have one 'tensor' split whose unit is the attention heads, the key/value
heads (query groups) or the MLP width (Shoeybi et al. 2019).
"""

from __future__ import annotations

from collections.abc import Mapping

from dnnscale.workload.kind_record import KindFacts
from dnnscale.workload.layer import Layer

UNLIMITED_EXTENT = 1 << 30
"""The extent of a layer with no unit of split (norms, the vocabulary-padded embedding): it does
not limit the tensor-parallel degree."""

TENSOR_EXTENT_KEY: Mapping[str, str] = KindFacts[str]("tensor_extent_key")
"""Megatron's unit of split per kind (query groups for the QKV projection), read from each
kind's record (workload/kind_record.py): kinds without one are absent."""


def split_schemes(layer: Layer, rules: str = "adam") -> tuple[str, ...]:
    """Ways a layer's neurons may be divided: under Adam's rules conv2d (any 3-D output) by
    output channels or rows, every 1-D layer by features; under Megatron's one 'tensor' split."""
    if rules == "megatron":
        return ("tensor",)
    if len(layer.output_shape) == 3:
        return ("channels", "rows")
    return ("features",)


def split_extent(layer: Layer, scheme: str) -> int:
    """How many units `scheme` divides among the members: output features, channels or rows;
    for Megatron's 'tensor' split heads, query groups or the MLP width (layers without such a
    unit — norms, the vocabulary-padded embedding — do not limit the degree: UNLIMITED_EXTENT)."""
    if scheme == "tensor":
        key = TENSOR_EXTENT_KEY.get(layer.kind)
        value = layer.hyper.get(key) if key else None
        return int(value) if isinstance(value, int) else UNLIMITED_EXTENT
    return layer.split_extent(scheme)


def max_split(layer: Layer, rules: str = "adam") -> int:
    """The widest split any of the layer's schemes allows (at least one unit per member)."""
    return max(split_extent(layer, scheme) for scheme in split_schemes(layer, rules))
