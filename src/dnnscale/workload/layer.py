"""The per-layer record every stage of dnnscale reads.

A `Layer` holds one layer's shapes (per sample, without the batch dimension), its parameter
count, its FLOPs per sample for each training phase, the bytes it moves per sample in each phase,
and the facts that model partitioning needs (kernel, stride, channels, features).

FLOPs follow the convention of torch.utils.flop_counter: one multiply-add is 2 FLOP; bias adds,
activations, pooling and softmax count 0 FLOP (they are memory bound and costed by bytes).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field


COST_HYPER_KEYS = ("hidden", "seq", "heads", "kv_heads", "ffn", "vocab", "attention_kernel",
                   "experts", "top_k", "capacity_factor", "memory", "relative", "layout",
                   "predictions", "inplace", "bias", "projections")
"""Hyper-parameters (besides shapes and counts) that cost rules read."""


def _hashable(value: object) -> object:
    """A hyper value as a key part: lists (a layer's `projections`) as tuples."""
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True)
class Layer:
    """One layer of a workload; all counts are per sample."""

    name: str
    kind: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    params: int
    fwd_flops: float
    input_grad_flops: float
    weight_grad_flops: float
    fwd_bytes: float
    input_grad_bytes: float
    weight_grad_bytes: float
    # Facts for partitioning; None where they do not apply.
    in_channels: int | None = None
    out_channels: int | None = None
    kernel: tuple[int, int] | None = None
    stride: tuple[int, int] | None = None
    padding: tuple[int, int] | None = None
    groups: int = 1
    in_features: int | None = None
    out_features: int | None = None
    hyper: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    def relabelled(self, name: str, hyper: dict[str, object]) -> "Layer":
        """This layer under another name and `hyper` (same shapes and counts). A fast copy for
        repeated blocks: it skips `__init__`, so give it only what a builder made."""
        copy = object.__new__(Layer)
        copy.__dict__.update(self.__dict__, name=name, hyper=hyper)
        return copy

    @property
    def input_values(self) -> int:
        """Values in one sample's input to this layer."""
        return math.prod(self.input_shape)

    @property
    def activation_values(self) -> int:
        """Values this layer outputs per sample (A_l in performance-model.md)."""
        return math.prod(self.output_shape)

    @property
    def kept_values(self) -> int:
        """Values per sample this layer's own output takes in memory until the backward: its
        outputs, or 0 where it writes into a buffer another layer counts (`inplace` in its
        hyper-parameters: a ReLU run in place over its input, PyTorch's nn.ReLU(inplace=True),
        or a residual add into its branch's output, `out += residual`)."""
        return 0 if self.hyper.get("inplace") else self.activation_values

    @property
    def fwd_macs(self) -> float:
        """Forward multiply-adds per sample ('connections' in Project Adam's terms)."""
        return self.fwd_flops / 2

    @property
    def train_flops(self) -> float:
        """Forward + input-gradient + weight-gradient FLOPs per sample."""
        return self.fwd_flops + self.input_grad_flops + self.weight_grad_flops

    @property
    def has_weights(self) -> bool:
        return self.params > 0

    @functools.cached_property
    def cost_key(self) -> tuple[object, ...]:
        """Everything the cost of this layer depends on but its name and place: repeated
        transformer blocks share it, so a stage costs each distinct layer once."""
        return (self.kind, self.input_shape, self.output_shape, self.params, self.fwd_flops,
                self.input_grad_flops, self.weight_grad_flops, self.fwd_bytes,
                self.input_grad_bytes, self.weight_grad_bytes, self.kernel, self.stride,
                self.groups, self.in_features, self.out_features,
                tuple(_hashable(self.hyper.get(key)) for key in COST_HYPER_KEYS))

    def split_extent(self, scheme: str) -> int:
        """How many units a vertical split divides among workers under `scheme`.

        'features' splits a linear layer's outputs (or a 1-D tensor); 'channels' splits output
        channels; 'rows' splits output rows (horizontal stripes). 1 when the layer cannot be split
        that way.
        """
        shape = self.output_shape
        if scheme == "features":
            return self.out_features if self.out_features is not None else math.prod(shape)
        if scheme == "channels":
            return shape[0] if len(shape) == 3 else 1
        if scheme == "rows":
            return shape[1] if len(shape) == 3 else 1
        raise ValueError(f"unknown split scheme {scheme!r}")
