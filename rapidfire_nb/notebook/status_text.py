"""What ``%rapidfire status`` prints: the runs table (best first, as the panel), the ops still
queued, the Ray workers' lines, each run's own progress in the panel's words."""

from __future__ import annotations

import json
import math
from typing import Any

from rapidfire_nb.experiment_view import ExperimentView, view_of


def status_table(exp, info=None):
    """The compact run table: id, status, the knobs that vary, progress, last eval loss, lineage.

    Rows come in the panel's default order (js/src/table.ts effectiveSort): best eval loss first
    once every live run (not deleted, not pruned) has one, the deleted and pruned ones after them;
    in run order until then. ``exp``: an Experiment or its view; ``info``: ``exp.get_runs_info()``
    (read here when not given)."""
    import pandas as pd

    view = view_of(exp)
    if info is None:
        info = view.get_runs_info()
    if len(info) == 0:
        return pd.DataFrame(columns=["status"])
    fixed = {"run_id", "status", "completed_steps", "total_steps", "samples_seen", "chunks_done",
             "epoch", "parent_run_id", "warm_start", "eval_loss", "error"}
    knob_cols = [c for c in info.columns if c not in fixed]
    num_chunks = view.num_chunks
    plans = _run_plans(view)
    rows = []
    for _, r in info.iterrows():
        row = {"run_id": int(r.run_id), "status": r.status}
        for c in knob_cols:
            row[c] = r[c]
        for col in ("pruning", "note"):   # not pruned, no note: an empty cell, as for error
            if col in row and (row[col] is None or _isna(row[col])):
                row[col] = ""            # (pandas would print None)
        if "worker" in row and not isinstance(row["worker"], str):
            row["worker"] = "-"      # no chunk trained yet: no worker (pandas would print NaN)
        plan = plans.get(int(r.run_id))
        if plan is None:    # no folded table (a read of get_runs_info alone): the engine's counters
            plan = {"completed_steps": int(r.completed_steps), "total_steps": int(r.total_steps),
                    "base_step": 0, "steps_per_epoch": None, "last_epoch": None, "last_chunk": None,
                    "num_chunks": None, "base_chunk": None}
        done, total = _own_steps(plan)
        row["steps"] = f"{done}/{total}" if total is not None else str(done)
        row["progress"] = _progress_text(plan, r.status, bool(r.warm_start), r.parent_run_id,
                                         num_chunks)
        row["eval_loss"] = None if r.eval_loss is None or pd.isna(r.eval_loss) else round(float(r.eval_loss), 4)
        parent = r.parent_run_id
        row["from"] = "" if parent is None or pd.isna(parent) else (
            f"{int(parent)} ({'warm' if r.warm_start else 'cold'}"
            + (f", {_data_start_text(plan, num_chunks)}" if r.warm_start and plan.get("base_chunk") is not None
               else "") + ")")
        err = r.error
        row["error"] = "" if not isinstance(err, str) or not err else _last_line(err)
        rows.append(row)
    ranks = _ranking(view)
    order = best_first([row["run_id"] for row in rows], ranks)
    return pd.DataFrame(rows).set_index("run_id").loc[order]


def _ranking(view: ExperimentView) -> dict[int, tuple[float | None, bool]]:
    """run_id -> (best eval loss so far, folded: deleted or pruned), from the folded run table."""
    if not view.has_table:
        return {}
    return view.read_table(lambda table: {
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
    the live engine's queue; None when nothing is queued or the engine is busy. ``exp``: an
    Experiment or its view."""
    ops = view_of(exp).queued_ops(timeout=1.0)
    if ops is None:
        return None
    words = []
    for op in ops:
        if op.kind == "clone":
            words.append(f"clone of {op.run_id} -> run {op.new_run_id}"
                         + (" (warm start)" if op.warm_start else ""))
        elif op.kind == "add":
            words.append(f"new run {op.run_id}")   # AutoML's next trial (rapidfire_nb.tuning)
        else:
            words.append(f"{op.kind} {op.run_id}" + (f" ({op.reason})" if op.reason else ""))
    if not words:
        return None
    return "queued (applied at the next chunk boundary): " + ", ".join(words)


_PLAN_KEYS = ("completed_steps", "total_steps", "base_step", "steps_per_epoch", "last_epoch",
              "last_chunk", "num_chunks", "base_chunk")


def _run_plans(view: ExperimentView) -> dict[int, dict]:
    """run_id -> the counters the panel's progress is made of (its step counters, where a warm
    clone's data starts, steps per epoch, the last chunk trained), from the Experiment's folded
    run table (engine/state.py), not by rescanning the log."""
    if not view.has_table:
        return {}
    return view.read_table(lambda table: {
        run["run_id"]: {k: run.get(k) for k in _PLAN_KEYS} for run in table["runs"].values()})


def _own_steps(plan: dict) -> tuple[int, int | None]:
    """The run's own optimizer steps, 0 to its total (js/src/format.ts ownSteps): a warm clone's
    engine counters start at its parent's data position, which is not steps it trained."""
    base = plan.get("base_step") or 0
    done = max(0, int(plan.get("completed_steps") or 0) - base)
    total = plan.get("total_steps")
    return done, (max(0, int(total) - base) if _int(total) else None)


def _own_epoch(plan: dict) -> tuple[int, int] | None:
    """(epoch 1-based, epochs) of the run's own schedule (js/src/format.ts ownEpoch), when known."""
    done, total = _own_steps(plan)
    per_epoch = plan.get("steps_per_epoch")
    if not _int(per_epoch) or per_epoch <= 0 or total is None or total <= 0:
        return None
    epochs = max(1, math.ceil(total / per_epoch))
    return min(epochs, max(1, math.ceil(done / per_epoch))), epochs


def _progress_text(plan: dict, status: str, warm_start: bool, parent: Any,
                   num_chunks: int | None = None) -> str:
    """The panel's wording (js/src/format.ts chunkText): "epoch 1/3 · chunk 2/4", the run's own
    epoch of its schedule and the chunk of data it trained last; before any, what it waits for."""
    epoch, chunk = plan.get("last_epoch"), plan.get("last_chunk")
    if not _int(epoch) or not _int(chunk):
        return _chunk_text(None, None, None, status, warm_start, parent)
    n = plan.get("num_chunks") or num_chunks
    where = f"chunk {int(chunk) + 1}" + (f"/{n}" if n else "")
    own = _own_epoch(plan)
    # without the run's plan (an older log), the epoch of the data stream
    return f"epoch {own[0]}/{own[1]} · {where}" if own else f"epoch {int(epoch) + 1} · {where}"


def _data_start_text(plan: dict, num_chunks: int | None = None) -> str:
    """"data from chunk 3/4": where a warm clone's data begins (js/src/format.ts dataStartText);
    the log's ``base_chunk`` is that chunk (0-based), the one after the parent's last."""
    n = plan.get("num_chunks") or num_chunks
    return f"data from chunk {int(plan['base_chunk']) + 1}" + (f"/{n}" if n else "")


def _chunk_text(epoch: int | None, chunk: int | None, num_chunks: int | None, status: str = "",
                warm_start: bool = False, parent: Any = None) -> str:
    """The panel's wording (js/src/format.ts chunkText): "epoch 2 · chunk 4/4" for the last chunk
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


def _isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= 80 else line[:77] + "..."


def _fmt(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value
