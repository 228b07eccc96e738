"""Expert parallelism (ep) and context parallelism (cp) priced by hand (issue 25).

A tiny mixture of experts: 2 blocks, h = 256, 8 heads, s = 128, V = 1000, fused attention, 4
experts of f = 1024 (4h, not gated), top-2, biases, learned positions, tied embeddings, bf16
(2 bytes per value), on one DGX A100 node (NVLink 231 GB/s and 0.6 µs per message inside it,
24 GB/s and 2.7 µs between nodes).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dnnscale.errors import InputError
from dnnscale.model.collectives import alltoall_two_tier_s, collective_transfer
from dnnscale.model.context_parallel import ring_bytes_per_pass
from dnnscale.model.predict import predict_plan
from dnnscale.model.records import Part
from dnnscale.optimize.modern import exhaustive_modern, make_modern_space, optimize_modern
from dnnscale.plan.mesh import DeviceMesh, MeshDim, joint_span
from dnnscale.plan.modern import modern_plan_from_dict
from dnnscale.plan.rules import check_modern_plan
from dnnscale.system import load_system
from dnnscale.system.topology import GroupSpan, LinkTier
from dnnscale.workload.transformer import transformer_workload

NVLINK_B, NVLINK_A = 231e9, 0.6e-6
IB_B, IB_A = 24e9, 2.7e-6


def tiny_moe(**overrides):  # noqa: ANN201
    options = dict(flash_attention=True, experts=4, top_k=2)
    options.update(overrides)
    return transformer_workload("tiny-moe", 2, 256, 8, 128, 1000, **options)


def tiny_dense(seq: int = 128):  # noqa: ANN201
    return transformer_workload("tiny-dense", 2, 256, 8, seq, 1000, flash_attention=True)


def node(nodes: int = 1):  # noqa: ANN201
    return load_system(f"dgx-a100-80g:{nodes}")


def plan(**fields):  # noqa: ANN201
    return modern_plan_from_dict(fields)


def layer(prediction, name):  # noqa: ANN001, ANN201
    return next(cost for cost in prediction.layers if cost.name == name)


# ------------------------------------------------------------------ the workload's counts

def test_parameters_split_into_dense_and_expert_by_hand() -> None:
    """Per block: norms 2·512, QKV 256·768 + 768, out 256² + 256, router 256·4 = 265,216
    dense; experts 4·(256·1024 + 1024) + 4·(1024·256 + 256) = 2,102,272. Outside: the
    embedding (1000 + 128)·256 = 288,768 and the final norm 512."""
    workload = tiny_moe()
    assert workload.params == 2 * (265_216 + 2_102_272) + 288_768 + 512
    stage = predict_plan(workload, node(), plan(ep=2, global_batch=2)).layers
    assert sum(1 for cost in stage if cost.kind == "moe_dispatch") == 2


# ------------------------------------------------------------------ the dispatch by hand

def _nvlink_ring_s(wire_bytes: float, hops: int) -> float:
    """An NCCL ring step on NVLink at the quickest protocol (NVIDIA/nccl src/graph/tuning.cc):
    LL at half the bandwidth and 0.6 µs a hop, LL128 at 0.92 and 1.9 µs, Simple at full
    bandwidth and 3.4 µs."""
    return min(wire_bytes / (share * NVLINK_B) + hops * latency
               for share, latency in ((0.5, 0.6e-6), (0.92, 1.9e-6), (1.0, 3.4e-6)))


def _alltoall_s(system, payload: float, members: int) -> float:  # noqa: ANN001
    """One all-to-all inside a node: (g−1)/g·x / B + (g−1)·α + the system's call cost."""
    return ((members - 1) / members * payload / NVLINK_B + (members - 1) * NVLINK_A
            + system.call_s(members))


