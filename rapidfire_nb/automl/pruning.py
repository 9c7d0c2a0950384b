"""The pruning knobs every search group accepts (``pruner=``, ``pruner_mode=``, ``objective=``...).

Config only: ``PruningOptions`` checks the knobs when a group is built; the driver that acts on
them at chunk boundaries is ``rapidfire_nb.tuning``, the policies ``rapidfire_nb.tuning.pruners``.
"""

from __future__ import annotations

from typing import Any

from rapidfire_nb.errors import ConfigError

PRUNERS = ("sha", "median", "hyperband")   # tuning/pruners.py implements each
MODES = ("stop", "suggest")
# "shard" is RapidFire AI 0.16.2's word for our chunk: accepted, stored as "chunk"
GRANULARITIES = ("chunk", "epoch")
GRANULARITY_ALIASES = {"shard": "chunk"}


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
    """The pruning knobs of a search group, checked at construction.

    ``granularity``: ``"chunk"`` (a rung is a number of chunks done) or ``"epoch"``; ``"shard"``
    (RapidFire AI 0.16.2's name for a chunk) means ``"chunk"``.
    """

    def __init__(self, where: str, pruner: str | None = None, pruner_mode: str = "stop",
                 reduction_factor: int = 2, min_chunks: int = 1, objective: str = "minimize:eval_loss",
                 granularity: str = "chunk"):
        self.objectives = parse_objective(objective, where)
        if pruner is not None and pruner not in PRUNERS:
            raise ConfigError(f"{where}: pruner must be one of {', '.join(map(repr, PRUNERS))} or "
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
        granularity = GRANULARITY_ALIASES.get(granularity, granularity) if isinstance(granularity, str) \
            else granularity
        if granularity not in GRANULARITIES:
            raise ConfigError(f"{where}: granularity must be 'chunk' (or 'shard', RapidFire's name) "
                              f"or 'epoch', got {granularity!r}")
        self.where, self.pruner, self.mode = where, pruner, pruner_mode
        self.reduction_factor, self.min_chunks = reduction_factor, min_chunks
        self.objective, self.granularity = objective, granularity

    @property
    def active(self) -> bool:
        return self.pruner is not None
