"""Communication caused by model partitioning, per worker and step (performance-model.md §2).

Only connections that cross a partition boundary move data. Byte counts are what one worker
receives (= sends, by symmetry) over a step of n samples, forward activations plus backward
input-gradients; the NIC is full duplex, so these bytes cost bytes / B.
"""

from __future__ import annotations

from dnnscale.model.registry import cost_formula
from dnnscale.workload.layer import Layer


def split_schemes(layer: Layer) -> tuple[str, ...]:
    """Ways a layer's neurons may be divided among workers: conv2d by output channels or by
    output rows (horizontal stripes); every 1-D layer by features."""
    if len(layer.output_shape) == 3:
        return ("channels", "rows")
    return ("features",)


@cost_formula
def fc_partition_bytes(in_features: int, partitions: int, bytes_per_value: int,
                       minibatch: int) -> float:
    """Bytes a worker exchanges for a fully connected layer whose outputs are split over P.

    Formula: 3 · (P−1)/P · n_in · b · n: forward, an all-gather of the inputs it does not own,
    (P−1)/P · n_in·b·n; backward, a reduce-scatter of the partial input-gradients, which gloo
    (torch 2.13) runs as an all-reduce of the whole tensor, 2 · (P−1)/P · n_in·b·n. In
    3·(P−1) messages (see fc_partition_messages).
    Units: values, bytes per value, samples -> bytes.
    Source: performance-model.md §2; Yan et al. KDD 2015 (model-parallel FC traffic); gloo's
    reduce_scatter measured on the testbed: 1 MB among 2 hosts took as long as a 2 MB all-reduce.
    """
    if partitions <= 1:
        return 0.0
    return 3 * (partitions - 1) / partitions * in_features * bytes_per_value * minibatch


@cost_formula
def fc_partition_messages(partitions: int) -> float:
    """Messages a worker sends per step for a split FC layer (or a channel-split conv).

    Formula: 3 · (P−1)   (a ring all-gather forward, P−1 steps; a ring all-reduce backward,
    2·(P−1) steps).
    Units: count.
    Source: performance-model.md §2.
    """
    return 3.0 * (partitions - 1) if partitions > 1 else 0.0


@cost_formula
def conv_stripe_bytes(kernel_h: int, in_width: int, in_channels: int, partitions: int,
                      bytes_per_value: int, minibatch: int) -> float:
    """Bytes a worker exchanges for a conv layer split into horizontal stripes (halo exchange).

    Formula: 2 · m · ⌊K_h/2⌋ · W_in · C_in · b · n with m = min(2, P−1) neighbours (forward halo
    rows in, backward halo gradients out); 0 for P = 1 or a 1-row kernel.
    Units: values, bytes per value, samples -> bytes.
    Source: performance-model.md §2 (stripe split with ⌊K/2⌋ halo rows above and below).
    """
    if partitions <= 1:
        return 0.0
    neighbours = min(2, partitions - 1)
    return 2 * neighbours * (kernel_h // 2) * in_width * in_channels * bytes_per_value * minibatch


@cost_formula
def conv_stripe_messages(kernel_h: int, partitions: int) -> float:
    """Messages a worker sends per step for a stripe-split conv layer.

    Formula: 2 · min(2, P−1) if ⌊K_h/2⌋ > 0 else 0.
    Units: count.
    Source: performance-model.md §2.
    """
    if partitions <= 1 or kernel_h // 2 == 0:
        return 0.0
    return 2.0 * min(2, partitions - 1)


@cost_formula
def conv_channel_bytes(in_channels: int, in_height: int, in_width: int, partitions: int,
                       bytes_per_value: int, minibatch: int) -> float:
    """Bytes a worker exchanges for a conv layer split by output channels.

    Formula: 3 · (P−1)/P · C_in · H_in · W_in · b · n   (forward: an all-gather of the input maps
    it does not hold; backward: the reduce-scatter of its partial input-gradients, an all-reduce
    in gloo, as for FC layers), in 3·(P−1) messages.
    Units: values, bytes per value, samples -> bytes.
    Source: performance-model.md §2 (channel split); gloo's reduce_scatter as in
    fc_partition_bytes.
    """
    if partitions <= 1:
        return 0.0
    return (3 * (partitions - 1) / partitions * in_channels * in_height * in_width
            * bytes_per_value * minibatch)


def layer_partition_traffic(layer: Layer, scheme: str, partitions: int, bytes_per_value: int,
                            minibatch: int, input_scheme: str = "rows") -> tuple[float, float]:
    """(bytes, messages) one worker exchanges per step for `layer` under `scheme`.

    Only weighted layers whose input is itself distributed move data; the caller decides the
    latter (the first weighted layer reads the replicated input sample). `input_scheme` is how
    that input is distributed (the previous weighted layer's split): stripes only exchange halo
    rows when the input is already in stripes; otherwise the whole input is first re-gathered
    (all-gather forward, reduce-scatter backward), which costs what a channel split costs.
    """
    if not layer.has_weights or partitions <= 1:
        return 0.0, 0.0
    if layer.kind == "conv2d" and scheme == "rows" and input_scheme == "rows":
        kh = layer.kernel[0] if layer.kernel else 1
        c_in, _, w_in = layer.input_shape
        return (conv_stripe_bytes(kh, w_in, c_in, partitions, bytes_per_value, minibatch),
                conv_stripe_messages(kh, partitions))
    if layer.kind == "conv2d":
        c_in, h_in, w_in = layer.input_shape
        return (conv_channel_bytes(c_in, h_in, w_in, partitions, bytes_per_value, minibatch),
                fc_partition_messages(partitions))
    return (fc_partition_bytes(layer.input_values, partitions, bytes_per_value, minibatch),
            fc_partition_messages(partitions))
