"""The config API: search axes, RF* config wrappers and search groups that expand into RunSpecs.

Names and shapes follow RapidFire AI, so its tutorials port by changing one import::

    from rapidfire_nb.automl import List, RFModelConfig, RFLoraConfig, RFSFTConfig, RFGridSearch

    configs = List([
        RFModelConfig(
            model_name="Qwen/Qwen2.5-0.5B-Instruct",
            peft_config=List([
                RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                RFLoraConfig(r=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
            ]),
            training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4),
        )
        for lr in (1e-3, 1e-4)
    ])
    group = RFGridSearch(configs, trainer_type="SFT")
    specs = group.expand()          # 4 RunSpecs, in a deterministic order

What lives here (public): ``List`` and ``Range`` (grid and random-search axes); ``RFLoraConfig``,
``RFSFTConfig``, ``RFDPOConfig``, ``RFGRPOConfig`` (every keyword of the installed PEFT/TRL class,
validated at construction by building the real object); ``RFModelConfig``; ``RFGridSearch``,
``RFRandomSearch`` and ``RFOptuna`` (Optuna's ask/tell over chunk-level eval values);
``RapidFireConfigWarning`` (the category of this module's warnings); and the helpers the engine and ``clone_modify`` use on expanded runs:
``apply_changes``, ``editable_knobs``, ``build_training_args``, ``build_lora_config``,
``warm_start_conflicts``. TRL/PEFT knowledge lives in ``_automl_backend``; expansion in
``_automl_space``.

Devices: configs are validated as the engine will run them *on this machine*. Without a CUDA/MPS
accelerator, ``use_cpu=True`` is added unless you set ``use_cpu``, and the run is fp32 unless you
chose a precision (TRL's default bf16 autocast measured ~2x slower than fp32 on CPU); ``fp16=True``
on a CPU-only machine is accepted with a warning and run in fp32, because float16 autocast on CPU
is ~60x slower (measured with torch 2.13). On a GPU without bf16 (a T4), TRL's default bf16 becomes
fp32 and an explicit ``bf16=True`` falls back to fp32 with a warning. A config written for a GPU
therefore always constructs on a laptop; on a GPU it runs as written.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import random
import warnings
from collections.abc import Iterable
from typing import Any

from rapidfire_nb import _automl_backend as _be
from rapidfire_nb._automl_backend import RapidFireConfigWarning
from rapidfire_nb._automl_space import Choice, Const, Node, Record, Span, canonical
from rapidfire_nb.engine.runspec import TRAINER_TYPES, RunSpec, _callable_name
from rapidfire_nb.errors import ConfigError

__all__ = [
    "List", "Range", "RFLoraConfig", "RFSFTConfig", "RFDPOConfig", "RFGRPOConfig", "RFModelConfig",
    # RFOptuna comes from the module __getattr__ below (created on first use)
    "RFGridSearch", "RFRandomSearch", "RFOptuna",  # noqa: F822
    "RapidFireConfigWarning", "apply_changes", "editable_knobs",
    "build_training_args", "build_lora_config", "warm_start_conflicts",
]

# Validating every corner of a config with many axes at construction would be exponential; above
# this many combinations, construction checks each axis value once (the group checks them all).
_MAX_CONSTRUCTION_COMBOS = 256


# ============================================================================================
# Axes

class List:
    """A grid axis: every value is tried (``RFGridSearch``) or one is drawn (``RFRandomSearch``).

    A plain Python list is one value (e.g. ``target_modules=["q_proj", "v_proj"]``); wrap values in
    ``List`` to make them an axis. Values may be anything a knob takes, including RF configs.

    Example::

        RFSFTConfig(learning_rate=List([1e-3, 1e-4]))        # 2 runs
        RFLoraConfig(target_modules=List([["q_proj"], ["q_proj", "v_proj"]]))  # 2 runs
    """

    def __init__(self, values: Iterable):
        if isinstance(values, (str, bytes, dict, List, Range)) or not hasattr(values, "__iter__"):
            raise ConfigError(f"List expects a list of values, got {type(values).__name__} {values!r}.")
        values = list(values)
        if not values:
            raise ConfigError("List needs at least one value.")
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, i):
        return self.values[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, List) and self.values == other.values

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"List({self.values!r})"

    def sample(self, rng: random.Random | None = None):
        """One value, drawn with ``rng`` (RapidFire's ``List.sample()`` without one)."""
        return (rng or random).choice(self.values)


class Range:
    """A random-search axis: ``RFRandomSearch`` draws a value in ``[start, end]`` (both included).

    Args:
        start, end: the bounds.
        dtype: ``"int"``/``"float"`` (or ``int``/``float``); inferred from the bounds when omitted
            (two ints give an int range).
        log: draw uniformly in log space (both bounds must be > 0) -- the usual choice for
            learning rates.

    Example::

        RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True), per_device_train_batch_size=Range(2, 8))

    A ``Range`` in an ``RFGridSearch`` is an error: a grid cannot enumerate a continuum.
    """

    def __init__(self, start, end, dtype=None, log: bool = False):
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"Range {name} must be a finite number, got {value!r}.")
        if dtype is None:
            dtype = "int" if isinstance(start, int) and isinstance(end, int) else "float"
        dtype = {int: "int", float: "float"}.get(dtype, dtype)
        if dtype not in ("int", "float"):
            raise ConfigError(f"Range dtype must be 'int' or 'float', got {dtype!r}.")
        if dtype == "int":
            if float(start) != int(start) or float(end) != int(end):
                raise ConfigError(f"Range({start!r}, {end!r}, dtype='int') needs integer bounds.")
            start, end = int(start), int(end)
        else:
            start, end = float(start), float(end)
        if start > end:
            raise ConfigError(f"Range start {start!r} is greater than end {end!r}.")
        if not isinstance(log, bool):
            raise ConfigError(f"Range log must be True or False, got {log!r}.")
        if log and start <= 0:
            raise ConfigError(f"Range({start!r}, {end!r}, log=True) needs bounds > 0.")
        self.start, self.end, self.dtype, self.log = start, end, dtype, log

    def sample(self, rng: random.Random):
        """One value drawn with ``rng``."""
        lo, hi = self.start, self.end
        if self.dtype == "int":
            if self.log:
                # uniform in log over [lo, hi + 1) then floor: every integer reachable, log-weighted
                value = int(math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))
            else:
                value = rng.randint(lo, hi)
            return min(max(value, lo), hi)
        if self.log:
            value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            value = rng.uniform(lo, hi)
        return min(max(value, lo), hi)

    def num_values(self) -> float:
        """How many distinct values a draw can give (``math.inf`` for a float interval)."""
        if self.dtype == "int":
            return self.end - self.start + 1
        return 1 if self.start == self.end else math.inf

    def values(self) -> list:
        if self.dtype == "int":
            return list(range(self.start, self.end + 1))
        if self.start == self.end:
            return [self.start]
        raise ValueError("a float Range has infinitely many values")

    def __eq__(self, other) -> bool:
        return isinstance(other, Range) and (self.start, self.end, self.dtype, self.log) == (
            other.start, other.end, other.dtype, other.log)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Range({self.start!r}, {self.end!r}, dtype={self.dtype!r}{', log=True' if self.log else ''})"


