"""Stage costs: one pipeline stage of one replica, split over a tensor group, per step.

The per-worker compute and split-caused communication of the most loaded member, layer by layer,
computed once per (tensor split, micro-batch) and reused by every aggregation (PS async, PS sync,
collectives) and by the optimizer. Under Project Adam's plans a replica is one stage and its P
workers are the tensor group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from operator import add
from typing import NamedTuple

from dataclasses import replace

from dnnscale.model.collectives import collective_transfer, span_members
from dnnscale.model.compute import cpu_phase_times_s
from dnnscale.model.context_parallel import (attention_kernel_shape, is_ring_attention,
                                             ring_block_bytes, ring_exposed_s, ulysses_events)
from dnnscale.model.expert_parallel import (EXPERT_WORK_KINDS, expert_exchange_events,
                                            expert_gemm_calls, expert_work_factor)
from dnnscale.model.gpu_compute import (TRANSPOSES_PER_CALL, bias_gradient_s,
                                        fp8_cast_launches, gpu_phase_times_s,
                                        input_gradient_sum_s, projection_shares,
                                        reduces_bias_gradient, transposes_layout)
from dnnscale.model.megatron_rules import (  # importing it registers Megatron's sharding rules
    input_share, output_share)
from dnnscale.model.mesh_split import NO_SPLIT, MeshSplit
from dnnscale.model.quota import collective_after_compute_s
from dnnscale.model.sharding import PHASE_FORWARD, Shard, SplitContext, shard_layer
from dnnscale.model.tp_overlap import HiddenExchange, hidden_exchange
from dnnscale.model.zero3_fetch import TensorRun
from dnnscale.plan.mesh import MeshDim, Placement, placement
from dnnscale.plan.plan import MICRO_PIPELINE
from dnnscale.plan.rules import layer_splits_into
from dnnscale.system.system import System
from dnnscale.workload.kind_record import KernelClass, Recompute, layer_kind, record_of
from dnnscale.workload.layer import Layer
from dnnscale.workload.splits import split_extent, split_schemes
from dnnscale.workload.workload import Workload


class LayerCost(NamedTuple):
    """One layer's cost on the most loaded worker of a replica, per step."""

    name: str
    kind: str
    scheme: str
    work_fraction: float
    forward_s: float
    input_grad_s: float
    weight_grad_s: float
    comm_bytes: float
    comm_messages: float
    comm_s: float
    replicated_params: int = 0
    """Parameters every worker holds whole (a stripe-split conv's kernel), else 0."""
    comm_forward_s: float = 0.0
    """The part of comm_s spent in the forward phase (recomputed with the forward)."""
    block: int | None = None
    forward_launches: int = 0
    """Kernels (compute and collectives) the host launches for the forward phase."""
    backward_launches: int = 0
    activation_values: float = 0.0
    """Work fraction × the values per sample the layer keeps (Layer.kept_values: its outputs,
    0 for a layer run in place): what this member keeps of it."""
    ep_comm_s: float = 0.0
    """Expert parallelism's all-to-alls (dispatch, combine), forward and backward."""
    cp_comm_s: float = 0.0
    """Context parallelism's exchange: ring attention's exposed sends or Ulysses' all-to-alls."""
    ep_forward_s: float = 0.0
    cp_forward_s: float = 0.0
    comm_hidden_s: float = 0.0
    """The part of comm_s that runs under the layer's own GEMMs when the plan overlaps its
    tensor-parallel exchanges (tp chunks, network.chunked_exposed_s); 0 for layers the
    overlap does not reach."""
    comm_hidden_forward_s: float = 0.0
    """The part of comm_hidden_s in the forward phase."""
    comm_forward_rerun_s: float = 0.0
    """The forward tp exchanges other than reduce-scatters (all-gathers, all-reduces): what
    per-operation checkpointing runs again, its save list keeping reduce-scatters' outputs."""
    comm_unfused_s: float = 0.0
    """The part of comm_hidden_s that torch's micro-pipelined overlap does not hide: the
    backward reduce-scatter of a gradient summed over several Linear modules
    (model/tp_overlap.py)."""

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def mesh_comm_s(self) -> float:
        """Communication the layer's splits cause over tp, ep and cp together."""
        return self.comm_s + self.ep_comm_s + self.cp_comm_s


