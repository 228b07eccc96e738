"""Sharding rules: how each layer kind splits over a tensor-parallel group, one registry.

A rule is registered with ``@sharding_rule(rules, split, scheme)`` (`split`: a rule name that
kinds' records point to, e.g. Adam's 'neurons', Megatron's 'column') and maps (layer, degree,
context) to a `Shard`: the share of the layer's work the most loaded member does, the parameters
every member holds whole, and the communication events the split causes (operation, payload,
phase). The model (stage costs), the plan's validity rules and the runtime all read this registry
— a split is decided in one place.

Project Adam's rules ('adam', performance-model.md §2): a weighted layer's neurons are divided
among P workers — linear (and any 1-D layer) by output features, conv2d by output channels or by
output rows (horizontal stripes); layers without weights follow the last weighted layer's split.
Only a weighted layer whose input is itself distributed (anything after the first weighted
layer) exchanges activations: forward, an all-gather of the input it does not hold; backward, a
reduce-scatter of its partial input gradients. Stripes exchange only halo rows when the input is
already in stripes, and keep the whole kernel on every worker (its gradients are all-reduced in
the replica each step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dnnscale.model.compute import imbalance_fraction
from dnnscale.plan.mesh import MeshDim
from dnnscale.workload.kind_record import record_of
from dnnscale.workload.layer import Layer
from dnnscale.workload.splits import WINDOWED_KINDS, split_extent, stripe_exchange

PHASE_FORWARD, PHASE_BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class CommEvent:
    """A collective the split causes per step: `operation` (collectives.py) on a tensor of
    `payload_bytes` (per member; for a halo exchange, per neighbour) among `members` members
    of a group of mesh dimension `dimension` (neighbours, for a halo), in `phase`. The model
    places the group by its dimension (plan/mesh.placement); a tensor split's events run over
    tp, the default."""

    operation: str
    payload_bytes: float
    members: int
    phase: str
    dimension: MeshDim = MeshDim.TP


@dataclass(frozen=True)
class SplitContext:
    """What a rule needs besides the layer: how its input is distributed, the micro-batch and
    the bytes per value; `token_fraction`, the share of each sample's tokens a member holds
    (1 / cp under context parallelism), scales the activations a split exchanges; `fp8`,
    whether the plan computes in FP8."""

    input_scheme: str
    input_distributed: bool
    minibatch: int
    bytes_per_value: float
    sequence_parallel: bool = False
    token_fraction: float = 1.0
    fp8: bool = False
    """The plan computes in FP8: the FP8 linear layers gather their operands in FP8
    (megatron_rules.gather_bytes_per_value)."""


@dataclass(frozen=True)
class Shard:
    """One layer's split: its scheme, the most loaded member's share of the work, parameters
    every member holds whole (a stripe-split conv's kernel), and the events the split causes."""

    scheme: str
    work_fraction: float
    replicated_params: int
    events: tuple[CommEvent, ...]


ShardingRule = Callable[[Layer, int, SplitContext], Shard]
SHARDING_RULES: dict[tuple[str, str, str], ShardingRule] = {}
"""(rule set, split rule, scheme) -> rule; a layer's split rule under a rule set is a fact of
its kind (workload/kind_record.py LayerKind.splits)."""


def sharding_rule(rules: str, split: str, scheme: str) -> Callable[[ShardingRule], ShardingRule]:
    """Register a rule for (rule set, split rule name, scheme); the kinds whose record names
    `split` under `rules` are split by it."""

    def decorate(func: ShardingRule) -> ShardingRule:
        SHARDING_RULES[(rules, split, scheme)] = func
        return func

    return decorate


def member_params(layer: Layer, scheme: str, units: int) -> int:
    """Parameters of `layer` that a member owning `units` of its output units holds.

    Formula: conv2d and shortcut_conv2d out·C_in/groups·K_h·K_w (+ out biases), linear
    out·n_in (+ out biases), batchnorm2d 2·out (γ, β), for out = units; a stripe ('rows')
    holds the whole kernel; layers without weights hold 0.
    Units: counts.
    Source: performance-model.md §2 (each worker holds 1/P of the replica's weights).
    """
    if scheme == "rows" and layer.has_weights:
        return layer.params
    bias = units if layer.hyper.get("bias", True) else 0
    if layer.kind in ("conv2d", "shortcut_conv2d"):
        kernel_h, kernel_w = layer.kernel or (1, 1)
        c_in = layer.in_channels if layer.in_channels is not None else layer.input_shape[0]
        return units * (c_in // layer.groups) * kernel_h * kernel_w + bias
    if layer.kind == "batchnorm2d":
        return 2 * units
    if layer.kind == "linear":
        return units * layer.input_shape[0] + bias
    return 0


def shard_layer(rules: str, layer: Layer, scheme: str, degree: int, context: SplitContext) -> Shard:
    """The split of `layer` by the rule its kind's record names under `rules`; InputError for a
    kind nobody registered or one the rule set has no rule for, ValueError for a scheme the
    rule does not have."""
    split = record_of(layer).split_rule(rules)
    rule = SHARDING_RULES.get((rules, split, scheme))
    if rule is None:
        raise ValueError(f"no {rules} sharding rule {split!r} for scheme {scheme!r} (layer "
                         f"{layer.name!r}, kind {layer.kind!r})")
    return rule(layer, degree, context)


def _regather(values_per_sample: int, degree: int, context: SplitContext) -> tuple[CommEvent, ...]:
    """Forward all-gather of a distributed input and backward reduce-scatter of its gradient."""
    if not context.input_distributed or degree <= 1:
        return ()
    payload = values_per_sample * context.bytes_per_value * context.minibatch
    return (CommEvent("allgather", payload, degree, PHASE_FORWARD),
            CommEvent("reduce_scatter", payload, degree, PHASE_BACKWARD))


def _kernel_allreduce(layer: Layer, degree: int, context: SplitContext) -> tuple[CommEvent, ...]:
    """A stripe-split layer's whole-kernel gradients, summed over the replica's members."""
    return (CommEvent("allreduce", layer.params * context.bytes_per_value, degree,
                      PHASE_BACKWARD),)


@sharding_rule("adam", "neurons", "features")
def adam_features(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Output features split over the P workers (a linear layer, or any 1-D layer).

    Work: ceil(n_out / P) / n_out of the layer on the most loaded worker. A weighted layer with a
    distributed input re-gathers its n_in input values per sample (all-gather forward,
    reduce-scatter of the partial input gradients backward).
    Source: performance-model.md §2; Yan et al. KDD 2015 (model-parallel FC traffic).
    """
    fraction = imbalance_fraction(split_extent(layer, "features"), degree)
    events = _regather(layer.input_values, degree, context) if layer.has_weights else ()
    return Shard("features", fraction, 0, events)


@sharding_rule("adam", "neurons", "channels")
def adam_channels(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Output channels split over the P workers: each needs all input maps (a re-gather of the
    C_in·H_in·W_in input values per sample when the input is distributed)."""
    fraction = imbalance_fraction(split_extent(layer, "channels"), degree)
    events = _regather(layer.input_values, degree, context) if layer.has_weights else ()
    return Shard("channels", fraction, 0, events)


@sharding_rule("adam", "neurons", "rows")
def adam_rows(layer: Layer, degree: int, context: SplitContext) -> Shard:
    """Output rows (horizontal stripes) split over the P workers.

    A weighted layer keeps its whole kernel on every worker (replicated parameters, all-reduced
    in the replica each step). A window layer (a conv, or a pooling layer that follows the
    stripes) whose input is already in stripes exchanges the halo rows its windows read that
    its neighbours hold, forward and backward (workload/splits.stripe_exchange: the busiest
    member's rows and neighbours, as the runtime re-splits each window layer's output rows
    evenly); a weighted layer's other distributed input is re-gathered first (the cost of a
    channel split).
    """
    fraction = imbalance_fraction(split_extent(layer, "rows"), degree)
    if degree <= 1:
        return Shard("rows", fraction, 0, ())
    events: tuple[CommEvent, ...] = ()
    if context.input_distributed:
        if layer.kind in WINDOWED_KINDS and context.input_scheme == "rows":
            rows, neighbours = stripe_exchange(layer, degree)
            c_in, _, w_in = layer.input_shape
            halo = rows * w_in * c_in * context.bytes_per_value * context.minibatch
            if rows:
                events = (CommEvent("halo", halo / neighbours, neighbours, PHASE_FORWARD),
                          CommEvent("halo", halo / neighbours, neighbours, PHASE_BACKWARD))
        elif layer.has_weights:
            events = _regather(layer.input_values, degree, context)
    if not layer.has_weights:
        return Shard("rows", fraction, 0, events)
    return Shard("rows", fraction, layer.params, events + _kernel_allreduce(layer, degree, context))
