"""`dnnscale report`: the HTML report of a plan, of the optimizer's best plan, or of a
validation run. Imported at CLI start-up: only typer here.

With any flag that only `predict` has (a plan's shape: -P/-R/-S/--sync/--config, --dp, ...)
it is `predict ... --html OUTPUT`; otherwise `optimize ... --html OUTPUT` (the chosen plan with
its curve; --tp/--pp there are choices for the GPU search); with --validation DIR, the page of
DIR/results.json written by `dnnscale validate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import typer.core

PRINTING_FLAGS = ("--json", "--quiet", "--explain", "--layers", "--full-curve", "--tokens",
                  "--html")
"""predict's and optimize's flags that only change what they print (or, --html, where the page
goes): report prints one line and writes the page to -o, so it refuses them."""


def _long_names(command: object) -> dict[str, str]:
    """Every option of `command` as typed (-q, --no-overlap) -> its long name (--quiet,
    --overlap)."""
    names: dict[str, str] = {}
    for param in getattr(command, "params", []):
        opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
        long = next((o for o in opts if o.startswith("--")), None)
        names.update({opt: long for opt in opts if long is not None})
    return names


def refuse_printing_flags(args: list[str], command: object) -> None:
    """InputError naming the first of PRINTING_FLAGS among `args` (the flags report passes on
    to `command`)."""
    from dnnscale.errors import InputError

    names = _long_names(command)
    for arg in args:
        flag = names.get(arg.split("=", 1)[0])
        if flag in PRINTING_FLAGS:
            raise InputError(flag, "does not apply to report, which writes the page to "
                             "-o/--output and prints nothing else" if flag != "--html" else
                             "does not apply to report: the page goes to -o/--output")


def refuse_stray_arguments(args: list[str], command: object) -> None:
    """InputError naming the first of `args` that is neither a flag of `command` nor a flag's
    value (`report pred.json -o r.html`: report reads no file but --validation's; without this
    the forwarded command would only say that -w is missing)."""
    from dnnscale.errors import InputError, short_repr

    takes_value = {opt for param in getattr(command, "params", [])
                   if not getattr(param, "is_flag", False)
                   for opt in getattr(param, "opts", ())}
    value_next = False
    for arg in args:
        if value_next:
            value_next = False
        elif arg.startswith("-") and arg != "-":
            value_next = "=" not in arg and arg in takes_value
        else:
            raise InputError("arguments", f"unexpected {short_repr(arg)}: report takes "
                             "predict's or optimize's flags (-w W -c C ...) or --validation "
                             "DIR, and no file")


def _options(command: object) -> set[str]:
    return {opt for param in getattr(command, "params", [])
            for opt in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))}


def command_for(args: list[str], root: object) -> str:
    """'predict' when the arguments hold a flag that only predict has (they fix one plan),
    else 'optimize'."""
    commands = getattr(root, "commands", {})
    only_predict = _options(commands["predict"]) - _options(commands["optimize"])
    names = {arg.split("=", 1)[0] for arg in args if arg.startswith("-")}
    return "predict" if names & only_predict else "optimize"


def _flag_names(command: object) -> list[str]:
    """`command`'s options as `-w/--workload`, without --help and PRINTING_FLAGS."""
    names = []
    for param in getattr(command, "params", []):
        opts = [*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ())]
        long = next((o for o in opts if o.startswith("--")), "")
        if getattr(param, "param_type_name", "") != "option" or long in PRINTING_FLAGS \
                or long == "--help":
            continue
        primary = list(getattr(param, "opts", ()))
        names.append("/".join([*sorted(primary, key=lambda o: o.startswith("--")),
                               *getattr(param, "secondary_opts", ())]))
    return names


def forwarded_flags_help(root: object) -> str:
    """The part of `report -h` that lists the flags report passes on: those of both predict
    and optimize, predict's own (any of them makes report predict's), optimize's own."""
    import textwrap

    commands = getattr(root, "commands", {})
    predict, optimize = (_flag_names(commands[name]) for name in ("predict", "optimize"))
    both = [name for name in predict if name in optimize]
    sections = (("Flags of both predict and optimize", both),
                ("predict's own (any of them: the page of that one plan)",
                 [name for name in predict if name not in both]),
                ("optimize's own (otherwise: the page of optimize's best plan)",
                 [name for name in optimize if name not in both]))
    lines = textwrap.wrap("Flags passed on (their help: `dnnscale predict -h`, `dnnscale "
                          "optimize -h`); refused, since report prints nothing but writes -o: "
                          + ", ".join(PRINTING_FLAGS), 78, initial_indent=" ",
                          subsequent_indent=" ", break_on_hyphens=False)
    for title, names in sections:
        lines += [f"  {title}:"] + textwrap.wrap(", ".join(names), 76, initial_indent="    ",
                                                 subsequent_indent="    ",
                                                 break_on_hyphens=False)
    return "\n".join(lines)


class ReportCommand(typer.core.TyperCommand):
    """report's help lists, after its own options, the flags it passes on."""

    def format_help(self, ctx: typer.Context, formatter: object) -> None:  # type: ignore[override]
        super().format_help(ctx, formatter)  # type: ignore[arg-type]
        typer.echo(forwarded_flags_help(ctx.find_root().command) + "\n")


def register(app: typer.Typer) -> None:
    @app.command("report", cls=ReportCommand,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def report(ctx: typer.Context,
               output: Path = typer.Option(..., "-o", "--output", help="the HTML file to write"),
               validation: Optional[Path] = typer.Option(
                   None, "--validation", help="a `dnnscale validate` output folder (its "
                   "results.json)")) -> None:
        """One self-contained HTML page: the plan and its predicted step with error band, a
        timeline of one step per worker or stage, memory per device, the scalability curve
        per mode with the chosen plan and change points, the top plans; or, with
        --validation DIR, predicted vs measured. Give predict's flags for one plan
        (-w W -c C -P 4 -R 8 -S 4, or --tp 8 --pp 8 --dp 8 ...), or optimize's for its best
        plan."""
        from dnnscale.errors import user_errors

        if validation is not None:
            user_errors(_validation_report)(validation, output, list(ctx.args))
            return
        args = list(ctx.args)
        from typer.main import get_command

        from dnnscale.errors import flag_aliases

        root = get_command(app)
        name = command_for(args, root)
        forwarded = getattr(root, "commands", {})[name]
        user_errors(refuse_stray_arguments)(args, forwarded)
        user_errors(refuse_printing_flags)(args, forwarded)
        with flag_aliases({"--html": "--output"}):  # the flag the user typed
            code = root.main([name, *args, "--html", str(output), "--quiet"],
                             prog_name="dnnscale", standalone_mode=False)
        if code:  # the command printed its one-line error
            raise typer.Exit(code)
        print(f"report written to {output}")


def _validation_report(folder: Path, output: Path, extra: list[str]) -> None:
    from dnnscale.atomic import check_output_path
    from dnnscale.errors import InputError
    from dnnscale.report.pages import validation_page, write_html

    if extra:
        raise InputError(extra[0].split("=", 1)[0], "does not apply with --validation")
    check_output_path(output, "--output")
    write_html(validation_page(read_validation(folder)), output, "--output")
    print(f"report written to {output}")


def read_validation(folder: Path) -> dict:
    """DIR/results.json of `dnnscale validate`, checked for the fields the page reads
    (report/validation_input.py)."""
    from dnnscale.report.validation_input import read_validation as read

    return read(folder)
