"""The result of `predict`: typed step parts and memory parts, throughput, bottleneck, fit.

`StepPart` and `MemoryPart` carry stable names (the JSON keys of `breakdown_s` and
`memory_bytes`); each part says what it is, so a table, the HTML timeline and `--explain` read
the same records. Step parts are named by `records.Part` and the bottleneck by
`records.Bottleneck` (string enums: the JSON keeps wave 1's strings). Names of wave 1 are kept;
new plans add parts, never rename them. `Prediction.step_record` holds the composition's
per-stage times (model/records.py), which the report draws without pricing anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dnnscale.model.error_band import ErrorBand
from dnnscale.model.records import Bottleneck, Part, PartKind, StepRecord
from dnnscale.model.stage import LayerCost
from dnnscale.plan.config import Config
from dnnscale.plan.mesh import MESH_ORDER
from dnnscale.plan.plan import ParallelPlan

PART_KINDS = tuple(PartKind)


@dataclass(frozen=True)
class StepPart:
    """Seconds per step of one worker in one activity. kind: 'compute' (a phase of the layers),
    'sum' (the total of the parts listed in `of`), 'communication', 'wait' (idle for another
    resource), 'update' (applying the optimizer) or 'total' (the step)."""

    name: Part
    seconds: float
    kind: PartKind
    of: tuple[Part, ...] = ()


@dataclass(frozen=True)
class MemoryPart:
    """Bytes one device of `role` ('worker' or 'ps') needs for `name`."""

    name: str
    bytes: float
    role: str = "worker"


@dataclass(frozen=True)
class Prediction:
    """Predicted performance of one plan.

    step_time_s: time between two steps of one replica (for asynchronous PS this includes any
    wait the PS bottleneck imposes: R·n / X). parts: seconds per step and worker in each
    activity. utilization: busy fraction of each resource (1.0 = the bottleneck). config: the
    Adam flags the plan came from (None for plans built otherwise).
    """

    plan: ParallelPlan
    throughput_samples_per_s: float
    step_time_s: float
    epoch_time_s: float
    bottleneck: Bottleneck | str
    parts: tuple[StepPart, ...]
    utilization: dict[str, float]
    memory: tuple[MemoryPart, ...]
    memory_capacity_bytes: dict[str, float]
    capacities_samples_per_s: dict[str, float] = field(default_factory=dict)
    layers: tuple[LayerCost, ...] = ()
    config: Config | None = None
    tokens_per_s: float | None = None
    """Transformers: tokens trained per second (samples/s × sequence length)."""
    mfu: float | None = None
    """Accelerators: model FLOPs utilisation, the model's training FLOPs (no recomputation)
    per second over the devices' peak (Chowdhery et al. 2022, PaLM appendix B)."""
    straggler_factor: float = 1.0
    """Asynchronous replicas of unequal speed: the epoch takes f·N/X times this
    (model/stragglers.py); 1 without a measured spread."""
    error_band: ErrorBand | None = None
    """The validated error distribution of the plan's regime on its system, or the reason
    there is none (model/error_band.py: `band_of`, attached by `predict_plan`); None for
    predictions built by hand."""
    step_record: StepRecord | None = None
    """The composition's per-stage times (model/records.py); None for predictions built by
    hand."""
    stage_memory: tuple[tuple[MemoryPart, ...], ...] = ()
    """Accelerator pipelines: per stage (from the first), the memory parts of one of its
    devices; `memory` is the fullest of them. Empty for one-stage CPU plans and predictions
    built by hand."""

    @property
    def epoch_throughput_samples_per_s(self) -> float:
        """Samples per second over a whole epoch, f·N / T_epoch = X / straggler factor."""
        return self.throughput_samples_per_s / self.straggler_factor

    @property
    def breakdown_s(self) -> dict[str, float]:
        """{part name: seconds}, in the order of `parts` (wave 1's `breakdown_s`)."""
        return {str(part.name): part.seconds for part in self.parts}

    @property
    def by_stage(self) -> bool:
        """Composed as micro-batches through pipeline stages (GPU and Megatron plans; their
        parts include the bubble), not as Project Adam's one-stage CPU step."""
        return self.step_record is not None and self.step_record.by_stage

    def part(self, name: Part | str) -> float:
        """Seconds of the part called `name` (0 if the plan has no such part)."""
        return self.breakdown_s.get(name, 0.0)

    def memory_of(self, role: str) -> float:
        """Total bytes one device of `role` needs."""
        return sum(part.bytes for part in self.memory if part.role == role)

    @property
    def memory_bytes(self) -> dict[str, float]:
        """{'worker': total, 'ps': total} per device, then the worker's parts by name."""
        totals = {"worker": self.memory_of("worker"), "ps": self.memory_of("ps")}
        totals.update({part.name: part.bytes for part in self.memory if part.role == "worker"})
        return totals

    def label(self) -> str:
        """The plan in a few words: Adam's flags, or TP/PP/DP, batch and options."""
        if self.config is not None:
            return self.config.label()
        from dnnscale.plan.modern import plan_label

        return plan_label(self.plan)

    def overflow(self) -> str:
        """Which role's memory exceeds its device and by which parts (empty when it fits)."""
        for role, capacity in self.memory_capacity_bytes.items():
            need = self.memory_of(role)
            if need > capacity:
                from dnnscale.units import format_si

                parts = sorted((p for p in self.memory if p.role == role), key=lambda p: -p.bytes)
                listed = ", ".join(f"{p.name.replace('_', ' ')} {format_si(p.bytes, 'B')}"
                                   for p in parts)
                return (f"a {role} needs {format_si(need, 'B')} > {format_si(capacity, 'B')} "
                        f"({listed})")
        return ""

    @property
    def fits(self) -> bool:
        """Every role's memory within its device's capacity."""
        return all(self.memory_of(role) <= capacity
                   for role, capacity in self.memory_capacity_bytes.items())

    def to_dict(self, with_layers: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "config": self.config.to_dict() if self.config is not None else None,
            "plan": self.plan.to_dict(),
            "throughput_samples_per_s": self.throughput_samples_per_s,
            "step_time_s": self.step_time_s,
            "epoch_time_s": self.epoch_time_s,
            "bottleneck": str(self.bottleneck),
            "breakdown_s": self.breakdown_s,
            "parts": [{"name": str(p.name), "seconds": p.seconds, "kind": str(p.kind),
                       "of": [str(name) for name in p.of]} for p in self.parts],
            "utilization": dict(self.utilization),
            "capacities_samples_per_s": {k: (None if math.isinf(v) else v)
                                         for k, v in self.capacities_samples_per_s.items()},
            "memory_bytes": self.memory_bytes,
            "memory_parts": [{"name": p.name, "bytes": p.bytes, "role": p.role}
                             for p in self.memory],
            "fits": self.fits,
        }
        if self.tokens_per_s is not None:
            data["tokens_per_s"] = self.tokens_per_s
        if self.mfu is not None:
            data["mfu"] = self.mfu
        if self.straggler_factor != 1.0:
            data["straggler_factor"] = self.straggler_factor
        if self.error_band is not None:
            data["error_band"] = self.error_band.to_dict()
        record = self.step_record
        if record is not None and record.by_stage:
            mesh = self.plan.mesh
            data["mesh"] = {
                "order": [str(dim) for dim in MESH_ORDER],
                "sizes": {str(dim): mesh.size(dim) for dim in MESH_ORDER},
                "devices": mesh.devices,
                "expert_tensor": self.plan.expert_tensor,
                "collectives_s": {str(c.dimension): c.seconds for c in record.collectives}}
        if with_layers:
            data["layers"] = [
                {"name": c.name, "kind": c.kind, "scheme": c.scheme, "work_fraction": c.work_fraction,
                 "forward_s": c.forward_s, "input_grad_s": c.input_grad_s,
                 "weight_grad_s": c.weight_grad_s, "comm_bytes": c.comm_bytes, "comm_s": c.comm_s,
                 **({"ep_comm_s": c.ep_comm_s} if c.ep_comm_s else {}),
                 **({"cp_comm_s": c.cp_comm_s} if c.cp_comm_s else {})}
                for c in self.layers]
        return data
