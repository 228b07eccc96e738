"""A CPU worker's passes over its parameters each step, beside forward and backward (issue 22).

The runtime's worker (runtime/worker.py: flat_gradient, local_update, vector_to_parameters)
turns its gradients into its next weights with whole-vector passes, each streaming every
parameter through memory. On the testbed's models (0.8-3.3 M parameters, 3-13 MB per vector,
larger than a core's caches) these passes are memory-bound and cost as much as a layer's
compute; a parameter server's worker does one more.
"""

from __future__ import annotations

from dnnscale.system.device import Device

COLLECTIVE_PASSES = 9
"""Values streamed per parameter per step without parameter servers: the gradient vector
assembled (torch.cat: read, write), the weights flattened (parameters_to_vector: read, write),
the local step w -= lr·g (read two, write one) and the weights written back
(vector_to_parameters: read, write)."""

PS_PASSES = COLLECTIVE_PASSES + 3
"""With parameter servers the gradient is also added to the one accumulated for the next push
(read two, write one)."""


def worker_bookkeeping_bytes(params: float, bytes_per_value: float,
                             parameter_server: bool) -> float:
    """Bytes a CPU worker reads and writes per step to turn its gradients into its next weights.

    Formula: Ψ · b · passes, passes = COLLECTIVE_PASSES (9) or PS_PASSES (12).
    Units: parameters, bytes per value -> bytes per step.
    Source: runtime/worker.py (flat_gradient, local_update, vector_to_parameters); timed against
    this formula by benchmarks/bookkeeping_bench.py (results/validation/bookkeeping.json).
    """
    return params * bytes_per_value * (PS_PASSES if parameter_server else COLLECTIVE_PASSES)


def worker_bookkeeping_s(params: float, bytes_per_value: float, parameter_server: bool,
                         machine: Device) -> float:
    """Seconds those passes take on one worker: the bytes at the machine's streaming memory
    bandwidth (one thread's copy rate), over its cores as the machine's other per-core rates
    are (a 0.25-core quota streams a quarter of the time).

    Formula: worker_bookkeeping_bytes / (B_mem · cores).
    Units: parameters, bytes per value, B/s, cores -> s.
    Source: as worker_bookkeeping_bytes; B_mem is calibrate/memory.memory_bandwidth_bytes_per_s.
    """
    rate = machine.memory_bandwidth_bytes_per_s * machine.cores
    return worker_bookkeeping_bytes(params, bytes_per_value, parameter_server) / rate
