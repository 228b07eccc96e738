"""The result of `predict`: throughput, step and epoch time, breakdown, bottleneck, memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dnnscale.config.config import Config
from dnnscale.model.replica import LayerCost


@dataclass(frozen=True)
class Prediction:
    """Predicted performance of one configuration.

    step_time_s: time between two steps of one replica (for asynchronous PS this includes any
    wait the PS bottleneck imposes: R·n / X). breakdown_s: seconds per step and worker in each
    activity. utilization: busy fraction of each resource (1.0 = the bottleneck).
    """

    config: Config
    throughput_samples_per_s: float
    step_time_s: float
    epoch_time_s: float
    bottleneck: str
    breakdown_s: dict[str, float]
    utilization: dict[str, float]
    memory_bytes: dict[str, float]
    fits: bool
    capacities_samples_per_s: dict[str, float] = field(default_factory=dict)
    layers: tuple[LayerCost, ...] = ()

    def to_dict(self, with_layers: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "config": self.config.to_dict(),
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "step_time_s": self.step_time_s,
            "epoch_time_s": self.epoch_time_s,
            "bottleneck": self.bottleneck,
            "breakdown_s": dict(self.breakdown_s),
            "utilization": dict(self.utilization),
            "capacities_samples_per_s": {k: (None if v == float("inf") else v)
                                         for k, v in self.capacities_samples_per_s.items()},
            "memory_bytes": dict(self.memory_bytes),
            "fits": self.fits,
        }
        if with_layers:
            data["layers"] = [
                {"name": c.name, "kind": c.kind, "scheme": c.scheme, "work_fraction": c.work_fraction,
                 "forward_s": c.forward_s, "input_grad_s": c.input_grad_s,
                 "weight_grad_s": c.weight_grad_s, "comm_bytes": c.comm_bytes, "comm_s": c.comm_s}
                for c in self.layers]
        return data
