"""Memory per worker and per parameter-server machine (performance-model.md §5)."""

from __future__ import annotations

from dnnscale.model.registry import cost_formula


@cost_formula
def worker_memory_bytes(params_on_worker: float, bytes_per_value: int,
                        optimizer_state_values: int, activation_values_on_worker: float,
                        minibatch: int) -> float:
    """Memory one worker needs.

    Formula: (W/P) · b · (1 + o + 1) + A · n · b   (weights, o optimizer-state values per
    parameter, a gradient buffer; activations kept for backward, A per sample on this worker)
    Units: parameters, bytes per value, values -> bytes.
    Source: performance-model.md §5.
    """
    return (params_on_worker * bytes_per_value * (2 + optimizer_state_values)
            + activation_values_on_worker * minibatch * bytes_per_value)


@cost_formula
def ps_memory_bytes(params_on_shard: float, bytes_per_value: int,
                    optimizer_state_values: int) -> float:
    """Memory one parameter-server machine needs.

    Formula: (W/S) · b · (1 + o)   (replication factor 1)
    Units: parameters, bytes per value -> bytes.
    Source: performance-model.md §5.
    """
    return params_on_shard * bytes_per_value * (1 + optimizer_state_values)
