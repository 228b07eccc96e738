"""How every object of a testbed is named, so that nothing else on the machine is ever touched.

A testbed called NAME owns exactly these objects, all carrying the prefix ``dns-NAME-``:

- network namespaces ``dns-NAME-h1`` … ``dns-NAME-hN`` (workers), ``dns-NAME-ps1`` … (PS hosts);
- in the root namespace, the bridge ``dns-NAME-br`` and one veth end per host, named like the
  host's namespace (the other end is ``eth0`` inside the namespace);
- cgroup v1 cpu groups ``/sys/fs/cgroup/cpu/dns-NAME-h1`` …

NAME is 1–6 lower-case letters or digits, starting with a letter, so every interface name fits
Linux's 15-character limit and one testbed's prefix is never the start of another's.
Ownership is decided by the exact pattern (`is_ours`), not by a loose prefix match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from dnnscale.errors import InputError

PREFIX = "dns-"
MAX_HOSTS_PER_ROLE = 99
CGROUP_CPU_ROOT = Path("/sys/fs/cgroup/cpu")
DEFAULT_NAME = "tb"

_NAME = re.compile(r"^[a-z][a-z0-9]{0,5}$")
_OBJECT = re.compile(r"^dns-([a-z][a-z0-9]{0,5})-(br|h[1-9][0-9]?|ps[1-9][0-9]?)$")


def check_name(name: str, field: str = "testbed.name") -> str:
    """Return `name` if it is a valid testbed name, else raise InputError naming `field`."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise InputError(field, f"must be 1-6 lower-case letters or digits starting with a letter "
                         f"(it becomes part of interface names), got {name!r}")
    return name


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


def is_ours(object_name: str, name: str | None = None) -> bool:
    """True if `object_name` is a testbed object (of testbed `name`, when given)."""
    match = _OBJECT.match(object_name)
    return bool(match) and (name is None or match.group(1) == name)


def owner_of(object_name: str) -> str | None:
    """The testbed name an object belongs to, or None if it is not a testbed object."""
    match = _OBJECT.match(object_name)
    return match.group(1) if match else None


@dataclass(frozen=True)
class TestbedNames:
    """Names of one testbed's objects."""

    __test__ = False  # not a pytest test class despite the name

    name: str

    @property
    def prefix(self) -> str:
        return f"{PREFIX}{self.name}-"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def host(self, role: str, index: int) -> str:
        """Short host name: h1, h2, … for workers, ps1, ps2, … for parameter-server hosts."""
        if not 1 <= index <= MAX_HOSTS_PER_ROLE:
            raise InputError("testbed.hosts", f"at most {MAX_HOSTS_PER_ROLE} hosts per role")
        return f"{'ps' if role == 'ps' else 'h'}{index}"

    def namespace(self, host: str) -> str:
        return f"{self.prefix}{host}"

    def veth(self, host: str) -> str:
        """The bridge-side end of the host's veth pair (root namespace)."""
        return f"{self.prefix}{host}"

    def cgroup(self, host: str) -> Path:
        return CGROUP_CPU_ROOT / f"{self.prefix}{host}"
