"""run_fit's argument checks, RapidFire AI 0.16.2's names included, and clone_modify's: every
refusal that needs no model and no engine, before anything is created. Plain values in, checked
values out; a refused call changes nothing."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rapidfire_nb.engine import RunSpec
from rapidfire_nb.errors import ConfigError, OpRefused


@dataclass(frozen=True)
class FitCall:
    """run_fit's arguments as the user gave them, unchecked: one value from the facade to
    ``check_fit_arguments``, instead of the same eleven positional values passed on twice."""
    config_group: Any
    create_model: Any
    train_dataset: Any
    eval_dataset: Any = None
    num_chunks: Any = None
    seed: Any = 42
    block: Any = None
    num_shards: Any = None
    num_gpus: Any = 1
    monte_carlo_simulations: Any = 1000
    sample_prompts: Any = None


@dataclass
class FitArguments:
    """run_fit's arguments, checked: ``num_chunks`` resolved from RapidFire's ``num_shards``,
    ``num_gpus`` from its seventh positional argument, the config group expanded to ``specs``."""
    config_group: Any
    specs: list[RunSpec]
    create_model: Callable
    train_dataset: Any
    eval_dataset: Any
    num_chunks: int
    seed: int
    block: bool | None
    num_gpus: int
    workers: int          # Ray workers to start (0: the kernel engine)


def check_concurrency_flag(allow_concurrent) -> bool:
    if not isinstance(allow_concurrent, bool):
        raise ConfigError(f"allow_concurrent must be True or False, got {allow_concurrent!r}")
    return allow_concurrent


def check_fit_arguments(call: FitCall, num_workers=0) -> FitArguments:
    """Every check of run_fit's arguments that needs no model and no data row, in the order the
    user reads them; last, the sharded runs (FSDP) against the workers there will be
    (``num_workers``: the Experiment's). ``sample_prompts`` are checked with the data."""
    config_group, create_model = call.config_group, call.create_model
    train_dataset, eval_dataset = call.train_dataset, call.eval_dataset
    num_chunks, seed, block, num_gpus = call.num_chunks, call.seed, call.block, call.num_gpus
    num_shards, monte_carlo_simulations = call.num_shards, call.monte_carlo_simulations
    if not callable(create_model):
        raise ConfigError("create_model must be a function model_config -> (model, tokenizer)")
    if isinstance(block, numbers.Integral) and not isinstance(block, bool):
        # RapidFire 0.16.2's seventh positional argument is num_gpus, ours is block
        if num_gpus != 1:
            raise ConfigError(f"run_fit: the seventh positional argument ({block!r}) is "
                              "RapidFire's num_gpus, and num_gpus= is given too: give one")
        num_gpus, block = block, None
    if block is not None and not isinstance(block, bool):
        raise ConfigError(f"block must be None, True or False, got {block!r}")
    num_chunks = chunks_from(num_chunks, num_shards)
    num_gpus, _ = check_rapidfire_only_knobs(num_gpus, monte_carlo_simulations)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    for name, ds in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if ds is None and name == "eval_dataset":
            continue
        if not hasattr(ds, "column_names") or not hasattr(ds, "__len__"):
            raise ConfigError(f"{name} must be a datasets.Dataset, got {type(ds).__name__}")
        if len(ds) == 0:
            raise ConfigError(f"{name} is empty")
    specs = expand(config_group)
    from rapidfire_nb.engine import warn_engine_owned_knobs

    for spec in specs:     # in the caller's cell: the engine thread's warnings go to run logs
        warn_engine_owned_knobs(spec)
    if eval_dataset is None and any(s.compute_metrics is not None for s in specs):
        raise ConfigError("compute_metrics needs an eval_dataset: pass eval_dataset= to run_fit")
    from rapidfire_nb.engine import apply_num_gpus, check_sharding, resolve_num_workers, warn_unused_fsdp_config

    workers = resolve_num_workers(num_workers)
    # FSDP: num_gpus applied to the runs without their own RFModelConfig(num_gpus=...), then every
    # sharded run checked against the workers there will be (engine/sharding.py)
    apply_num_gpus(specs, num_gpus)
    check_sharding(specs, workers=workers)
    warn_unused_fsdp_config(specs)
    return FitArguments(config_group, specs, create_model, train_dataset, eval_dataset, num_chunks,
                        seed, block, num_gpus, workers)


def chunks_from(num_chunks, num_shards) -> int:
    """``num_chunks``, or RapidFire 0.16.2's ``num_shards`` for it; both given is an error."""
    if num_chunks is not None and num_shards is not None:
        raise ConfigError(f"num_chunks={num_chunks!r} and num_shards={num_shards!r} are both given; "
                          "num_shards is RapidFire AI 0.16.2's name for num_chunks: give one of them")
    name, value = ("num_shards", num_shards) if num_shards is not None else ("num_chunks", num_chunks)
    if value is None:
        return 4
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_rapidfire_only_knobs(num_gpus, monte_carlo_simulations) -> tuple[int, int]:
    for name, value in (("num_gpus", num_gpus), ("monte_carlo_simulations", monte_carlo_simulations)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(num_gpus), int(monte_carlo_simulations)


def expand(config_group) -> list[RunSpec]:
    if hasattr(config_group, "expand"):
        specs = config_group.expand()
    elif isinstance(config_group, RunSpec):
        specs = [config_group]
    elif isinstance(config_group, (list, tuple)) and all(isinstance(s, RunSpec) for s in config_group):
        specs = list(config_group)
    else:
        raise ConfigError("config_group must be an RFGridSearch or RFRandomSearch (from "
                          f"rapidfire_nb.automl), got {type(config_group).__name__}")
    if not specs:
        raise ConfigError("config_group expands to no runs")
    return specs


def check_clone(engine, store, run_id, changes, warm_start) -> RunSpec:
    """clone_modify's checks against the run as the queued ops leave it; returns the new run's
    spec, creating nothing."""
    from rapidfire_nb import automl
    from rapidfire_nb.engine import check_status_op, check_target_modules, checked_run

    view = checked_run(engine, run_id)
    check_status_op("clone", view)
    if not isinstance(warm_start, bool):
        raise OpRefused(f"warm_start must be True or False, got {warm_start!r}")
    if warm_start and not view.exists:
        raise OpRefused(f"run {run_id} is a queued clone that has not been created yet; a warm "
                        "start needs its weights: clone it once it has trained a chunk")
    rec = view.record if view.exists else view
    if warm_start and engine.weights_missing(rec):
        from rapidfire_nb.engine import weights_lost_reason

        raise OpRefused(weights_lost_reason(rec, store))
    if changes is None:
        changes = {}
    if not isinstance(changes, dict):
        raise ConfigError(f"changes must be a dict of knob -> value, got {type(changes).__name__}")
    automl.check_changes(changes)
    spec = automl.apply_changes(rec.spec, changes)
    parent = rec.spec
    if (spec.peft_config is None) != (parent.peft_config is None):
        raise OpRefused("a clone cannot switch between LoRA and full fine-tuning; start a new experiment")
    if spec.base_key() != parent.base_key() and spec.peft_config is None:
        raise OpRefused("a full fine-tuning clone must keep the parent's base model")
    if warm_start:
        reasons = automl.warm_start_conflicts(parent, spec)
        if reasons:
            raise OpRefused("warm start copies the parent's weights, so it cannot change: "
                            + "; ".join(reasons) + " (use a cold clone)")
        if spec.trainer_type != parent.trainer_type:
            raise OpRefused("warm start needs the parent's trainer type")
    # the clone keeps the parent's num_gpus: its training args must still shard the way run_fit
    # would accept (dropping fsdp from a sharded run's clone, say, is refused, not trained sharded)
    from rapidfire_nb.engine import check_sharding

    check_sharding([spec], workers=engine.executor.worker_count, label=f"the clone of run {run_id}")
    loaded = engine.model_and_tokenizer(spec)
    if loaded is not None:
        check_target_modules(spec, loaded[0])
    engine.plan_run(spec)   # num_chunks vs the clone's steps per epoch
    return spec
