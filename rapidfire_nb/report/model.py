"""What the figures and the report read: the reducer's run table (``engine/state.py``), taken
from a live Experiment or folded from an experiment folder's event log, plus the few derived
views they share (the knobs that differ, the leaderboard's order, a run's lineage).

Reading a folder takes no lock and writes nothing: it reads ``events.jsonl`` (and, for display
only, ``experiment.json``) as JSON, so it works on a finished, stopped or killed experiment, on
one that still trains, and on a read-only copy someone sent.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rapidfire_nb.engine import (FolderLinkError, MetadataError, fold, lower_is_better, read_events,
                                 read_json, runs_by_id)
from rapidfire_nb.errors import RapidFireError


class ReportError(RapidFireError, ValueError):
    """A report or figure cannot be made from what was given (named in the message)."""


def snapshot(table: dict) -> dict:
    """A copy of ``table`` to draw from outside its lock: runs and series copied, the long
    ``points`` list (which repeats the series) left out; each series gains the optimizer ``step``
    and the ``time`` of its points from it (the curves' other x axes)."""
    runs = {}
    for key, run in table["runs"].items():
        r = dict(run)
        r["series"] = {split: {name: {"x": list(s["x"]), "y": list(s["y"])}
                               for name, s in run["series"][split].items()}
                       for split in ("train", "eval")}
        for k in ("config", "knobs", "changes", "latest", "best", "time"):
            r[k] = json.loads(json.dumps(run[k])) if run[k] is not None else None
        runs[key] = r
    add_point_axes(table, runs)
    out = {k: v for k, v in table.items() if k not in ("runs", "points", "timeline")}
    out["runs"] = runs
    out["timeline"] = [dict(row) for row in table["timeline"]]
    out["train_metrics"] = list(table["train_metrics"])
    out["eval_metrics"] = list(table["eval_metrics"])
    out["time"] = dict(table["time"])
    return out


def add_point_axes(table: dict, runs: dict | None = None) -> None:
    """Give each series of ``runs`` (default: the table's own) ``step`` and ``time`` lists beside
    its x and y, from ``table["points"]``: the reducer appends a series point exactly for the
    metric rows that have samples seen, in log order, so the lists line up."""
    runs = table["runs"] if runs is None else runs
    for run in runs.values():
        for split in ("train", "eval"):
            for s in run["series"][split].values():
                s["step"], s["time"] = [], []
    for p in table.get("points", ()):
        if not isinstance(p.get("samples_seen"), int) or isinstance(p.get("samples_seen"), bool):
            continue
        run = runs.get(str(p["run_id"]))
        if run is None:
            continue
        series = run["series"][p["split"]]
        for name in p["metrics"]:
            s = series.get(name)
            if s is not None and len(s["step"]) < len(s["x"]):
                s["step"].append(p["step"])
                s["time"].append(p.get("time"))


def read_folder(folder: str | Path) -> tuple[dict, dict]:
    """(run table, experiment.json or {}) of an experiment folder, read without the lock."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReportError(f"{folder} is not a folder (give an experiment folder, "
                          "e.g. rapidfire_experiments/<name>)")
    log = folder / "events.jsonl"
    if not log.exists() and not log.is_symlink():
        inside = sorted(p.parent.name for p in folder.glob("*/events.jsonl"))
        hint = (f"; experiments inside it: {', '.join(inside)}" if inside else "")
        raise ReportError(f"{folder} holds no events.jsonl, so it is not an experiment folder{hint}")
    if not log.is_symlink() and not log.is_file():
        raise ReportError(f"{log} is not a regular file (a device or a pipe), so it is not an "
                          "event log")
    # read_events refuses a link (the engine's folder rule: a sent folder must not make the
    # reader read a file outside it); experiment.json is read the same way
    table = fold(read_events(log))
    meta: dict = {}
    meta_path = folder / "experiment.json"
    if meta_path.is_symlink() or meta_path.is_file():
        try:
            loaded = read_json(meta_path)   # a bounded read of a regular file
        except FolderLinkError:
            raise
        except (OSError, ValueError, MetadataError):
            loaded = None   # display only: a damaged experiment.json leaves the report as is
        meta = loaded if isinstance(loaded, dict) else {}
    if table["experiment"] is None:
        table["experiment"] = meta.get("name") if isinstance(meta.get("name"), str) else folder.name
    return table, meta


# -- derived views ----------------------------------------------------------------------------

def _flat(d: Any, prefix: str = "") -> list[str]:
    if not isinstance(d, dict):
        return [prefix] if prefix else []
    keys = []
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        keys.extend(_flat(v, name) if isinstance(v, dict) and v else [name])
    return keys


def knob_value(config: Any, key: str) -> Any:
    obj = config
    for part in key.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _cell(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def differing_knobs(runs: list[dict]) -> dict[str, str]:
    """The knobs (dotted keys) whose values differ between ``runs``, each with a short name (the
    last part, unless two knobs share it): the search axes and what clones changed."""
    keys: list[str] = []
    for run in runs:
        for key in [*run["knobs"], *_flat(run["changes"] or {})]:
            if key not in keys:
                keys.append(key)
    varying = [k for k in keys
               if len({json.dumps(knob_value(r["config"], k), sort_keys=True, default=str)
                       for r in runs}) > 1]
    last = [k.split(".")[-1] for k in varying]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(varying, last)}


def knob_text(run: dict, knobs: dict[str, str]) -> list[tuple[str, str]]:
    return [(short, _cell(knob_value(run["config"], key))) for key, short in knobs.items()]


def ranking_metric(table: dict) -> str | None:
    """The eval metric the leaderboard ranks by: eval_loss when logged, else the first one."""
    names = table["eval_metrics"]
    if "eval_loss" in names:
        return "eval_loss"
    real = [n for n in names if n not in ("eval_runtime", "eval_samples_per_second",
                                          "eval_steps_per_second", "epoch")]
    return real[0] if real else (names[0] if names else None)


def leaderboard(table: dict) -> list[dict]:
    """Runs by their best value of the ranking metric (best first); runs without one after, by id."""
    metric = ranking_metric(table)
    runs = runs_by_id(table)
    if metric is None:
        return runs
    low = lower_is_better(metric)

    def key(run):
        v = run["best"].get(metric)
        if v is None or not math.isfinite(v):
            return (1, 0.0, run["run_id"])
        return (0, v if low else -v, run["run_id"])

    return sorted(runs, key=key)


def lineage(table: dict, run: dict) -> str:
    """'warm clone of 2 ← 1' for a clone (its parents, nearest first); '' otherwise."""
    if run["parent_run_id"] is None:
        return ""
    chain, seen = [], {run["run_id"]}
    parent = run["parent_run_id"]
    while parent is not None and parent not in seen:
        chain.append(str(parent))
        seen.add(parent)
        p = table["runs"].get(str(parent))
        parent = p["parent_run_id"] if p else None
    kind = "warm clone" if run["warm_start"] else "clone"
    return f"{kind} of {' ← '.join(chain)}"


# the most characters of one text (an answer, a prompt, a reference, a note, a reason) the
# report shows, as the live panel carries at most that many of one string; the rest is said
MAX_SHOWN_CHARS = 2000
_CUT = "\u2026 [{n:,} more characters not shown]"


def cut_text(text: str | None, limit: int = MAX_SHOWN_CHARS) -> str | None:
    """``text`` whole up to ``limit`` characters, else its first ones and how many were left out
    (the whole text stays in the log: exp.get_generations(), get_runs_info())."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[:limit] + _CUT.format(n=len(text) - limit)


def run_note(run: dict) -> str:
    """Why the run is where it is (the pruner's reason, an open suggestion, a stop or failure),
    then the user's own note (``exp.note``), each cut to what the report shows of one text."""
    why = cut_text(_why(run))
    mine = cut_text(run.get("note"))
    return f"{why} · note: {mine}" if why and mine else (f"note: {mine}" if mine else why)


def _why(run: dict) -> str:
    if run["pruned"]:
        return run["reason"] or "pruned"
    if run["suggestion"]:
        return f"pruner suggests stopping: {run['suggestion']}"
    if run["status"] == "failed":
        last = (run["error"] or "").strip().splitlines()
        return last[-1] if last else (run["reason"] or "failed")
    return run["reason"] or ""


def resolve_split(table: dict, metric: str, split: str | None) -> str:
    """``split`` as given, or for ``None`` the split that logs ``metric``: train when it is a
    train metric (or nothing is logged yet), eval when only the eval side has it, so
    ``plot("eval_loss")`` plots the eval loss."""
    if split is not None:
        return split
    if metric in table["train_metrics"] or not isinstance(metric, str):
        return "train"
    evals = table["eval_metrics"]
    return "eval" if metric in evals or f"eval_{metric}" in evals else "train"


def resolve_metric(table: dict, metric: str, split: str) -> str:
    """The logged name of ``metric`` in ``split``: eval metrics carry an ``eval_`` prefix, so
    ``plot("loss", split="eval")`` means ``eval_loss``."""
    if split not in ("train", "eval"):
        raise ReportError(f"split must be 'train', 'eval' or None, not {split!r}")
    if not isinstance(metric, str) or not metric:
        raise ReportError(f"metric must be a metric name such as 'loss', not {metric!r}")
    names = table[f"{split}_metrics"]
    if metric in names:
        return metric
    if split == "eval" and f"eval_{metric}" in names:
        return f"eval_{metric}"
    if not names:
        return metric   # nothing logged yet: an empty figure, not an error
    other = "eval" if split == "train" else "train"
    elsewhere = [n for n in (metric, f"eval_{metric}") if n in table[f"{other}_metrics"]]
    hint = (f" ({elsewhere[0]!r} is logged in the {other} split: pass split={other!r})"
            if elsewhere else "")
    raise ReportError(f"no {split} metric {metric!r} in this experiment{hint}; {split} metrics "
                      f"logged: {', '.join(names)}")
