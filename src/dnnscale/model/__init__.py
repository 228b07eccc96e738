"""The performance model: cost formulas (a registry of pure functions) and their composition."""

from dnnscale.model.prediction import Prediction
from dnnscale.model.predict import predict_config
from dnnscale.model.registry import COST_FORMULAS
from dnnscale.model.replica import ReplicaCosts, replica_costs

__all__ = ["COST_FORMULAS", "Prediction", "ReplicaCosts", "predict_config", "replica_costs"]
