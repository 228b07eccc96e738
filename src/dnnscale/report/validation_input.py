"""DIR/results.json of `dnnscale validate`, read for `report --validation`: every value the
validation page shows is checked here, where the file is first read, so that the page never
meets a value it cannot draw (a missing key, a text where a number goes, a throughput too large
to plot). Errors are one line naming ``--validation`` and the key (``rows[3].machines``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, short_repr

FIELD = "--validation"
MAX_THROUGHPUT = 1e12
"""Samples per second a row may hold (measured or predicted): far above any cluster's, low
enough that the page's log-scale chart can draw it."""
TEXT_KEYS = ("id", "label")
OPTIONAL_TEXT_KEYS = ("set", "predicted_bottleneck")
SUMMARY_NUMBERS = ("median_relative_error", "p90_relative_error", "max_relative_error",
                   "kendall_tau")


def _fail(where: str, problem: str) -> InputError:
    return InputError(f"{FIELD}: {where}", problem)


def _json(text: str, shown: str) -> Any:
    """The document (NaN and Infinity read as floats, as files from before strict JSON hold
    them; the checks below decide where they may stand)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(FIELD, f"{shown} is not JSON: {exc.msg} at line {exc.lineno}") \
            from None
    except RecursionError:
        raise InputError(FIELD, f"{shown} nests too deeply") from None
    except ValueError:  # an integer of more digits than Python converts
        raise InputError(FIELD, f"{shown} holds an integer too long to read") from None


def _number(value: Any, where: str, optional: bool = False) -> None:
    """A finite number; with `optional` also None or NaN (what the page shows as '—')."""
    if optional and (value is None or (isinstance(value, float) and math.isnan(value))):
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {short_repr(value)}")


def _throughput(value: Any, where: str) -> None:
    _number(value, where)
    if not 0 <= value <= MAX_THROUGHPUT:
        raise _fail(where, f"must be between 0 and {MAX_THROUGHPUT:.0e} samples/s, got "
                    f"{short_repr(value)}")


def _text(value: Any, where: str, ids: bool = False) -> None:
    allowed = (str, int) if ids else (str,)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise _fail(where, f"must be {'a name or number' if ids else 'text'}, got "
                    f"{short_repr(value)}")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping, got {short_repr(value)}")
    return value


def _check_row(row: Any, where: str) -> None:
    row = _mapping(row, where)
    for key in TEXT_KEYS:
        if key not in row:
            raise _fail(f"{where}.{key}", "missing (is this the results.json of dnnscale "
                        "validate?)")
    _text(row["id"], f"{where}.id", ids=True)
    _text(row["label"], f"{where}.label")
    for key in OPTIONAL_TEXT_KEYS:
        if row.get(key) is not None:
            _text(row[key], f"{where}.{key}")
    machines = row.get("machines")
    if isinstance(machines, bool) or not isinstance(machines, int) or not 1 <= machines <= 2**53:
        raise _fail(f"{where}.machines", f"must be a whole number of machines >= 1, got "
                    f"{short_repr(machines)}")
    _text(_mapping(row.get("config"), f"{where}.config").get("sync"), f"{where}.config.sync")
    _throughput(row.get("predicted_throughput_samples_per_s"),
                f"{where}.predicted_throughput_samples_per_s")
    measured = _mapping(row.get("measured"), f"{where}.measured")
    _throughput(measured.get("throughput_samples_per_s"),
                f"{where}.measured.throughput_samples_per_s")
    if measured.get("observed_bottleneck") is not None:
        _text(measured["observed_bottleneck"], f"{where}.measured.observed_bottleneck")
    _number(row.get("relative_error"), f"{where}.relative_error", optional=True)


def read_validation(folder: Path) -> dict[str, Any]:
    """DIR/results.json of `dnnscale validate`, checked for every value the page reads."""
    from dnnscale.safe_yaml import read_limited

    path = Path(folder) / "results.json"
    shown = short_repr(str(path))
    data = _json(read_limited(path, FIELD), shown)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not isinstance(data.get("summary"), dict):
        raise InputError(FIELD, f"{shown} has no 'rows' and 'summary' (is it the results.json "
                         "of dnnscale validate?)")
    for index, row in enumerate(data["rows"]):
        _check_row(row, f"rows[{index}]")
    summary = data["summary"]
    for key in SUMMARY_NUMBERS:
        _number(summary.get(key), f"summary.{key}", optional=True)
    configs = summary.get("configs")
    if configs is not None and (isinstance(configs, bool) or not isinstance(configs, int)
                                or not 0 <= configs <= 2**53):
        raise _fail("summary.configs", f"must be a count, got {short_repr(configs)}")
    for key in ("workload", "testbed", "network", "note"):
        if data.get(key) is not None and not isinstance(data[key], (str, int, float)):
            raise _fail(key, f"must be text, got {short_repr(data[key])}")
    return data
