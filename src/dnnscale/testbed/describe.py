"""The testbed description file: what `up` built, what `check` measured, and what runs read.

`dnnscale testbed up` writes it to ``/run/dnnscale/testbeds/NAME.yaml`` (the directory can be
changed with the environment variable DNNSCALE_TESTBED_DIR; ``up -o FILE`` also writes a copy),
`check` adds what it measured, and `run --testbed`, `calibrate` and `validate` read it through
the three functions here:

- `load_description(path_or_name)` -> `TestbedDescription`;
- `rank_placements(path_or_name, count, roles)` -> one `RankPlacement` per rank, whose command
  prefix puts the rank into its host's CPU cgroup and network namespace;
- `cluster_from_description(desc)` -> a `System` for the predictor.

Format (SI units, the unit in every key)::

    testbed: tb
    subnet: 198.18.0.0/24
    bridge: dns-tb-br
    created: '2026-11-30T05:00:00+00:00'
    measured_at: '2026-11-30T05:01:00+00:00'     # after `check`
    hosts:
    - name: h1
      role: worker                                # worker | ps
      namespace: dns-tb-h1
      address: 198.18.0.1
      ifname: eth0
      veth: dns-tb-h1                             # bridge-side end, root namespace
      cgroup: /sys/fs/cgroup/cpu/dns-tb-h1
      rate_bytes_per_s: 12500000.0                # asked, each direction
      latency_s: 0.0001                           # asked, added one-way (netem on egress)
      cpu_cores: 0.3                              # asked CPU quota
      cpu_period_s: 0.01                          # CFS period of the quota (0.1 if absent)
      measured:                                   # after `check`
        egress_bytes_per_s: 11950000.0            # TCP payload rate
        ingress_bytes_per_s: 11960000.0
        latency_s: 0.00016                        # one-way, half the median TCP round trip
        cpu_share: 0.29                           # CPU seconds per second, all hosts busy
        matmul_flops_per_s: 2.4e10                # one-thread fp32 matmul, all hosts busy
        peer: h2
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from dnnscale.errors import InputError
from dnnscale.runtime.placement import CGROUP_FD_ENV, RankPlacement
from dnnscale.testbed.names import check_name, is_ours
from dnnscale.testbed.spec import ROLES, TESTBED_BLOCK

if TYPE_CHECKING:
    from dnnscale.system import System

STATE_DIR_ENV = "DNNSCALE_TESTBED_DIR"
LEGACY_CFS_PERIOD_S = 0.1
"""The period of testbeds described before the period was recorded (the kernel's default)."""
CGROUP_FD = 9
"""Late join: the prefix opens the host's cgroup.procs on this descriptor (see enter_prefix)."""
DEFAULT_STATE_DIR = Path("/run/dnnscale/testbeds")
_MEASURED_KEYS = ("egress_bytes_per_s", "ingress_bytes_per_s", "latency_s", "cpu_share",
                  "matmul_flops_per_s")


@dataclass(frozen=True)
class HostMeasurement:
    """What `check` measured on one host; None where it could not be measured."""

    egress_bytes_per_s: float | None = None
    ingress_bytes_per_s: float | None = None
    latency_s: float | None = None
    cpu_share: float | None = None
    matmul_flops_per_s: float | None = None
    peer: str | None = None

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """The slower direction, or None if neither was measured."""
        values = [v for v in (self.egress_bytes_per_s, self.ingress_bytes_per_s) if v is not None]
        return min(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {key: getattr(self, key) for key in _MEASURED_KEYS}
        data["peer"] = self.peer
        return data


@dataclass(frozen=True)
class HostDescription:
    """One emulated machine: where it is and what it was asked to be."""

    name: str
    role: str
    namespace: str
    address: str
    ifname: str
    veth: str
    cgroup: str
    rate_bytes_per_s: float
    latency_s: float
    cpu_cores: float
    measured: HostMeasurement | None = None
    cpu_period_s: float = LEGACY_CFS_PERIOD_S

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name, "role": self.role, "namespace": self.namespace,
            "address": self.address, "ifname": self.ifname, "veth": self.veth,
            "cgroup": self.cgroup, "rate_bytes_per_s": self.rate_bytes_per_s,
            "latency_s": self.latency_s, "cpu_cores": self.cpu_cores,
            "cpu_period_s": self.cpu_period_s}
        if self.measured is not None:
            data["measured"] = self.measured.to_dict()
        return data


@dataclass(frozen=True)
class TestbedDescription:
    """A built testbed."""

    __test__ = False

    name: str
    subnet: str
    bridge: str
    created: str
    hosts: tuple[HostDescription, ...]
    measured_at: str | None = None
    source: str = field(default="", compare=False)

    def hosts_with_role(self, role: str) -> list[HostDescription]:
        return [host for host in self.hosts if host.role == role]

    def host(self, name: str) -> HostDescription:
        for host in self.hosts:
            if host.name == name:
                return host
        raise InputError("host", f"testbed {self.name!r} has no host {name!r}")

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"testbed": self.name, "subnet": self.subnet,
                                "bridge": self.bridge, "created": self.created}
        if self.measured_at:
            data["measured_at"] = self.measured_at
        data["hosts"] = [host.to_dict() for host in self.hosts]
        return data


