"""Parameter-server traffic and capacity (performance-model.md §3)."""

from __future__ import annotations

import math

from dnnscale.model.compute import cpu_phase_times_s
from dnnscale.system.device import Device
from dnnscale.workload.kinds import linear


def ps_push_bytes_per_step(weight_params: int, vector_values: float, bytes_per_value: int,
                           push_every: int) -> float:
    """Bytes pushed to the parameter servers per step: by one replica (all P workers), or by
    it to one shard, or by one worker.

    Formula: W_w · b / k_push + V · b, where W_w are the parameters pushed as weight updates and
    V the activation and error values of FC layers under Project Adam's vector protocol
    (n · (n_in + n_out) per layer with one shard and P = 1; per shard and worker as
    model/vectors.py slices them; the vectors of k_push steps travel together, so V per step on
    average).
    Units: parameters, values, bytes per value -> bytes per step.
    Source: performance-model.md §3; Chilimbi et al. OSDI 2014 §3.3 (FC update vectors).
    """
    return weight_params * bytes_per_value / push_every + vector_values * bytes_per_value


def ps_pull_bytes_per_step(params: int, bytes_per_value: int, pull_every: int) -> float:
    """Bytes one replica pulls from the parameter servers per step.

    Formula: W · b / k_pull
    Units: parameters, bytes per value -> bytes per step.
    Source: performance-model.md §3.
    """
    return params * bytes_per_value / pull_every


def busiest_shard_share(params: int, shards: int) -> float:
    """Share of the parameters held by the largest of S shards (flat slicing).

    Formula: ceil(W / S) / W
    Units: dimensionless.
    Source: performance-model.md §3 ("the largest shard decides").
    """
    if params <= 0:
        return 1.0 / shards
    return math.ceil(params / shards) / params


def ps_network_capacity_samples_per_s(ps_bandwidth_bytes_per_s: float, shard_share: float,
                                      push_bytes_per_sample: float,
                                      pull_bytes_per_sample: float) -> float:
    """Samples per second the parameter servers' NICs can sustain, all replicas together.

    Formula: X_ps,net = B_ps / (s · (push bytes per sample + pull bytes per sample)), s the
    busiest shard's share (= S·B / bytes per sample for an even split). A shard serves one
    request at a time (it receives a push, or sends a pull's reply), so the two directions of its
    NIC take turns rather than overlap: measured on the testbed, an asynchronous PS with 4
    workers ran at 0.5x the full-duplex capacity B / (s · max(push, pull)) that
    performance-model.md §3 first assumed.
    Units: bytes/s, bytes per sample -> samples/s.
    Source: performance-model.md §3; Yan et al. KDD 2015 (PS communication bottleneck);
    dnnscale's runtime/ps.py (sequential shard loop).
    """
    busiest = shard_share * (push_bytes_per_sample + pull_bytes_per_sample)
    return math.inf if busiest <= 0 else ps_bandwidth_bytes_per_s / busiest


def ps_cpu_capacity_samples_per_s(shard_share: float, update_s_per_sample: float,
                                  fc_outer_product_s_per_sample: float) -> float:
    """Samples per second the parameter servers' CPUs can sustain, all replicas together.

    Formula: X_ps,cpu = 1 / (s · (W·t_upd/(n·k_push) + Σ_FC F^w / φ_ps)), s the busiest shard's
    share; the second term is Adam's FC outer products, computed on the PS under the vector
    protocol.
    Units: seconds of PS work per sample -> samples/s.
    Source: performance-model.md §3; Yan et al. KDD 2015 (PS computation bottleneck).
    """
    busiest = shard_share * (update_s_per_sample + fc_outer_product_s_per_sample)
    return math.inf if busiest <= 0 else 1.0 / busiest


def ps_queueing_cycle_s(replicas: int, own_s: float, service_s: float) -> float:
    """Mean step of each of R asynchronous replicas that share one parameter-server shard: a
    replica does `own_s` of its own work (compute, its share of the transfers), then waits for
    the shard to serve its request, `service_s`, one request at a time.

    Formula: a closed network of R customers, one delay station Z = own_s and one queueing
    station D = service_s, by the Bard-Schweitzer approximate mean value analysis: a request
    finds (R − 1)/R of the queue, r = D·(1 + (R − 1)/R · Q) with Q = R·r / (Z + r), whose root
    is r = ((R·D − Z) + sqrt((R·D − Z)² + 4·D·Z)) / 2; the step is Z + r. It is exact for R = 1
    (Z + D) and for Z = 0 (R·D), lies between the asymptotes, max(Z + D, R·D) <= step <=
    Z + R·D, and differs from them most near the knee R·D ≈ Z + D, where the bound
    max(Z + D, R·D) says nobody queues. Closed form, so the search prices R = 10,000 replicas
    as fast as 2 (exact mean value analysis is a loop over R: it made the optimizer's
    ps-async search at M = 10,000 take 5 s, on a busy machine).
    Units: replicas, seconds, seconds -> seconds per step of one replica.
    Source: Schweitzer, "Approximate analysis of multiclass closed networks of queues" (1979);
    Bard, "Some extensions to multiclass queueing network analysis" (1979); Lazowska et al.,
    Quantitative System Performance (1984) §6.4.2. Measured (benchmarks/ps_queue_bench.py
    1gbit, results/validation/ps_queue/1gbit.json: the runtime's shards, R = 2-4, S = 1-2):
    two shards near the knee (R = 2-3) took 1.04-1.37x the bound's step and 0.95-1.05x this
    one's (exact MVA: 1.00-1.11x); a single shard, and two at R = 4, 0.79-0.96x this one's
    and 0.84-0.96x the bound's (its pushes and replies overlap a little in the socket buffers,
    which the half-duplex D leaves out). Over all R > 1 points measured/this: geomean 0.92,
    0.79-1.05; measured/bound: 1.01, 0.84-1.37.
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if service_s <= 0.0:
        return own_s
    excess_s = replicas * service_s - own_s
    residence_s = (excess_s + math.sqrt(excess_s * excess_s + 4.0 * service_s * own_s)) / 2.0
    return own_s + residence_s


def ps_outer_product_s(rows: int, columns: int, samples: int, bytes_per_value: int,
                       ps_machine: Device) -> float:
    """Seconds a parameter-server machine takes for one FC block of Adam's vector protocol.

    Formula: the weight-gradient phase of a linear layer `columns` -> `rows` over `samples`
    samples on the PS machine (compute.cpu_phase_times_s): 2·m·r·c FLOP at the machine's
    calibrated linear.weight_grad rate for a call of that size (plus its memory term where the
    profile measured one), the same curve that prices the workers' FC weight gradients.
    Units: rows, columns, samples, bytes per value -> seconds.
    Source: Chilimbi et al., OSDI 2014, §3.3 (the PS computes δᵀ·a itself); model/vectors.py
    (which rows and columns a shard multiplies).
    """
    if rows <= 0 or columns <= 0 or samples <= 0:
        return 0.0
    block = linear("ps_block", (columns,), bytes_per_value, False, out_features=rows, bias=False)
    return cpu_phase_times_s(block, 1.0, samples, ps_machine, False)[2]
