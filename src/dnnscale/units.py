"""Human units at the boundary, SI inside.

`parse_quantity("10Gbit/s", "bandwidth")` -> 1.25e9 (bytes/s). Every parser accepts a plain
number (already SI) or a string with a unit; decimal prefixes are powers of 1000, binary ones
(KiB, MiB, GiB) powers of 1024. Bits are converted to bytes (8 bits = 1 byte).
"""

from __future__ import annotations

import re

from dnnscale.errors import InputError, short_repr

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "m": 1e-3, "M": 1e6, "G": 1e9, "g": 1e9, "T": 1e12,
           "P": 1e15, "u": 1e-6, "µ": 1e-6, "n": 1e-9}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}

# dimension -> {unit suffix (lower-case): factor to SI}
_UNITS: dict[str, dict[str, float]] = {
    "bandwidth": {"b/s": 1.0, "byte/s": 1.0, "bit/s": 1 / 8, "bps": 1 / 8, "bit": 1 / 8},
    "bytes": {"b": 1.0, "byte": 1.0, "bytes": 1.0},
    "time": {"s": 1.0, "sec": 1.0},
    "flops": {"flop/s": 1.0, "flops": 1.0},
    "flop": {"flop": 1.0},
}

# One way only to match each number (no nested choices), so a long bad string fails in linear time.
_NUMBER = r"((?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)"
_LONGEST = 64
"""Characters in a quantity string; '1.25GB/s' needs 8."""
_PATTERN = re.compile(r"^\s*" + _NUMBER + r"\s*([A-Za-zµ/]*)\s*$")


def parse_quantity(value: object, dimension: str, field: str) -> float:
    """Parse a number or a string with a unit of `dimension` into SI; errors name `field`.

    Dimensions: bandwidth (-> bytes/s), bytes, time (-> s), flops (-> FLOP/s), flop (-> FLOP).
    """
    if isinstance(value, bool):
        raise InputError(field, f"expected a {dimension}, got {short_repr(value)}")
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise InputError(field, f"expected a {dimension} such as {_example(dimension)}, got {short_repr(value)}")
    if len(value) > _LONGEST:
        raise InputError(field, f"cannot read {short_repr(value)} as a {dimension} (more than "
                         f"{_LONGEST} characters)")
    match = _PATTERN.match(value)
    if not match:
        raise InputError(field, f"cannot read {short_repr(value)} as a {dimension} (e.g. {_example(dimension)})")
    number, unit = float(match.group(1)), match.group(2)
    if unit == "":
        return number
    factor = _unit_factor(unit, dimension)
    if factor is None:
        raise InputError(field, f"unknown unit in {short_repr(value)} for a {dimension} (e.g. {_example(dimension)})")
    return number * factor


def _unit_factor(unit: str, dimension: str) -> float | None:
    table = _UNITS[dimension]
    # Bits and bytes are case sensitive in the base ("Gb" is ambiguous; we read 'bit' and 'B').
    for binary, scale in _BINARY.items():
        if unit.startswith(binary):
            base = _base_factor(unit[len(binary):], table)
            return None if base is None else scale * base
    for prefix in sorted(_PREFIX, key=len, reverse=True):
        if prefix and unit.startswith(prefix):
            base = _base_factor(unit[len(prefix):], table)
            if base is not None:
                return _prefix_scale(prefix, dimension) * base
    return _base_factor(unit, table)


def _prefix_scale(prefix: str, dimension: str) -> float:
    # tc and most network people write 'mbit' for megabit: a lower-case m means mega except
    # for time (ms); sub-unit prefixes make no sense for sizes and rates.
    if dimension != "time" and prefix == "m":
        return 1e6
    return _PREFIX[prefix]


def _base_factor(base: str, table: dict[str, float]) -> float | None:
    if base in ("b", "b/s"):  # a lower-case b alone is a bit (as in tc's 'mbit' and 'Mb/s')
        return table.get("bit") if "bit" in table else None
    return table.get(base.lower())


def _example(dimension: str) -> str:
    return {"bandwidth": "'10Gbit/s' or '1.25GB/s'", "bytes": "'96GB'", "time": "'50us'",
            "flops": "'10GFLOP/s'", "flop": "'2GFLOP'"}[dimension]


def format_si(value: float, unit: str, digits: int = 3) -> str:
    """Format an SI value with a decimal prefix: format_si(1.25e9, 'B/s') -> '1.25 GB/s'."""
    if value == 0 or value != value:
        return f"{value:g} {unit}"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3), ("", 1.0),
                          ("m", 1e-3), ("µ", 1e-6), ("n", 1e-9)):
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def format_seconds(seconds: float) -> str:
    """Human duration: 0.0123 -> '12.3 ms', 5400 -> '1.50 h'."""
    if seconds >= 86400:
        return f"{seconds / 86400:.2f} d"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.2f} min"
    return format_si(seconds, "s")
