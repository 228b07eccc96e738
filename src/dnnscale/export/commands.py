"""`dnnscale export PLAN --to megatron|deepspeed|torchtitan`: a plan as an engine's launch files.

Imported by the CLI at startup, so only typer is imported here; the rest inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def register(app: typer.Typer) -> None:
    """Add the `export` command to `app`."""
    from dnnscale.errors import user_errors

    @app.command()
    @user_errors
    def export(
            plan: Path = typer.Argument(..., help="plan YAML/JSON, or the JSON of optimize "
                                        "--json (its best plan) or predict --json"),
            to: str = typer.Option(..., "--to", help="megatron | deepspeed | torchtitan"),
            workload: Optional[str] = typer.Option(
                None, "--workload", "-w", help="the workload (when the plan file names none)"),
            output: Optional[Path] = typer.Option(
                None, "-o", "--output", help="write the engine's file here (deepspeed: the "
                "ds_config; Megatron-DeepSpeed's flags go beside it as "
                "NAME.megatron-deepspeed.args)"),
            output_format: Optional[str] = typer.Option(
                None, "--format", help="megatron: args (one flag per line, default) | torchrun "
                "(a launch script)"),
            gpus_per_node: Optional[int] = typer.Option(
                None, "--gpus-per-node", help="megatron --format torchrun: GPUs per node "
                "(default 8)"),
            as_json: bool = typer.Option(False, "--json", help="print the files and notes as "
                                         "JSON")) -> None:
        """Write the launch flags or config file of an existing engine for a plan."""
        from dnnscale.export import export_plan
        from dnnscale.plan.engines import check_engine

        check_engine(to, "--to")
        options = _engine_options(to, output, output_format, gpus_per_node)
        targets = _output_paths(output, to)
        from dnnscale.atomic import check_distinct

        check_distinct([("--output", path) for path in targets],
                       (plan, workload.removeprefix("hf:") if workload else None))
        result = export_plan(plan, to, workload, **options)
        if targets:
            _write(result, targets)
        if as_json:
            from dnnscale.jsonout import print_json

            print_json({"engine": result.engine, "world_size": result.world_size,
                        "files": [{"name": f.name, "text": f.text} for f in result.files],
                        "written": [str(path) for path in targets], "notes": list(result.notes),
                        "assumptions": list(result.assumptions)})
            return
        import sys

        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        for assumption in result.assumptions:
            print(f"assumes: {assumption}", file=sys.stderr)
        if targets:
            for path in targets:
                print(f"wrote {path}")
            return
        for number, item in enumerate(result.files):
            if len(result.files) > 1:
                print(f"# ==> {item.name} <==" if number == 0 else f"\n# ==> {item.name} <==")
            print(item.text, end="")


def _engine_options(engine: str, output: Optional[Path], output_format: Optional[str],
                    gpus_per_node: Optional[int]) -> dict[str, Any]:
    """The exporter's keyword options; flags that belong to another engine are errors."""
    from dnnscale.errors import InputError, require_int

    options: dict[str, Any] = {}
    if output_format is not None:
        if engine != "megatron":
            raise InputError("--format", f"only applies with --to megatron (got --to {engine})")
        options["output_format"] = output_format
    if gpus_per_node is not None:
        if options.get("output_format") != "torchrun":
            raise InputError("--gpus-per-node", "only applies with --to megatron --format "
                             "torchrun")
        options["gpus_per_node"] = require_int("--gpus-per-node", gpus_per_node, maximum=1024)
    if engine == "deepspeed" and output is not None:
        options["config_name"] = str(output)
    return options


def _output_paths(output: Optional[Path], engine: str) -> list[Path]:
    """The files -o writes (checked before any work): the main one, and for deepspeed the
    Megatron-DeepSpeed flags beside it."""
    if output is None:
        return []
    from dnnscale.atomic import check_output_path

    paths = [check_output_path(output, "--output")]
    if engine == "deepspeed":
        from dnnscale.atomic import is_stream
        from dnnscale.errors import InputError
        from dnnscale.export.deepspeed import ARGS_NAME

        if is_stream(paths[0]):  # the companion would be made beside a device or a pipe
            raise InputError("--output", f"deepspeed writes two files (the config and "
                             f"NAME.{ARGS_NAME} beside it); give a file, not a device or pipe")
        paths.append(check_output_path(companion_path(paths[0], ARGS_NAME), "--output"))
    return paths


def companion_path(main: Path, suffix: str) -> Path:
    """``cfg/ds_config.json`` -> ``cfg/ds_config.megatron-deepspeed.args``."""
    return main.with_name(f"{main.stem}.{suffix}")


def _write(result: Any, targets: list[Path]) -> None:
    from dnnscale.atomic import atomic_write_text

    for item, path in zip(result.files, targets):
        atomic_write_text(path, item.text, "--output")
