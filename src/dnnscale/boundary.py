"""The last line of the input boundary: inputs that each pass their own rules but together give
no finite answer (rates near zero, sizes near the limits) fail as InputError, not as a crash or
as an absurd number.

`finite_answers(field)` wraps predict and optimize: ZeroDivisionError and OverflowError from the
model become one InputError naming `field`. `check_prediction` rejects a prediction whose step
time, epoch time or throughput is not a finite number > 0, whose times exceed MAX_SECONDS, or
whose memory parts are not a finite number of bytes up to MAX_COUNT (errors.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from dnnscale.errors import InputError, short_repr

F = TypeVar("F", bound=Callable[..., Any])

_HINT = "check the cluster's rates and the workload's sizes for extreme values"


def finite_answers(field: str) -> Callable[[F], F]:
    """Decorate a predict/optimize entry point: arithmetic that breaks down on the user's numbers
    raises InputError(field, ...) instead of a traceback."""

    def decorate(func: F) -> F:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except (ZeroDivisionError, OverflowError) as exc:
                raise InputError(field, f"the inputs give no finite answer "
                                 f"({type(exc).__name__}: {exc}); {_HINT}") from None

        return wrapper  # type: ignore[return-value]

    return decorate


MAX_SECONDS = 1e12
"""The longest step, epoch or step part a prediction may report: about 31,700 years. The slowest
real question (GPT-3 175B's 300 B tokens on one V100 in fp32) is about 10^10.5 s; an answer past
10^12 s comes from inputs outside any real training (a batch or sizes near the limits), and is
refused as such instead of printed."""


def _sane(value: object, upper: float, positive: bool) -> bool:
    """A finite number in (0, upper] (or [0, upper] unless `positive`); bools are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and (value > 0 if positive else value >= 0) and value <= upper


def check_prediction(prediction: Any, field: str = "predict") -> Any:
    """`prediction` if its answer is finite and sane: step time, epoch time and throughput
    finite and > 0, every step part and the times at most MAX_SECONDS, every memory part a
    finite number of bytes in [0, MAX_COUNT], tokens/s and MFU (when given) finite and >= 0."""
    from dnnscale.errors import MAX_COUNT

    checks: list[tuple[str, object, float, bool]] = [
        ("step_time_s", prediction.step_time_s, MAX_SECONDS, True),
        ("epoch_time_s", prediction.epoch_time_s, MAX_SECONDS, True),
        ("throughput_samples_per_s", prediction.throughput_samples_per_s, math.inf, True)]
    checks += [(f"{part.name} seconds", part.seconds, MAX_SECONDS, False)
               for part in prediction.parts]
    checks += [(f"{part.role} {part.name} bytes", part.bytes, float(MAX_COUNT), False)
               for part in prediction.memory]
    checks += [(name, value, math.inf, False) for name, value in
               (("tokens_per_s", prediction.tokens_per_s), ("mfu", prediction.mfu))
               if value is not None]
    for name, value, upper, positive in checks:
        if not _sane(value, upper, positive):
            raise InputError(field, f"the inputs give a {name} of {short_repr(value)}"
                             + (f" (more than {upper:.0e})" if _sane(value, math.inf, positive)
                                else "") + f"; {_HINT}")
    return prediction


def require_mapping(data: object, where: str) -> dict[str, Any]:
    """`data` if it is a mapping whose keys are all strings (what YAML gives; a Python caller's
    dict may mix `{1: 2, "tp": 2}`), else InputError naming `where` (or the odd key)."""
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping of fields, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise InputError(f"{where}[{short_repr(key, 40)}]", f"field names must be text, got "
                             f"a key of type {type(key).__name__}")
    return data


def require_bool(field: str, value: object) -> bool:
    """`value` if it is a real boolean (YAML true/false; never the string "false", which Python
    would read as true), else InputError naming `field`."""
    if not isinstance(value, bool):
        raise InputError(field, f"must be true or false, got {short_repr(value)}")
    return value


def require_switches(field: str, value: object) -> tuple[bool, ...] | None:
    """A switch or the choices of it (true, false, or a non-empty list of them) as sorted
    distinct choices (off first); None stays None; anything else is an InputError naming
    `field`."""
    if value is None:
        return None
    items = [value] if isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not items or \
            any(not isinstance(item, bool) for item in items):
        raise InputError(field, f"must be true, false or a list of them, got "
                         f"{short_repr(value)}")
    return tuple(sorted(set(items)))
