"""Validity rules of a plan that need the workload and the system (InputError names the field)."""

from __future__ import annotations

from dnnscale.errors import InputError
from dnnscale.plan.config import Config
from dnnscale.plan.plan import ParallelPlan
from dnnscale.system.system import System
from dnnscale.workload.splits import max_split
from dnnscale.workload.transformer_shape import TransformerShape
from dnnscale.workload.workload import Workload


def max_partitions(workload: Workload, rules: str = "adam") -> int:
    """The largest tensor degree every weighted layer can be split into (one unit per member)."""
    limits = [max_split(layer, rules) for layer in workload.layers if layer.has_weights]
    return min(limits) if limits else 1


def max_replicas(workload: Workload, minibatch: int) -> int:
    """The most replicas whose global step R·n still fits in one epoch: floor(samples / n).

    An epoch shorter than one global step would mean a step that trains on more samples than
    the epoch has, so configurations with R·n > samples_per_epoch are not valid."""
    return workload.samples_per_epoch // minibatch


def check_config(config: Config, workload: Workload, system: System) -> None:
    """Adam's flags against the workload and the system: a global step within one epoch,
    machines, and P within the narrowest weighted layer's widest split."""
    if config.minibatch > workload.samples_per_epoch:
        raise InputError("config.minibatch", f"{config.minibatch} is more than the "
                         f"{workload.samples_per_epoch} samples of one epoch")
    if config.replicas > max_replicas(workload, config.minibatch):
        raise InputError("config.replicas", f"R·n = {config.replicas}·{config.minibatch} = "
                         f"{config.replicas * config.minibatch} samples per global step is more "
                         f"than one epoch ({workload.samples_per_epoch} samples); at most "
                         f"{max_replicas(workload, config.minibatch)} replicas")
    if system.ps_machines:
        # Dedicated PS hosts: shards go there, and every worker (all-reduce ones too) needs a
        # worker machine of its own (testbed/describe.rank_placements places them so).
        if config.uses_ps and config.ps_shards > system.ps_machines:
            raise InputError("config.ps_shards", f"{config.ps_shards} shards but cluster "
                             f"{system.name!r} has {system.ps_machines} parameter-server machines")
        if config.workers > system.worker_machines:
            raise InputError("config", f"needs {config.workers} worker machines (P·R = "
                             f"{config.partitions}·{config.replicas}) but cluster "
                             f"{system.name!r} has {system.worker_machines}")
    elif config.machines > system.machines:
        raise InputError("config", f"needs {config.machines} machines (P·R + S = "
                         f"{config.partitions}·{config.replicas} + {config.ps_shards}) but cluster "
                         f"{system.name!r} has {system.machines}")
    weighted = [layer for layer in workload.layers if layer.has_weights]
    if weighted:
        narrow = min(weighted, key=max_split)
        limit = max_split(narrow)
        if config.partitions > limit:
            raise InputError("config.partitions", f"{config.partitions} is more than layer "
                             f"{narrow.name!r} can be split into (at most {limit})")


def check_plan_shape(plan: ParallelPlan, shape: TransformerShape) -> None:
    """A Megatron-style plan against a transformer's shape: the tensor-parallel degree divides
    the attention and key/value heads, pp · virtual stages divide the layers (also what
    `export` checks, with no system to place the plan on)."""
    t = plan.tensor.degree
    for field, count in (("heads", shape.heads), ("kv_heads", shape.kv_heads)):
        if count % t:
            raise InputError("plan.tp", f"{t} does not divide the model's {count} "
                             f"{'attention heads' if field == 'heads' else 'key/value heads'}")
    chunks = plan.pipeline.stages * plan.pipeline.virtual_stages
    if shape.layers % chunks:
        raise InputError("plan.pp", f"{shape.layers} layers do not divide into "
                         f"{plan.pipeline.stages} stages"
                         + (f" × {plan.pipeline.virtual_stages} chunks"
                            if plan.pipeline.virtual_stages > 1 else ""))


def check_modern_plan(plan: ParallelPlan, workload: Workload, system: System) -> None:
    """A Megatron-style plan against the workload and the system: devices, head and layer
    divisibility, the device's precision."""
    devices = plan.workers
    if devices > system.machines:
        raise InputError("plan", f"needs {devices} devices (tp·pp·dp = {plan.tensor.degree}·"
                         f"{plan.pipeline.stages}·{plan.data.replicas}) but cluster "
                         f"{system.name!r} has {system.machines}")
    shape = workload.transformer
    if shape is not None:
        check_plan_shape(plan, shape)
    elif plan.pipeline.stages > len(workload.layers):
        raise InputError("plan.pp", f"{plan.pipeline.stages} stages for {len(workload.layers)} "
                         f"layers")
    if system.machine.is_accelerator and plan.precision.compute not in \
            system.machine.peak_flops_per_s:
        raise InputError("plan.precision", f"{system.machine.name} has no "
                         f"{plan.precision.compute} units (it has "
                         f"{', '.join(sorted(system.machine.peak_flops_per_s))})")


def check_plan(plan: "Config | ParallelPlan", workload: Workload, system: System) -> None:
    """Adam's flags or a Megatron-style plan against the workload and the system."""
    if isinstance(plan, Config):
        check_config(plan, workload, system)
    else:
        check_modern_plan(plan, workload, system)
