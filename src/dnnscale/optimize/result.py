"""What `optimize` returns: the plan, the ranking, the scalability curve, and why the plan wins."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dnnscale.plan.config import Config
from dnnscale.model.prediction import Prediction
from dnnscale.model.records import Bottleneck
from dnnscale.optimize.feasibility import Infeasible
from dnnscale.plan.engines import ENGINES, engine_differences, plan_facts, runnable_engines
from dnnscale.plan.modern import modern_plan_to_dict
from dnnscale.units import format_seconds

SATURATED = 0.99
"""A resource busy at least this fraction of the time counts as saturated."""
IDLE = 0.5
"""A resource busy at most this fraction of the time counts as mostly idle."""


def cost_per_step(prediction: Prediction, price_per_device_hour: float | None) -> float | None:
    """USD per step of a GPU plan: step_time_s × GPUs × price / 3600 s (None without a price)."""
    if price_per_device_hour is None:
        return None
    return prediction.step_time_s * prediction.plan.workers * price_per_device_hour / 3600


class SpaceKind(str, Enum):
    """Which sub-space of the one search a result comes from: Adam's CPU configurations
    (sync mode, P, R, S, n, intervals) or Megatron-style GPU plans (TP, PP, DP, micro-batch,
    schedule, ZeRO, recompute, sequence parallel) for a transformer on accelerators."""

    ADAM = "adam"
    GPU = "gpu"


@dataclass(frozen=True)
class CurvePoint:
    """The best plan under a budget of `machines` (GPUs in the GPU space); speedup over the
    curve's first point (in epoch time for Adam's space, in step time for GPU plans, the same
    ratio at a fixed global batch)."""

    machines: int
    epoch_time_s: float
    speedup: float
    prediction: Prediction
    space: SpaceKind = SpaceKind.ADAM

    @property
    def gpus(self) -> int:
        """The budget in GPUs (the GPU space's name for `machines`)."""
        return self.machines

    @property
    def step_time_s(self) -> float:
        return self.prediction.step_time_s

    def to_dict(self) -> dict[str, Any]:
        if self.space is SpaceKind.GPU:
            return {"gpus": self.machines, "machines": self.machines,
                    "step_time_s": self.step_time_s, "speedup": self.speedup,
                    "gpus_used": self.prediction.plan.workers,
                    "plan_fields": modern_plan_to_dict(self.prediction.plan)}
        cfg = self.prediction.config
        return {"machines": self.machines, "epoch_time_s": self.epoch_time_s,
                "speedup": self.speedup, "machines_used": cfg.machines, "config": cfg.to_dict()}


@dataclass(frozen=True)
class OptimizeResult:
    """The optimizer's answer for `workload` on `cluster` within a budget of `machines`
    (GPUs in the GPU space), for either sub-space of the one search.

    top: the best plans, best first; best == top[0] (Adam's space: the best configuration of
    each of the K best groups; GPU space: the K best plans). curve: one point per budget (Adam:
    every budget from the smallest feasible one; GPU: powers of two and the budget). families:
    the best plan of each family beside the winner (Adam: each sync mode, JSON key
    "best_per_mode"; GPU: each of modern.FAMILIES, JSON key "families"). evaluated: plans
    whose step was computed; bounds_evaluated: interval (Adam) or group (GPU) bounds.
    search_time_s: wall time of the whole search, curve included.
    """

    workload: str
    cluster: str
    machines: int
    method: str
    best: Prediction
    top: list[Prediction]
    curve: list[CurvePoint]
    families: dict[str, Prediction]
    evaluated: int
    bounds_evaluated: int
    search_time_s: float
    explanation: list[str] = field(default_factory=list)
    space: SpaceKind = SpaceKind.ADAM
    infeasible: list[Infeasible] = field(default_factory=list)
    """Adam's space: the groups left out and why."""
    best_per_protocol: dict[str, Prediction] = field(default_factory=dict)
    """When the search chose Adam's FC protocol: the best PS configuration of each."""
    global_batch: int | None = None
    """GPU space: samples (sequences) per step, fixed across the search."""
    objective: str = "time"
    """GPU space: 'time' or 'cost' (the step's device-hours at price_per_device_hour)."""
    pareto: list[Prediction] = field(default_factory=list)
    """GPU space, when asked: the plans no other beats on both step time and GPUs (or cost)."""
    warnings: list[str] = field(default_factory=list)
    price_per_device_hour: float | None = None
    """GPU space: the system's price (USD per device-hour), for the cost per step."""
    engine: str | None = None
    """GPU space: the engine the search kept to (plan/engines.py), None for any."""

    def engines(self) -> dict[str, str | None]:
        """GPU space: per engine, why it cannot run the best plan ('plan.FIELD: why'), or None
        where it can (plan/engines.py)."""
        return {name: None if v is None else f"plan.{v.field}: {v.message}"
                for name, v in runnable_engines(self.best.plan).items()}

    def engine_notes(self) -> dict[str, list[str]]:
        """GPU space: per engine that runs the best plan otherwise than it was priced, how."""
        facts = plan_facts(self.best.plan)
        refused = self.engines()
        out = {name: [d.message for d in engine_differences(name, facts)] for name in ENGINES
               if refused[name] is None}
        return {name: notes for name, notes in out.items() if notes}

    @property
    def gpus(self) -> int:
        """The budget in GPUs (the GPU space's name for `machines`)."""
        return self.machines

    def cost_per_step(self, prediction: Prediction) -> float | None:
        """USD per step of a GPU plan at this result's price (None without one)."""
        return cost_per_step(prediction, self.price_per_device_hour)

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `dnnscale optimize --json`: each space keeps its own keys."""
        return self._gpu_dict() if self.space is SpaceKind.GPU else self._adam_dict()

    def _adam_dict(self) -> dict[str, Any]:
        def entry(p: Prediction) -> dict[str, Any]:
            return {"config": p.config.to_dict(), "prediction": p.to_dict()}

        return {"workload": self.workload, "cluster": self.cluster, "machines": self.machines,
                "method": self.method, "best": entry(self.best),
                "explanation": list(self.explanation),
                "top": [entry(p) for p in self.top],
                "best_per_mode": {mode: entry(p) for mode, p in self.families.items()},
                **({"best_per_fc_protocol": {name: entry(p) for name, p in
                                             self.best_per_protocol.items()}}
                   if self.best_per_protocol else {}),
                "curve": [point.to_dict() for point in self.curve],
                "infeasible": [item.to_dict() for item in self.infeasible],
                "evaluated": self.evaluated, "bounds_evaluated": self.bounds_evaluated,
                "search_time_s": self.search_time_s}

    def _gpu_dict(self) -> dict[str, Any]:
        def entry(p: Prediction) -> dict[str, Any]:
            return {"plan_fields": modern_plan_to_dict(p.plan), "label": p.label(),
                    "gpus": p.plan.workers, "cost_per_step": self.cost_per_step(p),
                    "prediction": p.to_dict()}

        engines = self.engines()
        return {"workload": self.workload, "cluster": self.cluster, "gpus": self.machines,
                "machines": self.machines, "global_batch": self.global_batch,
                "objective": self.objective, "method": self.method, "best": entry(self.best),
                "top": [entry(p) for p in self.top], "explanation": list(self.explanation),
                "warnings": list(self.warnings),
                "families": {name: entry(p) for name, p in self.families.items()},
                "pareto": [entry(p) for p in self.pareto],
                "engine": self.engine,
                "engines": [name for name, why in engines.items() if why is None],
                "engines_refused": {name: why for name, why in engines.items()
                                    if why is not None},
                "engine_notes": self.engine_notes(),
                "curve": [point.to_dict() for point in self.curve],
                "evaluated": self.evaluated, "bounds_evaluated": self.bounds_evaluated,
                "search_time_s": self.search_time_s}


def rank_key(prediction: Prediction) -> tuple[float, int, str]:
    return prediction.epoch_time_s, prediction.config.machines, prediction.config.label()


def describe_config(config: Config) -> str:
    """'ps-async P=2 R=8 S=4 n=32' (intervals only when not 1)."""
    parts = [config.sync, f"P={config.partitions}", f"R={config.replicas}"]
    if config.uses_ps:
        parts.append(f"S={config.ps_shards}")
    parts.append(f"n={config.minibatch}")
    if config.uses_ps and (config.push_every, config.pull_every) != (1, 1):
        parts.append(f"k_push={config.push_every} k_pull={config.pull_every}")
    if config.fc_protocol != "weights":
        parts.append(f"fc={config.fc_protocol}")
    if config.overlap:
        parts.append("overlap")
    return " ".join(parts)


def _named(utilization: dict[str, float], keep: Any) -> str:
    items = [(name, value) for name, value in utilization.items() if keep(value)]
    items.sort(key=lambda item: -item[1])
    return ", ".join(f"{name.replace('_', ' ')} {100 * value:.0f} %" for name, value in items)


def explain(best: Prediction, top: list[Prediction], per_mode: dict[str, Prediction],
            machines: int) -> list[str]:
    """Why the best configuration wins: what saturates, what idles, what it beats."""
    cfg = best.config
    lines = [f"bottleneck: {best.bottleneck}"]
    saturated = _named(best.utilization, lambda v: v >= SATURATED)
    if saturated:
        lines.append(f"saturated: {saturated}")
    busy = _named(best.utilization, lambda v: IDLE < v < SATURATED)
    if busy:
        lines.append(f"partly busy: {busy}")
    idle = _named(best.utilization, lambda v: v <= IDLE)
    if idle:
        lines.append(f"mostly idle: {idle}")
    unused = machines - cfg.machines
    if unused > 0:
        lines.append(f"uses {cfg.machines} of {machines} machines: the other {unused} would not "
                     f"make it faster (the fewest replicas that reach this time are chosen)")
    if len(top) > 1:
        runner = top[1]
        lines.append(f"next best: {describe_config(runner.config)} at "
                     f"{format_seconds(runner.epoch_time_s)} per epoch "
                     f"({runner.epoch_time_s / best.epoch_time_s:.3g}x slower)")
    for mode, prediction in per_mode.items():
        if mode != cfg.sync:
            lines.append(f"best {mode}: {describe_config(prediction.config)} at "
                         f"{format_seconds(prediction.epoch_time_s)} per epoch "
                         f"({prediction.epoch_time_s / best.epoch_time_s:.3g}x slower; "
                         f"bottleneck {prediction.bottleneck})")
    return lines


def explain_protocols(best_per_protocol: dict[str, Prediction]) -> list[str]:
    """When Adam's vector protocol wins over weight pushes, or loses, and why: the vectors
    shrink the PS traffic of FC layers (a PS-network-bound plan gains) but move their weight
    gradients onto the PS CPU (a plan that becomes PS-CPU bound loses)."""
    if not {"weights", "vectors"} <= set(best_per_protocol):
        return []
    weights, vectors = best_per_protocol["weights"], best_per_protocol["vectors"]
    winner, loser = ("vectors", "weights") if rank_key(vectors) < rank_key(weights) \
        else ("weights", "vectors")
    ratio = best_per_protocol[loser].epoch_time_s / best_per_protocol[winner].epoch_time_s
    why = (f"the weight protocol's best is bound by {weights.bottleneck}; with vectors the FC "
           f"updates cross the PS network as n·(n_in + n_out) values and the PS CPU forms them "
           f"(ps cpu {100 * vectors.utilization.get('ps_cpu', 0.0):.2g}% busy)"
           if winner == "vectors" else
           f"the vector protocol's best is bound by {vectors.bottleneck}"
           + ("; the FC outer products load the PS CPU" if vectors.bottleneck == Bottleneck.PS_CPU else
              "; its FC vectors are not smaller than the FC weights at this minibatch"
              if vectors.bottleneck == Bottleneck.PS_NETWORK else ""))
    return [f"fc protocol: {winner} beats {loser} ({ratio:.3g}x faster per epoch): {why}"]
