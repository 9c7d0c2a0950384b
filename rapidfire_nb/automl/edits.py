"""Working on expanded runs: building the TRL/PEFT objects the engine trains with, the knobs
``clone_modify`` may change, applying those changes, and warm-start conflicts."""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from typing import Any

from rapidfire_nb.automl import _backend as _be
from rapidfire_nb.automl.axes import List, Range
from rapidfire_nb.automl.policy import RapidFireConfigWarning, first_time
from rapidfire_nb.automl.specs import _display
from rapidfire_nb.engine import RunSpec
from rapidfire_nb.engine import check_generation_settings as _check_generation_config
from rapidfire_nb.errors import ConfigError

_EDITABLE_SECTIONS = ("training_args", "peft_config", "generation_config", "model_kwargs")
_EDITABLE_TOP = ("model_name",)
_COMMON_TRAINING = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
                    "gradient_accumulation_steps", "lr_scheduler_type", "warmup_steps", "weight_decay",
                    "max_grad_norm", "seed")
_COMMON_TRAINING_BY_TYPE = {"SFT": ("max_length",), "DPO": ("beta", "max_length", "loss_type"),
                            "GRPO": ("beta", "num_generations", "max_completion_length", "temperature")}
_COMMON_LORA = ("r", "lora_alpha", "lora_dropout", "target_modules")


def build_training_args(spec: RunSpec, **overrides):
    """The real TRL config of a run (``SFTConfig``/``DPOConfig``/``GRPOConfig``), as it runs on this
    machine. ``overrides`` (e.g. ``output_dir``, ``report_to``) replace the run's own values.

    Example::

        args = build_training_args(spec, output_dir=str(run_dir), report_to=[])
    """
    target = _be.TRAINING_TARGET[spec.trainer_type]
    fields = _be.knob_fields(target)
    for name in overrides:
        if name not in fields:
            raise _be.unknown_knob_error(target, name)
    obj, _, _ = _be.build_checked(target, {**spec.training_args, **overrides})
    return obj


def build_lora_config(spec: RunSpec):
    """The run's ``peft.LoraConfig``, or None for full fine-tuning. A causal LM without an explicit
    ``task_type`` gets ``task_type="CAUSAL_LM"`` (what TRL's trainers expect to save and generate)."""
    if spec.peft_config is None:
        return None
    kwargs = dict(spec.peft_config)
    if "task_type" not in kwargs and spec.model_type == "causal_lm":
        kwargs["task_type"] = "CAUSAL_LM"
    obj, _, _ = _be.build_checked(_be.TARGETS["RFLoraConfig"], kwargs)
    return obj


def editable_knobs(spec: RunSpec) -> dict:
    """Flat ``{"training_args.learning_rate": 1e-3, "peft_config.r": 8, ...}`` of the JSON knobs a
    user may edit in a clone: everything the run sets, plus the common knobs at their effective
    (TRL/PEFT default) values."""
    out: dict = {}
    target = _be.TRAINING_TARGET[spec.trainer_type]
    for k, v in spec.training_args.items():
        if _be.is_json_value(v):
            out[f"training_args.{k}"] = v
    built = build_training_args(spec)
    for k in _COMMON_TRAINING + _COMMON_TRAINING_BY_TYPE.get(spec.trainer_type, ()):
        if k in _be.knob_fields(target) and f"training_args.{k}" not in out:
            v = _be.normalize_value(getattr(built, k, None))
            if _be.is_json_value(v):
                out[f"training_args.{k}"] = v
    if spec.peft_config is not None:
        for k, v in spec.peft_config.items():
            if _be.is_json_value(v):
                out[f"peft_config.{k}"] = v
        lora = _be.TARGETS["RFLoraConfig"]
        for k in _COMMON_LORA:
            if f"peft_config.{k}" not in out:
                v = _be.normalize_value(_be.knob_default(lora, k))
                if _be.is_json_value(v):
                    out[f"peft_config.{k}"] = v
    for k, v in (spec.generation_config or {}).items():
        if _be.is_json_value(v):
            out[f"generation_config.{k}"] = v
    return out


def _flatten_changes(changes: dict, prefix: str = "") -> dict:
    flat: dict = {}
    for key, value in changes.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"changes: keys must be non-empty strings, got {key!r}.")
        full = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and full in _EDITABLE_SECTIONS:
            flat.update(_flatten_changes(value, full))   # merge; an empty dict changes nothing
        else:
            flat[full] = value
    return flat


flatten_changes = _flatten_changes  # the one reading of nested/dotted clone changes


