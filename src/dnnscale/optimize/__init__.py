"""The search: the fastest plan within a budget, exactly, and the scalability curve
(performance-model.md §6 for Adam's CPU configurations, §9 for GPU plans).

    from dnnscale.optimize import optimize
    result = optimize("adam-imagenet22k", "adam-2014", machines=120, top=5)
    result.best.config, result.best.epoch_time_s, result.curve[-1].speedup
    result = optimize("gpt3-125m", "dgx-a100-80g:1", global_batch=8)   # a GPU plan
    result.best.plan, result.families

One entry point (optimize/entry.py) and one result type (OptimizeResult) for both spaces.
`method="exhaustive"` enumerates every Adam configuration instead (the reference the fast search
is tested against). Nothing here imports torch.
"""

from dnnscale.optimize.entry import is_gpu_problem, optimize
from dnnscale.optimize.problem import prepare
from dnnscale.optimize.result import CurvePoint, OptimizeResult, SpaceKind

__all__ = ["CurvePoint", "OptimizeResult", "SpaceKind", "is_gpu_problem", "optimize", "prepare"]
