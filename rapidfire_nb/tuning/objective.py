"""The objective of a tuned config group: what a run logs at each eval, and when a run is done."""

from __future__ import annotations

from rapidfire_nb.engine import ACTIVE, COMPLETED
from rapidfire_nb.errors import ConfigError


def is_done(rec) -> bool:
    """Finished as far as the engine thread knows (the writer sets ``completed`` a bit later)."""
    return rec.status == COMPLETED or (rec.status in ACTIVE and rec.total_steps > 0
                                       and rec.completed_steps >= rec.total_steps)


# What each trainer logs at every eval without a compute_metrics (engine/adapters/base.py evaluate():
# eval_loss plus what TRL's SFTTrainer.compute_loss records in _metrics["eval"]). DPO and GRPO log
# more (rewards/..., logps/..., one reward per reward function), which depends on TRL and on the
# config, so for them an objective is checked at run time only, after the first eval.
SFT_EVAL_METRICS = ("loss", "entropy", "mean_token_accuracy", "aux_loss")


def bare(metric: str) -> str:
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
        if bare(metric) in SFT_EVAL_METRICS:
            continue
        blind = [i for i, s in enumerate(specs, 1)
                 if s.trainer_type == "SFT" and s.compute_metrics is None]
        if blind:
            logged = ", ".join(f"eval_{m}" for m in SFT_EVAL_METRICS)
            raise ConfigError(
                f"{where}: objective metric {metric!r} is never logged by run(s) "
                f"{', '.join(map(str, blind[:8]))}{'...' if len(blind) > 8 else ''}: an SFT run "
                f"without compute_metrics logs only {logged}. Give RFModelConfig a compute_metrics "
                f"that returns {bare(metric)!r}, or use one of those (e.g. 'minimize:eval_loss').")


def missing_objective(objectives, metrics: dict) -> str | None:
    """The first objective metric absent from one eval's ``metrics`` (None if all are there)."""
    for _, metric in objectives:
        if metric_value(metrics, metric) is None:
            return metric
    return None


def metric_value(metrics: dict, name: str):
    """The metric as a float, or None: a value that is not a number (a string in a crafted log,
    or from a compute_metrics) is no value to rank on."""
    if not isinstance(metrics, dict):
        return None
    for key in (name, f"eval_{name}"):
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
