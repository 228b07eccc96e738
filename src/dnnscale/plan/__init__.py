"""Plans: how training is split — the typed ParallelPlan, Adam's flags (Config), validity rules."""

from dnnscale.plan.config import SYNC_MODES, Config, config_from_dict, validate_config
from dnnscale.plan.load import load_config, load_plan
from dnnscale.plan.plan import (FC_PROTOCOLS, Batch, Collective, DataParallel, MemoryPolicy,
                                ParallelPlan, ParameterServer, Pipeline, Precision, TensorSplit)
from dnnscale.plan.modern import modern_plan_from_dict, modern_plan_to_dict, plan_label
from dnnscale.plan.rules import (check_config, check_modern_plan, check_plan, max_partitions,
                                 max_replicas)

__all__ = ["Batch", "Collective", "Config", "DataParallel", "FC_PROTOCOLS", "MemoryPolicy",
           "ParallelPlan", "ParameterServer", "Pipeline", "Precision", "SYNC_MODES",
           "TensorSplit", "check_config", "check_modern_plan", "check_plan", "load_plan", "modern_plan_from_dict",
           "modern_plan_to_dict", "plan_label", "config_from_dict", "load_config", "max_partitions",
           "max_replicas", "validate_config"]
