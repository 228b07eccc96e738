"""Accuracy figures for predicted vs measured throughput (performance-model.md §8)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """|predicted − measured| / measured for each pair."""
    if len(predicted) != len(measured):
        raise ValueError("predicted and measured differ in length")
    return [abs(p - m) / m for p, m in zip(predicted, measured)]


def error_summary(errors: Sequence[float]) -> dict[str, float]:
    """Median, 90th percentile (linear interpolation) and maximum of relative errors."""
    if not errors:
        return {"median_relative_error": math.nan, "p90_relative_error": math.nan,
                "max_relative_error": math.nan}
    values = np.asarray(errors, dtype=float)
    return {"median_relative_error": float(np.median(values)),
            "p90_relative_error": float(np.percentile(values, 90)),
            "max_relative_error": float(values.max())}


def kendall_tau(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Kendall's τ-b between predicted and measured throughput (1 = same ranking)."""
    from scipy.stats import kendalltau

    if len(predicted) < 2:
        return math.nan
    return float(kendalltau(predicted, measured).statistic)


def regret(chosen_measured_time_s: float, best_measured_time_s: float) -> float:
    """How much slower the optimizer's choice really trains than the best configuration run:
    T_chosen / T_best − 1 (0 = it picked the fastest)."""
    return chosen_measured_time_s / best_measured_time_s - 1.0
