"""SFT runs: TRL's ``SFTTrainer`` driven chunk by chunk (``RunTrainer`` does the stepping).

Private contacts with TRL made here (beyond those of adapters/base.py):
- ``SFTTrainer._prepare_dataset`` overridden (a documented hook) so that runs that differ only in
  training hyperparameters share one prepared (tokenized) dataset; its cache key reads
  ``dataclasses.fields(SFTConfig)`` minus ``TrainingArguments``'s fields (the data-preparation
  knobs SFTConfig adds). The public alternative, ``dataset_kwargs={"skip_prepare_dataset": True}``,
  would leave the preparation (tokenizing, chat template, completion masks) to the engine, and
  TRL's own preparation is reachable only through this method: the override keeps TRL's result.
"""

from __future__ import annotations

from rapidfire_nb.engine.adapters.base import RunTrainer, check_generation_columns
from rapidfire_nb.errors import ConfigError


class SFTRunTrainer(RunTrainer):
    """An SFT run: text, conversations, or prompt-completion pairs."""

    trainer_type = "SFT"

    def make_trainer(self, args, train_dataset, eval_dataset):
        kwargs = {}
        if self.text_formatting:   # TRL's form: row -> text, applied by SFTTrainer itself
            kwargs["formatting_func"] = self.spec.formatting_func
        return _shared_prep_sft_class()(
            model=self.model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset,
            processing_class=self.tokenizer, rf_prep_cache=self.prep_cache, **kwargs)

    @classmethod
    def check_dataset(cls, spec, dataset, name: str) -> None:
        check_generation_columns(spec, dataset, name)
        cols = set(dataset.column_names)
        if not ("text" in cols or "messages" in cols or {"prompt", "completion"} <= cols):
            raise ConfigError(
                f"{name} has columns {sorted(cols)}; SFT needs 'text', 'messages', or 'prompt' and "
                f"'completion' (or pass formatting_func= to RFModelConfig)")


_SHARED_PREP_CLS = None


def _shared_prep_sft_class():
    """SFTTrainer whose dataset preparation (tokenizing, truncation) is shared between runs.

    Runs that differ only in training hyperparameters prepare the same data identically; the
    first run's result is reused, keyed on the dataset, the tokenizer, the formatting function and
    every field SFTConfig adds to TrainingArguments (its data-preparation knobs), never on a
    TrainingArguments field such as the learning rate.
    """
    global _SHARED_PREP_CLS
    if _SHARED_PREP_CLS is not None:
        return _SHARED_PREP_CLS
    import dataclasses

    from transformers import TrainingArguments
    from trl import SFTConfig, SFTTrainer

    own = sorted({f.name for f in dataclasses.fields(SFTConfig)}
                 - {f.name for f in dataclasses.fields(TrainingArguments)})

    class SharedPrepSFTTrainer(SFTTrainer):
        def __init__(self, *a, rf_prep_cache: dict, **kw):
            self._rf_prep_cache = rf_prep_cache
            super().__init__(*a, **kw)

        def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
            key = (id(dataset), id(processing_class), id(formatting_func), bool(packing), dataset_name,
                   repr([(n, getattr(args, n, None)) for n in own]))
            hit = self._rf_prep_cache.get(key)
            # the entry holds the source dataset, so its id cannot be reused while cached
            if hit is not None and hit[0] is dataset:
                return hit[1]
            out = super()._prepare_dataset(dataset, processing_class, args, packing,
                                           formatting_func, dataset_name)
            self._rf_prep_cache[key] = (dataset, out)
            return out

    _SHARED_PREP_CLS = SharedPrepSFTTrainer
    return _SHARED_PREP_CLS
