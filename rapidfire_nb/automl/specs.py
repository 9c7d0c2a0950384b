"""Expanded leaves -> RunSpecs: the dotted knobs of a run and what the panel shows of them."""

from __future__ import annotations

import copy
import warnings
from typing import Any

from rapidfire_nb.automl import _backend as _be
from rapidfire_nb.automl._space import canonical
from rapidfire_nb.automl.policy import RapidFireConfigWarning, detect_machine, normalize_for_machine
from rapidfire_nb.engine import RunSpec, callable_name
from rapidfire_nb.errors import ConfigError

_SECTIONS = ("model_kwargs", "tokenizer_kwargs", "ref_model_kwargs", "training_args", "peft_config",
             "generation_config", "extra")


def _flatten(leaf: dict) -> dict:
    """Dotted knobs of one run (the keys of RunSpec.knobs)."""
    flat: dict = {}
    for name in ("model_name", "model_type", "ref_model_name", "ref_model_type"):
        flat[name] = leaf.get(name)
    for section in _SECTIONS:
        d = leaf.get(section)
        if d is None:
            flat[section] = None
            continue
        for k, v in d.items():
            flat[f"{section}.{k}"] = v
    for name in ("formatting_func", "compute_metrics"):
        flat[name] = leaf.get(name)
    funcs = leaf.get("reward_funcs")
    flat["reward_funcs"] = None if funcs is None else list(funcs)
    return flat


def _display(value: Any) -> Any:
    if isinstance(value, list):
        return [_display(v) for v in value]
    if callable(value) and not isinstance(value, type):
        return callable_name(value)
    return value


def _varying(flats: list[dict]) -> list[str]:
    keys: dict = {}
    for flat in flats:
        keys.update(dict.fromkeys(flat))
    return [k for k in keys if len({canonical(f.get(k)) for f in flats}) > 1]


def _leaves_to_specs(leaves: list[dict], trainer_type: str) -> list[RunSpec]:
    target = _be.TRAINING_TARGET[trainer_type]
    lora = _be.TARGETS["RFLoraConfig"]
    machine = detect_machine()
    prepared = []
    for leaf in leaves:
        leaf = dict(leaf)
        user_args = dict(leaf.get("training_args") or {})
        leaf["training_args"], _ = normalize_for_machine(user_args, machine, target.label)
        prepared.append((leaf, user_args))
    flats = [_flatten(leaf) for leaf, _ in prepared]
    varying = _varying(flats)
    specs = []
    n = len(prepared)
    for i, ((leaf, user_args), flat) in enumerate(zip(prepared, flats)):
        knobs = {k: _display(flat.get(k)) for k in varying}
        context = f" (run {i + 1} of {n})" if n > 1 else ""
        _be.build_checked(target, user_args, machine=machine, context=context,
                          combination=_section_combo(knobs, "training_args"))
        peft = leaf.get("peft_config")
        if peft is not None:
            _be.build_checked(lora, dict(peft), context=context,
                              combination=_section_combo(knobs, "peft_config"))
        funcs = leaf.get("reward_funcs")
        specs.append(RunSpec(
            trainer_type=trainer_type,
            model_name=leaf["model_name"],
            model_type=leaf["model_type"],
            model_kwargs=_port_model_kwargs(copy.deepcopy(leaf.get("model_kwargs") or {}), context),
            tokenizer_kwargs=copy.deepcopy(leaf.get("tokenizer_kwargs") or {}),
            ref_model_name=leaf.get("ref_model_name"),
            ref_model_type=leaf.get("ref_model_type"),
            ref_model_kwargs=copy.deepcopy(leaf.get("ref_model_kwargs") or {}),
            training_args=copy.deepcopy(dict(leaf["training_args"])),
            peft_config=None if peft is None else copy.deepcopy(dict(peft)),
            formatting_func=leaf.get("formatting_func"),
            compute_metrics=leaf.get("compute_metrics"),
            generation_config=copy.deepcopy(leaf.get("generation_config")),
            reward_funcs=None if funcs is None else list(funcs),
            knobs=knobs,
            extra=copy.deepcopy(leaf.get("extra") or {}),
        ))
    return specs


def _port_model_kwargs(kwargs: dict, context: str) -> dict:
    """``load_in_4bit``/``load_in_8bit`` in model_kwargs, as RapidFire tutorials pass them to
    ``from_pretrained``: transformers 5 refuses them there (they live in ``quantization_config``
    now). ``False`` is dropped; ``True`` becomes ``quantization_config=BitsAndBytesConfig(...)``."""
    flags = [k for k in ("load_in_4bit", "load_in_8bit") if k in kwargs]
    if not flags:
        return kwargs
    import transformers

    kwargs = dict(kwargs)
    on = {k: bool(kwargs.pop(k)) for k in flags}
    wanted = {k: v for k, v in on.items() if v}
    if wanted:
        if "quantization_config" in kwargs:
            raise ConfigError(f"model_kwargs{context}: {', '.join(wanted)}=True and quantization_config "
                              "are both given; keep quantization_config")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(**wanted)
        what = "moved into quantization_config=BitsAndBytesConfig(" + ", ".join(f"{k}=True" for k in wanted) + ")"
    else:
        what = "dropped (False is the default)"
    warnings.warn(RapidFireConfigWarning(
        f"model_kwargs{context}: {', '.join(flags)} is no longer a from_pretrained argument in "
        f"transformers {transformers.__version__}; {what}"), stacklevel=4)
    return kwargs


def _section_combo(knobs: dict, section: str) -> dict | None:
    prefix = section + "."
    combo = {k[len(prefix):]: v for k, v in knobs.items() if k.startswith(prefix)}
    return combo or None


