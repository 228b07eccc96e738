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
from collections.abc import Iterator
from contextlib import contextmanager
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
    """Print `data` as strict, indented JSON on stdout, whole: the text is made first, then
    written and flushed while a Ctrl-C is held back, so an interrupted command leaves the whole
    document or none (the held Ctrl-C takes effect right after; a second one at once)."""
    import sys

    text = dumps(data) + "\n"  # ASCII: a character is a byte
    with _ctrl_c_held():
        for start in range(0, len(text), _PIPE_BUF):
            sys.stdout.write(text[start:start + _PIPE_BUF])
            sys.stdout.flush()


_PIPE_BUF = 4096
"""Bytes a pipe takes whole or not at all. A larger write that a signal interrupts returns
short, and Python 3.11's buffered stdout then drops the rest of the text (seen with strace:
one write of 1 MB returns 65,536 and none follows); pieces this size never come back short."""


@contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """SIGINT recorded instead of acted on within the block, then replayed. A Python handler,
    not a blocked signal mask: the kernel gives a process's signal to any thread that does not
    block it (numpy's BLAS threads do not), and Python then runs the handler in the main
    thread anyway."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.getsignal(signal.SIGINT)

    def hold(signum: int, frame: Any) -> None:
        if held:  # a second Ctrl-C: the user means it
            _replay(previous, signum, frame)
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            _replay(previous, signal.SIGINT, None)


def _replay(handler: Any, signum: int, frame: Any) -> None:
    import os
    import signal

    if callable(handler):
        handler(signum, frame)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)
