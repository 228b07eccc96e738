"""The import contract: lower layers never import higher ones (design README, "Layering").

From ../shared/design/README.md: `units, errors` < `workload`, `system` < `plan` < `model` <
`optimize` < `report`, `export`, `validate` < `cli`; `runtime`, `testbed` and `calibrate` sit
beside `optimize` and none of them imports `cli`; `plan` may read `workload` and `system`
types but no pricing (no `model`, which the ranks already forbid). Modules of one rank may
import each other.

The top-level modules the README does not name, placed by what they import and who imports
them:
- atomic, safe_yaml, yamlio, jsonout, boundary: rank of `units, errors` — they import only
  errors (yamlio also safe_yaml) and serve workload, system, plan and up;
- the package itself (dnnscale/__init__.py, the Python API): rank of `report, export,
  validate` — it imports model, optimize, plan, system and workload, and report/page.py reads
  its __version__;
- cli_errors: rank of `cli` — only cli.py uses it.

Every import counts: module level, inside functions and under TYPE_CHECKING, in the forms
`import dnnscale.x`, `from dnnscale.x import y`, `from dnnscale import x` and relative ones.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "src" / "dnnscale"

RANKS: tuple[tuple[str, ...], ...] = (
    ("units", "errors", "atomic", "safe_yaml", "yamlio", "jsonout", "boundary"),
    ("workload", "system"),
    ("plan",),
    ("model",),
    ("optimize", "runtime", "testbed", "calibrate"),
    ("report", "export", "validate", ""),
    ("cli", "cli_errors", "entry", "__main__"),
)
"""Lowest first; "" is the package itself (its __init__.py)."""

RANK_OF = {part: rank for rank, parts in enumerate(RANKS) for part in parts}

COMMAND_TABLES = frozenset({"dnnscale.optimize.tables", "dnnscale.optimize.modern_tables"})
"""Modules that only a package's command modules import (the optimize command's printed
tables): they rank with the commands."""
KNOWN: dict[tuple[str, str], str] = {
    ("dnnscale.calibrate.gpu_grid", "dnnscale.validate.metrics"):
        "the GPU grid's error summary uses validate's metrics (open)",
}
"""Violations known at issue 24, each with why; remove one once fixed (its strict xfail below
turns red then)."""


def module_name(path: Path, root: Path, package: str) -> str:
    """The dotted name of the module at `path` under package directory `root`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def imported_modules(path: Path, root: Path, package: str) -> set[str]:
    """Every module of `package` that the module at `path` imports, anywhere in the file."""
    module = module_name(path, root, package)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names
                      if alias.name == package or alias.name.startswith(package + ".")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target != package and not target.startswith(package + "."):
                continue
            for alias in node.names:
                sub = root.joinpath(*target.split(".")[1:], alias.name)
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.add(f"{target}.{alias.name}" if is_module else target)
    found.discard(module)
    return found


def part_of(module: str) -> str:
    """The top-level part a module belongs to: its subpackage or top-level module, or "" for
    the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rank_of(module: str) -> int:
    """A module's rank: its part's, except that a package's command modules (`commands`,
    `*_commands`: the CLI's subcommands, registered by cli.py) and the tables only they print
    (COMMAND_TABLES) rank with `cli`; nothing below may import them."""
    last = module.rsplit(".", 1)[-1]
    if last == "commands" or last.endswith("_commands") or module in COMMAND_TABLES:
        return RANK_OF["cli"]
    return RANK_OF[part_of(module)]


def violations(root: Path, package: str) -> list[tuple[str, str]]:
    """(module, imported module) for every import of a higher rank, sorted."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root, package)
        rank = rank_of(module)
        for imported in sorted(imported_modules(path, root, package)):
            if rank_of(imported) > rank:
                found.append((module, imported))
    return found


@functools.cache
def _found() -> tuple[tuple[str, str], ...]:
    return tuple(violations(SOURCE, "dnnscale"))


def _report(found: list[tuple[str, str]]) -> str:
    return "lower layers import higher ones:\n" + "\n".join(
        f"  {module} (rank {RANK_OF[part_of(module)]}: {part_of(module) or 'dnnscale'}) imports "
        f"{imported} (rank {RANK_OF[part_of(imported)]}: {part_of(imported) or 'dnnscale'})"
        for module, imported in found)


def test_every_part_has_a_rank() -> None:
    parts = {path.stem for path in SOURCE.glob("*.py") if path.name != "__init__.py"} | {
        path.name for path in SOURCE.iterdir() if (path / "__init__.py").is_file()}
    assert parts | {""} == set(RANK_OF), "give each top-level module and subpackage a rank"


def test_lower_layers_never_import_higher_ones() -> None:
    found = [pair for pair in _found() if pair not in KNOWN]
    assert not found, _report(found)


@pytest.mark.parametrize("pair", [pytest.param(pair, marks=pytest.mark.xfail(
    strict=True, reason=reason), id=" -> ".join(pair)) for pair, reason in KNOWN.items()])
def test_each_known_violation_is_still_there(pair: tuple[str, str]) -> None:
    """Strict xfails: a known violation that disappears turns its case red, so KNOWN shrinks."""
    assert pair not in _found()


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_finds_planted_violations(tmp_path: Path) -> None:
    """Each import form, at module level and inside a function, up and down the ranks."""
    root = tmp_path / "pkg"
    _write(root, {
        "__init__.py": "from pkg.plan import rules\n",
        "errors.py": "",
        "cli.py": "import pkg.model.cost\n",
        "plan/__init__.py": "",
        "plan/rules.py": ("from pkg.errors import InputError\n"
                          "from pkg.system import tiers\n"
                          "def f():\n    from pkg.model.cost import price\n"),
        "plan/load.py": "from .rules import f\nfrom .. import cli\n",
        "system/__init__.py": "",
        "system/tiers.py": "import pkg.optimize\n",
        "model/__init__.py": "",
        "model/cost.py": "from pkg import errors\nfrom pkg.plan.rules import f\n",
        "optimize/__init__.py": "from typing import TYPE_CHECKING\n"
                                "if TYPE_CHECKING:\n    from pkg.report import page\n",
        "report/__init__.py": "",
        "report/page.py": "from pkg import __version__\n",
    })
    assert violations(root, "pkg") == [
        ("pkg.optimize", "pkg.report.page"),
        ("pkg.plan.load", "pkg.cli"),
        ("pkg.plan.rules", "pkg.model.cost"),
        ("pkg.system.tiers", "pkg.optimize"),
    ]
    assert imported_modules(root / "plan" / "load.py", root, "pkg") == {"pkg.plan.rules",
                                                                        "pkg.cli"}
    assert imported_modules(root / "report" / "page.py", root, "pkg") == {"pkg"}
    assert ("pkg.optimize (rank 4: optimize) imports pkg.report.page (rank 5: report)"
            in _report(violations(root, "pkg")))
