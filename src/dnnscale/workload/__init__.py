"""Workloads: what is trained (layers, shapes, FLOPs, bytes), the zoo and the YAML format."""

from __future__ import annotations

from pathlib import Path

from dnnscale.workload.layer import Layer
from dnnscale.errors import InputError
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload, build_workload, check_workload
from dnnscale.yamlio import is_yaml_source
from dnnscale.workload.zoo import ZOO, zoo_workload

__all__ = ["Layer", "TransformerShape", "Workload", "ZOO", "build_workload", "from_torch",
           "load_workload", "transformer_workload", "zoo_workload"]


def __getattr__(name: str) -> object:
    # from_torch needs torch, which predict must never import: load it only when asked for.
    if name == "from_torch":
        from dnnscale.workload.torch_import import from_torch

        return from_torch
    raise AttributeError(f"module 'dnnscale.workload' has no attribute {name!r}")


def load_workload(source: "str | Path | Workload") -> Workload:
    """A zoo name, a YAML file path, ``hf:path/config.json`` (a Hugging Face config, optionally
    ``hf:path/config.json:seq=4096,flash=true``), or a Workload (re-validated)."""
    if isinstance(source, Workload):
        return check_workload(source)
    if not isinstance(source, (str, Path)):
        raise InputError("workload", f"must be a zoo name, a YAML path or a Workload, got "
                         f"{type(source).__name__}")
    if isinstance(source, str) and source.startswith("hf:"):
        from dnnscale.workload.hf_config import load_hf_source

        return load_hf_source(source)
    path = Path(source)
    if is_yaml_source(source, "workload"):
        from dnnscale.workload.spec import load_workload_yaml

        return load_workload_yaml(path)
    return zoo_workload(str(source))
