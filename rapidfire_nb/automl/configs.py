"""The RF* config wrappers (``RFLoraConfig``, ``RFSFTConfig``, ``RFDPOConfig``, ``RFGRPOConfig``)
and ``RFModelConfig``, validated at construction against the installed TRL/PEFT classes."""

from __future__ import annotations

import copy
import itertools
import math
import warnings
from typing import Any

from rapidfire_nb.automl import _backend as _be
from rapidfire_nb.automl._space import Choice, Const, Node, Record, Span
from rapidfire_nb.automl.axes import List, Range
from rapidfire_nb.automl.policy import RapidFireConfigWarning, first_time
from rapidfire_nb.engine import PROMPT_KEYS, callable_name, check_generation_keys, check_prompt_settings
from rapidfire_nb.errors import ConfigError

# Validating every corner of a config with many axes at construction would be exponential; above
# this many combinations, construction checks each axis value once (the group checks them all).
_MAX_CONSTRUCTION_COMBOS = 256


def _has_axis(value: Any) -> bool:
    if isinstance(value, (List, Range)):
        return True
    if isinstance(value, dict):
        return any(_has_axis(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_axis(v) for v in value)
    return isinstance(value, (_RFConfig, RFModelConfig))


def _node(value: Any, path: str) -> Node:
    """The search-space tree of a value (see ``_space``)."""
    if isinstance(value, List):
        return Choice([_node(v, f"{path}[{i}]" if isinstance(v, (_RFConfig, RFModelConfig)) else path)
                       for i, v in enumerate(value.values)], path)
    if isinstance(value, Range):
        return Span(value, path)
    if isinstance(value, _RFConfig):
        return Record([(k, _node(v, f"{path}.{k}")) for k, v in value._knobs.items()], path,
                      factory=_KnobFactory(value._label))
    if isinstance(value, RFModelConfig):
        return Record([(k, _node(v, f"{path}.{k}" if path else k)) for k, v in value._slots()], path)
    if isinstance(value, dict) and _has_axis(value):
        return Record([(k, _node(v, f"{path}.{k}")) for k, v in value.items()], path)
    if isinstance(value, (list, tuple)) and _has_axis(value):
        raise ConfigError(
            f"'{path}': a List/Range inside a plain Python list is not expanded (a plain list is one "
            f"value). Make the whole value the axis: List([[...], [...]]).")
    return Const(value, path)


class KnobSet(dict):
    """The kwargs of one expanded RF*Config, remembering which class they came from."""

    label: str = ""


class _KnobFactory:
    def __init__(self, label: str):
        self.label = label

    def __call__(self, values: dict) -> KnobSet:
        out = KnobSet(values)
        out.label = self.label
        return out


def _normalize(value: Any) -> Any:
    """JSON-normalize a knob value, keeping List/Range axes (their values normalized)."""
    if isinstance(value, List):
        return List([_normalize(v) for v in value.values])
    if isinstance(value, (Range, _RFConfig, RFModelConfig)):
        return value
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and _has_axis(value):
        return [_normalize(v) for v in value]
    return _be.normalize_value(value)


# ============================================================================================
# RF* config wrappers

class _RFConfig:
    """Base of the RF* wrappers: the user's knobs (values, Lists, Ranges) of one TRL/PEFT class."""

    _label = ""

    def __init__(self, **kwargs):
        object.__setattr__(self, "_knobs", {})
        notes: list[str] = []
        knobs = self._accept_all(kwargs, notes)
        self._validate(knobs, notes, warn=True)
        object.__setattr__(self, "_knobs", knobs)

    # -- the wrapped class -------------------------------------------------------------------
    @classmethod
    def _target(cls) -> _be.Target:
        return _be.TARGETS[cls._label]

    @classmethod
    def knob_names(cls) -> list[str]:
        """Every keyword the installed TRL/PEFT class accepts."""
        return list(_be.knob_fields(cls._target()))

    # -- accepting knobs ---------------------------------------------------------------------
    def _accept_all(self, kwargs: dict, notes: list, current: dict | None = None) -> dict:
        """``current``: the knobs already set (on assignment), which a merging port adds to."""
        target = self._target()
        knobs: dict = {}
        merged: set[str] = set()   # knobs a merging port set from the user's own value too
        seen = {**(current or {}), **kwargs}
        for name, value in kwargs.items():
            if name in _be.knob_fields(target):
                if name not in merged:
                    knobs[name] = self._check_knob(name, value)
            elif (entry := _be.removed_knob(target, name)) is not None:
                for new_name, new_value in self._port(name, value, seen, notes).items():
                    knobs[new_name] = self._check_knob(new_name, new_value)
                    if entry.merges:
                        merged.add(new_name)
            else:
                raise _be.unknown_knob_error(target, name)
        return knobs

    def _port(self, name: str, value: Any, all_kwargs: dict, notes: list) -> dict:
        target = self._target()
        if isinstance(value, List):
            mapped = [_be.port_knob(target, name, v, all_kwargs) for v in value.values]
            notes.append(mapped[0][1])
            keys = list(mapped[0][0])
            return {k: List([m[0][k] for m in mapped]) for k in keys}
        result, note = _be.port_knob(target, name, value, all_kwargs)
        notes.append(note)
        return result

    def _check_knob(self, name: str, value: Any) -> Any:
        target = self._target()
        if isinstance(value, (_RFConfig, RFModelConfig)):
            raise _be.value_error(target, name, value, f"cannot be a {type(value).__name__}")
        value = _normalize(value)
        node = _node(value, name)
        for candidate in node.corners():
            problem = _be.check_value(target, name, candidate)
            if problem:
                where = " (a value of its List)" if isinstance(value, List) else (
                    " (an end of its Range)" if isinstance(value, Range) else "")
                if isinstance(value, list) and not isinstance(value, List):
                    # RapidFire users write a grid axis as List([...]); a bare list is one value
                    where += f"; to try each value, wrap them in List({value!r})"
                raise _be.value_error(target, name, candidate, problem, where)
        return value

    # -- validation by building the real object ----------------------------------------------
    def _validate(self, knobs: dict, notes: list, warn: bool, about: str | None = None) -> None:
        """Build the real object for the combinations of this config's own axes; warn (once per
        text) about ported knobs, device fallbacks and what TRL/PEFT themselves warn about --
        on assignment, only what concerns the assigned knob (``about``)."""
        target = self._target()
        axes = [name for name, value in knobs.items() if _has_axis(value)]
        per_knob = {name: list(_node(value, name).corners()) for name, value in knobs.items()}
        records: list = []
        device_notes: list[str] = []
        for combo in _construction_combos(per_knob):
            combination = {k: combo[k] for k in axes} if axes else None
            _, _, combo_notes = _be.build_checked(
                target, combo, combination=combination, record=records if not records else None)
            device_notes.extend(combo_notes)
        notes.extend(device_notes)
        if warn:
            seen = set()
            found = [(RapidFireConfigWarning, t) for t in notes] + records
            for category, text in found:
                if about is not None and about not in text:
                    continue
                if text in seen or (text in device_notes and not first_time(text)):
                    continue
                seen.add(text)
                warnings.warn(text, category, stacklevel=3)

    # -- attribute access (RapidFire tutorials do ``cfg = base.copy(); cfg.r = 16``) ------------
    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        knobs = self.__dict__.get("_knobs", {})
        if name in knobs:
            return knobs[name]
        target = self._target()
        if name in _be.knob_fields(target):
            return _be.knob_default(target, name)
        raise AttributeError(f"{self._label} has no knob '{name}'."
                             + _be.did_you_mean(name, _be.knob_fields(target)))

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        notes: list[str] = []
        updated = dict(self._knobs)
        accepted = self._accept_all({name: value}, notes, current=self._knobs)
        if name in updated and name in accepted:
            updated[name] = accepted[name]       # keep its place in the axis order
        else:
            updated.update(accepted)
        self._validate(updated, notes, warn=True, about=name)
        object.__setattr__(self, "_knobs", updated)

    def __delattr__(self, name: str) -> None:
        if name not in self._knobs:
            raise AttributeError(f"{self._label}: knob '{name}' is not set.")
        updated = {k: v for k, v in self._knobs.items() if k != name}
        self._validate(updated, [], warn=False)
        object.__setattr__(self, "_knobs", updated)

    def copy(self):
        """An independent copy (its knobs can be changed without touching this one)."""
        new = object.__new__(type(self))
        object.__setattr__(new, "_knobs", copy.deepcopy(self._knobs))
        return new

    def to_dict(self) -> dict:
        """The knobs you set (``List``/``Range`` objects included), in the order you set them."""
        return dict(self._knobs)

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self._knobs == other._knobs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{self._label}({', '.join(f'{k}={v!r}' for k, v in self._knobs.items())})"


def _construction_combos(per_knob: dict[str, list]) -> list[dict]:
    names = list(per_knob)
    total = math.prod(len(v) for v in per_knob.values())
    if total <= _MAX_CONSTRUCTION_COMBOS:
        return [dict(zip(names, vs)) for vs in itertools.product(*per_knob.values())]
    first = {n: vs[0] for n, vs in per_knob.items()}
    combos = [first]
    for n, vs in per_knob.items():
        combos += [{**first, n: v} for v in vs[1:]]
    return combos


class RFLoraConfig(_RFConfig):
    """``peft.LoraConfig`` whose knobs may be ``List``/``Range`` axes.

    Accepts every keyword of the installed PEFT's ``LoraConfig``; values are checked (types,
    ranges such as ``r >= 1`` and ``0 <= lora_dropout < 1``) and the real ``LoraConfig`` is built
    at construction, so mistakes surface here with the knob named.

    Example::

        lora = RFLoraConfig(r=List([8, 32]), lora_alpha=16, target_modules=["q_proj", "v_proj"])
        wider = lora.copy()
        wider.target_modules = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """

    _label = "RFLoraConfig"


class RFSFTConfig(_RFConfig):
    """TRL's ``SFTConfig`` whose knobs may be ``List``/``Range`` axes.

    Accepts every keyword of the installed TRL's ``SFTConfig`` (and knobs TRL/transformers have
    renamed, mapped with a warning). Each combination of this config's own axes is validated by
    building the real ``SFTConfig`` as the engine will run it on this machine.

    Example::

        args = RFSFTConfig(learning_rate=List([1e-3, 1e-4]), per_device_train_batch_size=8,
                           num_train_epochs=1, logging_steps=5)
    """

    _label = "RFSFTConfig"


class RFDPOConfig(_RFConfig):
    """TRL's ``DPOConfig`` whose knobs may be ``List``/``Range`` axes.

    Knobs DPO has dropped since RapidFire AI's tutorials were written (``max_prompt_length``,
    ``max_completion_length``, ``model_adapter_name``, ``ref_adapter_name``,
    ``force_use_ref_model``) are accepted and dropped with one ``RapidFireConfigWarning`` naming
    the knob and the installed TRL version.

    Example::

        args = RFDPOConfig(beta=List([0.1, 0.01]), loss_type="sigmoid", max_length=1024)
    """

    _label = "RFDPOConfig"


class RFGRPOConfig(_RFConfig):
    """TRL's ``GRPOConfig`` whose knobs may be ``List``/``Range`` axes.

    Knobs interact in GRPO (the generation batch must divide by ``num_generations``), so every
    combination is validated, never the fixed values alone::

        RFGRPOConfig(per_device_train_batch_size=4, num_generations=List([2, 4]))   # valid
        RFGRPOConfig(per_device_train_batch_size=4)   # ConfigError: TRL's default num_generations=8
    """

    _label = "RFGRPOConfig"


_TRAINING_CLASSES = {"SFT": RFSFTConfig, "DPO": RFDPOConfig, "GRPO": RFGRPOConfig}


# ============================================================================================
# RFModelConfig

_MODEL_FIELDS = ("model_name", "peft_config", "training_args", "model_type", "model_kwargs",
                 "tokenizer_kwargs", "formatting_func", "compute_metrics", "generation_config",
                 "reward_funcs", "ref_model_name", "ref_model_type", "ref_model_kwargs")
# Expansion order (first varies slowest), as RapidFire AI expands: base model, LoRA, trainer args,
# model kwargs, then the rest.
_SLOT_ORDER = ("model_name", "model_type", "peft_config", "training_args", "model_kwargs",
               "tokenizer_kwargs", "formatting_func", "compute_metrics", "generation_config",
               "ref_model_name", "ref_model_type", "ref_model_kwargs", "reward_funcs")
# RapidFire AI's RFModelConfig fields we carry in RunSpec.extra without using them.
_KNOWN_EXTRA = ("tokenizer", "num_gpus")


class RFModelConfig:
    """One base model with its LoRA and trainer configs (any of which may hold axes).

    Args:
        model_name: passed to your ``create_model`` in ``model_config["model_name"]``.
        peft_config: an ``RFLoraConfig``, a ``List`` of them (an axis; ``None`` in it means full
            fine-tuning), or ``None``.
        training_args: an ``RFSFTConfig``/``RFDPOConfig``/``RFGRPOConfig`` matching the group's
            ``trainer_type`` (``None``: TRL's defaults).
        model_type, model_kwargs, tokenizer_kwargs, ref_model_name, ref_model_type, ref_model_kwargs: passed
            to ``create_model`` in ``model_config``; dict values may be Lists.
            DPO/GRPO: a ``ref_model_name`` other than ``model_name`` is loaded through
            ``create_model`` (with ``ref_model_type``/``ref_model_kwargs``, defaulting to the
            base's) and used as the frozen reference; otherwise the base is the reference.
        formatting_func, compute_metrics: callables (or a ``List`` of them).
        generation_config: a dict of generation kwargs for evaluation (values may be Lists).
        reward_funcs: GRPO reward functions: a callable, a plain list of them (one value), or a
            ``List`` of such lists (an axis).
        **extra: other RapidFire AI fields (``tokenizer``, ``num_gpus``), kept in ``RunSpec.extra``.

    Example::

        RFModelConfig(model_name="Qwen/Qwen2.5-0.5B-Instruct",
                      peft_config=RFLoraConfig(r=16, target_modules=["q_proj", "v_proj"]),
                      training_args=RFSFTConfig(learning_rate=2e-4),
                      model_kwargs={"torch_dtype": List(["float32", "bfloat16"])})
    """

    def __init__(self, model_name, peft_config=None, training_args=None, model_type="causal_lm",
                 model_kwargs=None, tokenizer_kwargs=None, formatting_func=None, compute_metrics=None,
                 generation_config=None, reward_funcs=None, ref_model_name=None, ref_model_type=None,
                 ref_model_kwargs=None, **extra):
        values = dict(model_name=model_name, peft_config=peft_config, training_args=training_args,
                      model_type=model_type, model_kwargs=model_kwargs,
                      tokenizer_kwargs=tokenizer_kwargs, formatting_func=formatting_func,
                      compute_metrics=compute_metrics, generation_config=generation_config,
                      reward_funcs=reward_funcs, ref_model_name=ref_model_name,
                      ref_model_type=ref_model_type, ref_model_kwargs=ref_model_kwargs)
        for name in extra:
            if name not in _KNOWN_EXTRA:   # never silently kept: it would do nothing
                hint = _be.did_you_mean(name, _MODEL_FIELDS + _KNOWN_EXTRA)
                raise ConfigError(f"RFModelConfig: unknown argument '{name}'." + (hint or (
                    " Known: " + ", ".join(_MODEL_FIELDS + _KNOWN_EXTRA) + ".")))
        for name, value in values.items():
            object.__setattr__(self, name, _check_model_field(name, value))
        object.__setattr__(self, "extra", {k: _normalize(v) for k, v in extra.items()})

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "extra":
            if not isinstance(value, dict):
                raise ConfigError("RFModelConfig: extra must be a dict.")
            object.__setattr__(self, name, dict(value))
            return
        if name not in _MODEL_FIELDS:
            raise ConfigError(f"RFModelConfig has no field '{name}'." + _be.did_you_mean(name, _MODEL_FIELDS))
        object.__setattr__(self, name, _check_model_field(name, value))

    def _slots(self):
        return [(name, getattr(self, name)) for name in _SLOT_ORDER] + [("extra", self.extra)]

    def copy(self) -> RFModelConfig:
        """An independent copy: RF configs and dicts copied, callables shared."""
        new = object.__new__(RFModelConfig)
        for name in _MODEL_FIELDS + ("extra",):
            object.__setattr__(new, name, _copy_value(getattr(self, name)))
        return new

    def __eq__(self, other) -> bool:
        return isinstance(other, RFModelConfig) and all(
            getattr(self, n) == getattr(other, n) for n in _MODEL_FIELDS + ("extra",))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [f"model_name={self.model_name!r}"]
        for name in _MODEL_FIELDS[1:]:
            value = getattr(self, name)
            default = "causal_lm" if name == "model_type" else None
            if value != default:
                parts.append(f"{name}={_short(value)}")
        parts += [f"{k}={v!r}" for k, v in self.extra.items()]
        return f"RFModelConfig({', '.join(parts)})"


def _short(value: Any) -> str:
    if callable(value) and not isinstance(value, (_RFConfig, List)):
        return callable_name(value) or repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return repr(value)


def _copy_value(value: Any) -> Any:
    if isinstance(value, (_RFConfig, RFModelConfig)):
        return value.copy()
    if isinstance(value, List):
        return List([_copy_value(v) for v in value.values])
    if isinstance(value, dict):
        return {k: _copy_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_value(v) for v in value]
    if callable(value) or isinstance(value, Range):
        return value
    return copy.deepcopy(value)


def _options(value: Any) -> list:
    return list(value.values) if isinstance(value, List) else [value]


def _check_model_field(name: str, value: Any) -> Any:
    where = f"RFModelConfig: '{name}'"
    if isinstance(value, Range):
        raise ConfigError(f"{where} cannot be a Range.")
    if name == "model_name":
        for v in _options(value):
            if not isinstance(v, str) or not v:
                raise ConfigError(f"{where} must be a non-empty string, got {v!r}.")
        return value
    if name in ("model_type",):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where} must be a non-empty string, got {value!r}.")
        return value
    if name in ("ref_model_name", "ref_model_type"):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where} must be a string or None, got {value!r}.")
        return value
    if name == "peft_config":
        if isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} got a plain list; wrap the LoRA configs in List([...]) to make "
                              f"them a grid axis.")
        for v in _options(value):
            if v is not None and not isinstance(v, RFLoraConfig):
                raise ConfigError(f"{where} must be an RFLoraConfig, a List of them, or None; got "
                                  f"{type(v).__name__} (wrap a peft.LoraConfig's arguments in RFLoraConfig).")
        return value
    if name == "training_args":
        if isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} got a plain list; use List([...]) for an axis.")
        for v in _options(value):
            if v is not None and not isinstance(v, (RFSFTConfig, RFDPOConfig, RFGRPOConfig)):
                raise ConfigError(f"{where} must be an RFSFTConfig, RFDPOConfig or RFGRPOConfig, got "
                                  f"{type(v).__name__} (wrap TRL config arguments in the RF* class).")
        return value
    if name in ("model_kwargs", "tokenizer_kwargs", "ref_model_kwargs", "generation_config"):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a dict or None, got {type(value).__name__}.")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{where} keys must be strings, got {bad[0]!r}.")
        _node(value, name)  # refuses Lists hidden in plain lists
        if name == "generation_config":
            check_generation_keys(value)   # the keys clone_modify would refuse, refused here too
            # RapidFire's prompt settings, every value of a List (and both ends of a Range) too: a
            # search may draw a value only when it refills a slot, long after run_fit's checks
            for key in PROMPT_KEYS:
                if key in value:
                    for candidate in _node(value[key], f"generation_config.{key}").corners():
                        check_prompt_settings({key: candidate})
        return _normalize(value)
    if name in ("formatting_func", "compute_metrics"):
        for v in _options(value):
            if v is not None and not callable(v):
                raise ConfigError(f"{where} must be callable, got {type(v).__name__}.")
        return value
    if name == "reward_funcs":
        if value is None:
            return None
        opts = _options(value)
        normalized = []
        for v in opts:
            funcs = list(v) if isinstance(v, (list, tuple)) else [v]
            if not funcs:
                raise ConfigError(f"{where} must not be empty.")
            for f in funcs:
                if isinstance(f, (List, Range)):
                    raise ConfigError(f"{where}: a List inside a plain list is not expanded; use "
                                      f"List([[f, g], [f]]) for alternative reward sets.")
                if not (callable(f) or isinstance(f, str)):
                    raise ConfigError(f"{where} items must be callables (or reward model names), got "
                                      f"{type(f).__name__}.")
            normalized.append(funcs)
        return List(normalized) if isinstance(value, List) else normalized[0]
    raise AssertionError(name)


