"""Two baseline predictors fitted on the calibration runs, for comparison with dnnscale.

- Paleo-style (Qi et al., ICLR 2017): step time = FLOPs / (peak · η_comp) + bytes / (B · η_comm)
  with one compute-efficiency and one communication-efficiency scalar for all layers and
  transfers. No parameter-server bottleneck, no size-dependent efficiency.
- Optimus (Peng et al., EuroSys 2018): fitted speed functions of the number of parameter servers
  p and workers w, with non-negative coefficients θ (NNLS):
      async:  f(p, w) = w · (θ0 + θ1·m/w + θ2·w/p + θ3·w + θ4·p)^−1
      sync:   f(p, w) = (θ0·m/w + θ1 + θ2·w/p + θ3·w + θ4·p)^−1
  with m the global batch per step; w counts replicas (Optimus has no model partitioning), and
  all-reduce runs take the sync form without the p terms.

Both are fitted on the calibration set only, never on validated configurations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls


@dataclass(frozen=True)
class RunFeatures:
    """What a baseline may know about one configuration (per worker and step)."""

    sync: str
    replicas: int
    ps_shards: int
    minibatch: int
    flops_per_worker: float
    bytes_per_worker: float

    @property
    def samples_per_step(self) -> int:
        return self.replicas * self.minibatch


@dataclass(frozen=True)
class PaleoBaseline:
    """T_step = a·FLOPs + c·bytes, a = 1/(peak·η_comp), c = 1/(B·η_comm)."""

    seconds_per_flop: float
    seconds_per_byte: float

    @classmethod
    def fit(cls, runs: Sequence[RunFeatures], measured_throughput: Sequence[float]) -> "PaleoBaseline":
        design = np.array([[r.flops_per_worker, r.bytes_per_worker] for r in runs])
        step_s = np.array([r.samples_per_step / x for r, x in zip(runs, measured_throughput)])
        scale = design.max(axis=0)
        scale[scale == 0] = 1.0
        coefficients, _ = nnls(design / scale, step_s)
        coefficients = coefficients / scale
        return cls(float(coefficients[0]), float(coefficients[1]))

    def throughput(self, run: RunFeatures) -> float:
        step_s = self.seconds_per_flop * run.flops_per_worker + self.seconds_per_byte * run.bytes_per_worker
        return run.samples_per_step / step_s if step_s > 0 else float("inf")


def _optimus_terms(run: RunFeatures) -> list[float]:
    """Terms of a worker's step time τ: [1, n, w/p, w, p] (p terms 0 without a PS)."""
    w, p, n = run.replicas, run.ps_shards, run.minibatch
    return [1.0, float(n), w / p if p > 0 else 0.0, float(w), float(p)]


def _family(sync: str) -> str:
    return "async" if sync == "ps-async" else "sync"


@dataclass(frozen=True)
class OptimusBaseline:
    """Optimus's speed functions, written with the per-replica batch n:
    τ = θ0 + θ1·n + θ2·w/p + θ3·w + θ4·p is one worker's step time, and throughput is w·n/τ
    (for async this is f(p, w) = w/τ steps/s times n; for sync f = 1/τ steps/s times w·n).
    One θ per family (async, sync/all-reduce) when the calibration set has 3 runs of it, else a
    shared θ."""

    theta: dict[str, tuple[float, ...]]

    @classmethod
    def fit(cls, runs: Sequence[RunFeatures], measured_throughput: Sequence[float]) -> "OptimusBaseline":
        def solve(indices: list[int]) -> tuple[float, ...]:
            design = np.array([_optimus_terms(runs[i]) for i in indices])
            step_s = np.array([runs[i].samples_per_step / measured_throughput[i] for i in indices])
            scale = np.abs(design).max(axis=0)
            scale[scale == 0] = 1.0
            theta, _ = nnls(design / scale, step_s)
            return tuple(float(t) for t in theta / scale)

        everything = list(range(len(runs)))
        shared = solve(everything)
        theta = {}
        for family in ("async", "sync"):
            members = [i for i in everything if _family(runs[i].sync) == family]
            theta[family] = solve(members) if len(members) >= 3 else shared
        return cls(theta)

    def throughput(self, run: RunFeatures) -> float:
        step_s = float(np.dot(self.theta[_family(run.sync)], _optimus_terms(run)))
        return run.samples_per_step / step_s if step_s > 0 else float("inf")
