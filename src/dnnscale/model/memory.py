"""Memory per device, by part (performance-model.md §5): weights, gradients, optimizer state,
activations on a worker; weights and optimizer state on a parameter-server machine."""

from __future__ import annotations

from dnnscale.model.prediction import MemoryPart
from dnnscale.model.registry import cost_formula


@cost_formula
def worker_memory_parts(params_on_worker: float, param_bytes: float, grad_bytes: float,
                        optimizer_state_bytes_per_param: float,
                        activation_values_on_worker: float, activation_bytes: float,
                        minibatch: int) -> tuple[MemoryPart, ...]:
    """Memory one worker needs, by part.

    Formula: weights W_w·b_p, gradient buffer W_w·b_g, optimizer state W_w·s (s bytes of state per
    parameter: o values of b bytes, plus a master copy under mixed precision), activations kept
    for backward A·n·b_a (A values per sample on this worker, n samples).
    Units: parameters, bytes per value, values, samples -> bytes.
    Source: performance-model.md §5; Rajbhandari et al. SC'20 §3 (the 2+2+12 bytes per parameter
    of mixed-precision Adam).
    """
    return (MemoryPart("weights", params_on_worker * param_bytes),
            MemoryPart("gradients", params_on_worker * grad_bytes),
            MemoryPart("optimizer_state", params_on_worker * optimizer_state_bytes_per_param),
            MemoryPart("activations", activation_values_on_worker * minibatch * activation_bytes))


@cost_formula
def ps_memory_parts(params_on_shard: float, param_bytes: float,
                    optimizer_state_bytes_per_param: float) -> tuple[MemoryPart, ...]:
    """Memory one parameter-server machine needs, by part.

    Formula: weights (W/S)·b, optimizer state (W/S)·s   (replication factor 1)
    Units: parameters, bytes per value -> bytes.
    Source: performance-model.md §5.
    """
    return (MemoryPart("ps_weights", params_on_shard * param_bytes, "ps"),
            MemoryPart("ps_optimizer_state", params_on_shard * optimizer_state_bytes_per_param, "ps"))
