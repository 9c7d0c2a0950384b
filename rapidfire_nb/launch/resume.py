"""Resume planning: a resumed ``run_fit`` rebuilds every run from the experiment folder.

``refuse_lost_history`` refuses a folder whose log was lost while its runs were not;
``check_resume`` refuses a resume whose ``run_fit`` arguments (the ``FitPlan``) differ from the
original ones; ``plan_restore`` decides everything the restore will do before a byte is written
(and refuses a folder that does not fit the arguments), as a ``RestorePlan``; ``restore_runs``
then rebuilds each run from the event log and its checkpoint and mends what a crash left. Plain
values in (the plan, the folder's store and log, the engine being set up): nothing here sees the
Experiment.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from rapidfire_nb.engine import (ACTIVE, COMPLETED, DELETED, FAILED, PENDING, RUNNING, STOPPED, RunSpec,
                                 atomic_write_json, check_runs_json, failed_by_the_disk, read_json,
                                 read_nofollow)
from rapidfire_nb.errors import ConfigError, RapidFireError


@dataclass
class RestorePlan:
    """What ``restore_runs`` will do: the folded log (``table``), each run's restore record
    (``infos``) and spec (``specs``), the runs restored ``failed`` with their reason
    (``refused``), and the runs that only ``end(wait=False)`` stopped (they go on)."""
    table: dict
    infos: dict[int, dict]
    specs: dict[int, RunSpec]
    refused: dict[int, str]
    stopped_by_end: set[int] = field(default_factory=set)


def refuse_lost_history(store) -> None:
    """Resuming on an empty or missing event log while runs.json or checkpoints show that runs
    were created would silently drop every logged loss, metric and op: refused, nothing written.
    A folder where run_fit never created a run (no runs.json, no checkpoint) is fresh."""
    from rapidfire_nb.engine import EventLogError

    path = store.events_path
    try:
        empty = not os.path.lexists(path) or not read_nofollow(path).strip()
    except RapidFireError:
        raise    # a FIFO, a device or an oversized file, named by its own error
    except OSError as exc:
        raise EventLogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not empty:
        return
    runs = read_json(store.runs_path, {})
    ckpts = sorted(p.parent.name for p in (store.root / "checkpoints").glob("run_*/*.safetensors"))
    if not runs and not ckpts:
        return
    what = "is missing" if not path.exists() else "is empty"
    evidence = []
    if runs:
        evidence.append(f"{store.runs_path} records {len(runs)} run(s)")
    if ckpts:
        evidence.append(f"checkpoints exist for {', '.join(dict.fromkeys(ckpts))}")
    raise EventLogError(
        f"{path} {what} but {' and '.join(evidence)}: resuming would lose the experiment's "
        f"logged history (losses, metrics, ops). Restore {path.name} from a backup, or start a "
        f"new experiment (resume=False); nothing was changed")


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _config_diff(logged, given: dict, limit: int = 3) -> str:
    """The fields where a logged config and the one given now differ, as one phrase."""
    a, b = _flat(logged if isinstance(logged, dict) else {}), _flat(given)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k, "<unset>") != b.get(k, "<unset>")]
    if not keys:
        return "the same fields, another fingerprint"
    parts = [f"{k} is {a.get(k, '<unset>')!r:.60} there, {b.get(k, '<unset>')!r:.60} here" for k in keys[:limit]]
    more = f" (and {len(keys) - limit} more)" if len(keys) > limit else ""
    return "; ".join(parts) + more


def _short(fingerprint) -> str:
    text = str(fingerprint)
    return repr(text[:12] + "..." if len(text) > 15 else text)


def check_resume(meta: dict, name: str, plan) -> None:
    """Refuse a resume whose ``run_fit`` arguments (``plan``) differ from the original ones
    recorded in ``meta`` (experiment.json; pruning knobs included), before anything is changed."""
    from rapidfire_nb.tuning import check_pruning_resume

    data_fp = plan.data
    stored_data = meta.get("data") or {}
    for split, arg in (("train", "train_dataset"), ("eval", "eval_dataset")):
        if split in stored_data and stored_data[split] != data_fp[split]:
            raise ConfigError(
                f"resume=True but {arg} differs from the one experiment {name!r} was started "
                f"with (fingerprint {data_fp[split]!r}, stored {stored_data[split]!r}); pass the "
                f"same {arg} to run_fit")
    for key, given in (("num_chunks", plan.num_chunks), ("seed", plan.seed)):
        if meta.get(key) is not None and meta[key] != given:
            raise ConfigError(f"resume=True needs the original {key}={meta[key]!r} (got {given!r})")
    check_pruning_resume(meta.get("pruning"), plan.pruning)
    stored_runs = meta.get("runs")
    if stored_runs:
        given_runs = plan.fingerprints()
        if len(stored_runs) != len(given_runs):
            raise ConfigError(f"resume=True but the config group expands to {len(given_runs)} runs; "
                              f"the original one had {len(stored_runs)}; pass the same config group")
        for i, (a, b) in enumerate(zip(stored_runs, given_runs)):
            if a != b:
                raise ConfigError(
                    f"resume=True but run {i + 1}'s config differs from the original one: "
                    f"experiment.json's runs[{i}] records fingerprint {_short(a)}, this config "
                    f"group's run {i + 1} has {_short(b)}. Pass the same config group (and "
                    "callables of the same names); if you did, experiment.json was edited")


def restore_runs(restore: RestorePlan, engine, store, events, meta: dict | None = None) -> None:
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
    ``meta``: experiment.json to write once the runs are back (a crash came before run_fit
    wrote it), or None.
    """
    from rapidfire_nb.engine import CheckpointReadError

    store.remove_stale_tmp()
    table, infos = restore.table, restore.infos
    logged = {r["run_id"]: r for r in table["runs"].values() if r["created"]}
    logged_chunks = {_chunk_key(row) for row in table["timeline"]}
    logged_metrics = {(p["run_id"], p["split"], p["step"]) for p in table["points"]}
    # one runs.json write at the end instead of one per restored run (it is only a cache)
    with engine.runs_writes_deferred():
        for rid in sorted(infos):
            _restore_run(engine, store, events, rid, infos[rid], restore.specs[rid],
                         restore.refused.get(rid), rid in restore.stopped_by_end, set(logged),
                         logged_chunks, logged_metrics, CheckpointReadError)
    if meta is not None:
        atomic_write_json(store.meta_path, meta)
    engine.save_runs()

