"""AutoML at chunk boundaries: ``RFOptuna``, pruners on every search group, freed slots refilled.

    from rapidfire_nb.automl import RFOptuna, RFGridSearch

    group = RFOptuna(configs, trainer_type="SFT", n_initial=8, budget=20,
                     objective="minimize:eval_loss", sampler="tpe", pruner="sha", seed=42)
    exp.run_fit(group, create_model, train, evald, num_chunks=4)
    RFGridSearch(configs, pruner="sha", reduction_factor=2)        # a pruned grid

What lives here: ``ChunkAutoML``, the driver the Experiment attaches to its engine. The driver is called by the
engine thread at every chunk boundary (``Engine.boundary_hook``); it feeds the pruning policy
(``engine/pruning.py``, pure) and the Optuna study, then returns its decisions as the engine's own
ops, ``stop`` (with the pruning reason) and ``add`` (a new trial's run), and notes to log (a
suggestion); the engine acts on them, as a Ray Tune scheduler's decisions are acted on by its
runner. The driver never writes the engine's run table or the event log itself. The config classes it reads,
``PruningOptions`` and ``RFOptuna``, live in ``rapidfire_nb.automl`` (re-exported here). Optuna is
imported lazily: importing ``rapidfire_nb`` never imports it.

Files in the experiment folder: ``automl.json`` (the policy's rung values and decisions, written
after every change) and ``optuna/journal.log`` (Optuna's JournalStorage), so ``resume=True``
restores both and continues to the same decisions.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

# the config classes live in automl/ (config only); re-exported here for the driver's callers
from rapidfire_nb.automl.optuna_search import SAMPLERS, RFOptuna, _optuna, make_sampler, suggest
from rapidfire_nb.automl.pruning import GRANULARITIES, MODES, PruningOptions, parse_objective

__all__ = ["SAMPLERS", "RFOptuna", "make_sampler", "suggest", "GRANULARITIES", "MODES", "PruningOptions",
           "parse_objective", "ChunkAutoML", "driver_for", "needs_driver", "pruning_settings",
           "check_pruning_resume", "check_objective_is_logged"]
from rapidfire_nb.engine import (ACTIVE, COMPLETED, DELETED, FAILED, STOPPED, TERMINAL, Decision, Note,
                                 Op, atomic_write_json, get_run, make_policy, read_json)
from rapidfire_nb.errors import ConfigError, OpRefused

# Suggest mode in the event log: the pruner's mark, then the user's answer as an ``op`` event
# (accepted or refused, like every IC op), so a restart and the panel read the same story.
SUGGESTED = "pruning_suggested"
CONFIRM, IGNORE = "confirm_suggestion", "ignore_suggestion"


def rfoptuna_class():
    """The ``RFOptuna`` class (kept for callers of the time it was built on first use)."""
    return RFOptuna


# ============================================================================================
# The driver


def is_done(rec) -> bool:
    """Finished as far as the engine thread knows (the writer sets ``completed`` a bit later)."""
    return rec.status == COMPLETED or (rec.status in ACTIVE and rec.total_steps > 0
                                       and rec.completed_steps >= rec.total_steps)


# What each trainer logs at every eval without a compute_metrics (engine/trainers.py evaluate():
# eval_loss plus what TRL's SFTTrainer.compute_loss records in _metrics["eval"]). DPO and GRPO log
# more (rewards/..., logps/..., one reward per reward function), which depends on TRL and on the
# config, so for them an objective is checked at run time only, after the first eval.
SFT_EVAL_METRICS = ("loss", "entropy", "mean_token_accuracy", "aux_loss")


def _bare(metric: str) -> str:
    return metric[len("eval_"):] if metric.startswith("eval_") else metric


def check_objective_is_logged(group, specs) -> None:
    """Refuse, before anything trains, an objective that a run can never log: an SFT run without
    ``compute_metrics`` logs only SFT_EVAL_METRICS, so a pruner or RFOptuna judging by anything
    else would never see a value (every trial trained in full, a sampler that learns nothing)."""
    options = getattr(group, "pruning", None)
    if options is None:
        return
    where = type(group).__name__
    for _, metric in options.objectives:
        if _bare(metric) in SFT_EVAL_METRICS:
            continue
        blind = [i for i, s in enumerate(specs, 1)
                 if s.trainer_type == "SFT" and s.compute_metrics is None]
        if blind:
            logged = ", ".join(f"eval_{m}" for m in SFT_EVAL_METRICS)
            raise ConfigError(
                f"{where}: objective metric {metric!r} is never logged by run(s) "
                f"{', '.join(map(str, blind[:8]))}{'...' if len(blind) > 8 else ''}: an SFT run "
                f"without compute_metrics logs only {logged}. Give RFModelConfig a compute_metrics "
                f"that returns {_bare(metric)!r}, or use one of those (e.g. 'minimize:eval_loss').")


def missing_objective(objectives, metrics: dict) -> str | None:
    """The first objective metric absent from one eval's ``metrics`` (None if all are there)."""
    for _, metric in objectives:
        if _metric_value(metrics, metric) is None:
            return metric
    return None


