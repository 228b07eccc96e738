"""Strict JSON for everything dnnscale prints or writes: non-finite numbers become null.

Python's json module writes NaN and Infinity, which no JSON parser must accept. Every command
goes through `dumps` (or `print_json`), which turns NaN, +inf and -inf (floats, or numpy
scalars) into null and then refuses anything else that is not JSON. docs/formats.md says what
a null means where a number is expected: the value is unbounded or undefined (e.g. an
unconstrained capacity, or a ratio with nothing to compare).
"""

from __future__ import annotations

import json
import math
from typing import Any


def strict(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (mappings and lists recursively;
    tuples become lists, numpy scalars and arrays plain Python values)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {key: strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        return strict(tolist())
    return value


def dumps(data: Any, indent: int | None = 2) -> str:
    """Strict JSON text of `data` (NaN and infinities as null)."""
    separators = (",", ":") if indent is None else None
    return json.dumps(strict(data), indent=indent, allow_nan=False, separators=separators)


def print_json(data: Any) -> None:
    """Print `data` as strict, indented JSON on stdout."""
    print(dumps(data))
