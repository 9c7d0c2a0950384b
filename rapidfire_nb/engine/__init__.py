"""The training engine: chunking, scheduling, run state, swaps, checkpoints, events.

Nothing in here imports the notebook or tracking layers; they read the event log.

This module is the engine's face: the rest of the package imports the names below from here, and
only those (tests/package/test_layering.py checks it); the submodules behind them are the engine's own.
"""

import importlib

# Several submodules import torch, TRL or Ray, and the reducer (``state``) is read by the panel
# and the report without them: so a name loads from its submodule on first use, and importing
# this module imports none of them.
_WHERE = {
    # the run records' statuses
    "PENDING": "runs", "RUNNING": "runs", "STOPPED": "runs", "COMPLETED": "runs",
    "FAILED": "runs", "DELETED": "runs", "ACTIVE": "runs", "TERMINAL": "runs",
    "check_runs_json": "runs",
    # a run's configuration
    "RunSpec": "runspec", "TRAINER_TYPES": "runspec", "callable_name": "runspec",
    "model_identity": "runspec",
    "PROMPT_KEYS": "genconfig", "check_generation_keys": "genconfig",
    "check_generation_settings": "genconfig", "check_prompt_settings": "genconfig",
    "check_sample_prompts": "generation", "check_sample_generation": "precheck",
    # the engine, what it trains with, its ops (their rules, checks and application) and its
    # read-only view
    "Engine": "controller", "TrainingInputs": "inputs", "Op": "controller", "Note": "controller",
    "weights_lost_reason": "ops",
    "refusal": "ops", "ProjectedRun": "ops", "known_ids": "ops", "project": "ops",
    "checked_run": "ops", "check_status_op": "ops", "EngineView": "view",
    "ENDED_REASON": "lifecycle", "wait_with_progress": "lifecycle", "interruptible": "lifecycle",
    "trainer_class": "adapters", "warn_engine_owned_knobs": "adapters.base",
    "check_before_training": "precheck", "check_target_modules": "precheck",
    "check_run_data": "formatting",
    "preserved_accelerate_state": "hfstate",
    "derive_seed": "rng", "rng_fork": "rng",
    "export_adapter": "export", "check_export_path": "export", "ExportError": "export",
    "export_run": "export",
    # Ray workers
    "check_num_workers": "workers", "resolve_num_workers": "workers",
    "RemoteChunkExecutor": "workers.executor", "connect": "workers.pool", "init_local_ray": "workers.pool",
    # FSDP: run_fit's up-front checks of sharded runs
    "apply_num_gpus": "sharding", "check_sharding": "sharding", "warn_unused_fsdp_config": "sharding",
    # the event log and the reducer's run table
    "EventLog": "events", "ReadOnlyLog": "events", "read_events": "events",
    "read_nofollow": "events", "EventLogError": "events", "MAX_RUN_ID": "events",
    "MetricNamesError": "events", "MAX_METRICS_PER_EVENT": "events", "MAX_METRIC_NAMES": "events",
    "FolderLinkError": "events",
    "LiveTable": "state", "new_table": "state", "reduce": "state", "fold": "state",
    "get_run": "state", "runs_by_id": "state", "metric_x": "state", "lower_is_better": "state",
    "config_fingerprint": "state", "check_automl_state": "state",
    "TIME_KEYS": "state", "TIMELINE_COLUMNS": "state", "time_field": "state",
    # the experiment folder
    "ExperimentStore": "store", "check_experiment_meta": "store", "read_json": "store",
    "refuse_links": "store", "check_experiment_name": "store", "MAX_NAME": "store",
    "failed_by_the_disk": "store", "MetadataError": "store",
    "CheckpointReadError": "store", "checkpoint_writes": "persistence",
    "FolderLock": "lock", "ExperimentLocked": "lock",
    "atomic_write_json": "fsio", "refuse_special_files": "fsio", "atomic_write_text": "fsio",
    "atomic_write_bytes": "fsio",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    # Not cached: each use reads the submodule's name, as the direct imports it replaces did.
    if name in _WHERE:
        return getattr(importlib.import_module(f"rapidfire_nb.engine.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'rapidfire_nb.engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