def test_dispatch_and_combine_all_to_alls_by_hand() -> None:
    """One micro-batch of 1 sequence: each member sends its 128 tokens' 2 copies of 256 bf16
    values, 1·128·2·256·2 = 131,072 B, in the dispatch all-to-all among ep = 4 (3/4 of it on
    the wire in 3 messages), forward and backward; the combine the same."""
    system = node()
    prediction = predict_plan(tiny_moe(), system, plan(ep=4, global_batch=4))
    one = _alltoall_s(system, 131_072, 4)
    for name in ("block0.moe_dispatch", "block0.moe_combine"):
        cost = layer(prediction, name)
        assert cost.ep_comm_s == pytest.approx(2 * one, rel=1e-12)
        assert cost.ep_forward_s == pytest.approx(one, rel=1e-12)
    assert collective_transfer("alltoall", "nccl", 131_072, 4) == (98_304.0, 3.0)
    # two blocks, four all-to-alls each, one micro-batch per step
    assert prediction.part(Part.EP_COMM) == pytest.approx(8 * one, rel=1e-9)
    assert prediction.step_record.collective_s(MeshDim.EP) == prediction.part(Part.EP_COMM)


def test_sequence_parallel_members_exchange_their_own_tokens_by_hand() -> None:
    """tp = 2 with sequence parallelism: each tensor-parallel member holds 64 of the 128
    tokens and exchanges their copies, 1·64·2·256·2 = 65,536 B per all-to-all among ep = 2
    (Megatron-Core's A2A(EP) on the sequence-parallel input); without sequence parallelism
    every member exchanges all 128 tokens' copies, 131,072 B."""
    system = node()
    for sp, payload in ((True, 65_536), (False, 131_072)):
        prediction = predict_plan(tiny_moe(), system, plan(tp=2, ep=2, global_batch=2,
                                                           sequence_parallel=sp))
        one = _alltoall_s(system, payload, 2)
        assert layer(prediction, "block0.moe_dispatch").ep_comm_s == pytest.approx(
            2 * one, rel=1e-12)


def test_expert_linears_gather_the_token_copies_over_tp_by_hand() -> None:
    """The expert linears' tensor-group exchanges carry the s·k copies: with sequence
    parallelism the all-gather before expert_up moves 1·128·2·256·2 = 131,072 B (AG(TP) of the
    copies the all-to-all brought), k = 2 times attn_qkv's 65,536 B, the reduce-scatter after
    expert_down the same; under an imbalance of 1.5 the busiest member's 1.5×."""
    system = node()
    even = predict_plan(tiny_moe(), system, plan(tp=2, ep=2, global_batch=2,
                                                 sequence_parallel=True))
    qkv, up = layer(even, "block0.attn_qkv"), layer(even, "block0.expert_up")
    # an all-gather among 2 moves (g−1)/g of the tensor: 65,536 B of 131,072, 32,768 of 65,536
    assert up.comm_bytes == 2 * qkv.comm_bytes == 2 * 65_536
    assert layer(even, "block0.expert_down").comm_bytes == 2 * 65_536
    uneven = predict_plan(tiny_moe(), system, plan(tp=2, ep=2, global_batch=2,
                                                   sequence_parallel=True,
                                                   expert_imbalance=1.5))
    assert layer(uneven, "block0.expert_up").comm_bytes == pytest.approx(1.5 * 2 * 65_536)


@pytest.mark.parametrize("capacity, load", [(None, 1.5), (1.25, 1.25), (2.0, 1.5)])
def test_imbalance_scales_the_busiest_member(capacity, load) -> None:  # noqa: ANN001
    """The busiest member gets 1.5× the mean: its all-to-all payload and expert work grow by
    min(1.5, capacity factor) (dropless: 1.5)."""
    system = node()
    workload = tiny_moe(capacity_factor=capacity)
    even = predict_plan(workload, system, plan(ep=4, global_batch=4))
    uneven = predict_plan(workload, system, plan(ep=4, global_batch=4, expert_imbalance=1.5))
    dispatch = layer(uneven, "block0.moe_dispatch")
    assert dispatch.ep_comm_s == pytest.approx(2 * _alltoall_s(system, 131_072 * load, 4),
                                               rel=1e-12)
    for name in ("block0.expert_up", "block0.expert_act", "block0.expert_down"):
        assert layer(uneven, name).work_fraction == pytest.approx(
            load * layer(even, name).work_fraction, rel=1e-12)
    for name in ("block0.attn_qkv", "block0.moe_router"):  # dense layers are unaffected
        assert layer(uneven, name).forward_s == layer(even, name).forward_s


