"""Result frames: the folded run table (engine/state.py) as pandas DataFrames.

Both a live ``Experiment`` and a folder opened read-only (``Experiment.open(folder)``) build
their ``get_runs_info`` / ``get_results`` / ``get_timeline`` / ``time_split`` here, from the
same table, so a report made from a folder reads exactly what the notebook showed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rapidfire_nb.engine import DELETED, TIMELINE_COLUMNS, runs_by_id
from rapidfire_nb.tracking.naming import short_name

RUN_FIELDS = ("run_id", "status", "completed_steps", "total_steps", "samples_seen",
              "chunks_done", "parent_run_id", "warm_start", "error")


def runs_frame(table: dict, pruning_of: Callable[[int], str | None] | None = None):
    """``get_runs_info``'s frame (see ``Experiment.get_runs_info`` for the columns); with
    ``pruning_of`` a ``pruning`` column holds its note for each run."""
    import pandas as pd

    runs = [{**{k: r[k] for k in RUN_FIELDS}, "epoch": r["next_epoch"], "config": r["config"],
             "knobs": list(r["knobs"]), "eval_loss": r["latest"].get("eval_loss"),
             "worker": r["worker"], "name": short_name(r["run_id"], r["knobs"]), "note": r.get("note"),
             "devices": r.get("devices", 1)}
            for r in runs_by_id(table)]
    if not runs:
        return pd.DataFrame(columns=["run_id", "status"])
    # Ray workers (num_workers): the worker that trained each run's last chunk
    on_workers = any(run["worker"] is not None for run in runs)
    sharded = any(run["devices"] > 1 for run in runs)   # FSDP: how many devices each run uses
    knob_keys: list[str] = []
    for run in runs:
        for k in run["knobs"]:
            if k not in knob_keys:
                knob_keys.append(k)
    short = _short_names(knob_keys)
    rows = []
    for run in runs:
        row = {"run_id": run["run_id"], "name": run["name"], "status": run["status"]}
        for k in knob_keys:
            row[short[k]] = _cell(_get_knob(run["config"], k))
        row.update({k: run[k] for k in ("completed_steps", "total_steps", "samples_seen",
                                        "chunks_done", "epoch", "parent_run_id", "warm_start",
                                        "eval_loss", "error", "note")})
        if on_workers:
            row["worker"] = run["worker"]
        if sharded:
            row["devices"] = run["devices"]
        if pruning_of is not None:
            row["pruning"] = pruning_of(run["run_id"])
        rows.append(row)
    df = pd.DataFrame(rows)
    # text columns keep None for "nothing to say": pandas would turn a partly filled one into
    # a string column with NaN, so `error` (all None) and `pruning` would disagree
    for col in ("error", "pruning", "worker", "note"):
        if col in df:
            df[col] = pd.Series([row[col] for row in rows], index=df.index, dtype=object)
    # run ids are integers; a column with missing parents would otherwise read 1.0, 2.0
    df["parent_run_id"] = df["parent_run_id"].astype("Int64")
    return df


MAX_NOTE_CHARS = 2000


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def note_run(events, run_ids: set[int], run_id: int, text: str, *, writable: bool) -> None:
    """``Experiment.note``: check the note, then log it as a ``note`` event (the log is where a
    note lives: the panel, the report and a reopened folder read it back). An empty text clears
    the run's note. Bad input raises ``ValueError`` naming the problem and logs nothing."""
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise ValueError(f"run_id must be a run id (an integer), not {run_id!r}")
    if run_id not in run_ids:
        known = ", ".join(str(r) for r in sorted(run_ids)) or "none yet"
        raise ValueError(f"no run {run_id} in this experiment (runs: {known})")
    if not isinstance(text, str):
        raise ValueError(f"a note is text (a str), not {type(text).__name__}")
    if not _encodable(text):
        raise ValueError("a note must be valid Unicode text: it holds a lone surrogate "
                         "(half of a UTF-16 pair), which no file or browser can carry")
    if len(text) > MAX_NOTE_CHARS:
        raise ValueError(f"a note holds at most {MAX_NOTE_CHARS} characters; this one has "
                         f"{len(text)} (keep long texts in a file and note its path)")
    if "\x00" in text:
        raise ValueError("a note cannot contain a NUL character")
    if not writable:
        raise ValueError("this experiment is read-only or has ended: open it with "
                         "Experiment(name, resume=True) to add notes")
    events.append("note", run_id=run_id, text=text)