# --- where the file lives -----------------------------------------------------------------------

def state_dir() -> Path:
    """Directory of the description files (DNNSCALE_TESTBED_DIR or /run/dnnscale/testbeds)."""
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


def description_path(name: str) -> Path:
    return state_dir() / f"{check_name(name, '--name')}.yaml"


def _is_file(path: Path) -> bool:
    """path.is_file(), False where the name itself is impossible (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def resolve_description(ref: "str | Path") -> Path:
    """A description file path, or a testbed name ('tb', looked up in the state directory) ->
    the file's path, which must exist. An existing file wins over a name."""
    from dnnscale.testbed.names import valid_name

    text = str(ref)
    path = Path(text)
    if not _is_file(path) and valid_name(text):
        path = description_path(text)
    if not _is_file(path):
        hint = f" (run `dnnscale testbed up --name {text}`)" if valid_name(text) else ""
        raise InputError("testbed", f"no testbed description at {path}{hint}")
    return path


# --- reading and writing ------------------------------------------------------------------------

def save_description(desc: TestbedDescription, path: Path, field: str = "testbed") -> None:
    """Write `desc` to `path` atomically (a reader never sees half a file); a failure raises
    InputError naming `field`."""
    import yaml

    from dnnscale.atomic import atomic_write_text

    text = ("# dnnscale testbed description, written by `dnnscale testbed up`/`check`.\n"
            "# SI units; the unit is in every key. Read by run --testbed, calibrate, validate.\n"
            + yaml.safe_dump(desc.to_dict(), sort_keys=False))
    atomic_write_text(path, text, field)


def save_copy(desc: TestbedDescription, path: Path, field: str) -> None:
    """Write a copy where the user asked (`field` names the flag if that fails)."""
    save_description(desc, path, field)


def load_description(ref: "str | Path") -> TestbedDescription:
    """Read a testbed description (a file path or a testbed name); errors name the field."""
    from dnnscale.yamlio import load_yaml_file

    path = resolve_description(ref)
    return description_from_dict(load_yaml_file(path, "testbed"), str(path))


