"""The typed summary of a transformer workload's shape (`Workload.transformer`).

A transformer workload's layers (workload/transformer_kinds.py) carry every count per layer;
this summary keeps the few numbers a block-level formula needs (for example Korthikanti et al.
2022's activation memory per block, s·b·h·(34 + 5·a·s/h)) so that the model does not re-derive
them from the layer list. Validated on construction: a bad field raises `InputError` naming
``transformer.<field>``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from dnnscale.errors import MAX_COUNT, InputError, short_repr

NORMS = ("layernorm", "rmsnorm")
POSITIONALS = ("learned", "rope", "none")
NORM_POSITIONS = ("pre", "post")


@dataclass(frozen=True)
class TransformerShape:
    """Shape of a decoder (GPT, Llama) or encoder (BERT) stack; counts per sequence.

    layers L, hidden h, heads a, kv_heads (a for multi-head attention, fewer for grouped-query
    attention), ffn f (the MLP's inner width; a gated MLP has two h x f input matrices), vocab V,
    seq s (tokens per sample). `positions` is the number of rows of a learned position table
    (0 unless `positional == "learned"`), `token_types` the rows of BERT's segment table.
    `norm_position` "pre" (GPT-2 onwards: norm before each sub-layer, a final norm) or "post"
    (BERT: norm after each residual add, a norm after the embedding, no final norm).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    gated: bool = False
    norm: str = "layernorm"
    flash_attention: bool = False
    tied_embeddings: bool = True
    causal: bool = True
    positional: str = "learned"
    positions: int = 0
    token_types: int = 0
    norm_position: str = "pre"
    bias: bool = True
    dropout: bool = True

    def __post_init__(self) -> None:
        for name in REQUIRED_FIELDS:
            _require_int(name, getattr(self, name), 1)
        for name in ("positions", "token_types"):
            _require_int(name, getattr(self, name), 0)
        for name in ("gated", "flash_attention", "tied_embeddings", "causal", "bias", "dropout"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"transformer.{name}", f"must be true or false, got "
                                 f"{getattr(self, name)!r}")
        for name, allowed in (("norm", NORMS), ("positional", POSITIONALS),
                              ("norm_position", NORM_POSITIONS)):
            if getattr(self, name) not in allowed:
                raise InputError(f"transformer.{name}", f"must be one of {', '.join(allowed)}, "
                                 f"got {getattr(self, name)!r}")
        if self.hidden % self.heads:
            raise InputError("transformer.heads", f"{self.heads} heads do not divide hidden "
                             f"size {self.hidden}")
        if self.heads % self.kv_heads:
            raise InputError("transformer.kv_heads", f"{self.kv_heads} key/value heads do not "
                             f"divide {self.heads} query heads")
        if self.positional == "learned" and self.positions < self.seq:
            raise InputError("transformer.positions", f"a learned position table needs at least "
                             f"seq = {self.seq} rows, got {self.positions}")
        if self.positional != "learned" and self.positions:
            raise InputError("transformer.positions", f"must be 0 without learned positions, "
                             f"got {self.positions}")

    @property
    def tokens_per_sample(self) -> int:
        """One sample is one sequence of s tokens."""
        return self.seq

    @property
    def head_dim(self) -> int:
        """d = h / a."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """h_kv = kv_heads · d: the width of K (and of V)."""
        return self.kv_heads * self.head_dim


TRANSFORMER_FIELDS = tuple(f.name for f in fields(TransformerShape))
REQUIRED_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq")


def _require_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
        raise InputError(f"transformer.{name}", f"must be an integer in [{minimum}, "
                         f"{MAX_COUNT:,}], got {short_repr(value)}")


def transformer_shape_from_dict(data: object) -> TransformerShape:
    """A `TransformerShape` from a YAML mapping of its fields; errors name the field."""
    if not isinstance(data, dict):
        raise InputError("workload.transformer", f"must be a mapping, got {short_repr(data)}")
    unknown = sorted(set(data) - set(TRANSFORMER_FIELDS))
    if unknown:
        raise InputError(f"workload.transformer.{unknown[0]}", f"unknown field (known: "
                         f"{', '.join(TRANSFORMER_FIELDS)})")
    for name in REQUIRED_FIELDS:
        if name not in data:
            raise InputError(f"workload.transformer.{name}", "missing")
    return TransformerShape(**data)
