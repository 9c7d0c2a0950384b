"""AutoML at chunk boundaries: ``RFOptuna``, pruners on every search group, freed slots refilled.

    from rapidfire_nb.automl import RFOptuna, RFGridSearch

    group = RFOptuna(configs, trainer_type="SFT", n_initial=8, budget=20,
                     objective="minimize:eval_loss", sampler="tpe", pruner="sha", seed=42)
    exp.run_fit(group, create_model, train, evald, num_chunks=4)
    RFGridSearch(configs, pruner="sha", reduction_factor=2)        # a pruned grid

What lives here: ``PruningOptions`` (the ``pruner=``/``pruner_mode=``/``objective=`` knobs every
search group accepts), ``RFOptuna`` (Optuna samplers over the same ``List``/``Range`` spaces), and
``ChunkAutoML``, the driver the Experiment attaches to its engine. The driver is called by the
engine thread at every chunk boundary (``Engine.boundary_hook``); it feeds the pruning policy
(``engine/pruning.py``, pure) and the Optuna study, then acts through the engine's own ops: ``stop``
(with the pruning reason) and ``add`` (a new trial's run). Optuna is imported only here, lazily:
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

from rapidfire_nb.automl._space import Choice, Const, Node, Record, Span, canonical
from rapidfire_nb.engine import pruning as P
from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.state import get_run
from rapidfire_nb.engine.fsio import atomic_write_json
from rapidfire_nb.engine.store import read_json
from rapidfire_nb.errors import ConfigError, OpRefused

SAMPLERS = ("tpe", "cmaes", "random")
MODES = ("stop", "suggest")
GRANULARITIES = ("chunk", "epoch")
# Suggest mode in the event log: the pruner's mark, then the user's answer as an ``op`` event
# (accepted or refused, like every IC op), so a restart and the panel read the same story.
SUGGESTED = "pruning_suggested"
CONFIRM, IGNORE = "confirm_suggestion", "ignore_suggestion"


def parse_objective(objective: Any, where: str) -> list[tuple[str, str]]:
    """``"minimize:eval_loss, maximize:rougeL"`` -> [("minimize", "eval_loss"), ...]."""
    if not isinstance(objective, str) or not objective.strip():
        raise ConfigError(f"{where}: objective must be a string like 'minimize:eval_loss', got {objective!r}")
    out = []
    for part in objective.split(","):
        direction, sep, metric = part.strip().partition(":")
        if not sep or direction not in ("minimize", "maximize") or not metric.strip():
            raise ConfigError(f"{where}: objective part {part.strip()!r} must be 'minimize:<metric>' "
                              f"or 'maximize:<metric>' (e.g. 'minimize:eval_loss')")
        out.append((direction, metric.strip()))
    if len({m for _, m in out}) != len(out):
        raise ConfigError(f"{where}: objective names a metric twice: {objective!r}")
    return out


class PruningOptions:
    """The pruning knobs of a search group, checked at construction."""

    def __init__(self, where: str, pruner: str | None = None, pruner_mode: str = "stop",
                 reduction_factor: int = 2, min_chunks: int = 1, objective: str = "minimize:eval_loss",
                 granularity: str = "chunk"):
        self.objectives = parse_objective(objective, where)
        if pruner is not None and pruner not in P.PRUNERS:
            raise ConfigError(f"{where}: pruner must be one of {', '.join(map(repr, P.PRUNERS))} or "
                              f"None, got {pruner!r}")
        if pruner is not None and len(self.objectives) > 1:
            raise ConfigError(f"{where}: pruner={pruner!r} needs a single objective; with several "
                              f"({objective!r}) there is no one ranking: use pruner=None")
        if pruner_mode not in MODES:
            raise ConfigError(f"{where}: pruner_mode must be 'stop' or 'suggest', got {pruner_mode!r}")
        if pruner_mode == "suggest" and pruner is None:
            # without a pruner nothing is ever suggested: the user would wait for marks in vain
            raise ConfigError(f"{where}: pruner_mode='suggest' needs a pruner to suggest with: "
                              f"pass pruner='sha', 'median' or 'hyperband'")
        for name, value, low in (("reduction_factor", reduction_factor, 2), ("min_chunks", min_chunks, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
        if granularity not in GRANULARITIES:
            raise ConfigError(f"{where}: granularity must be 'chunk' or 'epoch', got {granularity!r}")
        self.where, self.pruner, self.mode = where, pruner, pruner_mode
        self.reduction_factor, self.min_chunks = reduction_factor, min_chunks
        self.objective, self.granularity = objective, granularity

    @property
    def active(self) -> bool:
        return self.pruner is not None


# ============================================================================================
# Optuna over our search spaces


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("RFOptuna needs Optuna: pip install optuna, or install rapidfire-nb with "
                          "the [optuna] extra (pip install -e '.[optuna]' from the clone)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _is_primitive(v) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def suggest(node: Node, trial) -> Any:
    """One point of the space, every axis asked of an Optuna trial (named by its config path)."""
    if isinstance(node, Const):
        return node.value
    if isinstance(node, Choice):
        if len(node.options) == 1:
            return suggest(node.options[0], trial)
        consts = [o.value for o in node.options if isinstance(o, Const)]
        if len(consts) == len(node.options) and all(_is_primitive(v) for v in consts) \
                and len({canonical(v) for v in consts}) == len(consts):
            return trial.suggest_categorical(node.path or "configs", consts)
        index = trial.suggest_categorical((node.path or "configs") + "#", list(range(len(node.options))))
        return suggest(node.options[index], trial)
    if isinstance(node, Span):
        r = node.range
        if r.dtype == "int":
            return trial.suggest_int(node.path, r.start, r.end, log=r.log)
        return trial.suggest_float(node.path, r.start, r.end, log=r.log)
    if isinstance(node, Record):
        return node.factory({name: suggest(child, trial) for name, child in node.fields})
    raise TypeError(f"unknown search-space node {type(node).__name__}")


def make_sampler(kind: str, seed: int, number: int):
    """A sampler seeded from (seed, trial number): asks are reproducible after a resume, where a
    sampler that kept one random stream would restart it."""
    optuna = _optuna()
    s = (seed * 1_000_003 + number) % (2 ** 31)
    if kind == "tpe":
        # constant liar: trials still training count as (pessimistic) observations, so parallel
        # asks spread out; pruned trials count with their intermediate values
        return optuna.samplers.TPESampler(seed=s, constant_liar=True, n_startup_trials=4)
    if kind == "cmaes":
        import warnings

        with warnings.catch_warnings():    # consider_pruned_trials is marked experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.CmaEsSampler(seed=s, consider_pruned_trials=True,
                                                warn_independent_sampling=False)
    return optuna.samplers.RandomSampler(seed=s)


def _automl():
    from rapidfire_nb import automl

    return automl


class _DefaultPruner(str):
    """RFOptuna's default ``"median"``, told apart from an explicit ``pruner="median"``: only an
    explicit pruner is an error with several objectives (as in RFGridSearch)."""


_DEFAULT_PRUNER = _DefaultPruner("median")


def _make_rfoptuna():
    automl = _automl()

    class RFOptuna(automl._SearchGroup):
        """Optuna-driven search over ``List``/``Range`` axes, pruned and refilled at chunk boundaries.

        ``n_initial`` trials train side by side; whenever one is pruned or finishes, its slot is
        refilled with ``study.ask()`` until ``budget`` trials exist. The sampler (``"tpe"`` with a
        constant liar, ``"cmaes"`` or ``"random"``) learns from every rung value, including those
        of trials still training and of pruned trials. ``objective`` names any eval metric
        (``"minimize:eval_loss"``, ``"maximize:eval_rougeL"``); several, comma-separated, make a
        multi-objective study: no pruning, and ``exp.get_pareto_front()`` lists the front.
        ``pruner`` in ``"median"`` (the default), ``"hyperband"``, ``"sha"`` or None; with several
        objectives the default is None and an explicit pruner is an error. Rungs are chunks of
        each run's data stream (``granularity="epoch"``: epochs). The space needs at least one
        ``List`` or ``Range`` axis. ``objective`` may name a metric with or without TRL's
        ``eval_`` prefix (``"rougeL"`` and ``"eval_rougeL"`` are the same). Deterministic for
        ``seed``.

        ``granularity``: ``"chunk"`` (default, a rung is a number of chunks done) or ``"epoch"``
        (a rung is a number of epochs done). ``pruner_mode="suggest"`` (needs a pruner) only
        marks the trials the pruner would stop (see ``Experiment.apply_suggestions``); a slot is
        refilled only once a mark is confirmed. ``reduction_factor`` (default 2): sha/hyperband
        keep the best ``ceil(n / reduction_factor)`` trials at each rung. ``min_chunks`` (default
        1): no trial is judged before that many rungs; sha/hyperband rungs are ``min_chunks *
        reduction_factor**i``. The pruner ranks on the (first) ``objective``.

        Example::

            RFOptuna(RFModelConfig(model_name="m", training_args=RFSFTConfig(
                         learning_rate=Range(1e-5, 1e-3, log=True))),
                     trainer_type="SFT", n_initial=4, budget=10, pruner="sha")
        """

        _name = "RFOptuna"

        def __init__(self, configs, trainer_type: str = "SFT", n_initial: int = 16, budget: int = 40,
                     objective: str = "minimize:eval_loss", sampler: str = "tpe",
                     pruner: str | None = _DEFAULT_PRUNER, seed: int = 42, granularity: str = "chunk", *,
                     pruner_mode: str = "stop", reduction_factor: int = 2, min_chunks: int = 1):
            if isinstance(configs, (list, tuple)):
                configs = automl.List(list(configs))   # RapidFire's RFOptuna takes a plain list
            super().__init__(configs, trainer_type)
            for name, value in (("n_initial", n_initial), ("budget", budget)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError(f"RFOptuna: {name} must be a positive integer, got {value!r}.")
            if budget < n_initial:
                raise ConfigError(f"RFOptuna: budget ({budget}) must be >= n_initial ({n_initial}).")
            if sampler not in SAMPLERS:
                raise ConfigError(f"RFOptuna: sampler must be one of {', '.join(map(repr, SAMPLERS))}, "
                                  f"got {sampler!r}.")
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise ConfigError(f"RFOptuna: seed must be an integer, got {seed!r}.")
            objectives = parse_objective(objective, "RFOptuna")
            if pruner is _DEFAULT_PRUNER:
                # the default prunes a single objective only; several have no one ranking
                pruner = None if len(objectives) > 1 else "median"
            # an explicit pruner with several objectives is refused by PruningOptions below
            self.pruning = PruningOptions("RFOptuna", pruner, pruner_mode, reduction_factor,
                                          min_chunks, objective, granularity)
            self.n_initial, self.budget, self.sampler, self.seed = n_initial, budget, sampler, seed
            self._initial: list[dict] | None = None
            self._study = None     # the experiment's Optuna study, once run_fit attached it
            tree = self._tree()
            if tree.max_distinct() <= 1:
                raise ConfigError(
                    "RFOptuna needs at least one List or Range axis: this space has a single "
                    "configuration, so every trial would train the same one (use RFGridSearch "
                    "to train one config).")
            keys = automl._varying([automl._flatten(leaf) for leaf, _ in
                                    zip(tree.corners(), range(512))])
            self._knob_keys = keys

        def _leaves(self) -> list[dict]:
            return [leaf for leaf, _ in self._initial_trials()]

        def _initial_trials(self) -> list[tuple[dict, dict]]:
            """The first ``n_initial`` (leaf, params), asked of a scratch in-memory study with the
            same seeds the experiment's study uses, so they are known before training starts."""
            if self._initial is None:
                optuna = _optuna()
                study = optuna.create_study(directions=self.directions())
                out = []
                for number in range(self.n_initial):
                    study.sampler = make_sampler(self.sampler, self.seed, number)
                    trial = study.ask()
                    out.append((suggest(self._tree(), trial), dict(trial.params)))
                self._initial = out
            return self._initial

        def directions(self) -> list[str]:
            return [d for d, _ in self.pruning.objectives]

        def expand(self):
            specs = automl._leaves_to_specs(self._leaves(), self.trainer_type)
            for spec, leaf in zip(specs, self._leaves()):
                self._set_knobs(spec, leaf)
            return specs

        def spec_from_leaf(self, leaf: dict):
            spec = automl._leaves_to_specs([leaf], self.trainer_type)[0]
            self._set_knobs(spec, leaf)
            return spec

        def _set_knobs(self, spec, leaf) -> None:
            flat = automl._flatten(leaf)
            keys = self._knob_keys or list(spec.knobs)
            spec.knobs = {k: automl._display(flat.get(k)) for k in keys}

        def __len__(self) -> int:
            return self.n_initial

    return RFOptuna


