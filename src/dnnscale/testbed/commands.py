"""`dnnscale testbed up | down | status | check`: an emulated cluster on this machine (as root).

Cheap to import: everything heavy is imported inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from dnnscale.errors import user_errors

testbed_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Emulated cluster on this machine: network namespaces as hosts, "
                               "rate-limited links, CPU quotas (needs root).")


def _print_json(data: Any) -> None:
    from dnnscale.jsonout import print_json

    print_json(data)


def _rate(bytes_per_s: float | None) -> str:
    from dnnscale.units import format_si

    return "-" if bytes_per_s is None else format_si(bytes_per_s * 8, "bit/s")


def _seconds(value: float | None) -> str:
    from dnnscale.units import format_seconds

    return "-" if value is None else format_seconds(value)


def _percent(ratio: float | None, tolerance: float | None = None) -> str:
    if ratio is None:
        return "-"
    text = f"{100 * ratio:.0f}%"
    if tolerance is not None and abs(ratio - 1) > tolerance:
        return f"[red]{text}[/red]"
    return text


DOWN_FLAGS: dict[str, tuple[str, ...]] = {"--name": ("one",)}
"""testbed down --all removes every testbed: no --name (plan/flags.py refuse_flags)."""
CHECK_FLAGS: dict[str, tuple[str, ...]] = {
    "--name": ("by-name",), **{flag: ("network",) for flag in ("--seconds", "--tries",
                                                              "--tolerance")},
    "--cpu-seconds": ("cpu",)}
"""testbed check's flags by what it measures, and --name unless --description names it."""
WORDS = {"one": "without --all", "by-name": "without --description",
         "network": "when links are measured (not with --no-network)",
         "cpu": "when CPU shares are measured (not with --no-cpu)"}


def _refuse(table: dict[str, tuple[str, ...]], paths: set[str]) -> None:
    from dnnscale.plan.flags import refuse_flags

    refuse_flags(table, paths, WORDS)


NAME_HELP = "testbed name (1-6 lower-case letters/digits); its objects are named dns-NAME-*"


@testbed_app.command()
@user_errors
def up(hosts: int = typer.Option(..., "--hosts", "-n", help="number of worker hosts"),
       rate: str = typer.Option("1gbit", "--rate", help="link rate of each worker, each "
                                "direction (e.g. 200mbit, 1gbit, 1.25GB/s)"),
       latency: str = typer.Option("0", "--latency", help="added one-way latency (e.g. 100us; "
                                   "needs the netem qdisc)"),
       cpu: Optional[float] = typer.Option(None, "--cpu", help="CPU quota of each worker in "
                                           "cores (default: 0.8 x cores split evenly, <= 1)"),
       ps_hosts: int = typer.Option(0, "--ps-hosts", help="number of parameter-server hosts"),
       ps_rate: Optional[str] = typer.Option(None, "--ps-rate", help="PS link rate (default: --rate)"),
       ps_latency: Optional[str] = typer.Option(None, "--ps-latency",
                                                help="PS added latency (default: --latency)"),
       ps_cpu: Optional[float] = typer.Option(None, "--ps-cpu", help="PS CPU quota (default: --cpu)"),
       cpu_period: Optional[str] = typer.Option(None, "--cpu-period", help="CFS period of every "
                                                "host's quota (e.g. 10ms; default 10ms, longer "
                                                "when a share needs it for a 1 ms quota); a long "
                                                "period lets an idle host burst"),
       name: str = typer.Option("tb", "--name", help=NAME_HELP),
       output: Optional[Path] = typer.Option(None, "-o", "--output",
                                             help="also write the description file here"),
       as_json: bool = typer.Option(False, "--json", help="print the description as JSON")) -> None:
    """Build the testbed: hosts as namespaces on a bridge, shaped links, CPU quotas."""
    from dnnscale.testbed.build import Interrupted, up as build_up
    from dnnscale.testbed.spec import cpu_budget_warning, make_spec

    if output is not None:
        from dnnscale.atomic import check_output_path

        check_output_path(output, "--output")
    spec = make_spec(name, hosts, rate, latency, cpu, ps_hosts, ps_rate, ps_latency, ps_cpu,
                     cpu_period)
    warning = cpu_budget_warning(spec)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        desc = build_up(spec, copy_to=output)
    except (KeyboardInterrupt, Interrupted):
        print("error: testbed up interrupted; everything it had made was removed", file=sys.stderr)
        raise typer.Exit(130) from None
    if as_json:
        _print_json({**desc.to_dict(), "description_file": desc.source})
        return
    from rich.console import Console

    console = Console()
    console.print(_hosts_table(desc))
    console.print(f"description: {desc.source}" + (f" (copy: {output})" if output else ""))


