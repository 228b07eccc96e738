"""Memory feasibility (performance-model.md §5) as the optimizer needs it.

A worker's memory depends on P and n only, a PS machine's on S only (it holds ceil(W/S)
parameters, nonincreasing in S), so feasibility splits into: which (P, n) fit a worker, and the
fewest shards S_min whose PS machines fit. Both are read from predict_config's own memory figures
and `fits` flag, never recomputed here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dnnscale.system import System
from dnnscale.plan.config import Config
from dnnscale.errors import InputError
from dnnscale.model.predict import predict_config
from dnnscale.model.stage import StageCosts
from dnnscale.units import format_si
from dnnscale.workload.workload import Workload


@dataclass(frozen=True)
class Infeasible:
    """A part of the space that does not fit in memory, and why (reported, never ranked)."""

    what: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"what": self.what, "reason": self.reason}


def worker_fits(workload: Workload, cluster: System, base: Config, partitions: int,
                minibatch: int, stage: StageCosts) -> tuple[bool, float]:
    """(fits, bytes) of one worker at (P, n), from predict_config's memory figures."""
    probe = replace(base, sync="allreduce", partitions=partitions, replicas=1, ps_shards=0,
                    minibatch=minibatch, fc_protocol="weights")
    prediction = predict_config(workload, cluster, probe, stage=stage)
    return prediction.fits, prediction.memory_bytes["worker"]


def min_ps_shards(workload: Workload, cluster: System, base: Config, stage: StageCosts,
                  limit: int) -> int | None:
    """Fewest shards S ≤ limit whose PS machines fit in memory (None if none), by bisection on
    predict_config with a configuration whose worker surely fits (its own stage costs).

    The probe pushes weights whatever the base's FC protocol: a shard holds its slice either
    way (model/memory.py), and the vector protocol's per-shard traffic is O(S) to price, which
    the bisection's S up to `limit` (the stored parameters) would make slow."""

    def fits(shards: int) -> bool:
        probe = replace(base, sync="ps-async", partitions=stage.partitions, replicas=1,
                        ps_shards=shards, minibatch=stage.minibatch, fc_protocol="weights")
        memory = predict_config(workload, cluster, probe, stage=stage).memory_bytes["ps"]
        return memory <= cluster.ps.memory_bytes

    if limit < 1 or not fits(limit):
        return None
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def ranges(values: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts: list[str] = []
    start = prev = None
    for value in sorted(values):
        if prev is not None and value == prev + 1:
            prev = value
            continue
        if start is not None:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        start = prev = value
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(parts)


def too_small_error(machines: int, min_partitions: int | None, min_shards: int | None,
                    modes: tuple[str, ...], workload: Workload, cluster: System,
                    widest: tuple[int, int, float]) -> InputError:
    """The error for a budget with no feasible configuration, saying what is missing.

    min_partitions: fewest workers per replica that fit in memory (None: no P fits);
    min_shards: fewest PS machines that fit (None: none within the budget); widest: (P, n, bytes)
    of the roomiest worker tried, for the message when nothing fits at all.
    """
    if min_partitions is None:
        partitions, minibatch, need = widest
        return InputError("workload", f"{workload.name} does not fit in worker memory even split "
                          f"over P={partitions} partitions (the most its layers and the budget "
                          f"allow) at minibatch {minibatch}: {format_si(need, 'B')} per worker > "
                          f"{format_si(cluster.machine.memory_bytes, 'B')}")
    per_replica = (f"at least {min_partitions} machine{'s' if min_partitions > 1 else ''} per "
                   f"replica to fit in worker memory")
    if "allreduce" in modes:
        return InputError("machines", f"{machines} machine{'s are' if machines != 1 else ' is'} "
                          f"too few: the model needs {per_replica}")
    if min_shards is None:
        return InputError("machines", f"{machines} machines are too few: the model needs "
                          f"{per_replica}, and the parameter server's shards do not fit in memory "
                          f"on the {max(machines - min_partitions, 0)} machines left beside them")
    total = min_partitions + min_shards
    return InputError("machines", f"{machines} machine{'s are' if machines != 1 else ' is'} too "
                      f"few: the model needs {per_replica} and {min_shards} parameter-server "
                      f"machine{'s' if min_shards > 1 else ''} to hold the weights, so at least "
                      f"{total} machines")
