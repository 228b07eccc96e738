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
from dnnscale.plan import Config
from dnnscale.optimize import optimize  # the function; shadows the subpackage name on purpose

if TYPE_CHECKING:
    from dnnscale.system import System
    from dnnscale.model import Prediction
    from dnnscale.workload import Workload

__version__ = "0.1.0"
__all__ = ["Config", "optimize", "predict", "__version__"]


@finite_answers("predict")
def predict(workload: "str | Path | Workload", cluster: "str | Path | System",
            config: "Config | str | Path") -> "Prediction":
    """Predict step time, throughput and epoch time of `config` for `workload` on `cluster`.

    Every input is validated as if it came from YAML (objects too): raises
    dnnscale.errors.InputError (naming the field) for invalid inputs.
    """
    from dnnscale.boundary import check_prediction
    from dnnscale.system import load_system
    from dnnscale.plan import check_config, load_config
    from dnnscale.model import predict_config
    from dnnscale.workload import load_workload

    w, c, cfg = load_workload(workload), load_system(cluster), load_config(config)
    check_config(cfg, w, c)
    return check_prediction(predict_config(w, c, cfg))
