"""Adam's FC vector protocol on the wire: what a worker packs for a shard, and the gradient the
shard rebuilds from it (the slicing rule is model/vectors.py's, so the model prices these bytes).

A push to a shard is one flat payload per piece (one partition's overlap with the shard's slice),
its segments in flat order:

- a dense segment (parameters of conv layers): the accumulated gradient values, as with the
  weight protocol;
- an FC segment: the errors δ of the rows the segment touches (m × rows, the rows of
  `Overlap.error_rows` in order), then the inputs a of its columns (m × cols), row-major, where m
  is the samples of the push (n · k_push; the vectors of k_push steps are stacked).

The shard adds −lr · δ[:, weight rows]ᵀ · a[:, cols] to the weight elements it owns (whole
rows by one in-place addmm_) and −lr · Σ_samples δ[:, bias rows] to its biases. With a loss averaged over the minibatch (δ carries the
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


def _add_weights(out: torch.Tensor, overlap: Overlap, errors: torch.Tensor,
                 inputs: torch.Tensor, alpha: float) -> None:
    """out (the overlap's weight elements, row-major) += alpha · (δ[:, rows]ᵀ · a[:, cols]):
    whole rows by one addmm_ in place, a partial first or last row by a vector product."""
    cols = overlap.region.cols
    w0, w1 = overlap.weights
    r0, r1 = overlap.weight_rows
    err = errors[:, _row_positions(overlap.error_rows, r0, r1)]
    if r1 - r0 == 1:  # within one row: the inputs sent are the overlap's own columns
        out[:w1 - w0].add_(err[:, 0] @ inputs, alpha=alpha)
        return
    position, row = 0, r0
    if w0 % cols:
        head = cols - w0 % cols
        out[:head].add_(err[:, 0] @ inputs[:, w0 % cols:], alpha=alpha)
        position, row = head, r0 + 1
    whole = w1 // cols - row
    if whole > 0:
        out[position:position + whole * cols].view(whole, cols).addmm_(
            err[:, row - r0:row - r0 + whole].t(), inputs, alpha=alpha)
        position, row = position + whole * cols, row + whole
    if w1 % cols:
        out[position:position + w1 % cols].add_(err[:, row - r0] @ inputs[:, :w1 % cols],
                                                alpha=alpha)


def add_update(segments: tuple[Segment, ...], payload: torch.Tensor, samples: int,
               target: torch.Tensor, alpha: float) -> None:
    """target (the piece's slice of the shard's weights, or of a sum) += alpha · the piece's
    gradient: dense values as sent, FC elements formed from the vectors in place (δᵀ·a for
    weights, Σδ for biases) without materialising the gradient."""
    position = 0
    for segment in segments:
        overlap = segment.overlap
        out = target[segment.offset:segment.offset + segment.length]
        if overlap is None:
            out.add_(payload[position:position + segment.length], alpha=alpha)
            position += segment.length
            continue
        rows = sum(b - a for a, b in overlap.error_rows)
        c0, c1 = overlap.columns
        errors = payload[position:position + samples * rows].view(samples, rows)
        position += samples * rows
        inputs = payload[position:position + samples * (c1 - c0)].view(samples, c1 - c0)
        position += samples * (c1 - c0)
        w0, w1 = overlap.weights
        if w1 > w0:
            _add_weights(out, overlap, errors, inputs, alpha)
        b0, b1 = overlap.bias_rows
        if b1 > b0:
            out[w1 - w0:w1 - w0 + b1 - b0].add_(
                errors[:, _row_positions(overlap.error_rows, b0, b1)].sum(0), alpha=alpha)
    if position != payload.numel():
        raise RuntimeError(f"vector payload of {payload.numel()} values, expected {position}")


def unpack_gradient(segments: tuple[Segment, ...], payload: torch.Tensor, samples: int,
                    piece_length: int) -> torch.Tensor:
    """The piece's gradient (length `piece_length`) from a payload (add_update into zeros)."""
    grad = torch.zeros(piece_length)
    add_update(segments, payload, samples, grad, 1.0)
    return grad
