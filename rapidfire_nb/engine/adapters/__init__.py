"""One adapter module per trainer type; each lists, at its top, every private piece of TRL,
transformers and accelerate it touches (adapters/base.py: those every type shares)."""

from __future__ import annotations

from rapidfire_nb.errors import ConfigError

TRAINER_TYPES = ("SFT", "DPO", "GRPO")


def trainer_class(trainer_type: str):
    """The ``RunTrainer`` subclass of a trainer type (its module is imported on first use)."""
    if trainer_type == "SFT":
        from rapidfire_nb.engine.adapters.sft import SFTRunTrainer

        return SFTRunTrainer
    if trainer_type == "DPO":
        from rapidfire_nb.engine.adapters.dpo import DPORunTrainer

        return DPORunTrainer
    if trainer_type == "GRPO":
        from rapidfire_nb.engine.adapters.grpo import GRPORunTrainer

        return GRPORunTrainer
    raise ConfigError(f"trainer_type {trainer_type!r} is not supported yet; supported: {sorted(TRAINER_TYPES)}")