class StageTotals(NamedTuple):
    """Sums over a stage's layers that the composition and the memory model read; additive, so
    a stage of n identical blocks is n times one block's totals plus its other layers."""

    forward_s: float = 0.0
    input_grad_s: float = 0.0
    weight_grad_s: float = 0.0
    partition_s: float = 0.0
    partition_bytes: float = 0.0
    replicated_params: float = 0.0
    recompute_full_s: float = 0.0
    recompute_selective_s: float = 0.0
    launches: float = 0.0
    launches_full: float = 0.0
    launches_selective: float = 0.0
    activation_values: float = 0.0
    """Σ work fraction × output values per sample, every layer (Adam's memory model)."""
    outside_activation_values: float = 0.0
    """The same over the layers outside transformer blocks."""
    expert_comm_s: float = 0.0
    context_comm_s: float = 0.0
    expert_forward_s: float = 0.0
    context_forward_s: float = 0.0
    partition_hidden_s: float = 0.0
    """Σ comm_hidden_s: the tensor-parallel exchanges an overlapping plan hides."""
    recompute_full_hidden_s: float = 0.0
    """Σ comm_hidden_forward_s over the block layers: what it hides of a full recompute."""
    recompute_op_s: float = 0.0
    """What per-operation checkpointing runs again (`per_op_recompute_share`)."""
    launches_op: float = 0.0
    loss_values: float = 0.0
    """Σ work fraction × output values of the loss layers (`cross_entropy`): the logits the
    member's loss reads, one per vocabulary entry per position (model/memory.loss_bytes)."""
    partition_unfused_s: float = 0.0
    """Σ comm_unfused_s: what of partition_hidden_s a 'micro_pipeline' overlap leaves exposed."""
    blocks: float = 0.0
    """Transformer blocks in the stage."""
    expert_blocks: float = 0.0
    """Those of them whose MLP is a mixture of experts (the rest have a dense MLP)."""

    @classmethod
    def of(cls, layers: Sequence[LayerCost]) -> "StageTotals":
        rows = []
        blocks, expert_blocks = set(), set()
        for layer in layers:
            in_block = layer.block is not None
            record = layer_kind(layer.kind)
            # selective recomputation recomputes the attention core (its record says so)
            attention = record.recompute is Recompute.ATTENTION_CORE
            per_op = per_op_recompute_share(record.kernel) if in_block else 0.0
            rows.append((
                layer.forward_s, layer.input_grad_s, layer.weight_grad_s, layer.comm_s,
                layer.comm_bytes, layer.replicated_params,
                layer.forward_s + layer.comm_forward_s + layer.ep_forward_s
                + layer.cp_forward_s if in_block else 0.0,
                layer.forward_s if attention else 0.0,
                layer.forward_launches + layer.backward_launches,
                layer.forward_launches if in_block else 0,
                layer.forward_launches if attention else 0,
                layer.activation_values,
                0.0 if in_block else layer.activation_values,
                layer.ep_comm_s, layer.cp_comm_s, layer.ep_forward_s,
                layer.cp_forward_s, layer.comm_hidden_s,
                layer.comm_hidden_forward_s if in_block else 0.0,
                per_op * layer.forward_s
                + (layer.comm_forward_rerun_s if in_block else 0.0),
                per_op * layer.forward_launches,
                layer.activation_values if layer.kind == "cross_entropy" else 0.0,
                layer.comm_unfused_s))
            if in_block:
                blocks.add(layer.block)
                if record.expert:
                    expert_blocks.add(layer.block)
        # each column summed in layer order, from 0.0 (a left fold: the same sums as adding
        # layer by layer)
        columns = (zip(*rows) if rows else ((),) * (len(cls._fields) - 2))
        sums = [reduce(add, column, 0.0) for column in columns]
        sums += (float(len(blocks)), float(len(expert_blocks)))
        return cls(*sums)

    def plus(self, other: "StageTotals", times: float = 1.0) -> "StageTotals":
        return StageTotals(*(a + times * b for a, b in zip(self, other)))


