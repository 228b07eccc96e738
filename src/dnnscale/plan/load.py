"""Plans from YAML, mappings or objects: Adam's `Config` fields (partitions, replicas, ps_shards,
sync, minibatch, ...) or the Megatron-style fields of plan/modern.py (tp, pp, dp, ...)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dnnscale.errors import InputError
from dnnscale.plan.config import Config, config_from_dict, validate_config
from dnnscale.plan.modern import check_parallel_plan, is_modern, modern_plan_from_dict
from dnnscale.plan.plan import ParallelPlan
from dnnscale.yamlio import load_yaml_file


def load_config(source: "str | Path | Config | dict[str, Any]") -> Config:
    """A Config (re-validated), a mapping of its fields, or a config YAML path."""
    if isinstance(source, Config):
        return validate_config(source)
    if isinstance(source, dict):
        return config_from_dict(source)
    if not isinstance(source, (str, Path)):
        raise InputError("config", f"must be a Config, a YAML path or a mapping, got "
                         f"{type(source).__name__}")
    return config_from_dict(load_yaml_file(Path(source), "config"))


def load_plan(source: "str | Path | Config | ParallelPlan | dict[str, Any]") -> "Config | ParallelPlan":
    """Adam's flags (a Config, or a mapping/YAML of its fields) or a Megatron-style plan (a
    ParallelPlan with Megatron's rules, or a mapping/YAML of plan/modern.py's fields), each
    re-validated; Adam's stay a Config so that they report under their own flags."""
    if isinstance(source, ParallelPlan):
        return check_parallel_plan(source)
    if isinstance(source, (str, Path)) and not isinstance(source, Config):
        data = load_yaml_file(Path(source), "config")
        return modern_plan_from_dict(data) if is_modern(data) else config_from_dict(data)
    if isinstance(source, dict) and is_modern(source):
        return modern_plan_from_dict(source)
    return load_config(source)
