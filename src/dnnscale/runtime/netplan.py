"""How a Workload becomes a vertically partitioned network, decided without torch.

Vertical split (Project Adam): every weighted layer's neurons are divided among the P workers of
a replica — linear by output features, conv2d by output channels or by output rows (horizontal
stripes, each worker holding the whole kernel), as `layout.split_sizes` divides them.
Element-wise layers act on each worker's part; pooling on its channels, or on its stripe after a
halo exchange. A layer that needs its whole input gets the split activation gathered first
(forward) and the input gradient reduce-scattered back (backward); the first weighted layer reads
the replicated sample. The torch side is in network.py. The split's validity rules (a unit per
partition, a slice per shard) are plan/rules.py's, the ones `predict` applies.
"""

from __future__ import annotations

import math

from dnnscale.plan import Config
from dnnscale.errors import InputError
from dnnscale.model.vectors import Region, flat_layout
from dnnscale.plan.rules import layer_splits_into, require, shards_within_params
from dnnscale.workload import Workload
from dnnscale.workload.layer import Layer

RUNNABLE_KINDS = ("conv2d", "linear", "maxpool2d", "avgpool2d", "relu", "flatten", "softmax_loss")


def layer_has_bias(layer: Layer) -> bool:
    return bool(layer.hyper.get("bias", True))


def weighted_scheme_of(layer: Layer) -> str:
    """The sharding scheme of a weighted layer under a channel split: conv2d by output
    channels, linear by output features."""
    return "channels" if layer.kind == "conv2d" else "features"


CONV_SPLITS = ("channels", "rows")


def weighted_schemes(workload: Workload, conv_split: str | dict[str, str]) -> dict[str, str]:
    """Each weighted layer's split: 'features' for linear; for conv2d `conv_split` ('channels'
    or 'rows', horizontal stripes), or a mapping from conv layer name to one of those."""
    schemes = {}
    for layer in workload.layers:
        if layer.kind == "linear":
            schemes[layer.name] = "features"
        elif layer.kind == "conv2d":
            chosen = conv_split.get(layer.name, "channels") if isinstance(conv_split, dict) \
                else conv_split
            if chosen not in CONV_SPLITS:
                raise InputError("run.conv_split", f"must be one of {', '.join(CONV_SPLITS)}, "
                                 f"got {chosen!r}")
            schemes[layer.name] = chosen
    return schemes


def partition_param_counts(workload: Workload, partitions: int,
                           schemes: dict[str, str] | None = None) -> list[int]:
    """Flat parameter count of each of the P partitions, in the network's parameter order.

    Channel/feature splits divide a layer's parameters; a stripe-split ('rows') conv layer's
    whole kernel is held, and counted, by every partition (model/vectors.flat_layout).
    """
    schemes = schemes or weighted_schemes(workload, "channels")
    counts = [0] * partitions
    for region in flat_layout(workload, partitions, schemes, vectors=False):
        counts[region.partition] += region.length
    return counts


def vector_regions(workload: Workload, config: Config,
                   schemes: dict[str, str] | None = None) -> tuple[Region, ...]:
    """The flat layout's regions under Adam's vector protocol, () under the weight protocol."""
    if config.fc_protocol != "vectors" or not config.uses_ps:
        return ()
    return flat_layout(workload, config.partitions,
                       schemes or weighted_schemes(workload, "channels"))


def classes(workload: Workload) -> int:
    """Width of the logits the loss reads: the input of a final softmax_loss, else the output."""
    last = workload.layers[-1]
    shape = last.input_shape if last.kind == "softmax_loss" else last.output_shape
    return int(math.prod(shape))


def check_runnable(workload: Workload, config: Config,
                   schemes: dict[str, str] | None = None) -> None:
    """Raise InputError naming the field if the runtime cannot train `workload` under `config`
    with the weighted layers split as `schemes` says (default: conv layers by channels)."""
    schemes = schemes or weighted_schemes(workload, "channels")
    if config.overlap and not config.uses_ps:
        raise InputError("config.overlap", "the runtime overlaps parameter-server transfers "
                         "only (Adam's); with sync allreduce use overlap: false")
    if config.epoch_fraction < 1 and config.sync != "ps-async":
        raise InputError("config.epoch_fraction", f"the cut-off ends the epoch of replicas that "
                         f"do not wait for each other: it needs sync ps-async, got "
                         f"{config.sync!r}")
    if config.optimizer != "sgd":
        raise InputError("config.optimizer", f"the runtime trains with plain SGD only, got "
                         f"{config.optimizer!r}")
    weighted = False
    striped = False  # the activation is split into row stripes
    for index, layer in enumerate(workload.layers):
        field = f"workload.layers[{index}]"
        if layer.kind not in RUNNABLE_KINDS:
            what = " (a module with no layer kind of its own)" if layer.kind == "generic" else ""
            raise InputError(f"{field}.kind", f"the runtime cannot build layer {layer.name!r}: "
                             f"kind {layer.kind!r}{what}; it builds {', '.join(RUNNABLE_KINDS)}")
        if layer.kind == "softmax_loss" and index != len(workload.layers) - 1:
            raise InputError(f"{field}.kind", "softmax_loss must be the last layer")
        if layer.has_weights:
            weighted = True
            if layer.kind == "conv2d" and layer.groups != 1 and config.partitions > 1 \
                    and schemes.get(layer.name) != "rows":
                raise InputError(f"{field}.groups", f"grouped convolutions cannot be split over "
                                 f"{config.partitions} partitions")
            striped = schemes.get(layer.name) == "rows"
            require(layer_splits_into(layer, "rows" if striped else weighted_scheme_of(layer),
                                      config.partitions), "config")
        elif layer.kind in ("maxpool2d", "avgpool2d") and striped:
            require(layer_splits_into(layer, "rows", config.partitions), "config")
        elif layer.kind == "flatten":
            striped = False
    if not weighted:
        raise InputError("workload.layers", "the runtime needs at least one conv2d or linear layer")
    last = workload.layers[-1]
    logits_shape = last.input_shape if last.kind == "softmax_loss" else last.output_shape
    if len(logits_shape) != 1 or logits_shape[0] < 2:
        raise InputError("workload.layers", f"the network must end in a flat output of at least "
                         f"2 classes (got shape {list(logits_shape)}); add flatten and linear")
    if config.uses_ps:
        require(shards_within_params(config.ps_shards, workload.params), "config")
