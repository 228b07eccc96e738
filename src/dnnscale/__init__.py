"""dnnscale: predict how long a DNN takes to train on a cluster, and find the fastest setup.

Python API::

    import dnnscale
    p = dnnscale.predict("adam-imagenet22k", "adam-2014",
                         dnnscale.Config(partitions=4, replicas=8, ps_shards=4, minibatch=32))
    p.epoch_time_s, p.bottleneck
    plan = dnnscale.optimize("adam-imagenet22k", "adam-2014", machines=120)
    plan.best.config, plan.curve

Inputs may be built-in names, YAML paths or objects. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dnnscale.boundary import finite_answers
from dnnscale.plan import Config, ParallelPlan
from dnnscale.optimize import optimize  # the function; shadows the subpackage name on purpose

if TYPE_CHECKING:
    from dnnscale.system import System
    from dnnscale.model import Prediction
    from dnnscale.workload import Workload

__version__ = "0.1.0"
__all__ = ["Config", "ParallelPlan", "optimize", "predict", "__version__"]


@finite_answers("predict")
def predict(workload: "str | Path | Workload", cluster: "str | Path | System",
            config: "Config | ParallelPlan | dict | str | Path") -> "Prediction":
    """Predict step time, throughput and epoch time of `config` for `workload` on `cluster`:
    Adam's flags (a Config or their mapping), or a Megatron-style plan (a ParallelPlan or a
    mapping of tp, pp, dp, micro_batch, global_batch, ...), or a YAML path of either.

    Every input is validated as if it came from YAML (objects too): raises
    dnnscale.errors.InputError (naming the field) for invalid inputs.
    """
    from dnnscale.boundary import check_prediction
    from dnnscale.system import load_system
    from dnnscale.model.predict import predict as predict_any
    from dnnscale.plan import check_plan, load_plan
    from dnnscale.workload import load_workload

    w, c, plan = load_workload(workload), load_system(cluster), load_plan(config)
    check_plan(plan, w, c)
    return check_prediction(predict_any(w, c, plan))
