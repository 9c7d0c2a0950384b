"""The one reducer: the event log folded into a run table.

Every reader of run state goes through here: crash recovery (``launch.resume.restore_runs``),
``get_runs_info`` / ``get_results`` / ``get_timeline``, the panel's snapshot and traceback
requests, the trackers (``tracking/hub.py``), the CLI demo and ``rapidfire bench``. The panel's
front end mirrors the same fold in ``js/src/state.ts``; both are checked against the same
recorded logs and expected tables (``tests/fixtures/events/``).

The event schema (each event type and its fields) is ``events_schema.json`` beside this file:
the one description both sides check the fixtures against (``check_event`` here, ``checkEvent``
in js/test/state_fixtures.test.ts).

Pure: no I/O, no torch, no clock. ``reduce(table, event)`` folds one event into the table in
place and returns it, so a reader that keeps its table folds only the events it has not seen
(``LiveTable`` does that for an ``EventLog``); ``fold(events)`` folds a whole log. The table is
plain JSON data (string run ids as keys), so a table can be saved and folding continued later.

**The x axis.** Every metric point, train and eval, is placed at the run's ``samples_seen``
(training samples consumed when it was measured, cumulative over epochs; a warm clone continues
its parent's count). Runs with different batch sizes, and clones continuing their parent's data
stream, compare on it; TensorBoard/MLflow/Trackio log at that step (``metric_x``) and the panel
plots both charts against it. The optimizer step stays in the table (``completed_steps``) and in
``get_results`` (``step``).

Table::

    {"experiment", "path", "resumed", "ended", "last_seq",
     "runs": {"<id>": run},            # in creation order
     "train_metrics", "eval_metrics",  # metric names, first seen first
     "time": {train, eval, swap, other},   # engine seconds, summed over chunk_done
     "timeline": [chunk_done rows],    # get_timeline
     "points": [metric rows],          # get_results: run_id, split, step, samples_seen, epoch,
                                       # chunk, time (of the event), metrics (finite numbers
                                       # or None)
     "workers": [{worker, node, device, lost}],   # Ray workers (num_workers), first seen first;
                                                  # empty for the in-kernel engine
     "lost_workers": [{worker, node, reason, runs, chunk_lost, workers_left, time, until}]}
                 # until: time of the later `workers` event that listed that name again (a resumed
                 # experiment's new pool reuses w0, w1...), else None: lost to the end

Run (see ``new_run``): status, reason, error (the last failure's traceback; cleared when the run
goes pending/running again), has_error, pruned, its spec (trainer_type, config, knobs, changes,
parent_run_id, warm_start, total_steps, steps_per_epoch, num_chunks, base_*), progress
(completed_steps, samples_seen, chunks_done, last_epoch/last_chunk of the last chunk trained,
next_epoch/next_chunk of the next one), latest/best metrics, series (x = samples_seen), its
time split, the last op, device_seq (the seq that last put it on the device), suggestion (an
open pruning suggestion's reason, suggest mode), worker (the Ray worker that trained its last
chunk; None in the kernel or before its first chunk) and note (the user's latest note, or None).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rapidfire_nb.engine.runs import STATUSES

SCHEMA_PATH = Path(__file__).with_name("events_schema.json")

TIME_KEYS = ("train", "eval", "generate", "swap", "other")
TIMELINE_COLUMNS = ("run_id", "epoch", "chunk", "device", "start", "end", "train_s", "eval_s",
                    "gen_s", "swap_s", "setup_s", "snapshot_s", "checkpoint_s", "other_s",
                    "completed_steps", "samples_seen", "worker", "moved", "hop_s",
                    "tokens", "tokens_per_s", "peak_mem_mb")
_LOWER_IS_BETTER = re.compile(r"loss|perplexity|ppl|error|wer|cer|mse|mae|rmse")


# -- values ------------------------------------------------------------------------------------

def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> float | int | None:
    """A finite number, else None (the wire JSON has no NaN; the view folds them to null too)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def lower_is_better(metric: str) -> bool:
    """Metrics where smaller is better; everything else (accuracy, reward, ...) is maximised."""
    return _LOWER_IS_BETTER.search(metric.lower()) is not None


