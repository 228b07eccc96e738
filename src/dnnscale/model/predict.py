"""Composition: replica costs + PS or all-reduce -> throughput, step and epoch time
(performance-model.md §3-§5)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dnnscale.cluster.spec import Cluster
from dnnscale.config.config import OPTIMIZER_STATE_VALUES, Config
from dnnscale.model.memory import ps_memory_bytes, worker_memory_bytes
from dnnscale.model.network import overlapped_time_s, ring_allreduce_time_s, transfer_time_s
from dnnscale.model.prediction import Prediction
from dnnscale.model.ps import (busiest_shard_share, ps_cpu_capacity_samples_per_s,
                               ps_network_capacity_samples_per_s, ps_pull_bytes_per_step,
                               ps_push_bytes_per_step)
from dnnscale.model.replica import ReplicaCosts, replica_costs
from dnnscale.workload.workload import Workload


def predict_config(workload: Workload, cluster: Cluster, config: Config,
                   replica: ReplicaCosts | None = None) -> Prediction:
    """Predict one configuration; `replica` may be passed in when already computed for (P, n)."""
    if replica is None:
        replica = replica_costs(workload, cluster.machine, cluster.network, config.partitions,
                                config.minibatch, config.fc_protocol)
    if config.sync == "allreduce":
        timing = _allreduce(workload, cluster, config, replica)
    else:
        timing = _parameter_server(workload, cluster, config, replica)
    memory = _memory(workload, config, replica)
    fits = memory["worker"] <= cluster.machine.memory_bytes and (
        not config.uses_ps or memory["ps"] <= cluster.ps.memory_bytes)
    epoch_s = config.epoch_fraction * workload.samples_per_epoch / timing.throughput
    return Prediction(config=config, throughput_samples_per_s=timing.throughput,
                      step_time_s=timing.step_s, epoch_time_s=epoch_s,
                      bottleneck=timing.bottleneck, breakdown_s=timing.breakdown,
                      utilization=timing.utilization, memory_bytes=memory, fits=fits,
                      capacities_samples_per_s=timing.capacities, layers=replica.layers)


@dataclass(frozen=True)
class _Timing:
    throughput: float
    step_s: float
    bottleneck: str
    breakdown: dict[str, float]
    utilization: dict[str, float]
    capacities: dict[str, float]


def _compute_breakdown(replica: ReplicaCosts) -> dict[str, float]:
    return {"forward": replica.forward_s, "input_grad": replica.input_grad_s,
            "weight_grad": replica.weight_grad_s, "compute": replica.compute_s,
            "partition_comm": replica.partition_s}


def _combine(busy_s: float, comm_s: float, config: Config, cluster: Cluster) -> float:
    if config.overlap:
        return overlapped_time_s(busy_s, comm_s, cluster.overlap_gamma)
    return busy_s + comm_s


def _largest(named_seconds: dict[str, float]) -> str:
    return max(named_seconds.items(), key=lambda item: item[1])[0]


def ps_terms(workload: Workload, cluster: Cluster, config: Config,
             params: int | None = None) -> dict[str, float]:
    """Per-step PS quantities of one replica: bytes pushed/pulled, PS CPU seconds (all shards)."""
    b, n = workload.bytes_per_value, config.minibatch
    fc_layers = [layer for layer in workload.layers if layer.kind == "linear"]
    vectors = config.fc_protocol == "vectors"
    params = workload.params if params is None else params  # W + (P−1)·W_rep, see replica.py
    pushed_params = params - (sum(layer.params for layer in fc_layers) if vectors else 0)
    vector_values = n * sum(layer.input_values + layer.activation_values for layer in fc_layers) \
        if vectors else 0.0
    fc_ps_s = 0.0
    if vectors:
        for layer in fc_layers:
            work = n * layer.weight_grad_flops
            fc_ps_s += work / cluster.ps.flops_per_s("linear", "weight_grad", work)
    return {
        "push_bytes": ps_push_bytes_per_step(pushed_params, vector_values, b, config.push_every),
        "pull_bytes": ps_pull_bytes_per_step(params, b, config.pull_every),
        "update_s": params * cluster.ps.update_s_per_param / config.push_every,
        "fc_ps_s": fc_ps_s,
        "share": busiest_shard_share(params, config.ps_shards),
    }


def _parameter_server(workload: Workload, cluster: Cluster, config: Config,
                      replica: ReplicaCosts) -> _Timing:
    n, P, R, S = config.minibatch, config.partitions, config.replicas, config.ps_shards
    net, ps_net = cluster.network, cluster.ps_net
    terms = ps_terms(workload, cluster, config, replica.stored_params(workload.params))
    share = terms["share"]
    busy_s = replica.compute_s + replica.partition_s
    breakdown = _compute_breakdown(replica)
    # A worker's own push and pull: its 1/P of the replica's bytes, one message per shard.
    push_w_s = transfer_time_s(terms["push_bytes"] / P, S / config.push_every,
                               net.bandwidth_bytes_per_s, net.latency_s)
    pull_w_s = transfer_time_s(terms["pull_bytes"] / P, S / config.pull_every,
                               net.bandwidth_bytes_per_s, net.latency_s)
    if config.sync == "ps-async":
        x_net = ps_network_capacity_samples_per_s(ps_net.bandwidth_bytes_per_s, share,
                                                  terms["push_bytes"] / n, terms["pull_bytes"] / n)
        x_cpu = ps_cpu_capacity_samples_per_s(share, terms["update_s"] / n, terms["fc_ps_s"] / n)
        # The busiest shard serves this replica's P workers one request at a time, so a replica
        # also waits for that shard to move its share of the replica's pushes and pulls.
        serve_s = share * (terms["push_bytes"] + terms["pull_bytes"]) / ps_net.bandwidth_bytes_per_s
        worker_step_s = _combine(busy_s, max(push_w_s + pull_w_s, serve_s), config, cluster)
        x_replicas = R * n / worker_step_s
        throughput = min(x_replicas, x_net, x_cpu)
        step_s = R * n / throughput
        capacities = {"workers": x_replicas, "ps_network": x_net, "ps_cpu": x_cpu}
        if throughput == x_replicas:
            bottleneck = _largest({"worker compute": replica.compute_s,
                                   "partition communication": replica.partition_s,
                                   "worker ps transfer": max(push_w_s + pull_w_s, serve_s)})
        else:
            bottleneck = "ps network" if throughput == x_net else "ps cpu"
        breakdown.update({"ps_push": push_w_s, "ps_pull": pull_w_s,
                          "ps_serve_wait": max(0.0, serve_s - push_w_s - pull_w_s),
                          "ps_wait": max(0.0, step_s - worker_step_s), "step": step_s})
        utilization = {"worker_compute": replica.compute_s / step_s,
                       "partition_network": replica.partition_s / step_s,
                       "worker_ps_network": max(push_w_s + pull_w_s, serve_s) / step_s,
                       "ps_network": throughput / x_net, "ps_cpu": throughput / x_cpu}
        return _Timing(throughput, step_s, bottleneck, breakdown, utilization, capacities)
    # Synchronous: every worker pushes, the shards apply all R updates, every worker pulls.
    push_s = max(terms["push_bytes"] / P / net.bandwidth_bytes_per_s,
                 R * share * terms["push_bytes"] / ps_net.bandwidth_bytes_per_s) \
        + S / config.push_every * net.latency_s
    pull_s = max(terms["pull_bytes"] / P / net.bandwidth_bytes_per_s,
                 R * share * terms["pull_bytes"] / ps_net.bandwidth_bytes_per_s) \
        + S / config.pull_every * net.latency_s
    apply_s = R * share * (terms["update_s"] + terms["fc_ps_s"])
    step_s = _combine(busy_s, push_s + apply_s + pull_s, config, cluster)
    throughput = R * n / step_s
    bottleneck = _largest({"worker compute": replica.compute_s,
                           "partition communication": replica.partition_s,
                           "ps network": push_s + pull_s, "ps cpu": apply_s})
    breakdown.update({"ps_push": push_s, "ps_apply": apply_s, "ps_pull": pull_s, "step": step_s})
    ps_nic_s = R * share * max(terms["push_bytes"], terms["pull_bytes"]) / ps_net.bandwidth_bytes_per_s
    utilization = {"worker_compute": replica.compute_s / step_s,
                   "partition_network": replica.partition_s / step_s,
                   "ps_network": ps_nic_s / step_s, "ps_cpu": apply_s / step_s}
    return _Timing(throughput, step_s, bottleneck, breakdown, utilization, {"workers": throughput})


def _allreduce(workload: Workload, cluster: Cluster, config: Config,
               replica: ReplicaCosts) -> _Timing:
    n, P, R = config.minibatch, config.partitions, config.replicas
    net = cluster.network
    params_on_worker = replica.stored_params(workload.params) / P
    allreduce_s = ring_allreduce_time_s(R, params_on_worker * workload.bytes_per_value,
                                        net.bandwidth_bytes_per_s, net.latency_s)
    update_s = params_on_worker * cluster.machine.update_s_per_param
    busy_s = replica.compute_s + replica.partition_s
    step_s = _combine(busy_s, allreduce_s, config, cluster) + update_s
    throughput = R * n / step_s
    bottleneck = _largest({"worker compute": replica.compute_s + update_s,
                           "partition communication": replica.partition_s,
                           "allreduce network": allreduce_s})
    breakdown = _compute_breakdown(replica)
    breakdown.update({"allreduce": allreduce_s, "update": update_s, "step": step_s})
    utilization = {"worker_compute": (replica.compute_s + update_s) / step_s,
                   "partition_network": replica.partition_s / step_s,
                   "allreduce_network": allreduce_s / step_s}
    return _Timing(throughput, step_s, bottleneck, breakdown, utilization, {"workers": throughput})


def _memory(workload: Workload, config: Config, replica: ReplicaCosts) -> dict[str, float]:
    state = OPTIMIZER_STATE_VALUES[config.optimizer]
    activations = math.prod(workload.input_shape) + sum(
        cost.work_fraction * layer.activation_values
        for cost, layer in zip(replica.layers, workload.layers))
    stored = replica.stored_params(workload.params)
    worker = worker_memory_bytes(stored / config.partitions, workload.bytes_per_value,
                                 state, activations, config.minibatch)
    ps = (ps_memory_bytes(math.ceil(stored / config.ps_shards), workload.bytes_per_value,
                          state) if config.uses_ps else 0.0)
    return {"worker": worker, "ps": ps}
