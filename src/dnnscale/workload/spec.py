"""Workload YAML: read and write.

Format::

    name: my-net
    input_shape: [3, 32, 32]
    samples_per_epoch: 50000
    bytes_per_value: 4          # optional, default 4 (fp32)
    layers:
      - {kind: conv2d, name: conv1, out_channels: 64, kernel: 5, padding: 2}
      - {kind: relu}
      - {kind: maxpool2d, kernel: 3, stride: 2}
      - {kind: flatten}
      - {kind: linear, out_features: 10}
      - {kind: softmax_loss}

Layers of kind `generic` carry their counts explicitly (see workload/kinds.py). A transformer
workload also has a `transformer:` mapping, its `TransformerShape` (workload/transformer_shape.py),
and layers of the transformer kinds (workload/transformer_kinds.py).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from dnnscale.errors import InputError
from dnnscale.yamlio import load_yaml_file
from dnnscale.workload.transformer_shape import transformer_shape_from_dict
from dnnscale.workload.workload import Workload, build_workload

_TOP_FIELDS = {"name", "input_shape", "samples_per_epoch", "bytes_per_value", "layers",
               "description", "transformer"}


def workload_from_dict(data: dict[str, Any]) -> Workload:
    """Build a workload from the YAML mapping described in this module's docstring."""
    if not isinstance(data, dict):
        raise InputError("workload", f"must be a mapping, got {type(data).__name__}")
    unknown = set(data) - _TOP_FIELDS
    if unknown:
        raise InputError(f"workload.{sorted(map(str, unknown))[0][:60]}", f"unknown field (known: "
                         f"{', '.join(sorted(_TOP_FIELDS))})")
    for required in ("input_shape", "layers", "samples_per_epoch"):
        if required not in data:
            raise InputError(f"workload.{required}", "missing")
    if not isinstance(data["layers"], list):
        raise InputError("workload.layers", "must be a list of layers")
    shape = data.get("transformer")
    return build_workload(str(data.get("name", "workload")), data["input_shape"], data["layers"],
                          data["samples_per_epoch"], data.get("bytes_per_value", 4),
                          str(data.get("description", "")),
                          transformer=None if shape is None else transformer_shape_from_dict(shape))


def load_workload_yaml(path: Path) -> Workload:
    return workload_from_dict(load_yaml_file(path, "workload"))


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """The YAML mapping that `workload_from_dict` reads back into an equal workload."""
    layers = []
    for layer in workload.layers:
        entry: dict[str, Any] = {"kind": layer.kind, "name": layer.name}
        entry.update({k: list(v) if isinstance(v, tuple) else v for k, v in layer.hyper.items()})
        layers.append(entry)
    data: dict[str, Any] = {"name": workload.name, "input_shape": list(workload.input_shape),
                            "samples_per_epoch": workload.samples_per_epoch,
                            "bytes_per_value": workload.bytes_per_value,
                            "description": workload.description}
    if workload.transformer is not None:
        data["transformer"] = {k: list(v) if isinstance(v, tuple) else v
                               for k, v in asdict(workload.transformer).items()}
    data["layers"] = layers
    return data


def save_workload_yaml(workload: Workload, path: Path, field: str = "output") -> None:
    """Write the workload's YAML to `path` atomically; a failure raises InputError(field)."""
    from dnnscale.atomic import atomic_write_text

    atomic_write_text(path, yaml.safe_dump(workload_to_dict(workload), sort_keys=False), field)
