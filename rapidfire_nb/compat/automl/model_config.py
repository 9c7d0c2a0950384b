"""``rapidfireai.automl.model_config``: the same names from ``rapidfire_nb.automl``."""

from rapidfire_nb.automl import RFDPOConfig, RFGRPOConfig, RFLoraConfig, RFModelConfig, RFSFTConfig

__all__ = ["RFDPOConfig", "RFGRPOConfig", "RFLoraConfig", "RFModelConfig", "RFSFTConfig"]
