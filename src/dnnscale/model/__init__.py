"""The performance model: sharding rules, collective costs, stage costs, composition, memory."""

from dnnscale.model.prediction import MemoryPart, Prediction, StepPart
from dnnscale.model.predict import predict_config, predict_plan
from dnnscale.model.stage import StageCosts, stage_costs

__all__ = ["MemoryPart", "Prediction", "StageCosts", "StepPart",
           "predict_config", "predict_plan", "stage_costs"]
