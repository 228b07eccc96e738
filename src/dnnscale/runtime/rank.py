"""One rank of a run: `python -m dnnscale.runtime.rank` (started by launch.py), or called
in-process by `dnnscale run --rank-from-env` (started by torchrun or any launcher).

Environment for the module form: DNNSCALE_RUN_SPEC (job JSON path), DNNSCALE_RANK,
DNNSCALE_WORLD_SIZE, DNNSCALE_INIT_METHOD (tcp://ADDR:PORT), optional DNNSCALE_HEARTBEAT (a file
this rank rewrites with its progress every 0.2 s, so the launcher can tell a frozen rank from a
waiting one) and DNNSCALE_HOST (the host name reported in the records).

Exit codes: 0 done; 3 gave up waiting for a peer (process-group timeout); 4 lost a peer
(connection closed); 5 the launcher (parent process) is gone; 1 anything else. The launcher uses them to blame the right rank.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

EXIT_PEER_TIMEOUT = 3
EXIT_PEER_LOST = 4
EXIT_ORPHANED = 5
LOOSE_TIMEOUT = timedelta(days=1)


class Progress:
    """The step a rank is on, written to a heartbeat file by a daemon thread.

    The same thread ends the process (exit 5) when its parent, the launcher, has gone, so a
    killed launcher never leaves ranks behind.
    """

    def __init__(self, path: str | None, interval_s: float = 0.2) -> None:
        self.step = -1
        self.path = path
        self.parent = os.getppid()
        if path:
            threading.Thread(target=self._beat, args=(path, interval_s), daemon=True).start()

    def _beat(self, path: str, interval_s: float) -> None:
        tmp = f"{path}.tmp"
        while True:
            if os.getppid() != self.parent:
                os._exit(EXIT_ORPHANED)
            try:
                with open(tmp, "w", encoding="utf-8") as handle:
                    handle.write(f"{self.step}\n")
                os.replace(tmp, path)
            except OSError:
                pass  # the launcher is cleaning up; the parent check above ends us
            time.sleep(interval_s)

    def set(self, step: int) -> None:
        self.step = step


def classify_failure(exc: BaseException) -> int:
    """Exit code for an exception: a peer timeout, a lost peer, or anything else."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if "timed out" in text or "timeout" in text:
        return EXIT_PEER_TIMEOUT
    if any(word in text for word in ("connection reset", "connection closed", "broken pipe",
                                     "connection refused", "end of file", "peer")):
        return EXIT_PEER_LOST
    return 1


@dataclass
class RankSetup:
    """What one rank knows once the process groups exist."""

    spec: Any
    config: Any
    workload: Any
    schemes: dict[str, str]
    role: Any
    host: str
    writer: Any
    partition_group: Any  # this replica's P workers (None: P = 1 or a shard)
    replica_group: Any  # this partition's R replicas, all-reduce only (None otherwise)
    loose: Any  # every rank, long timeout: PS requests and the end-of-run gather
    shard_map: Any  # None with all-reduce


def run_rank(spec: Any, rank: int, world: int, init_method: str, progress: Progress | None = None,
             truncate_output: bool = False, host: str | None = None) -> dict[str, Any] | None:
    """Train as rank `rank` of `world`; rank 0 returns the summary record (others None)."""
    import torch
    import torch.distributed as dist

    from dnnscale.runtime.layout import (ShardMap, partition_group_ranks, rank_roles,
                                         replica_group_ranks, world_size)
    from dnnscale.runtime.netplan import check_runnable, partition_param_counts, weighted_schemes
    from dnnscale.runtime.records import JsonlWriter
    from dnnscale.workload import load_workload

    torch.set_num_threads(1)
    progress = progress or Progress(None)
    config = spec.config_obj()
    workload = load_workload(spec.workload)
    schemes = weighted_schemes(workload, spec.conv_split)
    check_runnable(workload, config, schemes)
    if world != world_size(config):
        raise SystemExit(f"error: world size {world} does not match the config, which needs "
                         f"{world_size(config)} ranks (P·R + S)")
    role = rank_roles(config)[rank]
    if truncate_output:
        open(spec.output, "w").close()
    timeout = timedelta(seconds=spec.timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timeout)
    writer = JsonlWriter(spec.output)
    try:
        # Every rank creates every group, in the same order.
        partition_groups = {r: dist.new_group(partition_group_ranks(config, r), timeout=timeout)
                            for r in range(config.replicas)} if config.partitions > 1 else {}
        replica_groups = {p: dist.new_group(replica_group_ranks(config, p), timeout=timeout)
                          for p in range(config.partitions)} \
            if config.sync == "allreduce" and config.replicas > 1 else {}
        # PS requests and the end-of-run gather wait on other replicas' progress, not on a
        # broken peer: a group with a long timeout (dead peers still fail it at once).
        loose = dist.new_group(list(range(world)), timeout=max(timeout, LOOSE_TIMEOUT))
        setup = RankSetup(
            spec=spec, config=config, workload=workload, schemes=schemes, role=role,
            host=host or socket.gethostname(), writer=writer,
            partition_group=partition_groups.get(role.replica),
            replica_group=replica_groups.get(role.partition), loose=loose,
            shard_map=ShardMap(partition_param_counts(workload, config.partitions, schemes),
                               config.ps_shards) if config.uses_ps else None)
        dist.barrier()  # the output file is truncated before anyone writes to it
        writer.write({"type": "start", **role.to_dict(), "pid": os.getpid(), "host": setup.host,
                      "time_unix_s": time.time()})
        stats = _run_worker(setup, progress) if role.kind == "worker" else _run_shard(setup)
        progress.set(spec.steps)
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(stats, gathered if rank == 0 else None, dst=0, group=loose)
        summary = _summary(setup, gathered) if rank == 0 else None
        if summary is not None:
            writer.write(summary)
        dist.barrier(group=loose)
        return summary
    finally:
        writer.close()
        dist.destroy_process_group()


