"""AutoML at chunk boundaries: ``RFOptuna``, pruners on every search group, freed slots refilled.

    from rapidfire_nb.automl import RFOptuna, RFGridSearch

    group = RFOptuna(configs, trainer_type="SFT", n_initial=8, budget=20,
                     objective="minimize:eval_loss", sampler="tpe", pruner="sha", seed=42)
    exp.run_fit(group, create_model, train, evald, num_chunks=4)
    RFGridSearch(configs, pruner="sha", reduction_factor=2)        # a pruned grid

What lives here: ``ChunkAutoML``, the driver that run_fit's launcher attaches to the engine. The
engine thread calls it at every chunk boundary (``Engine.boundary_hook``) with a read-only view of
the run table; it feeds the pruning policy (``tuning/pruners.py``, pure) and the Optuna study
(``tuning/optuna.py``), and *yields* its decisions as the engine's own ops, ``stop`` (with the
pruning reason) and ``add`` (a new trial's run), and notes to log (a suggestion); the engine acts
on each as it is yielded, as a Ray Tune scheduler's decisions are acted on by its runner. The
driver never calls the engine, and never writes the engine's run table or the event log: it
reads the log and the folded run table, and keeps its own books. The config classes it reads,
``PruningOptions`` and ``RFOptuna``, live in ``rapidfire_nb.automl``. Optuna is imported lazily:
importing ``rapidfire_nb`` never imports it.

Files in the experiment folder: ``automl.json`` (the policy's rung values and decisions, written
after every change) and ``optuna/journal.log`` (Optuna's JournalStorage), so ``resume=True``
restores both and continues to the same decisions.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from rapidfire_nb.automl.pruning import PruningOptions
from rapidfire_nb.engine import (ACTIVE, COMPLETED, DELETED, STOPPED, TERMINAL, Note, Op,
                                 atomic_write_json, get_run, read_json)
from rapidfire_nb.errors import ConfigError, OpRefused
from rapidfire_nb.tuning.objective import bare, is_done, metric_value, missing_objective
from rapidfire_nb.tuning.optuna import _OptunaTuner
from rapidfire_nb.tuning.pruners import Decision, make_policy

# Suggest mode in the event log: the pruner's mark, then the user's answer as an ``op`` event
# (accepted or refused, like every IC op), so a restart and the panel read the same story.
SUGGESTED = "pruning_suggested"
CONFIRM, IGNORE = "confirm_suggestion", "ignore_suggestion"


class ChunkAutoML:
    """Pruning and refilling for one experiment, called by its engine at chunk boundaries.

    Plain values in: the experiment ``folder`` (its books go there), its event log ``events``
    (read, never written), ``table``, the log folded into the run table (engine/state.py's
    ``LiveTable``), the config group, its ``options``, the expanded ``specs`` and
    ``num_chunks``."""

    def __init__(self, folder: Path, events, table, group, options: PruningOptions, specs: list,
                 num_chunks: int):
        self.events, self.table = events, table
        self.group, self.options = group, options
        self.num_chunks = num_chunks
        self.metric = options.objectives[0][1]
        self.unit = 1 if options.granularity == "chunk" else num_chunks
        self.policy = None
        if options.active:
            # hyperband sizes its brackets by the longest data stream (epochs x chunks)
            epochs = max((math.ceil(float(s.training_args.get("num_train_epochs") or 1)) for s in specs),
                         default=1)
            max_chunks = max(1, num_chunks * epochs // self.unit)
            self.policy = make_policy(options.pruner, options.objectives[0][0], options.min_chunks,
                                      options.reduction_factor, max_chunks=max(max_chunks, 4))
        self.state_path = Path(folder) / "automl.json"
        self.suggestions: dict[int, Decision] = {}
        self.dismissed: dict[int, Decision] = {}   # suggestions the user ignored
        self.pruned: dict[int, Decision] = {}
        # confirms whose stop the engine refused (the run ended first), read from the log
        self.late: dict[int, str] = {}
        self._awaiting_stop: set[int] = set()
        self._log_seq = 0
        self._log_lock = threading.Lock()
        self.bracket_of_new: dict[int, Any] = {}
        self.tuner = None
        self.seen: dict[int, int] = {}           # run -> chunks done already reported
        # set once the first eval showed that an objective metric is not logged: the runs were
        # stopped with this reason, and the driver does nothing more (no ranking, no refills)
        self.objective_error: str | None = None
        # Experiment.cancel_current stopped every run: no refills start new trials after it
        self.cancelled = False
        self.initial_ids = list(range(1, len(specs) + 1))
        if self.is_optuna:
            self.tuner = _OptunaTuner(folder, group, specs)
        self.view = None   # the engine's read-only view, from attach()

    @property
    def is_optuna(self) -> bool:
        return hasattr(self.group, "sampler") and hasattr(self.group, "budget")

    # -- resume ------------------------------------------------------------------------------
    def load(self) -> None:
        """automl.json back into the driver; a damaged file raises ``MetadataError`` naming it and
        the field, and changes nothing (it is read before the resume writes anything)."""
        from rapidfire_nb.engine import check_automl_state

        data = check_automl_state(read_json(self.state_path, None, expect=dict), self.state_path)
        if data is None:
            return
        try:
            if self.policy is not None and data.get("policy"):
                self.policy.load_json(data["policy"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            from rapidfire_nb.engine import MetadataError

            raise MetadataError(f"{self.state_path}: field 'policy' is damaged ({type(exc).__name__}: "
                                f"{exc}); it was left as it is") from None
        self.suggestions = {int(k): Decision(**v) for k, v in (data.get("suggestions") or {}).items()}
        self.pruned = {int(k): Decision(**v) for k, v in (data.get("pruned") or {}).items()}
        self.dismissed = {int(k): Decision(**v) for k, v in (data.get("dismissed") or {}).items()}
        self.seen = {int(k): v for k, v in (data.get("seen") or {}).items()}
        self.objective_error = data.get("objective_error")

    def save(self) -> None:
        atomic_write_json(self.state_path, {
            "policy": None if self.policy is None else self.policy.to_json(),
            "suggestions": {str(k): vars(v) for k, v in self.suggestions.items()},
            "pruned": {str(k): vars(v) for k, v in self.pruned.items()},
            "dismissed": {str(k): vars(v) for k, v in self.dismissed.items()},
            "seen": {str(k): v for k, v in self.seen.items()},
            "objective_error": self.objective_error,
        })

    def spec_for(self, run_id: int):
        """The spec of a run this driver added (a refill), for ``resume=True``."""
        return None if self.tuner is None else self.tuner.spec_for(run_id)

    def rung_values_from_log(self) -> dict[int, dict[int, float]]:
        """run -> {chunks done: objective} as logged (restored runs have no live metrics)."""
        last: dict[int, float] = {}
        out: dict[int, dict[int, float]] = {}
        # the log was checked against the schema when it was opened (engine/events.py): these
        # fields are there and of their types
        for ev in self.events.since(0):
            if ev["type"] == "metric" and ev.get("split") == "eval":
                v = metric_value(ev.get("metrics"), self.metric)
                if v is not None:
                    last[ev["run_id"]] = v
            elif ev["type"] == "chunk_done" and ev.get("run_id") in last:
                out.setdefault(ev["run_id"], {})[ev.get("chunks_done")] = last[ev["run_id"]]
        return out

    def last_logged(self, run_id: int, metric: str):
        """The run's last logged eval value of ``metric`` (a restored run has no live metrics),
        read from the folded run table (engine/state.py): no rescan of the log.
        A NaN is folded to None there; both mean "no usable value" to the caller (a FAIL)."""
        def last(table):
            run = get_run(table, run_id)
            series = run["series"]["eval"] if run is not None else {}
            for key in (metric, f"eval_{metric}"):
                if series.get(key, {}).get("y"):
                    return series[key]["y"][-1]
            return None

        value = self.table.read(last)
        return None if value is None else float(value)

    def attach(self, view, resumed: bool) -> None:
        """Ready to decide over ``view`` (the engine's read-only ``EngineView``); on resume the
        log's story first. The launcher then sets ``on_boundary`` as the engine's hook and keeps
        ``handed_out_ids()`` from being given to other runs."""
        self.view = view
        self._logged = self.rung_values_from_log() if resumed else {}
        self._restop: dict[int, int] = {}       # run -> chunks done at which its stop is due
        if resumed:
            self._replay_suggestions()
            # killed between a decision (saved) and its stop (not yet applied or logged): the run
            # came back pending; stop it where the uninterrupted session did. A pruned run the
            # user later resumed by hand has its pruning stop in the log and is left alone.
            applied = {ev.get("run_id") for ev in self.events.since(0)
                       if ev["type"] == "run_status" and ev.get("status") == STOPPED
                       and ev.get("reason") == getattr(self.pruned.get(ev.get("run_id")), "reason", None)}
            confirmed = {ev["run_id"] for ev in self.events.since(0)
                         if ev["type"] == "op" and ev.get("op") == CONFIRM and ev.get("accepted")}
            for rid in sorted(self.pruned):
                if rid in applied:
                    continue
                # A pruner's stop came right after the chunk that reached its rung; that chunk's
                # checkpoint may not have been durable at the kill, so the run may first have to
                # train it again (same data, same weights: the same value). A user's confirm came
                # at no particular chunk: it is applied at once.
                due = 0 if rid in confirmed else self.pruned[rid].rung * self.unit
                self._restop[rid] = due
        if self.tuner is not None:
            self.tuner.policy = self.policy
            self.tuner.attach(view, resumed)

    def handed_out_ids(self) -> set[int]:
        """Run ids the study gave its trials, whether their run exists yet (restored at the first
        boundary), never will (its add was refused) or does: no clone may take one."""
        return set(self.tuner.trial_of) if self.tuner is not None else set()

    # -- the hook ----------------------------------------------------------------------------
    def on_boundary(self, view):
        """Engine thread, under the engine lock, between chunks: learn from ``view.runs`` (the
        engine's run table, read-only), decide, and yield the decisions as the engine's ops
        (``stop`` with the pruning reason, ``add`` for a trial's run) and notes (events to log).
        The engine acts on each as it is yielded, so what was decided before a later step here
        raises is acted on. The driver keeps its own books (automl.json, the study)."""
        runs = view.runs
        changed = False
        for rid, due in list(self._restop.items()):
            rec = runs.get(rid)
            if rec is None or rec.status not in ACTIVE:
                del self._restop[rid]
            elif is_done(rec):
                del self._restop[rid]       # nothing left to stop
            elif rec.chunks_done >= due:
                yield Op("stop", rid, reason=self.pruned[rid].reason, pruned=True)
                del self._restop[rid]
        if self.objective_error is not None or self.cancelled:
            return
        if (yield from self._objective_absent(runs)):
            self.save()
            return
        if self.tuner is not None:
            changed |= yield from self.tuner.restore_missing_runs(runs)
        for rid, rec in sorted(runs.items()):
            changed |= self._observe(rid, rec)
        decisions = self.policy.decide() if self.policy is not None else []
        for d in decisions:
            d = self._in_units(d)
            changed = True
            if self.options.mode == "stop":
                self.pruned[d.run_id] = d
                if self.tuner is not None:
                    self.tuner.prune(d.run_id)
                yield Op("stop", d.run_id, reason=d.reason, pruned=True)
            elif d.run_id not in self.suggestions and d.run_id not in self.dismissed \
                    and d.run_id not in self.pruned:
                # answered marks are in the log even when automl.json was lost: not asked twice;
                # an event, not only automl.json: the panel shows it and a restart replays it
                self.suggestions[d.run_id] = d
                yield Note(SUGGESTED, dict(run_id=d.run_id, rung=d.rung, rank=d.rank,
                                           of=d.of, reason=d.reason))
        if self.tuner is not None:
            changed |= self.tuner.settle(self, runs)
            changed |= yield from self.tuner.refill(self, view)
        if changed:
            self.save()

    def _objective_absent(self, runs):
        """After the first eval of any run: is every objective metric among its eval metrics?
        If not, stop every unfinished run with a reason that names the metric and what was logged,
        instead of training the whole budget blind (a pruner that never fires, a sampler that
        learns nothing: a silent random search). A generator of decisions; returns True when an
        objective is absent."""
        for rid, rec in sorted(runs.items()):
            evals = {k: v for k, v in rec.last_metrics.items() if k.startswith("eval_")}
            if rec.chunks_done < 1 or not evals:
                continue
            metric = missing_objective(self.options.objectives, evals)
            if metric is None:
                return False
            self.objective_error = (
                f"objective {metric!r} is not among the eval metrics of run {rid} "
                f"({', '.join(sorted(evals))}): a compute_metrics must return it "
                f"(as {bare(metric)!r} or 'eval_{bare(metric)}'); stopped before more training")
            for other, r in sorted(runs.items()):
                if r.status in ACTIVE and not is_done(r):
                    yield Op("stop", other, reason=self.objective_error)
            return True
        return False

    def _in_units(self, d: Decision) -> Decision:
        if self.unit == 1:
            return d
        return Decision(d.run_id, d.rung, d.rank, d.of,
                          f"pruned at epoch {d.rung} (rank {d.rank} of {d.of})")

    def _observe(self, rid: int, rec) -> bool:
        """Report every chunk ``rec`` finished since the last call; sync its live/finished state.

        Everything read here is written by the engine thread itself (counters, last metrics,
        statuses set between chunks), so what the hook sees does not depend on the checkpoint
        writer's timing: a run counts as finished when its counters reach its total steps."""
        changed = False
        first = rid not in self.seen
        if first:
            fresh_warm = rec.warm_start and rec.completed_steps == rec.step_offset
            self.seen[rid] = rec.chunks_done if fresh_warm else 0
            changed = True
            if self.policy is not None and rid not in self.policy.members:
                bracket = self.bracket_of_new.pop(rid, None)
                if bracket is None and self.tuner is not None:
                    bracket = self.tuner.brackets.get(rid)     # a refill restored after a crash
                self.policy.add_run(rid, bracket=bracket,
                                    parent=rec.parent_run_id, chunks=self.seen[rid] // self.unit)
        # bounded by the run's own counter (checked against its plan on resume), never by a
        # number read from automl.json: this runs under the engine lock
        for chunks in range(min(max(self.seen[rid], 0), rec.chunks_done) + 1, rec.chunks_done + 1):
            changed = True
            if chunks % self.unit:
                continue
            value = metric_value(rec.last_metrics, self.metric) if chunks == rec.chunks_done else None
            if value is None:
                value = self._logged.get(rid, {}).get(chunks)
            if self.policy is not None:
                self.policy.report(rid, chunks // self.unit, value)
            if self.tuner is not None and value is not None:
                self.tuner.report(rid, chunks, value)
        self.seen[rid] = max(self.seen[rid], rec.chunks_done)
        if self.policy is not None:
            m = self.policy.members[rid]
            finished = is_done(rec)
            live = rec.status in ACTIVE and not finished
            if m.pruned is None and (m.live, m.finished) != (live, finished):
                self.policy.set_state(rid, live, finished)
                changed = True
        return changed

    # -- user-facing ---------------------------------------------------------------------------
    def reason_for(self, run_id: int) -> str | None:
        """The pruning note of a run for ``get_runs_info`` (None if the pruner never judged it)."""
        view = self.view
        if view is None:
            return self._reason_for(run_id, None)
        # under the engine's lock: a mark the hook made is seen with its logged event, never
        # before the engine logged it
        with view.atomically():
            return self._reason_for(run_id, view.runs.get(run_id))

    def _reason_for(self, run_id: int, rec) -> str | None:
        if run_id in self.pruned:
            reason = self.pruned[run_id].reason
            if run_id in self._late_confirms():
                return f"suggested: {reason}; confirmed, but the run had {rec.status if rec else 'ended'}"
            if rec is not None and rec.status == DELETED:
                reason += "; then deleted"
            elif rec is not None and rec.status != STOPPED and run_id not in self._awaiting_stop:
                # a pruned run is stopped: only a resume makes it train (or end) again
                reason += f"; then resumed by hand ({rec.status})"
            return reason
        if run_id in self.suggestions:
            reason = "suggested: " + self.suggestions[run_id].reason
            if rec is not None and _ended(rec):
                reason += f"; run {COMPLETED if is_done(rec) else rec.status}"
            return reason
        if run_id in self.dismissed:
            return f"suggested: {self.dismissed[run_id].reason}; ignored by user"
        if self.objective_error is not None:
            return self.objective_error
        return None

    def _late_confirms(self) -> dict[int, str]:
        """Confirmed runs whose stop the engine refused because the run ended first (a confirm
        during the last chunk): the first ``stop`` op after an accepted confirm tells. Read from
        the log, so it holds after a restart too."""
        with self._log_lock:
            for ev in self.events.since(self._log_seq):
                self._log_seq = ev["seq"]
                if ev["type"] != "op":
                    continue
                rid = ev.get("run_id")
                if ev.get("op") == CONFIRM and ev.get("accepted"):
                    self._awaiting_stop.add(rid)
                elif ev.get("op") == "stop" and rid in self._awaiting_stop:
                    self._awaiting_stop.discard(rid)
                    if not ev.get("accepted"):
                        self.late[rid] = ev.get("reason") or ""
            return self.late

    def _wanted(self, run_ids) -> list[int]:
        """The suggested runs named (all when None); an unmarked id refuses the whole call."""
        import numbers

        if run_ids is None:      # every open mark: those on runs that ended are closed
            return sorted(r for r in self.suggestions if not _ended(self.view.project(r)))
        if isinstance(run_ids, numbers.Integral) and not isinstance(run_ids, bool):
            run_ids = [run_ids]
        if isinstance(run_ids, (str, bytes, dict)) or not hasattr(run_ids, "__iter__"):
            raise OpRefused(f"run_ids must be a run id or a list of run ids, got {run_ids!r}")
        wanted: list[int] = []
        for rid in run_ids:
            # ids read back from get_runs_info() are numpy integers: the same run ids
            if isinstance(rid, bool) or not isinstance(rid, numbers.Integral):
                raise OpRefused(f"run id must be an integer, got {rid!r}")
            if int(rid) not in self.suggestions:
                raise OpRefused(f"run {int(rid)} has no pruning suggestion; suggested runs are "
                                f"{sorted(self.suggestions)}")
            if int(rid) not in wanted:      # a repeated id is answered once
                wanted.append(int(rid))
        return wanted

    def apply_suggestions(self, run_ids, act) -> list[int]:
        """Stop the runs the pruner suggested (all open marks, or ``run_ids``); returns the runs
        stopped. A named run that is not pending/running (completed, failed, deleted, or stopped,
        queued ops included) is skipped: its answer is logged as refused ("run N is completed"),
        it is not in the returned list, and its mark stays in the table as closed. The Optuna
        trial is told PRUNED once the stop has taken effect (a run that completes first is told
        COMPLETE). ``act`` is handed each decision (the user's answer as a note, the stop as an
        op) and acts on it."""
        view = self.view
        with view.atomically():
            wanted = self._wanted(run_ids)
            runs = view.snapshot()
            done = []
            for rid in wanted:
                d = self.suggestions.pop(rid)
                # as the queued ops will leave it: a stop or delete already asked for wins
                status = view.project(rid).status
                if status in ACTIVE and not is_done(runs[rid]):
                    self.pruned[rid] = d
                    act(_answer(CONFIRM, rid, True, d.reason))
                    act(Op("stop", rid, reason=d.reason, pruned=True))
                    done.append(rid)
                else:
                    self.suggestions[rid] = d      # closed, but the pruner's judgement stays shown
                    act(_answer(CONFIRM, rid, False, f"run {rid} is {_status(view, rid)}"))
            self.save()
        return done

    def dismiss_suggestions(self, run_ids, act) -> list[int]:
        """Keep training the suggested runs (all open marks, or ``run_ids``): the marks go, and
        the pruner does not judge these runs again. Returns the runs dismissed. As in
        ``apply_suggestions``, a named run that ended (completed, failed, deleted, queued ops
        included) is skipped with its answer logged as refused; a stopped run can be resumed,
        so its mark can be ignored. ``act`` acts on each answer, as for ``apply_suggestions``."""
        view = self.view
        with view.atomically():
            done = []
            for rid in self._wanted(run_ids):
                if _ended(view.project(rid)):
                    act(_answer(IGNORE, rid, False, f"run {rid} is {_status(view, rid)}"))
                    continue
                self.dismissed[rid] = self.suggestions.pop(rid)
                act(_answer(IGNORE, rid, True, None))
                done.append(rid)
            self.save()
        return done

    def _replay_suggestions(self) -> None:
        """Suggestions and their answers as the event log tells them (it outlives automl.json's
        last save): open marks come back, and a confirm whose stop a kill cut off is redone."""
        marks: dict[int, Decision] = {}
        for ev in self.events.since(0):
            if ev["type"] == SUGGESTED:     # its fields were checked when the log was opened
                marks[ev["run_id"]] = Decision(ev["run_id"], ev["rung"], ev["rank"], ev["of"],
                                                 ev["reason"])
            elif ev["type"] == "op" and ev.get("op") in (CONFIRM, IGNORE) and ev.get("run_id") in marks:
                d = marks.pop(ev["run_id"])
                if ev["op"] == CONFIRM and ev.get("accepted"):
                    self.pruned.setdefault(d.run_id, d)
                elif ev["op"] == IGNORE and ev.get("accepted"):
                    self.dismissed.setdefault(d.run_id, d)
        self.suggestions = marks


def _answer(op: str, rid: int, accepted: bool, reason: str | None) -> Note:
    """The user's answer to a suggestion, logged as every op's answer is (``Engine.log_answer``)."""
    return Note("op", dict(op=op, run_id=rid, accepted=accepted, reason=reason, new_run_id=None,
                           latency_s=0.0))


def _ended(view) -> bool:
    """Completed, failed or deleted (or done training): a mark on it can no longer be acted on."""
    if view is None:
        return True
    rec = getattr(view, "record", view)
    return view.status in TERMINAL or (rec is not None and is_done(rec))


def _status(engine_view, rid: int) -> str:
    view = engine_view.project(rid)
    if view is None:
        return "gone"
    rec = view.record
    return COMPLETED if view.status in ACTIVE and rec is not None and is_done(rec) else view.status


def needs_driver(group) -> bool:
    """True for RFOptuna and for any group with a pruner."""
    options = getattr(group, "pruning", None)
    return options is not None and (options.active or hasattr(group, "budget"))


def pruning_settings(group) -> dict:
    """The knobs that steer the pruner's and the sampler's decisions, for experiment.json: a
    resume with other values would judge the old rungs by new rules (``launch/resume.py``)."""
    if not needs_driver(group):
        return {"pruner": None}
    o = group.pruning
    out = {"pruner": o.pruner, "pruner_mode": o.mode,
           "objective": ", ".join(f"{d}:{bare(m)}" for d, m in o.objectives),
           "reduction_factor": o.reduction_factor, "min_chunks": o.min_chunks,
           "granularity": o.granularity}
    if hasattr(group, "budget"):
        out.update(sampler=group.sampler, n_initial=group.n_initial, budget=group.budget,
                   optuna_seed=group.seed)
    return out


def check_pruning_resume(stored: dict | None, given: dict) -> None:
    """Refuse a resume whose pruning knobs differ from the stored ones (an older folder saved
    none: nothing to compare)."""
    if not isinstance(stored, dict):
        return
    for key in dict.fromkeys(["pruner", "pruner_mode", *sorted(stored), *sorted(given)]):
        if key == "pruner" or stored.get("pruner") is not None:
            if stored.get(key) != given.get(key):
                knob = "seed (of RFOptuna)" if key == "optuna_seed" else key
                raise ConfigError(f"resume=True needs the original {knob}={stored.get(key)!r} "
                                  f"(got {given.get(key)!r}): the pruner's stored rungs and "
                                  f"decisions were made with it; pass the same config group")


def driver_for(folder: Path, events, table, group, specs, num_chunks: int) -> ChunkAutoML | None:
    """The AutoML driver a config group asks for, or None (plain grid/random search)."""
    if not needs_driver(group):
        return None
    return ChunkAutoML(folder, events, table, group, group.pruning, specs, num_chunks)
