"""Project Adam's FC vector protocol on flat-sliced parameter-server shards (no torch).

Under `fc_protocol: vectors` a worker does not push the weight gradient of a fully connected
layer; it pushes the layer's input activations a (n × n_in) and output errors δ (n × n_out), and
the parameter server computes the update δᵀ·a itself (Chilimbi et al., OSDI 2014, §3.3: the
traffic of an FC layer falls from n_in·n_out to n·(n_in + n_out) values).

The shards own contiguous slices of one flat parameter vector (partition 0's parameters, then
partition 1's, ...; each layer's weight matrix row-major, then its bias), so a shard usually
holds part of an FC layer. A worker sends each shard exactly what the shard's slice needs — the
same rule the runtime follows (runtime/ps.py) and the model prices (model/compose.py):

- the errors of the output rows the slice touches (weight rows and bias entries, their union);
- the input columns those weight elements read: the slice's own columns when it lies within one
  row, else all n_in (a slice that spans two rows or more needs every column);
- the shard computes the block δ[:, rows]ᵀ · a[:, cols] (2·n·rows·cols FLOP) and keeps the
  elements it owns.

So with S = 1 and P = 1 a layer costs exactly n·(n_in + n_out) values; a layer cut by shard
boundaries, or split over P workers (each worker holds its own rows and the whole input), sends
the input columns once per shard piece.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dnnscale.model.sharding import member_params
from dnnscale.workload.splits import split_sizes
from dnnscale.workload.splits import split_extent
from dnnscale.workload.workload import Workload

Range = tuple[int, int]


@dataclass(frozen=True)
class Region:
    """A run of one partition's flat parameters at global offset `start`: one FC layer's slice
    (`layer` set: `rows` output units × `cols` inputs, row-major, then `rows` biases if `bias`),
    or the weights of other layers, pushed as gradients (`layer` None)."""

    start: int
    length: int
    partition: int
    layer: str | None = None
    rows: int = 0
    cols: int = 0
    bias: bool = False

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass(frozen=True)
class Overlap:
    """The part [lo, hi) (offsets inside the region) of an FC region that one shard owns, and
    what the shard needs for it."""

    region: Region
    lo: int
    hi: int

    @property
    def weights(self) -> Range:
        """Weight elements [w0, w1) of the region's row-major matrix in the overlap (may be empty)."""
        size = self.region.rows * self.region.cols
        return min(self.lo, size), min(self.hi, size)

    @property
    def weight_rows(self) -> Range:
        w0, w1 = self.weights
        if w1 <= w0:
            return (0, 0)
        cols = self.region.cols
        return w0 // cols, (w1 - 1) // cols + 1

    @property
    def columns(self) -> Range:
        """Input columns sent: the overlap's own within one row, else all of them."""
        w0, w1 = self.weights
        if w1 <= w0:
            return (0, 0)
        r0, r1 = self.weight_rows
        cols = self.region.cols
        if r1 - r0 == 1:
            return w0 - r0 * cols, w1 - r0 * cols
        return 0, cols

    @property
    def bias_rows(self) -> Range:
        size = self.region.rows * self.region.cols
        b0, b1 = max(self.lo, size) - size, max(self.hi, size) - size
        return (b0, b1) if b1 > b0 else (0, 0)

    @property
    def error_rows(self) -> tuple[Range, ...]:
        """Output rows whose errors are sent: the union of the weight and bias rows, in order."""
        spans = sorted(r for r in (self.weight_rows, self.bias_rows) if r[1] > r[0])
        if len(spans) == 2 and spans[1][0] <= spans[0][1]:
            return ((spans[0][0], max(spans[0][1], spans[1][1])),)
        return tuple(spans)

    @property
    def values_per_sample(self) -> int:
        """Values sent per sample: the errors of `error_rows` and the inputs of `columns`."""
        c0, c1 = self.columns
        return sum(b - a for a, b in self.error_rows) + c1 - c0