def test_expert_gemms_run_per_local_expert() -> None:
    """ep = 1 runs the 4 experts' GEMMs on one device, ep = 4 one expert per device: the
    same FLOPs per member (every member computes its tokens' copies), each call 4× larger,
    so at least as efficient; the experts' weights per member fall 4×."""
    system = node()
    one = predict_plan(tiny_moe(), system, plan(ep=1, dp=4, global_batch=4))
    four = predict_plan(tiny_moe(), system, plan(ep=4, global_batch=4))
    up1, up4 = layer(one, "block0.expert_up"), layer(four, "block0.expert_up")
    assert up1.work_fraction == up4.work_fraction == 1.0
    assert up4.forward_s <= up1.forward_s
    weights = {p.name: p.bytes for p in four.memory}["weights"]
    dense, experts = 2 * 265_216 + 288_768 + 512, 2 * 2_102_272
    assert weights == pytest.approx(2 * (dense + experts / 4), rel=1e-12)


def test_zero_shards_dense_state_over_dp_ep_and_experts_over_dp() -> None:
    """ZeRO-1 with dp = 2, ep = 4: the dense parameters' 12 B/param of Adam state over the
    8 members holding them, the experts' over the 2 holding the same experts."""
    prediction = predict_plan(tiny_moe(), node(), plan(ep=4, dp=2, zero=1, global_batch=8))
    dense, experts = 2 * 265_216 + 288_768 + 512, 2 * 2_102_272 / 4
    state = {p.name: p.bytes for p in prediction.memory}["optimizer_state"]
    assert state == pytest.approx(12 * (dense / 8 + experts / 2), rel=1e-12)


def test_dense_gradients_meet_over_ep_experts_do_not() -> None:
    """dp = 1, ep = 2, ZeRO 0, no overlap: the dense gradients (fp32 under bf16, Megatron's
    default) are all-reduced among the 2 ep members, which took different samples; each expert
    lives on one member, so its gradients meet nobody. Ring all-reduce of x among 2:
    2·(1/2)·x on the wire in 2 steps at NCCL's quickest protocol (for these 4.4 MB LL128:
    x / (0.92·B) + 2·1.9 µs), + call."""
    system = node()
    prediction = predict_plan(tiny_moe(), system, plan(ep=2, global_batch=2))
    dense = 2 * 265_216 + 288_768 + 512
    x = dense * 4
    assert _nvlink_ring_s(x, 2) == pytest.approx(x / (0.92 * NVLINK_B) + 2 * 1.9e-6)
    assert prediction.part(Part.DP_COMM) == pytest.approx(
        _nvlink_ring_s(x, 2) + system.call_s(2), rel=1e-9)
    assert prediction.throughput_samples_per_s == pytest.approx(2 / prediction.step_time_s)


def test_two_tier_alltoall_by_hand() -> None:
    """16 members, 8 per node, a 1 MB tensor each: 7 pieces of 62.5 kB over NVLink and 8 over
    the NIC at once; the slower sets the time."""
    intra, inter = LinkTier(NVLINK_B, NVLINK_A), LinkTier(IB_B, IB_A)
    x = 1e6
    expected = max(7 * x / 16 / NVLINK_B + 7 * NVLINK_A, 8 * x / 16 / IB_B + 8 * IB_A)
    assert alltoall_two_tier_s("nccl", x, GroupSpan(16, 8), intra, inter) == pytest.approx(
        expected, rel=1e-12)


# ------------------------------------------------------------------ ring attention by hand

def test_ring_attention_traffic_by_hand() -> None:
    """cp = 4, s = 128, one sequence, 8 K/V heads of 32 (h_kv = 256), tp = 1: a member's K|V
    block is 1·32·2·256·2 = 32,768 B; a pass sends 3 of them forward and 6 backward."""
    assert ring_bytes_per_pass(32_768, 4) == (98_304, 196_608)


def _slow_intra(system):  # noqa: ANN001, ANN201
    slow = dataclasses.replace(system.intra_node, bandwidth_bytes_per_s=1e6)
    return dataclasses.replace(system, intra_node=slow)


