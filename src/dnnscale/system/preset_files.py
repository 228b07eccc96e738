"""The package's preset files (system/presets/*.yaml), read once each."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml


def presets_folder() -> Any:
    return resources.files("dnnscale.system") / "presets"


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""Package data is trusted: libyaml's safe loader where present (10x faster than PyYAML's)."""


def read_preset(item: Any) -> Any:
    return yaml.load(item.read_text(), Loader=_LOADER)  # noqa: S506 (a safe loader)


@functools.cache
def preset_table(name: str) -> dict[str, Any]:
    """The mapping of package file presets/`name`.yaml (devices, interconnects,
    attention_kernels, microbenchmarks); {} if it is not a mapping."""
    data = read_preset(presets_folder() / f"{name}.yaml")
    return data if isinstance(data, dict) else {}
