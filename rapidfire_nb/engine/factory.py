"""The trainer factory: shared base models, DPO/GRPO references, and each run's ``RunTrainer``.

``create_model`` is called once per distinct base (and once per distinct ``ref_model_name``); every
LoRA run on a base becomes one adapter of that base's single ``PeftModel``, full fine-tuning runs
get a deep copy of the untouched base. Used by the local chunk executor (engine/executor.py) and,
for validation before training, by ``Experiment`` (``load_base``, ``model_and_tokenizer``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine.adapters import trainer_class
from rapidfire_nb.engine.adapters.base import RunTrainer, prepare_quantized_base
from rapidfire_nb.engine.inputs import TrainingInputs
from rapidfire_nb.engine.rng import derive_seed, rng_fork
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.store import ExperimentStore
from rapidfire_nb.errors import ConfigError


@contextlib.contextmanager
def _no_loading_bars():
    """run_fit calls ``create_model`` in the user's cell, so transformers' "Loading weights" bar
    would sit above the panel; bars come back as the user had them once the model is loaded."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


@dataclass
class Base:
    """One distinct base model, shared by every LoRA run built on it."""

    model: Any
    tokenizer: Any
    pristine: Any = None          # untouched copy for full fine-tuning runs
    peft_model: Any = None        # PeftModel holding the adapters of LoRA runs
    adapters: set = field(default_factory=set)