def _metric_value(metrics: dict, name: str):
    """The metric as a float, or None: a value that is not a number (a string in a crafted log,
    or from a compute_metrics) is no value to rank on."""
    if not isinstance(metrics, dict):
        return None
    for key in (name, f"eval_{name}"):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


class ChunkAutoML:
    """Pruning and refilling for one Experiment, called by its engine at chunk boundaries."""

    def __init__(self, exp, group, options: PruningOptions, specs: list, num_chunks: int):
        self.exp, self.group, self.options = exp, group, options
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
        self.state_path = Path(exp.path) / "automl.json"
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
        self.initial_ids = list(range(1, len(specs) + 1))
        if self.is_optuna:
            self.tuner = _OptunaTuner(exp, group, specs)

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
        for ev in self.exp.events.since(0):
            if ev["type"] == "metric" and ev.get("split") == "eval":
                v = _metric_value(ev.get("metrics"), self.metric)
                if v is not None:
                    last[ev["run_id"]] = v
            elif ev["type"] == "chunk_done" and ev.get("run_id") in last:
                out.setdefault(ev["run_id"], {})[ev.get("chunks_done")] = last[ev["run_id"]]
        return out

    def last_logged(self, run_id: int, metric: str):
        """The run's last logged eval value of ``metric`` (a restored run has no live metrics),
        read from the Experiment's folded run table (engine/state.py): no rescan of the log.
        A NaN is folded to None there; both mean "no usable value" to the caller (a FAIL)."""
        def last(table):
            run = get_run(table, run_id)
            series = run["series"]["eval"] if run is not None else {}
            for key in (metric, f"eval_{metric}"):
                if series.get(key, {}).get("y"):
                    return series[key]["y"][-1]
            return None

        value = self.exp._state().read(last)
        return None if value is None else float(value)

    def attach(self, engine, resumed: bool) -> None:
        self.engine = engine
        self._logged = self.rung_values_from_log() if resumed else {}
        self._restop: dict[int, int] = {}       # run -> chunks done at which its stop is due
        if resumed:
            self._replay_suggestions()
            # killed between a decision (saved) and its stop (not yet applied or logged): the run
            # came back pending; stop it where the uninterrupted session did. A pruned run the
            # user later resumed by hand has its pruning stop in the log and is left alone.
            applied = {ev.get("run_id") for ev in self.exp.events.since(0)
                       if ev["type"] == "run_status" and ev.get("status") == STOPPED
                       and ev.get("reason") == getattr(self.pruned.get(ev.get("run_id")), "reason", None)}
            confirmed = {ev["run_id"] for ev in self.exp.events.since(0)
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
            self.tuner.attach(engine, resumed)
        engine.boundary_hook = self.on_boundary

    # -- the hook ----------------------------------------------------------------------------
    def on_boundary(self, runs, out: list) -> None:
        """Engine thread, under the engine lock, between chunks: learn from ``runs`` (the engine's
        run table, read-only), decide, and append the decisions to ``out`` as the engine's ops
        (``stop`` with the pruning reason, ``add`` for a trial's run) and notes (events to log);
        the engine acts on them in order, even when a later step here raises. The driver keeps
        its own books (automl.json, the study)."""
        changed = False
        for rid, due in list(self._restop.items()):
            rec = runs.get(rid)
            if rec is None or rec.status not in ACTIVE:
                del self._restop[rid]
            elif is_done(rec):
                del self._restop[rid]       # nothing left to stop
            elif rec.chunks_done >= due:
                out.append(Op("stop", rid, reason=self.pruned[rid].reason))
                del self._restop[rid]
        if self.objective_error is not None:
            return
        if self._objective_absent(runs, out):
            self.save()
            return
        if self.tuner is not None:
            changed |= self.tuner.restore_missing_runs(runs, out)
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
                out.append(Op("stop", d.run_id, reason=d.reason))
            elif d.run_id not in self.suggestions and d.run_id not in self.dismissed \
                    and d.run_id not in self.pruned:
                # answered marks are in the log even when automl.json was lost: not asked twice;
                # an event, not only automl.json: the panel shows it and a restart replays it
                self.suggestions[d.run_id] = d
                out.append(Note(SUGGESTED, dict(run_id=d.run_id, rung=d.rung, rank=d.rank,
                                                of=d.of, reason=d.reason)))
        if self.tuner is not None:
            changed |= self.tuner.settle(self, runs)
            changed |= self.tuner.refill(self, runs, out)
        if changed:
            self.save()

    def _objective_absent(self, runs, out: list) -> bool:
        """After the first eval of any run: is every objective metric among its eval metrics?
        If not, stop every unfinished run with a reason that names the metric and what was logged,
        instead of training the whole budget blind (a pruner that never fires, a sampler that
        learns nothing: a silent random search)."""
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
                f"(as {_bare(metric)!r} or 'eval_{_bare(metric)}'); stopped before more training")
            out.extend(Op("stop", other, reason=self.objective_error)
                       for other, r in sorted(runs.items()) if r.status in ACTIVE and not is_done(r))
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
            value = _metric_value(rec.last_metrics, self.metric) if chunks == rec.chunks_done else None
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
        engine = getattr(self, "engine", None)
        if engine is None:
            return self._reason_for(run_id, None)
        # under the engine's lock: a mark the hook made is seen with its logged event, never
        # before the engine logged it
        with engine.atomically():
            return self._reason_for(run_id, engine.runs.get(run_id))

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
            for ev in self.exp.events.since(self._log_seq):
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
            return sorted(r for r in self.suggestions if not _ended(project_rec(self.engine, r)))
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

    def _answer(self, op: str, rid: int, accepted: bool, reason: str | None) -> None:
        self.engine.log_answer(op, rid, accepted, reason)

    def apply_suggestions(self, run_ids=None) -> list[int]:
        """Stop the runs the pruner suggested (all open marks, or ``run_ids``); returns the runs
        stopped. A named run that is not pending/running (completed, failed, deleted, or stopped,
        queued ops included) is skipped: its answer is logged as refused ("run N is completed"),
        it is not in the returned list, and its mark stays in the table as closed. The Optuna
        trial is told PRUNED once the stop has taken effect (a run that completes first is told
        COMPLETE)."""
        from rapidfire_nb.engine import project

        engine = self.engine
        with engine.atomically():
            wanted = self._wanted(run_ids)
            runs = engine.snapshot()
            done = []
            for rid in wanted:
                d = self.suggestions.pop(rid)
                # as the queued ops will leave it: a stop or delete already asked for wins
                status = project(engine, rid).status
                if status in ACTIVE and not is_done(runs[rid]):
                    self.pruned[rid] = d
                    self._answer(CONFIRM, rid, True, d.reason)
                    engine.submit(Op("stop", rid, reason=d.reason))
                    done.append(rid)
                else:
                    self.suggestions[rid] = d      # closed, but the pruner's judgement stays shown
                    self._answer(CONFIRM, rid, False, f"run {rid} is {_status(engine, rid)}")
            self.save()
        return done

    def dismiss_suggestions(self, run_ids=None) -> list[int]:
        """Keep training the suggested runs (all open marks, or ``run_ids``): the marks go, and
        the pruner does not judge these runs again. Returns the runs dismissed. As in
        ``apply_suggestions``, a named run that ended (completed, failed, deleted, queued ops
        included) is skipped with its answer logged as refused; a stopped run can be resumed,
        so its mark can be ignored."""
        with self.engine.atomically():
            done = []
            for rid in self._wanted(run_ids):
                if _ended(project_rec(self.engine, rid)):
                    self._answer(IGNORE, rid, False, f"run {rid} is {_status(self.engine, rid)}")
                    continue
                self.dismissed[rid] = self.suggestions.pop(rid)
                self._answer(IGNORE, rid, True, None)
                done.append(rid)
            self.save()
        return done

    def _replay_suggestions(self) -> None:
        """Suggestions and their answers as the event log tells them (it outlives automl.json's
        last save): open marks come back, and a confirm whose stop a kill cut off is redone."""
        marks: dict[int, Decision] = {}
        for ev in self.exp.events.since(0):
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