_RFOptuna = None


def rfoptuna_class():
    global _RFOptuna
    if _RFOptuna is None:
        _RFOptuna = _make_rfoptuna()
    return _RFOptuna


# ============================================================================================
# The driver


def is_done(rec) -> bool:
    """Finished as far as the engine thread knows (the writer sets ``completed`` a bit later)."""
    return rec.status == R.COMPLETED or (rec.status in R.ACTIVE and rec.total_steps > 0
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
    for key in (name, f"eval_{name}"):
        if key in metrics and metrics[key] is not None:
            return float(metrics[key])
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
            self.policy = P.make_policy(options.pruner, options.objectives[0][0], options.min_chunks,
                                        options.reduction_factor, max_chunks=max(max_chunks, 4))
        self.state_path = Path(exp.path) / "automl.json"
        self.suggestions: dict[int, P.Decision] = {}
        self.dismissed: dict[int, P.Decision] = {}   # suggestions the user ignored
        self.pruned: dict[int, P.Decision] = {}
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
        data = read_json(self.state_path, None)
        if data is None:
            return
        if self.policy is not None and data.get("policy"):
            self.policy.load_json(data["policy"])
        self.suggestions = {int(k): P.Decision(**v) for k, v in data.get("suggestions", {}).items()}
        self.pruned = {int(k): P.Decision(**v) for k, v in data.get("pruned", {}).items()}
        self.dismissed = {int(k): P.Decision(**v) for k, v in data.get("dismissed", {}).items()}
        self.seen = {int(k): v for k, v in data.get("seen", {}).items()}
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
        for ev in self.exp.events.since(0):
            if ev["type"] == "metric" and ev["split"] == "eval":
                v = _metric_value(ev["metrics"], self.metric)
                if v is not None:
                    last[ev["run_id"]] = v
            elif ev["type"] == "chunk_done" and ev["run_id"] in last:
                out.setdefault(ev["run_id"], {})[ev["chunks_done"]] = last[ev["run_id"]]
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
            applied = {ev["run_id"] for ev in self.exp.events.since(0)
                       if ev["type"] == "run_status" and ev["status"] == R.STOPPED
                       and ev.get("reason") == getattr(self.pruned.get(ev["run_id"]), "reason", None)}
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
            self.tuner.attach(engine, resumed)
        engine.boundary_hook = self.on_boundary

    # -- the hook ----------------------------------------------------------------------------
    def on_boundary(self) -> None:
        """Engine thread, under the engine lock, between chunks: learn, decide, act."""
        from rapidfire_nb.engine.controller import Op

        engine = self.engine
        changed = False
        for rid, due in list(self._restop.items()):
            rec = engine.runs.get(rid)
            if rec is None or rec.status not in R.ACTIVE:
                del self._restop[rid]
            elif is_done(rec):
                del self._restop[rid]       # nothing left to stop
            elif rec.chunks_done >= due:
                engine.submit(Op("stop", rid, reason=self.pruned[rid].reason))
                del self._restop[rid]
        if self.objective_error is not None:
            return
        if self._objective_absent(engine):
            self.save()
            return
        if self.tuner is not None:
            changed |= self.tuner.restore_missing_runs(self)
        for rid, rec in sorted(engine.runs.items()):
            changed |= self._observe(rid, rec)
        decisions = self.policy.decide() if self.policy is not None else []
        for d in decisions:
            d = self._in_units(d)
            changed = True
            if self.options.mode == "stop":
                self.pruned[d.run_id] = d
                if self.tuner is not None:
                    self.tuner.prune(d.run_id)
                engine.submit(Op("stop", d.run_id, reason=d.reason))
            elif d.run_id not in self.suggestions and d.run_id not in self.dismissed \
                    and d.run_id not in self.pruned:
                # answered marks are in the log even when automl.json was lost: not asked twice;
                # an event, not only automl.json: the panel shows it and a restart replays it
                self.suggestions[d.run_id] = d
                self.exp.events.append(SUGGESTED, run_id=d.run_id, rung=d.rung, rank=d.rank,
                                       of=d.of, reason=d.reason)
        if self.tuner is not None:
            changed |= self.tuner.settle(self)
            changed |= self.tuner.refill(self)
        if changed:
            self.save()

    def _objective_absent(self, engine) -> bool:
        """After the first eval of any run: is every objective metric among its eval metrics?
        If not, stop every unfinished run with a reason that names the metric and what was logged,
        instead of training the whole budget blind (a pruner that never fires, a sampler that
        learns nothing: a silent random search)."""
        from rapidfire_nb.engine.controller import Op

        for rid, rec in sorted(engine.runs.items()):
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
            for other, r in sorted(engine.runs.items()):
                if r.status in R.ACTIVE and not is_done(r):
                    engine.submit(Op("stop", other, reason=self.objective_error))
            return True
        return False

    def _in_units(self, d: P.Decision) -> P.Decision:
        if self.unit == 1:
            return d
        return P.Decision(d.run_id, d.rung, d.rank, d.of,
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
        for chunks in range(self.seen[rid] + 1, rec.chunks_done + 1):
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
            live = rec.status in R.ACTIVE and not finished
            if m.pruned is None and (m.live, m.finished) != (live, finished):
                self.policy.set_state(rid, live, finished)
                changed = True
        return changed

    # -- user-facing ---------------------------------------------------------------------------
    def reason_for(self, run_id: int) -> str | None:
        """The pruning note of a run for ``get_runs_info`` (None if the pruner never judged it)."""
        rec = self.engine.runs.get(run_id) if getattr(self, "engine", None) else None
        if run_id in self.pruned:
            reason = self.pruned[run_id].reason
            if run_id in self._late_confirms():
                return f"suggested: {reason}; confirmed, but the run had {rec.status if rec else 'ended'}"
            if rec is not None and rec.status == R.DELETED:
                reason += "; then deleted"
            elif rec is not None and rec.status != R.STOPPED and run_id not in self._awaiting_stop:
                # a pruned run is stopped: only a resume makes it train (or end) again
                reason += f"; then resumed by hand ({rec.status})"
            return reason
        if run_id in self.suggestions:
            reason = "suggested: " + self.suggestions[run_id].reason
            if rec is not None and _ended(rec):
                reason += f"; run {R.COMPLETED if is_done(rec) else rec.status}"
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
        self.exp.events.append("op", op=op, run_id=rid, accepted=accepted, reason=reason,
                               new_run_id=None, latency_s=0.0)

    def apply_suggestions(self, run_ids=None) -> list[int]:
        """Stop the runs the pruner suggested (all open marks, or ``run_ids``); returns the runs
        stopped. A named run that is not pending/running (completed, failed, deleted, or stopped,
        queued ops included) is skipped: its answer is logged as refused ("run N is completed"),
        it is not in the returned list, and its mark stays in the table as closed. The Optuna
        trial is told PRUNED once the stop has taken effect (a run that completes first is told
        COMPLETE)."""
        from rapidfire_nb.engine.controller import Op
        from rapidfire_nb.engine.queued import project

        engine = self.engine
        with engine.atomically():
            wanted = self._wanted(run_ids)
            runs = engine.snapshot()
            done = []
            for rid in wanted:
                d = self.suggestions.pop(rid)
                # as the queued ops will leave it: a stop or delete already asked for wins
                status = project(engine, rid).status
                if status in R.ACTIVE and not is_done(runs[rid]):
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
        marks: dict[int, P.Decision] = {}
        for ev in self.exp.events.since(0):
            if ev["type"] == SUGGESTED:
                marks[ev["run_id"]] = P.Decision(ev["run_id"], ev["rung"], ev["rank"], ev["of"],
                                                 ev["reason"])
            elif ev["type"] == "op" and ev.get("op") in (CONFIRM, IGNORE) and ev["run_id"] in marks:
                d = marks.pop(ev["run_id"])
                if ev["op"] == CONFIRM and ev.get("accepted"):
                    self.pruned.setdefault(d.run_id, d)
                elif ev["op"] == IGNORE and ev.get("accepted"):
                    self.dismissed.setdefault(d.run_id, d)
        self.suggestions = marks


def project_rec(engine, rid: int):
    """The run as its queued ops will leave it (its record's counters, the projected status)."""
    from rapidfire_nb.engine.queued import project

    return project(engine, rid)


def _ended(view) -> bool:
    """Completed, failed or deleted (or done training): a mark on it can no longer be acted on."""
    if view is None:
        return True
    rec = getattr(view, "record", view)
    return view.status in R.TERMINAL or (rec is not None and is_done(rec))


def _status(engine, rid: int) -> str:
    view = project_rec(engine, rid)
    if view is None:
        return "gone"
    rec = view.record
    return R.COMPLETED if view.status in R.ACTIVE and rec is not None and is_done(rec) else view.status


class _OptunaTuner:
    """The Optuna side of ``RFOptuna``: the study in the experiment folder, trial <-> run."""

    def __init__(self, exp, group, specs):
        optuna = _optuna()
        self.optuna, self.exp, self.group = optuna, exp, group
        folder = Path(exp.path) / "optuna"
        folder.mkdir(parents=True, exist_ok=True)
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        self.storage = JournalStorage(JournalFileBackend(str(folder / "journal.log")))
        self.study = optuna.create_study(study_name="rapidfire", storage=self.storage,
                                         directions=group.directions(), load_if_exists=True)
        self.multi = len(group.directions()) > 1
        group._study = self.study     # RapidFire's tutorials read config_group._study
        self.specs: dict[int, Any] = {}
        self.trial_of: dict[int, int] = {}       # run id -> trial number
        self.brackets: dict[int, Any] = {}       # run id -> pruning bracket (refills)
        self.initial_specs = specs

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
                # killed between study.ask() and naming the trial's run: name it now, as the
                # uninterrupted session did next (the restore adds the run)
                rid = max(set(self.trial_of) | set(engine.run_ids())) + 1
                self.optuna.trial.Trial(self.study, t._trial_id).set_user_attr("run_id", rid)
            if rid is not None:
                self.trial_of[rid] = t.number
                self.brackets[rid] = t.user_attrs.get("bracket")
                if rid > len(self.initial_specs):
                    try:
                        self.specs[rid] = self._spec_of(t)
                    except Exception:     # killed in the middle of its suggestions
                        self.study.tell(t.number, state=self.optuna.trial.TrialState.FAIL)

    def _spec_of(self, frozen):
        trial = self.optuna.trial.FixedTrial(frozen.params, frozen.number)
        return self.group.spec_from_leaf(suggest(self.group._tree(), trial))

    def spec_for(self, run_id: int):
        if not self.specs and not self.trial_of:
            # called during resume before attach: read the stored study now
            for t in self._trials():
                rid = t.user_attrs.get("run_id")
                if rid is not None and rid > len(self.initial_specs):
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

    def settle(self, driver) -> bool:
        """Tell the study about runs that finished, failed or were deleted."""
        changed = False
        TS = self.optuna.trial.TrialState
        for rid, number in self.trial_of.items():
            rec = self.engine.runs.get(rid)
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
            elif rec.status in (R.FAILED, R.DELETED):
                self.study.tell(number, state=TS.FAIL)
                changed = True
            elif rec.status == R.STOPPED and rid in driver.pruned:
                # a confirmed suggestion, told only now that its stop took effect: a run that
                # completed before its stop came is COMPLETE above, not PRUNED
                self.study.tell(number, state=TS.PRUNED)
                changed = True
        return changed

    def _active(self) -> int:
        """Trials holding a slot: unfinished, and their run pending/running (or not yet added)."""
        n = 0
        for rid, number in self.trial_of.items():
            if self._trials()[number].state.is_finished():
                continue
            rec = self.engine.runs.get(rid)
            if rec is None or (rec.status in R.ACTIVE and not is_done(rec)):
                n += 1
        return n

    def refill(self, driver) -> bool:
        from rapidfire_nb.engine.controller import Op

        exp, engine = self.exp, self.engine
        changed = False
        bracket = None
        while self._active() < self.group.n_initial and len(self._trials()) < self.group.budget:
            number = len(self._trials())
            self.study.sampler = make_sampler(self.group.sampler, self.group.seed, number)
            trial = self.study.ask()
            leaf = suggest(self.group._tree(), trial)
            new_id = max(set(engine.run_ids()) | exp._reserved_ids | set(self.trial_of)) + 1
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
                exp.events.append("op", op="add", run_id=new_id, accepted=False,
                                  reason=f"trial {number}: {type(exc).__name__}: {exc}",
                                  new_run_id=new_id, latency_s=0.0)
                continue
            self.specs[new_id] = spec
            exp._reserved_ids.add(new_id)
            engine.submit(Op("add", new_id, spec=spec))
        return changed

    def restore_missing_runs(self, driver) -> bool:
        """After a crash between an ask and its run's creation: add the run now (once)."""
        from rapidfire_nb.engine.controller import Op

        if getattr(self, "_restored", False):
            return False
        self._restored = True
        changed = False
        for rid, number in sorted(self.trial_of.items()):
            if rid in self.engine.run_ids() or rid not in self.specs:
                continue
            if self._trials()[number].state.is_finished():
                continue
            self.exp._reserved_ids.add(rid)
            self.engine.submit(Op("add", rid, spec=self.specs[rid]))
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
    resume with other values would judge the old rungs by new rules (``Experiment._check_resume``)."""
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
