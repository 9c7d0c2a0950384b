"""IC ops (stop, resume, delete, clone, add): the one table of their rules, the check of an op
against the run as the queued ops will leave it, and the ops' application by the engine.

The rules live in ``ops_rules.json`` beside this file, so that the panel's buttons are checked
against the same data (js/test/ops_rules.test.ts), as the event schema is. Three places use them:
an op is validated against the run as the queued ops will leave it (``checked_run``,
``check_status_op``), that state is projected by replaying queued ops with ``leaves``
(``project``), and the engine re-checks each op when it applies it (``apply_queued``: a
run may have finished meanwhile). Checks that need more than a status (a warm start's weights, a
clone's changes) are made where the facts are: a warm clone's weights when it is applied
(``clone``), a clone's changes by the caller that builds its spec.

The application functions take the engine as their first argument, as a Ray Tune scheduler's
hooks take the trial runner: they change runs only through the engine's own methods (its status
changes, ``add_run``, releasing a run's memory, the answer logged for each op), under its lock,
in the engine thread (or, once that has left, in the thread that drains the engine).
"""

from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.precheck import check_sample_generation
from rapidfire_nb.errors import OpRefused

if TYPE_CHECKING:
    from rapidfire_nb.engine.store import ExperimentStore

RULES_PATH = Path(__file__).with_name("ops_rules.json")
RULES: dict = json.loads(RULES_PATH.read_text(encoding="utf-8"))
OPS: tuple[str, ...] = tuple(RULES["ops"])
STATUSES: tuple[str, ...] = tuple(RULES["statuses"])


def _rule(op: str) -> dict:
    try:
        return RULES["ops"][op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}") from None


def allowed(op: str, status: str) -> bool:
    """True when ``op`` may be applied to a run whose (projected) status is ``status``."""
    return status in _rule(op)["allowed"]


def refusal(op: str, status: str, run_id: int, is_now: str | None = None) -> str | None:
    """None when allowed, else the reason the op is refused, as the user reads it. ``is_now``
    says where the run stands ("is stopped", or "is stopping (...)" while a queued op makes the
    difference); default "is <status>"."""
    if allowed(op, status):
        return None
    return _rule(op)["refusal"].format(run_id=run_id, status=status,
                                       is_now=is_now or f"is {status}")


def leaves(op: str, status: str) -> str:
    """The status a run is left in once ``op`` is applied to it (unchanged when refused)."""
    rule = _rule(op)
    if status not in rule["allowed"] or rule["leaves"] is None:
        return status
    return rule["leaves"]


# -- ops checked against the run as the queued ops will leave it ----------------------------------
#
# Ops are validated in the caller's thread and applied by the engine at the next chunk boundary.
# Validating against the engine's current state alone refuses sequences that are valid in order:
# ``nid = clone_modify(...); stop(nid)`` (run ``nid`` does not exist yet), ``stop(3); resume(3)``
# (run 3 is not stopped yet), and lets through a warm clone of a run whose delete is already
# queued. So each op is validated against the projected run: its current record, then every
# queued op replayed on it, in queue order. The engine still re-checks each op when it applies it
# (a run may finish before a queued stop reaches it), so projection only has to be right about
# what the queued ops *ask* for.

@dataclass
class ProjectedRun:
    run_id: int
    status: str
    spec: Any
    record: Any = None        # the engine's RunRecord, None while the run is a queued clone
    queued_clone: Any = None  # the clone op that will create it

    @property
    def exists(self) -> bool:
        return self.record is not None


def project(engine, run_id: int) -> ProjectedRun | None:
    """The run as the queued ops will leave it; None if neither it nor a queued clone exists."""
    with engine.atomically():
        rec = engine.runs.get(run_id)
        view = ProjectedRun(run_id, rec.status, rec.spec, record=rec) if rec is not None else None
        for op in engine.queued_ops():
            if op.kind == "clone" and op.new_run_id == run_id and view is None:
                view = ProjectedRun(run_id, R.PENDING, op.spec, queued_clone=op)
            elif view is not None and op.run_id == run_id and op.kind in OPS:
                view.status = leaves(op.kind, view.status)
        return view


