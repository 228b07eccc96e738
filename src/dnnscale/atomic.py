"""Output files: checked before any work starts, written whole or not at all.

`check_output_path` is called by every command that takes `-o`/`--plot`/... before it loads or
measures anything, so a bad path costs the user nothing. `atomic_output` yields a temporary
file in the destination's folder and renames it over the destination only when the block
finishes: an existing file stays as it was until the new one is complete, and an error or
Ctrl-C leaves neither a half-written file nor the temporary behind.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dnnscale.errors import InputError, short_repr


def check_output_path(path: "str | Path", field: str, *, folder: bool = False) -> Path:
    """Raise InputError naming `field` unless `path` can be written: its folder exists and is
    writable, and it is not itself a folder (with folder=True: it is a folder or can be made
    one in an existing folder). Returns the path."""
    text = str(path)
    if not text or "\0" in text:
        raise InputError(field, f"not a usable path: {short_repr(text)}")
    out = Path(text).expanduser()
    shown = short_repr(str(out))
    try:
        exists, is_dir = out.exists(), out.is_dir()
        parent = out.parent if str(out.parent) else Path(".")
        parent_ok = parent.is_dir()
    except OSError as exc:
        raise InputError(field, f"cannot use {shown}: {exc.strerror}") from None
    if folder:
        if exists and not is_dir:
            raise InputError(field, f"{shown} is a file, not a folder")
        target = out if exists else parent
        if not exists and not parent_ok:
            raise InputError(field, f"folder {short_repr(str(parent))} does not exist")
    else:
        if is_dir:
            raise InputError(field, f"{shown} is a folder; give a file name")
        if not parent_ok:
            raise InputError(field, f"folder {short_repr(str(parent))} does not exist")
        if exists and not os.access(out, os.W_OK):
            raise InputError(field, f"{shown} is not writable")
        target = parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise InputError(field, f"folder {short_repr(str(target))} is not writable")
    return out


def partial_path(path: "str | Path") -> Path:
    """Where a long-running command writes `path` while it runs: ``NAME.partial`` beside it
    (a fixed name, so the records can be followed live and every rank of a run finds it)."""
    out = Path(path)
    return out.with_name(out.name + ".partial")


@contextmanager
def atomic_output(path: "str | Path", field: str = "output", *, partial: bool = False,
                  keep_on: tuple[type[BaseException], ...] = ()) -> Iterator[Path]:
    """Yield a temporary path next to `path` (same suffix, so tools that infer a format from it
    still do); on success it replaces `path` atomically, on any exception (Ctrl-C included) it is
    removed and `path` is left untouched. OSError while creating or renaming -> InputError.

    partial: the temporary is `partial_path(path)` (emptied first) instead of a hidden random
    name. keep_on: exceptions after which the temporary still replaces `path` before the
    exception goes on (a failed run's records, which end with the error, are kept)."""
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    try:
        if partial:
            temp = partial_path(out)
            handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            handle, temporary = tempfile.mkstemp(prefix=f".{out.name}.",
                                                 suffix=f".tmp{out.suffix}", dir=folder)
            temp = Path(temporary)
    except OSError as exc:
        raise InputError(field, f"cannot write {short_repr(str(out))}: {exc.strerror}") from None
    os.close(handle)
    try:
        yield temp
    except keep_on:
        _replace(temp, out, field)
        raise
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _replace(temp, out, field)


def _replace(temp: Path, out: Path, field: str) -> None:
    try:
        os.chmod(temp, 0o644)
        os.replace(temp, out)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise InputError(field, f"cannot write {short_repr(str(out))}: "
                         f"{exc.strerror or exc}") from None


def atomic_write_text(path: "str | Path", text: str, field: str = "output") -> Path:
    """Write `text` to `path` atomically (see `atomic_output`), flushed to disk first."""
    with atomic_output(path, field) as temp:
        try:
            with open(temp, "w", encoding="utf-8") as stream:
                stream.write(text)
                stream.flush()
                os.fsync(stream.fileno())
        except OSError as exc:
            raise InputError(field, f"cannot write {short_repr(str(path))}: "
                             f"{exc.strerror or exc}") from None
    return Path(path)
