"""A run's short name: its id and the knobs that set it apart, ``3 · lr 1e-3 · r 32``.

The knobs are the run's ``run_created.knobs``: the values its search group varies (a grid's axes,
a random search's ranges) plus what a clone changed. A name shows at most two of them, those that
tell configs apart most often (``NAME_PRIORITY``: learning rate, LoRA rank...), each value cut to a
few characters: a legend entry or a TensorBoard run of five knobs and a module list read as a
sentence nobody scans. The id keeps names unique; ``full_name`` has every knob, for hovers and
titles. A name is built from
the run's own record, so it never changes as other runs come and go, and a replayed log (a
resumed experiment, a report made from a folder) names every run as before. The panel's
``js/src/names.ts`` applies the same rule; ``tests/tracking/test_naming.py`` checks both on one table.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

# Short words for the knobs searches vary most; any other knob goes by its last dotted part.
KNOB_ABBREVIATIONS = {
    "learning_rate": "lr", "lora_alpha": "alpha", "lora_dropout": "dropout",
    "per_device_train_batch_size": "bs", "gradient_accumulation_steps": "ga",
    "weight_decay": "wd", "warmup_ratio": "warmup", "warmup_steps": "warmup",
    "lr_scheduler_type": "sched", "num_train_epochs": "epochs", "max_length": "len",
    "num_generations": "gens", "target_modules": "modules", "model_name": "model",
    "max_steps": "steps",
}
NAME_KNOBS = 2   # at most this many knobs in a name; the full set is in full_name
# The knobs that set configs apart most often, first in a name; the others follow in logged order.
NAME_PRIORITY = ("learning_rate", "r", "lora_alpha", "model_name", "per_device_train_batch_size",
                 "gradient_accumulation_steps", "beta", "lr_scheduler_type", "weight_decay",
                 "num_train_epochs", "max_steps", "warmup_ratio", "warmup_steps", "lora_dropout")
VALUE_CHARS = 12   # a value longer than this is cut, with an ellipsis
SEP = " · "
_UNSAFE = re.compile(r'[\x00-\x1f\x7f/\\:*?"<>|]')


def knob_word(key: str) -> str:
    last = str(key).split(".")[-1]
    return KNOB_ABBREVIATIONS.get(last, last)


def _js_number(v: float) -> str:
    """A float as JavaScript's String(Number) writes it (1 not 1.0), for names equal to the panel's."""
    if v.is_integer() and abs(v) < 1e21:
        return str(int(v))
    return repr(v)


def knob_value_text(v: Any) -> str:
    """A knob value in a name: 1e-3, 0.05, 32, cosine, q_proj+v_proj."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if abs(v) < 1e6 else knob_value_text(float(v))
    if isinstance(v, float):
        if not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        if v.is_integer() and abs(v) < 1e6:
            return str(int(v))
        a = abs(v)
        if a != 0 and (a < 1e-2 or a >= 1e6):
            mantissa, exponent = f"{v:.2e}".split("e")
            return f"{_js_number(float(mantissa))}e{int(exponent)}"
        return _js_number(float(f"{v:.3g}"))
    if isinstance(v, (list, tuple)):
        return "+".join(knob_value_text(x) for x in v)
    if v is None:
        return "none"
    if isinstance(v, dict):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
    return str(v)


def compact_value_text(v: Any) -> str:
    """A knob value short enough for a name: a list as its first item and its length
    (``q_proj…(4)``), a path as its last part, anything longer than VALUE_CHARS cut."""
    if isinstance(v, (list, tuple)) and len(v) > 1:
        text = knob_value_text(list(v))
        if len(text) > VALUE_CHARS:
            text = f"{_cut(knob_value_text(v[0]), VALUE_CHARS - 4)}…({len(v)})"
        return text
    text = knob_value_text(v)
    if isinstance(v, str) and "/" in text.rstrip("/"):
        text = text.rstrip("/").rsplit("/", 1)[1]
    return _cut(text, VALUE_CHARS)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def name_keys(knobs: dict) -> list:
    """The knobs a name shows: the NAME_PRIORITY ones first, then the rest as logged; at most two."""
    keys = list(knobs)
    rank = {w: i for i, w in enumerate(NAME_PRIORITY)}
    order = sorted(range(len(keys)), key=lambda i: (rank.get(str(keys[i]).split(".")[-1], len(rank)), i))
    return [keys[i] for i in order[:NAME_KNOBS]]


def short_name(run_id: int, knobs: dict | None) -> str:
    """``3 · lr 1e-3 · r 32``; ``run 3`` for a run without knobs (nothing to tell it by)."""
    if not knobs:
        return f"run {int(run_id)}"
    return SEP.join([str(int(run_id)), *(f"{knob_word(k)} {compact_value_text(knobs[k])}" for k in name_keys(knobs))])


def full_name(run_id: int, knobs: dict | None) -> str:
    """Every knob, values whole: ``3 · lr 1e-3 · r 32 · modules q_proj+v_proj`` (hovers, titles)."""
    if not knobs:
        return f"run {int(run_id)}"
    return SEP.join([str(int(run_id)), *(f"{knob_word(k)} {knob_value_text(v)}" for k, v in knobs.items())])


def folder_name(run_id: int, knobs: dict | None) -> str:
    """The short name as one path component: no separators, no characters a file system refuses."""
    name = _UNSAFE.sub("_", short_name(run_id, knobs)).strip(" .")
    return name[:120] or str(int(run_id))
