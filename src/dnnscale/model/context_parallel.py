"""Context parallelism (the mesh's cp): each sample's sequence split over cp members, and how
attention sees the whole sequence anyway (docs/model.md, "Mixture of experts and long context").

Every layer works on the member's s / cp tokens (1/cp of its work, its tensor-parallel
exchanges 1/cp as large). Attention needs every key and value, by one of two algorithms:

- ring (ring attention; Liu, Zaharia & Abbeel 2023; Megatron-Core / Transformer Engine's
  context parallelism): cp steps; at each the member computes its queries against the K/V
  block it holds while passing that block on to the next member of the ring. The causal mask
  is balanced by splitting the sequence into 2·cp chunks, member i holding chunks i and
  2·cp − 1 − i, so every member does 1/cp of the attention FLOPs. Forward passes K and V
  (cp − 1 sends), backward passes K, V and their gradients (2 blocks per step). A send hides
  behind the step's compute when it is shorter; only the excess is exposed.
- alltoall (DeepSpeed-Ulysses; Jacobs et al. 2023): an all-to-all over cp turns the sequence
  split of Q, K, V into a head split (each member a/(cp·tp) heads over the whole sequence),
  attention runs locally, and an all-to-all turns the output back; backward the same for the
  gradients. Nothing overlaps.
"""

from __future__ import annotations

from dnnscale.model.mesh_split import MeshSplit
from dnnscale.model.network import exposed_with_contention_s, transfer_time_s
from dnnscale.model.sharding import PHASE_BACKWARD, PHASE_FORWARD, CommEvent, SplitContext
from dnnscale.plan.mesh import MeshDim
from dnnscale.system.topology import LinkTier
from dnnscale.workload.kind_record import KernelClass, record_of
from dnnscale.workload.layer import Layer

RING_BACKWARD_BLOCKS = 2
"""Blocks a ring-attention backward step passes on: K|V and dK|dV (Transformer Engine's
AttnFuncWithCPAndKVP2P backward sends the K/V block and the accumulated dK/dV)."""


def is_ring_attention(layer: Layer, split: MeshSplit) -> bool:
    """Whether `layer` is fused attention run as ring attention (cp > 1, ring)."""
    return (split.cp > 1 and split.cp_algorithm == "ring"
            and record_of(layer).kernel is KernelClass.FLASH)


def _dims(layer: Layer) -> tuple[int, int, int] | None:
    seq, hidden, heads, kv_heads = (layer.hyper.get(k) for k in ("seq", "hidden", "heads",
                                                                  "kv_heads"))
    if not all(isinstance(v, int) for v in (seq, hidden, heads, kv_heads)):
        return None
    assert isinstance(seq, int) and isinstance(hidden, int) and isinstance(heads, int) \
        and isinstance(kv_heads, int)
    return seq, hidden, kv_heads * (hidden // heads)


def ring_block_bytes(layer: Layer, split: MeshSplit, tp: int, context: SplitContext) -> float:
    """One K|V block a ring-attention member passes on per step, per micro-batch.

    Formula: b · (s / cp) · 2 · h_kv / tp · bytes (K and V of the member's tokens, its
    tensor-parallel share of the key/value heads).
    Units: bytes.
    Source: Liu et al. 2023 (Ring Attention) §3; Megatron-Core context parallelism (K/V
    blocks sent point to point around the cp group).
    """
    dims = _dims(layer)
    if dims is None:
        return 0.0
    seq, _, kv_hidden = dims
    return context.minibatch * seq / split.cp * 2 * kv_hidden / tp * context.bytes_per_value


def ring_exposed_s(block_bytes: float, cp: int, tier: LinkTier, forward_s: float,
                   backward_s: float, slowdown: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds of a ring-attention pass's exchange not hidden behind its
    compute, for a member whose attention takes `forward_s` and `backward_s` in all, with the
    compute's slowdown beside the hidden sends (network.exposed_with_contention_s, `slowdown`
    the device's κ).

    Formula: t_x = x / B + α, one block over the slowest tier the cp ring crosses; the pass is
    cp steps of compute t/cp, each of the last cp − 1 waiting for its block, so the exposed
    time is (cp − 1) · max(0, n · t_x − t/cp), n = 1 forward (K|V) and 2 backward (K|V and
    dK|dV, RING_BACKWARD_BLOCKS), of the (cp − 1) · n · t_x sent in all.
    Units: bytes, count, bytes/s, s -> s.
    Source: Liu et al. 2023 §3 (the exchange overlaps the block's compute when compute per
    block ≥ transfer); Transformer Engine's ring attention (double-buffered P2P sends).
    """
    if cp <= 1 or block_bytes <= 0:
        return 0.0, 0.0
    send_s = transfer_time_s(block_bytes, 1, tier.bandwidth_bytes_per_s, tier.latency_s)
    steps = cp - 1
    phases = ((send_s, forward_s), (RING_BACKWARD_BLOCKS * send_s, backward_s))
    forward, backward = (exposed_with_contention_s(steps * sent, steps * max(0.0, sent - t / cp),
                                                   slowdown) for sent, t in phases)
    return forward, backward


def ring_bytes_per_pass(block_bytes: float, cp: int) -> tuple[float, float]:
    """(forward, backward) bytes a member sends in one ring-attention pass: (cp − 1) blocks
    forward, 2 · (cp − 1) backward."""
    steps = max(0, cp - 1)
    return steps * block_bytes, RING_BACKWARD_BLOCKS * steps * block_bytes


def ulysses_events(layer: Layer, split: MeshSplit, tp: int,
                   context: SplitContext) -> tuple[CommEvent, ...]:
    """The all-to-alls over cp around fused attention under the Ulysses algorithm: forward
    Q|K|V in and the output back, backward the output's gradient in and Q|K|V's back.

    Formula: payloads per member b · (s / cp) · (h + 2·h_kv) / tp · bytes (Q|K|V) and
    b · (s / cp) · h / tp · bytes (the output), each an all-to-all among cp members.
    Units: bytes.
    Source: Jacobs et al. 2023 (DeepSpeed-Ulysses) §3: communication volume per member
    4·N·h/P for Q, K, V and O with P members.
    """
    if split.cp <= 1 or split.cp_algorithm != "alltoall" or \
            record_of(layer).kernel is not KernelClass.FLASH:
        return ()
    dims = _dims(layer)
    if dims is None:
        return ()
    seq, hidden, kv_hidden = dims
    tokens = context.minibatch * seq / split.cp * context.bytes_per_value / tp
    qkv, out = tokens * (hidden + 2 * kv_hidden), tokens * hidden
    return (CommEvent("alltoall", qkv, split.cp, PHASE_FORWARD, MeshDim.CP),
            CommEvent("alltoall", out, split.cp, PHASE_FORWARD, MeshDim.CP),
            CommEvent("alltoall", out, split.cp, PHASE_BACKWARD, MeshDim.CP),
            CommEvent("alltoall", qkv, split.cp, PHASE_BACKWARD, MeshDim.CP))


def attention_kernel_shape(layer: Layer, split: MeshSplit) -> tuple[int, bool] | None:
    """(sequence length, causal) the fused attention kernel runs at, for its published speed:
    ring attention's blocks are s / cp long and, but for the diagonal one, unmasked; Ulysses
    runs the whole sequence on fewer heads (the layer's own shape); None for the layer's own."""
    if not is_ring_attention(layer, split):
        return None
    seq = layer.hyper.get("seq")
    if not isinstance(seq, int):
        return None
    return max(1, seq // split.cp), False
