"""Output files: checked before any work starts, written whole or not at all, and never onto
anything but a file.

`check_output_path` is called by every command that takes `-o`/`--plot`/... before it loads or
measures anything, so a bad path costs the user nothing. `atomic_output` yields a temporary
file and, only when the block finishes, puts it where the user asked:

- a regular file, or a new name in an existing folder: the temporary sits beside it and is
  renamed over it, so an existing file stays as it was until the new one is complete, and an
  error or Ctrl-C leaves neither a half-written file nor the temporary behind;
- a stream, i.e. a named pipe (FIFO) that has a reader, a terminal, or /dev/null, /dev/zero,
  /dev/full (also through a symbolic link, such as /dev/stdout or /proc/self/fd/1): the
  temporary sits in a private folder of the system's temporary directory and its bytes are
  written straight into the stream at the end. The stream is never replaced, and it gets
  nothing if the command fails.

Everything else is refused with a one-line InputError naming the flag: a folder, a socket, a
block device, any other character device (/dev/mem, /dev/kmsg, ... are not outputs), a named
pipe with no reader (the write would wait forever), and a symbolic link to a regular file, to
a folder or to nothing (renaming over the link would replace the link; writing through it would
write somewhere other than the named folder). A path that names stdout while the command's
`--json` document goes there is refused too: stdout holds one JSON document or nothing.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from dnnscale.errors import InputError, short_repr

_STREAM_DEVICES = {(1, 3), (1, 5), (1, 7), (5, 0)}
"""Character devices (major, minor) an output may name: /dev/null, /dev/zero, /dev/full and
/dev/tty. Terminals (below) too; any other device is refused."""
_TERMINAL_MAJORS = {4, *range(136, 144)}
"""Virtual consoles and serial lines (4), pseudo-terminals (136-143)."""

_BATCH: ContextVar["list[tuple[Path, Path, str]] | None"] = ContextVar("batch", default=None)
_HELD_PIPES: dict[tuple[int, int], int] = {}
"""Named pipes opened by check_output_path, kept open until the write: closing the probe would
give the pipe's reader its end of file before the output comes."""


@contextmanager
def outputs_together() -> Iterator[None]:
    """Within the block, every `atomic_output` (not partial) keeps its finished temporary; they
    all go into place when the block ends, none of them if it raises: a command that fails
    while making its third output has not replaced the first two."""
    if _BATCH.get() is not None:
        yield
        return
    pending: list[tuple[Path, Path, str]] = []
    token = _BATCH.set(pending)
    try:
        yield
    except BaseException:
        for temp, _, _ in pending:
            temp.unlink(missing_ok=True)
        raise
    finally:
        _BATCH.reset(token)
    pending.sort(key=lambda item: not is_stream(item[1]))  # a stream write may fail (a
    # full device, a reader gone): try those first, then rename the files, which do not
    while pending:
        temp, out, field = pending.pop(0)
        try:
            finish_partial(temp, out, field)
        except BaseException:
            for rest, _, _ in pending:
                rest.unlink(missing_ok=True)
            raise


def is_stream(out: Path) -> bool:
    """Whether an output at `out` is written straight into a stream (a device or a pipe), not
    renamed into place; True for one that would be refused (its error comes first)."""
    try:
        return _classify(out, "output").stream
    except InputError:
        return True  # refused now: its error comes first, before any file is replaced


@dataclass(frozen=True)
class _Target:
    """Where an output goes: a file (renamed into place) or a stream (written straight)."""

    path: Path
    stream: bool
    info: "os.stat_result | None" = None  # the stream's (the link target's) stat


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISFIFO, "a named pipe")):
        if test(mode):
            return name
    return "not a regular file"


