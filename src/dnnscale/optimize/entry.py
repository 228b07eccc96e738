"""`optimize`: the one entry point of the search, for the Python API and the CLI alike.

The space follows from the inputs: a transformer workload on accelerators searches
Megatron-style GPU plans (optimize/modern.py), anything else Adam's CPU configurations
(optimize/api.py). Both return one OptimizeResult. An argument of the other space is an
InputError naming it, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from dnnscale.boundary import (check_prediction, finite_answers, require_bool,
                               require_switches)
from dnnscale.errors import InputError, require_int, require_positive, short_repr
from dnnscale.optimize.result import OptimizeResult
from dnnscale.plan.config import Config
from dnnscale.system import System, load_system
from dnnscale.workload import Workload, load_workload

GPU_SPACE = "GPU plans (a transformer workload on an accelerator cluster)"
ADAM_SPACE = "Adam's CPU configurations (any workload but a transformer on accelerators)"


def is_gpu_problem(workload: str | Path | Workload, cluster: str | Path | System) -> bool:
    """Whether the GPU-plan search applies: a transformer workload on accelerators."""
    return is_gpu_space(load_workload(workload), load_system(cluster))


def is_gpu_space(workload: Workload, system: System) -> bool:
    """is_gpu_problem of inputs already loaded (loading re-validates a Workload)."""
    return workload.transformer is not None and system.machine.is_accelerator


def _strings(values: str | Sequence[str] | None,
             field: str) -> tuple[str, ...] | None:
    """'none,full' or ['none', 'full'] -> ('none', 'full'); None stays None; anything but
    text or a list of text is an InputError naming `field`."""
    if values is None:
        return None
    if isinstance(values, str):
        items: list[object] = list(values.split(","))
    elif isinstance(values, (list, tuple)):
        items = list(values)
    else:
        raise InputError(field, f"must be names, comma-separated or a list, got "
                         f"{short_repr(values)}")
    for item in items:
        if not isinstance(item, str):
            raise InputError(field, f"must be names, got {short_repr(item)}")
    return tuple(str(item).strip() for item in items if str(item).strip())


def _counts(values: int | Iterable[int] | None, field: str) -> int | tuple[int, ...] | None:
    """One integer or a list of them (checked one by one where the space is built); text, a
    mapping or a set of anything else is an InputError naming `field`."""
    if values is None or isinstance(values, int):
        return values
    if not isinstance(values, (list, tuple, range, set, frozenset)):
        raise InputError(field, f"must be an integer or a list of integers, got "
                         f"{short_repr(values)}")
    return tuple(values)


def _optional_bool(field: str, value: object) -> bool | None:
    return None if value is None else require_bool(field, value)


def _optional_name(field: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InputError(field, f"must be a name, got {short_repr(value)}")
    return value


def _refuse(given: dict[str, object], space: str) -> None:
    """InputError naming the first argument given that the chosen space does not have."""
    for name, value in given.items():
        if value is not None:
            raise InputError(name, f"does not apply here: the search is over {space}")


@finite_answers("optimize")
def optimize(workload: str | Path | Workload, cluster: str | Path | System,
             machines: int | None = None, modes: str | Sequence[str] | None = None,
             top: int = 5, minibatch: int | Iterable[int] | None = None,
             push_every: int | Iterable[int] | None = None,
             pull_every: int | Iterable[int] | None = None, base: Config | None = None,
             curve: bool = True, method: str = "fast",
             fc_protocols: str | Sequence[str] | None = None,
             choose_overlap: bool = False, *, gpus: int | None = None,
             global_batch: int | None = None, tp: int | Iterable[int] | None = None,
             pp: int | Iterable[int] | None = None,
             micro_batch: int | Iterable[int] | None = None,
             zero: int | Iterable[int] | None = None,
             recompute: str | Sequence[str] | None = None,
             schedules: str | Sequence[str] | None = None, precision: str | None = None,
             sequence_parallel: bool | Sequence[bool] | None = None,
             overlap_dp: bool | Sequence[bool] | None = None,
             objective: str | None = None, pareto: bool | None = None,
             price_per_device_hour: float | None = None,
             engine: str | None = None, ep: int | Iterable[int] | None = None,
             cp: int | Iterable[int] | None = None,
             cp_algorithms: str | Sequence[str] | None = None,
             expert_imbalance: float | None = None,
             etp: int | Iterable[int] | None = None,
             overlap_tp: bool | Sequence[bool] | None = None,
             overlap_pp: bool | Sequence[bool] | None = None,
             loss: str | None = None, amp: str | None = None) -> OptimizeResult:
    """The fastest plan within a budget, the top `top`, the best of each family, and the
    scalability curve, over the space the inputs call for.

    workload, cluster: names, YAML paths or objects. machines (or gpus, its GPU-space name):
    the budget, default the cluster's. top, curve: both spaces.

    Adam's space (performance-model.md §6): modes ('ps-async', 'ps-sync', 'allreduce'),
    minibatch, push_every, pull_every (one value or choices), base (the fixed fields),
    fc_protocols, choose_overlap, method ('fast', or 'exhaustive': the reference).

    GPU space (§9): global_batch (required, samples per step), tp, pp, micro_batch, zero (one
    value or choices), recompute, schedules (names, or comma-separated), precision (default
    bf16), sequence_parallel and overlap_dp (True, False, or a list of both; None: both),
    objective ('time' | 'cost'), pareto, price_per_device_hour (USD, replaces the system's,
    for objective 'cost'), engine ('megatron' | 'deepspeed' | 'torchtitan': only plans that
    engine runs as priced, plan/engines.py; None: any plan, and the result says which
    engines run the winner), ep and cp (expert- and context-parallel degrees: one value or
    choices; defaults modern.default_expert_degrees / default_context_degrees),
    cp_algorithms ('ring', 'alltoall', or both; default both), expert_imbalance (the busiest
    ep member's load over the mean, for every plan; default 1), etp (expert tensor-parallel
    degrees to try besides each plan's tp; default none), overlap_tp (the tensor-parallel
    exchanges under the GEMMs, tp > 1 with sequence parallelism) and overlap_pp (the
    pipeline's sends under compute, interleaved schedule): True, False or both (None: the
    engines' defaults, overlap_tp off and overlap_pp on). loss: the loss kernel every plan
    computes (default the engine's, else 'inplace'); amp: how every 16-bit plan runs its
    memory-bound kernels ('half', the default and every engine's, 'autocast' or 'tf-amp').

    Raises InputError naming the field for bad input, an argument the chosen space does not
    have, or a budget too small for any feasible plan.
    """
    w, c = load_workload(workload), load_system(cluster)
    require_int("top", top)
    require_bool("curve", curve)
    require_bool("choose_overlap", choose_overlap)
    method = _optional_name("method", method) or "fast"
    sequence_parallel = require_switches("sequence_parallel", sequence_parallel)
    overlap_dp = require_switches("overlap_dp", overlap_dp)
    overlap_tp = require_switches("overlap_tp", overlap_tp)
    overlap_pp = require_switches("overlap_pp", overlap_pp)
    engine = _optional_name("engine", engine)
    pareto = _optional_bool("pareto", pareto)
    precision, objective = (_optional_name("precision", precision),
                            _optional_name("objective", objective))
    tp, pp, micro_batch, zero = (_counts(tp, "tp"), _counts(pp, "pp"),
                                 _counts(micro_batch, "micro_batch"), _counts(zero, "zero"))
    ep, cp, etp = _counts(ep, "ep"), _counts(cp, "cp"), _counts(etp, "etp")
    if gpus is not None and machines is not None and gpus != machines:
        raise InputError("gpus", f"{gpus} but machines={machines}: give one budget")
    budget = machines if machines is not None else gpus
    if budget is not None:
        require_int("machines" if machines is not None else "gpus", budget)
    if not is_gpu_space(w, c):
        _refuse({"gpus": gpus, "global_batch": global_batch, "tp": tp, "pp": pp,
                 "micro_batch": micro_batch, "zero": zero, "recompute": recompute,
                 "schedules": schedules, "precision": precision,
                 "sequence_parallel": sequence_parallel, "overlap_dp": overlap_dp,
                 "objective": objective, "pareto": pareto,
                 "price_per_device_hour": price_per_device_hour, "engine": engine,
                 "ep": ep, "cp": cp, "cp_algorithm": cp_algorithms,
                 "expert_imbalance": expert_imbalance, "etp": etp,
                 "overlap_tp": overlap_tp, "overlap_pp": overlap_pp, "loss": loss,
                 "amp": amp},
                ADAM_SPACE)
        from dnnscale.optimize.api import optimize_adam

        return optimize_adam(w, c, budget, modes, top, minibatch, push_every, pull_every, base,
                             curve, method, fc_protocols, choose_overlap)
    _refuse({"modes": modes, "minibatch": minibatch, "push_every": push_every,
             "pull_every": pull_every, "base": base, "fc_protocols": fc_protocols,
             "choose_overlap": choose_overlap or None}, GPU_SPACE)
    if method != "fast":
        raise InputError("method", f"the GPU-plan search is exact and has no {method!r} "
                         "method (its exhaustive reference is modern.exhaustive_modern)")
    if global_batch is None:
        raise InputError("global_batch", "required for GPU plans (samples per step)")
    from dnnscale.optimize.modern import make_modern_space, optimize_modern

    if price_per_device_hour is not None:
        c = replace(c, price_per_device_hour=require_positive("price_per_device_hour",
                                                              price_per_device_hour))
    space = make_modern_space(w, c, global_batch, tensor=tp, pipeline=pp,
                              micro_batch=micro_batch, zero=zero,
                              recompute=_strings(recompute, "recompute"),
                              schedules=_strings(schedules, "schedules"),
                              precision="bf16" if precision is None else precision,
                              sequence_parallel=sequence_parallel, overlap_dp=overlap_dp,
                              engine=engine, expert=ep, context=cp,
                              cp_algorithms=_strings(cp_algorithms, "cp_algorithm"),
                              expert_imbalance=1.0 if expert_imbalance is None
                              else expert_imbalance, expert_tensor=etp,
                              overlap_tp=overlap_tp, overlap_pp=overlap_pp, loss=loss,
                              amp=amp)
    result = optimize_modern(w, c, space, gpus=budget, top=top, objective=objective or "time",
                             pareto=bool(pareto), curve=curve)
    check_prediction(result.best, "optimize")
    return result
