"""The validation grid: which configurations to predict and run, and which calibrate baselines.

Format::

    workload: adam-cifar10
    defaults: {minibatch: 16}      # merged into every configuration
    steps: 10                      # timed steps per run
    warmup: 3                      # untimed steps first
    repeats: 3                     # runs per configuration (>= 1; the protocol asks >= 3)
    timeout: 120s                  # per-run rank timeout
    lr: 0.05
    calibration:                   # fits the baselines only; must not overlap `configs`
      - {partitions: 1, replicas: 1, ps_shards: 1, sync: ps-sync}
    configs:
      - {partitions: 2, replicas: 2, ps_shards: 1, sync: ps-async}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dnnscale.plan import Config, config_from_dict
from dnnscale.errors import InputError, require_int, require_positive, short_repr
from dnnscale.units import parse_quantity
from dnnscale.yamlio import load_yaml_file

_FIELDS = {"workload", "defaults", "steps", "warmup", "repeats", "timeout", "lr", "calibration",
           "configs", "description"}


@dataclass(frozen=True)
class Grid:
    workload: str
    configs: tuple[Config, ...]
    calibration: tuple[Config, ...]
    steps: int = 10
    warmup: int = 3
    repeats: int = 3
    timeout_s: float = 120.0
    lr: float = 0.05


def _configs(items: Any, defaults: dict[str, Any], where: str) -> tuple[Config, ...]:
    if not isinstance(items, list):
        raise InputError(where, "must be a list of configurations")
    configs = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(f"{where}[{index}]", f"must be a mapping, got {short_repr(item)}")
        configs.append(config_from_dict({**defaults, **item}, f"{where}[{index}]"))
    return tuple(configs)


def grid_from_dict(data: dict[str, Any]) -> Grid:
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise InputError(f"grid.{unknown[0]}", f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    if "configs" not in data:
        raise InputError("grid.configs", "missing")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InputError("grid.defaults", "must be a mapping of configuration fields")
    configs = _configs(data["configs"], defaults, "grid.configs")
    calibration = _configs(data.get("calibration") or [], defaults, "grid.calibration")
    if not configs:
        raise InputError("grid.configs", "must list at least one configuration")
    shared = set(configs) & set(calibration)
    if shared:
        raise InputError("grid.calibration", f"{next(iter(shared)).label()} is also a validated "
                         "configuration; the calibration set must be disjoint")
    if len(set(configs)) != len(configs):
        raise InputError("grid.configs", "lists a configuration twice")
    timeout = parse_quantity(data.get("timeout", 120.0), "time", "grid.timeout")
    return Grid(workload=str(data.get("workload", "")), configs=configs, calibration=calibration,
                steps=require_int("grid.steps", data.get("steps", 10)),
                warmup=require_int("grid.warmup", data.get("warmup", 3), minimum=0),
                repeats=require_int("grid.repeats", data.get("repeats", 3)),
                timeout_s=require_positive("grid.timeout", timeout),
                lr=require_positive("grid.lr", data.get("lr", 0.05)))


def load_grid(path: Path) -> Grid:
    return grid_from_dict(load_yaml_file(path, "grid"))
