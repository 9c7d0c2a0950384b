"""The ``%rapidfire`` line magic: steer the kernel's current experiment from a cell.

    %load_ext rapidfire
    %rapidfire status                       # compact table of runs (and the Ray workers, if any)
    %rapidfire stop 2
    %rapidfire resume 2
    %rapidfire confirm 3     (pruner_mode="suggest": or ignore 3)
    %rapidfire delete 3
    %rapidfire clone 1 lr=5e-4 lora_dropout=0.05 --warm-start
    %rapidfire knobs 1                      # what a clone of run 1 may change
    %rapidfire panel | tensorboard | results | help

Everything typed here is data, never code: values are read with ``json.loads`` and then
``ast.literal_eval`` (literals only), and a mistake prints one line naming it instead of a
traceback; a refused command changes nothing.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import sys
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class, no_var_expand

from rapidfire_nb.errors import RapidFireError

USAGE = """\
%rapidfire <command> [arguments]   (acts on the kernel's current Experiment)

  panel                         show the live control panel
  status                        compact table of the runs (best eval loss first once every
                                live run has one, as the panel; run order until then), the ops
                                still queued for the next chunk boundary; with Ray workers
                                (num_workers) also each worker, its node and device, the run it
                                trains and its log file
  stop ID                       stop a run at its next chunk boundary (its checkpoint stays)
  resume ID                     resume a stopped run from its checkpoint
  delete ID                     remove a run for good (its metrics stay, marked deleted)
  confirm ID                    pruner_mode="suggest": stop run ID as the pruner suggests
  ignore ID                     pruner_mode="suggest": keep run ID training (not judged again)
  clone ID key=value ... [--warm-start]
                                new run from run ID's config plus the changes; keys are dotted
                                (training_args.learning_rate) or short (learning_rate, lr) names
                                of the run's knobs; values are JSON or Python literals
                                (5e-4, 16, true, "cosine", ["q_proj","v_proj"]); --warm-start
                                starts from run ID's current weights and data position
  knobs ID                      the knobs a clone of run ID may change, with their values
  tensorboard                   open TensorBoard on this experiment's logs
  results                       every logged metric (long form DataFrame)
  help                          this text"""

# Short names people type for the knobs they change most often; shared with the config errors'
# "Did you mean" (automl)
from rapidfire_nb.automl._backend import KNOB_ALIASES as ALIASES  # noqa: E402
WARM_FLAGS = ("--warm-start", "--warm_start", "--warm")
_SECTIONS = ("training_args", "peft_config", "generation_config", "model_kwargs")
_MAX_VALUE_CHARS = 10_000


class MagicError(Exception):
    """A malformed or refused command; its message is printed as one line."""


# -- parsing (pure functions, tested on their own) ---------------------------------------------

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


# -- output ------------------------------------------------------------------------------------

def status_table(exp, info=None):
    """The compact run table: id, status, the knobs that vary, progress, last eval loss, lineage.

    Rows come in the panel's default order (js/src/state.ts effectiveSort): best eval loss first
    once every live run (not deleted, not pruned) has one, the deleted and pruned ones after them;
    in run order until then. ``info``: ``exp.get_runs_info()`` (read here when not given)."""
    import pandas as pd

    if info is None:
        info = exp.get_runs_info()
    if len(info) == 0:
        return pd.DataFrame(columns=["status"])
    fixed = {"run_id", "status", "completed_steps", "total_steps", "samples_seen", "chunks_done",
             "epoch", "parent_run_id", "warm_start", "eval_loss", "error"}
    knob_cols = [c for c in info.columns if c not in fixed]
    num_chunks = getattr(getattr(exp, "engine", None), "num_chunks", None)
    positions = _last_chunk_positions(exp)
    rows = []
    for _, r in info.iterrows():
        row = {"run_id": int(r.run_id), "status": r.status}
        for c in knob_cols:
            row[c] = r[c]
        if "pruning" in row and (row["pruning"] is None or _isna(row["pruning"])):
            row["pruning"] = ""      # not pruned: an empty cell, as for error
        if "worker" in row and not isinstance(row["worker"], str):
            row["worker"] = "-"      # no chunk trained yet: no worker (pandas would print NaN)
        row["steps"] = f"{int(r.completed_steps)}/{int(r.total_steps)}"
        epoch, chunk, run_chunks = positions.get(int(r.run_id), (None, None, None))
        row["progress"] = _chunk_text(epoch, chunk, run_chunks or num_chunks, r.status,
                                      bool(r.warm_start), r.parent_run_id)
        row["eval_loss"] = None if r.eval_loss is None or pd.isna(r.eval_loss) else round(float(r.eval_loss), 4)
        parent = r.parent_run_id
        row["from"] = "" if parent is None or pd.isna(parent) else (
            f"{int(parent)} ({'warm' if r.warm_start else 'cold'})")
        err = r.error
        row["error"] = "" if not isinstance(err, str) or not err else _last_line(err)
        rows.append(row)
    ranks = _ranking(exp)
    order = best_first([row["run_id"] for row in rows], ranks)
    return pd.DataFrame(rows).set_index("run_id").loc[order]


def _ranking(exp) -> dict[int, tuple[float | None, bool]]:
    """run_id -> (best eval loss so far, folded: deleted or pruned), from the folded run table."""
    if getattr(exp, "events", None) is None or not hasattr(exp, "_state"):
        return {}
    return exp._state().read(lambda table: {
        run["run_id"]: (run["best"].get("eval_loss"), run["status"] == "deleted" or bool(run["pruned"]))
        for run in table["runs"].values()})


def best_first(run_ids: list[int], ranks: dict[int, tuple[float | None, bool]]) -> list[int]:
    """The panel's "auto" order: once every live run has a finite best eval loss, live runs by it
    (lowest first, ties by id), then the deleted and pruned ones by id; else ``run_ids`` as given
    (a ranking with gaps would put unevaluated runs in arbitrary places)."""
    def best(rid):
        value = ranks.get(rid, (None, False))[0]
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None

    folded = {rid for rid in run_ids if ranks.get(rid, (None, False))[1]}
    live = [rid for rid in run_ids if rid not in folded]
    if not live or any(best(rid) is None for rid in live):
        return list(run_ids)
    return sorted(live, key=lambda rid: (best(rid), rid)) + sorted(folded)


def queued_ops_line(exp) -> str | None:
    """The ops accepted but not applied yet (they apply at the run's next chunk boundary), from
    the live engine's queue; None when nothing is queued or the engine is busy."""
    engine = getattr(exp, "engine", None)
    lock = getattr(engine, "lock", None)
    if engine is None or lock is None or not hasattr(engine, "queued_ops"):
        return None
    if not lock.acquire(timeout=1.0):
        return None
    try:
        ops = list(engine.queued_ops)
    finally:
        lock.release()
    words = []
    for op in ops:
        if op.kind == "clone":
            words.append(f"clone of {op.run_id} -> run {op.new_run_id}"
                         + (" (warm start)" if op.warm_start else ""))
        elif op.kind == "add":
            words.append(f"new run {op.run_id}")   # AutoML's next trial (tuning.py)
        else:
            words.append(f"{op.kind} {op.run_id}" + (f" ({op.reason})" if op.reason else ""))
    if not words:
        return None
    return "queued (applied at the next chunk boundary): " + ", ".join(words)


def _last_chunk_positions(exp) -> dict[int, tuple[int | None, int | None, int | None]]:
    """run_id -> (epoch, chunk, num_chunks) of its last ``chunk_done`` event: the position of that
    chunk in the run's data stream, which is what the panel shows. A warm clone reads its parent's
    stream from where the parent was, so its count of chunks done says nothing about this.
    Read from the Experiment's folded run table (engine/state.py), not by rescanning the log."""
    if getattr(exp, "events", None) is None or not hasattr(exp, "_state"):
        return {}
    return exp._state().read(lambda table: {
        run["run_id"]: (run["last_epoch"], run["last_chunk"], run["num_chunks"])
        for run in table["runs"].values()})


def _chunk_text(epoch: int | None, chunk: int | None, num_chunks: int | None, status: str = "",
                warm_start: bool = False, parent: Any = None) -> str:
    """The panel's wording (js/src/state.ts chunkText): "epoch 2 · chunk 4/4" for the last chunk
    trained, at its position in the data stream."""
    if epoch is None or chunk is None:
        if status in ("pending", "running"):
            if warm_start and parent is not None and not _isna(parent):
                return f"warm start from run {int(parent)} · first chunk next"
            return "first chunk next"
        return "no chunk trained"
    of = f"/{num_chunks}" if num_chunks else ""
    return f"epoch {int(epoch) + 1} · chunk {int(chunk) + 1}{of}"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def worker_logs(events) -> dict[str, str]:
    """worker -> its log file (``worker.log``, on the worker's node), from the ``workers`` events;
    a later listing of the same name (a replacement, a resumed session) wins."""
    logs: dict[str, str] = {}
    for ev in events:
        if ev.get("type") != "workers" or not isinstance(ev.get("workers"), list):
            continue
        for info in ev["workers"]:
            if isinstance(info, dict) and isinstance(info.get("worker"), str) and isinstance(info.get("log"), str):
                logs[info["worker"]] = info["log"]
    return logs


def worker_lines(table: dict, now: dict[str, int] | None = None, live: bool = True,
                 starting: int = 0, logs: dict[str, str] | None = None) -> list[str]:
    """What ``status`` says about the Ray workers (``Experiment(num_workers=...)``), from the folded
    run table (engine/state.py): one line per worker with its node and device, the run it trains
    now (``now``: worker -> run id, from the live engine) or trained last, and why a lost one was
    lost. ``live=False`` (no engine running: resumed before run_fit, or ended): the workers are the
    last session's, and the header says so. ``starting``: the live engine's number of workers,
    which are still starting while the log names none. ``logs``: worker -> its log file
    (``worker_logs``), shown for live workers and for lost ones (a worker that ends normally
    removes its log; a lost one keeps it). No lines for the in-kernel engine."""
    workers = table.get("workers") or []
    if not workers:
        if live and starting:
            return [f"workers: {starting} starting (Ray workers import torch and load the model "
                    "before the first chunk: the runs stay pending until then)"]
        return []
    now = now if live and now else {}
    runs = {r["run_id"]: r for r in table["runs"].values()}
    last: dict[str, dict] = {}
    for row in table["timeline"]:
        if isinstance(row.get("worker"), str):
            last[row["worker"]] = row
    losses: dict[str, dict] = {}
    for loss in table.get("lost_workers") or []:
        losses[loss["worker"]] = loss
    lost = sum(1 for w in workers if w["lost"])
    head = (f"workers: {len(workers)}" if live else f"workers of the last session (not running now): {len(workers)}"
            ) + (f" ({lost} lost)" if lost else "")
    cells = []
    for w in workers:
        name = w["worker"]
        what = []
        if name in now and not w["lost"]:
            what.append(f"training run {now[name]}")
        row = last.get(name)
        if row is not None:
            run = runs.get(row["run_id"], {})
            epoch, chunk = row.get("epoch"), row.get("chunk")
            # the rows are copied from the log as they are: a damaged epoch/chunk is left out
            where = (f" ({_chunk_text(epoch, chunk, run.get('num_chunks'))})" if _int(epoch) and _int(chunk)
                     else "")
            what.append(f"last trained run {row['run_id']}{where}")
        elif name not in now:
            what.append("no chunk trained yet")
        if w["lost"]:
            loss = losses.get(name, {})
            # the panel's notice in short (js/src/workers.ts workerLostNotice)
            moved, left, chunk = loss.get("runs") or [], loss.get("workers_left"), loss.get("chunk_lost")
            why = _reason_text(loss.get("reason") or "")
            gone = ["LOST" + (f": {why}" if why else "")]
            if moved:
                ids = f"run{'s' if len(moved) > 1 else ''} {', '.join(map(str, moved))}"
                gone.append(f"{ids} stopped (no worker left)" if left == 0 else
                            f"{ids} continue{'' if len(moved) > 1 else 's'} on the other workers")
            if chunk and left != 0:
                gone.append(f"run {chunk['run_id']}'s chunk {chunk['chunk'] + 1} (epoch {chunk['epoch'] + 1}) "
                            "is trained again")
            what[:0] = gone
        node = f"node {w['node']}" if w.get("node") else "node ?"
        text = "; ".join(what)
        if logs and name in logs and (live or w["lost"]):
            text += f"  log {logs[name]}"
        cells.append((name, node, w.get("device") or "?", text))
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return [head] + ["  " + "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3] for c in cells]


def _reason_text(reason: str) -> str:
    """A Ray error in one line: its type and its last line ("ActorDiedError: ... killed by ...")."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    kind, _, _ = lines[0].partition(":")
    last = lines[-1]
    if len(lines) > 1 and " " not in kind:
        # RayTaskError(ValueError) ... ValueError: boom -> RayTaskError(ValueError): boom
        inner, sep, rest = last.partition(":")
        if sep and " " not in inner and (inner == kind or kind.endswith(f"({inner})")):
            last = rest.strip()
        last = f"{kind}: {last}"
    text = last.rstrip(".")
    return text if len(text) <= 100 else text[:97] + "..."


def _training_now(exp) -> dict[str, int]:
    """worker -> run id of the chunk in flight there, from a live Ray worker engine (else {})."""
    engine = getattr(exp, "engine", None)
    lock = getattr(engine, "lock", None)
    if engine is None or lock is None or not hasattr(engine, "inflight"):
        return {}
    if not lock.acquire(timeout=1.0):   # the engine is busy: say what the log says
        return {}
    try:
        return {f.slot.name: rid for rid, f in engine.inflight.items()}
    finally:
        lock.release()


def _isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= 80 else line[:77] + "..."


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


# -- the magic ---------------------------------------------------------------------------------

@magics_class
class RapidFireMagics(Magics):
    """``%rapidfire``: see ``USAGE``."""

    # no_var_expand: IPython would otherwise evaluate {expr} and $name in the line as code
    @no_var_expand
    @line_magic
    def rapidfire(self, line: str = ""):
        try:
            return self._dispatch(line)
        except MagicError as exc:
            _say_error(str(exc))
        except RapidFireError as exc:
            # refusals from the Experiment already say what was wrong
            _say_error(str(exc))
        except Exception as exc:  # a magic never shows a traceback; the message names the cause
            _say_error(f"{type(exc).__name__}: {exc}")
        return None

    def _dispatch(self, line: str):
        tokens = split_args(line or "")
        if not tokens or tokens[0] in ("help", "-h", "--help", "?"):
            if len(tokens) > 1:
                raise MagicError("'help' takes no arguments")
            print(USAGE)
            return None
        command, args = tokens[0], tokens[1:]
        handler = getattr(self, f"_cmd_{command}", None)
        if handler is None:
            close = difflib.get_close_matches(command, COMMANDS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise MagicError(f"unknown command {command!r}{hint} (commands: {', '.join(COMMANDS)})")
        return handler(args)

    # each handler gets the tokens after the command name
    def _cmd_panel(self, args):
        _no_args("panel", args)
        from IPython.display import display

        display(_experiment().panel())

    def _cmd_status(self, args):
        _no_args("status", args)
        exp = _experiment()
        store = getattr(exp, "store", None)
        events_path = getattr(store, "events_path", None)
        if isinstance(events_path, Path) and not events_path.exists():
            # the folder (or its log) was removed under the live Experiment: what memory holds is stale
            where = getattr(exp, "path", events_path.parent)
            print(f"experiment {exp.name!r}: its folder {where} no longer exists (deleted?) or lost its "
                  "events.jsonl; nothing to show or continue", file=sys.stderr)
            return None
        table = status_table(exp)
        statuses: list[str] = []
        if getattr(exp, "events", None) is not None and hasattr(exp, "_state"):
            # ask the engine first, then read the table: never hold the table's lock while waiting
            # for the engine's (its loop holds that one while an AutoML hook reads the table)
            now = _training_now(exp)
            engine = getattr(exp, "engine", None)
            pool = getattr(engine, "pool", None)
            starting = getattr(pool, "n", 0) if isinstance(getattr(pool, "n", None), int) else 0
            logs = worker_logs(exp.events.since(0))
            lines, statuses = exp._state().read(lambda t: (
                worker_lines(t, now, live=engine is not None and not t.get("ended"), starting=starting,
                             logs=logs),
                [str(r.get("status")) for r in t["runs"].values()]))
            if lines:
                print("\n".join(lines))
        queued = queued_ops_line(exp)
        if queued:
            print(queued)
        if len(table) == 0:
            if statuses and getattr(exp, "engine", None) is None:
                # resume=True before run_fit: the log knows the runs, the engine is not started
                open_ = sum(1 for st in statuses if st in ("pending", "running", "stopped"))
                counts = ", ".join(f"{statuses.count(st)} {st}" for st in dict.fromkeys(statuses))
                if open_:
                    print(f"experiment {exp.name!r} has {len(statuses)} run(s) in its log ({counts}); call "
                          "exp.run_fit(...) with the original arguments to continue them")
                else:
                    print(f"experiment {exp.name!r} has {len(statuses)} run(s) in its log, none left to "
                          f"train ({counts}); exp.get_results() and exp.get_runs_info() read them")
            else:
                print(f"experiment {exp.name!r} has no runs yet (call exp.run_fit(...))")
            return None
        return table

    def _cmd_stop(self, args):
        rid = _one_id("stop", args)
        _experiment().stop(rid)
        print(f"run {rid}: stop requested (takes effect at its next chunk boundary)")

    def _cmd_resume(self, args):
        rid = _one_id("resume", args)
        _experiment().resume(rid)
        print(f"run {rid}: resumed (continues from its checkpoint)")

    def _cmd_delete(self, args):
        rid = _one_id("delete", args)
        _experiment().delete(rid)
        print(f"run {rid}: deleted (its metrics stay, marked deleted)")

    def _cmd_confirm(self, args):
        rid = _one_id("confirm", args)
        stopped = _experiment().apply_suggestions([rid])
        print(f"run {rid}: stop requested as the pruner suggested" if stopped else
              f"run {rid}: it ended before the confirm; nothing to stop")

    def _cmd_ignore(self, args):
        rid = _one_id("ignore", args)
        ignored = _experiment().dismiss_suggestions([rid])
        print(f"run {rid}: suggestion ignored; it trains on and is not judged again" if ignored else
              f"run {rid}: it ended before the answer; nothing to ignore")

    def _cmd_clone(self, args):
        exp = _experiment()
        run_id, changes, warm = parse_clone(args, exp.editable_knobs)
        new_id = exp.clone_modify(run_id, changes, warm_start=warm)
        desc = ", ".join(f"{k.rsplit('.', 1)[-1] if k.count('.') == 1 else k}={_fmt(v)}"
                         for k, v in changes.items())
        how = "warm start from its current weights" if warm else "cold start"
        print(f"run {new_id}: clone of run {run_id} with {desc} ({how})")

    def _cmd_knobs(self, args):
        rid = _one_id("knobs", args)
        knobs = _experiment().editable_knobs(rid)
        width = max((len(k) for k in knobs), default=0)
        print(f"knobs of run {rid} (change them with %rapidfire clone {rid} key=value ...):")
        for k, v in knobs.items():
            print(f"  {k.ljust(width)}  {_fmt(v)}")

    def _cmd_tensorboard(self, args):
        _no_args("tensorboard", args)
        return _experiment().tensorboard()

    def _cmd_results(self, args):
        _no_args("results", args)
        return _experiment().get_results()


COMMANDS = ["panel", "status", "stop", "resume", "delete", "confirm", "ignore", "clone", "knobs", "tensorboard",
            "results", "help"]


def _say_error(message: str) -> None:
    # one line: the cause, never a traceback
    print(f"%rapidfire: {' '.join(message.split())}", file=sys.stderr)


def _no_args(command: str, args: list[str]) -> None:
    if args:
        raise MagicError(f"'{command}' takes no arguments, got {' '.join(args)!r}")


def _one_id(command: str, args: list[str]) -> int:
    if len(args) > 1:
        raise MagicError(f"'{command}' takes one run id, got {' '.join(args)!r}")
    return parse_run_id(args[0] if args else None, command)


def _experiment():
    from rapidfire_nb.experiment import current_experiment

    exp = current_experiment()
    if exp is None:
        raise MagicError("no experiment in this kernel: create one with "
                         "exp = Experiment('name') and call exp.run_fit(...)")
    return exp


def load_ipython_extension(ipython) -> None:
    """``%load_ext rapidfire`` (or ``rapidfire_nb``): register ``%rapidfire``."""
    from rapidfire_nb._quiet import import_peft_quietly

    import_peft_quietly()
    ipython.register_magics(RapidFireMagics)


def unload_ipython_extension(ipython) -> None:
    line_magics = ipython.magics_manager.magics.get("line", {})
    line_magics.pop("rapidfire", None)
    ipython.magics_manager.registry.pop("RapidFireMagics", None)