def description_from_dict(data: dict[str, Any], source: str = "") -> TestbedDescription:
    """Validate a description mapping (as written by `save_description`)."""
    name = check_name(_field(data, "testbed", str, "testbed"), "testbed.testbed")
    subnet = _field(data, "subnet", str, "testbed")
    try:
        network = ipaddress.ip_network(subnet)
    except ValueError:
        raise InputError("testbed.subnet", f"not a subnet: {subnet!r}") from None
    if not network.subnet_of(TESTBED_BLOCK):  # type: ignore[arg-type]
        raise InputError("testbed.subnet", f"must lie inside {TESTBED_BLOCK}, got {subnet}")
    hosts_data = data.get("hosts")
    if not isinstance(hosts_data, list) or not hosts_data:
        raise InputError("testbed.hosts", "missing or empty (a list of hosts)")
    hosts = tuple(_host_from_dict(item, f"testbed.hosts[{i}]", name, network)
                  for i, item in enumerate(hosts_data))
    if len({h.name for h in hosts}) != len(hosts):
        raise InputError("testbed.hosts", "host names must be distinct")
    measured_at = data.get("measured_at")
    return TestbedDescription(name=name, subnet=subnet,
                              bridge=_field(data, "bridge", str, "testbed"),
                              created=str(data.get("created", "")), hosts=hosts,
                              measured_at=str(measured_at) if measured_at else None,
                              source=source)


