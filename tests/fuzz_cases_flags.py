"""Issue 26's bad-input cases for one area (flags); see tests/fuzz_cases.py for `Case`.

Generated from the commands themselves (typer's click commands) and their flag tables
(`FlagTable`s, plan/flags.py), so that a new flag is covered without a new line here:

- inapplicable-flags: every flag of a table on every base command line (one per path a command
  can take) whose path it does not apply to: refused, naming the flag.
- typed-flag-names: a bad value for every flag that takes one: the error names that flag (or,
  for the options that name a file or preset, the input's own root: ``workload``, ``cluster``).
- long-values: a 100,000-character value for every flag that takes one: the same, on a line
  of at most errors.MAX_LINE_CHARS (test_fuzz_inputs checks the length of every case's line).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fuzz_cases import GPT2_CONFIG, PLAN_FLAGS, Case

TINY_GPT = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=100"
LONG = "x" * 100_000
"""The long value: a single run of 100,000 characters."""


@dataclass(frozen=True)
class Base:
    """A valid command line that takes `paths` (the facets of the command's flag tables);
    `files` are written to the case's folder first."""

    name: str
    argv: tuple[str, ...]
    paths: frozenset[str]
    files: Mapping[str, "str | bytes | None"] = field(default_factory=dict)
    valid: bool = True
    """False: not a base for inapplicable-flags (a line without a mode, which stops at a
    flag's bad value first; or one that would run if the flag's value were good)."""


def _b(name: str, argv: tuple[str, ...], *paths: str,
       files: Mapping[str, "str | bytes | None"] | None = None, valid: bool = True) -> Base:
    return Base(name, argv, frozenset(paths), files or {}, valid)


HF = {"m/config.json": json.dumps(GPT2_CONFIG)}
ADAM_OPT = ("optimize", "-w", "adam-mnist", "-c", "adam-2014", "-M", "4")
GPU_OPT = ("optimize", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--global-batch", "8")
ADAM_PREDICT = ("predict", "-w", "adam-mnist", "-c", "adam-2014", *PLAN_FLAGS)
GPU_PREDICT = ("predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--global-batch", "8")
OUT = ("-o", "{d}/out.yaml")
GRID = ("workload: mlp:32-16-4\nsteps: 2\nwarmup: 1\nrepeats: 1\n"
        "configs:\n  - {partitions: 1, replicas: 2, sync: allreduce}\n")
PLAN_YAML = "workload: gpt3-125m\ntp: 1\npp: 1\ndp: 1\nmicro_batch: 1\nglobal_batch: 8\n"


def _bases() -> dict[tuple[str, ...], tuple[Base, ...]]:
    """command path -> its base command lines, the first the default for a flag that applies
    everywhere."""
    return {
        ("describe",): (
            _b("zoo", ("describe", "adam-mnist", "--json"), "zoo"),
            _b("torch", ("describe", "--torch", "m:f", "--input-shape", "4", "--json"), "torch"),
            _b("hf", ("describe", "--hf-config", "{d}/m/config.json", "--json"), "hf", files=HF),
            _b("bare", ("describe", "--json"), valid=False),
            _b("shape", ("describe", "--input-shape", "4", "--json"), valid=False)),
        ("predict",): (
            _b("adam-json", (*ADAM_PREDICT, "--json"), "adam", "json", "ps-async"),
            _b("gpu-json", (*GPU_PREDICT, "--json"), "gpu", "json"),
            _b("adam-table", ADAM_PREDICT, "adam", "table", "ps-async"),
            _b("adam-quiet", (*ADAM_PREDICT, "-q", "--html", "{d}/p.html"), "adam", "quiet",
               "writes", "ps-async"),
            _b("allreduce", ("predict", "-w", "adam-mnist", "-c", "adam-2014", "-R", "2",
                             "--sync", "allreduce", "--json"), "adam", "json", "allreduce")),
        ("optimize",): (
            _b("adam-json", (*ADAM_OPT, "--json"), "adam", "json"),
            _b("gpu-json", (*GPU_OPT, "--json"), "gpu", "json"),
            _b("adam-table", ADAM_OPT, "adam", "table"),
            _b("adam-quiet", (*ADAM_OPT, "-q", "--csv", "{d}/o.csv"), "adam", "quiet",
               "writes")),
        ("run",): (
            _b("local", ("run", "-w", "mlp:32-16-4", "--local", "--json"), "local", "channels",
               "ps-async"),
            _b("local-allreduce", ("run", "-w", "mlp:32-16-4", "-R", "2", "--sync", "allreduce",
                                   "--local", "--json"), "local", "channels", "allreduce"),
            _b("gpu", ("run", "-w", TINY_GPT, "--gpu", "--json"), "gpu", "channels"),
            _b("testbed", ("run", "-w", "mlp:32-16-4", "--testbed", "{d}/tb.yaml", "--json"),
               "testbed", "channels", "ps-async"),
            _b("env", ("run", "-w", "mlp:32-16-4", "--rank-from-env", "--json"),
               "rank-from-env", "channels", "ps-async"),
            _b("model-split", ("run", "-w", "adam-mnist", "--conv-split", "model", "--local",
                               "--json"), "local", "model", "ps-async", valid=False),
            _b("bare", ("run", "-w", "mlp:32-16-4", "--json"), valid=False)),
        ("calibrate",): (
            _b("local", ("calibrate", "--local", *OUT), "local", "network"),
            _b("gpu", ("calibrate", "--gpu", *OUT), "gpu", "network"),
            _b("testbed", ("calibrate", "--testbed", "{d}/tb.yaml", *OUT), "testbed",
               "network"),
            _b("local-no-network", ("calibrate", "--local", "--no-network", *OUT), "local"),
            _b("bare", ("calibrate", *OUT), valid=False)),
        ("testbed", "down"): (
            _b("all", ("testbed", "down", "--all", "--json")),
            _b("down", ("testbed", "down", "--json"), "one", valid=False)),
        ("testbed", "up"): (_b("up", ("testbed", "up", "--hosts", "2", "--json")),),
        ("testbed", "status"): (_b("status", ("testbed", "status", "--json")),),
        ("validate",): (
            _b("validate", ("validate", "--testbed", "tb", "--configs", "{d}/g.yaml", "-o",
                            "{d}/out", "--json"), files={"g.yaml": GRID}),),
        ("report",): (
            _b("predict", ("report", "-o", "{d}/r.html", *ADAM_PREDICT[1:])),
            _b("bare", ("report", "-o", "{d}/r.html"), valid=False)),
        ("export",): (
            _b("export", ("export", "{d}/plan.yaml", "--to", "megatron", "--json"),
               files={"plan.yaml": PLAN_YAML}),),
        ("bands",): (_b("bands", ("bands", "--json")),),
        ("testbed", "check"): (
            _b("no-network", ("testbed", "check", "--no-network", "--json"), "by-name", "cpu"),
            _b("description", ("testbed", "check", "--description", "{d}/tb.yaml", "--json"),
               "by-file", "network", "cpu"),
            _b("no-cpu", ("testbed", "check", "--no-cpu", "--json"), "by-name", "network")),
    }


def _tables() -> dict[tuple[str, ...], tuple[Mapping[str, Any], ...]]:
    """command path -> its flag tables (the commands' own)."""
    from dnnscale.calibrate import commands as calibrate
    from dnnscale.optimize import commands as optimize
    from dnnscale.plan import flags
    from dnnscale.runtime import commands as run
    from dnnscale.testbed import commands as testbed

    return {("describe",): (flags.DESCRIBE_FLAGS,),
            ("predict",): (flags.PREDICT_OUTPUT_FLAGS, flags.ADAM_SYNC_FLAGS),
            ("optimize",): (optimize.SPACE_FLAGS, optimize.OUTPUT_FLAGS),
            ("run",): (run.MODE_FLAGS, run.SPLIT_FLAGS, flags.ADAM_SYNC_FLAGS),
            ("calibrate",): (calibrate.MODE_FLAGS, calibrate.NETWORK_FLAGS),
            ("testbed", "down"): (testbed.DOWN_FLAGS,),
            ("testbed", "check"): (testbed.CHECK_FLAGS,),
            **{path: () for path in (("testbed", "up"), ("testbed", "status"), ("validate",),
                                     ("report",), ("export",), ("bands",))}}


# -- the commands, introspected -------------------------------------------------------------

def commands() -> dict[tuple[str, ...], Any]:
    """Every leaf command of the CLI by its path (``("testbed", "up")``)."""
    from typer.main import get_command

    from dnnscale.cli import app

    found: dict[tuple[str, ...], Any] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        subs = getattr(command, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, (*path, name))
        else:
            found[path] = command

    walk(get_command(app), ())
    return found


def long_flag(param: Any) -> str:
    return next(opt for opt in param.opts if opt.startswith("--"))


def options(command: Any) -> list[Any]:
    """The command's options (no --help), in declaration order."""
    return [p for p in command.params
            if getattr(p, "param_type_name", "") == "option" and p.name != "help"]


def takes_value(param: Any) -> bool:
    return not getattr(param, "is_flag", False)


def sample(param: Any) -> tuple[str, ...]:
    """The flag with a well-formed value of its type (its value does not matter where the
    flag does not apply)."""
    if not takes_value(param):
        return (long_flag(param),)
    kind = param.type_descriptor.annotation
    value = {int: "2", float: "0.5", Path: "{d}/v.out"}.get(kind, "1")
    return long_flag(param), value


def applies(flag: str, base: Base, tables: tuple[Mapping[str, Any], ...]) -> bool:
    return all(set(table[flag]) & base.paths for table in tables if flag in table)


# -- inapplicable-flags -----------------------------------------------------------------------

def inapplicable_cases() -> Iterator[Case]:
    every = commands()
    tables = _tables()
    for path, bases in _bases().items():
        params = {long_flag(p): p for p in options(every[path])}
        listed = {flag for table in tables[path] for flag in table}
        for base in (b for b in bases if b.valid):
            for flag in sorted(listed):
                if flag in base.argv or applies(flag, base, tables[path]):
                    continue
                yield Case(f"{'-'.join(path)}-{base.name}-{flag[2:]}", "inapplicable-flags",
                           (*base.argv, *sample(params[flag])), flag, dict(base.files))
    yield from _predict_plan_kind_cases(every[("predict",)])
    yield from _report_cases(every)


ADAM_PLAN_FLAGS = ("--partitions", "--replicas", "--ps-shards", "--sync", "--minibatch",
                   "--push-every", "--pull-every", "--fc-protocol", "--overlap")


def _predict_plan_kind_cases(predict: Any) -> Iterator[Case]:
    """predict: Adam's plan flags on a GPU plan (plan_from_options refuses the mix)."""
    params = {long_flag(p): p for p in options(predict)}
    for flag in ADAM_PLAN_FLAGS:
        yield Case(f"predict-gpu-plan-{flag[2:]}", "inapplicable-flags",
                   (*GPU_PREDICT, "--json", *sample(params[flag])), flag)
    yield Case("predict-gpu-plan-no-overlap", "inapplicable-flags",
               (*GPU_PREDICT, "--json", "--no-overlap"), "--no-overlap")


def _report_cases(every: dict[tuple[str, ...], Any]) -> Iterator[Case]:
    """report: the flags of predict and optimize that only change what they print."""
    from dnnscale.report.commands import PRINTING_FLAGS

    out = ("report", "-o", "{d}/r.html")
    for name, argv in (("predict", (*out, *ADAM_PREDICT[1:])), ("optimize", (*out, *ADAM_OPT[1:]))):
        params = {long_flag(p): p for p in options(every[(name,)])}
        for flag in PRINTING_FLAGS:
            if flag in params:
                yield Case(f"report-{name}-{flag[2:]}", "inapplicable-flags",
                           (*argv, *sample(params[flag])), flag)
    yield Case("report-validation-top", "inapplicable-flags",
               (*out, "--validation", "{d}", "--top", "3"), "--top")


# -- typed-flag-names and long-values ---------------------------------------------------------

SOURCE_FIELDS = {"workload": "workload", "cluster": "cluster", "config": "config",
                 "testbed": "testbed", "configs": "grid", "profile": "profile",
                 "description": "testbed"}
"""Options that name a file or preset: their errors name the input (``workload``), whose
dotted paths name what is wrong inside it."""
SOURCE_FLAG_COMMANDS = frozenset({"export"})
"""Commands whose source is another file (export's plan): their -w errors name the flag."""


def _source_field(command: str, name: str, flag: str) -> str:
    return flag if command in SOURCE_FLAG_COMMANDS else SOURCE_FIELDS.get(name, flag)

BAD_VALUES: dict[tuple[str, str], "str | tuple[str, str]"] = {
    # (command, flag): a bad value, or (value, the field expected when it is not the flag)
    ("describe", "--output"): "{d}",
    ("describe", "--torch"): "nocolon",
    ("describe", "--input-shape"): "3,-1",
    ("describe", "--samples-per-epoch"): "0",
    ("describe", "--hf-config"): "{d}/none.json",
    ("describe", "--seq"): "0",
    ("predict", "--workload"): ("no-such-net", "workload"),
    ("predict", "--cluster"): ("no-such-cluster", "cluster"),
    ("predict", "--config"): ("{d}/none.yaml", "config"),
    ("predict", "--partitions"): "0", ("predict", "--replicas"): "-2",
    ("predict", "--ps-shards"): "-1", ("predict", "--sync"): "gossip",
    ("predict", "--minibatch"): "0", ("predict", "--push-every"): "0",
    ("predict", "--pull-every"): "0", ("predict", "--fc-protocol"): "both",
    ("predict", "--tp"): "0", ("predict", "--pp"): "0", ("predict", "--dp"): "0",
    ("predict", "--micro-batch"): "0", ("predict", "--global-batch"): "0",
    ("predict", "--schedule"): "zigzag", ("predict", "--virtual-stages"): "0",
    ("predict", "--zero"): "9", ("predict", "--recompute"): "some",
    ("predict", "--precision"): "fp4", ("predict", "--grad-bytes"): "3",
    ("predict", "--zero3-fetch"): "modules", ("predict", "--overlap-tp-method"): "nccl",
    ("predict", "--grad-accumulation"): "sum", ("predict", "--loss"): "chunked",
    ("predict", "--amp"): "o2",
    ("predict", "--input-shape"): "3",
    ("predict", "--html"): "{d}",
    ("optimize", "--workload"): ("no-such-net", "workload"),
    ("optimize", "--cluster"): ("no-such-cluster", "cluster"),
    ("optimize", "--machines"): "0", ("optimize", "--modes"): "gossip",
    ("optimize", "--top"): "0", ("optimize", "--minibatch"): "16,x",
    ("optimize", "--push-every"): "0", ("optimize", "--pull-every"): "x",
    ("optimize", "--fc-protocol"): "both", ("optimize", "--optimizer"): "lion",
    ("optimize", "--epoch-fraction"): "0", ("optimize", "--input-shape"): "3",
    ("optimize", "--plot"): "{d}", ("optimize", "--global-batch"): "0",
    ("optimize", "--tp"): "0", ("optimize", "--pp"): "x", ("optimize", "--micro-batch"): "0",
    ("optimize", "--zero"): "7", ("optimize", "--recompute"): "some",
    ("optimize", "--schedule"): "zigzag", ("optimize", "--precision"): "fp4",
    ("optimize", "--objective"): "speed", ("optimize", "--price"): "-1",
    ("optimize", "--tokens"): "-5", ("optimize", "--html"): "{d}", ("optimize", "--csv"): "{d}",
    ("optimize", "--engine"): "colossal", ("optimize", "--sequence-parallel"): "yes",
    ("optimize", "--overlap-dp"): "maybe", ("optimize", "--loss"): "chunked",
    ("optimize", "--amp"): "o2",
    ("run", "--workload"): ("no-such-net", "workload"),
    ("run", "--input-shape"): "3",
    ("run", "--config"): ("{d}/none.yaml", "config"),
    ("run", "--partitions"): "0", ("run", "--replicas"): "0", ("run", "--ps-shards"): "-1",
    ("run", "--sync"): "gossip", ("run", "--minibatch"): "0", ("run", "--push-every"): "0",
    ("run", "--pull-every"): "0", ("run", "--fc-protocol"): "both",
    ("run", "--epoch-fraction"): "0",
    ("run", "--testbed"): ("{d}/none.yaml", "testbed"),
    ("run", "--device"): "tpu", ("run", "--micro-batch"): "0", ("run", "--global-batch"): "0",
    ("run", "--recompute"): "selective", ("run", "--precision"): "fp16",
    ("run", "--bf16-mode"): "never", ("run", "--steps"): "0", ("run", "--warmup"): "-1",
    ("run", "--timeout"): "0", ("run", "--conv-split"): "diagonal",
("run", "--lr"): "inf", ("run", "--output"): "{d}",
    ("calibrate", "--testbed"): ("{d}/none.yaml", "testbed"),
    ("calibrate", "--output"): "{d}", ("calibrate", "--kinds"): "lstm",
    ("calibrate", "--allreduce-peers"): "1", ("calibrate", "--device"): "tpu",
    ("calibrate", "--as"): "abacus",
    ("validate", "--output"): "{d}/none/out", ("validate", "--workload"): ("nonet", "workload"),
    ("validate", "--repeats"): "0", ("validate", "--steps"): "0",
    ("validate", "--html"): "{d}", ("validate", "--testbed"): ("none", "testbed"),
    ("validate", "--configs"): ("{d}/none.yaml", "grid"),
    ("export", "--to"): "tensorflow", ("export", "--workload"): "nonet",
    ("export", "--output"): "{d}", ("export", "--format"): "script",
    ("report", "--output"): "{d}", ("report", "--validation"): "{d}/none",
    ("bands", "--device"): "tpu",
    ("testbed", "up", "--hosts"): "0",
}
"""A bad value per flag that takes one (the flag named, unless the tuple says otherwise)."""

BAD_VALUE_BASES: dict[tuple[str, str], str] = {
    ("run", "--cluster"): "model-split", ("predict", "--html"): "adam-quiet",
    ("optimize", "--csv"): "adam-quiet", ("describe", "--torch"): "shape",
    ("describe", "--hf-config"): "bare", ("describe", "--samples-per-epoch"): "hf",
    ("run", "--testbed"): "bare", ("calibrate", "--testbed"): "bare",
    ("report", "--validation"): "bare",
    **{("predict", flag): "gpu-json" for flag in (
        "--tp", "--pp", "--dp", "--micro-batch", "--global-batch", "--schedule",
        "--virtual-stages", "--zero", "--recompute", "--precision", "--grad-bytes", "--ep",
        "--cp", "--cp-algorithm", "--expert-imbalance", "--etp", "--zero3-fetch",
        "--grad-accumulation", "--loss", "--amp", "--overlap-tp-method")},
}
"""Where a bad value needs a base other than the first that the flag applies to."""
NO_VALUE_CASES = {("describe", "--loss"): "is checked once the model is imported, with torch "
                                          "(seconds, not a fast case)",
                  ("validate", "--profile"): "is read with the testbed's cluster: without a "
                                             "testbed, the testbed's error comes first"}
"""Flags without typed-flag-names and long-values cases, and why."""


def _base_for(path: tuple[str, ...], flag: str) -> Base | None:
    bases = _bases().get(path)
    if bases is None:
        return None
    tables = _tables()[path]
    wanted = BAD_VALUE_BASES.get((path[0], flag))
    for base in bases:
        if (wanted is None or base.name == wanted) and applies(flag, base, tables):
            return base
    return None


def without(argv: tuple[str, ...], param: Any) -> tuple[str, ...]:
    """`argv` without `param` (any of its spellings) and its value: the case gives its own."""
    spellings = set(param.opts) | set(getattr(param, "secondary_opts", ()))
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in spellings:
            skip = takes_value(param)
        else:
            out.append(arg)
    return tuple(out)




def value_cases() -> Iterator[Case]:
    """typed-flag-names and long-values for the flags of BAD_VALUES and every flag that takes
    a number (click's parse error must name it too)."""
    for path, command in commands().items():
        for param in options(command):
            if not takes_value(param):
                continue
            flag = long_flag(param)
            base = _base_for(path, flag)
            if base is None or (path[0], flag) in NO_VALUE_CASES:
                continue
            argv = without(base.argv, param)
            key = (*path, flag) if path[0] == "testbed" else (path[0], flag)
            bad = BAD_VALUES.get(key)  # type: ignore[arg-type]
            expected = _source_field(path[0], param.name, flag)
            if isinstance(bad, tuple):
                bad, expected = bad
            label = f"{'-'.join(path)}-{flag[2:]}"
            if bad is None and param.type_descriptor.annotation in (int, float):
                bad = "many"
            if bad is not None:
                yield Case(label, "typed-flag-names", (*argv, flag, bad), expected,
                           dict(base.files))
            yield Case(label, "long-values", (*argv, flag, LONG),
                       _source_field(path[0], param.name, flag), dict(base.files))


def cases() -> Iterator[Case]:
    yield from inapplicable_cases()
    yield from value_cases()