def _classify(out: Path, field: str) -> _Target:
    """What `out` names, or InputError for what may not be written (see the module doc)."""
    shown = short_repr(str(out))
    try:
        info = os.lstat(out)
    except FileNotFoundError:
        return _Target(out, stream=False)
    except NotADirectoryError:
        raise InputError(field, f"folder {short_repr(str(out.parent))} does not exist") from None
    except OSError as exc:
        raise InputError(field, f"cannot use {shown}: {exc.strerror or exc}") from None
    if stat.S_ISREG(info.st_mode):
        return _Target(out, stream=False)
    if stat.S_ISDIR(info.st_mode):
        raise InputError(field, f"{shown} is a folder; give a file name")
    link = stat.S_ISLNK(info.st_mode)
    if link:
        try:
            info = os.stat(out)
        except OSError:
            raise InputError(field, f"{shown} is a symbolic link to nothing; give a file "
                             "name (a link is never replaced or written through)") from None
        if not (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            what = "a file" if stat.S_ISREG(info.st_mode) else _kind(info.st_mode)
            raise InputError(field, f"{shown} is a symbolic link to {what}; give the real "
                             "path (a link is never replaced or written through)")
    if stat.S_ISCHR(info.st_mode):
        device = (os.major(info.st_rdev), os.minor(info.st_rdev))
        if device not in _STREAM_DEVICES and device[0] not in _TERMINAL_MAJORS:
            raise InputError(field, f"{shown} is a device ({device[0]}:{device[1]}); outputs "
                             "go to files, pipes, terminals or /dev/null only")
        return _Target(out, stream=True, info=info)
    if stat.S_ISFIFO(info.st_mode):
        return _Target(out, stream=True, info=info)
    raise InputError(field, f"{shown} is {_kind(info.st_mode)}; give a file name")


def _refuse_json_stdout(target: _Target, field: str) -> None:
    """A stream that is this process's stdout, while the running command prints --json there."""
    if target.info is None or "typer" not in sys.modules:
        return
    try:
        same = os.path.samestat(target.info, os.fstat(1))
    except OSError:
        return
    if not same:
        return
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        return
    context = get_current_context(silent=True)
    while context is not None:
        if context.params.get("as_json"):
            raise InputError(field, f"{short_repr(str(target.path))} is stdout, which holds "
                             "the --json document; give a file")
        context = context.parent


def check_distinct(outputs: "Iterable[tuple[str, str | Path | None]]",
                   inputs: "tuple[str | Path | None, ...]" = ()) -> None:
    """InputError naming the later flag when two outputs, or an output and an input file, are
    one file (`--config plan.yaml --html plan.yaml` would replace the plan with the page;
    `--csv f --html f` would keep only the last). Streams (/dev/null, pipes) may be shared;
    `inputs` that are not existing files (a zoo name, a preset) are skipped."""
    read = {_file_key(path) for path in inputs if path is not None} - {None}
    written: dict[object, str] = {}
    for field, path in outputs:
        if path is None:
            continue
        found = _file_key(path)
        if found is None:
            if is_stream(Path(path)):
                continue
            found = ("new", os.path.realpath(Path(path).parent), Path(path).name)
        elif found in read:
            raise InputError(field, f"{short_repr(str(path))} is also an input of this "
                             f"command; writing it would replace the input")
        if found in written:
            raise InputError(field, f"{short_repr(str(path))} is also the output of "
                             f"{written[found]}")
        written[found] = field


def _file_key(path: "str | Path") -> "tuple[int, int] | None":
    """(device, inode) of an existing regular file; None for anything else."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None


def check_output_path(path: "str | Path", field: str, *, folder: bool = False) -> Path:
    """Raise InputError naming `field` unless `path` can be written: a new name in an existing,
    writable folder, a writable regular file, or a stream (see the module doc); with
    folder=True: a folder, or a new one in an existing folder. Returns the path."""
    text = str(path)
    if not text or "\0" in text:
        raise InputError(field, f"not a usable path: {short_repr(text)}")
    out = Path(text).expanduser()
    shown = short_repr(str(out))
    parent = out.parent if str(out.parent) else Path(".")
    if folder:
        try:
            exists, is_dir, parent_ok = out.exists(), out.is_dir(), parent.is_dir()
        except OSError as exc:
            raise InputError(field, f"cannot use {shown}: {exc.strerror}") from None
        if exists and not is_dir:
            raise InputError(field, f"{shown} is a file, not a folder")
        if not exists and not parent_ok:
            raise InputError(field, f"folder {short_repr(str(parent))} does not exist")
        target_folder = out if exists else parent
    else:
        target = _classify(out, field)
        if target.stream:
            _refuse_json_stdout(target, field)
            if not os.access(out, os.W_OK):
                raise InputError(field, f"{shown} is not writable")
            if target.info is not None and stat.S_ISFIFO(target.info.st_mode):
                _hold_pipe(target, field)
            return out
        try:
            exists, parent_ok = out.exists(), parent.is_dir()
        except OSError as exc:
            raise InputError(field, f"cannot use {shown}: {exc.strerror}") from None
        if not parent_ok:
            raise InputError(field, f"folder {short_repr(str(parent))} does not exist")
        if exists and not os.access(out, os.W_OK):
            raise InputError(field, f"{shown} is not writable")
        target_folder = parent
    if not os.access(target_folder, os.W_OK | os.X_OK):
        raise InputError(field, f"folder {short_repr(str(target_folder))} is not writable")
    return out


def _key(info: os.stat_result) -> tuple[int, int]:
    return info.st_dev, info.st_ino


def _open_stream(target: _Target, field: str) -> int:
    """A blocking descriptor for writing into the stream; a named pipe must have a reader
    (O_NONBLOCK: ENXIO instead of waiting for one forever)."""
    assert target.info is not None
    held = _HELD_PIPES.pop(_key(target.info), None)
    if held is not None:
        return held
    try:
        handle = os.open(target.path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise InputError(field, f"{short_repr(str(target.path))} is a named pipe with no "
                             "reader (start the reader first)") from None
        raise InputError(field, f"cannot write {short_repr(str(target.path))}: "
                         f"{exc.strerror or exc}") from None
    os.set_blocking(handle, True)
    return handle


def _hold_pipe(target: _Target, field: str) -> None:
    assert target.info is not None
    if _key(target.info) not in _HELD_PIPES:
        _HELD_PIPES[_key(target.info)] = _open_stream(target, field)


def partial_path(path: "str | Path") -> Path:
    """Where a long-running command writes `path` while it runs: ``NAME.partial`` beside it
    (a fixed name, so the records can be followed live and every rank of a run finds it). For
    a stream (a pipe, /dev/null, ...) a fixed name in the temporary directory instead: nothing
    is ever created beside a device."""
    out = Path(path)
    try:
        info = os.stat(out)
    except OSError:
        info = None
    if info is not None and (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        digest = hashlib.sha256(str(out.absolute()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"dnnscale-{os.getuid()}-{digest}.partial"
    return out.with_name(out.name + ".partial")


@contextmanager
def atomic_output(path: "str | Path", field: str = "output", *, partial: bool = False,
                  keep_on: tuple[type[BaseException], ...] = ()) -> Iterator[Path]:
    """Yield a temporary path (same suffix, so tools that infer a format from it still do); on
    success its bytes go to `path` (see the module doc), on any exception (Ctrl-C included) it
    is removed and `path` is left untouched. OSError while creating or writing -> InputError.

    partial: the temporary is `partial_path(path)` (emptied first) instead of a hidden random
    name. keep_on: exceptions after which the temporary still goes to `path` before the
    exception goes on (a failed run's records, which end with the error, are kept)."""
    out = Path(path)
    target = _classify(out, field)
    folder = out.parent if str(out.parent) else Path(".")
    try:
        if partial:
            temp = partial_path(out)
            handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        else:
            handle, temporary = tempfile.mkstemp(
                prefix=f".{out.name}.", suffix=f".tmp{out.suffix}",
                dir=None if target.stream else folder)
            temp = Path(temporary)
    except OSError as exc:
        raise InputError(field, f"cannot write {short_repr(str(out))}: {exc.strerror}") from None
    os.close(handle)
    try:
        yield temp
    except keep_on:
        finish_partial(temp, out, field)
        raise
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    batch = _BATCH.get()
    if batch is not None and not partial:
        batch.append((temp, out, field))
    else:
        finish_partial(temp, out, field)


def finish_partial(temp: "str | Path", out: "str | Path", field: str = "output") -> None:
    """Put the finished temporary `temp` where `out` says (renamed over a file, or written into
    a stream and removed); `temp` is gone afterwards either way."""
    temp, out = Path(temp), Path(out)
    try:
        target = _classify(out, field)  # again: the path may have changed while we worked
        if target.stream:
            _refuse_json_stdout(target, field)
            _copy_into(temp, target, field)
            return
        try:
            os.chmod(temp, 0o644)
            os.replace(temp, out)
        except OSError as exc:
            raise InputError(field, f"cannot write {short_repr(str(out))}: "
                             f"{exc.strerror or exc}") from None
    finally:
        temp.unlink(missing_ok=True)


def _copy_into(temp: Path, target: _Target, field: str) -> None:
    try:
        sys.stdout.flush()  # the stream may be our own stdout: what was printed comes first
    except (OSError, ValueError):
        pass
    handle = _open_stream(target, field)
    try:
        with open(handle, "wb", closefd=True) as sink, open(temp, "rb") as source:
            shutil.copyfileobj(source, sink)
    except OSError as exc:
        raise InputError(field, f"cannot write {short_repr(str(target.path))}: "
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
