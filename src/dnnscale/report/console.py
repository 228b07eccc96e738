"""The console every command prints its tables to, and how wide it is.

In a terminal, the terminal's width. Piped or redirected, rich would fall back to 80 columns
and wrap the tables; dnnscale prints them at their natural width instead (PIPE_WIDTH is only
an upper bound: a table is never wider than its content). `dnnscale --width N` (or COLUMNS)
sets it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PIPE_WIDTH = 4000
"""Columns when stdout is not a terminal: wide enough that no table wraps."""

_width: int | None = None


def set_width(width: int | None) -> None:
    """The width given by `--width` (None: decide by the terminal)."""
    global _width
    _width = width


def width_for(stream: Any) -> int | None:
    """Columns to print with: --width, else COLUMNS, else None (the terminal's) for a
    terminal and PIPE_WIDTH otherwise."""
    if _width is not None:
        return _width
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):
        interactive = False
    return None if interactive else PIPE_WIDTH


def console(stderr: bool = False) -> Any:
    """A rich Console on stdout (or stderr) at `width_for` that stream."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(width=width_for(stream), stderr=stderr)
