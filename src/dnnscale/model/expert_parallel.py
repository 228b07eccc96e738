"""Expert parallelism (the mesh's ep): the token exchange around the experts and the load of the
busiest expert-parallel member (docs/model.md, "Mixture of experts and long context").

A mixture-of-experts layer (workload/moe_kinds.py) routes each of a member's b·s/cp tokens to k
experts. With ep members each holding E/ep experts, a member sends the routed copies to the
members holding their experts (the dispatch all-to-all) and gets the outputs back (the combine
all-to-all), forward and, mirrored, backward: four all-to-alls per MoE layer and micro-batch.
At uniform routing every member computes b·(s/cp)·k token copies, whatever ep; ep divides the
experts' weights, not their FLOPs. The busiest member gets `imbalance` times the mean (a plan
parameter, 1 by default), capped at the capacity factor where the workload drops tokens above
it; its all-to-all receives and its expert GEMMs grow by that factor, and every member waits
for it.

Each member runs its E/ep local experts as E/ep GEMMs of b·(s/cp)·k·ep/E tokens each (a grouped
GEMM is one launch of them); their achieved efficiency is the device curve's at that size.
"""

from __future__ import annotations

from dnnscale.model.mesh_split import MeshSplit
from dnnscale.model.sharding import PHASE_BACKWARD, PHASE_FORWARD, CommEvent, SplitContext
from dnnscale.plan.mesh import MeshDim
from dnnscale.workload.kind_record import record_of
from dnnscale.workload.layer import Layer


EXPERT_WORK_KINDS = ("expert_up", "expert_act", "expert_down")
"""The routed experts' layers, whose work the busiest ep member's load scales."""


def expert_load_factor(imbalance: float, capacity_factor: float | None) -> float:
    """The busiest expert-parallel member's routed tokens over the mean.

    Formula: min(imbalance, c) with a capacity factor c (tokens over c times the mean are
    dropped, Fedus et al. 2022 §2.2), imbalance when dropless.
    Units: ratio.
    Source: Switch Transformer (Fedus et al., JMLR 2022) capacity; Megatron-Core's
    --moe-expert-capacity-factor (dropless without it).
    """
    return min(imbalance, capacity_factor) if capacity_factor is not None else imbalance


def _capacity(layer: Layer) -> float | None:
    value = layer.hyper.get("capacity_factor")
    return float(value) if isinstance(value, (int, float)) else None


def expert_work_factor(layer: Layer, split: MeshSplit) -> float:
    """The busiest member's share of an expert layer's work over the uniform share: its load
    factor for the routed experts' layers (their GEMMs and activation), 1 for others."""
    if layer.kind not in EXPERT_WORK_KINDS:
        return 1.0
    return expert_load_factor(split.imbalance, _capacity(layer))


def expert_gemm_calls(layer: Layer, split: MeshSplit) -> int:
    """GEMMs a member runs per phase of an expert linear: its E / ep local experts."""
    if not record_of(layer).expert:
        return 1
    experts = layer.hyper.get("experts")
    return max(1, int(experts) // split.ep) if isinstance(experts, int) else 1


def dispatch_bytes(layer: Layer, split: MeshSplit, context: SplitContext,
                   partitions: int = 1) -> float:
    """Bytes of the routed token copies one member sends (and the busiest receives) in one
    dispatch or combine all-to-all, per micro-batch.

    Formula: b · (s / cp) / t_sp · k · h · bytes · load (load = expert_load_factor): the
    member's tokens, k copies each, h values each; t_sp = tp under sequence parallelism, where
    each tensor-parallel member holds and exchanges 1/tp of the tokens and the copies are then
    gathered over tp for the tensor-split experts (AG(TP), priced on the expert linears,
    model/megatron_rules.py); t_sp = 1 without, where every tensor-parallel member exchanges
    the whole of its tokens' copies (DeepSpeed-MoE with expert tensor parallelism), and with
    etp < tp each of the tp / etp expert groups of a tensor group its share, t_sp = tp / etp
    (DeepSpeed-MoE's drop_tokens before the exchange when the experts are not tensor split).
    Units: bytes.
    Source: Megatron-Core's MoEAlltoAllTokenDispatcher, workflow "A2A(EP) -> AG(TP) ->
    experts -> RS(TP) -> A2A(EP)" on the sequence-parallel input (transformer/moe/
    token_dispatcher.py at NVIDIA/Megatron-LM d98e8a64; MoE with tp > 1 requires sequence
    parallelism); Rajbhandari et al. 2022 (DeepSpeed-MoE) §4.
    """
    seq, hidden, top_k = (layer.hyper.get(key) for key in ("seq", "hidden", "top_k"))
    if not (isinstance(seq, int) and isinstance(hidden, int) and isinstance(top_k, int)):
        return 0.0
    load = expert_load_factor(split.imbalance, _capacity(layer))
    # under sequence parallelism each tp member exchanges its own tokens; without, the tp / etp
    # expert groups of a tensor group take different tokens (DeepSpeed-MoE's drop_tokens)
    sequence_split = (partitions if context.sequence_parallel
                      else partitions // split.expert_tensor(partitions))
    return (context.minibatch * seq * split.token_fraction * top_k * hidden
            * context.bytes_per_value * load / sequence_split)


def expert_exchange_events(layer: Layer, split: MeshSplit, context: SplitContext,
                           partitions: int = 1) -> tuple[CommEvent, ...]:
    """The all-to-alls over ep of a dispatch or combine layer (`dispatch_bytes` at the
    stage's tp, `partitions`): one forward, one backward (the gradients travel the reverse
    way); none with ep = 1 or for other kinds."""
    if split.ep <= 1 or record_of(layer).expert_exchange is None:
        return ()
    payload = dispatch_bytes(layer, split, context, partitions)
    return (CommEvent("alltoall", payload, split.ep, PHASE_FORWARD, MeshDim.EP),
            CommEvent("alltoall", payload, split.ep, PHASE_BACKWARD, MeshDim.EP))
