"""dnnscale: predict how long a DNN takes to train on a cluster, and find the fastest setup.

Python API::

    import dnnscale
    p = dnnscale.predict("adam-imagenet22k", "adam-2014",
                         dnnscale.Config(partitions=4, replicas=8, ps_shards=4, minibatch=32))
    p.epoch_time_s, p.bottleneck
    plan = dnnscale.optimize("adam-imagenet22k", "adam-2014", machines=120)
    plan.best.config, plan.curve
    plan = dnnscale.optimize(my_module, "adam-2014", input_shape=(3, 32, 32))  # an nn.Module

Inputs may be built-in names, YAML paths or objects; a PyTorch model (an nn.Module or a factory
of one) with `input_shape`. Nothing here imports torch unless given a PyTorch model.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from dnnscale.boundary import finite_answers
from dnnscale.errors import InputError

if TYPE_CHECKING:  # pathlib too: `import dnnscale` stays cheap (dnnscale/entry.py's handler)
    from pathlib import Path

    from dnnscale.model import Prediction
    from dnnscale.optimize.result import OptimizeResult
    from dnnscale.plan import Config, ParallelPlan
    from dnnscale.system import System

__version__ = "0.1.0"
__all__ = ["Config", "ParallelPlan", "optimize", "predict", "__version__"]

_LAZY = {"Config": "dnnscale.plan", "ParallelPlan": "dnnscale.plan"}
"""Top-level names imported on first use, so `import dnnscale` stays cheap and `predict` never
imports the search or the report."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dnnscale' has no attribute {name!r}")


def optimize(workload: Any, cluster: "str | Path | System", *args: Any,
             input_shape: Any = None, loss: "str | None" = None,
             **kwargs: Any) -> "OptimizeResult":
    """`dnnscale.optimize.optimize` (see there for every argument: Adam's CPU space or, for a
    transformer on accelerators, GPU plans), also for a PyTorch model: `workload` may be an
    nn.Module or a zero-argument factory of one, with `input_shape` (one sample's shape without
    the batch, e.g. (3, 224, 224)) and optionally loss="cross_entropy". The name shadows the
    subpackage on purpose (see _Package)."""
    from dnnscale.optimize.entry import optimize as search
    from dnnscale.workload.source import resolve_workload

    _check_arguments(search, "optimize", 2 + len(args), kwargs)
    return search(resolve_workload(workload, input_shape, loss), cluster, *args, **kwargs)


def _check_arguments(func: Any, name: str, positional: int, keywords: dict[str, Any]) -> None:
    """InputError (not TypeError) for an argument `func` does not have: too many positional
    arguments (field `name`), or an unknown keyword (field: that keyword)."""
    import inspect

    parameters = inspect.signature(func).parameters
    known = [p for p in parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                          p.KEYWORD_ONLY)]
    names = {p.name for p in known} | {"input_shape", "loss"}
    for key in keywords:
        if key not in names:
            raise InputError(str(key), f"unknown argument of dnnscale.{name} (known: "
                             f"{', '.join(sorted(names))})")
    most = sum(1 for p in known if p.kind is p.POSITIONAL_OR_KEYWORD)
    if positional > most:
        raise InputError(name, f"takes at most {most} positional arguments, got {positional}; "
                         "give the rest by name")


class _Package(types.ModuleType):
    """The dnnscale package, whose attribute `optimize` stays the function above: importing
    the subpackage dnnscale.optimize (lazily, on first use) would otherwise rebind it to the
    module. The subpackage is reached through `import dnnscale.optimize.X` / `from
    dnnscale.optimize import X`, which read sys.modules."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "optimize" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


@finite_answers("predict")
def predict(workload: Any, cluster: "str | Path | System",
            config: "Config | ParallelPlan | dict | str | Path", *extra: Any,
            input_shape: Any = None, loss: "str | None" = None,
            **unknown: Any) -> "Prediction":
    """Predict step time, throughput and epoch time of `config` for `workload` on `cluster`:
    Adam's flags (a Config or their mapping), or a Megatron-style plan (a ParallelPlan or a
    mapping of tp, pp, dp, micro_batch, global_batch, ...), or a YAML path of either.
    `workload` may be a PyTorch model (an nn.Module or a factory) with `input_shape`.

    Every input is validated as if it came from YAML (objects too): raises
    dnnscale.errors.InputError (naming the field) for invalid inputs, also for an argument
    predict does not have (never a TypeError).
    """
    if extra:
        raise InputError("predict", f"takes 3 positional arguments (workload, cluster, config), "
                         f"got {3 + len(extra)}")
    for key in unknown:
        raise InputError(str(key), "unknown argument of dnnscale.predict (known: workload, "
                         "cluster, config, input_shape, loss)")
    from dnnscale.boundary import check_prediction
    from dnnscale.system import load_system
    from dnnscale.model.predict import predict as predict_any
    from dnnscale.plan import check_plan, load_plan
    from dnnscale.workload.source import resolve_workload

    w = resolve_workload(workload, input_shape, loss)
    c, plan = load_system(cluster), load_plan(config)
    check_plan(plan, w, c)
    return check_prediction(predict_any(w, c, plan))
