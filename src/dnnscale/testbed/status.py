"""`testbed status`: which testbeds exist, and whether each is complete.

A testbed is *complete* when its description file exists and every namespace, link, qdisc and
cgroup it names is present; *incomplete* otherwise (e.g. after a killed `up`: run `down`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dnnscale.errors import InputError
from dnnscale.testbed.describe import TestbedDescription, load_description, state_dir
from dnnscale.testbed.inventory import Inventory, take_inventory
from dnnscale.testbed.names import check_name, valid_name


@dataclass(frozen=True)
class TestbedState:
    """One testbed as found on the machine."""

    __test__ = False

    name: str
    description: TestbedDescription | None
    inventory: Inventory
    problem: str = ""

    @property
    def state(self) -> str:
        return "incomplete" if self.problem else "complete"

    def to_dict(self) -> dict[str, Any]:
        inv = self.inventory
        return {"name": self.name, "state": self.state, "problem": self.problem,
                "description": self.description.to_dict() if self.description else None,
                "description_file": self.description.source if self.description else None,
                "objects": {"namespaces": inv.namespaces, "links": inv.links,
                            "qdiscs": inv.qdiscs, "cgroups": inv.cgroups}}


def _missing(desc: TestbedDescription, inv: Inventory) -> list[str]:
    missing = [f"netns {h.namespace}" for h in desc.hosts if h.namespace not in inv.namespaces]
    missing += [f"link {h.veth}" for h in desc.hosts if h.veth not in inv.links]
    missing += [f"qdisc {h.veth}: tbf" for h in desc.hosts if f"{h.veth}: tbf" not in inv.qdiscs]
    missing += [f"cgroup {h.cgroup}" for h in desc.hosts if h.cgroup not in inv.cgroups]
    if desc.bridge not in inv.links:
        missing.append(f"link {desc.bridge}")
    return missing


def testbed_state(name: str) -> TestbedState:
    inv = take_inventory(name)
    path = state_dir() / f"{name}.yaml"
    if not path.exists():
        return TestbedState(name, None, inv, f"no description file {path}; run `dnnscale testbed "
                            f"down --name {name}`")
    try:
        desc = load_description(path)
    except InputError as exc:
        return TestbedState(name, None, inv, f"unreadable description {path}: {exc}")
    missing = _missing(desc, inv)
    problem = (f"missing {', '.join(missing[:4])}{', …' if len(missing) > 4 else ''}; run "
               f"`dnnscale testbed down --name {name}` and `up` again") if missing else ""
    return TestbedState(name, desc, inv, problem)


def testbed_states(name: str | None = None) -> list[TestbedState]:
    """The state of testbed `name`, or of every testbed found (objects or description files)."""
    if name is not None:
        check_name(name, "--name")
        state = testbed_state(name)
        return [state] if state.description is not None or not state.inventory.empty else []
    names = set(take_inventory().names())
    folder = state_dir()
    if folder.is_dir():
        names |= {p.stem for p in folder.glob("*.yaml") if valid_name(p.stem)}
    return [testbed_state(n) for n in sorted(names)]
