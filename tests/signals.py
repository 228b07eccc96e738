"""Ctrl-C in tests as a user at a terminal sends it, also when the suite runs as a background
job: a shell starts background commands with SIGINT ignored, every child inherits that, and a
program that starts with SIGINT ignored rightly stays uninterruptible (dnnscale.entry)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


def sigint_default() -> None:
    """A `preexec_fn`: the child starts with SIGINT's default action, as a foreground
    program does (Python then raises KeyboardInterrupt on it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process meanwhile, whatever it was before."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