def _has_axis(value: Any) -> bool:
    if isinstance(value, (List, Range)):
        return True
    if isinstance(value, dict):
        return any(_has_axis(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_axis(v) for v in value)
    return isinstance(value, (_RFConfig, RFModelConfig))


def _node(value: Any, path: str) -> Node:
    """The search-space tree of a value (see ``_automl_space``)."""
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
    def _accept_all(self, kwargs: dict, notes: list) -> dict:
        target = self._target()
        knobs: dict = {}
        for name, value in kwargs.items():
            if name in _be.knob_fields(target):
                knobs[name] = self._check_knob(name, value)
            elif _be.removed_knob(target, name) is not None:
                for new_name, new_value in self._port(name, value, kwargs, notes).items():
                    knobs[new_name] = self._check_knob(new_name, new_value)
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
        for combo in _construction_combos(per_knob):
            combination = {k: combo[k] for k in axes} if axes else None
            _, _, combo_notes = _be.build_checked(
                target, combo, combination=combination, record=records if not records else None)
            notes.extend(combo_notes)
        if warn:
            seen = set()
            found = [(RapidFireConfigWarning, t) for t in notes] + records
            for category, text in found:
                if about is not None and about not in text:
                    continue
                if text not in seen:
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
        accepted = self._accept_all({name: value}, notes)
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
        model_type, model_kwargs, tokenizer_kwargs, ref_model_name, ref_model_type,
        ref_model_kwargs: passed to ``create_model`` in ``model_config``; dict values may be Lists.
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
        return _callable_name(value) or repr(value)
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
            _check_generation_keys(value)   # the keys clone_modify would refuse, refused here too
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


# ============================================================================================
# Search groups

class _SearchGroup:
    _name = ""

    def __init__(self, configs, trainer_type: str = "SFT"):
        if not isinstance(trainer_type, str) or trainer_type.upper() not in TRAINER_TYPES:
            raise ConfigError(f"{self._name}: trainer_type must be one of {', '.join(TRAINER_TYPES)}; "
                              f"got {trainer_type!r}.")
        self.trainer_type = trainer_type.upper()
        if isinstance(configs, (list, tuple)):
            raise ConfigError(f"{self._name}: configs got a plain list; wrap the RFModelConfigs in "
                              f"List([...]).")
        for i, cfg in enumerate(_options(configs)):
            if not isinstance(cfg, RFModelConfig):
                raise ConfigError(f"{self._name}: configs must be an RFModelConfig or a List of them; "
                                  f"item {i} is {type(cfg).__name__}.")
            self._check_trainer(cfg, i if isinstance(configs, List) else None)
        self.configs = configs

    def _check_trainer(self, cfg: RFModelConfig, index: int | None) -> None:
        where = f"configs[{index}]" if index is not None else "configs"
        expected = _TRAINING_CLASSES[self.trainer_type]
        for args in _options(cfg.training_args):
            if args is not None and not isinstance(args, expected):
                raise ConfigError(
                    f"{self._name}(trainer_type={self.trainer_type!r}): {where}.training_args is an "
                    f"{type(args).__name__}; trainer_type {self.trainer_type!r} needs {expected.__name__}.")
        if self.trainer_type == "GRPO" and cfg.reward_funcs is None:
            raise ConfigError(f"{self._name}(trainer_type='GRPO'): {where}.reward_funcs is required "
                              f"(a callable or a list of callables).")
        if self.trainer_type != "GRPO" and cfg.reward_funcs is not None:
            raise ConfigError(f"{self._name}(trainer_type={self.trainer_type!r}): {where}.reward_funcs is "
                              f"only used by GRPO.")

    def _tree(self) -> Node:
        if isinstance(self.configs, List):
            return Choice([_node(c, f"configs[{i}]") for i, c in enumerate(self.configs.values)], "configs")
        return _node(self.configs, "")

    def _leaves(self) -> list[dict]:
        raise NotImplementedError

    def expand(self) -> list[RunSpec]:
        """The runs of this group, in order (run ids are their positions + 1), each validated."""
        return _leaves_to_specs(self._leaves(), self.trainer_type)

    def __len__(self) -> int:
        return len(self._leaves())


class RFGridSearch(_SearchGroup):
    """Every combination of the axes: the top-level ``List`` of ``RFModelConfig``s, a ``List`` of
    LoRA configs, and every ``List`` in trainer args, LoRA args and ``model_kwargs``.

    The order is deterministic: configs in ``List`` order; within one, the first axis varies slowest
    (base model, then LoRA, trainer args, model kwargs, the rest), keys in the order you wrote them.

    Example::

        group = RFGridSearch(RFModelConfig(model_name="m",
                                           training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-4]),
                                                                     num_train_epochs=List([1, 2]))),
                             trainer_type="SFT")
        [s.knobs for s in group.expand()]
        # [{'training_args.learning_rate': 0.001, 'training_args.num_train_epochs': 1}, ... 4 runs]

    A ``Range`` anywhere is a ConfigError naming the knob (use ``RFRandomSearch``).
    """

    _name = "RFGridSearch"

    def __init__(self, configs, trainer_type: str = "SFT", *, pruner: str | None = None,
                 pruner_mode: str = "stop", reduction_factor: int = 2, min_chunks: int = 1,
                 objective: str = "minimize:eval_loss"):
        super().__init__(configs, trainer_type)
        self.pruning = _pruning(self._name, pruner, pruner_mode, reduction_factor, min_chunks, objective)
        try:
            self._tree().grid_size()   # refuses a Range now rather than at run_fit
        except ConfigError as exc:
            raise ConfigError(f"RFGridSearch: {exc}") from None

    def _leaves(self) -> list[dict]:
        return list(self._tree().grid())


class RFRandomSearch(_SearchGroup):
    """``num_runs`` distinct configurations drawn from the space, deterministically for ``seed``.

    Each draw picks one ``RFModelConfig`` of the top-level ``List``, one value of every ``List``
    and a value in every ``Range`` (log-uniform with ``log=True``). Draws equal to an earlier one are
    redrawn; a space with fewer than ``num_runs`` distinct points is a ConfigError.

    Example::

        group = RFRandomSearch(RFModelConfig(model_name="m",
                                             training_args=RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True))),
                               trainer_type="SFT", num_runs=8, seed=0)
    """

    _name = "RFRandomSearch"

    def __init__(self, configs, trainer_type: str = "SFT", num_runs: int | None = None, seed: int = 42,
                 num_samples: int | None = None, *, pruner: str | None = None, pruner_mode: str = "stop",
                 reduction_factor: int = 2, min_chunks: int = 1, objective: str = "minimize:eval_loss"):
        super().__init__(configs, trainer_type)
        self.pruning = _pruning(self._name, pruner, pruner_mode, reduction_factor, min_chunks, objective)
        if num_samples is not None:   # the name the TRL docs' RapidFire page uses
            if num_runs is not None and num_runs != num_samples:
                raise ConfigError(f"RFRandomSearch: num_runs={num_runs!r} and num_samples={num_samples!r} "
                                  "disagree; give one of them.")
            num_runs = num_samples
        if isinstance(num_runs, bool) or not isinstance(num_runs, int) or num_runs < 1:
            raise ConfigError(f"RFRandomSearch: num_runs must be a positive integer, got {num_runs!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"RFRandomSearch: seed must be an integer, got {seed!r}.")
        self.num_runs, self.seed = num_runs, seed
        bound = self._tree().max_distinct()
        if bound < num_runs:
            raise ConfigError(f"RFRandomSearch: the space has at most {int(bound)} distinct "
                              f"configurations, fewer than num_runs={num_runs}.")

    def _leaves(self) -> list[dict]:
        tree = self._tree()
        rng = random.Random(self.seed)
        seen: set = set()
        leaves: list[dict] = []
        attempts = 0
        max_attempts = 1000 + 50 * self.num_runs
        while len(leaves) < self.num_runs and attempts < max_attempts:
            attempts += 1
            leaf = tree.sample(rng)
            key = canonical(leaf)
            if key not in seen:
                seen.add(key)
                leaves.append(leaf)
        if len(leaves) < self.num_runs:
            leaves += self._fill_from_enumeration(tree, rng, seen, self.num_runs - len(leaves))
        return leaves

    def _fill_from_enumeration(self, tree: Node, rng, seen: set, missing: int) -> list[dict]:
        # Draws keep colliding: the space is small or full of equal points. Enumerate it (it is
        # finite, or max_distinct would be inf and draws would practically never collide).
        bound = tree.max_distinct()
        if math.isinf(bound) or bound > 200_000:
            raise ConfigError(f"RFRandomSearch: could not draw {self.num_runs} distinct configurations.")
        rest, keys = [], set(seen)
        for leaf in tree.points():
            key = canonical(leaf)
            if key not in keys:
                keys.add(key)
                rest.append(leaf)
        if len(rest) < missing:
            raise ConfigError(f"RFRandomSearch: the space has only {len(seen) + len(rest)} distinct "
                              f"configurations, fewer than num_runs={self.num_runs}.")
        return rng.sample(rest, missing)


def _pruning(where, pruner, pruner_mode, reduction_factor, min_chunks, objective):
    """Pruning at chunk boundaries (``pruner="sha"|"median"|"hyperband"``), see ``tuning.py``."""
    from rapidfire_nb.tuning import PruningOptions

    return PruningOptions(where, pruner, pruner_mode, reduction_factor, min_chunks, objective)


def __getattr__(name: str):
    # RFOptuna lives in tuning.py (issue 18) and needs this module's classes: created on first use
    if name == "RFOptuna":
        from rapidfire_nb.tuning import rfoptuna_class

        return rfoptuna_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ============================================================================================
# Leaves -> RunSpecs

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
        return _callable_name(value)
    return value


def _varying(flats: list[dict]) -> list[str]:
    keys: dict = {}
    for flat in flats:
        keys.update(dict.fromkeys(flat))
    return [k for k in keys if len({canonical(f.get(k)) for f in flats}) > 1]


def _leaves_to_specs(leaves: list[dict], trainer_type: str) -> list[RunSpec]:
    target = _be.TRAINING_TARGET[trainer_type]
    lora = _be.TARGETS["RFLoraConfig"]
    machine = _be.detect_machine()
    prepared = []
    for leaf in leaves:
        leaf = dict(leaf)
        user_args = dict(leaf.get("training_args") or {})
        leaf["training_args"], _ = _be.normalize_for_machine(user_args, machine, target.label)
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


# ============================================================================================
# Working on expanded runs: the engine and clone_modify

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


def _check_generation_keys(gc: dict) -> None:
    from transformers import GenerationConfig
    known = set(GenerationConfig().to_dict())
    for k in gc:
        if k not in known:
            raise ConfigError(f"'generation_config.{k}' is not a generation setting."
                              + _be.did_you_mean(k, known))


def _check_generation_config(gc: dict) -> None:
    from transformers import GenerationConfig
    _check_generation_keys(gc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GenerationConfig(**gc).validate(strict=False)   # as run time: sampling-only flags warn, not fail
    except TypeError:
        pass  # older transformers: validate() has no strict flag; construction was the check
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"generation_config rejected by transformers.GenerationConfig: {exc}") from exc


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