@dataclass(frozen=True)
class StageCosts:
    """Per-worker, per-micro-batch costs of one stage (most loaded tensor-parallel member).

    `layers` holds every layer's cost when the stage was costed layer by layer (predict); the
    optimizer's search builds stages from one block's totals times the blocks they hold and
    leaves it empty. `boundary_values`: values per sample the stage's last layer hands on (a
    pipeline boundary's activation for workloads without a transformer shape).
    """

    partitions: int
    minibatch: int
    layers: tuple[LayerCost, ...]
    params: int = 0
    """W_stage: parameters of the stage's layers (all of a replica's for one stage)."""
    totals: StageTotals = StageTotals()
    """The sums the composition reads: StageTotals.of(layers) when costed layer by layer."""
    boundary_values: int = 0
    expert_params: int = 0
    """The part of `params` in routed experts' layers (split over ep, reduced over dp · cp)."""
    unit_params: int = 0
    """The most parameters one FSDP unit of the stage holds: its largest transformer block, or
    its layers outside the blocks together (the root unit: embeddings, final norm, output);
    the stage's `params` where it has no blocks (`largest_unit_params`)."""
    units: int = 1
    """The FSDP units of the stage (`unit_count`): its transformer blocks, and one more for its
    layers outside the blocks where they hold parameters."""
    tensors: TensorRun = TensorRun()
    """The stage's parameter tensors in forward order, for DeepSpeed's bucketed ZeRO-3
    (model/zero3_fetch.py)."""
    hooked_params: int = 0
    """The part of `params` in layers whose kind is not a GEMM (norms, embeddings): the weights
    whose gradients Megatron's fused gradient accumulation still adds by a hook
    (`hooked_params_of`, model/accumulation.py)."""

    @property
    def forward_s(self) -> float:
        return self.totals.forward_s

    @property
    def input_grad_s(self) -> float:
        return self.totals.input_grad_s

    @property
    def weight_grad_s(self) -> float:
        return self.totals.weight_grad_s

    @property
    def compute_s(self) -> float:
        """T_comp: forward + both backward phases on the most loaded worker."""
        return self.forward_s + self.input_grad_s + self.weight_grad_s

    @property
    def partition_bytes(self) -> float:
        return self.totals.partition_bytes

    @property
    def partition_s(self) -> float:
        """T_mp: time in split-caused (tensor-group) communication."""
        return self.totals.partition_s

    def exposed_partition_s(self, overlap: str | None) -> float:
        """T_mp as the plan runs it: less what the GEMMs hide when it overlaps its
        tensor-parallel exchanges, by the method `overlap` names (TensorSplit.overlap_mode;
        None: no overlap). 'micro_pipeline' hides less the unfused reduce-scatters."""
        if overlap is None:
            return self.partition_s
        unfused = self.totals.partition_unfused_s if overlap == MICRO_PIPELINE else 0.0
        return self.partition_s - (self.totals.partition_hidden_s - unfused)

    @property
    def expert_comm_s(self) -> float:
        """T_ep: expert parallelism's all-to-alls per micro-batch."""
        return self.totals.expert_comm_s

    @property
    def context_comm_s(self) -> float:
        """T_cp: context parallelism's exposed exchange per micro-batch."""
        return self.totals.context_comm_s

    def work_s(self, recompute: str, overlap: str | None) -> float:
        """A micro-batch's compute and recompute on a median device: what the wait for the
        slowest device scales (model/stragglers.slowest_device_factor)."""
        return self.compute_s + self.recompute_s(recompute, overlap is not None)

    def exposed_comm_s(self, overlap: str | None) -> float:
        """A micro-batch's exposed tensor-, expert- and context-parallel communication."""
        return self.exposed_partition_s(overlap) + self.expert_comm_s + self.context_comm_s

    @property
    def replicated_params(self) -> int:
        """W_rep: parameters that every worker of the replica holds whole (stripe-split convs,
        Megatron's norms)."""
        return int(self.totals.replicated_params)

    @property
    def blocks(self) -> int:
        return int(self.totals.blocks)

    @property
    def expert_blocks(self) -> int:
        """Blocks whose MLP is a mixture of experts."""
        return int(self.totals.expert_blocks)

    def stored_params(self, params: int) -> int:
        """Parameters the replica's P workers hold together, W + (P−1)·W_rep: what they push,
        pull, all-reduce and the shards store (every stripe worker keeps the whole kernel)."""
        return params + (self.partitions - 1) * self.replicated_params

    def launches(self, recompute: str) -> int:
        """Kernels the host launches per micro-batch: forward, backward and recomputed ones."""
        extra = {"full": self.totals.launches_full,
                 "selective": self.totals.launches_selective,
                 "op": self.totals.launches_op}.get(recompute, 0.0)
        return int(self.totals.launches + extra)

    def recompute_s(self, recompute: str, overlap: bool = False) -> float:
        """Forward work recomputed in the backward pass: 'full' every block layer's forward
        (with its tensor-parallel communication, less what the GEMMs hide of it when the plan
        overlaps it), 'selective' the attention core, 'op' what per-operation checkpointing
        runs again (`per_op_recompute_share`, and the forward all-gathers), else 0."""
        if recompute == "full":
            return self.totals.recompute_full_s - (
                self.totals.recompute_full_hidden_s if overlap else 0.0)
        return {"selective": self.totals.recompute_selective_s,
                "op": self.totals.recompute_op_s}.get(recompute, 0.0)


PER_OP_RECOMPUTE_SHARE = {KernelClass.GEMM: 0.5, KernelClass.FLASH: 0.0}
"""The share of a block layer's forward that per-operation checkpointing runs again, by its
kernel class (every other kind: all of it). torchtitan's policy (v0.2.2, distributed/
activation_checkpoint.py, with models/llama3/infra/parallelize.py's _op_sac_save_list) keeps
the outputs of the ops in its save list, mm and the SDPA kernels among them, except every
second mm, and recomputes the rest. Its mm counter runs on across micro-batches; a Llama block
makes 7 mm calls (wq, wk, wv, wo, w1, w3, w2), an odd count, so the recomputed ones alternate
between {wk, wo, w3} and {wq, wv, w1, w2}: each GEMM's forward runs again every second
micro-batch, half of it on average. The attention kernel is kept whole."""


def per_op_recompute_share(kernel: KernelClass) -> float:
    """The share of a block layer's forward per-operation checkpointing runs again
    (PER_OP_RECOMPUTE_SHARE; 1 for memory-bound and unfused attention kinds)."""
    return PER_OP_RECOMPUTE_SHARE.get(kernel, 1.0)


