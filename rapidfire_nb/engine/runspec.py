"""RunSpec: one fully expanded configuration, as the engine consumes it.

``rapidfire_nb.automl`` turns the user's RF*Config objects and search groups into a list of
RunSpecs; the engine never sees ``List``/``Range`` or the RF* wrappers.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TRAINER_TYPES = ("SFT", "DPO", "GRPO")
# training_args knobs that change what is logged or evaluated, never what a run computes
REPORTING_KNOBS = ("logging_steps", "logging_strategy", "logging_first_step", "eval_strategy",
                   "eval_steps", "eval_delay", "save_strategy", "save_steps", "save_total_limit",
                   "report_to", "run_name", "disable_tqdm")
# training_args knobs that choose how a run is spread over devices
SHARDING_KNOBS = ("fsdp", "fsdp_config")


@dataclass
class RunSpec:
    trainer_type: str                         # "SFT" | "DPO" | "GRPO"
    model_name: str
    model_type: str = "causal_lm"
    model_kwargs: dict = field(default_factory=dict)
    tokenizer_kwargs: dict = field(default_factory=dict)
    ref_model_name: str | None = None
    ref_model_type: str | None = None
    ref_model_kwargs: dict = field(default_factory=dict)
    # kwargs of TRL's SFTConfig/DPOConfig/GRPOConfig (JSON values), already validated and
    # normalized for this machine (e.g. use_cpu=True without an accelerator).
    training_args: dict = field(default_factory=dict)
    # kwargs of peft.LoraConfig, or None for full fine-tuning
    peft_config: dict | None = None
    formatting_func: Callable | None = None
    compute_metrics: Callable | None = None
    generation_config: dict | None = None
    reward_funcs: list | None = None
    # flat {"training_args.learning_rate": 1e-3, ...}: only the values that vary in the group
    knobs: dict = field(default_factory=dict)
    # extra RFModelConfig keyword arguments not otherwise modelled (kept, JSON-able)
    extra: dict = field(default_factory=dict)

    def model_config(self) -> dict:
        """The dict passed to the user's ``create_model`` (RapidFire-compatible keys)."""
        return {
            "model_name": self.model_name,
            "model_type": self.model_type,
            "model_kwargs": copy.deepcopy(self.model_kwargs),
            "tokenizer_kwargs": copy.deepcopy(self.tokenizer_kwargs),
            "ref_model_name": self.ref_model_name,
            "ref_model_type": self.ref_model_type,
            "ref_model_kwargs": copy.deepcopy(self.ref_model_kwargs),
            "peft_config": copy.deepcopy(self.peft_config),
            "training_args": copy.deepcopy(self.training_args),
            "trainer_type": self.trainer_type,
        }

    def base_key(self) -> str:
        """Runs with equal base keys share one copy of the base model."""
        return json.dumps(
            {"n": self.model_name, "t": self.model_type, "k": self.model_kwargs,
             "tk": self.tokenizer_kwargs},
            sort_keys=True, default=repr,
        )

    def reference_spec(self) -> RunSpec | None:
        """The reference model DPO/GRPO load through ``create_model`` when ``ref_model_name``
        names another model than the base (None: the base itself is the reference)."""
        if self.trainer_type not in ("DPO", "GRPO") or self.ref_model_name in (None, self.model_name):
            return None
        return RunSpec(trainer_type=self.trainer_type, model_name=self.ref_model_name,
                       model_type=self.ref_model_type or self.model_type,
                       model_kwargs=copy.deepcopy(self.ref_model_kwargs or self.model_kwargs),
                       tokenizer_kwargs=copy.deepcopy(self.tokenizer_kwargs))

    def config_dict(self) -> dict:
        """The full JSON leaf config (what is stored, logged and editable)."""
        return {
            "trainer_type": self.trainer_type,
            "model_name": self.model_name,
            "model_type": self.model_type,
            "model_kwargs": _jsonable(self.model_kwargs),
            "tokenizer_kwargs": _jsonable(self.tokenizer_kwargs),
            "ref_model_name": self.ref_model_name,
            "ref_model_type": self.ref_model_type,
            "ref_model_kwargs": _jsonable(self.ref_model_kwargs),
            "training_args": _jsonable(self.training_args),
            "peft_config": _jsonable(self.peft_config),
            "generation_config": _jsonable(self.generation_config),
            "formatting_func": callable_name(self.formatting_func),
            "compute_metrics": callable_name(self.compute_metrics),
            "reward_funcs": [callable_name(f) for f in self.reward_funcs or []] or None,
        }

    def seed_fingerprint(self) -> str:
        """What seeds a run's adapter init and RNG: its config without the knobs that only say how
        often it is logged or evaluated, so that those never change what it learns."""
        config = self.config_dict()
        args = dict(config["training_args"] or {})
        for knob in REPORTING_KNOBS:
            args.pop(knob, None)
        # sharding says where a run computes, not what: a run sharded over k devices at a
        # per-device batch b computes what one device does at k x b (engine/sharding.py)
        devices = int((self.extra or {}).get("num_gpus") or 1)
        for knob in SHARDING_KNOBS:
            args.pop(knob, None)
        if devices > 1 and "per_device_train_batch_size" in args:
            args["per_device_train_batch_size"] = args["per_device_train_batch_size"] * devices
        config["training_args"] = args
        blob = json.dumps(config, sort_keys=True, default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()

    def fingerprint(self) -> str:
        """Stable hash of the config; seeds adapter init so it depends on (seed, config) only."""
        blob = json.dumps(self.config_dict(), sort_keys=True, default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()


# Knobs whose value names a file, a folder or a hub id that TRL, transformers, accelerate or PEFT
# load (a chat template, a checkpoint to resume, a DeepSpeed/FSDP/accelerate config file, kwargs
# for a from_pretrained): like the model's name, a folder must never choose them.
PATH_KNOBS = {"training_args": ("chat_template_path", "resume_from_checkpoint", "deepspeed",
                                "fsdp_config", "accelerator_config", "model_init_kwargs",
                                "ref_model_init_kwargs", "reward_model_path"),
              "peft_config": ("base_model_name_or_path",)}


def model_identity(spec: RunSpec) -> dict:
    """What ``create_model`` loads for a run, and how: model and reference model names, types
    and kwargs (``trust_remote_code`` lives there) and the tokenizer's kwargs; and every
    path-valued knob (``PATH_KNOBS``: what the trainers load from a path). On resume this
    comes from ``run_fit``'s arguments only, never from a folder (``launch.resume.plan_restore``)."""
    return {"model_name": spec.model_name, "model_type": spec.model_type,
            "model_kwargs": _jsonable(spec.model_kwargs),
            "tokenizer_kwargs": _jsonable(spec.tokenizer_kwargs),
            "ref_model_name": spec.ref_model_name, "ref_model_type": spec.ref_model_type,
            "ref_model_kwargs": _jsonable(spec.ref_model_kwargs),
            **{f"{section}.{knob}": _jsonable((getattr(spec, section) or {}).get(knob))
               for section, knobs in PATH_KNOBS.items() for knob in knobs}}


def callable_name(fn: Any) -> str | None:
    """The name a function is recorded under (its qualified name); None for None."""
    if fn is None:
        return None
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value") and value.__class__.__module__.startswith(("enum", "transformers", "trl", "peft")):
        return _jsonable(value.value)
    return repr(value)