def test_ring_attention_overlap_by_hand() -> None:
    """cp = 2 on a 1 MB/s link (so the sends cannot hide): a 64-token block of K|V is
    1·64·2·256·2 = 65,536 B, t_x = 65,536 / 1e6 + 0.6 µs. Exposed: forward (2 − 1)·(t_x −
    t_fwd/2), backward (2 − 1)·(2·t_x − t_bwd/2), t the member's attention compute; the
    compute beside the hidden rest (t_fwd/2, t_bwd/2) runs κ = 18.9 % slower (Lee et al.
    2025), κ/(1 + κ) of it."""
    contention = 0.189 / 1.189
    system = _slow_intra(node())
    prediction = predict_plan(tiny_dense(), system, plan(cp=2, global_batch=1))
    flash = layer(prediction, "block0.flash_attention")
    t_x = 65_536 / 1e6 + NVLINK_A
    t_b = flash.input_grad_s + flash.weight_grad_s
    forward = t_x - flash.forward_s / 2 + flash.forward_s / 2 * contention
    backward = 2 * t_x - t_b / 2 + t_b / 2 * contention
    assert flash.cp_comm_s == pytest.approx(forward + backward, rel=1e-12)
    assert flash.cp_forward_s == pytest.approx(forward, rel=1e-12)
    # on NVLink the same sends hide behind the compute: only the compute's slowdown beside
    # them, κ/(1 + κ) of the three blocks' sends
    fast = layer(predict_plan(tiny_dense(), node(), plan(cp=2, global_batch=1)),
                 "block0.flash_attention")
    assert fast.cp_comm_s == pytest.approx(3 * (65_536 / NVLINK_B + NVLINK_A) * contention,
                                           rel=1e-12)


def test_context_parallel_splits_every_layer_by_cp() -> None:
    """cp = 2: every layer works on half the tokens, its TP exchanges half as large."""
    one = predict_plan(tiny_dense(), node(), plan(tp=2, global_batch=1))
    two = predict_plan(tiny_dense(), node(), plan(tp=2, cp=2, global_batch=1))
    for a, b in zip(one.layers, two.layers):
        assert b.work_fraction == pytest.approx(a.work_fraction / 2, rel=1e-12), a.name
    qkv = layer(two, "block0.attn_qkv")
    # the f operator's all-reduce backward of b·(s/2)·h·2 = 32,768 B among 2, small enough for
    # NCCL's LL protocol: 32,768 / (0.5·B) + 2·0.6 µs
    assert _nvlink_ring_s(32_768, 2) == pytest.approx(32_768 / (0.5 * NVLINK_B) + 2 * 0.6e-6)
    assert qkv.comm_s == pytest.approx(_nvlink_ring_s(32_768, 2) + node().call_s(2),
                                       rel=1e-12)


def test_ulysses_all_to_alls_by_hand() -> None:
    """cp = 2 all-to-all: Q|K|V of 64 tokens, 1·64·(256 + 512)·2 = 98,304 B, and the output
    1·64·256·2 = 32,768 B, each among 2 (half on the wire, 1 message), forward and backward."""
    system = node()
    prediction = predict_plan(tiny_dense(), system,
                              plan(cp=2, cp_algorithm="alltoall", global_batch=1))
    flash = layer(prediction, "block0.flash_attention")
    qkv, out = (_alltoall_s(system, x, 2) for x in (98_304, 32_768))
    assert flash.cp_comm_s == pytest.approx(2 * (qkv + out), rel=1e-12)
    assert flash.cp_forward_s == pytest.approx(qkv + out, rel=1e-12)


# ------------------------------------------------------------------ the mesh's groups

@settings(max_examples=200, deadline=None)
@given(sizes=st.tuples(*[st.sampled_from([1, 2, 3, 4, 8])] * 5),
       dims=st.lists(st.sampled_from(list(MeshDim)), min_size=1, max_size=3, unique=True),
       per_node=st.sampled_from([1, 2, 4, 8, 16]))