def logged_pruning_note(table: dict, run_id: int) -> str | None:
    """A run's pruning note as the log tells it (a folder opened read-only has no driver)."""
    run = table["runs"].get(str(run_id))
    if run is None:
        return None
    if run["pruned"]:
        return run["reason"] or run["error"]
    if run["suggestion"]:
        return "suggested: " + run["suggestion"]
    return None


def pruning_notes(driver, meta: dict, from_log: bool, live) -> Callable[[int], str | None] | None:
    """``runs_frame``'s ``pruning_of``: the AutoML driver's notes, or with no driver yet
    (read-only, or reopened before run_fit) the notes as the log (``live``, a ``LiveTable``)
    tells them; None when the experiment has no pruner."""
    if driver is not None:
        return driver.reason_for
    pruning = meta.get("pruning") or {}
    if from_log and (pruning.get("pruner") is not None or "budget" in pruning):
        return lambda rid: live.read(lambda t: logged_pruning_note(t, rid))
    return None


def statuses(table: dict) -> list[tuple[str, str | None]]:
    """(status, reason) of every run, in run order."""
    return [(r["status"], r["reason"]) for r in runs_by_id(table)]


def summary_line(name: str, path, runs: list[tuple[str, str | None]], continues: bool) -> str:
    """An Experiment's repr: its runs counted by status; with ``continues`` (a folder reopened
    to train, before run_fit) how many runs the same run_fit would continue."""
    from rapidfire_nb.engine import ENDED_REASON

    counts: dict[str, int] = {}
    for status, _reason in runs:
        counts[status] = counts.get(status, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    text = f"<Experiment {name!r}: {len(runs)} runs ({summary}) at {path}"
    unfinished = sum(status in ("pending", "running") or (status == "stopped" and reason == ENDED_REASON)
                     for status, reason in runs)
    if continues and unfinished:
        text += (f"; run_fit(...) with the same arguments continues the {unfinished} unfinished "
                 f"run{'s' if unfinished != 1 else ''}")
    return text + ">"


def results_frame(table: dict):
    import pandas as pd

    deleted = {r["run_id"] for r in table["runs"].values() if r["status"] == DELETED}
    rows = [{"run_id": p["run_id"], "split": p["split"], "step": p["step"],
             "samples_seen": p["samples_seen"], "epoch": p["epoch"], "chunk": p["chunk"],
             "metric": m, "value": float("nan") if v is None else v,
             "deleted": p["run_id"] in deleted}
            for p in table["points"] for m, v in p["metrics"].items()]
    return pd.DataFrame(rows, columns=["run_id", "split", "step", "samples_seen", "epoch", "chunk",
                                       "metric", "value", "deleted"])


def _from_one(value):
    return value + 1 if isinstance(value, int) else value


def generations_frame(table: dict):
    """One row per answer. ``epoch`` and ``chunk`` count from 1, as the panel and the report
    name each point ("epoch 1, chunk 2/2"): the answers are read beside those views."""
    import pandas as pd

    rows = [{"run_id": run["run_id"], "name": short_name(run["run_id"], run["knobs"]),
             "epoch": _from_one(g["epoch"]), "chunk": _from_one(g["chunk"]),
             **{k: g[k] for k in ("step", "samples_seen")},
             "prompt": prompt, "reference": ref, "text": text}
            for run in runs_by_id(table) for g in run["generations"]
            for prompt, ref, text in zip(g["prompts"], g["references"], g["texts"])]
    return pd.DataFrame(rows, columns=["run_id", "name", "epoch", "chunk", "step", "samples_seen",
                                       "prompt", "reference", "text"])


def timeline_frame(table: dict):
    import pandas as pd

    rows = [dict(row) for row in table["timeline"]]
    frame = pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS))
    # None (kernel engine, old logs) would make these object columns that cannot filter or sum
    frame["moved"] = frame["moved"].astype(bool)
    for col in ("hop_s", "gen_s", "tokens_per_s", "peak_mem_mb"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    frame["tokens"] = pd.to_numeric(frame["tokens"], errors="coerce").astype("Int64")
    return frame


def time_split(table: dict) -> dict:
    return {k: float(v) for k, v in table["time"].items()}


def _get_knob(config: dict, key: str):
    """A dotted knob's value in a run's logged config (``training_args.learning_rate``)."""
    obj: Any = config
    for p in key.split("."):
        obj = obj.get(p) if isinstance(obj, dict) else getattr(obj, p, None)
    return obj


def _cell(v):
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return v


def _short_names(keys: list[str]) -> dict[str, str]:
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}