def _layer_cost(layer: Layer, shard: Shard, minibatch: int, system: System, placed: Placement,
                skip_weight_grad: bool, precision: str, bytes_scale: float,
                split: MeshSplit = NO_SPLIT, context: SplitContext | None = None,
                partitions: int = 1) -> LayerCost:
    """One layer's phases on its shard, and each of the shard's events on the group of the
    event's mesh dimension (its `members` placed by `placed`): tp events as the split's
    communication, ep and cp events apart; ring attention's exposed exchange
    (model/context_parallel.py) on the cp group."""
    device = system.machine
    if device.is_accelerator:
        calls = expert_gemm_calls(layer, split)
        # the weights a member holds: its tensor share (the work's, less the token share and
        # the load), and of a routed expert layer's its E / ep experts
        tensor_share = shard.work_fraction / (_token_share(layer, split, partitions)
                                              * expert_work_factor(layer, split))
        weights = tensor_share / split.ep if record_of(layer).expert else tensor_share
        fwd, ing, wg = gpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         precision, bytes_scale, skip_weight_grad, calls,
                                         attention_kernel_shape(layer, split), weights)
    else:
        fwd, ing, wg = cpu_phase_times_s(layer, shard.work_fraction, minibatch, device,
                                         skip_weight_grad)
    comm_bytes = comm_messages = 0.0
    seconds_by = {MeshDim.TP: [0.0, 0.0], MeshDim.EP: [0.0, 0.0], MeshDim.CP: [0.0, 0.0]}
    rerun_s = 0.0  # forward tp exchanges other than reduce-scatters
    backward_rs_s = 0.0  # backward tp reduce-scatters
    casts = fp8_cast_launches(layer, precision) if device.is_accelerator else (0, 0)
    per_call = (1 + TRANSPOSES_PER_CALL if device.is_accelerator
                and transposes_layout(layer, precision, device) else 1)  # kernels per phase
    projections = len(projection_shares(layer)) if device.is_accelerator else 1
    launches = [int(fwd > 0) * per_call * projections + casts[0],
                (int(ing > 0) + int(wg > 0)) * per_call * projections + casts[1]]
    if (device.is_accelerator and context is not None and wg > 0
            and reduces_bias_gradient(layer, precision)):
        # the bias gradients, reductions of the output gradient the member holds
        outputs = output_share(layer, shard, partitions, context) * minibatch * math.prod(
            layer.output_shape)
        wg += bias_gradient_s(device, outputs, context.bytes_per_value)
        launches[1] += projections
    if projections > 1 and context is not None and ing > 0:
        # the separate projections' input gradients, summed
        inputs = (input_share(layer, shard, partitions, context) * minibatch
                  * layer.output_shape[0] * (layer.in_features or 0))
        ing += input_gradient_sum_s(device, projections, inputs, context.bytes_per_value)
        launches[1] += 1
    library, topology = system.collective_library, system.topology
    for event in shard.events:
        launches[event.phase != PHASE_FORWARD] += 1
        if event.dimension is MeshDim.TP:
            transfer = collective_transfer(event.operation, library, event.payload_bytes,
                                           event.members)
            comm_bytes += transfer.bytes
            comm_messages += transfer.messages
        span = placed[event.dimension].span_of(span_members(event.operation, event.members))
        seconds = collective_after_compute_s(system, event.operation, event.payload_bytes, span,
                                             topology)
        total = seconds_by.setdefault(event.dimension, [0.0, 0.0])
        total[0] += seconds
        if event.phase == PHASE_FORWARD:
            total[1] += seconds
            if event.dimension is MeshDim.TP and event.operation != "reduce_scatter":
                rerun_s += seconds
        elif event.dimension is MeshDim.TP and event.operation == "reduce_scatter":
            backward_rs_s += seconds
    if context is not None and is_ring_attention(layer, split):
        # cp kernels per phase (one per K/V block) and the sends between them
        launches[0] += 2 * (split.cp - 1)
        launches[1] += 2 * (split.cp - 1)
        forward_s, backward_s = ring_exposed_s(
            ring_block_bytes(layer, split, partitions, context), split.cp,
            placed[MeshDim.CP].tier, fwd, ing + wg, device.overlap_slowdown)
        cp_total = seconds_by[MeshDim.CP]
        cp_total[0] += forward_s + backward_s
        cp_total[1] += forward_s
    block = layer.hyper.get("block")
    tp_s, ep_s, cp_s = (seconds_by[d] for d in (MeshDim.TP, MeshDim.EP, MeshDim.CP))
    hidden = HiddenExchange(0.0, 0.0, 0.0)
    record = record_of(layer)
    if device.is_accelerator and record.fp8_gemm and not record.expert and tp_s[0] > 0:
        # Transformer Engine's linear modules (the fp8_gemm kinds) run their all-gather or
        # reduce-scatter in tp chunks under the GEMM of the same phase; the routed experts'
        # exchanges are the token dispatcher's, outside the userbuffers overlap
        hidden = hidden_exchange(layer, tp_s[1], tp_s[0] - tp_s[1], backward_rs_s, fwd,
                                 ing + wg, partitions, device.overlap_slowdown)
    return LayerCost(layer.name, layer.kind, shard.scheme, shard.work_fraction, fwd, ing, wg,
                     comm_bytes, comm_messages, tp_s[0], shard.replicated_params, tp_s[1],
                     block if isinstance(block, int) else None, launches[0], launches[1],
                     shard.work_fraction * layer.kept_values, ep_s[0], cp_s[0],
                     ep_s[1], cp_s[1], hidden.forward + hidden.backward, hidden.forward,
                     rerun_s, hidden.unfused)


