"""Adam's FC vector protocol on the wire: what a worker packs for a shard, and the gradient the
shard rebuilds from it (the slicing rule is model/vectors.py's, so the model prices these bytes).

A push to a shard is one flat payload per piece (one partition's overlap with the shard's slice),
its segments in flat order:

- a dense segment (parameters of conv layers): the accumulated gradient values, as with the
  weight protocol;
- an FC segment: the errors δ of the rows the segment touches (m × rows, the rows of
  `Overlap.error_rows` in order), then the inputs a of its columns (m × cols), row-major, where m
  is the samples of the push (n · k_push; the vectors of k_push steps are stacked).

The shard computes δ[:, weight rows]ᵀ · a[:, cols] and keeps the elements it owns, and the
bias gradient Σ_samples δ[:, bias rows]. With a loss averaged over the minibatch (δ carries the
1/n), that is exactly the weight gradient the worker would have pushed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dnnscale.model.vectors import Overlap, Region, cut
from dnnscale.runtime.layout import Piece, ShardMap

Vectors = dict[str, tuple[torch.Tensor, torch.Tensor]]
"""FC layer name -> (inputs a: m × n_in, errors δ: m × rows of this partition)."""


@dataclass(frozen=True)
class Segment:
    """Part of a piece: `length` values at `offset` inside the piece; `overlap` for an FC
    layer's part, None for dense gradients."""

    offset: int
    length: int
    overlap: Overlap | None


def piece_segments(regions: tuple[Region, ...], shard_map: ShardMap,
                   piece: Piece) -> tuple[Segment, ...]:
    """The segments of `piece`, in flat order."""
    start = shard_map.partition_offsets[piece.partition] + piece.worker_start
    segments = []
    for region, lo, hi in cut(regions, start, start + piece.length):
        offset = region.start + lo - start
        overlap = Overlap(region, lo, hi) if region.layer is not None else None
        segments.append(Segment(offset, hi - lo, overlap))
    return tuple(segments)


def _row_positions(ranges: tuple[tuple[int, int], ...], lo: int, hi: int) -> slice:
    """Where rows [lo, hi) sit among the concatenated `ranges` (they lie within one range)."""
    position = 0
    for a, b in ranges:
        if a <= lo and hi <= b:
            return slice(position + lo - a, position + hi - a)
        position += b - a
    raise ValueError(f"rows [{lo}, {hi}) are not among {ranges}")


def pack(segments: tuple[Segment, ...], piece_grad: torch.Tensor, vectors: Vectors) -> torch.Tensor:
    """The payload a worker sends for one piece: dense gradient values and FC vectors."""
    parts = []
    for segment in segments:
        overlap = segment.overlap
        if overlap is None:
            parts.append(piece_grad[segment.offset:segment.offset + segment.length])
            continue
        inputs, errors = vectors[overlap.region.layer or ""]
        parts.append(torch.cat([errors[:, a:b] for a, b in overlap.error_rows], 1).reshape(-1))
        c0, c1 = overlap.columns
        parts.append(inputs[:, c0:c1].reshape(-1))
    return torch.cat(parts) if parts else torch.empty(0)


def payload_length(segments: tuple[Segment, ...], samples: int) -> int:
    """Values in the payload of a push of `samples` samples."""
    return sum(segment.length if segment.overlap is None
               else samples * segment.overlap.values_per_sample for segment in segments)


def unpack_gradient(segments: tuple[Segment, ...], payload: torch.Tensor, samples: int,
                    piece_length: int) -> torch.Tensor:
    """The piece's gradient (length `piece_length`) from a payload: dense values copied, FC
    elements computed from the vectors (δᵀ·a for weights, Σδ for biases)."""
    grad = torch.empty(piece_length)
    position = 0
    for segment in segments:
        overlap = segment.overlap
        out = grad[segment.offset:segment.offset + segment.length]
        if overlap is None:
            out.copy_(payload[position:position + segment.length])
            position += segment.length
            continue
        rows = sum(b - a for a, b in overlap.error_rows)
        c0, c1 = overlap.columns
        errors = payload[position:position + samples * rows].view(samples, rows)
        position += samples * rows
        inputs = payload[position:position + samples * (c1 - c0)].view(samples, c1 - c0)
        position += samples * (c1 - c0)
        region = overlap.region
        w0, w1 = overlap.weights
        filled = 0
        if w1 > w0:
            r0, r1 = overlap.weight_rows
            block = errors[:, _row_positions(overlap.error_rows, r0, r1)].t() @ inputs
            first = w0 - r0 * region.cols if c1 - c0 == region.cols else 0
            out[:w1 - w0] = block.reshape(-1)[first:first + w1 - w0]
            filled = w1 - w0
        b0, b1 = overlap.bias_rows
        if b1 > b0:
            out[filled:filled + b1 - b0] = \
                errors[:, _row_positions(overlap.error_rows, b0, b1)].sum(0)
    if position != payload.numel():
        raise RuntimeError(f"vector payload of {payload.numel()} values, expected {position}")
    return grad