def known_ids(engine) -> list[int]:
    with engine.atomically():
        ids = set(engine.runs)
        ids.update(op.new_run_id for op in engine.queued_ops() if op.kind == "clone")
        return sorted(ids)


_QUEUED_WORDS = {"stopped": "stopping", "pending": "resuming", "deleted": "deleting"}


def is_now(view: ProjectedRun) -> str:
    """"is stopped", or, when a queued op makes the difference, "is stopping (a queued op ...)":
    a second Stop before the boundary must not read as if the run had stopped already."""
    now = view.record.status if view.record is not None else None
    if now is None or now == view.status:
        return f"is {view.status}"
    going = _QUEUED_WORDS.get(view.status, f"becoming {view.status}")
    return f"is {going} (still {now} until the queued op applies at its next chunk boundary)"


def checked_run(engine, run_id) -> ProjectedRun:
    """The run ``run_id`` names, as the queued ops will leave it; ``OpRefused`` for an id that
    is no integer or names no run (a queued clone's id works at once)."""
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise OpRefused(f"run_id must be an integer, got {run_id!r}")
    view = project(engine, run_id)
    if view is None:
        raise OpRefused(f"unknown run {run_id}; runs are {known_ids(engine)}")
    return view


def check_status_op(op: str, view: ProjectedRun) -> None:
    """``OpRefused`` with the table's reason when ``op`` (stop, resume, delete) may not be
    applied to the run as the queued ops leave it."""
    refused = refusal(op, view.status, view.run_id,
                      is_now=is_now(view) if op in ("stop", "resume") else None)
    if refused:
        raise OpRefused(refused)


# -- ops applied, by the engine thread at a chunk boundary ----------------------------------------
#
# ``engine`` is the controller's Engine (engine/controller.py, which calls in here: this module
# never imports it). Everything below runs holding the engine's lock, in the engine thread or,
# once that has left, in the thread that drains the engine.

def apply_queued(engine) -> bool:
    """Apply queued ops in order, holding (in order) those on a run whose chunk is in flight:
    they are applied once it has come back and been booked, so that they see the run at a
    chunk boundary (in the kernel nothing is in flight between chunks). Each op is answered in
    the event log, accepted or refused. True when a delete was accepted: the caller then frees
    the deleted runs' memory, once for the whole batch."""
    drained = []
    while True:
        try:
            drained.append(engine.ops.get_nowait())
        except queue.Empty:
            break
    blocked = set(engine.executor.inflight)
    held, ready = [], []
    for op in engine._held_ops + drained:
        ids = {op.run_id} | ({op.new_run_id} if op.new_run_id is not None else set())
        if ids & blocked:
            held.append(op)
            blocked |= ids      # later ops on these runs wait behind it
        else:
            ready.append(op)
    engine._held_ops = held
    freed = False
    for op in ready:
        engine._queued[:] = [q for q in engine._queued if q is not op]
        rec = engine.runs.get(op.run_id)
        ok, reason = True, None
        try:
            if rec is None and op.kind != "add":   # a queued clone that was refused when applied
                raise OpRefused(f"run {op.run_id} does not exist (its clone was refused)")
            if op.kind in ("stop", "resume", "delete") and not allowed(op.kind, rec.status):
                # the run moved on since the op was validated (it finished, or failed)
                ok, reason = False, f"run {op.run_id} is {rec.status}"
            elif op.kind == "stop":
                engine._set_status(rec, leaves("stop", rec.status),
                                   reason=op.reason or "stopped by user", pruned=op.pruned)
            elif op.kind == "resume":
                engine._set_status(rec, leaves("resume", rec.status), reason="resumed by user")
            elif op.kind == "delete":
                delete(engine, rec)
            elif op.kind == "clone":
                clone(engine, op, rec)
            elif op.kind == "add":
                if op.run_id in engine.runs:
                    ok, reason = False, f"run {op.run_id} exists already"
                else:
                    engine.add_run(op.spec, run_id=op.run_id)
        except Exception as exc:
            ok, reason = False, f"{type(exc).__name__}: {exc}"
        engine.log_answer(op.kind, op.run_id, ok, reason, new_run_id=op.new_run_id,
                          latency_s=time.time() - op.submitted)
        freed = freed or (ok and op.kind == "delete")
    return freed


