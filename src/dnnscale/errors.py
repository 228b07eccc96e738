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


def require_positive(field: str, value: float) -> float:
    """Return `value` if it is a finite number > 0, else raise InputError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(field, f"must be a number, got {value!r}")
    if not value > 0 or value != value or value == float("inf"):
        raise InputError(field, f"must be > 0, got {value!r}")
    return value


def require_int(field: str, value: object, minimum: int = 1) -> int:
    """Return `value` if it is an integer >= `minimum`, else raise InputError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(field, f"must be an integer, got {value!r}")
    if value < minimum:
        raise InputError(field, f"must be >= {minimum}, got {value}")
    return value
