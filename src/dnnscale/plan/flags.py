"""Plans from command-line flags and an optional plan file: Adam's flags (-P -R -S --sync ...)
build a Config, the GPU flags (--tp --pp --dp ...) a Megatron-style plan.

Below the CLI so that every command that takes plan flags (`predict`, `run`, ...) builds its plan
the same way without importing `dnnscale.cli` (layering: plan < ... < cli). Also -w's help,
a plan file's `workload:` (read here for predict and export alike), and the notes a command
prints on stderr."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from dnnscale.errors import InputError, short_repr, typed_options
from dnnscale.plan.config import Config, config_from_dict
from dnnscale.plan.modern import is_modern, modern_plan_from_dict
from dnnscale.plan.plan import ParallelPlan
from dnnscale.yamlio import load_yaml_file


WORKLOAD_HELP = ("zoo name, workload YAML, hf:config.json, or a PyTorch model as "
                 "package.module:factory (with --input-shape)")
"""The help of -w, which predict and optimize share (cli.py, optimize/commands.py)."""


def config_from_options(config_file: Path | None, **flags: Any) -> Config:
    """A Config from an optional YAML file, overridden by the flags that were given."""
    data: dict[str, Any] = load_yaml_file(config_file, "config") if config_file else {}
    return _config_from_data(data, flags)


def _config_from_data(data: dict[str, Any], flags: Mapping[str, Any]) -> Config:
    return config_from_dict({**data, **{key: value for key, value in flags.items()
                                        if value is not None}})


WORKLOAD_KEY = "workload"
"""The key of a plan file (and of optimize's JSON) that names its workload: `predict --config`
and `export` read it (docs/formats.md)."""


def workload_name(data: Mapping[str, Any], field: str) -> str | None:
    """The workload a plan mapping names under WORKLOAD_KEY (None: none), checked to be a
    name; an error names `field`."""
    value = data.get(WORKLOAD_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(field, f"must name a workload (a zoo name, a YAML path or "
                         f"hf:config.json), got {short_repr(value)}")
    return value


def read_plan_file(config_file: Path | None) -> tuple[dict[str, Any], str | None]:
    """A --config file's plan fields, and the workload it names (`workload:`, else None)."""
    data: dict[str, Any] = load_yaml_file(config_file, "config") if config_file else {}
    name = workload_name(data, f"config.{WORKLOAD_KEY}")
    return {key: value for key, value in data.items() if key != WORKLOAD_KEY}, name


def plan_workload(flag: str | None, in_file: str | None) -> str:
    """The workload of `predict`: -w, else the plan file's `workload:`; both given, they must
    name the same (the same text, or -w a file whose workload has the file's name, checked
    once the workload is loaded: `check_plan_workload`)."""
    if flag is None and in_file is None:
        raise InputError("--workload", "missing (give -w, or a --config plan file with "
                         "workload:)")
    return flag if flag is not None else str(in_file)


def check_plan_workload(flag: str | None, in_file: str | None, loaded_name: str,
                        the_file: str = "the --config plan file", flag_typed: str = "-w") -> None:
    """A plan file's `workload:` agrees with the workload flag: the same text, or the name of
    the workload the flag loaded (optimize's JSON names it by name; the flag may give the YAML
    it came from). predict's and export's rule; `the_file` and `flag_typed` word the error."""
    if flag is not None and in_file is not None and in_file not in (flag, loaded_name):
        raise InputError("--workload", f"{short_repr(flag)} is workload {short_repr(loaded_name)}, "
                         f"but {the_file} names {short_repr(in_file)}; give the same "
                         f"or leave {flag_typed} out")


def plan_from_options(data: dict[str, Any], adam: dict[str, Any],
                      modern: dict[str, Any]) -> Config | ParallelPlan:
    """Adam's flags (-P -R -S --sync ...) build a Config; the GPU flags (--tp --pp --dp ...) a
    Megatron-style plan; a --config file's fields (`data`, read_plan_file) may hold either
    kind, and flags of its kind override them. Mixing the kinds is an error naming the first
    flag of the other kind."""
    given_adam = {k: v for k, v in adam.items() if v is not None}
    given_modern = {k: v for k, v in modern.items() if v is not None}
    if given_modern or is_modern(data):
        if given_adam:
            first = next(iter(given_adam))
            flag = typed_options().get(first, f"--{first.replace('_', '-')}")
            raise InputError(flag, "is one of Project Adam's flags; "
                             "give either those or the GPU plan's (--tp, --pp, --dp, ...)")
        return modern_plan_from_dict({**data, **given_modern})
    return _config_from_data(data, given_adam)


def plan_for_devices(plan: Config | ParallelPlan, accelerators: bool, config_file: Path | None,
                     adam: Mapping[str, Any]) -> Config | ParallelPlan:
    """The plan `plan_from_options` built, or, on accelerators when no plan flag and no plan
    file was given, the GPU plan's defaults (one device: TP1 PP1 DP1, one micro-batch): the
    default Config is Adam's parameter server, which is not priced on accelerators, and an
    error about a --sync the user never typed would only confuse."""
    given = config_file is not None or any(value is not None for value in adam.values())
    if accelerators and isinstance(plan, Config) and not given:
        return modern_plan_from_dict({})
    return plan


def print_notes(*notes: str | None) -> None:
    """Each note given (None: none) as one `note: ...` line on stderr; a command prints them
    once its work succeeded, so that a failing one prints its one error line alone."""
    import sys

    for note in notes:
        if note is not None:
            print(f"note: {note}", file=sys.stderr)


FlagTable = Mapping[str, Collection[str]]
"""A command's flags that do not apply everywhere: long flag -> the paths it applies to (the
ways the command can run: ``gpu``, ``local``, ``json`` ...). A flag not in it applies on every
path."""


def refuse_flags(table: FlagTable, paths: Collection[str], words: Mapping[str, str],
                 here: str = "") -> None:
    """InputError naming the first flag on the command line that applies to none of `paths`
    (the ones this run takes), with the paths it does apply to in `words` (path -> e.g. "with
    --gpu"); `here` says what this run is. Flags left at their defaults are never refused, and
    outside a CLI command (the Python API, whose arguments are checked by value) nothing is."""
    taken = set(paths)
    for name, typed in typed_options().items():
        applies = _entry(table, typed)
        if applies is None or taken & set(applies):
            continue
        reason = " or ".join(dict.fromkeys(words[path] for path in applies))
        raise InputError(typed, f"only applies {reason}" + (f"; {here}" if here else ""))


def _entry(table: FlagTable, typed: str) -> Collection[str] | None:
    """The table's paths of a typed flag; ``--no-overlap`` is found under ``--overlap``."""
    if typed in table:
        return table[typed]
    return table.get("--" + typed[5:]) if typed.startswith("--no-") else None


ADAM_SYNC_FLAGS: dict[str, tuple[str, ...]] = {
    "--push-every": ("ps-async", "ps-sync"), "--pull-every": ("ps-async", "ps-sync")}
"""Adam's flags by the sync mode of the config (predict, run): the intervals of a worker's
pushes and pulls only exist with a parameter server."""


def refuse_sync_flags(config: Config) -> None:
    """refuse_flags(ADAM_SYNC_FLAGS) for the sync mode `config` has."""
    refuse_flags(ADAM_SYNC_FLAGS, {config.sync}, SYNC_WORDS, f"this plan is {config.sync}")


SYNC_WORDS = {"ps-async": "with a parameter server (--sync ps-async or ps-sync)",
              "ps-sync": "with a parameter server (--sync ps-async or ps-sync)"}


PREDICT_OUTPUT_FLAGS: dict[str, tuple[str, ...]] = {
    "--explain": ("table",), "--layers": ("table", "json"), "--json": ("table", "json"),
    "--quiet": ("writes",)}
"""predict's flags by what it prints (the plan's kind is plan_from_options's: Adam's flags
and the GPU plan's never mix)."""
DESCRIBE_FLAGS: dict[str, tuple[str, ...]] = {
    "--input-shape": ("torch",), "--loss": ("torch",), "--samples-per-epoch": ("torch", "hf"),
    "--seq": ("hf",)}
"""describe's flags by the workload's source: a zoo name or YAML, --torch or --hf-config."""
PRINT_WORDS = {"table": "to the printed tables (not with --json or --quiet)",
               "json": "to what is printed (not with --quiet)",
               "writes": "with --html (there is nothing else to print)",
               "torch": "with --torch", "hf": "with --hf-config"}