def delete(engine, rec: R.RunRecord) -> None:
    """The run's memory released (not collected: ``apply_queued``'s caller collects once per
    batch), its checkpoints removed, its status ``deleted``."""
    if rec.status == R.DELETED:
        return
    engine._release(rec, collect=False)
    engine.store.delete_checkpoints(rec.run_id)
    engine._set_status(rec, R.DELETED, reason="deleted by user")


def weights_lost(rec: R.RunRecord) -> bool:
    """A run without live or stored weights whose weights are not just its fresh initialisation:
    it trained (or started warm), so a clone of it that starts fresh would not be warm."""
    return rec.warm_start or rec.completed_steps > rec.step_offset or rec.chunks_done > 0


def weights_lost_reason(rec: R.RunRecord, store: ExperimentStore) -> str:
    return (f"run {rec.run_id} ({rec.status}, {rec.completed_steps - rec.step_offset} steps trained) "
            f"has no weights to warm-start from: its checkpoint {store.checkpoint_path(rec.run_id)} "
            f"is missing (deleted, or a partial copy of the folder); clone it cold (warm_start=False)")


def clone(engine, op, parent: R.RunRecord) -> None:
    """The run ``op`` clones from ``parent`` added to the engine: warm (the parent's weights, as
    ``warm_start_weights`` finds them), or cold. ``OpRefused`` when a warm clone has nothing to
    start from, or its generation settings do not fit the sample prompts."""
    weights = None
    if op.warm_start:
        # a delete queued before this clone was validated may have been applied first
        if parent.status == R.DELETED:
            raise OpRefused(f"run {parent.run_id} was deleted before this warm clone was "
                            "applied; its weights are gone")
        weights = warm_start_weights(engine, parent)
        if weights is None:
            if weights_lost(parent):
                # a silent cold start labelled warm would be a wrong result nobody can see
                raise OpRefused(weights_lost_reason(parent, engine.store))
    # the run_fit check of the sample prompts, for the clone's generation settings: refused
    # now, with the prompt named, rather than failing the clone after its first chunk
    check_sample_generation([op.spec], engine.model_and_tokenizer, engine.sample_prompts,
                            engine.inputs.eval_dataset, engine.inputs.prep_cache,
                            run_ids=[op.new_run_id])
    if weights is not None:
        # on disk before the run exists: a crash in between leaves only an orphan file
        engine.store.save_warm_start(op.new_run_id, weights, op.spec.fingerprint())
    rec = engine.add_run(op.spec, run_id=op.new_run_id, parent=parent, warm_start=op.warm_start,
                         changes=op.changes)
    if weights is not None:
        engine.executor.set_start_weights(rec.run_id, weights)


def warm_start_weights(engine, parent: R.RunRecord) -> dict | None:
    """Where a warm clone starts: the parent's live weights, else its last checkpoint, else
    (a warm clone that never finished a chunk, whatever its status) the weights it started
    from. None when none of these exist."""
    weights = engine.executor.live_weights(parent.run_id)
    if weights is not None:
        return weights
    ckpt = engine.store.load_checkpoint(parent.run_id)
    if ckpt is not None:
        return ckpt["trainer"]["weights"]
    weights = engine.executor.start_weights(parent.run_id)
    if weights is None and parent.warm_start:
        weights = engine.store.load_warm_start(parent.run_id)
    return weights