def mesh_split_key(layer: Layer, split: MeshSplit) -> tuple[object, ...]:
    """What of `split` a layer's cost reads: every layer its token share (cp); the mixture of
    experts' layers also ep and the load (their all-to-alls, GEMM calls and work) and fused
    attention the cp algorithm (ring or Ulysses). Two splits with one key cost the layer the
    same, so a search's splits share the rest."""
    record = record_of(layer)
    if record.expert or record.expert_exchange is not None or layer.kind in EXPERT_WORK_KINDS:
        return (split.cp, split.ep, split.imbalance, split.etp)
    if record.kernel is KernelClass.FLASH:
        return (split.cp, split.cp_algorithm)
    return (split.cp,)


def split_over_mesh(shard: Shard, layer: Layer, split: MeshSplit, partitions: int,
                    context: SplitContext) -> Shard:
    """A layer's tensor-parallel shard on the rest of the stage's mesh: 1/cp of its tokens (so
    of its work; ring attention's load-balanced causal split and Ulysses' head split alike),
    the busiest expert member's load on the routed experts' layers (their work and their
    tensor-group exchanges of the token copies), and the ep all-to-alls and the Ulysses
    all-to-alls as events on their dimensions."""
    if split == NO_SPLIT:
        return shard
    load = expert_work_factor(layer, split)
    own = shard.events
    if load != 1.0 and record_of(layer).expert:  # the busiest member gathers its load's copies
        own = tuple(replace(event, payload_bytes=event.payload_bytes * load) for event in own)
    events = (own + expert_exchange_events(layer, split, context, partitions)
              + ulysses_events(layer, split, partitions, context))
    fraction = shard.work_fraction * _token_share(layer, split, partitions) * load
    return replace(shard, work_fraction=fraction, events=events)


def _own_tensor_split(layer: Layer, split: MeshSplit) -> bool:
    """Whether the layer is one of the routed experts' and splits over etp ≠ tp members."""
    return split.etp is not None and layer.kind in EXPERT_WORK_KINDS


def _token_share(layer: Layer, split: MeshSplit, partitions: int) -> float:
    """The share of a sample's tokens (or token copies) the layer works on at one member: 1/cp,
    and for the routed experts' layers etp / (cp · tp) (MeshSplit.expert_token_fraction)."""
    if _own_tensor_split(layer, split):
        return split.expert_token_fraction(partitions)
    return split.token_fraction


_State = tuple[str, bool]
"""The state entering a layer: the last weighted layer's scheme, whether the input is
distributed over the tensor group."""

_Path = tuple[LayerCost, "_Path | None"]

LayerOptions = tuple[tuple[_State, LayerCost, float], ...]
"""Each way to cost one layer entering in one state (`_options`): (state after, cost, s)."""
"""A chain of layer costs as a linked list, last layer first (extending one is O(1))."""


def _options(layer: Layer, state: _State, pinned: str | None, partitions: int, minibatch: int,
             system: System, placed: Placement, rules: str, fc_protocol: str, precision: str,
             bytes_scale: float, bytes_per_value: float, sequence_parallel: bool,
             split: MeshSplit = NO_SPLIT) -> tuple[tuple[_State, LayerCost, float], ...]:
    """Each way to cost `layer` entering in `state`: (the state after it, its cost, its
    compute + communication seconds). A weighted layer takes each valid scheme (`pinned`
    only, when given) and leaves its scheme behind; a layer without weights follows the state."""
    current_scheme, input_distributed = state
    valid = split_schemes(layer, rules)
    if pinned is not None and pinned not in valid:
        raise ValueError(f"layer {layer.name!r} has no split {pinned!r} (one of {valid})")
    candidates = ((pinned,) if pinned is not None else valid) if layer.has_weights else (
        (current_scheme,) if current_scheme in valid else valid[:1])
    context = SplitContext(current_scheme, input_distributed, minibatch, bytes_per_value,
                           sequence_parallel, split.token_fraction, precision == "fp8")
    # the routed experts' layers split over etp members at their own token share (etp < tp)
    ways, layer_context = partitions, context
    if _own_tensor_split(layer, split):
        ways = split.expert_tensor(partitions)
        layer_context = replace(context, token_fraction=_token_share(layer, split, partitions))
    skip_weight_grad = fc_protocol == "vectors" and record_of(layer).vector_gradients
    options = []
    for scheme in candidates:
        if (layer.has_weights and split_extent(layer, scheme) < ways and ways > 1
                and len(valid) > 1):
            continue  # invalid split: some worker would get nothing
        if (not layer.has_weights and scheme == "rows" and partitions > 1
                and layer_splits_into(layer, "rows", partitions) is not None):
            continue  # a pooling layer on stripes with fewer rows than workers (runtime/netplan)
        shard = split_over_mesh(shard_layer(rules, layer, scheme, ways, layer_context), layer,
                                split, partitions, context)
        cost = _layer_cost(layer, shard, minibatch, system, placed, skip_weight_grad,
                           precision, bytes_scale, split, context, partitions)
        after = (scheme, partitions > 1) if layer.has_weights else state
        options.append((after, cost, cost.compute_s + cost.mesh_comm_s))
    return tuple(options)


