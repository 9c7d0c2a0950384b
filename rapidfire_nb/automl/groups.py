"""Search groups: ``RFGridSearch`` and ``RFRandomSearch`` (``RFOptuna`` is in ``optuna_search.py``)."""

from __future__ import annotations

import math
import random

from rapidfire_nb.automl._space import Choice, Node, canonical
from rapidfire_nb.automl.axes import List
from rapidfire_nb.automl.configs import _TRAINING_CLASSES, RFModelConfig, _node, _options
from rapidfire_nb.automl.pruning import PruningOptions
from rapidfire_nb.automl.specs import _leaves_to_specs
from rapidfire_nb.engine import TRAINER_TYPES, RunSpec
from rapidfire_nb.errors import ConfigError

class _SearchGroup:
    _name = ""

    def __init__(self, configs, trainer_type: str = "SFT"):
        if not isinstance(trainer_type, str) or trainer_type.upper() not in TRAINER_TYPES:
            raise ConfigError(f"{self._name}: trainer_type must be one of {', '.join(TRAINER_TYPES)}; "
                              f"got {trainer_type!r}.")
        self.trainer_type = trainer_type.upper()
        if isinstance(configs, (list, tuple)):
            raise ConfigError(f"{self._name}: configs got a plain list; wrap the RFModelConfigs in "
                              f"List([...]).")
        for i, cfg in enumerate(_options(configs)):
            if not isinstance(cfg, RFModelConfig):
                raise ConfigError(f"{self._name}: configs must be an RFModelConfig or a List of them; "
                                  f"item {i} is {type(cfg).__name__}.")
            self._check_trainer(cfg, i if isinstance(configs, List) else None)
        self.configs = configs

    def _check_trainer(self, cfg: RFModelConfig, index: int | None) -> None:
        where = f"configs[{index}]" if index is not None else "configs"
        expected = _TRAINING_CLASSES[self.trainer_type]
        for args in _options(cfg.training_args):
            if args is not None and not isinstance(args, expected):
                raise ConfigError(
                    f"{self._name}(trainer_type={self.trainer_type!r}): {where}.training_args is an "
                    f"{type(args).__name__}; trainer_type {self.trainer_type!r} needs {expected.__name__}.")
        if self.trainer_type == "GRPO" and cfg.reward_funcs is None:
            raise ConfigError(f"{self._name}(trainer_type='GRPO'): {where}.reward_funcs is required "
                              f"(a callable or a list of callables).")
        if self.trainer_type != "GRPO" and cfg.reward_funcs is not None:
            raise ConfigError(f"{self._name}(trainer_type={self.trainer_type!r}): {where}.reward_funcs is "
                              f"only used by GRPO.")

    def _tree(self) -> Node:
        if isinstance(self.configs, List):
            return Choice([_node(c, f"configs[{i}]") for i, c in enumerate(self.configs.values)], "configs")
        return _node(self.configs, "")

    def _leaves(self) -> list[dict]:
        raise NotImplementedError

    def expand(self) -> list[RunSpec]:
        """The runs of this group, in order (run ids are their positions + 1), each validated."""
        return _leaves_to_specs(self._leaves(), self.trainer_type)

    def __len__(self) -> int:
        return len(self._leaves())


class RFGridSearch(_SearchGroup):
    """Every combination of the axes: the top-level ``List`` of ``RFModelConfig``s, a ``List`` of
    LoRA configs, and every ``List`` in trainer args, LoRA args and ``model_kwargs``.

    The order is deterministic: configs in ``List`` order; within one, the first axis varies slowest
    (base model, then LoRA, trainer args, model kwargs, the rest), keys in the order you wrote them.

    Example::

        group = RFGridSearch(RFModelConfig(model_name="m",
                                           training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-4]),
                                                                     num_train_epochs=List([1, 2]))),
                             trainer_type="SFT")
        [s.knobs for s in group.expand()]
        # [{'training_args.learning_rate': 0.001, 'training_args.num_train_epochs': 1}, ... 4 runs]

    A ``Range`` anywhere is a ConfigError naming the knob (use ``RFRandomSearch``).

    Pruning (optional): ``pruner`` (``"sha"``, ``"median"``, ``"hyperband"``; default None, no
    pruning) stops weak runs at chunk boundaries, as ``stopped`` with a reason such as ``pruned at
    chunk 2 (rank 3 of 4)``, where 2 counts the chunks the run has done across epochs.
    ``pruner_mode="suggest"`` only marks them (see ``Experiment.apply_suggestions`` /
    ``Experiment.dismiss_suggestions``). ``reduction_factor`` (default 2): sha/hyperband keep the
    best ``ceil(n / reduction_factor)`` runs at each rung. ``min_chunks`` (default 1): no run is
    judged before it has done that many chunks; sha/hyperband rungs are ``min_chunks *
    reduction_factor**i``. ``objective`` (default ``"minimize:eval_loss"``): the eval metric the
    pruner ranks on, ``"minimize:..."`` or ``"maximize:..."``.
    """

    _name = "RFGridSearch"

    def __init__(self, configs, trainer_type: str = "SFT", *, pruner: str | None = None,
                 pruner_mode: str = "stop", reduction_factor: int = 2, min_chunks: int = 1,
                 objective: str = "minimize:eval_loss"):
        super().__init__(configs, trainer_type)
        self.pruning = _pruning(self._name, pruner, pruner_mode, reduction_factor, min_chunks, objective)
        try:
            self._tree().grid_size()   # refuses a Range now rather than at run_fit
        except ConfigError as exc:
            raise ConfigError(f"RFGridSearch: {exc}") from None

    def _leaves(self) -> list[dict]:
        return list(self._tree().grid())


