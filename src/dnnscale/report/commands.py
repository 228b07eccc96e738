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


def register(app: typer.Typer) -> None:
    @app.command("report", context_settings={"allow_extra_args": True,
                                             "ignore_unknown_options": True})
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
        user_errors(_no_json)(args)
        from typer.main import get_command

        from dnnscale.atomic import field_as_typed

        root = get_command(app)
        with field_as_typed("--html", "--output"):  # the flag the user typed
            code = root.main([command_for(args, root), *args, "--html", str(output), "--quiet"],
                             prog_name="dnnscale", standalone_mode=False)
        if code:  # the command printed its one-line error
            raise typer.Exit(code)
        print(f"report written to {output}")


def _no_json(args: list[str]) -> None:
    if any(arg == "--json" or arg.startswith("--json=") for arg in args):
        from dnnscale.errors import InputError

        raise InputError("--json", "report writes an HTML page and prints no JSON; for JSON "
                         "run predict or optimize with --json (and --html FILE for the page)")


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
    """DIR/results.json of `dnnscale validate`, checked for the fields the page reads."""
    import json

    from dnnscale.errors import InputError
    from dnnscale.safe_yaml import read_limited

    path = folder / "results.json"
    text = read_limited(path, "--validation")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError("--validation", f"{path} is not JSON: {exc.msg} at line {exc.lineno}"
                         ) from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not isinstance(data.get("summary"), dict):
        raise InputError("--validation", f"{path} has no 'rows' and 'summary' (is it the "
                         "results.json of dnnscale validate?)")
    for index, row in enumerate(data["rows"]):
        try:
            float(row["measured"]["throughput_samples_per_s"])
            float(row["predicted_throughput_samples_per_s"])
            row["id"], row["label"], row["config"]["sync"]
        except (KeyError, TypeError, ValueError):
            raise InputError(f"--validation: rows[{index}]", "lacks the measured and predicted "
                             "throughput, id, label or config.sync") from None
    return data
