"""What ``%rapidfire`` reads from its line: tokens, run ids, knob names and values.

Pure functions, tested on their own. Everything typed is data, never code: values are read with
``json.loads`` and then ``ast.literal_eval`` (literals only); a mistake raises ``MagicError``
with one line naming it.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
from typing import Any

# Short names people type for the knobs they change most often; shared with the config errors'
# "Did you mean" (automl)
from rapidfire_nb.automl._backend import KNOB_ALIASES as ALIASES

WARM_FLAGS = ("--warm-start", "--warm_start", "--warm")
_SECTIONS = ("training_args", "peft_config", "generation_config", "model_kwargs")
_MAX_VALUE_CHARS = 10_000


class MagicError(Exception):
    """A malformed or refused command; its message is printed as one line."""


def split_args(line: str) -> list[str]:
    """Split on whitespace outside quotes and brackets, keeping quotes (they matter to JSON)."""
    tokens: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            cur.append(ch)
            if ch == "\\" and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
            cur.append(ch)
        elif ch in "[{(":
            depth += 1
            cur.append(ch)
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                raise MagicError(f"unbalanced {ch!r} in: {line.strip()}")
            cur.append(ch)
        elif ch.isspace() and depth == 0:
            if cur:
                tokens.append("".join(cur))
                cur = []
        else:
            cur.append(ch)
        i += 1
    if quote:
        raise MagicError(f"unclosed {quote} quote in: {line.strip()}")
    if depth:
        raise MagicError(f"unclosed bracket in: {line.strip()}")
    if cur:
        tokens.append("".join(cur))
    return tokens


def parse_run_id(token: str | None, command: str) -> int:
    if token is None:
        raise MagicError(f"'{command}' needs a run id, e.g. %rapidfire {command} 1")
    text = token.lstrip("#")
    if not text.isdigit() or not text.isascii():
        raise MagicError(f"run id must be a positive integer, got {token!r}")
    return int(text)


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def _tuples_to_lists(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_tuples_to_lists(v) for v in value]
    if isinstance(value, dict):
        return {k: _tuples_to_lists(v) for k, v in value.items()}
    return value


def parse_value(text: str, key: str, bare_word_ok: bool = False) -> Any:
    """A value typed after ``key=``: JSON first, then a Python literal; never evaluated as code.

    ``bare_word_ok`` (the knob currently holds a string) lets ``lr_scheduler_type=cosine`` mean the
    string "cosine" without quotes.
    """
    if text == "":
        raise MagicError(f"{key}= has no value")
    if len(text) > _MAX_VALUE_CHARS:
        raise MagicError(f"the value of {key} is too long ({len(text)} characters)")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        try:
            value = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            if bare_word_ok and text.replace("_", "").replace("-", "").replace(".", "").isalnum():
                return text
            raise MagicError(
                f"{key}={text}: not a JSON or Python literal (numbers, true/false, null, quoted "
                f"strings, lists, dicts); values are never evaluated as code") from None
    value = _tuples_to_lists(value)
    if not _is_json(value):
        raise MagicError(f"{key}={text}: only JSON values (numbers, strings, booleans, null, lists, "
                         f"dicts with string keys) can be set, got {type(value).__name__}")
    return value


def resolve_key(key: str, knobs: dict, run_id: int) -> str:
    """A typed key -> the dotted knob it names among ``knobs`` (the run's editable knobs).

    Dotted keys under an editable section pass through even when the run does not set them (the
    clone's validation names them if TRL/PEFT do not know them); a short name must match exactly
    one knob's last part (after the aliases above)."""
    if key in knobs:
        return key
    section = key.split(".", 1)[0]
    if "." in key:
        if section in _SECTIONS:
            return key
        raise MagicError(f"unknown knob {key!r}: dotted keys start with one of "
                         f"{', '.join(_SECTIONS)}")
    if key == "model_name" or key in _SECTIONS:   # a whole section, e.g. peft_config=null
        return key
    name = ALIASES.get(key, key)
    matches = [k for k in knobs if k.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise MagicError(f"{key!r} is ambiguous for run {run_id}: it could be "
                         f"{' or '.join(sorted(matches))}; use the dotted name")
    shorts = sorted({k.rsplit(".", 1)[-1] for k in knobs} | set(ALIASES))
    close = difflib.get_close_matches(name, shorts, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise MagicError(f"unknown knob {key!r} for run {run_id}{hint} (see %rapidfire knobs {run_id}; "
                     f"a dotted key like training_args.{name} sets a knob the run does not list)")


def parse_clone(tokens: list[str], knobs_of) -> tuple[int, dict, bool]:
    """``ID key=value ... [--warm-start]`` -> (run_id, {dotted key: value}, warm_start).

    ``knobs_of(run_id)`` returns the run's editable knobs (and raises for an unknown run)."""
    if not tokens:
        raise MagicError("'clone' needs a run id, e.g. %rapidfire clone 1 lr=5e-4 --warm-start")
    run_id = parse_run_id(tokens[0], "clone")
    warm = False
    pairs: list[tuple[str, str]] = []
    for tok in tokens[1:]:
        if tok.startswith("-"):
            if tok in WARM_FLAGS:
                warm = True
                continue
            raise MagicError(f"unknown option {tok!r} for clone (the only option is --warm-start)")
        key, eq, text = tok.partition("=")
        if not eq:
            raise MagicError(f"expected key=value, got {tok!r}")
        key = key.strip()
        if not key or not all(part.isidentifier() for part in key.split(".")):
            raise MagicError(f"{key!r} is not a knob name (expected e.g. lr or training_args.learning_rate)")
        pairs.append((key, text))
    if not pairs:
        raise MagicError("'clone' needs at least one change, e.g. %rapidfire clone "
                         f"{run_id} lr=5e-4")
    knobs = knobs_of(run_id)
    changes: dict[str, Any] = {}
    typed: dict[str, str] = {}
    for key, text in pairs:
        full = resolve_key(key, knobs, run_id)
        if full in changes:
            raise MagicError(f"{full} is set twice ({typed[full]} and {key})")
        value = parse_value(text, key, bare_word_ok=isinstance(knobs.get(full), str))
        changes[full] = value
        typed[full] = key
    return run_id, changes, warm
