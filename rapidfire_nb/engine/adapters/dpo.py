"""DPO runs: TRL's ``DPOTrainer`` driven chunk by chunk.

A chunk is counted in preference pairs. With LoRA the reference model is the shared base with every
adapter disabled (TRL's own ``use_adapter(model, None)``), so no second copy exists; without LoRA
the reference is one frozen copy of the base, shared by the full fine-tuning runs of that base
(or the model named by ``ref_model_name``). ``precompute_ref_log_probs`` is honoured against that
reference.

Private contacts with TRL made here (beyond those of adapters/base.py and adapters/shared.py),
all because TRL builds its reference and precomputes log-probs inside ``__init__`` with no hook to
hand it a shared reference instead:
- ``DPOTrainer._precompute_ref_logps`` and ``DPOTrainer._precompute_model_hash`` (with
  ``trl.trainer.utils.hash_module``): precomputed after construction, against our reference
- ``DPOTrainer.precompute_ref_logps`` and ``DPOTrainer.ref_model`` set after construction
- ``args.precompute_ref_log_probs`` switched off while the constructor runs
- a placeholder ``ref_model`` during construction, so TRL does not copy a ``default`` adapter
- ``trl.data_utils.extract_prompt`` (public) to check the implicit-prompt form up front
"""

from __future__ import annotations

import torch

from rapidfire_nb.engine.adapters.base import RunTrainer, check_generation_columns
from rapidfire_nb.engine.adapters.shared import (
    RunPatches,
    frozen_reference,
    lm_module,
    refuse_unsupported,
    text_or_conversation,
)
from rapidfire_nb.engine.rng import rng_fork
from rapidfire_nb.errors import ConfigError


class _Placeholder(torch.nn.Module):
    """Stands in for ``ref_model`` while DPOTrainer is built around a shared PeftModel.

    Without a ``ref_model``, TRL treats a PeftModel as "re-training a pretrained adapter" and copies
    its ``default`` adapter into a ``ref`` one; a shared model holds only ``run_N`` adapters. The
    placeholder is dropped right after construction so that TRL's PEFT path (adapters disabled)
    provides the reference.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, *args, **kwargs):  # pragma: no cover - never called
        raise RuntimeError("placeholder reference model called")


def _check_implicit_prompt(row: dict, name: str) -> None:
    """TRL's implicit-prompt preference form: no 'prompt' column; the prompt is what 'chosen' and
    'rejected' share at their start (conversations: their first turns), as DPOTrainer extracts it."""
    from trl.data_utils import extract_prompt

    chosen, rejected = row["chosen"], row["rejected"]
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise ConfigError(f"{name}: 'chosen' and 'rejected' must both be strings or both be chat "
                          "conversations")
    parts = extract_prompt({"chosen": chosen, "rejected": rejected})
    if not parts["prompt"]:
        raise ConfigError(
            f"{name} has no 'prompt' column and the first row's 'chosen' and 'rejected' share no "
            "first turn to take the prompt from; add a 'prompt' column or start both conversations "
            "with the same prompt turns")
    if not parts["chosen"] or not parts["rejected"]:
        raise ConfigError(f"{name}: in the first row 'chosen' and 'rejected' are the same after their "
                          "shared prompt turns; each needs its own answer")


class DPORunTrainer(RunTrainer):
    """A DPO run: preference pairs, reference = base with adapters disabled (LoRA) or a frozen copy."""

    trainer_type = "DPO"

    @classmethod
    def check_dataset(cls, spec, dataset, name: str) -> None:
        cols = set(dataset.column_names)
        missing = [c for c in ("chosen", "rejected") if c not in cols]
        if missing:
            raise ConfigError(
                f"{name} has columns {sorted(cols)}; DPO needs 'chosen' and 'rejected' (and 'prompt', "
                f"unless chosen and rejected share their first turns) (missing: {', '.join(missing)})")
        present = [c for c in ("prompt", "chosen", "rejected") if c in cols]
        if len(dataset):
            row = dataset[0]
            for c in present:
                if not text_or_conversation(row[c]):
                    raise ConfigError(f"{name}: column {c!r} must hold strings or lists of chat messages, "
                                      f"got {type(row[c]).__name__}")
            if "prompt" not in cols:
                _check_implicit_prompt(row, name)
        refuse_unsupported(spec, {"sync_ref_model": True})
        check_generation_columns(spec, dataset, name)

    def make_trainer(self, args, train_dataset, eval_dataset):
        from trl import DPOTrainer

        refuse_unsupported(self.spec, {"sync_ref_model": True})
        self.raw_eval_dataset = eval_dataset
        self.patches = RunPatches()
        # the base with its adapters disabled (LoRA) is the reference, unless ref_model_name
        # named another model (loaded by the engine, frozen, shared like a base)
        shared = self.adapter_name is not None and self.ref_model is None
        precompute = bool(args.precompute_ref_log_probs)
        # TRL would precompute inside the constructor, before the placeholder below is dropped
        args.precompute_ref_log_probs = False
        if shared:
            ref = _Placeholder(self.model.config)
            patched = [lm_module(self.model)]
        else:
            ref = self.ref_model if self.ref_model is not None else frozen_reference(
                self.model, self.tokenizer, self.spec.base_key())
            patched = [lm_module(self.model), ref]
        with self.patches.capture(patched, [self.model] + ([] if shared else [ref])):
            trainer = DPOTrainer(model=self.model, ref_model=ref, args=args, train_dataset=train_dataset,
                                 eval_dataset=eval_dataset, processing_class=self.tokenizer)
        if shared:
            trainer.ref_model = None
        dropped = len(train_dataset) - len(trainer.train_dataset)
        if dropped:
            # the run's data stream (and its step count) was planned over every training pair
            raise ConfigError(
                f"DPOTrainer drops {dropped} of {len(train_dataset)} training pairs whose prompt alone has "
                f"max_length={args.max_length} tokens or more; raise max_length, shorten the prompts, or "
                f"use truncation_mode='keep_end'")
        args.precompute_ref_log_probs = precompute
        trainer.precompute_ref_logps = precompute
        if precompute:
            self._precompute(trainer, args)
        return trainer

    def _precompute(self, trainer, args) -> None:
        from trl.trainer.utils import hash_module

        self.patches.install()
        self.activate_adapter()
        trainer._precompute_model_hash = hash_module(trainer.ref_model or self.model)
        with rng_fork():
            bs = args.precompute_ref_batch_size or args.per_device_train_batch_size
            trainer.train_dataset = trainer._precompute_ref_logps(trainer.train_dataset, "train", bs)
            if trainer.eval_dataset is not None:
                bs = args.precompute_ref_batch_size or args.per_device_eval_batch_size
                trainer.eval_dataset = trainer._precompute_ref_logps(trainer.eval_dataset, "eval", bs)

    def activate_adapter(self) -> None:
        super().activate_adapter()
        patches = getattr(self, "patches", None)
        if patches is not None:
            patches.install()

    def close(self) -> None:
        if getattr(self, "patches", None) is not None:
            self.patches.clear()
        super().close()
