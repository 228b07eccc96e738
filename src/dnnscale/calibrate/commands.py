"""`dnnscale calibrate`: measure this machine (or the testbed) and write a hardware profile.

Cheap to import: torch and the benchmarks load inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer


MAX_PEERS = 64
"""The largest all-reduce group calibrate measures (each peer is a process)."""

MODE_FLAGS: dict[str, tuple[str, ...]] = {
    "--free-core": ("testbed",), "--max-message": ("testbed",),
    **{flag: ("local", "testbed") for flag in ("--no-network", "--kinds", "--allreduce-peers")},
    **{flag: ("gpu",) for flag in ("--device", "--as", "--steps")},
}
"""calibrate's flags by what it measures (plan/flags.py refuse_flags); the rest apply to all."""
NETWORK_FLAGS: dict[str, tuple[str, ...]] = {"--allreduce-peers": ("network",),
                                             "--max-message": ("network",)}
"""--allreduce-peers and --max-message size a network measurement."""
WORDS = {"local": "with --local", "testbed": "with --testbed",
         "gpu": "with --gpu", "network": "when the network is measured (not with --no-network)"}


def register(app: typer.Typer) -> None:
    """Add the `calibrate` command to the CLI."""
    from dnnscale.errors import user_errors

    @app.command()
    @user_errors
    def calibrate(local: bool = typer.Option(False, "--local", help="measure this machine "
                                             "(network: two processes over loopback)"),
                  testbed: Optional[Path] = typer.Option(None, "--testbed", help="testbed "
                                                         "description file: network between "
                                                         "its hosts"),
                  output: Path = typer.Option(..., "-o", "--output", help="profile YAML to write"),
                  quick: bool = typer.Option(False, "--quick", help="under a minute, coarser"),
                  no_network: bool = typer.Option(False, "--no-network",
                                                  help="skip the network measurements"),
                  kinds: Optional[str] = typer.Option(None, "--kinds", help="comma-separated "
                                                      "grid groups (conv2d, linear, pooling, "
                                                      "elementwise); default all"),
                  allreduce_peers: Optional[str] = typer.Option(
                      None, "--allreduce-peers", help="all-reduce group sizes (default 2,4; on "
                      "a testbed every size from 2 to its worker hosts)"),
                  max_message: Optional[str] = typer.Option(
                      None, "--max-message", help="testbed: the largest message measured "
                      "(point-to-point, all-reduce, held pulls), e.g. 16MiB; at least a "
                      "workload's full gradient (default 4MiB)"),
                  free_core: bool = typer.Option(False, "--free-core", help="testbed: measure "
                                                 "compute on a free core of this machine, not "
                                                 "inside a host under its quota"),
                  gpu: bool = typer.Option(False, "--gpu", help="measure a CUDA GPU's kernels "
                                           "and write a GPU profile"),
                  device: str = typer.Option("cuda", "--device", help="--gpu: cuda or cuda:N"),
                  as_device: Optional[str] = typer.Option(
                      None, "--as", help="--gpu: the devices.yaml name of the GPU (default: "
                                         "from its CUDA name)"),
                  steps: bool = typer.Option(True, "--steps/--no-steps",
                                             help="--gpu: fit the step constants on short "
                                                  "training runs")) -> None:
        """Measure compute, memory and network rates and write a hardware profile (YAML);
        with --gpu, a GPU's kernel efficiencies as a GPU profile.

        On a testbed, compute is measured inside its first worker host, under the host's CPU
        quota, while every other host runs a CPU loop (what runs see), and the network between
        its hosts: point-to-point, all-reduce at every group size, the wait a collective costs
        after compute under the quota, and a synchronous PS's held pulls.
        """
        from dnnscale.errors import InputError
        from dnnscale.plan.flags import refuse_flags

        from dnnscale.atomic import check_output_path

        if sum((local, testbed is not None, gpu)) != 1:
            raise InputError("calibrate", "give exactly one of --local, --testbed FILE or --gpu")
        mode = "gpu" if gpu else "local" if local else "testbed"
        refuse_flags(MODE_FLAGS, {mode}, WORDS, f"not with --{mode}")
        refuse_flags(NETWORK_FLAGS, set() if no_network else {"network"}, WORDS)
        check_output_path(output, "--output")
        if gpu:
            from dnnscale.calibrate.gpu_commands import run_gpu_calibration

            run_gpu_calibration(output, quick, device, as_device, steps)
            return
        grid_kinds = _kinds(kinds)
        peers = _peers(allreduce_peers) if allreduce_peers is not None else None
        cap = _max_message(max_message) if max_message is not None else None
        run_calibration(output, quick, not no_network, grid_kinds, peers,
                        str(testbed) if testbed is not None else None,
                        under_quota=testbed is not None and not free_core,
                        max_message_bytes=cap)


