"""The panel's wire protocol, without the widget: message schema, event trimming, batching.

Front-end -> Python messages (every one may carry an optional ``request_id``, echoed in the reply):

- ``{"type": "pull", "since": int}``                          events with seq > since
- ``{"type": "op", "op": "stop"|"resume"|"delete", "run_id": int}``
- ``{"type": "op", "op": "confirm_suggestion"|"ignore_suggestion", "run_id": int}``  answer a
  pruner's suggestion (``pruner_mode="suggest"``): stop the run, or let it train on
- ``{"type": "op", "op": "clone", "run_id": int, "changes": {dotted.knob: JSON value},
   "warm_start": bool, "validate_only": bool}``               (the two bools are optional)
- ``{"type": "traceback", "run_id": int}``                     a failed run's traceback
- ``{"type": "editable", "run_id": int}``                      the run's JSON-editable knobs
- ``{"type": "note", "run_id": int, "text": str}``              attach a note to a run (at most
  MAX_NOTE_CHARS characters; "" clears it); it is logged as a ``note`` event

Python -> front-end messages:

- ``{"type": "events", "events": [...], "last_seq": int, "queued": [[op, run_id], ...]}``
  pushed by the publisher thread
- ``{"type": "reply", "request_id": ..., "ok": bool, "error": str|None, ...}``; a pull reply adds
  ``events``, ``last_seq``, ``more``, ``on_device``, ``queued``; a stop / resume / delete reply
  ``queued``; a clone ``new_run_id``; traceback ``traceback``; editable ``knobs``.
- ``queued`` (also in the ``snapshot`` trait): the stop / resume / delete ops accepted but not
  applied yet, in queue order (they apply at the run's next chunk boundary); left out when the
  engine's lock was busy.

Everything from the front end is data: it is checked field by field against the schema below
(types, allowed keys, sizes) and never evaluated.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine import MAX_RUN_ID

PROTOCOL_VERSION = 1

MAX_SEQ = 2**53
MAX_REQUEST_ID_LEN = 64
MAX_CHANGES = 64
MAX_KNOB_KEY_LEN = 200
MAX_STRING_LEN = 4096
MAX_JSON_NODES = 1000
MAX_JSON_DEPTH = 4

# Pull replies and pushes are cut into batches so one message stays small for any front end.
MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 256 * 1024
MAX_WIRE_STRING = 2000
MAX_TRACEBACK_CHARS = 20000
MAX_NOTE_CHARS = 2000   # as Experiment.note

OPS = ("stop", "resume", "delete", "clone", "confirm_suggestion", "ignore_suggestion")
_COMMON_KEYS = {"type", "request_id"}
_ALLOWED_KEYS = {
    "pull": _COMMON_KEYS | {"since"},
    "traceback": _COMMON_KEYS | {"run_id"},
    "editable": _COMMON_KEYS | {"run_id"},
    "note": _COMMON_KEYS | {"run_id", "text"},
    "op": _COMMON_KEYS | {"op", "run_id"},
    "clone": _COMMON_KEYS | {"op", "run_id", "changes", "warm_start", "validate_only"},
}
# Dotted identifiers; no part may start with "_", so no private or dunder attribute is ever named.
_KNOB_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*")


class MessageError(ValueError):
    """A front-end message that does not fit the schema; the text says which field and why."""


@dataclass(frozen=True)
class Request:
    """One validated front-end message."""

    type: str
    request_id: str | int | None = None
    run_id: int | None = None
    since: int | None = None
    op: str | None = None
    changes: dict[str, Any] = field(default_factory=dict)
    warm_start: bool = False
    validate_only: bool = False
    text: str | None = None


def _is_int(value: Any) -> bool:
    # bool is an int subclass; JSON true must not pass for run 1.
    return isinstance(value, int) and not isinstance(value, bool)


def request_id_of(content: Any) -> str | int | None:
    """The message's request_id if it is well-formed, else None (so any reply can echo it)."""
    if not isinstance(content, dict):
        return None
    rid = content.get("request_id")
    if isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_LEN and rid.isprintable():
        return rid
    if _is_int(rid) and 0 <= rid <= MAX_SEQ:
        return rid
    return None


