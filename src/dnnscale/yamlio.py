"""Reading YAML files at the boundary, with one-line errors that name what was being read.

Every file goes through dnnscale.safe_yaml: at most MAX_FILE_BYTES of UTF-8, nesting, aliases
and expanded size bounded, text keys once per mapping.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, short_repr
from dnnscale.safe_yaml import load_yaml_text, read_limited


def load_yaml_file(path: Path, what: str) -> dict[str, Any]:
    """Read a YAML mapping from `path`; errors name `what` (e.g. 'workload')."""
    path = Path(path)
    data = load_yaml_text(read_limited(path, what), what, short_repr(str(path)))
    if not isinstance(data, dict):
        raise InputError(what, f"{short_repr(str(path))} must hold a YAML mapping, got "
                         f"{type(data).__name__}")
    return data


def is_yaml_source(source: object, what: str) -> bool:
    """Whether a name-or-path argument means a YAML file: it ends in .yaml/.yml or names an
    existing file. Odd strings (NUL bytes, names too long for the system) raise InputError."""
    text = str(source)
    if "\0" in text:
        raise InputError(what, "the name or path holds a NUL character")
    path = Path(text)
    if path.suffix in (".yaml", ".yml"):
        return True
    try:
        return path.is_file()
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # too long for a file: a name, then
            return False
        raise InputError(what, f"cannot use {short_repr(text)}: {exc.strerror}") from None


def path_beside(value: object, source: str) -> Path:
    """A path that a YAML file names (a cluster's `profile:`): `~` expanded, and a relative one
    taken from the folder of the file `source` (when `source` is a file)."""
    path = Path(str(value)).expanduser()
    if not path.is_absolute() and source and Path(source).is_file():
        path = Path(source).parent / path
    return path
