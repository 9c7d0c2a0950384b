"""Crash recovery: a resumed ``run_fit`` rebuilds every run from the experiment folder.

``check_resume`` refuses a resume whose ``run_fit`` arguments differ from the original ones;
``plan_restore`` decides everything the restore will do before a byte is written (and refuses a
folder that does not fit the arguments); ``restore_runs`` then rebuilds each run from the event log
and its checkpoint and mends what a crash left. Each takes the ``Experiment`` being resumed.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from rapidfire_nb._version import __version__
from rapidfire_nb.engine import (ACTIVE, COMPLETED, DELETED, FAILED, PENDING, RUNNING, STOPPED, RunSpec,
                                 atomic_write_json, check_runs_json, failed_by_the_disk, read_json)
from rapidfire_nb.errors import ConfigError, RapidFireError


def check_resume(exp, specs, data_fp, num_chunks, seed, config_group=None) -> None:
    """Refuse a resume whose ``run_fit`` arguments differ from the original ones (pruning
    knobs included), before anything is changed."""
    from rapidfire_nb.tuning import check_pruning_resume, pruning_settings

    meta = exp.meta
    pruning = pruning_settings(config_group)
    # remembered so restore_runs can complete experiment.json if a crash came before it
    exp._resume_meta = {"num_chunks": num_chunks, "seed": seed, "data": data_fp,
                         "runs": [s.fingerprint() for s in specs], "pruning": pruning}
    stored_data = meta.get("data") or {}
    for split, name in (("train", "train_dataset"), ("eval", "eval_dataset")):
        if split in stored_data and stored_data[split] != data_fp[split]:
            raise ConfigError(
                f"resume=True but {name} differs from the one experiment {exp.name!r} was started "
                f"with (fingerprint {data_fp[split]!r}, stored {stored_data[split]!r}); pass the "
                f"same {name} to run_fit")
    for key, given in (("num_chunks", num_chunks), ("seed", seed)):
        if meta.get(key) is not None and meta[key] != given:
            raise ConfigError(f"resume=True needs the original {key}={meta[key]!r} (got {given!r})")
    check_pruning_resume(meta.get("pruning"), pruning)
    stored_runs = meta.get("runs")
    if stored_runs:
        given_runs = exp._resume_meta["runs"]
        if len(stored_runs) != len(given_runs):
            raise ConfigError(f"resume=True but the config group expands to {len(given_runs)} runs; "
                              f"the original one had {len(stored_runs)}; pass the same config group")
        for i, (a, b) in enumerate(zip(stored_runs, given_runs)):
            if a != b:
                raise ConfigError(f"resume=True but run {i + 1}'s config differs from the original "
                                  f"one; pass the same config group (and callables of the same names)")

def restore_runs(exp, specs: list[RunSpec], restore: dict) -> None:
    """Rebuild every run (clones included) from the event log and its checkpoint; mend the log.

    The event log is the authority (folded by engine/state.py); runs.json is a cache the
    engine writes for people and tools. Recovery refuses a damaged runs.json (someone changed
    the folder) and reads it only for what the log cannot say: a run whose ``run_created``
    never reached the log (a failed log write), and, in logs written before ``run_created``
    carried them, a clone's ``changes`` and a warm clone's first chunk.

    What a crash can leave, and what this does about it:
    - a run's checkpoint newer than its events in the log (killed between the checkpoint's
      rename and the log append, or during the append): the checkpoint carries the chunk's
      events; the missing ones are appended, none twice;
    - runs of the group missing from the log (killed while ``run_fit`` created them): they
      are created now, without a second ``run_created`` event if one was logged;
    - a run that failed because its checkpoint could not be written (disk full): it continues
      from its previous, intact checkpoint;
    - temporary files of interrupted writes: removed.
    Stopped runs stay stopped; running ones become pending and continue from their checkpoint.
    """
    from rapidfire_nb import automl
    from rapidfire_nb.engine import CheckpointReadError

    engine = exp.engine
    exp.store.remove_stale_tmp()
    table, infos = restore["table"], restore["infos"]
    logged = {r["run_id"]: r for r in table["runs"].values() if r["created"]}
    from rapidfire_nb.engine import ENDED_REASON

    # by end(wait=False), not by the user: they go on
    exp._stopped_by_end = {rid for rid, r in logged.items()
                            if r["status"] == STOPPED and r["reason"] == ENDED_REASON}
    logged_chunks = {_chunk_key(row) for row in table["timeline"]}
    logged_metrics = {(p["run_id"], p["split"], p["step"]) for p in table["points"]}
    # one runs.json write at the end instead of one per restored run (it is only a cache)
    with engine.runs_writes_deferred():
        for rid in sorted(infos):
            _restore_run(exp, rid, infos[rid], restore["specs"][rid], restore["refused"].get(rid),
                              set(logged), logged_chunks, logged_metrics, automl,
                              CheckpointReadError)
    if not exp.meta.get("data") and getattr(exp, "_resume_meta", None):
        exp.meta = {"name": exp.name, "version": __version__, **exp._resume_meta}
        atomic_write_json(exp.store.meta_path, exp.meta)
    engine.save_runs()

def plan_restore(exp, specs: list[RunSpec], engine, driver) -> dict:
    """Everything ``restore_runs`` will do, decided before it writes a byte: every run's
    spec, and the refusals. The whole resume is refused (``ConfigError``, nothing changed)
    when a logged run does not fit the ``run_fit`` arguments: an id the group cannot have,
    another config, or counters beyond what the run's plan allows (a crafted count would
    otherwise keep the engine busy for ever).

    Model identity (what ``create_model`` loads and how) never comes from the folder: a
    run's ``model_name``, ``model_type``, ``model_kwargs`` (``trust_remote_code`` among
    them), ``tokenizer_kwargs`` and reference model are those of the ``run_fit`` arguments.
    A clone may change them while the session that made it is live (as in RapidFire AI,
    whose clone takes the whole config), but on resume such a clone is refused: it is
    restored ``failed`` with the reason, and ``create_model`` is never called for it (clone
    its parent again to train it)."""
    from rapidfire_nb import automl
    from rapidfire_nb.engine import fold, model_identity

    cache = check_runs_json(read_json(exp.store.runs_path, {}), exp.store.runs_path)
    table = fold(exp.events.since(0))
    logged = {r["run_id"]: r for r in table["runs"].values() if r["created"]}
    infos = {rid: _restore_info(run, cache.get(rid)) for rid, run in logged.items()}
    for rid, rec in cache.items():
        infos.setdefault(rid, rec)
    for rid in range(1, len(specs) + 1):
        infos.setdefault(rid, {"status": PENDING, "parent_run_id": None, "warm_start": False})
    planned: dict[int, RunSpec] = {}
    refused: dict[int, str] = {}
    where = exp.store.events_path
    for rid in sorted(infos):
        info = infos[rid]
        parent_id = info.get("parent_run_id")
        if parent_id is None:
            added = driver.spec_for(rid) if driver is not None else None   # refills
            if added is not None:
                spec = added
            elif rid > len(specs):
                raise ConfigError(f"resume=True but the config group expands to {len(specs)} runs "
                                  f"and the experiment has a run {rid}; pass the same config group")
            else:
                spec = specs[rid - 1]
        elif parent_id in planned and parent_id < rid:
            parent = planned[parent_id]
            changes = info.get("changes") or {}
            try:
                spec = automl.apply_changes(parent, changes)
            except ConfigError as exc:
                raise ConfigError(f"cannot restore run {rid}, a clone of run {parent_id}: its "
                                  f"logged changes in {where} are refused: {exc}") from None
            if model_identity(spec) != model_identity(parent):
                keys = sorted(k for k in model_identity(spec)
                              if model_identity(spec)[k] != model_identity(parent)[k])
                refused[rid] = (
                    f"not restored: run {rid} is a clone of run {parent_id} that changed "
                    f"{', '.join(keys)}; on resume what create_model loads comes only from "
                    f"run_fit's arguments, never from the folder ({where} could have been "
                    f"edited). Clone run {parent_id} again to train it")
                spec = parent
        else:
            raise RapidFireError(f"cannot restore run {rid}: its parent run {parent_id} is missing "
                                 f"from {where}")
        if rid not in refused and info.get("fingerprint") and info["fingerprint"] != spec.fingerprint():
            raise ConfigError(f"resume=True but run {rid}'s config differs from the original one; "
                              f"pass the same config group")
        if rid not in refused:
            _check_counters(rid, info, spec, engine, where)
        planned[rid] = spec
    return {"table": table, "infos": infos, "specs": planned, "refused": refused}

def _restore_run(exp, rid, info, spec, refused, created, logged_chunks, logged_metrics, automl,
                 CheckpointReadError) -> None:
    engine = exp.engine
    parent_id = info.get("parent_run_id")
    rec = engine.add_run(spec, run_id=rid, parent=None, warm_start=bool(info.get("warm_start")),
                         changes=info.get("changes"), emit=rid not in created)
    rec.parent_run_id = parent_id
    if refused is not None:
        # nothing of it is loaded: no checkpoint, no base model, no create_model call
        rec.status, rec.error = FAILED, refused
        exp.events.append("run_status", run_id=rid, status=FAILED, error=refused,
                           reason="its model would have come from the folder")
        return
    rec.step_offset = info.get("step_offset", 0)
    rec.total_steps += rec.step_offset   # a warm clone's own schedule, after its stream offset
    for key in ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done", "error"):
        setattr(rec, key, info.get(key, getattr(rec, key)))
    status = info.get("status", PENDING)
    reason = "restored after restart"
    if status == STOPPED and rid in exp._stopped_by_end:
        status, reason = PENDING, "continued: it was stopped only because the experiment ended"
    if status == FAILED and failed_by_the_disk(rec.error):
        status, reason = PENDING, "retried from its last intact checkpoint after a checkpoint write failure"
        rec.error = None
    ckpt = unreadable = None
    if status != DELETED:
        try:
            ckpt = exp.store.load_checkpoint(rid)
        except CheckpointReadError as exc:
            unreadable = exc
            if status not in (COMPLETED, FAILED):
                status, rec.error = FAILED, str(exc)
                reason = "its checkpoint cannot be read"
    if ckpt is not None and (problem := _counter_problem(ckpt["counters"], spec, engine)):
        unreadable, ckpt = CheckpointReadError(
            f"{exp.store.checkpoint_path(rid)}: {problem}; it is not loaded"), None
        if status not in (COMPLETED, FAILED):
            status, rec.error, reason = FAILED, str(unreadable), "its checkpoint cannot be read"
    if ckpt is not None:
        for k, v in ckpt["counters"].items():
            setattr(rec, k, v)
        chunk_event = ckpt.get("chunk_event")
        if chunk_event and _chunk_key(chunk_event) not in logged_chunks:
            # killed between the checkpoint and (the end of) its log append
            missing = [(t, p) for t, p in ckpt["events"]
                       if t != "metric" or (p["run_id"], p["split"], p["step"]) not in logged_metrics]
            exp.events.extend(missing + [("chunk_done", chunk_event)])
    elif status in (PENDING, RUNNING, STOPPED, FAILED):
        # failed ones too: a warm clone of a run that failed before its first checkpoint
        # starts from these weights, in this session as in the one that created it
        if rec.warm_start:
            weights = _lost_warm_start_weights(exp, rec)
            if weights is None and status == FAILED:
                pass   # failed already; a warm clone of it is refused (no weights)
            elif weights is None:
                status = FAILED
                rec.error = (f"run {rid} was a warm-start clone of run {parent_id} whose starting "
                             f"weights were lost in the crash (saved before the warm-start store "
                             f"existed); clone the parent again")
                reason = "warm-start weights lost"
            else:
                engine.set_start_weights(rid, weights)
        elif status != FAILED:   # no chunk finished before the crash: it starts from scratch
            rec.completed_steps = rec.samples_seen = rec.epoch = rec.chunk = rec.chunks_done = 0
    elif status == COMPLETED and unreadable is not None:
        warnings.warn(f"run {rid} is completed but its checkpoint cannot be used: {unreadable}",
                      stacklevel=3)
    elif status == COMPLETED:
        warnings.warn(f"run {rid} is completed but its checkpoint {exp.store.checkpoint_path(rid)} "
                      f"is missing: its weights are gone (export and warm clones of it are refused)",
                      stacklevel=3)
    if status == RUNNING:
        status = PENDING
    if status in ACTIVE and rec.completed_steps >= rec.total_steps:
        status = COMPLETED
    rec.status = status
    if status != info.get("status") or rid not in created:
        exp.events.append("run_status", run_id=rid, status=status, error=rec.error, reason=reason)

def _lost_warm_start_weights(exp, rec):
    """A warm-start clone without a checkpoint: its stored starting weights, else the parent's
    checkpoint if the parent is still exactly where the clone started."""
    weights = exp.store.load_warm_start(rec.run_id)
    if weights is not None:
        return weights
    parent_ckpt = exp.store.load_checkpoint(rec.parent_run_id)
    if parent_ckpt is not None and parent_ckpt["counters"]["completed_steps"] == rec.step_offset:
        return parent_ckpt["trainer"]["weights"]
    return None


def _chunk_key(ev: dict) -> tuple:
    return (ev["run_id"], ev["epoch"], ev["chunk"], ev["completed_steps"])


def _restore_info(run: dict, cached: dict | None) -> dict:
    """A logged run (engine/state.py's table) as the record ``_restore_run`` rebuilds it from;
    ``cached`` (its runs.json record) fills only what logs of older versions did not carry."""
    from rapidfire_nb.engine import config_fingerprint

    cached = cached or {}
    chunk = run["next_chunk"]
    if run["chunks_done"] == 0 and run["base_chunk"] is None:
        chunk = cached.get("chunk", 0)
    return {
        "status": run["status"], "parent_run_id": run["parent_run_id"],
        "warm_start": run["warm_start"],
        "changes": run["changes"] if run["changes"] is not None else cached.get("changes"),
        "step_offset": run["base_step"], "completed_steps": run["completed_steps"],
        "samples_seen": run["samples_seen"], "epoch": run["next_epoch"], "chunk": chunk,
        "chunks_done": run["chunks_done"], "error": run["error"],
        "fingerprint": config_fingerprint(run["config"]) if run["config"] else cached.get("fingerprint"),
    }


# the run record's counters a folder sets on resume (log, runs.json, a checkpoint)
_COUNTERS = ("step_offset", "completed_steps", "chunks_done", "epoch", "chunk", "samples_seen")


def _counter_problem(values: dict, spec: RunSpec, engine) -> str | None:
    """What in ``values`` is beyond the run's plan (None when nothing is): a count read from a
    folder must not exceed what the run can reach, since loops and schedules follow it."""
    plan, total = engine.plan_run(spec)
    offset = values.get("step_offset") or 0
    per_epoch = plan.steps_per_epoch
    limits = {
        "step_offset": per_epoch,                      # a warm clone starts inside an epoch
        "completed_steps": total + per_epoch,
        # every chunk holds at least one optimizer step (num_chunks <= steps per epoch)
        "chunks_done": total + engine.num_chunks,
        "epoch": (total + per_epoch) // per_epoch + 1,
        "chunk": engine.num_chunks,
        "samples_seen": 2 ** 53,
    }
    for key in _COUNTERS:
        value = values.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limits[key]:
            return (f"{key}={value!r:.40} is beyond what the run's plan allows (0..{limits[key]}: "
                    f"{total} optimizer steps in {engine.num_chunks} chunks per epoch, offset {offset})")
    return None


def _check_counters(rid: int, info: dict, spec: RunSpec, engine, where: Path) -> None:
    problem = _counter_problem(info, spec, engine)
    if problem is None:
        return
    field = problem.split("=", 1)[0]
    line = _line_of(where, rid, field, info.get(field))
    raise ConfigError(f"resume=True refused: {where}{line}: run {rid}'s {problem}. The folder was "
                      "changed by hand or by another program; nothing was changed")


def _line_of(path: Path, rid: int, field: str, value) -> str:
    """", line N" of the last event of run ``rid`` that logged ``value`` (error messages only)."""
    names = {"chunks_done": ("chunks_done",), "completed_steps": ("completed_steps", "step", "base_step"),
             "samples_seen": ("samples_seen", "base_samples_seen"), "step_offset": ("base_step",),
             "epoch": ("epoch",), "chunk": ("chunk", "base_chunk")}.get(field, (field,))
    found = ""
    try:
        for number, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
            if str(value).encode() not in raw:
                continue
            ev = json.loads(raw)
            if isinstance(ev, dict) and ev.get("run_id") == rid and any(ev.get(n) == value for n in names):
                found = f", line {number} (seq {ev.get('seq')}, field {ev.get('type')}." \
                        f"{next(n for n in names if ev.get(n) == value)})"
    except (OSError, ValueError):
        pass
    return found
