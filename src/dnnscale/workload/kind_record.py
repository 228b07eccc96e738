"""One record per layer kind: everything dnnscale knows about a kind, in one place.

A `LayerKind` holds the kind's builder (shape inference, parameters, FLOPs and bytes per phase,
workload/kinds.py and workload/transformer_kinds.py), the kernel class the accelerator model
prices its FLOPs as (model/gpu_compute.py), the CPU rate curve a calibrated CPU device keys it
by (model/compute.py), the split rule each rule set applies to it (model/sharding.py,
model/megatron_rules.py) with Megatron's unit of split, its recompute class (which
recomputation policy recomputes its forward, and so drops its stored activations:
model/stage.py, model/memory.py), and whether a parameter server may form its weight gradient
from activation and error vectors (Project Adam's FC protocol).

Every kind states every fact when it is registered (`register_kind` in workload/kinds.py); a
layer whose kind is not registered is an error (`layer_kind`), at workload load and in the model,
never priced by a default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar, cast

from dnnscale.errors import InputError, short_repr
from dnnscale.workload.layer import Layer

LayerBuilder = Callable[..., Layer]
T = TypeVar("T")


class KernelClass(Enum):
    """Which achieved-efficiency curve prices a kind's FLOPs on an accelerator; MEMORY kinds do
    no FLOPs there (their time is their bytes over the memory bandwidth)."""

    GEMM = "gemm"
    ATTENTION = "attention"
    FLASH = "flash"
    MEMORY = "memory"


class Recompute(Enum):
    """Which recomputation policy recomputes a kind's forward in the backward pass.

    ATTENTION_CORE: selective recomputation (and full, inside a block): the core of attention
    (Korthikanti et al. 2022 §5): the s²-sized chain, or the fused kernel that replaces it,
    which Megatron-Core's selective recomputation checkpoints too (megatron/core/transformer/
    attention.py: checkpoint_core_attention wraps the core attention whatever kernel runs it,
    `--recompute-modules core_attn`). BLOCK: only full recomputation, for layers inside a
    transformer block (outside blocks nothing is recomputed).
    """

    ATTENTION_CORE = "attention_core"
    BLOCK = "block"


@dataclass(frozen=True)
class LayerKind:
    """Everything known about one layer kind (module docstring).

    splits: rule set ('adam', 'megatron') -> the name of the sharding rule that splits this kind
    under it (model/sharding.py registers rules by that name). tensor_extent_key: the `hyper`
    key whose value is Megatron's unit of split (heads, query groups, MLP width), None when the
    kind has none and so does not limit the degree. cpu_rate: the FLOP-rate curve name of a
    calibrated CPU device ('default' for kinds not calibrated on their own).
    vector_gradients: a fully connected layer whose weight gradient a parameter server may form
    from the activation and error vectors (Chilimbi et al. OSDI'14 §3.3).
    fp8_gemm: a linear layer inside a transformer block, the module Transformer Engine replaces
    (te.Linear, LayerNormLinear, LayerNormMLP): under an FP8 plan its three GEMMs run in FP8
    with a cast of their inputs (model/gpu_compute.py); every other kind (attention, norms, the
    embedding and the output layer, which engines keep in higher precision) runs in bf16.
    expert: a routed expert's linear layer (workload/moe_kinds.py): its weights are the
    experts', split over the mesh's ep (experts / ep per member, their gradients reduced over
    dp · cp only), and its GEMMs run one per local expert at the tokens routed to it.
    expert_exchange: 'dispatch' or 'combine', the token exchange around the experts, an
    all-to-all over ep forward and backward (model/expert_parallel.py); None for other kinds.
    """

    name: str
    build: LayerBuilder
    kernel: KernelClass
    cpu_rate: str
    splits: Mapping[str, str]
    tensor_extent_key: str | None
    recompute: Recompute
    vector_gradients: bool = False
    fp8_gemm: bool = False
    expert: bool = False
    expert_exchange: str | None = None

    def split_rule(self, rules: str) -> str:
        """The name of the rule `rules` splits this kind by; InputError when it has none."""
        rule = self.splits.get(rules)
        if rule is None:
            raise InputError("plan.tensor.rules", f"the {short_repr(rules)} rules do not say how "
                             f"to split a {self.name} layer (they split it under: "
                             f"{', '.join(sorted(self.splits)) or 'none'})")
        return rule


LAYER_KINDS: dict[str, LayerKind] = {}
"""The registry: kind name -> its record."""


def layer_kind(kind: str, field: str = "layer.kind") -> LayerKind:
    """The record of `kind`; InputError naming `field` for a kind nobody registered."""
    record = LAYER_KINDS.get(kind)
    if record is None:
        raise InputError(field, f"unknown layer kind {short_repr(kind)} (known: "
                         f"{', '.join(sorted(LAYER_KINDS))})")
    return record


def record_of(layer: Layer) -> LayerKind:
    """The record of `layer`'s kind; the error names the layer's kind field."""
    return layer_kind(layer.kind, f"layers.{layer.name}.kind")


class KindFacts(Mapping[str, T], Generic[T]):
    """A read-only view of one fact over the registry, kind -> value, leaving out kinds whose
    value is `absent` (e.g. kernel class over the kinds that do FLOPs): for callers that look a
    fact up by kind name (calibration grids, Megatron's unit of split)."""

    def __init__(self, fact: str, absent: object = None) -> None:
        self._fact, self._absent = fact, absent

    def __getitem__(self, kind: str) -> T:
        record = LAYER_KINDS.get(kind)
        value = getattr(record, self._fact) if record is not None else self._absent
        if value == self._absent:
            raise KeyError(kind)
        return cast(T, value)

    def __iter__(self) -> Iterator[str]:
        return (name for name, record in LAYER_KINDS.items()
                if getattr(record, self._fact) != self._absent)

    def __len__(self) -> int:
        return sum(1 for _ in self)