def plan_restore(specs: list[RunSpec], store, events, engine, driver) -> RestorePlan:
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
    from rapidfire_nb.engine import ENDED_REASON, fold, model_identity

    cache = check_runs_json(read_json(store.runs_path, {}), store.runs_path)
    table = fold(events.since(0))
    logged = {r["run_id"]: r for r in table["runs"].values() if r["created"]}
    infos = {rid: _restore_info(run, cache.get(rid)) for rid, run in logged.items()}
    for rid, rec in cache.items():
        infos.setdefault(rid, rec)
    for rid in range(1, len(specs) + 1):
        infos.setdefault(rid, {"status": PENDING, "parent_run_id": None, "warm_start": False})
    planned: dict[int, RunSpec] = {}
    refused: dict[int, str] = {}
    where = store.events_path
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
            raise ConfigError(
                f"resume=True but run {rid}'s config differs from the one logged in {where} (its "
                f"run_created event): {_config_diff(info.get('config'), spec.config_dict())}. Pass "
                f"the same config group; if you did, that line of {where.name} was edited")
        if rid not in refused:
            _check_counters(rid, info, spec, engine, where)
        planned[rid] = spec
    # by end(wait=False), not by the user: they go on
    stopped_by_end = {rid for rid, r in logged.items()
                      if r["status"] == STOPPED and r["reason"] == ENDED_REASON}
    return RestorePlan(table, infos, planned, refused, stopped_by_end)

def _restore_run(engine, store, events, rid, info, spec, refused, stopped_by_end, created,
                 logged_chunks, logged_metrics, CheckpointReadError) -> None:
    parent_id = info.get("parent_run_id")
    rec = engine.add_run(spec, run_id=rid, parent=None, warm_start=bool(info.get("warm_start")),
                         changes=info.get("changes"), emit=rid not in created)
    rec.parent_run_id = parent_id
    if refused is not None:
        # nothing of it is loaded: no checkpoint, no base model, no create_model call
        rec.status, rec.error = FAILED, refused
        events.append("run_status", run_id=rid, status=FAILED, error=refused,
                           reason="its model would have come from the folder")
        return
    rec.step_offset = info.get("step_offset", 0)
    rec.total_steps += rec.step_offset   # a warm clone's own schedule, after its stream offset
    for key in ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done", "error"):
        setattr(rec, key, info.get(key, getattr(rec, key)))
    status = info.get("status", PENDING)
    reason = "restored after restart"
    if status == STOPPED and stopped_by_end:
        status, reason = PENDING, "continued: it was stopped only because the experiment ended"
    if status == FAILED and failed_by_the_disk(rec.error):
        status, reason = PENDING, "retried from its last intact checkpoint after a checkpoint write failure"
        rec.error = None
    ckpt = unreadable = None
    if status != DELETED:
        try:
            ckpt = store.load_checkpoint(rid)
        except CheckpointReadError as exc:
            unreadable = exc
            if status not in (COMPLETED, FAILED):
                status, rec.error = FAILED, str(exc)
                reason = "its checkpoint cannot be read"
    if ckpt is not None and (problem := _counter_problem(ckpt["counters"], spec, engine)):
        unreadable, ckpt = CheckpointReadError(
            f"{store.checkpoint_path(rid)}: {problem}; it is not loaded"), None
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
            events.extend(missing + [("chunk_done", chunk_event)])
    elif status in (PENDING, RUNNING, STOPPED, FAILED):
        # failed ones too: a warm clone of a run that failed before its first checkpoint
        # starts from these weights, in this session as in the one that created it
        if rec.warm_start:
            weights = _lost_warm_start_weights(store, rec)
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
        warnings.warn(f"run {rid} is completed but its checkpoint {store.checkpoint_path(rid)} "
                      f"is missing: its weights are gone (export and warm clones of it are refused)",
                      stacklevel=3)
    if status == RUNNING:
        status = PENDING
    if status in ACTIVE and rec.completed_steps >= rec.total_steps:
        status = COMPLETED
    rec.status = status
    if status != info.get("status") or rid not in created:
        events.append("run_status", run_id=rid, status=status, error=rec.error, reason=reason)

def _lost_warm_start_weights(store, rec):
    """A warm-start clone without a checkpoint: its stored starting weights, else the parent's
    checkpoint if the parent is still exactly where the clone started."""
    weights = store.load_warm_start(rec.run_id)
    if weights is not None:
        return weights
    parent_ckpt = store.load_checkpoint(rec.parent_run_id)
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
        "config": run["config"],
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
        for number, raw in enumerate(read_nofollow(path).split(b"\n"), start=1):
            if str(value).encode() not in raw:
                continue
            ev = json.loads(raw)
            if isinstance(ev, dict) and ev.get("run_id") == rid and any(ev.get(n) == value for n in names):
                found = f", line {number} (seq {ev.get('seq')}, field {ev.get('type')}." \
                        f"{next(n for n in names if ev.get(n) == value)})"
    except (OSError, ValueError):
        pass
    return found
