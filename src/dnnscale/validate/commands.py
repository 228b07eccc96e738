"""`dnnscale validate`: predicted vs measured on the testbed (imports stay light here)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from dnnscale.errors import InputError


def register(app: typer.Typer) -> None:
    app.command(name="validate")(validate_command)
    app.command(name="bands")(bands_command)


def bands_command(
        device: Optional[str] = typer.Option(
            None, "--device", help="only regimes whose device contains this text, any case "
            "(e.g. H100, A100-SXM4, cpu)"),
        show_all: bool = typer.Option(False, "--all", help="also the regimes with fewer rows "
                                      "than a band needs"),
        as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The error each measured regime showed: the bands predictions carry (docs/accuracy.md)."""
    from dnnscale.errors import user_errors

    user_errors(_bands)(device, show_all, as_json)


def _bands(device: Optional[str], show_all: bool, as_json: bool) -> None:
    from dnnscale.model.error_band import MIN_ROWS, measured_regimes

    regimes = measured_regimes()
    if device is not None:
        wanted = device.strip().lower()
        known = sorted({r.regime.device for r in regimes})
        if not wanted:
            raise InputError("--device", "give part of a device name, e.g. H100 or cpu")
        regimes = [r for r in regimes if wanted in r.regime.device.lower()]
        if not regimes:
            raise InputError("--device", f"no measured regime on a device matching "
                             f"{device!r}; measured devices: {', '.join(known) or 'none'}")
    shown = regimes if show_all else [r for r in regimes if r.validated]
    thin = len(regimes) - len(shown)  # 0 with --all
    if as_json:
        from dnnscale.jsonout import print_json

        print_json({"min_rows": MIN_ROWS, "regimes": [r.to_dict() for r in shown],
                    "left_out": thin})
        return
    from dnnscale.report.console import console
    from dnnscale.report.tables import bands_table

    out = console()
    out.print(bands_table(shown))
    if thin:
        out.print(f"{thin} more measured regime{'s' if thin != 1 else ''} with fewer than "
                  f"{MIN_ROWS} rows (no band): --all lists them")


def validate_command(
        workload: Optional[str] = typer.Option(None, "--workload", "-w",
                                               help="zoo name or YAML (default: the grid's)"),
        testbed: str = typer.Option(..., "--testbed", help="testbed name or description file"),
        configs: Path = typer.Option(..., "--configs", help="grid YAML (see docs/accuracy.md)"),
        profile: Optional[Path] = typer.Option(None, "--profile",
                                               help="calibrated hardware profile YAML"),
        output: Path = typer.Option(..., "-o", "--output", help="output folder"),
        repeats: Optional[int] = typer.Option(None, "--repeats", help="override the grid's"),
        steps: Optional[int] = typer.Option(None, "--steps", help="override the grid's"),
        no_optimizer: bool = typer.Option(False, "--no-optimizer", help="skip the regret check"),
        reuse_runs: bool = typer.Option(False, "--reuse-runs", help="read runs already in "
                                        "OUTPUT/runs (same configuration and splits) instead of "
                                        "running them again; predictions are made anew"),
        html: Optional[Path] = typer.Option(
            None, "--html", help="write the HTML report here (default: OUTPUT/report.html)"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as JSON")) -> None:
    """Predict and run every configuration of a grid on the testbed; errors, baselines, regret."""
    from dnnscale.errors import user_errors

    user_errors(_validate)(workload, testbed, configs, profile, output, repeats, steps,
                           no_optimizer, as_json, reuse_runs, html)


def _validate(workload: Optional[str], testbed: str, configs: Path, profile: Optional[Path],
              output: Path, repeats: Optional[int], steps: Optional[int], no_optimizer: bool,
              as_json: bool, reuse_runs: bool = False, html: Optional[Path] = None) -> None:
    import dataclasses

    from rich.console import Console

    from dnnscale.errors import InputError, require_int
    from dnnscale.testbed.describe import cluster_from_description, load_description
    from dnnscale.validate.grid import load_grid
    from dnnscale.validate.pipeline import validate
    from dnnscale.validate.profile import apply_profile
    from dnnscale.validate.report import markdown, write_outputs

    from dnnscale.atomic import check_output_path
    from dnnscale.jsonout import print_json

    check_output_path(output, "--output", folder=True)
    if html is not None:
        check_output_path(html, "--html")
    grid = load_grid(configs)
    overrides = {k: require_int(f"--{k}", v) for k, v in (("repeats", repeats), ("steps", steps))
                 if v is not None}
    grid = dataclasses.replace(grid, **overrides)
    workload_ref = workload or grid.workload
    if not workload_ref:
        raise InputError("--workload", "missing (and the grid names none)")
    if workload is not None:  # a bad -w is an error before the testbed is looked for
        from dnnscale.workload.source import load_named

        load_named(workload)
    if Path(workload_ref).is_file():  # the ranks may start in another folder
        workload_ref = str(Path(workload_ref).resolve())
    desc = load_description(testbed)
    cluster = cluster_from_description(desc)
    if profile is not None:
        cluster = apply_profile(cluster, profile, desc)
    console = Console(stderr=True)
    rate = sorted({h.rate_bytes_per_s * 8 / 1e6 for h in desc.hosts})
    label = "/".join(f"{r:g} Mbit/s" for r in rate)
    result = validate(workload_ref, cluster, desc, grid, output / "runs",
                      progress=lambda text: console.log(text), network_label=label,
                      optimizer=not no_optimizer, reuse=reuse_runs)
    result["testbed"] = desc.name
    result["calibrated"] = cluster.calibrated
    result["note"] = (f"Predictions from cluster {cluster.name!r}"
                      f"{' with profile ' + str(profile) if profile else ' (uncalibrated)'}.")
    write_outputs(result, output, html)
    if as_json:
        print_json(result["summary"])
    else:
        sys.stdout.write(markdown(result))