class RFRandomSearch(_SearchGroup):
    """``num_runs`` distinct configurations drawn from the space, deterministically for ``seed``.

    Each draw picks one ``RFModelConfig`` of the top-level ``List``, one value of every ``List``
    and a value in every ``Range`` (log-uniform with ``log=True``). Draws equal to an earlier one are
    redrawn; a space with fewer than ``num_runs`` distinct points is a ConfigError.

    Example::

        group = RFRandomSearch(RFModelConfig(model_name="m",
                                             training_args=RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True))),
                               trainer_type="SFT", num_runs=8, seed=0)

    Pruning (optional): ``pruner`` (``"sha"``, ``"median"``, ``"hyperband"``; default None, no
    pruning) stops weak runs at chunk boundaries, as ``stopped`` with a reason such as ``pruned at
    chunk 2 (rank 3 of 4)``, where 2 counts the chunks the run has done across epochs.
    ``pruner_mode="suggest"`` only marks them (see ``Experiment.apply_suggestions`` /
    ``Experiment.dismiss_suggestions``). ``reduction_factor`` (default 2): sha/hyperband keep the
    best ``ceil(n / reduction_factor)`` runs at each rung. ``min_chunks`` (default 1): no run is
    judged before it has done that many chunks; sha/hyperband rungs are ``min_chunks *
    reduction_factor**i``. ``objective`` (default ``"minimize:eval_loss"``): the eval metric the
    pruner ranks on, ``"minimize:..."`` or ``"maximize:..."``.
    """

    _name = "RFRandomSearch"

    def __init__(self, configs, trainer_type: str = "SFT", num_runs: int | None = None, seed: int = 42,
                 num_samples: int | None = None, *, pruner: str | None = None, pruner_mode: str = "stop",
                 reduction_factor: int = 2, min_chunks: int = 1, objective: str = "minimize:eval_loss"):
        super().__init__(configs, trainer_type)
        self.pruning = _pruning(self._name, pruner, pruner_mode, reduction_factor, min_chunks, objective)
        if num_samples is not None:   # the name the TRL docs' RapidFire page uses
            if num_runs is not None and num_runs != num_samples:
                raise ConfigError(f"RFRandomSearch: num_runs={num_runs!r} and num_samples={num_samples!r} "
                                  "disagree; give one of them.")
            num_runs = num_samples
        if isinstance(num_runs, bool) or not isinstance(num_runs, int) or num_runs < 1:
            raise ConfigError(f"RFRandomSearch: num_runs must be a positive integer, got {num_runs!r}.")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"RFRandomSearch: seed must be an integer, got {seed!r}.")
        self.num_runs, self.seed = num_runs, seed
        bound = self._tree().max_distinct()
        if bound < num_runs:
            raise ConfigError(f"RFRandomSearch: the space has at most {int(bound)} distinct "
                              f"configurations, fewer than num_runs={num_runs}.")

    def _leaves(self) -> list[dict]:
        tree = self._tree()
        rng = random.Random(self.seed)
        seen: set = set()
        leaves: list[dict] = []
        attempts = 0
        max_attempts = 1000 + 50 * self.num_runs
        while len(leaves) < self.num_runs and attempts < max_attempts:
            attempts += 1
            leaf = tree.sample(rng)
            key = canonical(leaf)
            if key not in seen:
                seen.add(key)
                leaves.append(leaf)
        if len(leaves) < self.num_runs:
            leaves += self._fill_from_enumeration(tree, rng, seen, self.num_runs - len(leaves))
        return leaves

    def _fill_from_enumeration(self, tree: Node, rng, seen: set, missing: int) -> list[dict]:
        # Draws keep colliding: the space is small or full of equal points. Enumerate it (it is
        # finite, or max_distinct would be inf and draws would practically never collide).
        bound = tree.max_distinct()
        if math.isinf(bound) or bound > 200_000:
            raise ConfigError(f"RFRandomSearch: could not draw {self.num_runs} distinct configurations.")
        rest, keys = [], set(seen)
        for leaf in tree.points():
            key = canonical(leaf)
            if key not in keys:
                keys.add(key)
                rest.append(leaf)
        if len(rest) < missing:
            raise ConfigError(f"RFRandomSearch: the space has only {len(seen) + len(rest)} distinct "
                              f"configurations, fewer than num_runs={self.num_runs}.")
        return rng.sample(rest, missing)


def _pruning(where, pruner, pruner_mode, reduction_factor, min_chunks, objective):
    """Pruning at chunk boundaries (``pruner="sha"|"median"|"hyperband"``), see ``automl/pruning.py``."""
    return PruningOptions(where, pruner, pruner_mode, reduction_factor, min_chunks, objective)