def project_rec(engine, rid: int):
    """The run as its queued ops will leave it (its record's counters, the projected status)."""
    from rapidfire_nb.engine import project

    return project(engine, rid)


def _ended(view) -> bool:
    """Completed, failed or deleted (or done training): a mark on it can no longer be acted on."""
    if view is None:
        return True
    rec = getattr(view, "record", view)
    return view.status in TERMINAL or (rec is not None and is_done(rec))


def _status(engine, rid: int) -> str:
    view = project_rec(engine, rid)
    if view is None:
        return "gone"
    rec = view.record
    return COMPLETED if view.status in ACTIVE and rec is not None and is_done(rec) else view.status


class _HeldFolderLock:
    """Optuna's journal lock for a folder that the Experiment already owns (its ``.lock``
    flock: one live engine per folder, and only the kernel's driver writes the journal). Optuna's
    default lock is a symbolic link beside the journal, which a kill leaves behind, and an
    experiment folder holding a link is refused when it is opened again."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        return None


class _SearchSpaceTrial:
    """Answers ``suggest`` from a stored trial's params, refusing any value outside the space
    that run_fit's config group defines (``ConfigError`` naming the journal, trial and param)."""

    def __init__(self, params: dict, number: int, where: Path):
        self.params, self.number, self.where = dict(params), number, where

    def _value(self, name: str, allowed: str, ok) -> Any:
        if name not in self.params:
            raise ConfigError(f"{self.where}: trial {self.number} has no value for {name!r}; the "
                              "journal was cut short or edited")
        value = self.params[name]
        if not ok(value):
            raise ConfigError(f"{self.where}: trial {self.number}'s {name}={value!r:.80} is not in "
                              f"run_fit's search space ({allowed}): the journal was edited or damaged; "
                              "nothing was changed")
        return value

    def suggest_categorical(self, name, choices):
        def ok(v):
            return any(type(v) is type(c) and v == c for c in choices)

        return self._value(name, f"one of {list(choices)!r:.200}", ok)

    def suggest_int(self, name, low, high, log=False, step=1):
        return self._value(name, f"an integer in [{low}, {high}], step {step}",
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= high
                           and (v - low) % step == 0)

    def suggest_float(self, name, low, high, log=False, step=None):
        def ok(v):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                    or not low <= v <= high:
                return False
            # on the step's grid, to float precision (Optuna stores the rounded multiple)
            return step is None or abs((v - low) / step - round((v - low) / step)) < 1e-6

        return self._value(name, f"a number in [{low}, {high}]" + (f", step {step}" if step else ""), ok)


