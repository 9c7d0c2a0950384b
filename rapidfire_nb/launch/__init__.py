"""run_fit's pipeline: plain values in, a started engine out; it never receives the Experiment.

    fit = prepare(FitCall(<run_fit's arguments>), name=..., store=..., events=..., table=..., ...)
    ...                                         # the facade logs its session (nothing before)
    meta = commit(fit, name)                    # runs created (or restored), experiment.json

``prepare`` checks run_fit's arguments (``arguments.py``: every refusal that needs nothing), then
everything that needs the data, the folder or the models (``plan.FitPlan``; ``resume.py`` for a
resumed folder), and writes nothing: a refusal there leaves the folder as it was. ``commit``
creates the runs (or restores them) and wires the AutoML driver (``rapidfire_nb.tuning``) to the
engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rapidfire_nb.launch.arguments import (FitArguments, FitCall, check_clone,
                                           check_concurrency_flag, check_fit_arguments)
from rapidfire_nb.launch.plan import FitPlan, make_plan
from rapidfire_nb.launch.resume import RestorePlan, refuse_lost_history

__all__ = ["FitArguments", "FitCall", "FitPlan", "Launch", "RestorePlan", "check_clone", "check_concurrency_flag",
           "check_fit_arguments", "commit", "prepare", "refuse_lost_history"]


@dataclass
class Launch:
    """What ``prepare`` decided: the engine (runs not created yet), the AutoML driver or None,
    the plan, and for a resumed folder its stored ``experiment.json`` and the restore plan."""
    args: FitArguments
    engine: Any
    driver: Any
    plan: FitPlan
    store: Any
    events: Any
    stored_meta: dict | None
    restore: RestorePlan | None


def prepare(call: FitCall, *, store, events, table, name: str, stored_meta: dict | None,
            num_workers, offload: str) -> Launch:
    """Everything run_fit checks before it writes: its arguments (``check_fit_arguments``), the
    data against every run, the engine and each run's plan, a resume against the folder, the
    AutoML objective, the base models (loaded here, in the caller's thread, so ``create_model``'s
    errors show in the cell) and the executor's own checks (with Ray: the workers start and load
    what the runs need). ``stored_meta`` is the resumed folder's experiment.json (None: a new one)."""
    from rapidfire_nb import automl
    from rapidfire_nb.engine import (Engine, TrainingInputs, check_before_training, check_run_data,
                                     check_sample_generation, check_sample_prompts, trainer_class)
    from rapidfire_nb.errors import ConfigError
    from rapidfire_nb.launch.resume import check_resume, plan_restore
    from rapidfire_nb.tuning import check_objective_is_logged, driver_for, needs_driver, pruning_settings

    args = check_fit_arguments(call, num_workers)
    samples = check_sample_prompts(call.sample_prompts)
    specs, group = args.specs, args.config_group
    train, evald = args.train_dataset, args.eval_dataset
    prep_cache: dict = {}   # formatting_func's mapped data, shared by the runs' trainers
    for spec in specs:
        check_run_data(spec, trainer_class(spec.trainer_type), train, evald, prep_cache)
    workers = args.workers
    # what every run trains with, as one value, built once here and taken whole by the engine,
    # its trainer factory and, with Ray, the pool and each worker
    inputs = TrainingInputs(args.create_model, train, evald, args.num_chunks, args.seed,
                            automl.build_training_args, automl.build_lora_config, offload=offload,
                            prep_cache=prep_cache, sample_prompts=samples)
    executor = None
    if workers:   # Ray is imported only on this path
        from rapidfire_nb.engine import RemoteChunkExecutor

        executor = RemoteChunkExecutor.for_workers(workers, inputs)
    engine = Engine(store, events, inputs, executor=executor)
    for spec in specs:          # num_chunks vs steps per epoch, for every run, before anything
        engine.plan_run(spec)
    plan = make_plan(args, pruning_settings(group))
    if stored_meta is not None:
        check_resume(stored_meta, name, plan)
    # -- AutoML at chunk boundaries: pruners, RFOptuna
    if needs_driver(group):
        if evald is None:
            raise ConfigError(f"{type(group).__name__}: the objective {group.pruning.objective!r} is "
                              "measured on the eval set after every chunk: pass eval_dataset= to run_fit")
        check_objective_is_logged(group, specs)
    driver = driver_for(store.root, events, table, group, specs, args.num_chunks)
    restore = None
    if stored_meta is not None:
        if driver is not None:
            driver.load()      # reads automl.json only; a damaged one refuses here
        restore = plan_restore(specs, store, events, engine, driver)   # refuses before any write
    # create_model once per distinct base, in this thread so its errors show here
    need_pristine: dict = {}
    for spec in specs:
        need_pristine[spec.base_key()] = need_pristine.get(spec.base_key(), False) or spec.peft_config is None
    for spec in specs:
        engine.load_base(spec, need_pristine[spec.base_key()])
    # what needs the base or the data: LoRA targets, the first rows, generation_config
    check_before_training(specs, engine.model_and_tokenizer, train, evald, prep_cache)
    check_sample_generation(specs, engine.model_and_tokenizer, samples, evald, prep_cache)
    # the executor's own checks (with Ray: the workers start and load what the runs need); its
    # errors change nothing
    engine.executor.prepare(specs)
    return Launch(args, engine, driver, plan, store, events, stored_meta, restore)


def commit(fit: Launch, name: str) -> dict:
    """Create the runs (or restore them from the folder), write experiment.json, and attach the
    AutoML driver; returns experiment.json as written (or as it stands on a resume)."""
    from rapidfire_nb.engine import EngineView, atomic_write_json
    from rapidfire_nb.launch.resume import restore_runs

    engine, plan = fit.engine, fit.plan
    resumed = fit.stored_meta is not None
    if resumed:
        meta = fit.stored_meta
        # a crash before run_fit wrote experiment.json's settings: completed now
        missing = not meta.get("data")
        if missing:
            meta = plan.meta(name)
        restore_runs(fit.restore, engine, fit.store, fit.events, meta=meta if missing else None)
    else:
        with engine.runs_writes_deferred():   # runs.json once, holding every run
            for spec in plan.specs:
                engine.add_run(spec)
        engine.save_runs()
        meta = plan.meta(name)
        atomic_write_json(fit.store.meta_path, meta)
    driver = fit.driver
    if driver is not None:
        driver.attach(EngineView(engine), resumed)
        # every id the study handed out stays its trial's: a clone never takes one
        engine.reserve_run_ids(driver.handed_out_ids())
        engine.boundary_hook = driver.on_boundary
    return meta
