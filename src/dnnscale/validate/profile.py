"""Give a testbed-derived cluster the compute rates of a calibrated hardware profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dnnscale.system import System


def apply_profile(cluster: System, profile_path: Path) -> System:
    """`cluster` with every machine's compute curves, memory rates and update cost from the
    profile (per core, scaled by each machine's cores); the network stays the cluster's (the
    testbed's measured links)."""
    from dnnscale.system.load import profile_machine
    from dnnscale.system.profile import load_profile

    profile = load_profile(profile_path)

    def calibrated(machine):  # type: ignore[no-untyped-def]
        return profile_machine(profile, cores=machine.cores, memory_bytes=machine.memory_bytes)

    return dataclasses.replace(
        cluster, machine=calibrated(cluster.machine),
        ps_machine=calibrated(cluster.ps_machine) if cluster.ps_machine else None,
        calibrated=True, profile_source=str(profile_path))
