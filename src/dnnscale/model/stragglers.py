"""Stragglers in an asynchronous epoch, and what Adam's cut-off buys (performance-model.md §4);
the slowest device a synchronous step waits for (`slowest_device_factor`).

Asynchronous replicas do not wait for each other, so the model's throughput X (all replicas
running) is unchanged by their speed differences, but an epoch is not: every replica works
through its own N/R samples, and the epoch ends when the slowest is done — or, with Project
Adam's cut-off, once a fraction f of all samples is (Chilimbi et al., OSDI 2014, §3.3: an epoch
ends when a set fraction of the images is processed, so that slow machines do not hold it up).

The replicas' speeds come from one measured number, the spread c: the standard deviation of
ln(mean step time) across the replicas of a run or of the calibration's straggler benchmark
(calibrate/stragglers.py, runtime/records.epoch_summary); c = 0, the default, gives factor 1
and the epoch time f·N/X of wave 1.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist


_NORMAL = NormalDist()


@functools.lru_cache(maxsize=4096)
def top_normal_score(members: int) -> float:
    """Blom's normal score of the largest of `members` draws, Φ⁻¹((N − 3/8)/(N + 1/4)): the
    expected maximum of N standard normals (0 for one). The scores `replica_rates` ranks
    replicas by, at i = N."""
    return _NORMAL.inv_cdf((members - 0.375) / (members + 0.25)) if members > 1 else 0.0


def slowest_device_factor(devices: int, spread: float) -> float:
    """How much longer a synchronous step's device work takes than on the median device: every
    collective waits for its slowest member, so N devices of a speed spread σ run at the
    slowest's pace, e^(σ·z_N) with z_N the expected maximum of N standard normals
    (`top_normal_score`); 1 for one device or σ = 0.

    Formula: g = exp(σ · Φ⁻¹((N − 3/8)/(N + 1/4))). Units: devices, ln(speed) s.d. -> factor.
    Source: Sinha et al., "Not All GPUs Are Created Equal", SC'22: identical GPUs differ in
    speed (power management, manufacturing); see system/gpu.GPU_SPEED_SPREAD for σ.
    """
    if spread <= 0 or devices <= 1:
        return 1.0
    return math.exp(spread * top_normal_score(devices))


def replica_rates(replicas: int, spread: float, saturation: float = math.inf) -> list[float]:
    """Each replica's samples/s relative to the mean worker-bound rate x̄ (X_workers / R),
    fastest first: ρ_i = e^(−c·z_i) / mean_j e^(−c·z_j) with Blom's normal scores
    z_i = Φ⁻¹((i − 3/8)/(R + 1/4)); when the parameter servers' capacity C = u·R·x̄ binds
    (u = `saturation` < 1) each replica gets at most the fair share φ, Σ_i min(ρ_i, φ) = u·R."""
    scores = [_NORMAL.inv_cdf((i - 0.375) / (replicas + 0.25)) for i in range(1, replicas + 1)]
    raw = [math.exp(-spread * z) for z in scores]
    mean = sum(raw) / replicas
    rates = [r / mean for r in raw]
    capacity = saturation * replicas
    if capacity >= sum(rates):
        return rates
    # Water-filling from the slowest: the slow ones keep their own rate while it is below the
    # share left for the rest.
    left, remaining = capacity, replicas
    for rate in reversed(rates):
        share = left / remaining
        if rate > share:
            return [min(r, share) for r in rates]
        left -= rate
        remaining -= 1
    return rates


def straggler_factor(replicas: int, epoch_fraction: float, spread: float,
                     saturation: float = math.inf) -> float:
    """How much longer an asynchronous epoch takes than f·N/X because replicas differ in speed.

    Formula: with replica rates x_i (replica_rates: lognormal spread c by Blom's normal scores,
    capped by the fair share of the PS capacity when u = C/(R·x̄) < 1) and each replica owning
    N/R samples, the epoch ends at the t with Σ_i min(x_i·t, N/R) = f·N; the factor is
    g = t·X / (f·N), X = Σ_i x_i. g = 1 for R = 1 or c = 0; g ≥ 1 always; f = 1 gives
    X / (R · x_slowest); f < 1 lets the fast replicas' finished shares cover the slow ones'.
    Units: replicas, fraction, spread (of ln seconds), saturation (dimensionless) -> factor.
    Source: Chilimbi et al., OSDI 2014, §3.3 (the epoch cut-off against slow machines); Blom,
    "Statistical Estimates and Transformed Beta-Variables" (1958) for the normal scores; the
    spread measured by calibrate/stragglers.py.
    """
    if replicas <= 1 or spread <= 0:
        return 1.0
    rates = replica_rates(replicas, spread, saturation)  # fastest first, share N/R = 1 each
    target = epoch_fraction * replicas
    total = sum(rates)
    done, running = 0.0, total
    t = 0.0
    for rate in rates:  # the fastest replica finishes its share first, at t = 1/rate
        finish = 1.0 / rate
        if done + running * finish >= target:
            t = (target - done) / running
            break
        done += 1.0
        running -= rate
        t = finish
    return max(1.0, t * total / target)
