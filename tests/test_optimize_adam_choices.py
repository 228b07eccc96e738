"""The optimizer choosing Adam's FC protocol and overlap: the exact search still equals the
exhaustive one, and the answer says when the vector protocol wins and why."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dnnscale.optimize import optimize
from dnnscale.optimize.space import make_space
from dnnscale.plan import Config
from dnnscale.system import RateCurve, load_system

CLUSTERS = Path(__file__).parent / "snapshots" / "clusters"
CALIBRATED = str(CLUSTERS / "calibrated-100mbit.yaml")
PS_HOSTS = str(CLUSTERS / "ps-hosts.yaml")


def test_space_doubles_the_ps_groups_only() -> None:
    plain = make_space(modes="ps-async,allreduce")
    both = make_space(modes="ps-async,allreduce", fc_protocols="weights,vectors",
                      choose_overlap=True)
    assert len(plain.groups(2)) == 4 and len(both.groups(2)) == 2 * 4 + 2
    assert {(g.fc_protocol, g.overlap) for g in both.groups(2) if g.uses_ps} == {
        ("weights", False), ("weights", True), ("vectors", False), ("vectors", True)}
    assert {(g.fc_protocol, g.overlap) for g in both.groups(2) if not g.uses_ps} == {(None, None)}
    config = [g for g in both.groups(1) if g.uses_ps][-1].config(both.base, 2, 1)
    assert (config.fc_protocol, config.overlap) == ("vectors", True)
    assert make_space(fc_protocols="vectors").base.fc_protocol == "vectors"  # one value fixes it


@pytest.mark.parametrize("cluster", [CALIBRATED, PS_HOSTS])
@pytest.mark.parametrize("workload", ["adam-cifar10", "mlp:784-1024-1024-10"])
def test_choosing_protocol_and_overlap_is_exact(workload: str, cluster: str) -> None:
    kwargs = dict(machines=7, modes="ps-async,ps-sync,allreduce", minibatch=[8, 32],
                  fc_protocols="weights,vectors", choose_overlap=True, curve=False)
    fast = optimize(workload, cluster, **kwargs)
    slow = optimize(workload, cluster, method="exhaustive", **kwargs)
    assert fast.best.epoch_time_s == pytest.approx(slow.best.epoch_time_s, rel=1e-9)
    assert [p.epoch_time_s for p in fast.top] == pytest.approx(
        [p.epoch_time_s for p in slow.top], rel=1e-9)
    assert set(fast.best_per_protocol) == set(slow.best_per_protocol) == {"weights", "vectors"}
    for name in ("weights", "vectors"):
        assert fast.best_per_protocol[name].epoch_time_s == pytest.approx(
            slow.best_per_protocol[name].epoch_time_s, rel=1e-9)
        assert fast.best_per_protocol[name].config.fc_protocol == name


def test_vectors_win_when_the_ps_network_binds() -> None:
    """adam-cifar10 at n = 8 on 100 Mbit/s: FC1 (1152 x 512, 590k of the 0.78 M weights)
    pushes 8·(1152 + 512) = 13k values instead of 590k, so the PS-network-bound plan speeds up."""
    result = optimize("adam-cifar10", CALIBRATED, machines=6, modes="ps-async", minibatch=8,
                      fc_protocols="weights,vectors", curve=False)
    weights, vectors = result.best_per_protocol["weights"], result.best_per_protocol["vectors"]
    assert weights.bottleneck in ("ps network", "worker ps transfer")
    assert vectors.epoch_time_s < weights.epoch_time_s
    assert result.best.config.fc_protocol == "vectors"
    (line,) = [x for x in result.explanation if x.startswith("fc protocol:")]
    assert line.startswith("fc protocol: vectors beats weights")
    assert f"bound by {weights.bottleneck}" in line


def test_weights_win_when_the_ps_cpu_would_bind() -> None:
    """A PS machine at 1 MFLOP/s cannot form the outer products: the weights protocol wins."""
    system = load_system(CALIBRATED)
    slow_ps = dataclasses.replace(system.machine, flops_per_s_per_core={
        "default": RateCurve.constant(1e6)}, bytes_per_s_per_core={})
    system = dataclasses.replace(system, ps_machine=slow_ps)
    result = optimize("adam-cifar10", system, machines=6, modes="ps-async", minibatch=8,
                      fc_protocols="weights,vectors", curve=False)
    assert result.best.config.fc_protocol == "weights"
    assert result.best_per_protocol["vectors"].bottleneck == "ps cpu"
    (line,) = [x for x in result.explanation if x.startswith("fc protocol:")]
    assert line.startswith("fc protocol: weights beats vectors")
    assert "the FC outer products load the PS CPU" in line


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dnnscale.cli", "optimize", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_choices() -> None:
    result = _cli("-w", "adam-cifar10", "-c", CALIBRATED, "-M", "5", "--modes", "ps-async",
                  "-n", "8", "--fc-protocol", "weights,vectors", "--choose-overlap", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data["best_per_fc_protocol"]) == {"weights", "vectors"}
    assert any(line.startswith("fc protocol:") for line in data["explanation"])
    bad = _cli("-w", "adam-cifar10", "-c", CALIBRATED, "--choose-overlap", "--overlap")
    assert bad.returncode == 2 and "--choose-overlap" in bad.stderr
    bad = _cli("-w", "adam-cifar10", "-c", CALIBRATED, "--fc-protocol", "weights,rows")
    assert bad.returncode == 2 and "--fc-protocol" in bad.stderr
    assert Config().label() == "P=1 R=1 S=1 ps-async n=32"
    assert Config(fc_protocol="vectors", overlap=True).label() == \
        "P=1 R=1 S=1 ps-async n=32 fc=vectors overlap"
