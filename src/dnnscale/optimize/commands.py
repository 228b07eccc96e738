"""`dnnscale optimize`: the fastest configuration within a machine budget, and the curve.

Imported by the CLI at startup, so only typer is imported here; the rest inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

ADAM, GPU = "adam", "gpu"
TABLE, JSON, QUIET = "table", "json", "quiet"
WRITES = "writes"
SPACE_FLAGS: dict[str, tuple[str, ...]] = {
    **{flag: (ADAM,) for flag in ("--modes", "--minibatch", "--push-every", "--pull-every",
                                  "--fc-protocol", "--overlap", "--choose-overlap",
                                  "--optimizer", "--epoch-fraction", "--exhaustive",
                                  "--full-curve")},
    **{flag: (GPU,) for flag in ("--global-batch", "--tp", "--pp", "--micro-batch", "--zero",
                                 "--recompute", "--schedule", "--precision", "--objective",
                                 "--price", "--pareto", "--tokens", "--engine",
                                 "--sequence-parallel", "--overlap-dp", "--ep", "--cp",
                                 "--cp-algorithm", "--expert-imbalance", "--loss", "--amp")},
}
"""optimize's flags by the space searched (plan/flags.py refuse_flags); the rest apply to both."""
OUTPUT_FLAGS: dict[str, tuple[str, ...]] = {
    "--full-curve": (TABLE,), "--tokens": (TABLE, JSON), "--json": (TABLE, JSON),
    "--quiet": (WRITES,)}
"""optimize's flags by what it prints: the table, JSON, or nothing (--quiet), and --quiet only
when it writes a file."""
WORDS = {ADAM: "to Adam's CPU search", GPU: "to the GPU-plan search",
         TABLE: "to the printed tables (not with --json or --quiet)",
         JSON: "to what optimize prints (not with --quiet)",
         WRITES: "with --html, --csv or --plot (there is nothing else to print)"}

HERE = {ADAM: "this search is over Adam's CPU configurations (not a transformer workload on "
              "accelerators)",
        GPU: "this search is over GPU plans (a transformer workload on accelerators)"}


