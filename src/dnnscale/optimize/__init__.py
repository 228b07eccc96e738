"""The scalability optimizer: the fastest configuration within a machine budget, exactly, and the
scalability curve (performance-model.md §6).

    from dnnscale.optimize import optimize
    result = optimize("adam-imagenet22k", "adam-2014", machines=120, top=5)
    result.best.config, result.best.epoch_time_s, result.curve[-1].speedup

`method="exhaustive"` enumerates every configuration instead (the reference the fast search is
tested against). Nothing here imports torch.
"""

from dnnscale.optimize.api import optimize, prepare
from dnnscale.optimize.result import CurvePoint, OptimizeResult

__all__ = ["CurvePoint", "OptimizeResult", "optimize", "prepare"]
