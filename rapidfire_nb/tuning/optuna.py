"""RFOptuna's study in the experiment folder: trials <-> runs, refills, and the study read back
on resume (``optuna/journal.log``, Optuna's JournalStorage). Optuna is imported lazily."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rapidfire_nb.automl.optuna_search import _optuna, make_sampler, suggest
from rapidfire_nb.engine import ACTIVE, DELETED, FAILED, STOPPED, Note, Op
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.tuning.objective import is_done, metric_value


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

    def __init__(self, folder: Path, group, specs):
        optuna = _optuna()
        self.optuna, self.group = optuna, group
        # opened on first use, not here: a resume that run_fit then refuses must leave the folder
        # as it was (creating the journal, or Optuna's create_study, would write to it)
        self.journal_path = Path(folder) / "optuna" / "journal.log"
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

    def attach(self, view, resumed: bool) -> None:
        """Trial <-> run as the study stored them; the ids it handed out are ``trial_of``'s keys
        (the launcher keeps them from being handed out again)."""
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
                rid = max(set(self.trial_of) | set(view.run_ids())) + 1
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
                values = [metric_value(rec.last_metrics, m) for _, m in driver.options.objectives]
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

    def refill(self, driver, view):
        """Ask the study for trials while slots are free; each becomes an ``add`` op (a trial
        whose config cannot be planned: a refused ``add`` noted in the log). A generator of
        decisions; returns whether anything changed."""
        runs = view.runs
        changed = False
        bracket = None
        while self._active(runs) < self.group.n_initial and len(self._trials()) < self.group.budget:
            number = len(self._trials())
            self.study.sampler = make_sampler(self.group.sampler, self.group.seed, number)
            trial = self.study.ask()
            leaf = suggest(self.group._tree(), trial)
            # above every id in use and every id a trial holds; the engine keeps the id taken
            # once the decision is acted on (before this generator goes on)
            new_id = max(view.taken_ids() | set(self.trial_of), default=0) + 1
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
                view.plan_run(spec)
            except Exception as exc:
                self.study.tell(number, state=self.optuna.trial.TrialState.FAIL)
                yield Note("op", dict(op="add", run_id=new_id, accepted=False,
                                      reason=f"trial {number}: {type(exc).__name__}: {exc}",
                                      new_run_id=new_id, latency_s=0.0))
                continue
            self.specs[new_id] = spec
            yield Op("add", new_id, spec=spec)
        return changed

    def restore_missing_runs(self, runs):
        """After a crash between an ask and its run's creation: add the run now (once). A
        generator of decisions; returns whether anything changed."""
        if getattr(self, "_restored", False):
            return False
        self._restored = True
        changed = False
        for rid, number in sorted(self.trial_of.items()):
            if rid in runs or rid not in self.specs:
                continue
            if self._trials()[number].state.is_finished():
                continue
            yield Op("add", rid, spec=self.specs[rid])
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
