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


def split_sizes(extent: int, parts: int) -> list[int]:
    """Divide `extent` units among `parts` workers as evenly as possible, larger parts first.

    Example: 10 units over 3 workers -> [4, 3, 3]. Needs extent >= parts >= 1.
    """
    if parts < 1 or extent < parts:
        raise ValueError(f"cannot split {extent} units among {parts} workers")
    base, extra = divmod(extent, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


Rows = tuple[int, int]
WINDOWED_KINDS = ("conv2d", "maxpool2d", "avgpool2d")
"""Layers whose output rows read a window of input rows: on stripes they need halo rows."""


def stripe_ranges(extent: int, parts: int) -> list[Rows]:
    """The rows [lo, hi) each of `parts` stripes holds of `extent` rows (split_sizes order)."""
    ranges, lo = [], 0
    for size in split_sizes(extent, parts):
        ranges.append((lo, lo + size))
        lo += size
    return ranges


def stripe_rows(layer: Layer, out_rows: Rows) -> tuple[Rows, int, int]:
    """Input rows a window layer (conv or pool) reads to make output rows [lo, hi), and the
    zero rows to add above and below (the part of its padding that falls in the stripe).

    Output row o reads padded rows [o·s, o·s + K_h), i.e. input rows [o·s − pad, o·s − pad + K_h).
    """
    kh, sh, ph = layer.kernel[0], layer.stride[0], layer.padding[0]  # type: ignore[index]
    h_in = layer.input_shape[1]
    first, last = out_rows[0] * sh - ph, (out_rows[1] - 1) * sh - ph + kh
    return (max(first, 0), min(last, h_in)), max(0, -first), max(0, last - h_in)


def _overlap_rows(a: Rows, b: Rows) -> int:
    return max(0, min(a[1], b[1]) - max(a[0], b[0]))


def stripe_exchange(layer: Layer, parts: int) -> tuple[int, int]:
    """The halo a window layer on stripes exchanges, as the runtime does it (runtime/network.
    PartitionedNet): its input is held in `parts` even stripes of the input rows, each member
    makes an even stripe of the output rows and receives the rows its windows read that others
    hold. Returns (rows, neighbours) of the busiest member: the most rows it sends or receives
    (one direction of its link), and how many members it trades with.

    Example: a 2x2/2 pool on 14 rows held as 7 + 7 makes 4 + 3 output rows; the first reads
    input rows 0-7 and borrows row 7: (1, 1). The same pool on 28 rows held as 14 + 14 reads
    exactly what each holds: (0, 0).
    """
    held = stripe_ranges(layer.input_shape[1], parts)
    needed = [stripe_rows(layer, rows)[0] for rows in stripe_ranges(layer.split_extent("rows"),
                                                                    parts)]
    busiest = (0, 0)
    for me in range(parts):
        peers = [q for q in range(parts) if q != me and (
            _overlap_rows(needed[me], held[q]) or _overlap_rows(needed[q], held[me]))]
        received = sum(_overlap_rows(needed[me], held[q]) for q in peers)
        sent = sum(_overlap_rows(needed[q], held[me]) for q in peers)
        busiest = max(busiest, (max(received, sent), len(peers)))
    return busiest