class _OptunaTuner:
    """The Optuna side of ``RFOptuna``: the study in the experiment folder, trial <-> run."""

    def __init__(self, exp, group, specs):
        optuna = _optuna()
        self.optuna, self.exp, self.group = optuna, exp, group
        # opened on first use, not here: a resume that run_fit then refuses must leave the folder
        # as it was (creating the journal, or Optuna's create_study, would write to it)
        self.journal_path = Path(exp.path) / "optuna" / "journal.log"
        self._study = None
        self.multi = len(group.directions()) > 1
        self.specs: dict[int, Any] = {}
        self.trial_of: dict[int, int] = {}       # run id -> trial number
        self.brackets: dict[int, Any] = {}       # run id -> pruning bracket (refills)
        self.initial_specs = specs

    def _storage(self):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        try:
            return JournalStorage(JournalFileBackend(str(self.journal_path), lock_obj=_HeldFolderLock()))
        except Exception as exc:   # a damaged or crafted journal: Optuna's replay raises anything
            raise ConfigError(f"{self.journal_path} cannot be read ({type(exc).__name__}: "
                              f"{str(exc)[:200]}); it was left as it is") from None

    def _stored_study(self):
        """The folder's study, read without writing anything (None when there is none)."""
        if not self.journal_path.is_file():
            return None
        storage = self._storage()
        if not any(s.study_name == "rapidfire" for s in storage.get_all_studies()):
            return None
        return self.optuna.load_study(study_name="rapidfire", storage=storage)

    @property
    def study(self):
        if self._study is None:
            study = self._stored_study()
            if study is None:
                self.journal_path.parent.mkdir(parents=True, exist_ok=True)
                # create_study(load_if_exists=True) would log a second "create study" on every
                # resume: it is called only when the journal holds no study yet
                study = self.optuna.create_study(study_name="rapidfire", storage=self._storage(),
                                                 directions=self.group.directions())
            self._study = study
            self.group._study = study     # RapidFire's tutorials read config_group._study
        return self._study

    def _trials(self):
        return self.study.get_trials(deepcopy=False)

    def attach(self, engine, resumed: bool) -> None:
        self.engine = engine
        trials = self._trials()
        if not trials:
            # the experiment's study starts with exactly the trials expand() asked in scratch
            for number, (_leaf, params) in enumerate(self.group._initial_trials()):
                self.study.enqueue_trial(params, skip_if_exists=False)
                self.study.sampler = make_sampler(self.group.sampler, self.group.seed, number)
                trial = self.study.ask()
                suggest(self.group._tree(), trial)
                trial.set_user_attr("run_id", number + 1)
            trials = self._trials()
        for t in trials:
            rid = t.user_attrs.get("run_id")
            if rid is None and not t.state.is_finished():
                # killed between study.ask() and naming the trial's run: finish the ask and name
                # the run now, as the uninterrupted session did next (the restore adds the run)
                rid = max(set(self.trial_of) | set(engine.run_ids())) + 1
                t = self._finish_lost_ask(t, trials)
                self.optuna.trial.Trial(self.study, t._trial_id).set_user_attr("run_id", rid)
            if rid is not None:
                self.trial_of[rid] = t.number
                self.brackets[rid] = t.user_attrs.get("bracket")
                if rid > len(self.initial_specs):
                    try:
                        self.specs[rid] = self._spec_of(t)
                    except Exception:     # killed in the middle of its suggestions
                        self.study.tell(t.number, state=self.optuna.trial.TrialState.FAIL)
        # every id the study handed out stays its trial's, whether its run exists yet (restored
        # at the first boundary), never will (its add was refused) or does: a clone asked for
        # before then never takes one
        engine.reserve_run_ids(self.trial_of)

    def _finish_lost_ask(self, lost, trials):
        """A trial asked just before a kill may lack some (or all) of its suggestions and its
        bracket. Its sampler is seeded by its number, so asking a scratch copy of the study as it
        stood then (the trials before it) gives the suggestions the lost session drew; they are
        given to the stored trial, which then trains what it would have trained."""
        optuna = self.optuna
        scratch = optuna.create_study(directions=self.group.directions())
        scratch.add_trials([t for t in trials if t.number < lost.number])
        scratch.sampler = make_sampler(self.group.sampler, self.group.seed, lost.number)
        asked = scratch.ask()
        suggest(self.group._tree(), asked)
        base = make_sampler(self.group.sampler, self.group.seed, lost.number)
        self.study.sampler = optuna.samplers.PartialFixedSampler(dict(asked.params), base)
        trial = optuna.trial.Trial(self.study, lost._trial_id)
        suggest(self.group._tree(), trial)
        if "bracket" not in lost.user_attrs and getattr(self, "policy", None) is not None:
            # the first refill of a boundary opens a bracket named after its trial
            trial.set_user_attr("bracket", self.policy.new_bracket(f"t{lost.number}"))
        return self._trials()[lost.number]

    def _spec_of(self, frozen):
        """A refill's spec from its stored trial. The journal is folder data: every value must
        lie in run_fit's own search space (a listed choice, a value inside its Range), checked
        here rather than left to Optuna's FixedTrial, which only warns about a value outside a
        range. So the journal can pick, among the values the config group lists, the ones a
        refill trains (as the sampler did), never a model or knob that the group does not list."""
        trial = _SearchSpaceTrial(frozen.params, frozen.number, self.journal_path)
        return self.group.spec_from_leaf(suggest(self.group._tree(), trial))

    def spec_for(self, run_id: int):
        if not self.specs and not self.trial_of:
            # called during resume before attach: read the stored study now, writing nothing
            study = self._stored_study()
            for t in (study.get_trials(deepcopy=False) if study is not None else []):
                rid = t.user_attrs.get("run_id")
                if isinstance(rid, int) and rid > len(self.initial_specs):
                    self.specs[rid] = self._spec_of(t)
        return self.specs.get(run_id)

    def report(self, rid: int, chunks: int, value: float) -> None:
        if self.multi or rid not in self.trial_of:
            return
        frozen = self._trials()[self.trial_of[rid]]
        if frozen.state.is_finished() or chunks in frozen.intermediate_values:
            return
        self.optuna.trial.Trial(self.study, frozen._trial_id).report(value, chunks)

    def _tell(self, rid: int, **kw) -> None:
        frozen = self._trials()[self.trial_of[rid]]
        if not frozen.state.is_finished():
            self.study.tell(frozen.number, skip_if_finished=True, **kw)

    def prune(self, rid: int) -> None:
        if rid in self.trial_of:
            self._tell(rid, state=self.optuna.trial.TrialState.PRUNED)

    def settle(self, driver, runs) -> bool:
        """Tell the study about runs that finished, failed or were deleted."""
        changed = False
        TS = self.optuna.trial.TrialState
        for rid, number in self.trial_of.items():
            rec = runs.get(rid)
            if rec is None:
                continue
            frozen = self._trials()[number]
            if frozen.state.is_finished():
                continue
            if is_done(rec):
                values = [_metric_value(rec.last_metrics, m) for _, m in driver.options.objectives]
                if any(v is None for v in values):     # restored run: read the log
                    values = [v if v is not None else driver.last_logged(rid, m)
                              for v, (_, m) in zip(values, driver.options.objectives)]
                if any(v is None or math.isnan(v) for v in values):
                    self.study.tell(number, state=TS.FAIL)
                else:
                    self.study.tell(number, values if self.multi else values[0])
                changed = True
            elif rec.status in (FAILED, DELETED):
                self.study.tell(number, state=TS.FAIL)
                changed = True
            elif rec.status == STOPPED and rid in driver.pruned:
                # a confirmed suggestion, told only now that its stop took effect: a run that
                # completed before its stop came is COMPLETE above, not PRUNED
                self.study.tell(number, state=TS.PRUNED)
                changed = True
        return changed

    def _active(self, runs) -> int:
        """Trials holding a slot: unfinished, and their run pending/running (or not yet added)."""
        n = 0
        for rid, number in self.trial_of.items():
            if self._trials()[number].state.is_finished():
                continue
            rec = runs.get(rid)
            if rec is None or (rec.status in ACTIVE and not is_done(rec)):
                n += 1
        return n

    def refill(self, driver, runs, out: list) -> bool:
        """Ask the study for trials while slots are free; each becomes an ``add`` op in ``out``
        (a trial whose config cannot be planned: a refused ``add`` noted in the log)."""
        engine = self.engine
        changed = False
        bracket = None
        while self._active(runs) < self.group.n_initial and len(self._trials()) < self.group.budget:
            number = len(self._trials())
            self.study.sampler = make_sampler(self.group.sampler, self.group.seed, number)
            trial = self.study.ask()
            leaf = suggest(self.group._tree(), trial)
            new_id = engine.reserve_run_id(avoid=self.trial_of)
            if driver.policy is not None:
                # the runs asked at one boundary form one bracket (hyperband: dealt one of its
                # grace periods, so a refill does not join a bracket that judged its rungs already)
                bracket = bracket if bracket is not None else driver.policy.new_bracket(f"t{number}")
                driver.bracket_of_new[new_id] = self.brackets[new_id] = bracket
                trial.set_user_attr("bracket", bracket)
            trial.set_user_attr("run_id", new_id)
            self.trial_of[new_id] = number
            changed = True
            try:
                spec = self.group.spec_from_leaf(leaf)
                engine.plan_run(spec)
            except Exception as exc:
                self.study.tell(number, state=self.optuna.trial.TrialState.FAIL)
                out.append(Note("op", dict(op="add", run_id=new_id, accepted=False,
                                           reason=f"trial {number}: {type(exc).__name__}: {exc}",
                                           new_run_id=new_id, latency_s=0.0)))
                continue
            self.specs[new_id] = spec
            out.append(Op("add", new_id, spec=spec))
        return changed

    def restore_missing_runs(self, runs, out: list) -> bool:
        """After a crash between an ask and its run's creation: add the run now (once)."""
        if getattr(self, "_restored", False):
            return False
        self._restored = True
        changed = False
        for rid, number in sorted(self.trial_of.items()):
            if rid in runs or rid not in self.specs:
                continue
            if self._trials()[number].state.is_finished():
                continue
            out.append(Op("add", rid, spec=self.specs[rid]))
            changed = True
        return changed

    def pareto_front(self):
        import pandas as pd

        run_of = {n: r for r, n in self.trial_of.items()}
        rows = []
        for t in self.study.best_trials:
            row = {"run_id": run_of.get(t.number), "trial": t.number}
            for (_, metric), v in zip(self.group.pruning.objectives, t.values):
                row[metric] = v
            row.update(t.params)
            rows.append(row)
        return pd.DataFrame(rows)


def needs_driver(group) -> bool:
    """True for RFOptuna and for any group with a pruner."""
    options = getattr(group, "pruning", None)
    return options is not None and (options.active or hasattr(group, "budget"))


def pruning_settings(group) -> dict:
    """The knobs that steer the pruner's and the sampler's decisions, for experiment.json: a
    resume with other values would judge the old rungs by new rules (``recovery.check_resume``)."""
    if not needs_driver(group):
        return {"pruner": None}
    o = group.pruning
    out = {"pruner": o.pruner, "pruner_mode": o.mode,
           "objective": ", ".join(f"{d}:{_bare(m)}" for d, m in o.objectives),
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


def driver_for(exp, group, specs, num_chunks: int) -> ChunkAutoML | None:
    """The AutoML driver a config group asks for, or None (plain grid/random search)."""
    if not needs_driver(group):
        return None
    return ChunkAutoML(exp, group, group.pruning, specs, num_chunks)
