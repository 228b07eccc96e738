"""ZeRO-3 / FSDP gathers and reduces each FSDP unit on its own (model/data_parallel.zero_traffic,
model/stage.unit_count), DeepSpeed's stage 3 in its buckets (model/zero3_fetch.py), and every
one of those collectives pays NCCL's flat-ring latency (model/collectives.flat_ring_extra_hops):
checked by hand on a small plan."""

from __future__ import annotations

import pytest

from dnnscale.model import predict_plan
from dnnscale.model.predict import plan_stage_costs
from dnnscale.model.stage import unit_count
from dnnscale.plan import ParallelPlan, modern_plan_from_dict
from dnnscale.system import load_system
from dnnscale.workload import load_workload


def _plan(**fields: object) -> ParallelPlan:
    return modern_plan_from_dict({"tp": 1, "micro_batch": 1, "precision": "bf16", **fields})


def test_a_stage_counts_its_blocks_and_its_root_unit() -> None:
    assert unit_count([100, 100, 5]) == 3
    assert unit_count([100, 0]) == 1          # the layers outside the blocks hold no weights
    assert unit_count([]) == 1


PROTOCOLS = {"LL": (0.5, 2.7e-6, 0.6e-6), "LL128": (0.92, 4.0e-6, 1.9e-6),
             "Simple": (1.0, 14e-6, 3.4e-6)}
"""NCCL's protocols on 2 DGX A100 nodes: (share of bandwidth, network hop, NVLink hop)."""


def _collective_by_hand(system: object, x: float, calls: int) -> float:
    """`calls` equal collectives moving `x` bytes in all through 16 GPUs in 2 nodes of 8, each
    on its quickest NCCL protocol end to end: the shards x/8 across the nodes (1/2 · x/8 /
    B_IB + α_IB), then inside the node (7/8 · x / B_NVL + 7 α_NVL), 7 more NVLink hops of
    NCCL's flat ring, and the call's fixed cost."""
    ib, nvl = system.topology.inter_node, system.topology.intra_node  # type: ignore[attr-defined]
    assert nvl is not None
    call = system.call_s(16)  # type: ignore[attr-defined]

    def one(per: float, protocol: str) -> float:
        share, a_ib, a_nvl = PROTOCOLS[protocol]
        return (0.5 * per / 8 / (share * ib.bandwidth_bytes_per_s) + a_ib
                + 7 / 8 * per / (share * nvl.bandwidth_bytes_per_s) + 7 * a_nvl + 7 * a_nvl)

    per = x / calls
    return calls * (min(one(per, p) for p in PROTOCOLS) + call)


def test_zero3_pays_each_units_latency_by_hand() -> None:
    """gpt3-1.3b (24 blocks and the root unit: 25) over 16 GPUs in 2 DGX A100 nodes, one
    micro-batch: 2 all-gathers of the bf16 weights (x = 2Ψ) and one reduce-scatter of the fp32
    gradients (4Ψ), each in 25 collectives (`_collective_by_hand`). NCCL runs these 105-210 MB
    pieces on Simple (full bandwidth; 14 µs a network hop, 3.4 µs an NVLink hop:
    src/graph/tuning.cc), the quickest of LL (half the bandwidth; 2.7 and 0.6 µs), LL128
    (0.92; 4.0 and 1.9 µs) and Simple."""
    workload, system = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:2")
    psi = sum(layer.params for layer in workload.layers)
    prediction = predict_plan(workload, system, _plan(dp=16, zero=3, global_batch=16))
    expected = 2 * _collective_by_hand(system, 2 * psi, 25) + \
        _collective_by_hand(system, 4 * psi, 25)
    assert prediction.breakdown_s["dp_comm"] == pytest.approx(expected, rel=1e-9)
    # the same bytes in one collective each would cost 3 · 24 calls' latency less
    per_call = 14e-6 + 14 * 3.4e-6 + system.call_s(16)
    assert expected - (2 * _collective_by_hand(system, 2 * psi, 1)
                       + _collective_by_hand(system, 4 * psi, 1)) == \
        pytest.approx(3 * 24 * per_call)


def test_deepspeed_buckets_by_hand() -> None:
    """The same plan under DeepSpeed's stage 3 (zero3_fetch buckets, model/zero3_fetch.py):
    gpt3-1.3b's tensors are the embedding (107.1 M, at least the 50 M prefetch bucket: a call
    of its own), then per block 12.6 + 4.2 + 16.8 + 16.8 = 50.35 M (the layer norms, 4,096
    each, stay whole): one call per block, 25 all-gathers as FSDP's; its 1.32 G gradients
    fill 500 M reduce buckets three times, 3 reduce-scatters where FSDP runs 25."""
    workload, system = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:2")
    psi = sum(layer.params for layer in workload.layers)
    assert 1.25e9 < psi < 1.5e9
    prediction = predict_plan(workload, system, _plan(dp=16, zero=3, global_batch=16,
                                                      zero3_fetch="buckets"))
    expected = 2 * _collective_by_hand(system, 2 * psi, 25) + \
        _collective_by_hand(system, 4 * psi, 3)
    assert prediction.breakdown_s["dp_comm"] == pytest.approx(expected, rel=1e-9)


def test_the_search_template_counts_the_same_units() -> None:
    """The optimizer's stage template (stages_from_template) and the layer-by-layer stage
    agree on the units, so predict and the search price ZeRO-3 alike: one stage holds the 24
    blocks and the root unit; with pp = 2 each holds 12 blocks and its part of the root's
    layers (the embedding first, the final norm last: both hold weights)."""
    workload, system = load_workload("gpt3-1.3b"), load_system("dgx-a100-80g:1")
    (whole,) = plan_stage_costs(workload, system, _plan(dp=8, zero=3, global_batch=8))
    assert whole.units == 25
    plan = _plan(pp=2, dp=4, zero=3, global_batch=8)
    by_layer = plan_stage_costs(workload, system, plan, per_layer=True)
    by_template = plan_stage_costs(workload, system, plan, per_layer=False)
    assert [s.units for s in by_layer] == [s.units for s in by_template] == [13, 13]
