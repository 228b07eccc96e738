"""`predict`: price a plan's stage, compose its step, size its memory (performance-model.md)."""

from __future__ import annotations

import math

from dnnscale.model.compose import StepContext, compose, epoch_time_s
from dnnscale.model.memory import ps_memory_parts, worker_memory_parts
from dnnscale.model.prediction import MemoryPart, Prediction
from dnnscale.model.stage import StageCosts, stage_costs
from dnnscale.plan.config import Config
from dnnscale.plan.plan import OPTIMIZERS, ParallelPlan, ParameterServer
from dnnscale.system.system import System
from dnnscale.workload.workload import Workload


def plan_stage_costs(workload: Workload, system: System, plan: ParallelPlan) -> StageCosts:
    """The stage costs of `plan` (its tensor split at its micro-batch)."""
    aggregation = plan.data.aggregation
    fc_protocol = aggregation.fc_protocol if isinstance(aggregation, ParameterServer) else "weights"
    return stage_costs(workload, system, plan.tensor.degree, plan.batch.micro_batch, fc_protocol,
                       plan.tensor.rules)


def predict_plan(workload: Workload, system: System, plan: ParallelPlan,
                 stage: StageCosts | None = None, config: Config | None = None) -> Prediction:
    """Predict one plan; `stage` may be passed in when already computed for its split and batch.
    `config`: the Adam flags the plan was built from, reported with it."""
    if stage is None:
        stage = plan_stage_costs(workload, system, plan)
    context = StepContext(workload, system, plan, stage)
    step = compose(context, plan.data.replicas, plan.ps_shards)
    memory, capacity = memory_parts(workload, system, plan, stage)
    return Prediction(plan=plan, throughput_samples_per_s=step.throughput,
                      step_time_s=step.step_s,
                      epoch_time_s=epoch_time_s(workload, plan, step.throughput),
                      bottleneck=step.bottleneck, parts=step.parts,
                      utilization=step.utilization, memory=memory,
                      memory_capacity_bytes=capacity, capacities_samples_per_s=step.capacities,
                      layers=stage.layers, config=config)


def predict_config(workload: Workload, system: System, config: Config,
                   stage: StageCosts | None = None) -> Prediction:
    """Predict the plan that Adam's flags `config` describe."""
    return predict_plan(workload, system, config.to_plan(), stage, config)


def memory_parts(workload: Workload, system: System, plan: ParallelPlan,
                 stage: StageCosts) -> tuple[tuple[MemoryPart, ...], dict[str, float]]:
    """Memory parts per device role, and each role's capacity (bytes)."""
    b = workload.bytes_per_value
    state_bytes = OPTIMIZERS[plan.optimizer] * b
    activations = math.prod(workload.input_shape) + sum(
        cost.work_fraction * layer.activation_values
        for cost, layer in zip(stage.layers, workload.layers))
    stored = stage.stored_params(workload.params)
    parts = worker_memory_parts(stored / plan.tensor.degree, b, b, state_bytes, activations, b,
                                plan.batch.micro_batch)
    capacity = {"worker": system.machine.memory_bytes}
    if plan.data.uses_ps:
        parts += ps_memory_parts(math.ceil(stored / plan.ps_shards), b, state_bytes)
        capacity["ps"] = system.ps.memory_bytes
    return parts, capacity
