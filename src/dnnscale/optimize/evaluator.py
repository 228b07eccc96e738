"""Throughput of one group (sync mode, P, n, k_push, k_pull) as a function of R and S, cheaply.

The search calls this thousands of times, so it keeps what does not change within a group (the
replica's compute and partition time, the PS bytes and work per step) and evaluates the rest of
model/predict.py's composition with the same registered cost formulas, in the same order of
floating-point operations, so its throughput is predict_config's to the last bit (tests check
this on random configurations; the optimizer re-checks every configuration it reports).

The structure the exact search relies on, read off those formulas (performance-model.md §4, §6):

- ps-async: X = min(R·n / T_w(S), X_ps(share(S))). T_w, the worker step (compute + partition
  traffic combined with the longer of its own push/pull, S messages each, and the busiest
  shard's service of the replica, share·(push + pull)/B_ps), does not depend on R; its own part
  grows with S and the service part falls with the share; X_ps = min(X_ps,net, X_ps,cpu) grows
  as the busiest shard's share ceil(W/S)/W falls. Over S in [lo, hi], T_w >= its value with the
  latency of lo shards and the share of hi shards.
- ps-sync: X = R·n / T(R, share, S) with T = combine(T_comp + T_mp, push + apply + pull), where
  push = max(W_push/P/B, R·share·W_push/B_ps) + S/k_push·α (pull alike) and apply =
  R·share·t_apply. T/R is nonincreasing in R (each term is a constant or proportional to R;
  combine is 1-homogeneous), so X is nondecreasing in R; X falls as share or S-latency grows.
- PS modes, both: for fixed S the best R is the largest, floor((M − S)/P), capped at one
  epoch's worth, floor(samples per epoch / n) (as for all-reduce's R). Over an interval
  S ∈ [lo, hi], X ≤ X(R(lo), share(hi), latency of lo shards): a valid upper bound.
- allreduce: X = R·n / (combine(T_comp + T_mp, T_ring(R)) + T_update); T_ring grows with R, so
  X need not grow with R (latency-bound rings get slower); over R ∈ [lo, hi],
  X ≤ hi·n / T_step(lo).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dnnscale.cluster.spec import Cluster
from dnnscale.config.config import Config, max_replicas
from dnnscale.model.network import overlapped_time_s, ring_allreduce_time_s, transfer_time_s
from dnnscale.model.predict import ps_terms
from dnnscale.model.ps import (busiest_shard_share, ps_cpu_capacity_samples_per_s,
                               ps_network_capacity_samples_per_s)
from dnnscale.model.replica import ReplicaCosts
from dnnscale.optimize.space import Group
from dnnscale.workload.workload import Workload


@dataclass
class GroupEvaluator:
    """X(R, S) for one group. For PS modes the search variable is S (R = floor((m − S)/P));
    for all-reduce it is R. `min_shards`: fewest shards whose PS memory fits."""

    group: Group
    config: Config
    workload: Workload
    cluster: Cluster
    replica: ReplicaCosts
    min_shards: int
    evaluations: int = 0
    bounds: int = 0
    _per_shards: dict[int, tuple[float, float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg, net = self.config, self.cluster.network
        self.n, self.P = cfg.minibatch, cfg.partitions
        self.most_replicas = max_replicas(self.workload, self.n)  # R·n within one epoch
        self.params = self.replica.stored_params(self.workload.params)  # W + (P−1)·W_rep
        self.busy_s = self.replica.compute_s + self.replica.partition_s
        self.overlap, self.gamma = cfg.overlap, self.cluster.overlap_gamma
        self.bandwidth, self.latency = net.bandwidth_bytes_per_s, net.latency_s
        self.ps_bandwidth = self.cluster.ps_net.bandwidth_bytes_per_s
        if self.group.uses_ps:
            terms = ps_terms(self.workload, self.cluster, cfg, self.params)
            self.push_bytes, self.pull_bytes = terms["push_bytes"], terms["pull_bytes"]
            self.update_s, self.fc_ps_s = terms["update_s"], terms["fc_ps_s"]
        else:
            self.params_on_worker = self.params / self.P
            self.ring_bytes = self.params_on_worker * self.workload.bytes_per_value
            self.update_s = self.params_on_worker * self.cluster.machine.update_s_per_param

    # -- shared pieces ------------------------------------------------------------------------

    def _combine(self, busy_s: float, comm_s: float) -> float:
        if self.overlap:
            return overlapped_time_s(busy_s, comm_s, self.gamma)
        return busy_s + comm_s

    def _shards(self, shards: int) -> tuple[float, float, float]:
        """What depends on S alone, memoised: (share, worker step, PS capacity) for ps-async,
        (share, push latency, pull latency) for ps-sync."""
        cached = self._per_shards.get(shards)
        if cached is not None:
            return cached
        cfg, n, P = self.config, self.n, self.P
        share = busiest_shard_share(self.params, shards)
        if self.group.sync == "ps-async":
            push_w_s = transfer_time_s(self.push_bytes / P, shards / cfg.push_every,
                                       self.bandwidth, self.latency)
            pull_w_s = transfer_time_s(self.pull_bytes / P, shards / cfg.pull_every,
                                       self.bandwidth, self.latency)
            x_net = ps_network_capacity_samples_per_s(self.ps_bandwidth, share,
                                                      self.push_bytes / n, self.pull_bytes / n)
            x_cpu = ps_cpu_capacity_samples_per_s(share, self.update_s / n, self.fc_ps_s / n)
            cached = (share, push_w_s + pull_w_s, min(x_net, x_cpu))
        else:
            cached = (share, shards / cfg.push_every * self.latency,
                      shards / cfg.pull_every * self.latency)
        self._per_shards[shards] = cached
        return cached

    def _ps_throughput(self, replicas: int, share_shards: int, latency_shards: int) -> float:
        """X with R replicas, the share of `share_shards` shards and the per-message costs of
        `latency_shards` shards (the same S for a real configuration)."""
        n = self.n
        if self.group.sync == "ps-async":
            # the worker's own transfers (latency of `latency_shards`) or the busiest shard's
            # service of the replica (share of `share_shards`), whichever is longer
            own_s = self._shards(latency_shards)[1]
            share, _, x_ps = self._shards(share_shards)
            serve_s = share * (self.push_bytes + self.pull_bytes) / self.ps_bandwidth
            worker_step_s = self._combine(self.busy_s, max(own_s, serve_s))
            return min(replicas * n / worker_step_s, x_ps)
        share = self._shards(share_shards)[0]
        _, push_latency_s, pull_latency_s = self._shards(latency_shards)
        P, B, B_ps = self.P, self.bandwidth, self.ps_bandwidth
        push_s = max(self.push_bytes / P / B, replicas * share * self.push_bytes / B_ps) \
            + push_latency_s
        pull_s = max(self.pull_bytes / P / B, replicas * share * self.pull_bytes / B_ps) \
            + pull_latency_s
        apply_s = replicas * share * (self.update_s + self.fc_ps_s)
        step_s = self._combine(self.busy_s, push_s + apply_s + pull_s)
        return replicas * n / step_s

    def _allreduce_step_s(self, replicas: int) -> float:
        ring_s = ring_allreduce_time_s(replicas, self.ring_bytes, self.bandwidth, self.latency)
        return self._combine(self.busy_s, ring_s) + self.update_s

    # -- what the search uses -----------------------------------------------------------------

    def domain(self, machines: int) -> tuple[int, int] | None:
        """The search variable's range under a budget of `machines`: S for PS modes (each with
        at least one replica), R for all-reduce; None when nothing fits."""
        if self.group.uses_ps:
            hi = machines - self.P
            return (self.min_shards, hi) if hi >= self.min_shards else None
        hi = min(machines // self.P, self.most_replicas)
        return (1, hi) if hi >= 1 else None

    def _ps_replicas(self, shards: int, machines: int) -> int:
        """R for S shards: all the machines left, (M − S)/P, but no more than one epoch's."""
        return min((machines - shards) // self.P, self.most_replicas)

    def replicas_and_shards(self, x: int, machines: int) -> tuple[int, int]:
        if self.group.uses_ps:
            return self._ps_replicas(x, machines), x
        return x, 0

    def value(self, x: int, machines: int) -> float:
        """Throughput (samples/s) at search variable x under the budget."""
        self.evaluations += 1
        if self.group.uses_ps:
            return self._ps_throughput(self._ps_replicas(x, machines), x, x)
        return x * self.n / self._allreduce_step_s(x)

    def throughput(self, replicas: int, shards: int) -> float:
        """Throughput of the configuration (R, S) of this group."""
        self.evaluations += 1
        if self.group.uses_ps:
            return self._ps_throughput(replicas, shards, shards)
        return replicas * self.n / self._allreduce_step_s(replicas)

    def bound(self, lo: int, hi: int, machines: int) -> float:
        """An upper bound of value(x) over x in [lo, hi] (equal to it when lo == hi)."""
        self.bounds += 1
        if self.group.uses_ps:
            return self._ps_throughput(self._ps_replicas(lo, machines), hi, lo)
        return hi * self.n / self._allreduce_step_s(lo)
