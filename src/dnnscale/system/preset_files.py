"""The package's preset files (system/presets/*.yaml), read once each."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from dnnscale.units import parse_quantity


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


def device_peaks(device_name: str) -> dict[str, float]:
    """precision -> dense peak FLOP/s of presets/devices.yaml's `device_name` ({} if the table
    has no such device)."""
    facts = preset_table("devices").get(device_name)
    if not isinstance(facts, dict):
        return {}
    where = f"devices.{device_name}"
    return {str(precision): parse_quantity(value, "flops", f"{where}.peak_flops.{precision}")
            for precision, value in facts["peak_flops"].items() if value is not None}
