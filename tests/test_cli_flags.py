"""The flag tables and the error-line limits behind tests/fuzz_cases_flags.py (issue 26).

The fuzz cases run the command lines; these tests keep their generator honest: every flag a
table names exists on its command (a renamed flag would silently lose its check), every flag
that takes a value has its typed-flag-names and long-values cases (or a reason why not), and
the clipping of error lines holds for any text.
"""

from __future__ import annotations

import pytest

from dnnscale.errors import CUT, MAX_LINE_CHARS, MAX_VALUE_CHARS, InputError, clip_line, \
    typed_field
from tests import fuzz_cases_flags as flags


def test_every_table_names_real_flags_of_its_command() -> None:
    every = flags.commands()
    for path, tables in flags._tables().items():
        known = {opt for param in flags.options(every[path])
                 for opt in (*param.opts, *getattr(param, "secondary_opts", ()))}
        for table in tables:
            assert set(table) <= known, (path, set(table) - known)
    from dnnscale.report.commands import PRINTING_FLAGS

    both = {flags.long_flag(p) for name in ("predict", "optimize")
            for p in flags.options(every[(name,)])}
    assert set(PRINTING_FLAGS) <= both


def test_every_flag_of_a_table_has_a_base_it_applies_to() -> None:
    bases = flags._bases()
    for path, tables in flags._tables().items():
        for flag in {flag for table in tables for flag in table}:
            assert any(flags.applies(flag, base, tables) for base in bases[path]), (path, flag)


def test_every_flag_with_a_value_has_its_cases() -> None:
    """A new flag that takes a value gets a long-values case by itself; one without a cheap
    base command line must say why in NO_VALUE_CASES."""
    covered = {case.name for case in flags.value_cases() if case.group == "long-values"}
    for path, command in flags.commands().items():
        for param in flags.options(command):
            if not flags.takes_value(param):
                continue
            flag = flags.long_flag(param)
            if (path[0], flag) in flags.NO_VALUE_CASES:
                continue
            assert f"{'-'.join(path)}-{flag[2:]}" in covered, (path, flag)


def test_the_flag_classes_are_large_enough() -> None:
    groups: dict[str, int] = {}
    for case in flags.cases():
        groups[case.group] = groups.get(case.group, 0) + 1
    assert groups["inapplicable-flags"] >= 100
    assert groups["typed-flag-names"] >= 60 and groups["long-values"] >= 60


@pytest.mark.parametrize("text", [
    "x" * 100_000, "value " * 50_000, "a\nb\tc " + "é" * 300, "short", "",
    "error: --flag: got '" + "9" * 5000 + "' (known: a, b, c)"])
def test_clip_line_bounds_any_text(text: str) -> None:
    line = clip_line(text)
    assert len(line) <= MAX_LINE_CHARS and "\n" not in line
    assert all(len(run) <= MAX_VALUE_CHARS for run in line.split())
    if len(" ".join(text.split())) <= MAX_VALUE_CHARS:
        assert line == " ".join(text.split())
    else:
        assert CUT in line


def test_a_long_value_keeps_the_rest_of_the_message() -> None:
    line = clip_line("error: --modes: unknown mode '" + "x" * 100_000 + "' (known: ps-async)")
    assert line.startswith("error: --modes: unknown mode 'x") and line.endswith("(known: ps-async)")


def test_input_error_clips_its_message() -> None:
    error = InputError("--modes", "unknown mode " + "x" * 100_000)
    assert len(str(error)) <= MAX_LINE_CHARS and error.field == "--modes"


def test_fields_stay_as_they_are_outside_the_cli() -> None:
    """The Python API has no command line: its fields are its arguments' names."""
    for field in ("modes", "config.replicas", "--hf-config", "plan.tp", "workload"):
        assert typed_field(field) == field


# -- the default plan on accelerators -------------------------------------------------------

def test_predict_without_plan_flags_on_accelerators_prices_the_gpu_defaults() -> None:
    """No plan flag and no plan file on a GPU node: the GPU plan's defaults (TP1 PP1 DP1, one
    micro-batch of one sample), not Adam's parameter server, which is refused there with a
    --sync the user never typed. Adam's defaults stay on a CPU cluster."""
    import json

    from typer.testing import CliRunner

    from dnnscale.cli import app

    runner = CliRunner()
    gpu = runner.invoke(app, ["predict", "-w", "gpt3-125m", "-c", "dgx-a100-80g:1", "--json"])
    assert gpu.exit_code == 0, gpu.stderr
    plan = json.loads(gpu.stdout)["plan"]
    assert (plan["tensor"]["degree"], plan["data"]["replicas"]) == (1, 1)
    assert plan["data"]["aggregation"]["kind"] == "Collective"
    assert plan["batch"] == {"micro_batch": 1, "accumulation": 1,
                             "grad_accumulation": "fused"}
    cpu = runner.invoke(app, ["predict", "-w", "adam-mnist", "-c", "adam-2014", "--json"])
    assert cpu.exit_code == 0, cpu.stderr
    assert json.loads(cpu.stdout)["config"]["sync"] == "ps-async"
    typed = runner.invoke(app, ["predict", "-w", "adam-mnist", "-c", "dgx-a100-80g:1",
                                "--sync", "ps-async"])
    assert typed.exit_code == 2
    assert typed.stderr.startswith("error: --sync: a parameter server is not priced")
