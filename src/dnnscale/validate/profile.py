"""Give a testbed-derived cluster what a calibrated hardware profile measured."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dnnscale.system import System


def apply_profile(cluster: System, profile_path: Path, desc: Any = None,
                  supplements: Sequence[Path] = ()) -> System:
    """`cluster` with what the profile measured, and of each partition-exchange operation the
    profile did not measure, the fits of the first of `supplements` (later calibrations of
    the same testbed setting: system/profile.load_supplement) that did.

    - compute: every machine's curves, memory rates and update cost from the profile (per
      core, scaled by each machine's cores). A profile measured inside a testbed host under
      its quota with the other hosts busy (calibration.under_quota) already holds throttling
      and contention, so with the testbed's description `desc` each role's cores are its
      asked quota, not `check`'s measured share (which holds the same contention once more);
    - network: the links' bandwidth stays the cluster's (the testbed's measured links); the
      per-message latency is at least the calibrated point-to-point α between two ranks (gloo
      and Python, under the quota); all-reduce fits per group size and the held-pull fits
      ride on the workers' tier (model/collectives.py reads them), each fit's bandwidth bounded
      by physics: an all-reduce's by the link's rate (a ring moves its bytes over each
      member's link), held pulls from S shards by S shard links (a fit from latency-bound
      points came out at 16x the link, docs/testbed.md); a collective's wait under
      the quota is the system's per-call cost for its group size (System.call_s), the median
      over the sizes measured where a system asks for one figure; the runtime's layer
      exchanges (partition_exchange: all-gather and reduce-scatter per group size, a stripe's
      halo per neighbour count) ride on the workers' tier as those operations' fits,
      bandwidth bounded by the link's rate, and as their measured curves, which price them
      before the fits (the α-β line missed mid-sized exchanges by up to 2x, docs/accuracy.md).
    """
    from dnnscale.model.collectives import PULL_PIECE_CURVE
    from dnnscale.system.load import profile_machine
    from dnnscale.system.profile import load_profile, load_supplement

    profile = load_profile(profile_path)
    exchanges = list(profile.partition_exchange)
    for path in supplements:
        have = {fit.operation for fit in exchanges}
        exchanges += [fit for fit in load_supplement(path) if fit.operation not in have]
    under_quota = bool(profile.calibration.get("under_quota")) and desc is not None

    def calibrated(machine, role: str):  # type: ignore[no-untyped-def]
        cores = machine.cores
        if under_quota:
            hosts = desc.hosts_with_role(role)
            cores = statistics.fmean(h.cpu_cores for h in hosts) if hosts else cores
        return profile_machine(profile, cores=cores, memory_bytes=machine.memory_bytes)

    link_bytes_per_s = cluster.network.bandwidth_bytes_per_s
    shard_link_bytes_per_s = (cluster.ps_network or cluster.network).bandwidth_bytes_per_s
    network = dataclasses.replace(
        cluster.network,
        latency_s=max(cluster.network.latency_s,
                      profile.network.latency_s if profile.network else 0.0),
        allreduce_fits=tuple((link.peers, min(link.bandwidth_bytes_per_s, link_bytes_per_s),
                              link.latency_s)
                             for link in profile.allreduce) or cluster.network.allreduce_fits,
        fits=cluster.network.fits + tuple(
            ("ps_sync_pull", link.peers,
             min(link.bandwidth_bytes_per_s, (link.shards or 1) * shard_link_bytes_per_s),
             link.latency_s)
            for link in profile.ps_sync_pull) + tuple(
            (link.operation, link.peers, min(link.bandwidth_bytes_per_s, link_bytes_per_s),
             link.latency_s)
            for link in exchanges))
    network = dataclasses.replace(network, curves=tuple(
        (link.operation, link.peers, link.points) for link in exchanges if link.points)
        + tuple((PULL_PIECE_CURVE, link.peers,  # per piece: collectives.held_pull_convoy_s
                 tuple((x / (link.shards or 1), t / (link.shards or 1)) for x, t in link.points))
                for link in profile.ps_sync_pull if link.points))
    ps_network = cluster.ps_network
    if ps_network is not None and profile.ps_network is not None:
        ps_network = dataclasses.replace(
            ps_network, latency_s=max(ps_network.latency_s, profile.ps_network.latency_s))
    waits = [seconds for _, seconds in profile.collective_call_wait]
    return dataclasses.replace(
        cluster, machine=calibrated(cluster.machine, "worker"),
        ps_machine=calibrated(cluster.ps_machine, "ps") if cluster.ps_machine else None,
        network=network, ps_network=ps_network,
        collective_call_s=statistics.median(waits) if waits else cluster.collective_call_s,
        collective_call_waits=tuple((int(m), float(w)) for m, w in profile.collective_call_wait),
        collective_cpu=profile.collective_cpu or cluster.collective_cpu,
        calibrated=True, profile_source=str(profile_path))
