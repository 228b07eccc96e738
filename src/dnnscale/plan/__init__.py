"""Plans: how training is split — the typed ParallelPlan, Adam's flags (Config), validity rules."""

from dnnscale.plan.config import SYNC_MODES, Config, config_from_dict, validate_config
from dnnscale.plan.load import load_config
from dnnscale.plan.plan import (FC_PROTOCOLS, Batch, Collective, DataParallel, MemoryPolicy,
                                ParallelPlan, ParameterServer, Pipeline, Precision, TensorSplit)
from dnnscale.plan.rules import check_config, max_partitions, max_replicas

__all__ = ["Batch", "Collective", "Config", "DataParallel", "FC_PROTOCOLS", "MemoryPolicy",
           "ParallelPlan", "ParameterServer", "Pipeline", "Precision", "SYNC_MODES",
           "TensorSplit", "check_config", "config_from_dict", "load_config", "max_partitions",
           "max_replicas", "validate_config"]
