"""``RFOptuna``: Optuna's samplers over the same ``List``/``Range`` spaces as the other groups.

Config only: the class checks its knobs, knows its first ``n_initial`` trials before training
starts (asked of a scratch in-memory study with the seeds the experiment's study will use) and
turns a trial into a run spec. The driver that prunes and refills at chunk boundaries, with the
experiment's own study, is ``rapidfire_nb.tuning``. Optuna is imported lazily, on first use.
"""

from __future__ import annotations

import warnings
from typing import Any

from rapidfire_nb.automl._space import Choice, Const, Node, Record, Span, canonical
from rapidfire_nb.automl.axes import List
from rapidfire_nb.automl.groups import _SearchGroup
from rapidfire_nb.automl.pruning import PruningOptions, parse_objective
from rapidfire_nb.automl.specs import _display, _flatten, _leaves_to_specs, _varying
from rapidfire_nb.errors import ConfigError, RapidFireConfigWarning

SAMPLERS = ("tpe", "cmaes", "random")


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
        # with a step, the upper bound is the last reachable multiple (Optuna warns otherwise)
        if r.dtype == "int":
            return trial.suggest_int(node.path, r.start, r.top, log=r.log, step=r.step or 1)
        return trial.suggest_float(node.path, r.start, r.top, log=r.log, step=r.step)
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


class _DefaultPruner(str):
    """RFOptuna's default ``"median"``, told apart from an explicit ``pruner="median"``: only an
    explicit pruner is an error with several objectives (as in RFGridSearch)."""


_DEFAULT_PRUNER = _DefaultPruner("median")


class RFOptuna(_SearchGroup):
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

    ``granularity``: ``"chunk"`` (default, a rung is a number of chunks done; ``"shard"``, RapidFire
    AI 0.16.2's default, means the same) or ``"epoch"`` (a rung is a number of epochs done).
    ``build_all_indexes`` (RapidFire 0.16.2) is accepted and has no effect here: it decides which
    RAG indexes RapidFire's evals mode builds up front, and there are none in fine-tuning.
    ``pruner_mode="suggest"`` (needs a pruner) only marks the trials the pruner would stop (see
    ``Experiment.apply_suggestions``); a slot is refilled only once a mark is confirmed.
    ``reduction_factor`` (default 2): sha/hyperband keep the best ``ceil(n / reduction_factor)``
    trials at each rung. ``min_chunks`` (default 1): no trial is judged before that many rungs;
    sha/hyperband rungs are ``min_chunks * reduction_factor**i``. The pruner ranks on the (first) ``objective``.

    Example::

        RFOptuna(RFModelConfig(model_name="m", training_args=RFSFTConfig(
                     learning_rate=Range(1e-5, 1e-3, log=True))),
                 trainer_type="SFT", n_initial=4, budget=10, pruner="sha")
    """

    _name = "RFOptuna"

    def __init__(self, configs, trainer_type: str = "SFT", n_initial: int = 16, budget: int = 40,
                 objective: str = "minimize:eval_loss", sampler: str = "tpe",
                 pruner: str | None = _DEFAULT_PRUNER, seed: int = 42, granularity: str = "chunk",
                 build_all_indexes: bool = True, *, pruner_mode: str = "stop", reduction_factor: int = 2,
                 min_chunks: int = 1):
        if isinstance(configs, (list, tuple)):
            configs = List(list(configs))   # RapidFire's RFOptuna takes a plain list
        super().__init__(configs, trainer_type)
        for name, value in (("n_initial", n_initial), ("budget", budget)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RFOptuna: {name} must be a positive integer, got {value!r}.")
        if budget < n_initial:
            # RapidFire AI takes max(budget, n_initial) without a word; code written for it must run
            # as written, so the same here, said once
            warnings.warn(RapidFireConfigWarning(
                f"RFOptuna: budget ({budget}) is below n_initial ({n_initial}); as in RapidFire AI the "
                f"search trains max(budget, n_initial) = {n_initial} trials."), stacklevel=2)
            budget = n_initial
        # RapidFire lower-cases both names ("TPE", "Median" work there)
        sampler = sampler.lower() if isinstance(sampler, str) else sampler
        if isinstance(pruner, str) and pruner is not _DEFAULT_PRUNER:
            pruner = pruner.lower()
        if sampler not in SAMPLERS:
            raise ConfigError(f"RFOptuna: sampler must be one of {', '.join(map(repr, SAMPLERS))}, "
                              f"got {sampler!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"RFOptuna: seed must be an integer, got {seed!r}.")
        if not isinstance(build_all_indexes, bool):
            raise ConfigError(f"RFOptuna: build_all_indexes must be True or False, got {build_all_indexes!r}.")
        self.build_all_indexes = build_all_indexes   # RapidFire's evals-mode knob: no effect here
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
        keys = _varying([_flatten(leaf) for leaf, _ in
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
        specs = _leaves_to_specs(self._leaves(), self.trainer_type)
        for spec, leaf in zip(specs, self._leaves()):
            self._set_knobs(spec, leaf)
        return specs

    def spec_from_leaf(self, leaf: dict):
        spec = _leaves_to_specs([leaf], self.trainer_type)[0]
        self._set_knobs(spec, leaf)
        return spec

    def _set_knobs(self, spec, leaf) -> None:
        flat = _flatten(leaf)
        keys = self._knob_keys or list(spec.knobs)
        spec.knobs = {k: _display(flat.get(k)) for k in keys}

    def __len__(self) -> int:
        return self.n_initial

