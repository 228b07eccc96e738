"""What an overlapping plan hides of a linear layer's tensor-parallel exchanges under its GEMMs,
by how the engine overlaps them (plan/plan.py TP_OVERLAP_METHODS; issue 23).

Both methods cut an exchange and its GEMM into tp chunks, each chunk travelling while the GEMM
works on another (network.chunked_exposed_s), and slow the GEMM while they overlap it
(network.exposed_with_contention_s). They differ in which exchanges they reach:

- 'userbuffers' (Transformer Engine, Megatron-LM's --tp-comm-overlap): every all-gather and
  reduce-scatter of the block's linear layers, forward and backward;
- 'micro_pipeline' (torch's async TP, torchtitan): torch/_inductor/fx_passes/
  micro_pipeline_tp.py fuses an all-gather with the matmuls that read its result, and a
  reduce-scatter only with the single matmul whose output it reduces (_find_producer_matmul:
  an mm, a scaled mm, or one between two reshapes). Where one gathered input feeds several
  Linear modules, its gradient is their input gradients' sum, and the backward reduce-scatter
  of that sum runs after the GEMMs, exposed.
"""

from __future__ import annotations

from typing import NamedTuple

from dnnscale.model.network import chunked_exposed_s, exposed_with_contention_s
from dnnscale.workload.layer import Layer


def linears_reading_gather(layer: Layer) -> int:
    """How many Linear modules read the one gathered input of `layer` in torchtitan's models
    (the engine that runs 'micro_pipeline'): 3 for a QKV projection (Attention's wq, wk, wv),
    2 for a gated MLP's first linear (FeedForward's w1 and w3), else 1 (the model prices each
    of those as one GEMM layer). Source: torchtitan 9dec370, models/llama/model.py, and
    parallelisms/parallelize_llama.py apply_tp, which gathers the attention's and the feed-
    forward's input once (PrepareModuleInput to Replicate) for those colwise linears."""
    if layer.kind == "attn_qkv":
        return 3
    if layer.kind == "mlp_up" and layer.hyper.get("gated"):
        return 2
    return 1


class HiddenExchange(NamedTuple):
    """Seconds of a layer's tensor-parallel exchanges an overlapping plan hides: `forward` and
    `backward` under 'userbuffers'; `unfused`, the part of `backward` that 'micro_pipeline'
    does not hide."""

    forward: float
    backward: float
    unfused: float


def hidden_exchange(layer: Layer, forward_tp_s: float, backward_tp_s: float,
                    backward_reduce_scatter_s: float, forward_compute_s: float,
                    backward_compute_s: float, chunks: int, slowdown: float) -> HiddenExchange:
    """What `chunks` (tp) chunked overlap hides of a linear layer's forward and backward
    exchanges (`forward_tp_s`, `backward_tp_s`, of which `backward_reduce_scatter_s` are
    reduce-scatters) under its forward and backward GEMMs.

    Formula: per phase, hidden = T_c − exposed_with_contention(T_c, chunked_exposed(T_c, T_x,
    k)). `unfused` = hidden_backward − the same over T_c − T_rs when several Linear modules
    read the layer's gathered input (`linears_reading_gather` > 1), else 0: torch's pass
    leaves that reduce-scatter out of the chunked overlap.
    Units: s -> s.
    Source: network.chunked_exposed_s (Wang et al., ASPLOS 2023) and
    exposed_with_contention_s (Lee et al., arXiv 2507.03114); torch 2.13,
    torch/_inductor/fx_passes/micro_pipeline_tp.py (fuse_matmul_reduce_scatter,
    _find_producer_matmul) for what the micro-pipeline leaves out.
    """

    def hidden(comm_s: float, compute_s: float) -> float:
        if comm_s <= 0:
            return 0.0
        return comm_s - exposed_with_contention_s(
            comm_s, chunked_exposed_s(comm_s, compute_s, chunks), slowdown)

    backward = hidden(backward_tp_s, backward_compute_s)
    unfused = 0.0
    if linears_reading_gather(layer) > 1 and backward_reduce_scatter_s > 0:
        unfused = backward - hidden(backward_tp_s - backward_reduce_scatter_s,
                                    backward_compute_s)
    return HiddenExchange(hidden(forward_tp_s, forward_compute_s), backward, unfused)