def metric_x(event: dict) -> int | None:
    """Where a metric event is plotted and tracked: the run's samples seen (see the docstring)."""
    x = event.get("samples_seen")
    return x if _is_int(x) else None


def config_fingerprint(config: dict) -> str:
    """The fingerprint of a logged config; equals ``RunSpec.fingerprint()`` of the spec that
    logged it (same JSON, same hash)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=repr).encode()).hexdigest()


# -- the table ---------------------------------------------------------------------------------

class _Names(list):
    """A table's metric names, in first-seen order, with a set beside them: folding an event
    asks "seen before?" for each of its names, and a list's own ``in`` made the fold quadratic in
    the number of names (a crafted log of 40,000 names took a minute). Still a list to every
    reader (JSON, equality, copies)."""

    def __init__(self, names=()):
        super().__init__(names)
        self._seen = set(self)

    def __contains__(self, name) -> bool:
        return name in self._seen

    def append(self, name) -> None:
        if name not in self._seen:
            self._seen.add(name)
            super().append(name)

    def __deepcopy__(self, memo):
        return _Names(self)

    def __reduce__(self):
        return (_Names, (list(self),))


def time_field(key: str) -> str:
    """The ``chunk_done`` field of a slice of the time split (``gen_s`` for ``generate``)."""
    return "gen_s" if key == "generate" else f"{key}_s"


def new_table() -> dict:
    return {
        "experiment": None, "path": None, "resumed": False, "ended": False, "last_seq": 0,
        "runs": {}, "train_metrics": _Names(), "eval_metrics": _Names(),
        "time": dict.fromkeys(TIME_KEYS, 0.0), "timeline": [], "points": [],
        "workers": [], "lost_workers": [], "sample_prompts": None,
    }


def new_run(run_id: int) -> dict:
    return {
        "run_id": run_id, "created": False,
        "status": "pending", "reason": None, "error": None, "has_error": False, "pruned": False,
        "trainer_type": "", "config": {}, "knobs": {}, "changes": None,
        "parent_run_id": None, "warm_start": False,
        "total_steps": None, "steps_per_epoch": None, "num_chunks": None,
        "base_samples_seen": 0, "base_step": 0, "base_chunk": None,
        "completed_steps": 0, "samples_seen": 0, "chunks_done": 0,
        "last_epoch": None, "last_chunk": None, "next_epoch": 0, "next_chunk": 0,
        "latest": {}, "best": {}, "series": {"train": {}, "eval": {}},
        "time": dict.fromkeys(TIME_KEYS, 0.0), "last_op": None, "device_seq": 0,
        "suggestion": None, "worker": None, "note": None, "generations": [],
    }


def get_run(table: dict, run_id: int) -> dict | None:
    return table["runs"].get(str(run_id))


def runs_by_id(table: dict) -> list[dict]:
    """Every run that has a ``run_created`` event, by id."""
    return sorted((r for r in table["runs"].values() if r["created"]), key=lambda r: r["run_id"])


def _run_for(table: dict, run_id: int) -> dict:
    run = table["runs"].get(str(run_id))
    if run is None:
        run = table["runs"][str(run_id)] = new_run(run_id)
    return run


def reduce(table: dict, event: dict) -> dict:
    """Fold one event into ``table`` (in place) and return it. Unknown event types and fields are
    ignored (a newer engine's log stays readable); malformed fields are skipped, never raised."""
    seq = event.get("seq")
    if _is_int(seq) and seq > table["last_seq"]:
        table["last_seq"] = seq
    kind = event.get("type")
    run_id = event.get("run_id") if _is_int(event.get("run_id")) else None
    if kind == "experiment":
        if isinstance(event.get("name"), str):
            table["experiment"] = event["name"]
        if isinstance(event.get("path"), str):
            table["path"] = event["path"]
        table["resumed"] = event.get("resumed") is True
        table["ended"] = False
    elif kind == "experiment_end":
        table["ended"] = True
    elif kind == "workers":
        _workers(table, event)
    elif kind == "worker_lost":
        _worker_lost(table, event)
    elif run_id is None:
        return table
    elif kind == "run_created":
        _created(_run_for(table, run_id), event)
    elif kind == "run_status":
        _status(_run_for(table, run_id), event, seq)
    elif kind == "metric":
        _metric(table, _run_for(table, run_id), event)
    elif kind == "chunk_done":
        _chunk_done(table, _run_for(table, run_id), event, seq)
    elif kind == "op":
        run = get_run(table, run_id)   # an op on an unknown run (refused) invents no run
        if run is not None:
            run["last_op"] = {"op": _str(event.get("op")) or "?", "accepted": event.get("accepted") is True,
                              "reason": _str(event.get("reason"))}
            # confirmed or ignored (or refused because the run ended): the question is answered
            if event.get("op") in ("confirm_suggestion", "ignore_suggestion"):
                run["suggestion"] = None
    elif kind == "note":
        run = get_run(table, run_id)   # a note on an unknown run invents no run
        text = _str(event.get("text"))
        if run is not None and text is not None:
            run["note"] = text or None
    elif kind == "generation":
        _generation(table, get_run(table, run_id), event)
    elif kind == "pruning_suggested":
        run = get_run(table, run_id)
        if run is not None:
            run["suggestion"] = _str(event.get("reason")) or "the pruner would stop this run"
    return table


def fold(events: Iterable[dict], table: dict | None = None) -> dict:
    """Fold ``events`` (oldest first) into ``table`` (a new one by default)."""
    table = new_table() if table is None else table
    for event in events:
        reduce(table, event)
    return table


def _created(run: dict, ev: dict) -> None:
    run["created"] = True
    if isinstance(ev.get("trainer_type"), str):
        run["trainer_type"] = ev["trainer_type"]
    if isinstance(ev.get("config"), dict):
        run["config"] = copy.deepcopy(ev["config"])
    if isinstance(ev.get("knobs"), dict):
        run["knobs"] = copy.deepcopy(ev["knobs"])
    if isinstance(ev.get("changes"), dict):
        run["changes"] = copy.deepcopy(ev["changes"])
    run["parent_run_id"] = ev["parent_run_id"] if _is_int(ev.get("parent_run_id")) else None
    run["warm_start"] = ev.get("warm_start") is True
    # devices a sharded run trains on (num_gpus, FSDP over a gang of workers); absent: one
    if _is_int(ev.get("devices")) and ev["devices"] > 1:
        run["devices"] = ev["devices"]
    for key in ("total_steps", "steps_per_epoch", "num_chunks"):
        run[key] = ev[key] if _is_int(ev.get(key)) else None
    for key in ("base_samples_seen", "base_step"):
        run[key] = ev[key] if _is_int(ev.get(key)) else 0
    # None when the log predates the field (recovery then asks runs.json)
    run["base_chunk"] = ev["base_chunk"] if _is_int(ev.get("base_chunk")) else None
    run["samples_seen"] = max(run["samples_seen"], run["base_samples_seen"])
    run["completed_steps"] = max(run["completed_steps"], run["base_step"])
    if run["chunks_done"] == 0:
        run["next_chunk"] = run["base_chunk"] or 0


def _status(run: dict, ev: dict, seq: Any) -> None:
    status = ev.get("status")
    if status in STATUSES:
        run["status"] = status
    if status == "running" and _is_int(seq):
        run["device_seq"] = seq
    # the error stays with the run (a deleted failed run keeps its traceback) until it trains
    # again (a retry after a failed write); the wire form carries has_error instead of the text
    error = _str(ev.get("error")) or None
    if error is not None or ev.get("has_error") is True:
        run["error"] = error if error is not None else run["error"]
        run["has_error"] = True
    elif status in ("pending", "running"):
        run["error"], run["has_error"] = None, False
    run["reason"] = _str(ev.get("reason"))
    run["pruned"] = run["status"] == "stopped" and ev.get("pruned") is True


def _metric(table: dict, run: dict, ev: dict) -> None:
    split = "eval" if ev.get("split") == "eval" else "train"
    step = ev.get("step") if _is_int(ev.get("step")) else None
    samples = ev.get("samples_seen") if _is_int(ev.get("samples_seen")) else None
    if step is not None and split == "train" and step > run["completed_steps"]:
        run["completed_steps"] = step
    if samples is not None and samples > run["samples_seen"]:
        run["samples_seen"] = samples
    x = metric_x(ev)
    names = table[f"{split}_metrics"]
    if not isinstance(names, _Names):   # a table rebuilt from JSON or copied by hand
        names = table[f"{split}_metrics"] = _Names(names)
    series = run["series"][split]
    values: dict[str, Any] = {}
    raw = ev.get("metrics") if isinstance(ev.get("metrics"), dict) else {}
    for name, raw_value in raw.items():
        value = _num(raw_value)
        # a metric that is not a number at all (a string, a list) has no curve
        if value is None and raw_value is not None and (isinstance(raw_value, bool)
                                                        or not isinstance(raw_value, (int, float))):
            continue
        names.append(name)   # once: a name seen before is not added again
        values[name] = value
        run["latest"][name] = value
        if value is not None:
            best = run["best"].get(name)
            if best is None or (value < best if lower_is_better(name) else value > best):
                run["best"][name] = value
        if x is not None:
            s = series.setdefault(name, {"x": [], "y": []})
            s["x"].append(x)
            s["y"].append(value)
    table["points"].append({"run_id": run["run_id"], "split": split, "step": step,
                            "samples_seen": samples, "epoch": ev.get("epoch"),
                            "chunk": ev.get("chunk"), "time": _num(ev.get("time")),
                            "metrics": values})


def _chunk_done(table: dict, run: dict, ev: dict, seq: Any) -> None:
    if _is_int(seq):
        run["device_seq"] = seq
    for key in ("completed_steps", "total_steps", "samples_seen", "chunks_done"):
        if _is_int(ev.get(key)):
            run[key] = ev[key]
    epoch, chunk = ev.get("epoch"), ev.get("chunk")
    if _is_int(epoch) and _is_int(chunk):
        run["last_epoch"], run["last_chunk"] = epoch, chunk
        if run["num_chunks"] is not None and chunk + 1 >= run["num_chunks"]:
            run["next_epoch"], run["next_chunk"] = epoch + 1, 0
        else:
            run["next_epoch"], run["next_chunk"] = epoch, chunk + 1
    # The engine logs moved=True whenever a run is new to the worker, its very first chunk too:
    # that one started there, it did not move (nothing trained before, no checkpoint travelled).
    moved = ev.get("moved") is True and run["worker"] is not None
    if isinstance(ev.get("worker"), str):
        run["worker"] = ev["worker"]
    for key in TIME_KEYS:
        v = _num(ev.get(time_field(key)))
        if v is not None and v > 0:
            run["time"][key] += v
            table["time"][key] += v
    row = {c: ev.get(c) for c in TIMELINE_COLUMNS}
    row["moved"] = moved
    table["timeline"].append(row)


def _generation(table: dict, run: dict | None, ev: dict) -> None:
    """A run's answers to the sample prompts after one chunk (a malformed event is skipped)."""
    texts, prompts = ev.get("texts"), ev.get("prompts")
    if run is None or not _strings(texts) or not _strings(prompts) or len(texts) != len(prompts):
        return
    refs = ev.get("references")
    refs = [r if isinstance(r, str) else None for r in refs] if isinstance(refs, list) \
        and len(refs) == len(prompts) else [None] * len(prompts)
    last = table["sample_prompts"]
    if last is None or last["prompts"] != prompts or last["references"] != refs:
        last = table["sample_prompts"] = {"prompts": list(prompts), "references": refs}
    # each answer keeps the prompts it answered (shared, not copied): a resume may ask others
    run["generations"].append({k: ev[k] if _is_int(ev.get(k)) else None
                               for k in ("epoch", "chunk", "step", "samples_seen")}
                              | {"texts": list(texts), "prompts": last["prompts"],
                                 "references": last["references"]})


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _worker_row(table: dict, name: str) -> dict:
    for row in table["workers"]:
        if row["worker"] == name:
            return row
    row = {"worker": name, "node": None, "device": None, "lost": False}
    table["workers"].append(row)
    return row


def _workers(table: dict, ev: dict) -> None:
    # logged at each loop start and after replacements: it lists the live workers; earlier ones
    # stay in the table (a lost worker keeps its row, flagged)
    for info in ev.get("workers") if isinstance(ev.get("workers"), list) else []:
        if not isinstance(info, dict) or not isinstance(info.get("worker"), str):
            continue
        row = _worker_row(table, info["worker"])
        for key in ("node", "device"):
            if isinstance(info.get(key), str):
                row[key] = info[key]
        if row["lost"]:
            # a resumed experiment's new pool names its workers w0, w1... again: listed means
            # live; the loss stays in lost_workers, ended here (log order, not the clocks)
            row["lost"] = False
            for loss in table["lost_workers"]:
                if loss["worker"] == row["worker"] and loss["until"] is None:
                    loss["until"] = _num(ev.get("time"))
                    if loss["until"] is None:
                        loss["until"] = loss["time"] if loss["time"] is not None else 0.0


def _worker_lost(table: dict, ev: dict) -> None:
    name = _str(ev.get("worker"))
    if name is None:
        return
    row = _worker_row(table, name)    # a worker that died in its constructor was never listed
    row["lost"] = True
    node = _str(ev.get("node")) or row["node"]
    runs = [r for r in ev.get("runs") if _is_int(r)] if isinstance(ev.get("runs"), list) else []
    lost = ev.get("chunk_lost")
    chunk_lost = ({k: lost[k] for k in ("run_id", "epoch", "chunk")}
                  if isinstance(lost, dict) and all(_is_int(lost.get(k)) for k in ("run_id", "epoch", "chunk"))
                  else None)
    table["lost_workers"].append({
        "worker": name, "node": node, "reason": _str(ev.get("reason")), "runs": runs,
        "chunk_lost": chunk_lost,
        "workers_left": ev["workers_left"] if _is_int(ev.get("workers_left")) else None,
        "time": _num(ev.get("time")), "until": None})


# -- the schema --------------------------------------------------------------------------------

_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "int": _is_int,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def check_event(event: Any, schema: dict) -> list[str]:
    """What in ``event`` breaks the schema (an empty list when nothing does)."""
    if not isinstance(event, dict):
        return [f"not an object: {type(event).__name__}"]
    problems = []
    spec = schema["events"].get(event.get("type"))
    if spec is None:
        return [f"unknown event type {event.get('type')!r}"]
    fields = {**schema["common"], **spec["fields"]}
    for name, field in fields.items():
        if name not in event:
            if field.get("required"):
                problems.append(f"{event['type']}: missing {name!r}")
            continue
        value = event[name]
        if not any(_TYPE_CHECKS[t](value) for t in field["type"]):
            problems.append(f"{event['type']}.{name}: {value!r:.60} is not {'/'.join(field['type'])}")
        elif "enum" in field and value not in field["enum"]:
            problems.append(f"{event['type']}.{name}: {value!r} is not one of {field['enum']}")
    return problems


# -- automl.json -------------------------------------------------------------------------------

_DECISION = {"run_id": "int", "rung": "int", "rank": "int", "of": "int", "reason": "string"}


def check_automl_state(data: Any, path: Any) -> dict | None:
    """``automl.json`` (the pruning driver's state, tuning/driver.py) checked field by
    field: a ``MetadataError`` naming the file and the field, or the data (None: no file)."""
    from rapidfire_nb.errors import MetadataError

    if data is None:
        return None

    def bad(field: str, why: str):
        raise MetadataError(f"{path}: field {field!r} {why}; it was left as it is")

    def decision(field: str, d: Any) -> None:
        if not isinstance(d, dict) or set(d) != set(_DECISION):
            bad(field, f"must be an object with exactly {', '.join(_DECISION)}")
        for key, kind in _DECISION.items():
            if not _TYPE_CHECKS[kind](d[key]) or (kind == "int" and d[key] < (key == "run_id")):
                bad(f"{field}.{key}", f"is {d[key]!r:.40}, not a {'run id' if key == 'run_id' else kind}")

    def run_keyed(field: str, obj: Any, check) -> None:
        if obj is None:
            return
        if not isinstance(obj, dict):
            bad(field, "must be an object of run id -> value")
        for key, value in obj.items():
            if not (key.isdigit() and int(key) >= 1):
                bad(f"{field}.{key}", "is not a run id (a positive integer)")
            check(f"{field}.{key}", value)

    def count(field: str, v: Any) -> None:
        if not _is_int(v) or v < 0:
            bad(field, f"is {v!r:.40}, not a count (an integer >= 0)")

    if _deeper_than(data, 12):
        bad("(file)", "is nested too deeply")
    for field in ("suggestions", "pruned", "dismissed"):
        run_keyed(field, data.get(field), decision)
    run_keyed("seen", data.get("seen"), count)
    if data.get("objective_error") is not None and not isinstance(data["objective_error"], str):
        bad("objective_error", "must be a string or null")
    policy = data.get("policy")
    if policy is not None:
        if not isinstance(policy, dict) or not isinstance(policy.get("members"), list) \
                or not isinstance(policy.get("decided"), list) or not _is_int(policy.get("added")):
            bad("policy", "must be an object with 'added' (int), 'members' and 'decided' (arrays)")
        for i, m in enumerate(policy["members"]):
            where = f"policy.members[{i}]"
            if not isinstance(m, dict):
                bad(where, "is not an object")
            for key, kind in (("run_id", "int"), ("chunks", "int"), ("live", "bool"),
                              ("finished", "bool"), ("values", "object")):
                if key not in m or not _TYPE_CHECKS[kind](m[key]):
                    bad(f"{where}.{key}", f"is missing or not {kind}")
            count(f"{where}.chunks", m["chunks"])
            for k, v in m["values"].items():
                if not k.isdigit() or (v is not None and _num(v) is None):
                    bad(f"{where}.values.{k}", "must map a rung to a finite number or null")
            if m.get("pruned") is not None:
                decision(f"{where}.pruned", m["pruned"])
        for i, d in enumerate(policy["decided"]):
            if not (isinstance(d, list) and len(d) == 2 and isinstance(d[1], list)
                    and all(_is_int(r) for r in d[1])
                    and (d[0] is None or isinstance(d[0], (str, int)))):
                bad(f"policy.decided[{i}]", "must be [bracket, [run ids]]")
    return data


def _deeper_than(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        if children and depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


# -- an incrementally folded log ---------------------------------------------------------------

class LiveTable:
    """The table of an ``EventLog`` (anything with ``since(seq)``), folded as events arrive:
    each ``read`` folds only what was appended since the last one (O(new events)).

    ``read(fn)`` runs ``fn(table)`` under the table's lock, so what it reads is one consistent
    state even while another thread folds; ``fn`` must not keep references into the table.
    """

    def __init__(self, events: Any):
        self._events = events
        self._lock = threading.Lock()
        self._table = new_table()

    def read(self, fn: Callable[[dict], Any] = copy.deepcopy) -> Any:
        with self._lock:
            for event in self._events.since(self._table["last_seq"]):
                reduce(self._table, event)
            return fn(self._table)
