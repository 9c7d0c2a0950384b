"""What ``rapidfire_nb.automl`` knows about TRL and PEFT (its user-visible policy: ``policy``).

Everything version-dependent lives here: which knobs the *installed* ``SFTConfig`` / ``DPOConfig`` /
``GRPOConfig`` / ``LoraConfig`` accept (read from their dataclass fields, never hard-coded), the type
and range checks TRL/PEFT leave to training time, porting the knobs of ``policy.REMOVED_KNOBS``
(mapped to today's equivalent or dropped with one warning), and building the real config objects,
normalized by ``policy.normalize_for_machine``, with errors that name the knob.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import functools
import importlib
import math
import pathlib
import re
import types
import typing
import warnings
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.automl.policy import REMOVED_KNOBS, Machine, Removed, detect_machine, normalize_for_machine
from rapidfire_nb.errors import ConfigError



# --------------------------------------------------------------------------------------------
# The wrapped classes

@dataclass(frozen=True)
class Target:
    """One wrapped TRL/PEFT config class."""

    label: str          # our class name, used in messages: "RFSFTConfig"
    module: str         # "trl" | "peft"
    cls_name: str       # "SFTConfig"
    trainer_type: str | None  # "SFT" | "DPO" | "GRPO" | None for LoRA

    @property
    def cls(self) -> type:
        return _import_class(self.module, self.cls_name)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.cls_name}"


TARGETS = {
    "RFSFTConfig": Target("RFSFTConfig", "trl", "SFTConfig", "SFT"),
    "RFDPOConfig": Target("RFDPOConfig", "trl", "DPOConfig", "DPO"),
    "RFGRPOConfig": Target("RFGRPOConfig", "trl", "GRPOConfig", "GRPO"),
    "RFLoraConfig": Target("RFLoraConfig", "peft", "LoraConfig", None),
}
TRAINING_TARGET = {t.trainer_type: t for t in TARGETS.values() if t.trainer_type}


def _import(module: str):
    if module in ("peft", "trl"):
        # often the script's or notebook's first peft import (an RFLoraConfig): without %load_ext
        # or the CLI, bitsandbytes would print a misleading "pip install kernels" line here
        from rapidfire_nb._quiet import import_peft_quietly

        import_peft_quietly()
    return importlib.import_module(module)


@functools.cache
def _import_class(module: str, name: str) -> type:
    # TRL takes seconds to import; only pay for it when a config is first built.
    return getattr(_import(module), name)


@functools.cache
def library_version(module: str) -> str:
    return getattr(_import(module), "__version__", "?")


@functools.cache
def knob_fields(target: Target) -> dict[str, dataclasses.Field]:
    """Constructor keywords of the installed class, in declaration order."""
    return {f.name: f for f in dataclasses.fields(target.cls) if f.init}


@functools.cache
def knob_hints(target: Target) -> dict[str, Any]:
    try:
        return typing.get_type_hints(target.cls)
    except Exception:  # an unresolvable annotation must not make every knob unusable
        return {}


def knob_default(target: Target, name: str) -> Any:
    f = knob_fields(target)[name]
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


# Short names users type for common knobs (also what ``%rapidfire clone`` accepts).
KNOB_ALIASES = {
    "lr": "learning_rate",
    "batch_size": "per_device_train_batch_size",
    "bs": "per_device_train_batch_size",
    "epochs": "num_train_epochs",
    "rank": "r",
    "alpha": "lora_alpha",
    "dropout": "lora_dropout",
}


def did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.75)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(c) for c in close) + "?"



def removed_knob(target: Target, name: str) -> Removed | None:
    """The porting entry for ``name``, or None when it is a live knob or never existed."""
    if name in knob_fields(target) or target.trainer_type is None:
        return None
    entry = REMOVED_KNOBS[target.trainer_type].get(name)
    if entry is None:
        return None
    if entry.mapping is not None and entry.replaces not in knob_fields(target):
        return dataclasses.replace(entry, mapping=None)  # the new name is missing too: drop
    return entry


def port_knob(target: Target, name: str, value: Any, knobs: dict) -> tuple[dict, str]:
    """Translate a removed knob. Returns (kwargs to set, the one warning text)."""
    entry = removed_knob(target, name)
    assert entry is not None
    where = f"{entry.library} {library_version(entry.library)}"
    if entry.mapping is not None and entry.replaces in knobs and not entry.merges:
        return {}, (f"{target.label}: '{name}' was removed in {where} ({entry.note}); dropped "
                    f"because '{entry.replaces}' is set too.")
    if entry.mapping is not None:
        mapped = entry.mapping(value, knobs)
        shown = ", ".join(f"{k}={v!r}" for k, v in mapped.items()) or "nothing"
        return mapped, f"{target.label}: '{name}' was removed in {where} ({entry.note}); mapped to {shown}."
    return {}, f"{target.label}: '{name}' does not exist in {where} ({entry.note}); dropped."


def unknown_knob_error(target: Target, name: str) -> ConfigError:
    known = list(knob_fields(target))
    if target.trainer_type:
        known += list(REMOVED_KNOBS[target.trainer_type])
    err = ConfigError(
        f"{target.label}: unknown knob '{name}': {target.qualname} "
        f"({target.module} {library_version(target.module)}) has no such argument."
        + (f" Did you mean {KNOB_ALIASES[name]!r}?" if KNOB_ALIASES.get(name) in known
           else did_you_mean(name, known)))
    err.knob = name
    return err


# --------------------------------------------------------------------------------------------
# Values: JSON normalization, types and ranges

def normalize_value(value: Any) -> Any:
    """Make a knob value plain: enums to their value, tuples/sets to lists, paths to str.
    Objects with no JSON form (a torch dtype, a ParallelismConfig) are kept as they are."""
    if isinstance(value, enum.Enum):
        return normalize_value(value.value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [normalize_value(v) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [normalize_value(v) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, dict):
        return {k: normalize_value(v) for k, v in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return value.item()
    return value


def is_json_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json_value(v) for k, v in value.items())
    return False


def _conforms(value: Any, hint: Any) -> bool:
    """Does ``value`` fit the annotation? Unknown typing constructs say yes (TRL decides)."""
    if hint is Any or hint is None:
        return True
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is typing.Literal:
        if value in args and not (isinstance(value, bool) and True not in args and False not in args):
            return True
        # PEFT writes patterns such as 'pissa_niter_[number of iters]'
        return isinstance(value, str) and any(
            isinstance(a, str) and "[" in a and value.startswith(a.split("[")[0]) for a in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if hint in (list, tuple, set) or origin in (list, tuple, set, collections.abc.Sequence):
        if not isinstance(value, (list, tuple, set, frozenset)):
            return False
        if origin is list and args:
            return all(_conforms(v, args[0]) for v in value)
        return True
    if hint is dict or origin in (dict, collections.abc.Mapping):
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, (hint, str))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    text = getattr(hint, "__name__", None) if isinstance(hint, type) else None
    text = text or str(hint)
    return re.sub(r"\b(typing|transformers|peft|trl|accelerate)(\.\w+)*\.", "", text)


# Numeric knobs TRL/PEFT accept at construction but that fail later (or silently misbehave).
# (low, low_inclusive, high, high_inclusive); None bounds are open.
_RANGES: dict[str, tuple] = {
    "learning_rate": (0, True, None, False),
    "weight_decay": (0, True, None, False),
    "max_grad_norm": (0, True, None, False),
    "adam_epsilon": (0, True, None, False),
    "adam_beta1": (0, True, 1, False),
    "adam_beta2": (0, True, 1, False),
    "num_train_epochs": (0, False, None, False),
    "per_device_train_batch_size": (1, True, None, False),
    "per_device_eval_batch_size": (1, True, None, False),
    "gradient_accumulation_steps": (1, True, None, False),
    "eval_accumulation_steps": (1, True, None, False),
    "logging_steps": (0, False, None, False),
    "save_steps": (0, False, None, False),
    "eval_steps": (0, False, None, False),
    "seed": (0, True, None, False),
    "data_seed": (0, True, None, False),
    "dataloader_num_workers": (0, True, None, False),
    "max_length": (1, True, None, False),
    "max_completion_length": (1, True, None, False),
    "num_generations": (1, True, None, False),
    "generation_batch_size": (1, True, None, False),
    "steps_per_generation": (1, True, None, False),
    "num_iterations": (1, True, None, False),
    "beta": (0, True, None, False),
    "label_smoothing": (0, True, 0.5, True),
    "temperature": (0, False, None, False),
    "top_p": (0, False, 1, True),
    "epsilon": (0, True, None, False),
    # LoRA
    "r": (1, True, None, False),
    "lora_alpha": (0, False, None, False),
    "lora_dropout": (0, True, 1, False),
}
# Knobs typed int by PEFT/TRL that work with any real number (PEFT computes alpha / r); and
# transformers' fsdp, typed str but documented (and read) as also True or a list of options.
_TYPE_WIDENED = {"lora_alpha": float, "fsdp": bool | str | list[str] | None}


def check_value(target: Target, name: str, value: Any) -> str | None:
    """Why ``value`` is not acceptable for knob ``name`` (None when it is)."""
    hint = _TYPE_WIDENED.get(name) or knob_hints(target).get(name)
    # TRL/PEFT turn a single string into a one-item list for list[str] knobs (loss_type='ipo')
    if isinstance(value, str) and hint is not None and "list[str]" in _describe(hint):
        hint = None
    if hint is not None and not _conforms(value, hint):
        return f"expects {_describe(hint)}, got {type(value).__name__} {value!r}"
    if name == "fsdp" and isinstance(value, str) and value and not value.strip():
        # transformers turns FSDP on for any non-empty string; the options read from it are none
        return f"names no FSDP option (give e.g. 'full_shard auto_wrap', or leave it unset); got {value!r}"
    if name == "max_steps" and isinstance(value, int) and not isinstance(value, bool):
        if value == 0 or value < -1:
            return f"must be a positive integer, or -1 for 'use num_train_epochs'; got {value!r}"
    bounds = _RANGES.get(name)
    if bounds and isinstance(value, (int, float)) and not isinstance(value, bool):
        low, low_incl, high, high_incl = bounds
        bad = (isinstance(value, float) and not math.isfinite(value))
        bad = bad or (low is not None and (value < low or (value == low and not low_incl)))
        bad = bad or (high is not None and (value > high or (value == high and not high_incl)))
        if bad:
            lo = "" if low is None else f"{'>=' if low_incl else '>'} {low}"
            hi = "" if high is None else f"{'<=' if high_incl else '<'} {high}"
            return f"must be {' and '.join(x for x in (lo, hi) if x)}; got {value!r}"
    return None


def value_error(target: Target, name: str, value: Any, problem: str, where: str = "") -> ConfigError:
    err = ConfigError(f"{target.label}: knob '{name}' {problem}{where}.")
    err.knob = name
    return err


# --------------------------------------------------------------------------------------------
# Building the real objects

_NOISE = (
    # TRL's own default gradient_checkpointing=True trips transformers' rename warning on every
    # construction; it says nothing about the user's config.
    r"`gradient_checkpointing` is deprecated",
)


def construct(target: Target, kwargs: dict, *, record: list | None = None):
    """``target.cls(**kwargs)``, with TRL's default-value noise silenced; other warnings are
    appended to ``record`` when given, else silenced."""
    from rapidfire_nb.engine import preserved_accelerate_state

    # building a TrainingArguments resets accelerate's global state under running trainers
    with preserved_accelerate_state(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = target.cls(**kwargs)
    if record is not None:
        for w in caught:
            text = str(w.message)
            if not any(re.search(p, text) for p in _NOISE):
                record.append((w.category, text))
    return obj


def _try(target: Target, kwargs: dict) -> Exception | None:
    try:
        construct(target, kwargs)
    except Exception as exc:  # noqa: BLE001 -- any rejection is what we are asking about
        return exc
    return None


def build_checked(target: Target, user_kwargs: dict, *, machine: Machine | None = None,
                  combination: dict | None = None, context: str = "", record: list | None = None):
    """Build the real object from the user's kwargs (device-normalized for training configs).

    On failure, find the knob(s) to blame -- those that fail alone, plus those the message names --
    and raise a ConfigError naming them and, when given, the grid combination.
    """
    kwargs = dict(user_kwargs)
    notes: list[str] = []
    if target.trainer_type:
        kwargs, notes = normalize_for_machine(kwargs, machine or detect_machine(), target.label)
    try:
        obj = construct(target, kwargs, record=record)
    except Exception as exc:  # noqa: BLE001
        raise _blame(target, user_kwargs, kwargs, exc, machine, combination, context) from exc
    return obj, kwargs, notes


def _blame(target, user_kwargs, kwargs, exc, machine, combination, context) -> ConfigError:
    base = {k: v for k, v in kwargs.items() if k not in user_kwargs}  # what normalization added
    alone = []
    for name, value in user_kwargs.items():
        single = {name: value}
        if target.trainer_type:
            single, _ = normalize_for_machine(single, machine or detect_machine(), target.label)
        if _try(target, single) is not None:
            alone.append(name)
    text = str(exc).strip() or type(exc).__name__
    mentioned = [n for n in user_kwargs if re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", text)]
    culprits = alone + [n for n in mentioned if n not in alone] or list(user_kwargs) or list(base)
    shown = ", ".join(f"{n}={user_kwargs.get(n, base.get(n))!r}" for n in culprits)
    # A knob the message names that nobody set is TRL's default; say so, or the user hunts for it.
    fields = knob_fields(target)
    defaults = [n for n in fields if n not in kwargs and knob_default(target, n) is not None
                and re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", str(exc))]
    if defaults:
        shown += " (with the default " + ", ".join(
            f"{n}={knob_default(target, n)!r}" for n in defaults) + ")"

    noun = "knob" if len(culprits) == 1 else "knobs"
    combo = ""
    if combination and (set(combination) - set(culprits)):
        combo = " in the combination " + ", ".join(f"{k}={v!r}" for k, v in combination.items())
    err = ConfigError(
        f"{target.label}{context}: {noun} {shown} rejected by {target.qualname} "
        f"({target.module} {library_version(target.module)}){combo}: {text}")
    err.knob = culprits[0] if culprits else None
    err.knobs = culprits
    return err
