"""Errors that reach the user.

`InputError` is raised for anything wrong with what the user gave us (a file, a flag, a field).
Its message names the offending field and fits on one line; the CLI prints it and exits with
code 2, without a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class InputError(ValueError):
    """Bad user input. `field` is a dotted path such as ``cluster.network.bandwidth``."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class CommandFailed(RuntimeError):
    """A command's work failed (a run, a system step), not the user's input: exit code 1,
    the message on one line."""


def user_errors(func: F) -> F:
    """For CLI commands: InputError -> one line on stderr and exit 2; CommandFailed -> one line
    and exit 1; never a traceback for either."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import typer

        try:
            return func(*args, **kwargs)
        except InputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
        except CommandFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


MAX_COUNT = 2**53
"""The largest integer any count may be (exactly representable as a float, so no count loses
precision or overflows when the model turns it into seconds or bytes)."""


def require_positive(field: str, value: float) -> float:
    """Return `value` if it is a finite number > 0, else raise InputError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, f"must be a number, got {short_repr(value)}")
    if not _finite(value) or not value > 0:
        raise InputError(field, f"must be > 0 and finite, got {short_repr(value)}")
    return value


def _finite(value: float) -> bool:
    """Whether `value` is a finite float or an int a float can hold."""
    try:
        return abs(float(value)) < float("inf")
    except OverflowError:
        return False


def require_int(field: str, value: object, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """Return `value` if it is an integer in [`minimum`, `maximum`], else raise InputError
    naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, f"must be an integer, got {short_repr(value)}")
    if value < minimum:
        raise InputError(field, f"must be >= {minimum}, got {value}")
    if value > maximum:
        raise InputError(field, f"must be <= {maximum:,}, got {short_repr(value)}")
    return value


def require_count(field: str, value: object, minimum: int = 0) -> int:
    """Return `value` if it is an integer count >= `minimum` (0 by default) and <= MAX_COUNT."""
    return require_int(field, value, minimum=minimum)


def require_nonnegative(field: str, value: object) -> float:
    """Return `value` if it is a finite number >= 0, else raise InputError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, f"must be a number, got {short_repr(value)}")
    if not _finite(value) or not value >= 0:  # also false for NaN
        raise InputError(field, f"must be a finite number >= 0, got {short_repr(value)}")
    return value


def short_repr(value: object, limit: int = 60) -> str:
    """repr(value) cut to `limit` characters (a user's value may be huge), on one line."""
    try:
        text = repr(value) if not isinstance(value, (list, dict, tuple, set)) else \
            _bounded_repr(value, limit)
    except Exception:  # noqa: BLE001 - a repr that fails still gives a message
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _bounded_repr(value: object, limit: int) -> str:
    import reprlib

    shortener = reprlib.Repr()
    shortener.maxlevel, shortener.maxlist, shortener.maxdict = 3, 6, 6
    shortener.maxstring = shortener.maxother = limit
    return shortener.repr(value)
