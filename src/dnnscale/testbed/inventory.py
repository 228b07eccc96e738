"""What testbed objects exist right now, found by their names (not from the description file).

This is what `down` removes and `status` shows, so a testbed whose `up` was killed half-way, or
whose description file is gone, is still found and cleaned up completely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from dnnscale.testbed.names import CGROUP_CPU_ROOT, is_ours, owner_of
from dnnscale.testbed.system import run


@dataclass
class Inventory:
    """The objects of one testbed (or of all testbeds) that exist now."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    """Root-namespace interfaces: the bridge and the bridge-side veth ends."""
    qdiscs: list[str] = field(default_factory=list)
    """'DEV: kind' for each non-default root qdisc on our root-namespace links."""
    cgroups: list[str] = field(default_factory=list)
    bridge_subnets: dict[str, str] = field(default_factory=dict)
    """Bridge name -> the subnet recorded in its alias."""

    @property
    def empty(self) -> bool:
        return not (self.namespaces or self.links or self.qdiscs or self.cgroups)

    def objects(self) -> list[str]:
        return ([f"netns {n}" for n in self.namespaces] + [f"link {n}" for n in self.links]
                + [f"qdisc {q}" for q in self.qdiscs] + [f"cgroup {c}" for c in self.cgroups])

    def names(self) -> list[str]:
        """Testbed names that have any object."""
        found = {owner_of(n) for n in self.namespaces + self.links}
        found |= {owner_of(c.rsplit("/", 1)[-1]) for c in self.cgroups}
        return sorted(n for n in found if n)


BRIDGE_ALIAS_TAG = "dnnscale-testbed"


def list_namespaces(name: str | None = None) -> list[str]:
    """Our network namespaces (of testbed `name`, or of all testbeds)."""
    out = run(["ip", "-j", "netns", "list"], check=False).strip()
    entries = json.loads(out) if out else []
    return sorted(e["name"] for e in entries if is_ours(e.get("name", ""), name))


def _root_links() -> list[dict[str, object]]:
    out = run(["ip", "-j", "link", "show"]).strip()
    return json.loads(out) if out else []


def list_links(name: str | None = None) -> tuple[list[str], dict[str, str]]:
    """Our root-namespace links, and bridge -> subnet from the bridges' aliases."""
    links, subnets = [], {}
    for link in _root_links():
        ifname = str(link.get("ifname", ""))
        if not is_ours(ifname, name):
            continue
        links.append(ifname)
        alias = str(link.get("ifalias", ""))
        if alias.startswith(BRIDGE_ALIAS_TAG + " "):
            subnets[ifname] = alias.split()[-1]
    return sorted(links), subnets


def list_qdiscs(links: list[str]) -> list[str]:
    """Non-default qdiscs (tbf, netem) on the given root-namespace links."""
    out = run(["tc", "-j", "qdisc", "show"], check=False).strip()
    entries = json.loads(out) if out else []
    return sorted(f"{e['dev']}: {e['kind']}" for e in entries
                  if e.get("dev") in links and e.get("kind") in ("tbf", "netem"))


def list_cgroups(name: str | None = None) -> list[str]:
    """Our cgroup v1 cpu groups (paths)."""
    if not CGROUP_CPU_ROOT.is_dir():
        return []
    return sorted(str(p) for p in CGROUP_CPU_ROOT.iterdir() if p.is_dir() and is_ours(p.name, name))


def take_inventory(name: str | None = None) -> Inventory:
    """Everything of testbed `name` (or of every testbed) that exists now."""
    links, subnets = list_links(name)
    return Inventory(namespaces=list_namespaces(name), links=links, qdiscs=list_qdiscs(links),
                     cgroups=list_cgroups(name), bridge_subnets=subnets)


def used_subnets() -> set[str]:
    """Subnets held by existing testbed bridges."""
    return set(list_links()[1].values())
