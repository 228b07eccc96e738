"""`dnnscale optimize`: the fastest configuration within a machine budget, and the curve.

Imported by the CLI at startup, so only typer is imported here; the rest inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


def register(app: typer.Typer) -> None:
    """Add the `optimize` command to `app`."""
    from dnnscale.errors import user_errors

    @app.command()
    @user_errors
    def optimize(
            workload: str = typer.Option(..., "--workload", "-w", help="zoo name or YAML"),
            cluster: str = typer.Option(..., "--cluster", "-c", help="preset name or YAML"),
            machines: Optional[int] = typer.Option(
                None, "--machines", "-M", help="machine budget (default: the cluster's machines)"),
            modes: Optional[str] = typer.Option(
                None, "--modes", help="comma-separated: ps-async,ps-sync,allreduce (default: all)"),
            top: int = typer.Option(5, "--top", "-k", help="how many groups to rank"),
            minibatch: Optional[str] = typer.Option(
                None, "--minibatch", "-n", help="minibatch, or choices: 16,32,64 (default 32)"),
            push_every: Optional[str] = typer.Option(
                None, "--push-every", help="steps between pushes, or choices: 1,2,4 (default 1)"),
            pull_every: Optional[str] = typer.Option(
                None, "--pull-every", help="steps between pulls, or choices (default 1)"),
            fc_protocol: Optional[str] = typer.Option(
                None, "--fc-protocol", help="weights | vectors, or weights,vectors to let the "
                                            "PS configurations choose (Adam's FC protocol)"),
            overlap: Optional[bool] = typer.Option(None, "--overlap/--no-overlap"),
            choose_overlap: bool = typer.Option(
                False, "--choose-overlap", help="let the PS configurations run with overlap "
                                                "on or off, whichever is faster"),
            optimizer: Optional[str] = typer.Option(None, "--optimizer",
                                                    help="sgd | momentum | adam"),
            epoch_fraction: Optional[float] = typer.Option(None, "--epoch-fraction"),
            exhaustive: bool = typer.Option(
                False, "--exhaustive", help="enumerate every configuration (the slow reference)"),
            plot: Optional[Path] = typer.Option(None, "--plot",
                                                help="write the scalability curve as a PNG"),
            full_curve: bool = typer.Option(False, "--full-curve",
                                            help="print every budget of the curve"),
            global_batch: Optional[int] = typer.Option(
                None, "--global-batch", help="GPU plans: samples (sequences) per step"),
            tp: Optional[str] = typer.Option(None, "--tp", help="GPU: tensor degrees, e.g. 1,2,4,8"),
            pp: Optional[str] = typer.Option(None, "--pp", help="GPU: pipeline stages, e.g. 1,2,4"),
            micro_batch: Optional[str] = typer.Option(None, "--micro-batch",
                                                      help="GPU: micro-batch choices"),
            zero: Optional[str] = typer.Option(None, "--zero", help="GPU: ZeRO stages, e.g. 0,1"),
            recompute: Optional[str] = typer.Option(
                None, "--recompute", help="GPU: none,selective,full (choices)"),
            schedule: Optional[str] = typer.Option(None, "--schedule",
                                                   help="GPU: 1f1b,interleaved,gpipe (choices)"),
            precision: str = typer.Option("bf16", "--precision", help="GPU: bf16 | fp16 | fp8 ..."),
            objective: str = typer.Option("time", "--objective", help="time | cost"),
            price: Optional[float] = typer.Option(
                None, "--price", help="USD per device-hour (for --objective cost)"),
            pareto: bool = typer.Option(False, "--pareto",
                                        help="list the plans no other beats on time and GPUs"),
            tokens: Optional[float] = typer.Option(
                None, "--tokens", help="GPU: also report the time to train this many tokens"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """Find the configuration with the least predicted epoch time, rank the runners-up, and
        print the scalability curve (best epoch time and speedup per machine budget)."""
        from dnnscale.plan import config_from_dict
        from dnnscale.optimize.api import optimize as run_optimize
        from dnnscale.optimize.space import parse_int_list

        if plot is not None:
            from dnnscale.atomic import check_output_path

            check_output_path(plot, "--plot")
        from dnnscale.optimize.api import is_gpu_problem

        if is_gpu_problem(workload, cluster):
            from dnnscale.optimize.modern_commands import run_modern

            run_modern(workload, cluster, machines, global_batch, top, tp, pp, micro_batch, zero,
                       recompute, schedule, precision, objective, price, pareto, tokens, plot,
                       as_json)
            return

        from dnnscale.errors import InputError
        from dnnscale.optimize.space import parse_fc_protocols

        protocols = parse_fc_protocols(fc_protocol)
        if choose_overlap and overlap is not None:
            raise InputError("--choose-overlap", "lets the optimizer choose; do not also give "
                             "--overlap/--no-overlap")
        base = config_from_dict({"fc_protocol": protocols[0] if len(protocols) == 1 else None,
                                 "overlap": overlap, "optimizer": optimizer,
                                 "epoch_fraction": epoch_fraction}, where="optimize")
        result = run_optimize(workload, cluster, machines=machines, modes=modes, top=top,
                              minibatch=parse_int_list(minibatch, "minibatch"),
                              push_every=parse_int_list(push_every, "push_every"),
                              pull_every=parse_int_list(pull_every, "pull_every"), base=base,
                              method="exhaustive" if exhaustive else "fast",
                              fc_protocols=protocols if len(protocols) > 1 else None,
                              choose_overlap=choose_overlap)
        if plot is not None:
            from dnnscale.report.curve_plot import plot_curve

            plot_curve([p.machines for p in result.curve], [p.epoch_time_s for p in result.curve],
                       [p.speedup for p in result.curve], plot,
                       title=f"{result.workload} on {result.cluster}: best predicted "
                       f"configuration per budget")
        if as_json:
            from dnnscale.jsonout import print_json

            print_json(result.to_dict())
            return
        _print_report(result, full_curve, plot)


def _print_report(result: Any, full_curve: bool, plot: Optional[Path]) -> None:
    from rich.console import Console

    from dnnscale.optimize.tables import curve_table, plan_table, top_table

    console = Console()
    console.print(plan_table(result))
    console.print("[bold]Why it wins[/bold]")
    for line in result.explanation:
        console.print(f"  - {line}")
    console.print(top_table(result))
    console.print(curve_table(result, full_curve))
    for item in result.infeasible:
        console.print(f"[yellow]infeasible:[/yellow] {item.what}: {item.reason}")
    console.print(f"{result.method} search: {result.evaluated:,} configurations evaluated"
                  + (f", {result.bounds_evaluated:,} interval bounds" if result.bounds_evaluated
                     else "") + f" in {result.search_time_s * 1000:.0f} ms")
    if plot is not None:
        console.print(f"curve plot written to {plot}")