def check_changes(changes: dict) -> None:
    """Refuse what has no stated meaning: a knob given twice (``"training_args.learning_rate"``
    and ``{"training_args": {"learning_rate": ...}}``), and ``output_dir``, which would be
    silently ignored (every run writes under its experiment folder)."""
    seen: dict[str, str] = {}

    def walk(d: dict, prefix: str) -> None:
        for key, value in d.items():
            if not isinstance(key, str):
                continue   # apply_changes names it
            full = f"{prefix}.{key}" if prefix else key
            spelled = f"{{{prefix!r}: {{{key!r}: ...}}}}" if prefix else repr(key)
            if isinstance(value, dict) and full in _EDITABLE_SECTIONS:
                walk(value, full)
                continue
            if full in seen:
                raise ConfigError(f"changes set {full!r} twice ({seen[full]} and {spelled}); give "
                                  "each knob once")
            seen[full] = spelled
            if full == "training_args.output_dir":
                raise ConfigError("changes: training_args.output_dir cannot be set; every run writes "
                                  "under its experiment folder (outputs/run_N)")

    walk(changes, "")


def apply_changes(spec: RunSpec, changes: dict) -> RunSpec:
    """A new RunSpec: ``spec`` with ``changes`` applied and validated (the parent is untouched).

    ``changes`` is nested (``{"training_args": {"learning_rate": 5e-4}}``) or dotted
    (``{"training_args.learning_rate": 5e-4, "peft_config.r": 16}``); values must be JSON
    (numbers, strings, booleans, None, lists, dicts). Editable: ``training_args.*``,
    ``peft_config.*`` (``peft_config: None`` means full fine-tuning), ``generation_config.*``,
    ``model_kwargs.*`` and ``model_name``; nested dicts merge into the run's config, and empty
    changes give an equal copy (a plain clone). Callables (formatting_func, reward_funcs,
    compute_metrics) are inherited. The real TRL/PEFT configs are built before anything returns;
    an unknown knob or a bad value raises ConfigError naming it.

    Example::

        child = apply_changes(parent, {"training_args.learning_rate": 5e-4})
        child.knobs["training_args.learning_rate"]   # 0.0005
    """
    if not isinstance(changes, dict):
        raise ConfigError(f"changes must be a dict such as {{'training_args.learning_rate': 5e-4}}, got "
                          f"{type(changes).__name__}.")
    flat = _flatten_changes(changes)
    sections = {
        "training_args": copy.deepcopy(spec.training_args),
        "peft_config": copy.deepcopy(spec.peft_config),
        "generation_config": copy.deepcopy(spec.generation_config),
        "model_kwargs": copy.deepcopy(spec.model_kwargs),
    }
    model_name = spec.model_name
    target = _be.TRAINING_TARGET[spec.trainer_type]
    lora = _be.TARGETS["RFLoraConfig"]
    editable = ", ".join([f"{s}.*" for s in _EDITABLE_SECTIONS] + list(_EDITABLE_TOP))
    for key, value in flat.items():
        if isinstance(value, (List, Range)):
            raise ConfigError(f"'{key}': a clone is one run; give a single value, not {value!r}.")
        value = _be.normalize_value(value)
        if not _be.is_json_value(value):
            raise ConfigError(f"'{key}': only JSON values can be changed in a clone, got "
                              f"{type(value).__name__} {value!r}.")
        section, _, rest = key.partition(".")
        if key == "model_name":
            if not isinstance(value, str) or not value:
                raise ConfigError(f"'model_name' must be a non-empty string, got {value!r}.")
            model_name = value
            continue
        if section not in _EDITABLE_SECTIONS:
            raise ConfigError(f"'{key}' is not an editable knob (editable: {editable})."
                              + (_dotted_hint(key, target, lora)
                                 or _be.did_you_mean(section, _EDITABLE_SECTIONS + _EDITABLE_TOP)))
        if not rest:
            if section in ("peft_config", "generation_config") and value is None:
                sections[section] = None
                continue
            if isinstance(value, dict):   # an empty dict or a whole section to replace
                sections[section] = dict(value)
                continue
            raise ConfigError(f"'{key}' needs a knob name, e.g. '{section}.learning_rate'.")
        knob, _, nested = rest.partition(".")
        if section == "training_args":
            _check_edit(target, key, knob, value if not nested else None, nested)
        elif section == "peft_config":
            _check_edit(lora, key, knob, value if not nested else None, nested)
        if sections[section] is None:
            sections[section] = {}
        _set_nested(sections[section], knob, nested, value, key)
        if nested and section in ("training_args", "peft_config"):
            tgt = target if section == "training_args" else lora
            problem = _be.check_value(tgt, knob, sections[section][knob])
            if problem:
                raise _be.value_error(tgt, knob, sections[section][knob], problem, f" (from '{key}')")
    if sections["generation_config"] is not None:
        _check_generation_config(sections["generation_config"])
    _, normalized, notes = _be.build_checked(target, sections["training_args"], context=" (clone)")
    for note in notes:
        if first_time(note):
            warnings.warn(note, RapidFireConfigWarning, stacklevel=2)
    if sections["peft_config"] is not None:
        _be.build_checked(lora, sections["peft_config"], context=" (clone)")
    knobs = dict(spec.knobs)
    for key in flat:
        section, _, rest = key.partition(".")
        knob = rest.split(".", 1)[0]
        if section in sections and knob:
            container = sections[section] or {}
            knobs[f"{section}.{knob}"] = _display(container.get(knob))
        elif key == "model_name":
            knobs["model_name"] = model_name
        else:
            knobs[key] = _display(sections.get(section))
    return dataclasses.replace(
        spec, model_name=model_name, model_kwargs=sections["model_kwargs"], training_args=normalized,
        peft_config=sections["peft_config"], generation_config=sections["generation_config"],
        knobs=knobs, tokenizer_kwargs=copy.deepcopy(spec.tokenizer_kwargs),
        ref_model_kwargs=copy.deepcopy(spec.ref_model_kwargs), extra=copy.deepcopy(spec.extra),
        reward_funcs=None if spec.reward_funcs is None else list(spec.reward_funcs))


