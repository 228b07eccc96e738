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

from pathlib import Path
from typing import TYPE_CHECKING, Any

from dnnscale.boundary import finite_answers
from dnnscale.plan import Config, ParallelPlan
from dnnscale.optimize import optimize as _search

if TYPE_CHECKING:
    from dnnscale.system import System
    from dnnscale.model import Prediction

__version__ = "0.1.0"
__all__ = ["Config", "ParallelPlan", "optimize", "predict", "__version__"]


def optimize(workload: Any, cluster: "str | Path | System", *args: Any,
             input_shape: Any = None, loss: "str | None" = None, **kwargs: Any) -> Any:
    """`dnnscale.optimize.optimize` (see there for every argument), also for a PyTorch model:
    `workload` may be an nn.Module or a zero-argument factory of one, with `input_shape` (one
    sample's shape without the batch, e.g. (3, 224, 224)) and optionally loss="cross_entropy".
    The name shadows the subpackage on purpose."""
    from dnnscale.workload.source import resolve_workload

    return _search(resolve_workload(workload, input_shape, loss), cluster, *args, **kwargs)


@finite_answers("predict")
def predict(workload: Any, cluster: "str | Path | System",
            config: "Config | ParallelPlan | dict | str | Path", *,
            input_shape: Any = None, loss: "str | None" = None) -> "Prediction":
    """Predict step time, throughput and epoch time of `config` for `workload` on `cluster`:
    Adam's flags (a Config or their mapping), or a Megatron-style plan (a ParallelPlan or a
    mapping of tp, pp, dp, micro_batch, global_batch, ...), or a YAML path of either.
    `workload` may be a PyTorch model (an nn.Module or a factory) with `input_shape`.

    Every input is validated as if it came from YAML (objects too): raises
    dnnscale.errors.InputError (naming the field) for invalid inputs.
    """
    from dnnscale.boundary import check_prediction
    from dnnscale.system import load_system
    from dnnscale.model.predict import predict as predict_any
    from dnnscale.plan import check_plan, load_plan
    from dnnscale.workload.source import resolve_workload

    w = resolve_workload(workload, input_shape, loss)
    c, plan = load_system(cluster), load_plan(config)
    check_plan(plan, w, c)
    return check_prediction(predict_any(w, c, plan))
