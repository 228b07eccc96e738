"""`dnnscale calibrate --gpu`: the command's body (calibrate/commands.py registers the flags).

Cheap to import: torch loads once the device has been checked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


def run_gpu_calibration(output: Path, quick: bool, device_text: str, as_device: Optional[str],
                        steps: bool) -> Any:
    """Check the device, calibrate with a progress bar, write the profile atomically, print a
    summary line. Without CUDA: InputError('--gpu', ...) before anything is measured."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from dnnscale.calibrate.gpu import (GpuCalibrationPlan, calibrate_gpu, calibration_steps,
                                        known_devices)
    from dnnscale.errors import InputError, short_repr
    from dnnscale.runtime.cuda import cuda_device
    from dnnscale.system.gpu_profile import save_gpu_profile

    known = known_devices()  # the flags first: a bad --as is wrong on any machine
    if as_device is not None and as_device not in known:
        raise InputError("--as", f"unknown device {short_repr(as_device)} (known: "
                         f"{', '.join(known)})")
    device = cuda_device(device_text)
    import torch

    from dnnscale.calibrate.gpu_device import CudaDevice, device_preset_for
    name = torch.cuda.get_device_name(device)
    preset = as_device or device_preset_for(
        name, float(torch.cuda.get_device_properties(device).total_memory), known)
    plan = GpuCalibrationPlan.make("quick" if quick else "full")
    console = Console(stderr=True)
    console.print(f"calibrating {name} ({device}) as {preset}, {plan.mode} plan")
    with Progress(TextColumn("[bold]calibrate --gpu[/bold] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("starting", total=calibration_steps(plan, steps))

        def advance(label: str) -> None:
            progress.update(task, advance=1, description=escape(label[:60]))

        profile = calibrate_gpu(CudaDevice(device), plan, preset, advance,
                                train_device=device if steps else None,
                                log=lambda message: console.print(message, markup=False))
    save_gpu_profile(profile, output)
    summary(console, profile, output)
    return profile


def summary(console: Any, profile: Any, output: Path) -> None:
    """One line: the curves' ceilings, the copy bandwidth, the launch time."""
    from dnnscale.units import format_seconds, format_si

    peaks = ", ".join(f"{name} η ≤ {curve.peak:.2f}" for name, curve in
                      profile.efficiency.items())
    copy = profile.extra.get("hbm_copy_bandwidth_bytes_per_s")
    console.print(f"wrote {output}: {profile.device}, {peaks}, memory η ≤ "
                  f"{profile.memory_efficiency.peak:.2f}"
                  + (f", copy {format_si(copy, 'B/s')}" if copy else "")
                  + f", {format_seconds(profile.launch_s)} host time per kernel")