def flat_layout(workload: Workload, partitions: int, schemes: dict[str, str] | None = None,
                vectors: bool = True) -> tuple[Region, ...]:
    """The global flat parameter vector as regions, partition-major, layers in order.

    `schemes`: each weighted layer's split ('rows' keeps a conv's whole kernel on every
    partition; anything else divides its output units, larger parts first). With `vectors`
    every linear layer is a region of its own; dense runs of other layers are merged.
    """
    schemes = schemes or {}
    regions: list[Region] = []
    offset = 0
    for partition in range(partitions):
        dense = 0
        for layer in workload.layers:
            if not layer.has_weights:
                continue
            scheme = schemes.get(layer.name, "features" if layer.kind == "linear" else "channels")
            if scheme == "rows" and partitions > 1:
                size, units = member_params(layer, "rows", 0), 0
            else:
                scheme = "features" if layer.kind == "linear" else "channels"
                units = split_sizes(split_extent(layer, scheme), partitions)[partition]
                size = member_params(layer, scheme, units)
            if vectors and layer.kind == "linear":
                if dense:
                    regions.append(Region(offset - dense, dense, partition))
                    dense = 0
                regions.append(Region(offset, size, partition, layer.name, units,
                                      layer.input_shape[0], bool(layer.hyper.get("bias", True))))
            else:
                dense += size
            offset += size
        if dense:
            regions.append(Region(offset - dense, dense, partition))
    return tuple(regions)


def shard_bounds(total: int, shards: int) -> list[Range]:
    """Shard s owns [s·N//S, (s+1)·N//S) of the N flat parameters (runtime/layout.ShardMap)."""
    return [(s * total // shards, (s + 1) * total // shards) for s in range(shards)]


def cut(regions: tuple[Region, ...], lo: int, hi: int) -> list[tuple[Region, int, int]]:
    """The regions that meet global range [lo, hi), each with the local range it shares."""
    parts = []
    for region in regions:
        a, b = max(lo, region.start), min(hi, region.end)
        if a < b:
            parts.append((region, a - region.start, b - region.start))
    return parts


@dataclass
class ShardLoad:
    """What one shard receives per sample and step of one replica under the vector protocol."""

    params: int = 0
    """Parameters the shard owns (pulled, and updated per push)."""
    dense_params: int = 0
    """Of those, the ones pushed as gradients (not in an FC layer)."""
    vector_values_per_sample: float = 0.0
    blocks: list[tuple[int, int]] = field(default_factory=list)
    """(rows, columns) of each FC block δ[:, rows]ᵀ · a[:, cols] the shard multiplies."""


@dataclass(frozen=True)
class VectorTraffic:
    """Per shard its load; per partition (worker) what it pushes per sample and step."""

    shards: tuple[ShardLoad, ...]
    worker_dense_params: tuple[int, ...]
    worker_vector_values_per_sample: tuple[float, ...]


def vector_traffic(regions: tuple[Region, ...], shards: int, partitions: int) -> VectorTraffic:
    """Every shard's and every worker's vector-protocol traffic for S = `shards` (one replica,
    all its partitions), following this module's slicing rule. O(S + regions)."""
    total = regions[-1].end if regions else 0
    loads = [ShardLoad() for _ in range(shards)]
    dense = [0] * partitions
    values = [0.0] * partitions
    bounds = shard_bounds(total, shards)
    shard = 0
    for region in regions:
        if region.layer is None:
            dense[region.partition] += region.length
        while shard < shards and bounds[shard][1] <= region.start:
            shard += 1
        s = shard
        while s < shards and bounds[s][0] < region.end:
            a, b = max(region.start, bounds[s][0]), min(region.end, bounds[s][1])
            if a < b:
                load = loads[s]
                load.params += b - a
                if region.layer is None:
                    load.dense_params += b - a
                else:
                    piece = Overlap(region, a - region.start, b - region.start)
                    load.vector_values_per_sample += piece.values_per_sample
                    values[region.partition] += piece.values_per_sample
                    (r0, r1), (c0, c1) = piece.weight_rows, piece.columns
                    if r1 > r0:
                        load.blocks.append((r1 - r0, c1 - c0))
            s += 1
    return VectorTraffic(tuple(loads), tuple(dense), tuple(values))
