"""The last line of the input boundary: inputs that each pass their own rules but together give
no finite answer (rates near zero, sizes near the limits) fail as InputError, not as a crash or
as an absurd number.

`finite_answers(field)` wraps predict and optimize: ZeroDivisionError and OverflowError from the
model become one InputError naming `field`. `check_prediction` rejects a prediction whose step
time, epoch time or throughput is not a finite number > 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from dnnscale.errors import InputError

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


def check_prediction(prediction: Any, field: str = "predict") -> Any:
    """`prediction` if its step time, epoch time and throughput are finite and > 0."""
    for name in ("step_time_s", "epoch_time_s", "throughput_samples_per_s"):
        value = getattr(prediction, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise InputError(field, f"the inputs give a {name} of {value!r}; {_HINT}")
    return prediction