def test_joint_span_counts_the_members_in_a_node(sizes, dims, per_node) -> None:  # noqa: ANN001
    """joint_span against listing the group of rank 0 and counting its members below the first
    node's end (a single dimension: its own placement, system/topology.group_span)."""
    mesh = DeviceMesh(tuple(sizes))
    members = [sum(c * mesh.stride(d) for c, d in zip(coords, dims))
               for coords in itertools.product(*[range(mesh.size(d)) for d in dims])]
    span = joint_span(mesh, tuple(dims), per_node)
    assert span.size == len(members)
    if len([d for d in dims if mesh.size(d) > 1]) > 1:
        assert span.per_node == max(1, sum(1 for r in members if r < per_node))


# ------------------------------------------------------------------ the rules

@pytest.mark.parametrize("workload, fields, field", [
    (tiny_moe, dict(ep=3, global_batch=3), "plan.ep"),
    (tiny_dense, dict(ep=2, global_batch=2), "plan.ep"),
    (tiny_dense, dict(cp=3, global_batch=1), "plan.cp"),           # 128 % 6
    (tiny_dense, dict(tp=4, cp=4, cp_algorithm="alltoall", global_batch=1), "plan.cp"),
    # Ulysses: 8 heads split 4 ways fine, but 130 tokens do not split over cp 4
    (lambda: tiny_dense(seq=130), dict(cp=4, cp_algorithm="alltoall", global_batch=1),
     "plan.cp"),
    (lambda: transformer_workload("nf", 2, 256, 8, 128, 1000), dict(cp=2, global_batch=1),
     "plan.cp"),
])
def test_rules_name_the_field(workload, fields, field) -> None:  # noqa: ANN001
    with pytest.raises(InputError) as error:
        check_modern_plan(plan(**fields), workload(), node(2))
    assert error.value.field == field


@pytest.mark.parametrize("fields, field", [
    (dict(ep=2, expert_imbalance=3.0), "plan.expert_imbalance"),
    (dict(ep=2, expert_imbalance=0.5), "plan.expert_imbalance"),
    (dict(cp=2, cp_algorithm="tree"), "plan.cp_algorithm"),
    (dict(ep=2, dp=2, micro_batch=1, global_batch=6), "plan.global_batch"),
    (dict(ep=0), "plan.ep"),
])
def test_plan_fields_are_validated(fields, field) -> None:  # noqa: ANN001
    with pytest.raises(InputError) as error:
        modern_plan_from_dict(fields)
    assert error.value.field == field


# ------------------------------------------------------------------ the search

def test_search_over_ep_and_cp_is_exact() -> None:
    """The fast search equals the exhaustive one (every plan through predict_plan) over tp,
    pp, ep, cp and both cp algorithms on 8 GPUs."""
    workload = tiny_moe()
    system = node()
    space = make_modern_space(workload, system, 8, tensor=(1, 2), pipeline=(1, 2),
                              micro_batch=(1, 2), zero=(0, 1), recompute=("none",),
                              expert=(1, 2, 4), context=(1, 2))
    fast = optimize_modern(workload, system, space, top=3, curve=False)
    slow = exhaustive_modern(workload, system, space, 8)
    assert fast.best.step_time_s == pytest.approx(slow[0].step_time_s, rel=1e-9)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in slow[:3]], rel=1e-9)
    assert {(p.plan.expert.degree, p.plan.context.degree) for p in slow} >= {(4, 2), (1, 1)}


def test_optimize_picks_ep_for_mixtral_and_says_why() -> None:
    """Mixtral 8x7B on 64 H100 at 256 sequences of 4k: the winner splits the experts (ep > 1)
    and the explanation names ep and the best plan without it."""
    workload = transformer_workload(
        "mixtral-4k", 32, 4096, 32, 4096, 32000, ffn=14336, kv_heads=8, gated=True,
        norm="rmsnorm", positional="rope", tied_embeddings=False, bias=False, dropout=False,
        flash_attention=True, experts=8, top_k=2)
    system = load_system("dgx-h100:8")
    result = optimize_modern(workload, system, make_modern_space(workload, system, 256),
                             curve=False)
    assert result.best.plan.expert.degree > 1
    assert any(line.startswith("ep ") for line in result.explanation)
    assert any("no expert parallelism" in line for line in result.explanation)


