"""The committed validation grids for Adam's mechanisms (issue 18): they load, the runtime can
run every configuration, at least 12 have a mechanism on, and the pair meant to show the vector
protocol winning is predicted to (on the committed 100 Mbit/s testbed profile)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dnnscale.model import predict_config
from dnnscale.plan import check_config
from dnnscale.runtime.netplan import check_runnable
from dnnscale.system import load_system
from dnnscale.validate.grid import load_grid
from dnnscale.workload import load_workload

ROOT = Path(__file__).parent.parent
GRIDS = [ROOT / "benchmarks" / "validation" / f"grid-adam-mechanisms-{name}.yaml"
         for name in ("cifar10", "imagenet22k-small")]
CLUSTER = str(ROOT / "tests" / "snapshots" / "clusters" / "calibrated-100mbit.yaml")


def _mechanism(config) -> bool:  # type: ignore[no-untyped-def]
    return config.fc_protocol == "vectors" or config.overlap or config.epoch_fraction < 1


def test_grids_have_the_mechanisms_and_run() -> None:
    cluster = load_system(CLUSTER)
    on = 0
    for path in GRIDS:
        grid = load_grid(path)
        workload = load_workload(str(ROOT / grid.workload) if grid.workload.endswith(".yaml")
                                 else grid.workload)
        for config in grid.configs:
            assert config.machines <= 6
            check_config(config, workload, cluster)
            check_runnable(workload, config)
        mechanisms = [c for c in grid.configs if _mechanism(c)]
        assert {c.fc_protocol for c in mechanisms} >= {"vectors"}
        assert any(c.overlap for c in mechanisms) and any(c.epoch_fraction < 1 for c in mechanisms)
        on += len(mechanisms)
    assert on >= 12


@pytest.mark.parametrize("path, at_least", [(GRIDS[0], 1.5), (GRIDS[1], 2.0)])
def test_vector_pair_is_predicted_to_win(path: Path, at_least: float) -> None:
    grid = load_grid(path)
    weights, vectors = grid.configs[0], grid.configs[1]
    assert dataclasses.replace(weights, fc_protocol="vectors") == vectors
    workload = load_workload(str(ROOT / grid.workload) if grid.workload.endswith(".yaml")
                             else grid.workload)
    cluster = load_system(CLUSTER)
    slow, fast = (predict_config(workload, cluster, c) for c in (weights, vectors))
    assert slow.bottleneck == "ps network"
    assert fast.throughput_samples_per_s > at_least * slow.throughput_samples_per_s
    assert fast.utilization["ps_cpu"] < 0.5