def _hosts_table(desc: Any) -> Any:
    from rich.table import Table

    table = Table(title=f"testbed {desc.name} ({desc.subnet}, bridge {desc.bridge})")
    numeric = ("rate", "latency", "cpu", "cpu period")
    for column in ("host", "role", "namespace", "address", *numeric):
        table.add_column(column, justify="right" if column in numeric else "left")
    for h in desc.hosts:
        table.add_row(h.name, h.role, h.namespace, h.address, _rate(h.rate_bytes_per_s),
                      _seconds(h.latency_s), f"{h.cpu_cores:g}", _seconds(h.cpu_period_s))
    return table


@testbed_app.command()
@user_errors
def down(name: str = typer.Option("tb", "--name", help=NAME_HELP),
         all_testbeds: bool = typer.Option(False, "--all", help="remove every testbed"),
         as_json: bool = typer.Option(False, "--json", help="print what was removed as JSON")) -> None:
    """Remove every namespace, link, qdisc, cgroup and process of the testbed (found by name)."""
    from dnnscale.testbed.names import check_name
    from dnnscale.testbed.teardown import down as tear_down

    _refuse(DOWN_FLAGS, set() if all_testbeds else {"one"})
    report = tear_down(None if all_testbeds else check_name(name, "--name"))
    if as_json:
        _print_json({"removed": report.removed, "killed_pids": report.killed_pids})
        return
    what = "every testbed" if all_testbeds else f"testbed {name!r}"
    if not report.removed:
        print(f"{what}: nothing to remove")
        return
    killed = f", stopped {len(report.killed_pids)} processes" if report.killed_pids else ""
    print(f"{what}: removed {len(report.removed)} objects{killed}")