class TrainerFactory:
    def __init__(self, store: ExperimentStore, inputs: TrainingInputs):
        self.store = store
        # the datasets' prepared forms are shared by the runs' trainers through
        # ``inputs.prep_cache``; run_fit's checks fill it first
        self.inputs = inputs
        self.bases: dict[str, Base] = {}
        self.references: dict[str, Any] = {}   # DPO/GRPO references named by ref_model_name
        self.create_model_calls = 0

    # -- bases -------------------------------------------------------------------------------
    def load_base(self, spec: RunSpec, need_pristine: bool) -> Base:
        """Call ``create_model`` once per distinct base (in the caller's thread: errors show)."""
        key = spec.base_key()
        if key in self.bases:
            self.reference_model(spec)
            return self.bases[key]
        with _no_loading_bars():
            result = self.inputs.create_model(spec.model_config())
        self.create_model_calls += 1
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(
                f"create_model must return (model, tokenizer); it returned {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, tuple) else ""))
        model, tokenizer = result
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"create_model returned {type(model).__name__} as the model; "
                              "expected a transformers PreTrainedModel")
        if tokenizer is None or not callable(tokenizer):
            raise ConfigError(f"create_model returned {type(tokenizer).__name__} as the tokenizer; "
                              "expected a transformers tokenizer")
        if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None):
            tokenizer.pad_token = tokenizer.eos_token
        model = prepare_quantized_base(model, spec.model_name, need_pristine)
        base = Base(model=model, tokenizer=tokenizer)
        if need_pristine:
            base.pristine = copy.deepcopy(model)
        self.bases[key] = base
        self.reference_model(spec)   # after the base: its vocabulary is checked against the base's
        return base

    def reference_model(self, spec: RunSpec):
        """A DPO/GRPO reference other than the base (``ref_model_name``): ``create_model`` called
        once per distinct reference with its own type and kwargs, frozen, shared by every run that
        names it, and kept apart from the bases (adapters never go into it). None: the base."""
        ref_spec = spec.reference_spec()
        if ref_spec is None:
            return None
        key = ref_spec.base_key()
        if key in self.references:
            return self.references[key]
        with _no_loading_bars():
            result = self.inputs.create_model(ref_spec.model_config())
        self.create_model_calls += 1
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(f"create_model must return (model, tokenizer); for ref_model_name="
                              f"{spec.ref_model_name!r} it returned {type(result).__name__}")
        ref = result[0]
        ref.requires_grad_(False)
        ref.eval()
        base = self.bases.get(spec.base_key())
        if base is not None:
            want = base.model.get_input_embeddings().num_embeddings
            got = ref.get_input_embeddings().num_embeddings
            if want != got:
                raise ConfigError(f"ref_model_name={spec.ref_model_name!r} has a vocabulary of {got} tokens "
                                  f"and the base {spec.model_name!r} {want}; the reference scores the "
                                  "policy's tokens, so both need the same tokenizer")
        self.references[key] = ref
        return ref

    def model_and_tokenizer(self, spec: RunSpec) -> tuple[Any, Any] | None:
        """The loaded base of ``spec`` (the model before any adapter), or None if not loaded."""
        base = self.bases.get(spec.base_key())
        return None if base is None else (base.model, base.tokenizer)

    # -- plans and trainers ------------------------------------------------------------------
    def plan_run(self, spec: RunSpec):
        """(chunk plan, total optimizer steps) of a run, from its config and the data size."""
        cls = trainer_class(spec.trainer_type)
        inputs = self.inputs
        args = inputs.build_args(spec, output_dir=str(self.store.root / "outputs" / "_plan"),
                                 seed=inputs.seed, **RunTrainer.ENGINE_ARGS)
        from rapidfire_nb.engine.sharding import devices_of

        devices = devices_of(spec)   # a sharded run steps on devices x its per-device batch
        plan = cls.plan_for(args, len(inputs.train_dataset), inputs.num_chunks, inputs.seed,
                            **({"devices": devices} if devices > 1 else {}))
        return plan, plan.total_steps(args.max_steps, args.num_train_epochs)

    def build(self, rec: RunRecord) -> RunTrainer:
        """A new ``RunTrainer`` for ``rec`` on its shared base (the caller holds HF_STATE_LOCK).

        A LoRA run's adapter is initialised from (seed, run config) only, never from what was
        built before it; a full fine-tuning run trains a deep copy of the untouched base."""
        spec = rec.spec
        base = self.load_base(spec, need_pristine=spec.peft_config is None)
        cls = self.trainer_class_for(spec)
        out_dir = str(self.store.output_dir(rec.run_id))
        init_seed = derive_seed(self.inputs.seed, spec.seed_fingerprint())
        if spec.peft_config is not None:
            from peft import get_peft_model

            name = f"run_{rec.run_id}"
            lora = self.inputs.build_lora(spec)
            with rng_fork():
                import torch

                torch.manual_seed(init_seed)  # adapter init depends on (seed, config) only
                if base.peft_model is None:
                    base.peft_model = get_peft_model(base.model, lora, adapter_name=name)
                else:
                    base.peft_model.add_adapter(name, lora)
            base.adapters.add(name)
            model, adapter = base.peft_model, name
        else:
            source = base.pristine if base.pristine is not None else base.model
            model, adapter = copy.deepcopy(source), None
        import datasets

        was = datasets.utils.logging.is_progress_bar_enabled()
        datasets.utils.logging.disable_progress_bar()
        try:
            inputs = self.inputs
            return cls(rec, model, base.tokenizer, inputs.train_dataset, inputs.eval_dataset,
                       inputs.num_chunks, inputs.seed, out_dir, adapter, inputs.build_args,
                       prep_cache=inputs.prep_cache, ref_model=self.reference_model(spec))
        finally:
            if was:
                datasets.utils.logging.enable_progress_bar()

    def trainer_class_for(self, spec: RunSpec):
        """The ``RunTrainer`` type a run is built with (a gang's factory: its sharded form)."""
        return trainer_class(spec.trainer_type)

    def drop_adapter(self, spec: RunSpec, rt: RunTrainer) -> None:
        """Remove a released run's adapter from its base's PeftModel."""
        base = self.bases.get(spec.base_key())
        if rt.adapter_name is None or base is None or base.peft_model is None:
            return
        try:
            base.peft_model.delete_adapter(rt.adapter_name)
        except Exception:
            # PEFT refuses to delete the last adapter; it is then just left inactive
            pass
        base.adapters.discard(rt.adapter_name)
