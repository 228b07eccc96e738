"""Config YAML: the fields of `Config` (partitions, replicas, ps_shards, sync, minibatch, ...)."""

from __future__ import annotations

from pathlib import Path

from dnnscale.plan.config import Config, config_from_dict
from dnnscale.yamlio import load_yaml_file


def load_config(source: "str | Path | Config") -> Config:
    if isinstance(source, Config):
        return source
    return config_from_dict(load_yaml_file(Path(source), "config"))
