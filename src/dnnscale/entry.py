"""The `dnnscale` program: Ctrl-C and a broken stdout end it with a code, never a traceback.

This module imports only the standard library and puts its SIGINT handler in place when it is
imported, before the heavy imports (typer, rich, numpy) start: from then on Ctrl-C exits 130
with no traceback (while the command runs it unwinds as KeyboardInterrupt, so outputs and
temporary files are cleaned up; before and after, there is nothing to clean and the process
ends at once). Only what runs before this module is the interpreter's own: its start-up and
`import dnnscale` (which is kept to the standard library, 10-40 ms). A SIGINT that was ignored
when the program started (a background job) stays ignored.

stdout that cannot be written, once, for every command: a closed pipe (`dnnscale ... | head
-1`) ends the program quietly with exit code 141, as a Unix tool killed by SIGPIPE; any other
failure (`> /dev/full`) prints ``error: stdout: REASON`` on stderr and exits 1. Either way the
rest of the output is thrown away (stdout then points at /dev/null), so the interpreter's last
flush has nothing to complain about.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a job ended by Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
EXIT_STDOUT_FAILED = 1

_state = {"running": False}


def _on_sigint(signum: int, frame: object) -> None:
    if _state["running"]:
        raise KeyboardInterrupt
    os._exit(EXIT_INTERRUPTED)  # importing, or finished: nothing to unwind


class _GuardedStdout:
    """sys.stdout, remembering the first OSError a write or flush raised (which the command
    may report as something else: rich exits 1 on a broken pipe, typer too)."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self.failure: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)  # type: ignore[attr-defined, no-any-return]
        except OSError as exc:
            self.failure = self.failure or exc
            raise

    def flush(self) -> None:
        try:
            self._stream.flush()  # type: ignore[attr-defined]
        except OSError as exc:
            self.failure = self.failure or exc
            raise

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null: what is still buffered, and later writes, go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _install() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


_install()  # at import: the script's next line runs main, but a Ctrl-C may come in between


def main() -> None:
    """Run the CLI (the `dnnscale` script and `python -m dnnscale`)."""
    _install()
    guard = _GuardedStdout(sys.stdout) if sys.stdout is not None else None
    if guard is not None:
        sys.stdout = guard
    code: str | int | None = 0
    try:
        from dnnscale.cli import app

        _state["running"] = True
        try:
            app()
        finally:
            if guard is not None and guard.failure is None:
                guard.flush()  # inside the try: a failure here is a stdout failure too
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except OSError:
        if guard is None or guard.failure is None:
            raise
    finally:
        _state["running"] = False
    if guard is not None and guard.failure is not None:
        code = _stdout_failed(guard.failure)
    sys.exit(code)


def _stdout_failed(exc: OSError) -> int:
    _discard_stdout()
    if exc.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    try:
        print(f"error: stdout: {exc.strerror or exc}", file=sys.stderr)
    except OSError:
        pass
    return EXIT_STDOUT_FAILED
