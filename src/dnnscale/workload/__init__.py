"""Workloads: what is trained (layers, shapes, FLOPs, bytes), the zoo and the YAML format."""

from __future__ import annotations

from pathlib import Path

from dnnscale.workload.layer import Layer
from dnnscale.workload.transformer import transformer_workload
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload, build_workload
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
    ``hf:path/config.json:seq=4096,flash=true``), or a Workload (returned as is)."""
    if isinstance(source, Workload):
        return source
    if isinstance(source, str) and source.startswith("hf:"):
        from dnnscale.workload.hf_config import load_hf_source

        return load_hf_source(source)
    path = Path(source)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        from dnnscale.workload.spec import load_workload_yaml

        return load_workload_yaml(path)
    return zoo_workload(str(source))