def register(app: typer.Typer) -> None:
    """Add the `optimize` command to `app`."""
    from dnnscale.plan.flags import WORKLOAD_HELP
    from dnnscale.system.commands import (CLUSTER_HELP, INTER_NODE_BANDWIDTH_OPTION,
                                          INTER_NODE_LATENCY_OPTION, INTERCONNECT_OPTION,
                                          NICS_OPTION)
    from dnnscale.errors import user_errors

    @app.command()
    @user_errors
    def optimize(
            workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
            cluster: str = typer.Option(..., "--cluster", "-c", help=CLUSTER_HELP),
            machines: Optional[int] = typer.Option(
                None, "--machines", "-M", help="machine budget (default: the cluster's machines; "
                "on local, the 4 ranks its 2 cores hold)"),
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
            overlap: Optional[bool] = typer.Option(
                None, "--overlap/--no-overlap",
                help="overlap PS traffic with computation (the cluster's γ-norm)"),
            choose_overlap: bool = typer.Option(
                False, "--choose-overlap", help="let the PS configurations run with overlap "
                                                "on or off, whichever is faster"),
            optimizer: Optional[str] = typer.Option(None, "--optimizer",
                                                    help="sgd | momentum | adam"),
            epoch_fraction: Optional[float] = typer.Option(
                None, "--epoch-fraction",
                help="Adam's straggler cut-off: an epoch ends when this fraction is done"),
            interconnect: Optional[str] = INTERCONNECT_OPTION,
            inter_node_bandwidth: Optional[str] = INTER_NODE_BANDWIDTH_OPTION,
            inter_node_latency: Optional[str] = INTER_NODE_LATENCY_OPTION,
            nics_per_node: Optional[int] = NICS_OPTION,
            input_shape: Optional[str] = typer.Option(
                None, "--input-shape", help="with -w package.module:factory, one sample's "
                "input shape without the batch, e.g. 3,224,224"),
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
            zero: Optional[str] = typer.Option(
                None, "--zero", help="GPU: ZeRO stages 0-3, e.g. 0,1 (default: all four)"),
            sequence_parallel: Optional[str] = typer.Option(
                None, "--sequence-parallel", help="GPU: on, off or on,off (default: both; "
                "only with tp > 1)"),
            overlap_dp: Optional[str] = typer.Option(
                None, "--overlap-dp", help="GPU: data-parallel gradients overlap the backward "
                "pass: on, off or on,off (default: both)"),
            overlap_tp: Optional[str] = typer.Option(
                None, "--overlap-tp", help="GPU: tensor-parallel exchanges under the GEMMs "
                "(tp > 1 with sequence parallelism; Megatron's --tp-comm-overlap): on, off or "
                "on,off (default: off, the engines' default)"),
            overlap_pp: Optional[str] = typer.Option(
                None, "--overlap-pp", help="GPU: pipeline sends under compute (interleaved "
                "schedule): on, off or on,off (default: on, Megatron's)"),
            ep: Optional[str] = typer.Option(
                None, "--ep", help="GPU: expert-parallel degrees, e.g. 1,2,4,8 (default: the "
                "divisors of a MoE model's experts; 1 for a dense model)"),
            cp: Optional[str] = typer.Option(
                None, "--cp", help="GPU: context-parallel degrees, e.g. 1,2,4 (default: "
                "1,2,4,8 from 16k-token sequences, else 1)"),
            cp_algorithm: Optional[str] = typer.Option(
                None, "--cp-algorithm", help="GPU: ring,alltoall (choices; default both)"),
            expert_imbalance: Optional[float] = typer.Option(
                None, "--expert-imbalance", help="GPU: the busiest ep member's routed tokens "
                "over the mean, for every plan (default 1: uniform)"),
            etp: Optional[str] = typer.Option(
                None, "--etp", help="GPU: expert tensor-parallel degrees to try besides tp, "
                "e.g. 1 (MoE workloads; each plan takes those dividing its tp; default: tp)"),
            engine: Optional[str] = typer.Option(
                None, "--engine", help="GPU: megatron | deepspeed | torchtitan: only plans "
                "that engine runs as priced (default: any; the result names the engines "
                "that run the winner)"),
            recompute: Optional[str] = typer.Option(
                None, "--recompute", help="GPU: none,selective,full,op (choices; default "
                "none,selective,full, torchtitan's none,op,full)"),
            loss: Optional[str] = typer.Option(
                None, "--loss", help="GPU: how every plan computes the loss: inplace | torch "
                "| torch16 | fused (default: the --engine's, else inplace, Megatron's)"),
            amp: Optional[str] = typer.Option(
                None, "--amp", help="GPU, 16-bit precisions: how every plan runs its "
                "memory-bound kernels: half (the model cast to 16 bits, every engine's, the "
                "default) | autocast | tf-amp"),
            schedule: Optional[str] = typer.Option(None, "--schedule",
                                                   help="GPU: 1f1b,interleaved,gpipe (choices)"),
            precision: Optional[str] = typer.Option(
                None, "--precision", help="GPU: bf16 (default) | fp16 | fp8 ..."),
            objective: Optional[str] = typer.Option(None, "--objective",
                                                    help="time (default) | cost"),
            price: Optional[float] = typer.Option(
                None, "--price", help="USD per device-hour (for --objective cost)"),
            pareto: bool = typer.Option(False, "--pareto",
                                        help="list the plans no other beats on time and GPUs"),
            tokens: Optional[float] = typer.Option(
                None, "--tokens", help="GPU: also report the time to train this many tokens"),
            html: Optional[Path] = typer.Option(
                None, "--html", help="also write the HTML report (timeline, memory, curve) to "
                "FILE"),
            csv: Optional[str] = typer.Option(None, "--csv",
                                              help="also write the ranked plans as CSV to "
                                                   "FILE ('-': stdout)"),
            quiet: bool = typer.Option(False, "--quiet", "-q",
                                       help="print nothing but errors (with --html, --csv)"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
        """Find the configuration with the least predicted epoch time, rank the runners-up, and
        print the scalability curve (best epoch time and speedup per machine budget)."""
        from dnnscale.atomic import check_distinct, check_output_path
        from dnnscale.errors import InputError, require_positive
        from dnnscale.optimize.entry import is_gpu_space, optimize as run_optimize
        from dnnscale.optimize.modern_commands import print_gpu_result, strings, switches
        from dnnscale.optimize.result import SpaceKind
        from dnnscale.optimize.space import parse_fc_protocols, parse_int_list
        from dnnscale.plan import config_from_dict
        from dnnscale.plan.flags import print_notes, refuse_flags
        from dnnscale.system.gpu import bare_preset_note
        from dnnscale.system.load import load_cluster
        from dnnscale.workload.source import resolve_workload

        for path, name in ((plot, "--plot"), (html, "--html"),
                           (None if csv == "-" else csv, "--csv")):
            if path is not None:
                check_output_path(path, name)
        check_distinct([("--plot", plot), ("--html", html),
                        ("--csv", None if csv == "-" else csv)],
                       (workload.removeprefix("hf:"), cluster))
        if csv == "-" and as_json:
            raise InputError("--csv", "'-' writes the CSV to stdout, which holds the --json "
                             "document; give a file")
        w = resolve_workload(workload, input_shape, field="--workload")
        c = load_cluster(cluster, dict(interconnect=interconnect, bandwidth=inter_node_bandwidth,
                                       latency=inter_node_latency, nics_per_node=nics_per_node))
        space = GPU if is_gpu_space(w, c) else ADAM
        refuse_flags(SPACE_FLAGS, {space}, WORDS, HERE[space])
        refuse_flags(OUTPUT_FLAGS, {QUIET if quiet else JSON if as_json else TABLE}
                     | ({WRITES} if html or csv or plot else set()), WORDS)
        if price is not None:  # the API names it price_per_device_hour
            require_positive("--price", price)
        if tokens is not None:  # before the search: a count, at most MAX_COUNT
            from dnnscale.errors import MAX_COUNT

            if require_positive("--tokens", tokens) > MAX_COUNT:
                raise InputError("--tokens", f"must be <= {MAX_COUNT:,} (2^53) tokens, got "
                                 f"{tokens:.3g}")
        silent = quiet or csv == "-"
        lists = {name: parse_int_list(value, name, minimum=0 if name == "zero" else 1)
                 for name, value in (("minibatch", minibatch), ("push_every", push_every),
                                     ("pull_every", pull_every), ("tp", tp), ("pp", pp),
                                     ("micro_batch", micro_batch), ("zero", zero),
                                     ("ep", ep), ("cp", cp), ("etp", etp))}
        if global_batch is None and space == GPU:  # after the lists: a bad --tp is named first
            raise InputError("--global-batch", "required for GPU plans (samples per step)")
        protocols = parse_fc_protocols(fc_protocol)
        if choose_overlap and overlap is not None:
            raise InputError("--choose-overlap", "lets the optimizer choose; do not also give "
                             "--overlap/--no-overlap")
        fixed = {"fc_protocol": protocols[0] if len(protocols) == 1 else None,
                 "overlap": overlap, "optimizer": optimizer, "epoch_fraction": epoch_fraction}
        base = (config_from_dict(fixed, where="optimize")
                if any(value is not None for value in fixed.values()) else None)

        def search(chosen_modes: Any, how_many: int) -> Any:
            """The one entry point, with every flag given (a flag of the other space is an
            InputError naming it)."""
            return run_optimize(w, c, machines=machines, modes=chosen_modes, top=how_many,
                                minibatch=lists["minibatch"],
                                push_every=lists["push_every"],
                                pull_every=lists["pull_every"], base=base,
                                method="exhaustive" if exhaustive else "fast",
                                fc_protocols=protocols if len(protocols) > 1 else None,
                                choose_overlap=choose_overlap, global_batch=global_batch,
                                tp=lists["tp"], pp=lists["pp"],
                                micro_batch=lists["micro_batch"],
                                zero=lists["zero"],
                                recompute=strings(recompute, "recompute"),
                                schedules=strings(schedule, "schedule"), precision=precision,
                                sequence_parallel=switches(sequence_parallel,
                                                           "--sequence-parallel"),
                                overlap_dp=switches(overlap_dp, "--overlap-dp"),
                                overlap_tp=switches(overlap_tp, "--overlap-tp"),
                                overlap_pp=switches(overlap_pp, "--overlap-pp"),
                                engine=engine, loss=loss, amp=amp, ep=lists["ep"],
                                cp=lists["cp"],
                                cp_algorithms=strings(cp_algorithm, "cp_algorithm"),
                                expert_imbalance=expert_imbalance, etp=lists["etp"],
                                objective=objective, pareto=pareto or None,
                                price_per_device_hour=price)

        try:
            result = search(modes, top)
        except InputError as exc:  # the API's names that are not the flags' (user_errors names
            if exc.field not in API_FLAGS:  # the others by the flags' own names)
                raise
            raise InputError(API_FLAGS[exc.field], exc.problem) from None
        if not quiet:
            print_notes(bare_preset_note(cluster))
        from dnnscale.atomic import outputs_together

        if result.space is SpaceKind.GPU:
            with outputs_together():  # every file made before any is replaced, then stdout
                print_gpu_result(result, w, tokens, plot, as_json, quiet=True)
                _write_outputs(result, w, c, html, csv, None, True)
            print_gpu_result(result, w, tokens, None, as_json, silent)
            if html is not None and not (silent or as_json):
                print(f"report written to {html}")
            return
        with outputs_together():
            if plot is not None:
                from dnnscale.report.curve_plot import plot_result_curve

                plot_result_curve(result, plot)
            _write_outputs(result, w, c, html, csv, lambda mode: search(mode, 1), True)
        if silent:
            return
        if as_json:
            from dnnscale.jsonout import print_json

            print_json(result.to_dict())
            return
        _print_report(result, full_curve, plot, html)


API_FLAGS = {"schedules": "--schedule", "gpus": "--machines", "cp_algorithm": "--cp-algorithm",
             "expert_imbalance": "--expert-imbalance"}
"""The optimize API's argument names whose flag has another name."""


def _write_outputs(result: Any, workload: Any, system: Any, html: Optional[Path],
                   csv: Optional[str], rerun: Any, silent: bool) -> None:
    """The HTML report and the CSV of the ranked plans, when asked for."""
    if html is not None:
        from dnnscale.report.build import optimize_report
        from dnnscale.report.pages import write_html

        write_html(optimize_report(result, workload, system, rerun), html)
        if not silent:
            print(f"report written to {html}")
    if csv is not None:
        from dnnscale.report.csv_out import write_ranked_csv

        write_ranked_csv(result.top, csv)


def _print_report(result: Any, full_curve: bool, plot: Optional[Path],
                  html: Optional[Path] = None) -> None:
    from dnnscale.optimize.tables import curve_table, plan_table, top_table
    from dnnscale.report.console import console as make_console

    console = make_console()
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
    if html is not None:
        console.print(f"report written to {html}")