def _max_message(text: str) -> int:
    from dnnscale.errors import InputError
    from dnnscale.units import parse_quantity

    value = parse_quantity(text, "bytes", "--max-message")
    if not 4096 <= value <= 2**30:
        raise InputError("--max-message", f"must be between 4KiB and 1GiB, got {text!r}")
    return int(value)


def _kinds(text: Optional[str]) -> Optional[tuple[str, ...]]:
    from dnnscale.calibrate.compute import GRID
    from dnnscale.errors import InputError

    if text is None:
        return None
    kinds = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [kind for kind in kinds if kind not in GRID]
    if unknown or not kinds:
        raise InputError("--kinds", f"unknown group {unknown[0] if unknown else text!r} "
                         f"(known: {', '.join(GRID)})")
    if not {"conv2d", "linear"} <= set(kinds):
        raise InputError("--kinds", "must include conv2d and linear (a profile needs both)")
    return kinds


def _peers(text: str) -> tuple[int, ...]:
    from dnnscale.errors import InputError

    try:
        peers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InputError("--allreduce-peers", f"must be integers like 2,4, got {text!r}") from None
    if any(p < 2 for p in peers):
        raise InputError("--allreduce-peers", f"group sizes must be >= 2, got {text!r}")
    if any(p > MAX_PEERS for p in peers):
        raise InputError("--allreduce-peers", f"group sizes must be <= {MAX_PEERS} (one "
                         f"process each), got {text!r}")
    return peers


def run_calibration(output: Path, quick: bool, network: bool,
                    grid_kinds: Optional[tuple[str, ...]], peers: Optional[tuple[int, ...]],
                    testbed: Optional[str], under_quota: bool = False,
                    max_message_bytes: Optional[int] = None) -> Any:
    """Calibrate with a rich progress bar, write the profile atomically, print a summary."""
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dnnscale.system.profile import save_profile
    from dnnscale.calibrate.run import (TESTBED_MAX_MESSAGE_BYTES, Plan, calibrate,
                                        testbed_network, testbed_placements, testbed_steps)

    desc = None
    if testbed is not None:
        from dnnscale.testbed.describe import load_description

        desc = load_description(testbed)
        if peers is None:
            workers = len(desc.hosts_with_role("worker"))
            peers = tuple(range(2, min(workers, MAX_PEERS) + 1))
    runner = (testbed_network(testbed, max_message_bytes or TESTBED_MAX_MESSAGE_BYTES)
              if testbed is not None else None)
    placements = testbed_placements(testbed) if testbed is not None else None
    plan = Plan.make(quick, network=network, grid_kinds=grid_kinds, allreduce_peers=peers)
    total = plan.steps()
    if desc is not None and network:
        total += testbed_steps(desc, plan) - (1 + len(plan.allreduce_peers))
    console = Console(stderr=True)
    with Progress(TextColumn("[bold]calibrate[/bold] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("starting", total=total)

        def advance(label: str) -> None:
            progress.update(task, advance=1, description=label)

        compute = None
        if under_quota:
            from dnnscale.calibrate.quota import calibrate_compute_under_quota

            compute = calibrate_compute_under_quota(desc, plan.quick, plan.grid_kinds, advance)
        profile = calibrate(plan, advance, runner, compute, placements)
    if desc is not None:
        profile = replace(profile, calibration={**profile.calibration, "testbed": desc.name})
    save_profile(profile, output)
    _summary(console, profile, output)
    return profile


def _summary(console: Any, profile: Any, output: Path) -> None:
    from dnnscale.units import format_seconds, format_si

    peak = max(curve.peak for curve in profile.flops_per_s_per_core.values())
    line = (f"wrote {output}: peak {format_si(peak, 'FLOP/s')} per core, memory "
            f"{format_si(profile.memory_bandwidth_bytes_per_s, 'B/s')}, update "
            f"{format_seconds(profile.update_s_per_param)}/param")
    if profile.network is not None:
        line += (f", network {format_si(profile.network.bandwidth_bytes_per_s, 'B/s')} + "
                 f"{format_seconds(profile.network.latency_s)}")
    if profile.overlap is not None and profile.stragglers is not None:
        line += (f", overlap γ {profile.overlap.gamma:.3g}, replica spread "
                 f"{profile.stragglers.spread:.3g}")
    console.print(line)