def _cheapest_per_state(paths: list[tuple[_State, float, _Path | None]]
                        ) -> list[tuple[_State, float, _Path | None]]:
    """The cheapest of `paths` into each state (of equal ones the first)."""
    cheapest: dict[_State, tuple[_State, float, _Path | None]] = {}
    for entry in paths:
        known = cheapest.get(entry[0])
        if known is None or entry[1] < known[1]:
            cheapest[entry[0]] = entry
    return list(cheapest.values())


def stage_costs(workload: Workload, system: System, partitions: int, minibatch: int,
                fc_protocol: str = "weights", rules: str = "adam",
                layer_indices: list[int] | None = None, precision: str = "fp32",
                sequence_parallel: bool = False, bytes_scale: float = 1.0,
                schemes: Mapping[str, str] | None = None,
                split: MeshSplit = NO_SPLIT,
                shared: dict[tuple[object, ...], LayerOptions] | None = None) -> StageCosts:
    """Cost every layer (of one pipeline stage: `layer_indices`, default all) on the most
    loaded of P tensor-parallel members, each weighted layer under a valid split (sharding.py),
    with the split-caused communication on the tiers the group spans.

    The splits are an exact shortest path over the layer chain (Viterbi): the state entering a
    layer is (the last weighted layer's scheme, whether the input is distributed); a layer's
    cost under a scheme given that state is its compute + communication time in seconds, the
    transition traffic included (shard_layer prices it from the SplitContext of the incoming
    state), and the chain with the least Σ (compute_s + comm_s) wins — not each layer's own
    cheapest scheme, which ignores the traffic its choice forces on the next layer (issue 24).
    A weighted layer's schemes are its valid ones (at least one unit per worker); layers
    without weights follow the last weighted layer's split and keep the state. Of equal chains
    the one found first wins (workload/splits.split_schemes order). Each (layer cost key, state) is
    priced once, so a stack of identical blocks costs one block. With fc_protocol 'vectors'
    the FC weight gradients move to the PS. On accelerators the phases run in `precision`,
    activation bytes scaled by `bytes_scale`. `schemes` (layer name -> scheme) pins the named
    weighted layers' splits (the path is then the cheapest among those that keep them).
    `split`: the plan's ep and cp (model/mesh_split.py), priced on every layer
    (`split_over_mesh`). `shared`: a memo of layer options kept across calls on the same
    workload and system (the search's many splits share most layers' costs: a layer's cost
    depends on the split only through `mesh_split_key`).
    """
    b = workload.bytes_per_value * bytes_scale
    params = expert_params = hooked = 0
    units: dict[int | None, int] = {}  # an FSDP unit's parameters: each block, the rest together
    tensors: list[int] = []  # each layer's parameters, in order (model/zero3_fetch.py)
    chosen = set(layer_indices) if layer_indices is not None else None
    memo: dict[tuple[object, ...], LayerOptions] = {}
    context_key = (partitions, minibatch, rules, fc_protocol, precision, bytes_scale,
                   sequence_parallel)
    # tp, cp and ep are the mesh's innermost dimensions: their placement needs only their sizes.
    placed = placement(split.mesh(partitions), system.topology,
                       split.expert_tensor(partitions))
    start: _State = ("tensor" if rules == "megatron" else "features", False)
    frontier: list[tuple[_State, float, _Path | None]] = [(start, 0.0, None)]
    last_index = -1
    for index, layer in enumerate(workload.layers):
        if chosen is not None and index not in chosen:
            continue
        last_index = index
        params += layer.params
        if record_of(layer).expert:
            expert_params += layer.params
        hooked += hooked_params_of(layer)
        block = layer.hyper.get("block")
        block_id = block if isinstance(block, int) else None
        units[block_id] = units.get(block_id, 0) + layer.params
        tensors.append(layer.params)
        pinned = schemes.get(layer.name) if schemes is not None and layer.has_weights else None
        extended: list[tuple[_State, float, _Path | None]] = []
        for state, total, path in frontier:
            key = (layer.cost_key, state, pinned)
            options = memo.get(key)
            if options is None:
                long_key = (key, context_key, mesh_split_key(layer, split))
                found = shared.get(long_key) if shared is not None else None
                if found is None:
                    found = _options(layer, state, pinned, partitions, minibatch, system,
                                     placed, rules, fc_protocol, precision, bytes_scale, b,
                                     sequence_parallel, split)
                    if shared is not None:
                        shared[long_key] = found
                options = memo[key] = found
            for after, cost, seconds in options:
                if cost.name != layer.name or cost.block != block_id:
                    cost = cost._replace(name=layer.name, block=block_id)
                extended.append((after, total + seconds, (cost, path)))
        if not extended:
            raise ValueError(f"layer {layer.name!r} cannot be split {partitions} ways")
        frontier = extended if len(extended) == 1 else _cheapest_per_state(extended)
    best = min(frontier, key=lambda entry: entry[1])[2]
    costs: list[LayerCost] = []
    while best is not None:
        costs.append(best[0])
        best = best[1]
    costs.reverse()
    last = workload.layers[last_index] if last_index >= 0 else workload.layers[-1]
    return StageCosts(partitions, minibatch, tuple(costs), params, StageTotals.of(costs),
                      boundary_values=last.activation_values, expert_params=expert_params,
                      unit_params=largest_unit_params(units.values()),
                      units=unit_count(units.values()), tensors=TensorRun(tuple(tensors)),
                      hooked_params=hooked)


