"""Reading YAML files at the boundary, with one-line errors that name what was being read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from dnnscale.errors import InputError


def load_yaml_file(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML mapping from `path`; errors name `what` (e.g. 'workload')."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(what, f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(what, f"malformed YAML in {path}{where}") from None
    if not isinstance(data, dict):
        raise InputError(what, f"{path} must hold a YAML mapping, got {type(data).__name__}")
    return data
