"""Errors that reach the user.

`InputError` is raised for anything wrong with what the user gave us (a file, a flag, a field).
Its message names the offending field and fits on one line; the CLI prints it and exits with
code 2, without a traceback. However long a user's value, no error line echoes more than
MAX_VALUE_CHARS of it, nor runs past MAX_LINE_CHARS (`clip_line`, applied by InputError itself
and by the two places the CLI prints errors: `user_errors` and cli_errors.one_line).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

MAX_VALUE_CHARS = 200
"""The most characters of one value (a run of text without a space) an error line echoes."""
MAX_LINE_CHARS = 400
"""The most characters of one error line, ``error: FIELD: problem`` included."""
CUT = "\u2026"
"""What marks a cut: '…'."""


def clip_line(text: str, limit: int = MAX_LINE_CHARS, run: int = MAX_VALUE_CHARS) -> str:
    """`text` on one line: whitespace collapsed, every run of more than `run` characters without
    a space (a value: a name, a path, a number's digits) cut to `run` ending in '…', and the
    whole cut to `limit` ending in '…'."""
    text = " ".join(str(text).split())
    if len(text) > run:
        text = re.sub(r"\S{%d,}" % (run + 1), lambda match: match.group()[:run - 1] + CUT, text)
    return text if len(text) <= limit else text[:limit - 1] + CUT


class InputError(ValueError):
    """Bad user input. `field` is a dotted path such as ``cluster.network.bandwidth``, or the
    flag the user typed (``--replicas``). Both are clipped (`clip_line`): a user's value of any
    length gives a message of at most MAX_LINE_CHARS."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = clip_line(field, MAX_VALUE_CHARS)
        self.problem = clip_line(problem)
        super().__init__(f"{self.field}: {self.problem}" if self.field else self.problem)


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
            field = typed_field(exc.field)
            print(clip_line(f"error: {field}: {exc.problem}" if field else f"error: {exc}"),
                  file=sys.stderr)
            raise typer.Exit(2) from None
        except CommandFailed as exc:
            print(clip_line(f"error: {exc}", limit=4 * MAX_LINE_CHARS), file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


_ALIASES: ContextVar[Mapping[str, str]] = ContextVar("dnnscale_flag_aliases", default={})


@contextmanager
def flag_aliases(aliases: Mapping[str, str]) -> Iterator[None]:
    """Within: errors naming a key of `aliases` name its value instead, for a command that
    runs another with flags of its own making (`report -o F` runs `predict ... --html F`:
    its errors must say ``--output``, which the user typed)."""
    token = _ALIASES.set({**_ALIASES.get(), **aliases})
    try:
        yield
    finally:
        _ALIASES.reset(token)


FIELD_PREFIXES = ("config.", "plan.", "optimize.", "base.", "run.")
"""How the layers below the CLI name a field that a flag sets: ``config.replicas`` (-R),
``plan.virtual_stages`` (--virtual-stages), or the bare parameter (``modes``)."""


def typed_field(field: str) -> str:
    """The flag the user typed for an error's `field`, when one set it: ``config.replicas`` ->
    ``--replicas`` if -R/--replicas is on the command line (a value from a --config file
    keeps its ``config.`` path), ``modes`` -> ``--modes``; the aliases of `flag_aliases` on
    top. Outside a CLI command, `field` as it is."""
    key = field
    for prefix in FIELD_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    typed = _typed_params()
    found = typed.get(key.replace("-", "_"))
    # never an on/off flag's (it has no value to be wrong); a bare name is an API argument's
    # (``modes``) unless the option names a file or preset (``workload``: the file's own root)
    if found is not None and not found[1] and not (key == field and key in SOURCE_OPTIONS):
        field = found[0]
    via = LOADER_FLAGS.get(field)
    if via is not None and field[2:].replace("-", "_") not in typed and via in typed:
        field = typed[via][0]
    return _ALIASES.get().get(field, field)


LOADER_FLAGS = {"--hf-config": "workload"}
"""Loaders that name their file by describe's flag (``--hf-config``): on a command line
without that flag, the file came as ``-w hf:config.json``, and the error names --workload."""


def typed_options() -> dict[str, str]:
    """The options on the command line of the click command now running: parameter name ->
    the flag as typed, by its long name (``-R 2`` -> ``--replicas``, ``--no-overlap`` for an
    on/off flag given off). Empty outside a CLI command (the Python API)."""
    return {name: flag for name, (flag, _) in _typed_params().items()}


def _typed_params() -> dict[str, tuple[str, bool]]:
    """typed_options with whether each is an on/off flag."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - typer is a dependency; the API works without
        return {}
    ctx = get_current_context(silent=True)
    if ctx is None:
        return {}
    typed: dict[str, tuple[str, bool]] = {}
    for param in ctx.command.params:
        if getattr(param, "param_type_name", "") != "option" or param.name is None:
            continue
        source = ctx.get_parameter_source(param.name)
        if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT", "PROMPT"):
            continue
        opts = list(param.opts)
        if getattr(param, "secondary_opts", None) and ctx.params.get(param.name) is False:
            opts = list(param.secondary_opts)
        typed[param.name] = (next((o for o in opts if o.startswith("--")), opts[0]),
                             bool(getattr(param, "is_flag", False)))
    return typed


SOURCE_OPTIONS = frozenset({"workload", "cluster", "config", "testbed", "profile", "configs",
                            "description", "validation", "plan"})
"""Options that name a file or preset: a bare error field of theirs (``workload``,
``cluster``) is the input's own root, whose dotted paths (``cluster.network.bandwidth``) name
what is wrong inside it; they stay as they are."""


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