@testbed_app.command()
@user_errors
def status(name: Optional[str] = typer.Option(None, "--name", help="only this testbed"),
           as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """What testbeds exist: their hosts and every object found on the machine."""
    from dnnscale.testbed.status import testbed_states

    states = testbed_states(name)
    if as_json:
        _print_json([state.to_dict() for state in states])
        return
    from rich.console import Console

    console = Console()
    if not states:
        console.print("no testbed" + (f" named {name!r}" if name else ""))
    for state in states:
        if state.description is not None:
            console.print(_hosts_table(state.description))
        console.print(f"testbed {state.name}: [bold]{state.state}[/bold]"
                      + (f" - {state.problem}" if state.problem else ""))
        for obj in state.inventory.objects():
            console.print(f"  {obj}")


@testbed_app.command()
@user_errors
def check(name: str = typer.Option("tb", "--name", help=NAME_HELP),
          description: Optional[Path] = typer.Option(None, "--description",
                                                     help="description file (instead of --name)"),
          seconds: float = typer.Option(0.5, "--seconds", help="length of each bandwidth flow"),
          tries: int = typer.Option(2, "--tries", help="flows per link and direction; the "
                                    "fastest counts (a busy machine can only slow one down)"),
          cpu_seconds: float = typer.Option(2.0, "--cpu-seconds", help="length of the CPU test"),
          network: bool = typer.Option(True, "--network/--no-network",
                                       help="measure every link's rate and latency"),
          cpu: bool = typer.Option(True, "--cpu/--no-cpu", help="measure each host's CPU share"),
          tolerance: float = typer.Option(0.1, "--tolerance", help="exit 1 if a link's measured "
                                          "rate is off the expected by more than this fraction"),
          output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                help="also write the measured description here"),
          as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Measure every link (both directions), latency and CPU share; print them next to the asked.

    The measurements are stored in the description file, so clusters derived from it use them.
    """
    from dnnscale.errors import InputError, require_int, require_positive
    from dnnscale.testbed.check import CheckOptions, check as run_check, with_measurements
    from dnnscale.testbed.describe import load_description, save_copy, save_description

    _refuse(CHECK_FLAGS, {"by-name" if description is None else "by-file"}
            | ({"network"} if network else set()) | ({"cpu"} if cpu else set()))
    require_positive("--seconds", seconds)
    require_positive("--cpu-seconds", cpu_seconds)
    require_int("--tries", tries)
    if not 0 < tolerance < 1:
        raise InputError("--tolerance", f"must be between 0 and 1, got {tolerance}")
    if output is not None:
        from dnnscale.atomic import check_output_path

        check_output_path(output, "--output")
    from dnnscale.testbed.names import check_name

    desc = load_description(description if description is not None
                            else check_name(name, "--name"))
    options = CheckOptions(seconds_per_flow=seconds, tries=tries, cpu_seconds=cpu_seconds,
                           network=network, cpu=cpu)
    checks = run_check(desc, options)
    measured = with_measurements(desc, checks)
    save_description(measured, Path(desc.source))
    if output is not None:
        save_copy(measured, output, "--output")
    rows = [c.to_dict() for c in checks]
    off = [f"{r['name']} {direction}" for r in rows for direction in ("egress", "ingress")
           if r["ratio"][direction] is not None and abs(r["ratio"][direction] - 1) > tolerance]
    if as_json:
        _print_json({"testbed": desc.name, "tolerance": tolerance, "links_off": off,
                     "hosts": rows, "description_file": desc.source})
    else:
        from rich.console import Console

        console = Console()
        console = Console(width=max(console.width, 124))
        console.print(_check_table(desc.name, checks, tolerance))
        console.print("rates are TCP payload (about 4-5 % below the tbf rate, which counts "
                      "headers); latency is one-way (half the median round trip)")
    if off:
        print(f"error: links off the expected rate by more than {100 * tolerance:g} %: "
              f"{', '.join(off)}", file=sys.stderr)
        raise typer.Exit(1)


def _check_table(name: str, checks: list[Any], tolerance: float) -> Any:
    from rich.table import Table

    table = Table(title=f"testbed {name}: asked vs measured (rates in Mbit/s)")
    columns = ("host", "peer", "asked", "egress", "ingress", "latency asked", "latency",
               "cpu asked", "cpu share", "matmul GFLOP/s")
    for column in columns:
        table.add_column(column, justify="left" if column in ("host", "peer") else "right")
    for c in checks:
        h, m, r = c.host, c.measured, c.to_dict()["ratio"]
        asked = _mbit(h.rate_bytes_per_s)
        expected = c.expected_egress_bytes_per_s
        if expected is not None and expected < h.rate_bytes_per_s:
            asked += f" (peers {_mbit(expected)})"   # what the % columns compare with
        table.add_row(h.name, m.peer or "-", asked,
                      _with_ratio(_mbit(m.egress_bytes_per_s), r["egress"], tolerance),
                      _with_ratio(_mbit(m.ingress_bytes_per_s), r["ingress"], tolerance),
                      _seconds(h.latency_s), _seconds(m.latency_s), f"{h.cpu_cores:g}",
                      _with_ratio("-" if m.cpu_share is None else f"{m.cpu_share:.3f}", r["cpu"]),
                      "-" if m.matmul_flops_per_s is None else f"{m.matmul_flops_per_s / 1e9:.1f}")
    return table


def _mbit(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s * 8 / 1e6:.1f}"


def _with_ratio(text: str, ratio: float | None, tolerance: float | None = None) -> str:
    return text if ratio is None else f"{text} {_percent(ratio, tolerance)}"


def register(app: typer.Typer) -> None:
    """Add the `testbed` command group to the main CLI."""
    app.add_typer(testbed_app, name="testbed")
