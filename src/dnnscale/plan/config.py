"""Project Adam's flags (P, R, S, sync mode, minibatch, intervals): `Config`, which builds a plan.

Every wave-1 flag and YAML field keeps working: a Config is validated here and turned into a
`ParallelPlan` by `Config.to_plan()` — P is a tensor split with Adam's rules, R data parallelism,
S parameter-server shards (or a ring all-reduce with `sync: allreduce`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from dnnscale.boundary import require_mapping
from dnnscale.errors import InputError, require_int, short_repr
from dnnscale.plan.plan import (FC_PROTOCOLS, OPTIMIZERS, Batch, Collective, DataParallel,
                                ParallelPlan, ParameterServer, TensorSplit)
from dnnscale.plan.rules import protocol_needs_ps, ps_shards_for_sync, require

SYNC_MODES = ("ps-async", "ps-sync", "allreduce")


@dataclass(frozen=True)
class Config:
    """P partitions per replica, R replicas, S parameter-server shards (0 with all-reduce).

    minibatch: samples one replica processes per step (n). push_every / pull_every: steps between
    a worker's pushes of accumulated updates / pulls of fresh weights (k_push, k_pull).
    fc_protocol: 'weights' (push weight gradients) or 'vectors' (Project Adam's protocol: push
    activation and error vectors of FC layers; the PS computes their outer products).
    overlap: communication overlaps computation, combined with the cluster's γ-norm.
    epoch_fraction: Adam's straggler cut-off f (an epoch ends when f of the samples are done).
    """

    partitions: int = 1
    replicas: int = 1
    ps_shards: int = 1
    sync: str = "ps-async"
    minibatch: int = 32
    push_every: int = 1
    pull_every: int = 1
    fc_protocol: str = "weights"
    overlap: bool = False
    optimizer: str = "sgd"
    epoch_fraction: float = 1.0

    @property
    def uses_ps(self) -> bool:
        return self.sync != "allreduce"

    @property
    def workers(self) -> int:
        return self.partitions * self.replicas

    @property
    def machines(self) -> int:
        """Machines the configuration occupies: R·P workers plus S parameter servers."""
        return self.workers + self.ps_shards

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_plan(self) -> ParallelPlan:
        """The plan these flags describe: P → tensor split (Adam's rules), R → data parallelism
        aggregated by S parameter-server shards (asynchronous or not) or a ring all-reduce."""
        aggregation: ParameterServer | Collective
        if self.sync == "allreduce":
            aggregation = Collective("ring", 0)
        else:
            aggregation = ParameterServer(self.ps_shards, self.sync == "ps-async",
                                          self.push_every, self.pull_every, self.fc_protocol)
        return ParallelPlan(tensor=TensorSplit(self.partitions, "adam"),
                            data=DataParallel(self.replicas, aggregation),
                            batch=Batch(self.minibatch, 1), optimizer=self.optimizer,
                            overlap=self.overlap, epoch_fraction=self.epoch_fraction)

    def label(self) -> str:
        ps = f"S={self.ps_shards} " if self.uses_ps else ""
        adam = ("" if self.fc_protocol == "weights" else f" fc={self.fc_protocol}") \
            + (" overlap" if self.overlap else "")
        return f"P={self.partitions} R={self.replicas} {ps}{self.sync} n={self.minibatch}{adam}"


def config_from_dict(data: dict[str, Any], where: str = "config") -> Config:
    """Validate a mapping (YAML or flags) into a Config; errors name the field."""
    require_mapping(data, where)
    known = {f.name for f in fields(Config)}
    unknown = sorted(str(key) for key in set(data) - known)
    if unknown:
        raise InputError(f"{where}.{unknown[0][:60]}", f"unknown field (known: {', '.join(sorted(known))})")
    values = {k: v for k, v in data.items() if v is not None}
    sync = values.get("sync", "ps-async")
    if sync not in SYNC_MODES:
        raise InputError(f"{where}.sync", f"must be one of {', '.join(SYNC_MODES)}, got "
                         f"{short_repr(sync)}")
    if sync == "allreduce":
        values.setdefault("ps_shards", 0)
    for name in ("partitions", "replicas", "minibatch", "push_every", "pull_every"):
        if name in values:
            require_int(f"{where}.{name}", values[name])
    if "ps_shards" in values:
        shards = require_int(f"{where}.ps_shards", values["ps_shards"], minimum=0)
        require(ps_shards_for_sync(sync, shards), where)
    if values.get("fc_protocol", "weights") not in FC_PROTOCOLS:
        raise InputError(f"{where}.fc_protocol", f"must be one of {', '.join(FC_PROTOCOLS)}, "
                         f"got {short_repr(values['fc_protocol'])}")
    require(protocol_needs_ps(values.get("fc_protocol", "weights"), sync), where)
    if not isinstance(values.get("optimizer", "sgd"), str) or \
            values.get("optimizer", "sgd") not in OPTIMIZERS:
        raise InputError(f"{where}.optimizer", f"must be one of "
                         f"{', '.join(OPTIMIZERS)}, got {short_repr(values['optimizer'])}")
    if "overlap" in values and not isinstance(values["overlap"], bool):
        raise InputError(f"{where}.overlap", f"must be true or false, got "
                         f"{short_repr(values['overlap'])}")
    fraction = values.get("epoch_fraction", 1.0)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise InputError(f"{where}.epoch_fraction", f"must be in (0, 1], got "
                         f"{short_repr(fraction)}")
    return Config(**values)


def validate_config(config: object, where: str = "config") -> Config:
    """Re-validate a Config object (e.g. one a Python caller built) through the same rules as
    YAML and flags: `Config(replicas=-2)` or `Config(sync="gossip")` raise InputError naming the
    field. Returns the config."""
    if not isinstance(config, Config):
        raise InputError(where, f"must be a Config, a YAML path or a mapping, got "
                         f"{type(config).__name__}")
    return config_from_dict(config.to_dict(), where)