def _run_worker(setup: RankSetup, progress: Progress) -> dict[str, Any]:
    """Build this worker's part of the network and data, seed the shards, train."""
    import torch.distributed as dist
    from torch.nn.utils import parameters_to_vector

    from dnnscale.runtime.data import TeacherData
    from dnnscale.runtime.layout import partition_group_ranks
    from dnnscale.runtime.netplan import classes, vector_regions
    from dnnscale.runtime.network import PartitionComm, PartitionedNet
    from dnnscale.runtime.ps import PSClient
    from dnnscale.runtime.records import worker_totals
    from dnnscale.runtime.worker import EpochCutoff, WorkerContext, train

    spec, config, role = setup.spec, setup.config, setup.role
    comm = PartitionComm(setup.partition_group, role.partition, config.partitions,
                         partition_group_ranks(config, role.replica))
    net = PartitionedNet(setup.workload, comm, spec.seed, setup.schemes)
    data = TeacherData(setup.workload.input_shape, classes(setup.workload), config.minibatch,
                       config.replicas, role.replica, spec.seed)
    client = None
    if setup.shard_map is not None:
        client = PSClient(setup.shard_map, role.partition, config.workers, setup.loose,
                          vector_regions(setup.workload, config, setup.schemes))
        if role.replica == 0:
            client.init(parameters_to_vector(net.parameters()).detach())
    dist.barrier(group=setup.loose)
    ctx = WorkerContext(rank=role.rank, replica=role.replica, partition=role.partition,
                        config=config, lr=spec.lr, ps=client, replica_group=setup.replica_group,
                        epoch=EpochCutoff.for_run(config, spec.steps, spec.warmup,
                                                  role.replica, role.partition))
    records = train(net, data, ctx, spec.steps, setup.writer.write, progress.set)
    if client is not None:
        client.done()
    return {"kind": "worker", "host": setup.host, **worker_totals(records, spec.warmup)}


def _run_shard(setup: RankSetup) -> dict[str, Any]:
    """Receive the initial weights, serve the workers until all are done, report."""
    import torch.distributed as dist

    from dnnscale.runtime.netplan import vector_regions
    from dnnscale.runtime.ps import ShardServer

    config, shard = setup.config, setup.role.shard
    server = ShardServer(setup.shard_map, shard, config.partitions, config.replicas,
                         setup.spec.lr, synchronous=config.sync == "ps-sync",
                         requests=setup.loose,
                         regions=vector_regions(setup.workload, config, setup.schemes),
                         samples_per_push=config.minibatch * config.push_every)
    server.receive_init()
    dist.barrier(group=setup.loose)
    stats = server.serve()
    record = {"type": "ps", **setup.role.to_dict(), "host": setup.host,
              "params": setup.shard_map.shard_size(shard),
              "pushes_by_rank": {str(k): v for k, v in sorted(stats.pushes_by_rank.items())},
              "values_received": stats.values_received,
              "pulls": stats.pulls, "updates_applied": stats.updates_applied,
              "busy_s": stats.busy_s, "wait_s": stats.wait_s,
              "param_change_l2": server.change_l2()}
    setup.writer.write(record)
    return {"kind": "ps", **record}


def _summary(setup: RankSetup, gathered: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 0's summary record from every rank's stats."""
    import torch

    from dnnscale.runtime.records import summarize

    workers = [s for s in gathered if s["kind"] == "worker"]
    shards = [{k: v for k, v in s.items() if k not in ("kind", "type")}
              for s in gathered if s["kind"] == "ps"]
    summary = summarize(workers, config=setup.config.to_dict(), workload=setup.workload.name,
                        hosts=[s["host"] for s in gathered], torch_version=torch.__version__,
                        steps=setup.spec.steps, warmup=setup.spec.warmup, shards=shards)
    summary["world_size"] = len(gathered)
    summary["conv_split"] = {name: scheme for name, scheme in setup.schemes.items()
                             if scheme != "features"}
    summary["lr"] = setup.spec.lr
    return summary


def import_then_join() -> None:
    """Import what a rank needs, then join the host's CPU cgroup if the placement deferred it
    (a testbed host's quota would make the imports take ~7 s instead of ~1.6 s)."""
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import dnnscale.runtime.network  # noqa: F401
    import dnnscale.runtime.ps  # noqa: F401
    import dnnscale.runtime.worker  # noqa: F401
    from dnnscale.runtime.placement import join_cgroup

    join_cgroup()


def main() -> int:
    """Module entry point for ranks started by launch.py."""
    progress = Progress(os.environ.get("DNNSCALE_HEARTBEAT"))
    import_then_join()
    from dnnscale.runtime.job import RunSpec

    spec = RunSpec.load(os.environ["DNNSCALE_RUN_SPEC"])
    try:
        run_rank(spec, int(os.environ["DNNSCALE_RANK"]), int(os.environ["DNNSCALE_WORLD_SIZE"]),
                 os.environ["DNNSCALE_INIT_METHOD"], progress,
                 host=os.environ.get("DNNSCALE_HOST"))
    except Exception as exc:  # noqa: BLE001 - reported to the launcher by exit code and log
        traceback.print_exc()
        return classify_failure(exc)
    return 0


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    sys.exit(main())