def _dotted_hint(key: str, target: _be.Target, lora: _be.Target) -> str:
    """" Did you mean 'training_args.learning_rate'?" for a short knob name (or an alias such as
    ``lr``, as ``%rapidfire clone`` accepts) given to ``clone_modify``; "" when it is none."""
    knob = _be.KNOB_ALIASES.get(key, key)
    for section, tgt in (("training_args", target), ("peft_config", lora)):
        if knob in _be.knob_fields(tgt):
            return f" Did you mean '{section}.{knob}'?"
    return ""


def _check_edit(target: _be.Target, key: str, knob: str, value: Any, nested: str) -> None:
    if knob not in _be.knob_fields(target):
        entry = _be.removed_knob(target, knob)
        if entry is not None:
            err = ConfigError(f"'{key}': {knob} no longer exists in {entry.library} "
                              f"{_be.library_version(entry.library)} ({entry.note}).")
            err.knob = key
            raise err
        err = _be.unknown_knob_error(target, knob)
        err.args = (f"'{key}': " + err.args[0],)
        err.knob = key
        raise err
    if not nested:
        problem = _be.check_value(target, knob, value)
        if problem:
            err = _be.value_error(target, knob, value, problem, f" (from '{key}')")
            err.knob = key
            raise err


def _set_nested(container: dict, knob: str, nested: str, value: Any, key: str) -> None:
    if not nested:
        container[knob] = value
        return
    node = container.get(knob)
    node = dict(node) if isinstance(node, dict) else ({} if node is None else None)
    if node is None:
        raise ConfigError(f"'{key}': '{knob}' is not a dict, so it has no '{nested}'.")
    container[knob] = node
    parts = nested.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is not None and not isinstance(child, dict):
            raise ConfigError(f"'{key}': '{part}' is not a dict.")
        node[part] = dict(child or {})
        node = node[part]
    node[parts[-1]] = value


# LoRA knobs that change which weights exist (or their shapes): a warm start cannot carry over.
_STRUCTURAL_LORA = ("r", "target_modules", "exclude_modules", "modules_to_save", "use_dora", "bias",
                    "layers_to_transform", "layers_pattern", "rank_pattern", "fan_in_fan_out",
                    "lora_bias", "target_parameters", "trainable_token_indices", "use_qalora")


def warm_start_conflicts(parent: RunSpec, child: RunSpec) -> list[str]:
    """Why ``child`` cannot start from ``parent``'s current weights (empty when it can)."""
    reasons = []
    if parent.model_name != child.model_name:
        reasons.append(f"model_name changes ({parent.model_name!r} -> {child.model_name!r})")
    if parent.model_type != child.model_type:
        reasons.append(f"model_type changes ({parent.model_type!r} -> {child.model_type!r})")
    if json.dumps(parent.model_kwargs, sort_keys=True, default=repr) != json.dumps(
            child.model_kwargs, sort_keys=True, default=repr):
        reasons.append("model_kwargs change (another base model)")
    if (parent.peft_config is None) != (child.peft_config is None):
        reasons.append("switching between LoRA and full fine-tuning")
    elif parent.peft_config is not None:
        lora = _be.TARGETS["RFLoraConfig"]
        fields = _be.knob_fields(lora)
        for knob in _STRUCTURAL_LORA:
            if knob not in fields:
                continue
            default = _be.normalize_value(_be.knob_default(lora, knob))
            a = parent.peft_config.get(knob, default)
            b = child.peft_config.get(knob, default)
            if isinstance(a, list) and isinstance(b, list) and knob == "target_modules":
                a, b = sorted(map(str, a)), sorted(map(str, b))
            if a != b:
                reasons.append(f"LoRA {knob} changes ({a!r} -> {b!r})")
    return reasons