# ------------------------------------------------------------------ the command line

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale", *args], capture_output=True,
                          text=True, timeout=120)


SMALL_MOE = "gpt:layers=2,hidden=256,heads=8,seq=128,vocab=1000,flash=true,experts=4,top_k=2"


def test_predict_json_carries_the_mesh_and_its_parts() -> None:
    done = _cli("predict", "-w", SMALL_MOE, "-c", "dgx-a100-80g:1", "--ep", "4", "--dp", "2",
                "--global-batch", "8", "--json")
    if done.returncode == 2 and "experts" in done.stderr:
        pytest.skip("gpt: has no experts key in this tree")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["mesh"]["sizes"] == {"pp": 1, "dp": 2, "ep": 4, "cp": 1, "tp": 1}
    assert data["mesh"]["devices"] == 8
    assert data["breakdown_s"]["ep_comm"] > 0
    assert data["mesh"]["collectives_s"]["ep"] == data["breakdown_s"]["ep_comm"]
    assert data["plan"]["expert"] == {"degree": 4, "imbalance": 1.0, "tensor": None}


def test_predict_context_parallel_json_and_bad_flags() -> None:
    workload = "gpt:layers=2,hidden=256,heads=8,seq=128,vocab=1000,flash=true"
    done = _cli("predict", "-w", workload, "-c", "dgx-a100-80g:1", "--cp", "2",
                "--cp-algorithm", "alltoall", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["breakdown_s"]["cp_comm"] > 0 and data["mesh"]["sizes"]["cp"] == 2
    bad = _cli("predict", "-w", workload, "-c", "dgx-a100-80g:1", "--cp", "3")
    assert bad.returncode == 2 and "cp" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    dense = _cli("predict", "-w", workload, "-c", "dgx-a100-80g:1", "--ep", "2")
    assert dense.returncode == 2 and "ep" in dense.stderr and "no experts" in dense.stderr


def test_timeline_shows_the_all_to_alls_and_the_ring_exchange() -> None:
    """The report's step timeline draws each micro-batch's ep all-to-alls and cp exchange as
    pieces of its forward and backward passes, which add up to the stage's time."""
    from dnnscale.report.timeline import step_timeline

    workload = transformer_workload("m", 4, 1024, 16, 8192, 32000, flash_attention=True,
                                    experts=8, top_k=2)
    prediction = predict_plan(workload, node(2), plan(pp=2, ep=4, cp=2, global_batch=8,
                                                      cp_algorithm="alltoall"))
    timeline = step_timeline(prediction)
    first = timeline.segments[0]
    pieces = dict(first.pieces)
    stage = prediction.step_record.stages[0]
    assert stage.ep_forward_s > 0 and stage.cp_forward_s > 0
    assert pieces[Part.EP_COMM] == pytest.approx(stage.ep_forward_s, rel=1e-12)
    assert pieces[Part.CP_COMM] == pytest.approx(stage.cp_forward_s, rel=1e-12)
    assert sum(pieces.values()) == pytest.approx(first.seconds, rel=1e-9)
    passes = [s for s in timeline.segments if s.lane == 0 and s.name in ("forward", "backward")]
    drawn = sum(s.seconds for s in passes)
    assert drawn == pytest.approx(prediction.step_record.micro_batches
                                  * stage.micro_batch_s, rel=1e-9)


def test_ep_groups_sit_tp_apart_across_the_cp_ranks() -> None:
    """tp 2 × cp 4 × ep 2 on 8-GPU nodes: Megatron-Core's expert order (etp-ep-edp) puts the
    two ep members 2 ranks apart (ranks 0 and 2: one node, NVLink), not tp · cp = 8 apart
    (two nodes); the experts' gradient group, dp 2 · cp 4 = 8 members, lies tp · ep = 4 apart:
    ranks 0, 4, ..., 28 over 4 nodes, 2 per node."""
    from dnnscale.model.compose import StepContext
    from dnnscale.model.predict import plan_stage_costs
    from dnnscale.plan.mesh import placement
    from dnnscale.system.topology import GroupSpan

    workload = tiny_moe()
    system = node(4)
    the_plan = plan(tp=2, cp=4, ep=2, dp=2, global_batch=4)
    placed = placement(the_plan.mesh, system.topology)
    assert placed[MeshDim.EP].stride == 2 and placed[MeshDim.EP].span == GroupSpan(2, 2)
    context = StepContext(workload, system, the_plan, plan_stage_costs(workload, system,
                                                                        the_plan))
    dense, experts = context.data_parallel_spans(2)
    assert experts == GroupSpan(8, 2)
    assert dense == GroupSpan(16, 4)  # dp · ep · cp = 16 members tp apart: 4 per node


# ------------------------------------------------------------------ expert tensor parallelism

def test_etp_keeps_the_work_and_moves_the_weights_by_hand() -> None:
    """tp 2, ep 2, one node: with etp 2 (the default) each member holds half of each of its 2
    experts, with etp 1 two whole experts: expert weights 2·2,102,272 / (ep · etp) per member
    (bf16: ×2 bytes), dense ones 2·265,216/2 + the embedding and norm /2 as before. The
    experts' FLOPs per member are the same (1 / (tp · cp) of the copies' work either way)."""
    system = node()
    fields = dict(tp=2, ep=2, global_batch=2, sequence_parallel=True)
    same = predict_plan(tiny_moe(), system, plan(**fields))
    whole = predict_plan(tiny_moe(), system, plan(**fields, etp=1))
    experts = 2 * 2_102_272
    weights = {p.name: p.bytes for p in same.memory}["weights"]
    weights1 = {p.name: p.bytes for p in whole.memory}["weights"]
    assert weights1 - weights == pytest.approx(2 * (experts / 2 - experts / 4), rel=1e-12)
    for name in ("block0.expert_up", "block0.expert_down", "block0.expert_act"):
        assert layer(whole, name).work_fraction == pytest.approx(
            layer(same, name).work_fraction, rel=1e-12) == pytest.approx(0.5)
    # etp 1: the experts are whole on each member, no tensor-group exchange around them
    assert layer(whole, "block0.expert_up").comm_s == 0.0
    assert layer(same, "block0.expert_up").comm_s > 0.0


def test_etp_all_to_all_and_its_group_by_hand() -> None:
    """tp 2, etp 1, ep 2 without sequence parallelism: each tensor member exchanges half the
    tokens' copies (the two expert groups of a tensor group take different tokens), 1·64·2·256·2
    = 65,536 B, among ep members 1 rank apart (plan/mesh.expert_stride); with sequence
    parallelism the same 65,536 B."""
    from dnnscale.plan.mesh import placement

    system = node()
    for sp in (False, True):
        prediction = predict_plan(tiny_moe(), system, plan(tp=2, ep=2, global_batch=2, etp=1,
                                                           sequence_parallel=sp))
        assert layer(prediction, "block0.moe_dispatch").ep_comm_s == pytest.approx(
            2 * _alltoall_s(system, 65_536, 2), rel=1e-12)
    the_plan = plan(tp=2, ep=2, global_batch=2, etp=1)
    assert placement(the_plan.mesh, system.topology, 1)[MeshDim.EP].stride == 1
    assert placement(the_plan.mesh, system.topology)[MeshDim.EP].stride == 2


def test_etp_expert_gradients_meet_over_tp_too_by_hand() -> None:
    """tp 4, etp 1, ep 2, dp 4 on 4 nodes of 8: the experts' gradient group is dp · cp · tp /
    etp = 16 members, etp · ep = 2 ranks apart: 4 per node over 4 nodes; with etp = tp it is
    the dp = 4 members tp · ep = 8 apart, one per node."""
    from dnnscale.model.compose import StepContext
    from dnnscale.model.predict import plan_stage_costs
    from dnnscale.system.topology import GroupSpan

    workload, system = tiny_moe(), node(4)
    for etp, span in ((1, GroupSpan(16, 4)), (None, GroupSpan(4, 1))):
        fields = dict(tp=4, ep=2, dp=4, global_batch=8, sequence_parallel=True)
        the_plan = plan(**fields, **({"etp": etp} if etp else {}))
        context = StepContext(workload, system, the_plan,
                              plan_stage_costs(workload, system, the_plan))
        assert context.data_parallel_spans(4)[1] == span
        assert the_plan.expert_replicas == (16 if etp else 4)


@pytest.mark.parametrize("fields, workload, field", [
    (dict(tp=4, etp=3, ep=2, global_batch=2), tiny_moe, "plan.etp"),
    (dict(tp=2, etp=1, global_batch=1), tiny_dense, "plan.etp"),
])
def test_etp_rules(fields, workload, field) -> None:  # noqa: ANN001
    with pytest.raises(InputError) as error:
        check_modern_plan(plan(**fields), workload(), node(2))
    assert error.value.field == field


def test_etp_equal_to_tp_is_the_default_plan() -> None:
    assert plan(tp=2, etp=2, ep=2, global_batch=2) == plan(tp=2, ep=2, global_batch=2)
    from dnnscale.plan.modern import plan_label

    assert "EP2 ETP1" in plan_label(plan(tp=2, etp=1, ep=2, global_batch=2))


def test_etp_exports() -> None:
    """Megatron-LM takes --expert-tensor-parallel-size; Megatron-DeepSpeed's etp 1 is the
    absence of --enable-expert-tensor-parallelism; torchtitan's expert_tensor_parallel_degree
    is etp (1 or tp), other etp refused by both."""
    from dnnscale.export.deepspeed import export_deepspeed
    from dnnscale.export.megatron import export_megatron
    from dnnscale.export.torchtitan import export_torchtitan

    shape = transformer_workload(
        "tiny-llama-moe", 2, 256, 8, 128, 1000, flash_attention=True, experts=4, top_k=2,
        gated=True, norm="rmsnorm", positional="rope", tied_embeddings=False, bias=False,
        dropout=False).transformer
    fields = dict(tp=4, ep=2, dp=1, global_batch=2, sequence_parallel=True, zero=1)
    megatron = export_megatron(plan(**fields, etp=2), shape, "t").files[-1].text.splitlines()
    assert "--expert-tensor-parallel-size 2" in megatron
    assert not any(line.startswith("--expert-tensor") for line in
                   export_megatron(plan(**fields), shape, "t").files[-1].text.splitlines())
    deepspeed = export_deepspeed(plan(**fields, etp=1), shape, "t").files[-1].text.splitlines()
    assert "--enable-expert-tensor-parallelism" not in deepspeed
    assert "--enable-expert-tensor-parallelism" in export_deepspeed(
        plan(**fields), shape, "t").files[-1].text.splitlines()
    titan = export_torchtitan(plan(**{**fields, "zero": 3}, etp=1), shape, "t").files[0].text
    assert "expert_tensor_parallel_degree = 1" in titan
    for export in (export_deepspeed, export_torchtitan):
        with pytest.raises(InputError) as error:
            export(plan(**{**fields, "zero": 3 if export is export_torchtitan else 1}, etp=2),
                   shape, "t")
        assert error.value.field == "plan.etp"


def test_search_over_etp_is_exact() -> None:
    """The fast search equals the exhaustive one with etp 1 and 2 beside tp in the space: the
    groups at tp 4 take etp 1, 2 and 4, at tp 2 etp 1 and 2, at tp 1 only 1."""
    from dnnscale.optimize.modern import groups_of

    workload = tiny_moe()
    system = node()
    space = make_modern_space(workload, system, 8, tensor=(1, 2, 4), pipeline=(1,),
                              micro_batch=(1, 2), zero=(0,), recompute=("none",),
                              expert=(1, 2, 4), context=(1,), expert_tensor=(1, 2))
    by_tp = {}
    for group in groups_of(space, workload):
        by_tp.setdefault(group.tensor, set()).add(group.etp)
    assert by_tp == {1: {None}, 2: {None, 1}, 4: {None, 1, 2}}
    fast = optimize_modern(workload, system, space, top=3, curve=False)
    slow = exhaustive_modern(workload, system, space, 8)
    assert fast.best.step_time_s == pytest.approx(slow[0].step_time_s, rel=1e-9)
    assert [p.step_time_s for p in fast.top] == pytest.approx(
        [p.step_time_s for p in slow[:3]], rel=1e-9)
    assert any(p.plan.expert.tensor == 1 for p in slow)