def _check_int(content: dict, key: str, low: int, high: int, what: str) -> int:
    if key not in content:
        raise MessageError(f"missing {key!r} ({what})")
    value = content[key]
    if not _is_int(value):
        raise MessageError(f"{key!r} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise MessageError(f"{key!r} out of range: {value} (allowed {low}..{high})")
    return value


def _check_bool(content: dict, key: str) -> bool:
    value = content.get(key, False)
    if not isinstance(value, bool):
        raise MessageError(f"{key!r} must be true or false, got {type(value).__name__}")
    return value


def check_json_value(value: Any, where: str) -> Any:
    """Accept only plain JSON (None, bool, finite numbers, short strings, small lists/dicts)."""
    nodes = 0
    stack = [(value, 0, where)]
    while stack:
        item, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_JSON_NODES:
            raise MessageError(f"{where}: value too large (more than {MAX_JSON_NODES} elements)")
        if depth > MAX_JSON_DEPTH:
            raise MessageError(f"{path}: nested too deeply (more than {MAX_JSON_DEPTH} levels)")
        if item is None or isinstance(item, bool):
            continue
        if _is_int(item):
            if abs(item) > 2**63:
                raise MessageError(f"{path}: integer out of range")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise MessageError(f"{path}: {item} is not a finite number")
            continue
        if isinstance(item, str):
            if len(item) > MAX_STRING_LEN:
                raise MessageError(f"{path}: string longer than {MAX_STRING_LEN} characters")
            continue
        if isinstance(item, list):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(item))
            continue
        if isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str) or len(k) > MAX_KNOB_KEY_LEN:
                    raise MessageError(f"{path}: object keys must be short strings")
                stack.append((v, depth + 1, f"{path}.{k}"))
            continue
        raise MessageError(f"{path}: {type(item).__name__} is not a JSON value")
    return value


def _check_changes(content: dict) -> dict[str, Any]:
    if "changes" not in content:
        raise MessageError("missing 'changes' (a {knob: value} object) in a clone message")
    changes = content["changes"]
    if not isinstance(changes, dict):
        raise MessageError(f"'changes' must be an object, got {type(changes).__name__}")
    if len(changes) > MAX_CHANGES:
        raise MessageError(f"'changes' has {len(changes)} entries (at most {MAX_CHANGES})")
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if not isinstance(key, str):
            raise MessageError(f"knob names must be strings, got {type(key).__name__}")
        if len(key) > MAX_KNOB_KEY_LEN or not _KNOB_KEY.fullmatch(key):
            shown = key[:60] + ("…" if len(key) > 60 else "")
            raise MessageError(f"invalid knob name {shown!r}: use dotted names like 'training_args.learning_rate'")
        out[key] = check_json_value(value, key)
    return out


def parse_message(content: Any, buffers: Any = None) -> Request:
    """Validate one front-end message; raise MessageError naming the problem."""
    if buffers:
        raise MessageError("binary buffers are not accepted")
    if not isinstance(content, dict):
        raise MessageError(f"a message must be an object, got {type(content).__name__}")
    kind = content.get("type")
    if not isinstance(kind, str) or kind not in ("pull", "op", "traceback", "editable", "note"):
        shown = kind[:40] if isinstance(kind, str) else type(kind).__name__
        raise MessageError(f"unknown message type {shown!r} (expected pull, op, traceback, editable or note)")
    if "request_id" in content and content["request_id"] is not None and request_id_of(content) is None:
        raise MessageError(
            f"'request_id' must be a printable string of at most {MAX_REQUEST_ID_LEN} characters or an integer"
        )
    schema = kind
    op = None
    if kind == "op":
        op = content.get("op")
        if not isinstance(op, str) or op not in OPS:
            shown = op[:40] if isinstance(op, str) else type(op).__name__
            raise MessageError(f"unknown op {shown!r} (expected one of {', '.join(OPS)})")
        if op == "clone":
            schema = "clone"
    for key in content:
        if not isinstance(key, str):
            raise MessageError("message keys must be strings")
        if key not in _ALLOWED_KEYS[schema]:
            shown = key[:40] + ("…" if len(key) > 40 else "")
            raise MessageError(f"unexpected key {shown!r} in a {op or kind} message")
    rid = request_id_of(content)
    if kind == "pull":
        return Request("pull", rid, since=_check_int(content, "since", 0, MAX_SEQ, "the last seq the view has"))
    run_id = _check_int(content, "run_id", 1, MAX_RUN_ID, "the run's id")
    if kind in ("traceback", "editable"):
        return Request(kind, rid, run_id=run_id)
    if kind == "note":
        text = content.get("text")
        if not isinstance(text, str):
            raise MessageError("'text' must be a string (the note)")
        if len(text) > MAX_NOTE_CHARS:
            raise MessageError(f"a note holds at most {MAX_NOTE_CHARS} characters; this one has {len(text)}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise MessageError("the note holds a lone surrogate (half of a UTF-16 pair): not valid "
                               "Unicode text") from None
        return Request("note", rid, run_id=run_id, text=text)
    if op != "clone":
        return Request("op", rid, run_id=run_id, op=op)
    return Request(
        "op",
        rid,
        run_id=run_id,
        op="clone",
        changes=_check_changes(content),
        warm_start=_check_bool(content, "warm_start"),
        validate_only=_check_bool(content, "validate_only"),
    )


