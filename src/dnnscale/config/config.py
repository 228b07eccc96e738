"""The parallel configuration (how training is split) and its validity rules."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from dnnscale.errors import InputError, require_int, short_repr

if TYPE_CHECKING:
    from dnnscale.cluster.spec import Cluster
    from dnnscale.workload.layer import Layer
    from dnnscale.workload.workload import Workload

SYNC_MODES = ("ps-async", "ps-sync", "allreduce")
FC_PROTOCOLS = ("weights", "vectors")
OPTIMIZER_STATE_VALUES = {"sgd": 0, "momentum": 1, "adam": 2}


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

    def label(self) -> str:
        ps = f"S={self.ps_shards} " if self.uses_ps else ""
        return f"P={self.partitions} R={self.replicas} {ps}{self.sync} n={self.minibatch}"


def config_from_dict(data: dict[str, Any], where: str = "config") -> Config:
    """Validate a mapping (YAML or flags) into a Config; errors name the field."""
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping of fields, got {type(data).__name__}")
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
        if sync == "allreduce" and shards != 0:
            raise InputError(f"{where}.ps_shards", f"must be 0 with sync allreduce (no parameter "
                             f"server), got {shards}")
        if sync != "allreduce" and shards < 1:
            raise InputError(f"{where}.ps_shards", f"must be >= 1 with sync {sync}, got {shards}")
    if values.get("fc_protocol", "weights") not in FC_PROTOCOLS:
        raise InputError(f"{where}.fc_protocol", f"must be one of {', '.join(FC_PROTOCOLS)}, "
                         f"got {short_repr(values['fc_protocol'])}")
    if values.get("fc_protocol") == "vectors" and sync == "allreduce":
        raise InputError(f"{where}.fc_protocol", "'vectors' needs a parameter server, not allreduce")
    if not isinstance(values.get("optimizer", "sgd"), str) or \
            values.get("optimizer", "sgd") not in OPTIMIZER_STATE_VALUES:
        raise InputError(f"{where}.optimizer", f"must be one of "
                         f"{', '.join(OPTIMIZER_STATE_VALUES)}, got "
                         f"{short_repr(values['optimizer'])}")
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


def max_replicas(workload: "Workload", minibatch: int) -> int:
    """The most replicas whose global step R·n still fits in one epoch: floor(samples / n).

    An epoch shorter than one global step would mean a step that trains on more samples than
    the epoch has, so configurations with R·n > samples_per_epoch are not valid."""
    return workload.samples_per_epoch // minibatch


def _layer_limit(layer: "Layer") -> int:
    from dnnscale.model.partition import split_schemes

    return max(layer.split_extent(scheme) for scheme in split_schemes(layer))


def max_partitions(workload: "Workload") -> int:
    """The largest P every weighted layer can be split into (at least one unit per worker)."""
    limits = [_layer_limit(layer) for layer in workload.layers if layer.has_weights]
    return min(limits) if limits else 1


def check_config(config: Config, workload: "Workload", cluster: "Cluster") -> None:
    """Rules that need the workload and the cluster; raises InputError naming the field."""
    if config.minibatch > workload.samples_per_epoch:
        raise InputError("config.minibatch", f"{config.minibatch} is more than the "
                         f"{workload.samples_per_epoch} samples of one epoch")
    if config.replicas > max_replicas(workload, config.minibatch):
        raise InputError("config.replicas", f"R·n = {config.replicas}·{config.minibatch} = "
                         f"{config.replicas * config.minibatch} samples per global step is more "
                         f"than one epoch ({workload.samples_per_epoch} samples); at most "
                         f"{max_replicas(workload, config.minibatch)} replicas")
    if config.machines > cluster.machines:
        raise InputError("config", f"needs {config.machines} machines (P·R + S = "
                         f"{config.partitions}·{config.replicas} + {config.ps_shards}) but cluster "
                         f"{cluster.name!r} has {cluster.machines}")
    weighted = [layer for layer in workload.layers if layer.has_weights]
    if weighted:
        narrow = min(weighted, key=_layer_limit)
        limit = _layer_limit(narrow)
        if config.partitions > limit:
            raise InputError("config.partitions", f"{config.partitions} is more than layer "
                             f"{narrow.name!r} can be split into (at most {limit})")