def hooked_params_of(layer: Layer) -> int:
    """The layer's parameters whose gradients are not formed by a GEMM (its kind's kernel is not
    KernelClass.GEMM): the ones Megatron's gradient-accumulation fusion leaves to a hook
    (model/accumulation.py); 0 for a GEMM layer."""
    return 0 if record_of(layer).kernel is KernelClass.GEMM else layer.params


def unit_count(units: Iterable[int]) -> int:
    """How many FSDP units a stage gathers one after another: each of its blocks, and its
    layers outside the blocks together where they hold parameters (the root unit); at least 1.

    Formula: the number of units with parameters, at least 1. Units: count.
    Source: as largest_unit_params (one all-gather per unit in forward, one in backward, and one
    reduce-scatter per unit: torch.distributed.fsdp, FullyShardedDataParallel's pre-forward,
    pre-backward and post-backward hooks; FSDP2's fully_shard per module).
    """
    return max(1, sum(1 for params in units if params > 0))


def largest_unit_params(units: Iterable[int]) -> int:
    """The largest FSDP unit among a stage's `units` (each block's parameters, and those of
    its layers outside the blocks together): what a sharded member gathers whole at once.

    Formula: max over the units. Units: parameters.
    Source: PyTorch FSDP wraps each transformer block as its own unit and the root module holds
    the rest (llm-foundry's and torchtitan's wrapping policies; torch.distributed.fsdp docs,
    auto_wrap_policy).
    """
    return max(units, default=0)


MAX_BLOCK_KINDS = 4
"""The most kinds of block a pipeline layout prices by template (an MoE stack with dense
blocks has two); a workload of more distinct blocks is costed layer by layer."""


def block_kinds(workload: Workload) -> tuple[tuple[tuple[int, ...], ...], dict[int, int]] | None:
    """The transformer blocks grouped by kind, blocks of a kind being copies of each other (same
    costs, layer for layer): each kind's first block's layer indices (kinds in order of first
    appearance) and each block's kind; None without blocks or with more than MAX_BLOCK_KINDS
    kinds."""
    by_block: dict[int, list[int]] = {}
    for index, layer in enumerate(workload.layers):
        block = layer.hyper.get("block")
        if isinstance(block, int):
            by_block.setdefault(block, []).append(index)
    if not by_block:
        return None
    firsts: dict[tuple[object, ...], int] = {}
    kinds: list[tuple[int, ...]] = []
    kind_of: dict[int, int] = {}
    for block in sorted(by_block):
        indices = by_block[block]
        keys = tuple(workload.layers[i].cost_key for i in indices)
        kind = firsts.get(keys)
        if kind is None:
            if len(kinds) == MAX_BLOCK_KINDS:
                return None
            kind = firsts[keys] = len(kinds)
            kinds.append(tuple(indices))
        kind_of[block] = kind
    return tuple(kinds), kind_of


@dataclass(frozen=True)
class PipelineLayout:
    """What each pipeline device holds: its number of blocks of each kind, its other layers, and
    its last layer (the boundary) — computed once per (workload, stages, virtual stages)."""

    kinds: tuple[tuple[int, ...], ...]
    """Per kind of block (block_kinds), the indices of its first block's layers (every block of
    a kind costs the same)."""
    blocks: tuple[tuple[int, ...], ...]
    """Per device, its number of blocks of each kind."""
    others: tuple[tuple[int, ...], ...]
    last: tuple[int, ...]


