"""Cost formulas: every one documents formula, units and source; the composition calls them
directly (COST_FORMULAS, a registry nothing looked up, is gone); collectives are the one lookup,
keyed by (operation, library, algorithm), and refuse an undocumented entry."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import dnnscale.model
from dnnscale.model.collectives import COLLECTIVE_COSTS, Transfer, collective_cost
from dnnscale.model.compute import imbalance_fraction, phase_time_s
from dnnscale.model.network import overlapped_time_s

MODEL = Path(dnnscale.model.__file__).parent
NAMED = {"phase_time_s", "imbalance_fraction", "transfer_time_s", "overlapped_time_s",
         "ring_allgather", "ring_reduce_scatter", "ring_allreduce", "tree_allreduce",
         "gloo_reduce_scatter", "halo_exchange", "ps_network_capacity_samples_per_s",
         "ps_cpu_capacity_samples_per_s", "ps_queueing_cycle_s", "worker_memory_parts",
         "ps_memory_parts", "kernel_time_s", "transformer_block_activation_bytes",
         "sharded_state_parts", "quota_stall_s", "measured_time_s"}


def _formulas() -> dict[str, str]:
    """Every function in dnnscale/model whose docstring states a Formula: name -> docstring."""
    found = {}
    for path in sorted(MODEL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                doc = ast.get_docstring(node) or ""
                if "Formula:" in doc:
                    found[node.name] = doc
    return found


def test_every_formula_is_documented() -> None:
    formulas = _formulas()
    assert NAMED <= set(formulas)
    for name, doc in formulas.items():
        assert "Units:" in doc and "Source:" in doc, name
    for cost in COLLECTIVE_COSTS.values():
        assert cost.__name__ in formulas


def test_cost_formulas_registry_is_gone() -> None:
    assert not hasattr(dnnscale.model, "COST_FORMULAS")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dnnscale.model.registry")


def test_collective_registry_refuses_undocumented_cost() -> None:
    with pytest.raises(TypeError, match="lacks Formula, Units, Source"):
        @collective_cost("mystery", "nccl")
        def mystery(payload_bytes: float, members: int) -> Transfer:
            return Transfer(payload_bytes, 1.0)
    assert ("mystery", "nccl", "ring") not in COLLECTIVE_COSTS


def test_simple_formulas_by_hand() -> None:
    assert imbalance_fraction(10, 4) == 0.3                    # ceil(10/4)/10
    assert phase_time_s(2e9, 1e9, 1e9, 1e10) == 2.0           # compute bound
    assert phase_time_s(1e6, 1e10, 1e9, 1e10) == 1.0          # memory bound
    assert overlapped_time_s(3.0, 4.0, 1.0) == 7.0
    assert overlapped_time_s(3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert overlapped_time_s(3.0, 4.0, float("inf")) == 4.0
