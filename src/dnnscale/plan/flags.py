"""Plans from command-line flags and an optional plan file: Adam's flags (-P -R -S --sync ...)
build a Config, the GPU flags (--tp --pp --dp ...) a Megatron-style plan.

Below the CLI so that every command that takes plan flags (`predict`, `run`, ...) builds its plan
the same way without importing `dnnscale.cli` (layering: plan < ... < cli)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError
from dnnscale.plan.config import Config, config_from_dict
from dnnscale.plan.modern import is_modern, modern_plan_from_dict
from dnnscale.plan.plan import ParallelPlan
from dnnscale.yamlio import load_yaml_file


def config_from_options(config_file: Path | None, **flags: Any) -> Config:
    """A Config from an optional YAML file, overridden by the flags that were given."""
    data: dict[str, Any] = load_yaml_file(config_file, "config") if config_file else {}
    data.update({key: value for key, value in flags.items() if value is not None})
    return config_from_dict(data)


def plan_from_options(config_file: Path | None, adam: dict[str, Any],
                      modern: dict[str, Any]) -> Config | ParallelPlan:
    """Adam's flags (-P -R -S --sync ...) build a Config; the GPU flags (--tp --pp --dp ...) a
    Megatron-style plan; a --config file may hold either kind, and flags of its kind override
    it. Mixing the kinds is an error naming the first flag of the other kind."""
    data: dict[str, Any] = load_yaml_file(config_file, "config") if config_file else {}
    given_adam = {k: v for k, v in adam.items() if v is not None}
    given_modern = {k: v for k, v in modern.items() if v is not None}
    if given_modern or is_modern(data):
        if given_adam:
            first = next(iter(given_adam))
            raise InputError(f"--{first.replace('_', '-')}", "is one of Project Adam's flags; "
                             "give either those or the GPU plan's (--tp, --pp, --dp, ...)")
        return modern_plan_from_dict({**data, **given_modern})
    return config_from_options(config_file, **given_adam)


def typed_flags(values: Mapping[str, object], prefix: str = "plan",
                flags: Mapping[str, str] | None = None) -> dict[str, str]:
    """Error field -> the flag the user typed, for the `values` given (not None): `tp` ->
    ``{prefix}.tp`` -> ``--tp`` (`flags` names a flag whose name is not the field's)."""
    named = dict(flags or {})
    return {(f"{prefix}.{key}" if prefix else key):
            named.get(key, "--" + key.replace("_", "-"))
            for key, value in values.items() if value is not None}


@contextmanager
def as_typed(fields: Mapping[str, str]) -> Iterator[None]:
    """An InputError naming one of `fields` (typed_flags) names the flag the user typed
    instead (`plan.global_batch` -> `--global-batch`); any other passes unchanged."""
    try:
        yield
    except InputError as exc:
        if exc.field in fields:
            raise InputError(fields[exc.field], exc.problem) from None
        raise