# ---------------------------------------------------------------------------------------------
# Python -> front end


def to_json(value: Any, max_string: int = MAX_WIRE_STRING, _depth: int = 0) -> Any:
    """A JSON-safe copy: non-finite floats become None (the wire JSON has no NaN), numpy scalars
    become Python numbers, long strings are cut, anything else becomes its short repr."""
    if value is None or isinstance(value, (bool, str)):
        if isinstance(value, str) and len(value) > max_string:
            return value[: max_string - 1] + "…"
        return value
    if _is_int(value):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if _depth > 8:
        return None
    if isinstance(value, dict):
        return {str(k): to_json(v, max_string, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, max_string, _depth + 1) for v in value]
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return to_json(item(), max_string, _depth + 1)
        except Exception:
            pass
    text = repr(value)
    return text[: max_string - 1] + "…" if len(text) > max_string else text


def wire_event(event: dict) -> dict:
    """An event as the view gets it: tracebacks and full configs stay in Python (fetched on demand)."""
    out = dict(event)
    if out.get("type") == "run_status":
        error = out.pop("error", None)
        out["has_error"] = bool(error)
    elif out.get("type") == "run_created":
        out["settings"] = config_settings(out.pop("config", None))
    return to_json(out)


MAX_SETTINGS = 200


def config_settings(config) -> dict:
    """A run's config as the view needs it: its short leaves under dotted knob names
    (``training_args.num_train_epochs``), so that a knob one run varies (a clone's change) reads
    as the value the others set, not as "default". Long strings, long lists and callables' reprs
    stay in Python with the rest of the config."""
    out: dict = {}

    def walk(value, prefix: str) -> None:
        if len(out) >= MAX_SETTINGS:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{prefix}{k}.")
            return
        key = prefix[:-1]
        if value is None or isinstance(value, (bool, int, float)):
            out[key] = value
        elif isinstance(value, str) and len(value) <= 80:
            out[key] = value
        elif (isinstance(value, list) and len(value) <= 16
              and all(isinstance(x, (str, int, float, bool)) and len(str(x)) <= 40 for x in value)):
            out[key] = value

    if isinstance(config, dict):
        walk(config, "")
    return out


def batch_events(events: list[dict]) -> tuple[list[dict], bool]:
    """Wire form of the leading events that fit one message; ``more`` says some were left."""
    out: list[dict] = []
    size = 0
    for event in events[:MAX_BATCH_EVENTS]:
        wired = wire_event(event)
        size += len(json.dumps(wired, separators=(",", ":")))
        if out and size > MAX_BATCH_BYTES:
            return out, True
        out.append(wired)
    return out, len(events) > len(out)


def reply(request_id: Any, ok: bool, error: str | None = None, **extra: Any) -> dict:
    return {"type": "reply", "request_id": request_id, "ok": ok, "error": error, **extra}
