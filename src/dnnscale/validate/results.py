"""The results file of `dnnscale validate` (DIR/results.json) read back for `report
--validation`: checked for every field the page reads, so a file that passes can be reported,
and one that does not is one InputError naming the field.

Schema (what report/pages.validation_page reads; other fields pass through)::

    {"rows": [{"id": str | int, "label": str, "machines": int >= 1,
               "config": {"sync": str, ...},
               "measured": {"throughput_samples_per_s": number, "observed_bottleneck"?: str},
               "predicted_throughput_samples_per_s": number,
               "relative_error"?: number | null, "predicted_bottleneck"?: str,
               "set"?: str}, ...],
     "summary": {"configs"?: any, "median_relative_error"?: number | null,
                 "p90_relative_error"?: number | null, "max_relative_error"?: number | null,
                 "kendall_tau"?: number | null},
     "workload"?, "testbed"?, "network"?, "repeats"?, "steps"?, "note"?: text or numbers}

A throughput may be NaN or ≤ 0 (a failed run): the page leaves such a row out, as it does the
calibration rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dnnscale.boundary import require_mapping
from dnnscale.errors import InputError, short_repr

FIELD = "--validation"


def _number(value: object, where: str, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(where, f"must be a number{' or null' if optional else ''}, got "
                         f"{short_repr(value)}")


def _text(value: object, where: str, numbers: bool = False) -> None:
    kinds: tuple[type, ...] = (str, int, float) if numbers else (str,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InputError(where, f"must be text, got {short_repr(value)}")


def check_results(data: object, where: str = FIELD) -> dict[str, Any]:
    """`data` if it has every field the validation page reads, with the types it needs."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not isinstance(data.get("summary"), dict):
        raise InputError(where, "has no 'rows' and 'summary' (is it the results.json of "
                         "dnnscale validate?)")
    require_mapping(data, where)
    for key in ("workload", "testbed", "network", "repeats", "steps", "note"):
        if data.get(key) is not None:
            _text(data[key], f"{where}: {key}", numbers=True)
    summary = require_mapping(data["summary"], f"{where}: summary")
    for key in ("median_relative_error", "p90_relative_error", "max_relative_error",
                "kendall_tau"):
        _number(summary.get(key), f"{where}: summary.{key}", optional=True)
    for index, row in enumerate(data["rows"]):
        at = f"{where}: rows[{index}]"
        row = require_mapping(row, at)
        for key in ("id", "label", "machines", "config", "measured",
                    "predicted_throughput_samples_per_s"):
            if key not in row:
                raise InputError(f"{at}.{key}", "missing")
        _text(row["id"], f"{at}.id", numbers=True)
        _text(row["label"], f"{at}.label")
        machines = row["machines"]
        if isinstance(machines, bool) or not isinstance(machines, int) or machines < 1:
            raise InputError(f"{at}.machines", f"must be an integer >= 1, got "
                             f"{short_repr(machines)}")
        config = require_mapping(row["config"], f"{at}.config")
        if "sync" not in config:
            raise InputError(f"{at}.config.sync", "missing")
        _text(config["sync"], f"{at}.config.sync")
        measured = require_mapping(row["measured"], f"{at}.measured")
        if "throughput_samples_per_s" not in measured:
            raise InputError(f"{at}.measured.throughput_samples_per_s", "missing")
        _number(measured["throughput_samples_per_s"], f"{at}.measured.throughput_samples_per_s")
        if measured.get("observed_bottleneck") is not None:
            _text(measured["observed_bottleneck"], f"{at}.measured.observed_bottleneck")
        _number(row["predicted_throughput_samples_per_s"],
                f"{at}.predicted_throughput_samples_per_s")
        _number(row.get("relative_error"), f"{at}.relative_error", optional=True)
        for key in ("predicted_bottleneck", "set"):
            if row.get(key) is not None:
                _text(row[key], f"{at}.{key}")
    return data


def read_results(folder: Path, where: str = FIELD) -> dict[str, Any]:
    """FOLDER/results.json of `dnnscale validate`, checked by `check_results`."""
    from dnnscale.safe_yaml import read_limited

    path = Path(folder) / "results.json"
    text = read_limited(path, where)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(where, f"{short_repr(str(path))} is not JSON: {exc.msg} at line "
                         f"{exc.lineno}") from None
    except (RecursionError, ValueError):
        raise InputError(where, f"{short_repr(str(path))} is not JSON this tool can read (too "
                         "deep, or a number too long)") from None
    return check_results(data, where)
