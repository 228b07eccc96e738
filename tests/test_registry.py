"""The cost-formula registry: every formula documents formula, units and source."""

from __future__ import annotations

import pytest

import dnnscale.model  # noqa: F401  (registers the formulas)
from dnnscale.model.registry import COST_FORMULAS, cost_formula


def test_every_formula_is_documented() -> None:
    assert {"phase_time_s", "imbalance_fraction", "transfer_time_s", "overlapped_time_s",
            "ring_allgather", "ring_reduce_scatter", "ring_allreduce", "gloo_reduce_scatter",
            "halo_exchange", "ps_network_capacity_samples_per_s", "ps_cpu_capacity_samples_per_s",
            "worker_memory_parts", "ps_memory_parts"} <= set(COST_FORMULAS)
    for name, formula in COST_FORMULAS.items():
        doc = formula.__doc__ or ""
        assert "Formula:" in doc and "Units:" in doc and "Source:" in doc, name


def test_registry_refuses_undocumented_formula() -> None:
    with pytest.raises(TypeError, match="lacks Formula, Units, Source"):
        @cost_formula
        def mystery(x: float) -> float:
            return x


def test_simple_formulas_by_hand() -> None:
    f = COST_FORMULAS
    assert f["imbalance_fraction"](10, 4) == 0.3                    # ceil(10/4)/10
    assert f["phase_time_s"](2e9, 1e9, 1e9, 1e10) == 2.0           # compute bound
    assert f["phase_time_s"](1e6, 1e10, 1e9, 1e10) == 1.0          # memory bound
    assert f["overlapped_time_s"](3.0, 4.0, 1.0) == 7.0
    assert f["overlapped_time_s"](3.0, 4.0, 2.0) == pytest.approx(5.0)
    assert f["overlapped_time_s"](3.0, 4.0, float("inf")) == 4.0
