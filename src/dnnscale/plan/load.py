"""Config YAML: the fields of `Config` (partitions, replicas, ps_shards, sync, minibatch, ...)."""

from __future__ import annotations

from pathlib import Path

from dnnscale.errors import InputError
from dnnscale.plan.config import Config, config_from_dict, validate_config
from dnnscale.yamlio import load_yaml_file


def load_config(source: "str | Path | Config | dict") -> Config:
    """A Config (re-validated), a mapping of its fields, or a config YAML path."""
    if isinstance(source, Config):
        return validate_config(source)
    if isinstance(source, dict):
        return config_from_dict(source)
    if not isinstance(source, (str, Path)):
        raise InputError("config", f"must be a Config, a YAML path or a mapping, got "
                         f"{type(source).__name__}")
    return config_from_dict(load_yaml_file(Path(source), "config"))