def pipeline_layout(workload: Workload, assignment: list[list[int]]) -> PipelineLayout | None:
    """The layout of `assignment` (schedule.stage_layers), or None when the blocks are of too
    many kinds (block_kinds)."""
    grouped = block_kinds(workload)
    if grouped is None:
        return None
    kinds, kind_of = grouped
    layers = workload.layers
    outside = set(workload.outside_block_indices)
    blocks, others = [], []
    for indices in assignment:
        held = {layers[i].hyper["block"] for i in indices if i not in outside}
        counts = [0] * len(kinds)
        for block in held:
            counts[kind_of[block]] += 1  # type: ignore[index]
        blocks.append(tuple(counts))
        others.append(tuple(i for i in indices if i in outside))
    return PipelineLayout(kinds, tuple(blocks), tuple(others),
                          tuple(indices[-1] for indices in assignment))


@dataclass(frozen=True)
class BlockTemplate:
    """One kind of block priced once: its totals, parameters and routed experts' parameters."""

    totals: StageTotals
    params: int
    expert_params: int = 0
    tensors: tuple[int, ...] = ()
    """Each of the block's layers' parameters, in order (model/zero3_fetch.py)."""
    hooked_params: int = 0
    """Its layers' `hooked_params_of`."""


@dataclass(frozen=True)
class StageTemplate:
    """One split and micro-batch priced once: each kind of block's totals and parameters, and
    the cost of every layer outside the blocks."""

    partitions: int
    minibatch: int
    kinds: tuple[BlockTemplate, ...]
    outside: dict[int, LayerCost]


def stage_template(workload: Workload, system: System, partitions: int, minibatch: int,
                   kinds: tuple[tuple[int, ...], ...], rules: str = "megatron",
                   precision: str = "fp32", sequence_parallel: bool = False,
                   bytes_scale: float = 1.0, split: MeshSplit = NO_SPLIT,
                   shared: dict[tuple[object, ...], LayerOptions] | None = None
                   ) -> StageTemplate:
    """Price the layers outside the blocks and the first block of each kind (`kinds`,
    PipelineLayout.kinds) in one chain."""
    outside = workload.outside_block_indices
    indices = sorted([*outside, *(i for block in kinds for i in block)])
    costed = stage_costs(workload, system, partitions, minibatch, "weights", rules, indices,
                         precision=precision, sequence_parallel=sequence_parallel,
                         bytes_scale=bytes_scale, split=split, shared=shared)
    cost_of = dict(zip(indices, costed.layers))
    layers = workload.layers
    return StageTemplate(partitions, minibatch, tuple(
        BlockTemplate(StageTotals.of([cost_of[i] for i in block]),
                      sum(layers[i].params for i in block),
                      sum(layers[i].params for i in block if record_of(layers[i]).expert),
                      tuple(layers[i].params for i in block),
                      sum(hooked_params_of(layers[i]) for i in block))
        for block in kinds), {i: cost_of[i] for i in outside})


def stages_from_template(workload: Workload, template: StageTemplate,
                         layout: PipelineLayout) -> tuple[StageCosts, ...]:
    """Each device's StageCosts: its blocks of each kind times that kind's totals plus its other
    layers (devices that hold the same kind of stage share one record)."""
    stages = []
    made: dict[tuple[tuple[int, ...], tuple[int, ...], int], StageCosts] = {}
    first_block = min((min(kind) for kind in layout.kinds if kind), default=0)
    for blocks, others, last in zip(layout.blocks, layout.others, layout.last):
        boundary = workload.layers[last].activation_values
        key = (blocks, others, boundary)
        stage = made.get(key)
        if stage is None:
            totals = StageTotals.of([template.outside[i] for i in others])
            params = root = sum(workload.layers[i].params for i in others)
            hooked = sum(hooked_params_of(workload.layers[i]) for i in others)
            expert_params = 0
            for kind, count in zip(template.kinds, blocks):
                if count:
                    totals = totals.plus(kind.totals, count)
                    params += kind.params * count
                    expert_params += kind.expert_params * count
                    hooked += kind.hooked_params * count
            unit_sizes = [root] + [kind.params for kind, count in zip(template.kinds, blocks)
                                   for _ in range(count)]
            run = TensorRun(
                tuple(workload.layers[i].params for i in others if i < first_block),
                tuple((kind.tensors, count) for kind, count in zip(template.kinds, blocks)
                      if count),
                tuple(workload.layers[i].params for i in others if i >= first_block))
            stage = made[key] = StageCosts(template.partitions, template.minibatch, (), params,
                                           totals, boundary, expert_params,
                                           largest_unit_params(unit_sizes),
                                           unit_count(unit_sizes), run, hooked)
        stages.append(stage)
    return tuple(stages)
