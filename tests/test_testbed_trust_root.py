"""Issue 11 on a real testbed (as root; skipped otherwise): the CFS period in the cgroup files,
the burst probe, a rank joining its cgroup after its imports, and the new microbenchmarks
(a collective's wait after compute, held pulls). Every test tears its testbed down, also when
it fails, and checks that nothing is left."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dnnscale.testbed.build import up
from dnnscale.testbed.describe import rank_placements
from dnnscale.testbed.inventory import take_inventory
from dnnscale.testbed.spec import make_spec
from dnnscale.testbed.system import support_problem
from dnnscale.testbed.teardown import down

PROBLEM = support_problem()
pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None, reason=f"testbed unavailable: {PROBLEM}")]


@pytest.fixture(scope="module")
def testbed() -> Iterator[str]:
    """Three hosts at 1 gbit, 0.2 core each, a 20 ms period; always torn down."""
    name = "u" + secrets.token_hex(2)
    try:
        up(make_spec(name, 3, "1gbit", cpu=0.2, cpu_period="20ms"))
        yield name
    finally:
        down(name)
        assert take_inventory(name).empty


def test_cgroups_get_the_period_and_no_burst(testbed: str) -> None:
    cgroup = Path(f"/sys/fs/cgroup/cpu/dns-{testbed}-h1")
    assert (cgroup / "cpu.cfs_period_us").read_text().strip() == "20000"
    assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "4000"      # 0.2 x 20 ms
    if (cgroup / "cpu.cfs_burst_us").exists():
        assert (cgroup / "cpu.cfs_burst_us").read_text().strip() == "0"


@pytest.mark.timeout(180)
def test_burst_probe_measures_every_gap_and_stops_its_processes(testbed: str) -> None:
    from dnnscale.testbed.describe import load_description
    from dnnscale.testbed.fidelity import measure_burst

    result = measure_burst(load_description(testbed), gaps_s=(0.0, 0.05), chunk_s=0.01,
                           rounds=2, busy_others=True)
    assert result.busy_others == 2 and set(result.paces) == {0.0, 0.05}
    # a chunk's wall time is at least its CPU time (one thread), so its pace is at least the
    # 0.2-core share: exactly that when the chunk fits in the budget a gap left (a burst),
    # which a loaded machine's shorter chunk can do; 5 % for the two clocks' granularity
    assert all(len(v) == 2 and all(p >= 0.2 * 0.95 for p in v)
               for v in result.paces.values()), result.paces
    assert 0.005 < result.chunk_cpu_s < 0.05
    for host in ("h1", "h2", "h3"):
        procs = Path(f"/sys/fs/cgroup/cpu/dns-{testbed}-{host}/cgroup.procs").read_text()
        assert procs.strip() == ""                      # every probe and CPU loop was stopped


@pytest.mark.timeout(120)
def test_a_late_joining_process_enters_its_cgroup_when_it_says_so(testbed: str) -> None:
    placement = rank_placements(testbed, 1, join_late=True)[0]
    program = ("from dnnscale.runtime.placement import join_cgroup\n"
               "def cpu_line():\n"
               "    return [l for l in open('/proc/self/cgroup').read().splitlines()\n"
               "            if 'cpu' in l.split(':')[1].split(',')][0]\n"
               "before = cpu_line(); join_cgroup(); print(before); print(cpu_line())\n")
    out = subprocess.run([*placement.prefix, sys.executable, "-c", program],
                         env={**os.environ, **placement.env}, capture_output=True, text=True,
                         timeout=100, check=True).stdout.splitlines()
    assert not out[0].endswith(f"dns-{testbed}-h1")     # imports ran outside the quota
    assert out[1].endswith(f"/dns-{testbed}-h1")        # then the process joined


@pytest.mark.timeout(300)
def test_collective_wait_and_held_pulls_microbenchmarks(testbed: str) -> None:
    from dnnscale.calibrate.network import measure_call_wait, measure_ps_sync_pull

    wait = measure_call_wait(rank_placements(testbed, 2, join_late=True), sizes=(4096,),
                             quick=True)
    assert 0.0 <= wait < 0.5
    roles = ["worker", "worker", "ps"]
    fit = measure_ps_sync_pull(rank_placements(testbed, 3, roles=roles, join_late=True), 1,
                               [1024, 262_144, 2**20], quick=True)
    assert (fit.peers, fit.shards) == (2, 1) and len(fit.points) == 3
    assert fit.bandwidth_bytes_per_s > 1e6 and fit.latency_s >= 0
    # two workers pull 1 MiB each from one shard at 1 gbit: at least 2 MiB / 125 MB/s
    assert fit.points[-1][1] >= 2 * 2**20 / 125e6 * 0.9
