"""Configurations: how training is split (P, R, S, sync mode, batch, intervals)."""

from dnnscale.config.config import (FC_PROTOCOLS, SYNC_MODES, Config, check_config,
                                    config_from_dict, max_partitions, max_replicas,
                                    validate_config)
from dnnscale.config.load import load_config

__all__ = ["Config", "FC_PROTOCOLS", "SYNC_MODES", "check_config", "config_from_dict",
           "load_config", "max_partitions", "max_replicas", "validate_config"]
