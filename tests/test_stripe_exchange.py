"""Issue 22: a stripe's halo is the rows the runtime exchanges (workload/splits.stripe_exchange,
the geometry runtime/network.PartitionedNet runs), and a testbed's measured exchange times are
interpolated (model/network.measured_time_s), both by hand."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

import pytest

from dnnscale.model.collectives import collective_time_s
from dnnscale.model.network import measured_time_s
from dnnscale.model.sharding import SplitContext, shard_layer
from dnnscale.system import LinkTier
from dnnscale.workload import build_workload
from dnnscale.workload.splits import stripe_exchange, stripe_ranges, stripe_rows


def _layer(height: int, spec: dict) -> object:
    return build_workload("w", [4, height, 6], [spec], samples_per_epoch=10).layers[0]


def test_pool_halos_by_hand() -> None:
    pool = {"kind": "maxpool2d", "kernel": 2, "stride": 2}
    # 14 rows held 7 + 7; the pool makes 4 + 3 rows, the first reads input rows 0-7: row 7 is
    # the second member's, one row from one neighbour
    assert stripe_exchange(_layer(14, pool), 2) == (1, 1)
    # 28 rows held 14 + 14, 7 + 7 output rows read exactly rows 0-13 and 14-27: nothing moves
    assert stripe_exchange(_layer(28, pool), 2) == (0, 0)
    assert stripe_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]


def test_conv_halos_by_hand() -> None:
    conv = {"kind": "conv2d", "out_channels": 3, "kernel": 5, "padding": 2}
    layer = _layer(12, conv)
    # output rows 0-5 read padded rows -2..7, i.e. input rows 0-7 (two padding rows): the
    # first member holds 0-5 and borrows 6-7; the second sends them and borrows 4-5
    assert stripe_rows(layer, (0, 6)) == ((0, 8), 2, 0)
    assert stripe_exchange(layer, 2) == (2, 1)
    # three members of 4 rows: the middle one borrows two rows from each side, sends two to each
    assert stripe_exchange(layer, 3) == (4, 2)


def test_the_shard_prices_the_busiest_members_rows() -> None:
    layer = _layer(12, {"kind": "conv2d", "out_channels": 3, "kernel": 5, "padding": 2})
    shard = shard_layer("adam", layer, "rows", 3, SplitContext("rows", True, 10, 4))
    halos = [e for e in shard.events if e.operation == "halo"]
    # 4 rows x 6 columns x 4 channels x 4 B x 10 samples over 2 neighbours, each way
    assert [(e.payload_bytes, e.members, e.phase) for e in halos] == [
        (4 * 6 * 4 * 4 * 10 / 2, 2, "forward"), (4 * 6 * 4 * 4 * 10 / 2, 2, "backward")]
    pool = build_workload("w", [4, 14, 6], [{"kind": "maxpool2d", "kernel": 2, "stride": 2}],
                          samples_per_epoch=10).layers[0]
    events = shard_layer("adam", pool, "rows", 2, SplitContext("rows", True, 10, 4)).events
    assert [(e.operation, e.payload_bytes, e.members) for e in events] == [
        ("halo", 6 * 4 * 4 * 10, 1), ("halo", 6 * 4 * 4 * 10, 1)]


@given(height=st.integers(4, 40), kernel=st.integers(1, 5), stride=st.integers(1, 3),
       parts=st.integers(2, 4))
def test_a_halo_never_exceeds_the_window(height: int, kernel: int, stride: int,
                                          parts: int) -> None:
    assume(kernel <= height)
    layer = _layer(height, {"kind": "maxpool2d", "kernel": kernel, "stride": stride})
    assume(layer.split_extent("rows") >= parts and height >= parts)
    rows, neighbours = stripe_exchange(layer, parts)
    assert 0 <= neighbours <= parts - 1 and (rows == 0) == (neighbours == 0)
    # a member's output stripe reads at most its own share of input rows plus one window's
    # overhang; what it borrows is within that overhang on each side
    assert rows <= 2 * (kernel + stride * parts) * max(1, neighbours)


def test_measured_times_are_interpolated_and_price_the_exchange() -> None:
    points = ((1024.0, 0.058), (262_144.0, 0.035), (1_048_576.0, 0.14), (1024.0, 0.060))
    assert measured_time_s(points, 512) == pytest.approx(0.059)          # the smallest's mean
    mid = 0.059 + (0.035 - 0.059) * (65_536 - 1024) / (262_144 - 1024)
    assert measured_time_s(points, 65_536) == pytest.approx(mid)
    slope = (0.14 - 0.035) / (1_048_576 - 262_144)
    assert measured_time_s(points, 2_097_152) == pytest.approx(0.14 + slope * 1_048_576)
    tier = LinkTier(1e7, 1e-3, fits=(("reduce_scatter", 4, 1e7, 1e-2),),
                    curves=(("reduce_scatter", 4, points),))
    # the curve wins over the α-β fit for its group size; other sizes keep the fit or the link
    assert collective_time_s("reduce_scatter", "gloo", 65_536, 4, tier) == pytest.approx(mid)
    assert collective_time_s("allgather", "gloo", 65_536, 4, tier) == pytest.approx(
        3 / 4 * 65_536 / 1e7 + 3 * 1e-3)