def _field(data: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise InputError(f"{where}.{key}", "missing")
    value = data[key]
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise InputError(f"{where}.{key}", f"must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, kind):
        raise InputError(f"{where}.{key}", f"must be a {kind.__name__}, got {value!r}")
    return value


def _host_from_dict(data: Any, where: str, testbed: str,
                    network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> HostDescription:
    role = _field(data, "role", str, where)
    if role not in ROLES:
        raise InputError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    namespace = _field(data, "namespace", str, where)
    if not is_ours(namespace, testbed):
        raise InputError(f"{where}.namespace", f"{namespace!r} is not a namespace of testbed "
                         f"{testbed!r}")
    cgroup = _field(data, "cgroup", str, where)
    if not is_ours(Path(cgroup).name, testbed):
        raise InputError(f"{where}.cgroup", f"{cgroup!r} is not a cgroup of testbed {testbed!r}")
    address = _field(data, "address", str, where)
    try:
        if ipaddress.ip_address(address) not in network:
            raise ValueError
    except ValueError:
        raise InputError(f"{where}.address",
                         f"must be an address in {network}, got {address!r}") from None
    values = {key: _field(data, key, float, where)
              for key in ("rate_bytes_per_s", "latency_s", "cpu_cores")}
    for key, value in values.items():
        if value < 0 or (key != "latency_s" and value == 0):
            raise InputError(f"{where}.{key}", f"must be > 0, got {value!r}")
    if isinstance(data, dict) and data.get("cpu_period_s") is not None:
        period = _field(data, "cpu_period_s", float, where)
        if not 0.001 <= period <= 1.0:
            raise InputError(f"{where}.cpu_period_s", f"must be between 0.001 and 1, got {period!r}")
        values["cpu_period_s"] = period
    return HostDescription(name=_field(data, "name", str, where), role=role, namespace=namespace,
                           address=address, ifname=_field(data, "ifname", str, where),
                           veth=_field(data, "veth", str, where), cgroup=cgroup,
                           measured=_measured_from_dict(data.get("measured"), f"{where}.measured"),
                           **values)


def _measured_from_dict(data: Any, where: str) -> HostMeasurement | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise InputError(where, f"must be a mapping, got {data!r}")
    values: dict[str, Any] = {}
    for key in _MEASURED_KEYS:
        value = data.get(key)
        if value is not None:
            value = _field(data, key, float, where)
            if value <= 0:
                raise InputError(f"{where}.{key}", f"must be > 0, got {value!r}")
        values[key] = value
    peer = data.get("peer")
    return HostMeasurement(peer=str(peer) if peer is not None else None, **values)


# --- what runs read -----------------------------------------------------------------------------

def enter_prefix(host: HostDescription, join_late: bool = False) -> tuple[str, ...]:
    """Command prefix that runs a command in `host`'s CPU cgroup and network namespace.

    With `join_late`, the shell only opens the cgroup's ``cgroup.procs`` on descriptor
    CGROUP_FD (``exec 9>>CGROUP/cgroup.procs``), which the command inherits; the command runs
    at full speed until it writes its pid there (runtime/placement.join_cgroup, after importing
    torch: ~1.6 s of CPU, ~7 s under a 0.25-core quota). The environment's DNNSCALE_CGROUP_FD
    (placement env) says so.

    ``sh -c 'echo $$ > CGROUP/cgroup.procs && exec ip netns exec NS "$@"' dnnscale-rank CMD…``:
    the shell moves itself into the cgroup, then becomes `ip netns exec`, which enters the
    namespace and becomes CMD, so CMD keeps the shell's pid (killing the launched process kills
    the rank) and inherits the cgroup. The cgroup is joined first because `ip netns exec`
    remounts /sys, which hides /sys/fs/cgroup from the command.
    """
    sh = shutil.which("sh") or "/bin/sh"
    ip = shutil.which("ip") or "ip"
    procs = shlex.quote(f"{host.cgroup}/cgroup.procs")
    namespace = shlex.quote(host.namespace)
    enter = f'exec {CGROUP_FD}>>{procs}' if join_late else f'echo $$ > {procs}'
    script = f'{enter} && exec {shlex.quote(ip)} netns exec {namespace} "$@"'
    return (sh, "-c", script, "dnnscale-rank")


def host_env(host: HostDescription) -> dict[str, str]:
    """Environment for a process on `host`: gloo on its eth0, one compute thread."""
    return {"GLOO_SOCKET_IFNAME": host.ifname, "TP_SOCKET_IFNAME": host.ifname,
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "DNNSCALE_TESTBED_HOST": host.name}


def placement_for(host: HostDescription, join_late: bool = False) -> RankPlacement:
    env = host_env(host)
    if join_late:
        env[CGROUP_FD_ENV] = str(CGROUP_FD)
    return RankPlacement(address=host.address, ifname=host.ifname,
                         prefix=enter_prefix(host, join_late), host=host.name, env=env)


def rank_placements(ref: "str | Path | TestbedDescription", count: int,
                    roles: Sequence[str] | None = None,
                    join_late: bool = False) -> list[RankPlacement]:
    """Where each of `count` ranks runs on the testbed.

    `join_late`: the rank joins its host's cgroup itself once it has imported what it needs
    (runtime/placement.join_cgroup); until then it runs unthrottled. Every torch process of
    dnnscale (ranks, network benchmarks, calibration under a quota) does; other commands get
    the immediate join.

    `roles[i]` is 'worker' or 'ps' (default: all workers). The k-th rank of a role goes to the
    (k mod H)-th host of that role, H the number of such hosts, so ranks spread over hosts before
    any host gets a second one (hosts then share their CPU quota and link). A testbed without PS
    hosts places parameter servers on the worker hosts that follow the workers' (rank W + k on
    host (W + k) mod H for W worker ranks).
    """
    desc = ref if isinstance(ref, TestbedDescription) else load_description(ref)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError("ranks", f"must be an integer >= 1, got {count!r}")
    wanted = list(roles) if roles is not None else ["worker"] * count
    if len(wanted) != count:
        raise InputError("roles", f"needs one role per rank ({count}), got {len(wanted)}")
    for rank, role in enumerate(wanted):
        if role not in ROLES:
            raise InputError(f"roles[{rank}]", f"must be one of {', '.join(ROLES)}, got {role!r}")
    workers = desc.hosts_with_role("worker")
    # Without dedicated PS hosts, parameter servers take the worker hosts after the workers'
    # (every host is a machine of the cluster; R·P + S <= hosts puts each rank on its own).
    pools = {"worker": workers, "ps": desc.hosts_with_role("ps") or workers}
    seen = {"worker": 0, "ps": 0 if desc.hosts_with_role("ps") else wanted.count("worker")}
    placements = []
    for rank, role in enumerate(wanted):
        hosts = pools[role]
        if not hosts:
            raise InputError("testbed", f"rank {rank} needs a {role} host but testbed "
                             f"{desc.name!r} has none")
        placements.append(placement_for(hosts[seen[role] % len(hosts)], join_late))
        seen[role] += 1
    return placements


def free_port(placement: RankPlacement, timeout_s: float = 30.0) -> int:
    """A TCP port that is free on `placement`'s address, found by binding port 0 there.

    Runs a tiny Python inside the placement's prefix (the host's namespace), so it also works
    for a plain local placement (empty prefix). Another process may still take the port before
    the caller binds it; rendezvous retries are the caller's business.
    """
    import subprocess
    import sys

    code = ("import socket; s = socket.socket(); s.bind((%r, 0)); print(s.getsockname()[1])"
            % placement.address)
    result = subprocess.run([*placement.prefix, sys.executable, "-c", code], capture_output=True,
                            text=True, timeout=timeout_s, check=False)
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        from dnnscale.testbed.system import TestbedError

        raise TestbedError(f"cannot find a free port on {placement.host} ({placement.address}): "
                           f"{result.stderr.strip()[-200:]}")
    return int(result.stdout.strip())


def cluster_from_description(ref: "str | Path | TestbedDescription") -> "System":
    """A `System` for the predictor that describes the testbed.

    - machines: all hosts (workers + PS); ps_machines: the dedicated PS hosts, so that workers
      go only to worker hosts and shards only to PS hosts, as `rank_placements` puts them (the
      validity rules and the optimizer's budget read it); without PS hosts shards take hosts
      from the same pool (R·P + S <= hosts);
    - network / ps_network: each role's link rate and one-way latency, measured by `check`
      when it ran (TCP payload rate, the slower direction, mean over the role's hosts) and as
      asked otherwise;
    - ps_pull_convoy: True, because the testbed runs dnnscale's runtime, whose synchronous
      shards answer held pulls one worker after another;
    - compute: until `dnnscale calibrate` measures the testbed, the `local` preset's per-core
      rate curves, memory and update cost, with `cores` = the host's CPU share (measured by
      `check` if it ran, else the asked quota). `calibrated` stays False.
    """
    from dnnscale.system import System, LinkTier, load_system

    desc = ref if isinstance(ref, TestbedDescription) else load_description(ref)
    base = load_system("local").machine
    workers, ps_hosts = desc.hosts_with_role("worker"), desc.hosts_with_role("ps")
    if not workers:
        raise InputError("testbed.hosts", "has no worker host")

    def machine(hosts: list[HostDescription]) -> Any:
        return replace(base, cores=_role_value(hosts, "cpu_cores", "cpu_share"))

    def network(hosts: list[HostDescription]) -> LinkTier:
        return LinkTier(
            bandwidth_bytes_per_s=_role_value(hosts, "rate_bytes_per_s", "bandwidth_bytes_per_s"),
            latency_s=_role_value(hosts, "latency_s", "latency_s"))

    measured = any(h.measured is not None for h in desc.hosts)
    return System(
        name=f"testbed-{desc.name}", machines=len(desc.hosts), machine=machine(workers),
        network=network(workers), ps_machine=machine(ps_hosts) if ps_hosts else None,
        ps_network=network(ps_hosts) if ps_hosts else None, ps_machines=len(ps_hosts),
        ps_pull_convoy=True, calibrated=False,
        cpu_period_s=fmean(h.cpu_period_s for h in workers) if workers else None,
        description=(f"emulated testbed {desc.name!r}: {len(workers)} workers, {len(ps_hosts)} "
                     f"PS hosts; network {'measured' if measured else 'as asked'}; compute = "
                     "local preset x CPU share (uncalibrated)"),
        profile_source=desc.source or f"testbed:{desc.name}")


def _role_value(hosts: list[HostDescription], asked_key: str, measured_key: str) -> float:
    """Mean over `hosts` of the measured value where every host has one, else of the asked."""
    measured = [getattr(h.measured, measured_key) if h.measured else None for h in hosts]
    if all(value is not None for value in measured):
        return fmean(measured)  # type: ignore[arg-type]
    return fmean(getattr(h, asked_key) for h in hosts)
