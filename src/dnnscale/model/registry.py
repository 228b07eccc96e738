"""A registry of cost formulas: pure functions of sizes and rates, SI units in and out.

Each formula is registered with `@cost_formula` and its docstring states the formula, the units
and the source (the pattern of torch.utils.flop_counter's `register_flop_formula`). Users may
register their own and look them up by name in `COST_FORMULAS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., float])
COST_FORMULAS: dict[str, Callable[..., float]] = {}


def cost_formula(func: F) -> F:
    """Register `func` under its name; it must document Formula, Units and Source."""
    doc = func.__doc__ or ""
    missing = [word for word in ("Formula", "Units", "Source") if word not in doc]
    if missing:
        raise TypeError(f"cost formula {func.__name__} lacks {', '.join(missing)} in its docstring")
    COST_FORMULAS[func.__name__] = func
    return func
