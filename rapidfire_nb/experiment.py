"""Experiment: the user's facade over the engine.

    exp = Experiment("sft-demo")
    exp.run_fit(config_group, create_model, train_dataset, eval_dataset, num_chunks=4)
    exp            # in a notebook: the live control panel
    exp.get_results()

Everything the user calls is validated here, in the caller's thread; accepted interactive ops are
queued for the engine thread, which applies them at the next chunk boundary.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapidfire_nb._version import __version__
from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.adapters import trainer_class
from rapidfire_nb.engine.controller import Engine, Op
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.engine.lock import FolderLock
from rapidfire_nb.engine.precheck import check_before_training, check_target_modules
from rapidfire_nb.engine.queued import ProjectedRun, known_ids, project
from rapidfire_nb.engine.fsio import atomic_write_json
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.store import (
    ExperimentStore,
    check_experiment_meta,
    failed_by_the_disk,
    read_json,
)
from rapidfire_nb.errors import ConfigError, OpRefused, RapidFireError

_current: weakref.ref[Experiment] | None = None
# fullmatch, not match: "$" would let a trailing newline through into the folder name
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def current_experiment() -> Experiment | None:
    """The most recently created, not yet ended Experiment of this process."""
    exp = _current() if _current is not None else None
    return exp if exp is not None and not exp._ended else None


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython

        ip = get_ipython()
    except Exception:
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def _dataset_fingerprint(ds) -> str:
    """A content hash (datasets' own fingerprint is random after a map with an unhashable fn)."""
    if ds is None:
        return "none"
    h = hashlib.sha256(json.dumps([len(ds), sorted(ds.column_names)]).encode())
    step = max(1, len(ds) // 1024)
    for i in range(0, len(ds), step):
        h.update(json.dumps(ds[i], sort_keys=True, default=repr).encode())
    return f"{len(ds)}:{h.hexdigest()[:16]}"


# -- TRL/PEFT objects from a RunSpec (automl owns validation; this is the engine's entry) --------

def build_training_args(spec: RunSpec, **overrides):
    from rapidfire_nb import automl

    return automl.build_training_args(spec, **overrides)


def build_lora_config(spec: RunSpec):
    from rapidfire_nb import automl

    return automl.build_lora_config(spec)


class Experiment:
    """A named experiment: a folder, an event log, and the runs trained in it.

    Args:
        experiment_name: folder name under ``experiment_path``. Creating an ``Experiment`` whose
            folder already holds one starts a new folder ``<name>_2``, ``_3``, ... (one printed
            line; ``exp.path`` says where); ``resume=True`` continues the old one instead. Opening
            a folder that a live Experiment holds is refused.
        experiment_path: parent folder (default ``./rapidfire_experiments``).
        resume: continue an existing experiment folder after a dead kernel; call ``run_fit`` with
            the same arguments again (datasets and callables cannot be stored).
        tracking: trackers to feed (``["tensorboard", "mlflow", "trackio"]``); default from the
            ``RF_*_ENABLED`` environment switches (TensorBoard on).
        mode: accepted for RapidFire AI compatibility (``"fit"``).
        offload: where runs that are not training keep their own state (adapter or full model
            copy, and optimizer state). ``"auto"`` (default): on the GPU, moving the least recently
            trained runs to pinned host memory only while the GPU is short of memory; ``"never"``:
            always on the device; ``"always"``: only the training run is on the device.
        num_workers: where chunks train. ``"auto"`` (default): in this kernel when at most one GPU
            is visible; one Ray worker per GPU when there are several, or per GPU of the Ray
            cluster already chosen (``ray.init(address=...)`` or ``RAY_ADDRESS``). ``0``: in this
            kernel. ``n``: n Ray workers (on CPUs when the cluster has no GPU). A chosen cluster with
            at most one GPU trains in this kernel, with a warning: pass ``n`` to use it. Needs Ray:
            ``pip install -e '.[ray]'`` from the clone, or ``pip install 'ray>=2.60'``; see
            "More than one GPU" in the README.
    """

    def __init__(self, experiment_name: str, experiment_path: str | Path | None = None, *,
                 mode: str = "fit", resume: bool = False, tracking: list[str] | None = None,
                 offload: str = "auto", num_workers: int | str = "auto"):
        global _current
        if not isinstance(experiment_name, str) or not _NAME_RE.fullmatch(experiment_name):
            raise ConfigError(
                f"experiment_name must be 1-128 letters, digits, '.', '_' or '-' (got {experiment_name!r})")
        if mode not in ("fit",):
            raise ConfigError(f"mode={mode!r} is not supported; only 'fit'")
        if offload not in ("auto", "always", "never"):
            raise ConfigError(f"offload={offload!r}: use 'auto' (park runs in host memory only when "
                              "the GPU is short of memory), 'always' or 'never'")
        from rapidfire_nb.engine.workers import check_num_workers

        check_num_workers(num_workers)
        parent = Path(experiment_path) if experiment_path is not None else Path("rapidfire_experiments")
        root = parent / experiment_name
        if resume and not (root / "experiment.json").exists():
            raise ConfigError(f"resume=True but there is no experiment at {root}")
        if not resume and (root / "experiment.json").exists():
            # a re-executed cell must not mix two experiments in one folder
            n = 2
            while (parent / f"{experiment_name}_{n}" / "experiment.json").exists():
                n += 1
            # one short line in the cell (a re-run cell is normal), not a warning with a temp path
            print(f"rapidfire: experiment {experiment_name!r} exists; this one is "
                  f"'{experiment_name}_{n}' (resume=True continues {experiment_name!r})")
            experiment_name, root = f"{experiment_name}_{n}", parent / f"{experiment_name}_{n}"
        root.mkdir(parents=True, exist_ok=True)
        self.name = experiment_name
        self.path = root.resolve()
        self.resumed = resume
        self.offload = offload
        self.num_workers = num_workers
        self.store = ExperimentStore(self.path)
        # the folder's owner from here to end(): nothing below may write before this
        self._folder_lock = FolderLock(self.path).acquire()
        try:
            self.meta = check_experiment_meta(read_json(self.store.meta_path, {}),
                                              self.store.meta_path) if resume else {}
            if resume:
                self._refuse_lost_history()
            self.events = EventLog(self.store.events_path)
        except BaseException:
            self._folder_lock.release()
            raise
        self.engine: Engine | None = None
        self._ended = False
        self._reserved_ids: set[int] = set()
        self._panel = None
        self._tb = None
        self.automl = None   # pruning/refill driver of the config group (tuning.py), if any
        if not resume:
            atomic_write_json(self.store.meta_path, {"name": self.name, "version": __version__})
        self.events.append("experiment", name=self.name, path=str(self.path), resumed=bool(resume))
        self._trackers = None
        self._start_trackers(tracking)
        _current = weakref.ref(self)

    def _refuse_lost_history(self) -> None:
        """Resuming on an empty or missing event log while runs.json or checkpoints show that runs
        were created would silently drop every logged loss, metric and op: refused, nothing written.
        A folder where run_fit never created a run (no runs.json, no checkpoint) is fresh."""
        from rapidfire_nb.engine.events import EventLogError

        path = self.store.events_path
        try:
            empty = not path.exists() or not path.read_bytes().strip()
        except OSError as exc:
            raise EventLogError(f"cannot read {path}: {exc.strerror or exc}") from exc
        if not empty:
            return
        runs = read_json(self.store.runs_path, {})
        ckpts = sorted(p.parent.name for p in (self.path / "checkpoints").glob("run_*/*.safetensors"))
        if not runs and not ckpts:
            return
        what = "is missing" if not path.exists() else "is empty"
        evidence = []
        if runs:
            evidence.append(f"{self.store.runs_path} records {len(runs)} run(s)")
        if ckpts:
            evidence.append(f"checkpoints exist for {', '.join(dict.fromkeys(ckpts))}")
        raise EventLogError(
            f"{path} {what} but {' and '.join(evidence)}: resuming would lose the experiment's "
            f"logged history (losses, metrics, ops). Restore {path.name} from a backup, or start a "
            f"new experiment (resume=False); nothing was changed")

    def _start_trackers(self, tracking):
        try:
            from rapidfire_nb.tracking import TrackerHub, resolve_trackers
        except ImportError:
            return
        names = resolve_trackers(tracking)
        if names:
            self._trackers = TrackerHub(self.events, self.path, self.name, names)
            self._trackers.start()

    # -- training ----------------------------------------------------------------------------
    def run_fit(self, config_group, create_model: Callable, train_dataset, eval_dataset=None,
                num_chunks: int = 4, seed: int = 42, block: bool | None = None) -> Experiment:
        """Expand and validate ``config_group``, then train every run, chunk by chunk.

        Args:
            config_group: an ``RFGridSearch``, ``RFRandomSearch`` or ``RFOptuna`` (from
                ``rapidfire_nb.automl``): each configuration it expands to is one run.
            create_model: ``model_config -> (model, tokenizer)``; called once per distinct base
                model, in this thread (its errors show here).
            train_dataset, eval_dataset: ``datasets.Dataset``; the eval set is evaluated after every
                chunk (optional unless a pruner, RFOptuna or ``compute_metrics`` needs it).
            num_chunks: chunks per epoch. The training data is cut into ``num_chunks`` equal parts
                and every run trains chunk k of the data before any run trains chunk k+1, so all
                runs can be compared after each chunk. More chunks: earlier comparisons, more swaps.
            seed: the seed of every run's data order (per epoch) and of its initialisation (a
                LoRA adapter's weights, derived from the seed and the run's config): the same
                seed, data and configs train the same weights.
            block: ``None`` (default): in a Jupyter/Colab kernel return at once while training goes
                on in a background thread (the returned Experiment displays as the live panel; ops
                such as ``stop`` work meanwhile); in a plain script or terminal IPython block until
                every run is finished. ``False``: return at once everywhere (call ``wait()`` or
                ``end()`` later); ``True``: block everywhere.

        With Ray workers (``num_workers``) the first ``run_fit`` also starts Ray and the workers
        (it prints a line saying so): 10-30 s the first time; it returns once every worker has
        loaded the base model(s) and the functions and data the runs need.

        Every error that can be found before training (configs, data columns, ``num_chunks``,
        ``create_model``'s return value) is raised here and nothing is started.
        """
        from rapidfire_nb._quiet import import_peft_quietly

        import_peft_quietly()   # before trl/peft: no bitsandbytes "pip install kernels" line
        self._check_open()
        if self.engine is not None:
            raise RapidFireError("run_fit was already called on this Experiment; use clone_modify "
                                 "to add runs, or create a new Experiment")
        if not callable(create_model):
            raise ConfigError("create_model must be a function model_config -> (model, tokenizer)")
        if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
            raise ConfigError(f"num_chunks must be an integer >= 1, got {num_chunks!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        for name, ds in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if ds is None and name == "eval_dataset":
                continue
            if not hasattr(ds, "column_names") or not hasattr(ds, "__len__"):
                raise ConfigError(f"{name} must be a datasets.Dataset, got {type(ds).__name__}")
            if len(ds) == 0:
                raise ConfigError(f"{name} is empty")
        specs = _expand(config_group)
        if eval_dataset is None and any(s.compute_metrics is not None for s in specs):
            raise ConfigError("compute_metrics needs an eval_dataset: pass eval_dataset= to run_fit")
        from rapidfire_nb.engine.formatting import check_run_data

        prep_cache: dict = {}   # formatting_func's mapped data, shared by the runs' trainers
        for spec in specs:
            check_run_data(spec, trainer_class(spec.trainer_type), train_dataset, eval_dataset,
                           prep_cache)

        from rapidfire_nb.engine.workers import resolve_num_workers

        workers = resolve_num_workers(self.num_workers)
        if workers:   # Ray is imported only on this path
            from rapidfire_nb.engine.workers.engine import WorkerEngine

            engine = WorkerEngine(self.store, self.events, create_model, train_dataset, eval_dataset,
                                  num_chunks, seed, build_training_args, build_lora_config,
                                  offload=self.offload, prep_cache=prep_cache, num_workers=workers)
        else:
            engine = Engine(self.store, self.events, create_model, train_dataset, eval_dataset,
                            num_chunks, seed, build_training_args, build_lora_config,
                            offload=self.offload, prep_cache=prep_cache)
        for spec in specs:          # num_chunks vs steps per epoch, for every run, before anything
            engine.plan_run(spec)
        data_fp = {"train": _dataset_fingerprint(train_dataset), "eval": _dataset_fingerprint(eval_dataset)}
        if self.resumed:
            self._check_resume(specs, data_fp, num_chunks, seed, config_group)
        # -- AutoML at chunk boundaries (issue 18): pruners, RFOptuna --------------------------
        from rapidfire_nb.tuning import driver_for, needs_driver, pruning_settings

        if needs_driver(config_group) and eval_dataset is None:
            raise ConfigError(f"{type(config_group).__name__}: the objective "
                              f"{config_group.pruning.objective!r} is measured on the eval set "
                              "after every chunk: pass eval_dataset= to run_fit")
        if needs_driver(config_group):
            from rapidfire_nb.tuning import check_objective_is_logged

            check_objective_is_logged(config_group, specs)
        automl = driver_for(self, config_group, specs, num_chunks)
        # -------------------------------------------------------------------------------------
        # create_model once per distinct base, in this thread so its errors show here
        need_pristine = {}
        for spec in specs:
            need_pristine[spec.base_key()] = need_pristine.get(spec.base_key(), False) or spec.peft_config is None
        for spec in specs:
            engine.load_base(spec, need_pristine[spec.base_key()])
        # what needs the base or the data: LoRA targets, the first rows, generation_config
        check_before_training(specs, engine.model_and_tokenizer, train_dataset, eval_dataset, prep_cache)
        if workers:
            # seconds of silence otherwise: Ray's start, then each worker imports torch and loads
            # the model(s) and what the runs need (start_workers checks it before any run exists)
            print(f"rapidfire: starting {workers} Ray worker{'s' if workers > 1 else ''} (Ray itself "
                  "first if it is not running: 10-30 s the first time); run_fit returns once each "
                  "worker has loaded the model", flush=True)
            engine.start_workers(specs)   # Ray, the workers, what they must load; errors change nothing
        self.engine = engine
        self.automl = automl
        if self.resumed:
            self._restore_runs(specs)
        else:
            for spec in specs:
                engine.add_run(spec)
            meta = {"name": self.name, "version": __version__, "num_chunks": num_chunks, "seed": seed,
                    "data": data_fp, "runs": [s.fingerprint() for s in specs],
                    "pruning": pruning_settings(config_group)}
            atomic_write_json(self.store.meta_path, meta)
            self.meta = meta
        if automl is not None:
            if self.resumed:
                automl.load()
            automl.attach(engine, self.resumed)
        engine.start()
        if block is None:
            block = not _in_kernel()
        if block:
            self.wait()
        return self

    def _check_resume(self, specs, data_fp, num_chunks, seed, config_group=None) -> None:
        """Refuse a resume whose ``run_fit`` arguments differ from the original ones (pruning
        knobs included), before anything is changed."""
        from rapidfire_nb.tuning import check_pruning_resume, pruning_settings

        meta = self.meta
        pruning = pruning_settings(config_group)
        # remembered so _restore_runs can complete experiment.json if a crash came before it
        self._resume_meta = {"num_chunks": num_chunks, "seed": seed, "data": data_fp,
                             "runs": [s.fingerprint() for s in specs], "pruning": pruning}
        stored_data = meta.get("data") or {}
        for split, name in (("train", "train_dataset"), ("eval", "eval_dataset")):
            if split in stored_data and stored_data[split] != data_fp[split]:
                raise ConfigError(
                    f"resume=True but {name} differs from the one experiment {self.name!r} was started "
                    f"with (fingerprint {data_fp[split]!r}, stored {stored_data[split]!r}); pass the "
                    f"same {name} to run_fit")
        for key, given in (("num_chunks", num_chunks), ("seed", seed)):
            if meta.get(key) is not None and meta[key] != given:
                raise ConfigError(f"resume=True needs the original {key}={meta[key]!r} (got {given!r})")
        check_pruning_resume(meta.get("pruning"), pruning)
        stored_runs = meta.get("runs")
        if stored_runs:
            given_runs = self._resume_meta["runs"]
            if len(stored_runs) != len(given_runs):
                raise ConfigError(f"resume=True but the config group expands to {len(given_runs)} runs; "
                                  f"the original one had {len(stored_runs)}; pass the same config group")
            for i, (a, b) in enumerate(zip(stored_runs, given_runs)):
                if a != b:
                    raise ConfigError(f"resume=True but run {i + 1}'s config differs from the original "
                                      f"one; pass the same config group (and callables of the same names)")

    def _restore_runs(self, specs: list[RunSpec]) -> None:
        """Rebuild every run (clones included) from the event log and its checkpoint; mend the log.

        The event log is the authority (folded by engine/state.py); runs.json is a cache the
        engine writes for people and tools. Recovery refuses a damaged runs.json (someone changed
        the folder) and reads it only for what the log cannot say: a run whose ``run_created``
        never reached the log (a failed log write), and, in logs written before ``run_created``
        carried them, a clone's ``changes`` and a warm clone's first chunk.

        What a crash can leave, and what this does about it:
        - a run's checkpoint newer than its events in the log (killed between the checkpoint's
          rename and the log append, or during the append): the checkpoint carries the chunk's
          events; the missing ones are appended, none twice;
        - runs of the group missing from the log (killed while ``run_fit`` created them): they
          are created now, without a second ``run_created`` event if one was logged;
        - a run that failed because its checkpoint could not be written (disk full): it continues
          from its previous, intact checkpoint;
        - temporary files of interrupted writes: removed.
        Stopped runs stay stopped; running ones become pending and continue from their checkpoint.
        """
        from rapidfire_nb import automl
        from rapidfire_nb.engine.state import fold
        from rapidfire_nb.engine.store import CheckpointReadError

        engine = self.engine
        self.store.remove_stale_tmp()
        cache = R.check_runs_json(read_json(self.store.runs_path, {}), self.store.runs_path)
        table = fold(self.events.since(0))
        logged = {r["run_id"]: r for r in table["runs"].values() if r["created"]}
        infos = {rid: _restore_info(run, cache.get(rid)) for rid, run in logged.items()}
        for rid, rec in cache.items():
            infos.setdefault(rid, rec)
        for rid in range(1, len(specs) + 1):
            infos.setdefault(rid, {"status": R.PENDING, "parent_run_id": None, "warm_start": False})
        from rapidfire_nb.engine.lifecycle import ENDED_REASON

        # by end(wait=False), not by the user: they go on
        self._stopped_by_end = {rid for rid, r in logged.items()
                                if r["status"] == R.STOPPED and r["reason"] == ENDED_REASON}
        logged_chunks = {_chunk_key(row) for row in table["timeline"]}
        logged_metrics = {(p["run_id"], p["split"], p["step"]) for p in table["points"]}
        # one runs.json write at the end instead of one per restored run (it is only a cache)
        with engine.runs_writes_deferred():
            for rid in sorted(infos):
                self._restore_run(rid, infos[rid], specs, set(logged), logged_chunks, logged_metrics,
                                  automl, CheckpointReadError)
        if not self.meta.get("data") and getattr(self, "_resume_meta", None):
            self.meta = {"name": self.name, "version": __version__, **self._resume_meta}
            atomic_write_json(self.store.meta_path, self.meta)
        engine.save_runs()

    def _restore_run(self, rid, info, specs, created, logged_chunks, logged_metrics, automl,
                     CheckpointReadError) -> None:
        engine = self.engine
        parent_id = info.get("parent_run_id")
        if parent_id is None:
            added = self.automl.spec_for(rid) if self.automl is not None else None  # refills
            if added is not None:
                spec = added
            elif rid > len(specs):
                raise ConfigError(f"resume=True but the config group expands to {len(specs)} runs and "
                                  f"the experiment has a run {rid}; pass the same config group")
            else:
                spec = specs[rid - 1]
        elif (parent := engine.snapshot().get(parent_id)) is not None:
            spec = automl.apply_changes(parent.spec, info.get("changes") or {})
        else:
            raise RapidFireError(f"cannot restore run {rid}: its parent run {parent_id} is missing "
                                 f"from {self.store.events_path}")
        if info.get("fingerprint") and info["fingerprint"] != spec.fingerprint():
            raise ConfigError(f"resume=True but run {rid}'s config differs from the original one; "
                              f"pass the same config group")
        rec = engine.add_run(spec, run_id=rid, parent=None, warm_start=bool(info.get("warm_start")),
                             changes=info.get("changes"), emit=rid not in created)
        rec.parent_run_id = parent_id
        rec.step_offset = info.get("step_offset", 0)
        rec.total_steps += rec.step_offset   # a warm clone's own schedule, after its stream offset
        for key in ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done", "error"):
            setattr(rec, key, info.get(key, getattr(rec, key)))
        status = info.get("status", R.PENDING)
        reason = "restored after restart"
        if status == R.STOPPED and rid in self._stopped_by_end:
            status, reason = R.PENDING, "continued: it was stopped only because the experiment ended"
        if status == R.FAILED and failed_by_the_disk(rec.error):
            status, reason = R.PENDING, "retried from its last intact checkpoint after a checkpoint write failure"
            rec.error = None
        ckpt = unreadable = None
        if status != R.DELETED:
            try:
                ckpt = self.store.load_checkpoint(rid)
            except CheckpointReadError as exc:
                unreadable = exc
                if status not in (R.COMPLETED, R.FAILED):
                    status, rec.error = R.FAILED, str(exc)
                    reason = "its checkpoint cannot be read"
        if ckpt is not None:
            for k, v in ckpt["counters"].items():
                setattr(rec, k, v)
            chunk_event = ckpt.get("chunk_event")
            if chunk_event and _chunk_key(chunk_event) not in logged_chunks:
                # killed between the checkpoint and (the end of) its log append
                missing = [(t, p) for t, p in ckpt["events"]
                           if t != "metric" or (p["run_id"], p["split"], p["step"]) not in logged_metrics]
                self.events.extend(missing + [("chunk_done", chunk_event)])
        elif status in (R.PENDING, R.RUNNING, R.STOPPED, R.FAILED):
            # failed ones too: a warm clone of a run that failed before its first checkpoint
            # starts from these weights, in this session as in the one that created it
            if rec.warm_start:
                weights = self._lost_warm_start_weights(rec)
                if weights is None and status == R.FAILED:
                    pass   # failed already; a warm clone of it is refused (no weights)
                elif weights is None:
                    status = R.FAILED
                    rec.error = (f"run {rid} was a warm-start clone of run {parent_id} whose starting "
                                 f"weights were lost in the crash (saved before the warm-start store "
                                 f"existed); clone the parent again")
                    reason = "warm-start weights lost"
                else:
                    engine.set_start_weights(rid, weights)
            elif status != R.FAILED:   # no chunk finished before the crash: it starts from scratch
                rec.completed_steps = rec.samples_seen = rec.epoch = rec.chunk = rec.chunks_done = 0
        elif status == R.COMPLETED and unreadable is not None:
            warnings.warn(f"run {rid} is completed but its checkpoint cannot be used: {unreadable}",
                          stacklevel=3)
        elif status == R.COMPLETED:
            warnings.warn(f"run {rid} is completed but its checkpoint {self.store.checkpoint_path(rid)} "
                          f"is missing: its weights are gone (export and warm clones of it are refused)",
                          stacklevel=3)
        if status == R.RUNNING:
            status = R.PENDING
        if status in R.ACTIVE and rec.completed_steps >= rec.total_steps:
            status = R.COMPLETED
        rec.status = status
        if status != info.get("status") or rid not in created:
            self.events.append("run_status", run_id=rid, status=status, error=rec.error, reason=reason)

    def _lost_warm_start_weights(self, rec):
        """A warm-start clone without a checkpoint: its stored starting weights, else the parent's
        checkpoint if the parent is still exactly where the clone started."""
        weights = self.store.load_warm_start(rec.run_id)
        if weights is not None:
            return weights
        parent_ckpt = self.store.load_checkpoint(rec.parent_run_id)
        if parent_ckpt is not None and parent_ckpt["counters"]["completed_steps"] == rec.step_offset:
            return parent_ckpt["trainer"]["weights"]
        return None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is pending or running; True if so, False on timeout.

        Panel buttons are handled by the kernel only between cell executions, so while a cell is
        blocked here clicks wait until it returns; in a notebook, prefer to let ``run_fit`` return
        and call ``wait`` only at the end.
        """
        if self.engine is None:
            return True
        self._refuse_from_engine_threads("wait")
        done = self.engine.wait(timeout)
        if done and self._trackers is not None:
            self._trackers.flush(timeout=30)
        return done

    def end(self, wait: bool = True) -> None:
        """Finish the experiment: flush trackers, free memory, release the folder.

        ``wait=True`` (default, as RapidFire notebooks call it right after ``run_fit``): first
        waits for every pending and running run to finish, printing progress. ``wait=False``: runs
        not finished stop at their next chunk boundary and are marked ``stopped`` (their
        checkpoints stay: ``Experiment(name, resume=True)`` plus the same ``run_fit`` call
        continues them; runs the user stopped stay stopped). No run is left ``running`` either way.
        """
        global _current
        if self._ended:
            return
        if not isinstance(wait, bool):
            raise ConfigError(f"end(wait=...) must be True or False, got {wait!r}")
        if self.engine is not None:
            self._refuse_from_engine_threads("end")
            if wait:
                from rapidfire_nb.engine.lifecycle import wait_with_progress

                wait_with_progress(self.engine)
            from rapidfire_nb.engine.lifecycle import ENDED_REASON

            self.engine.drain()
            self.engine.end_unfinished(ENDED_REASON)
            self.engine.close()
        self.events.append("experiment_end")
        if self._trackers is not None:
            try:
                self._trackers.flush(timeout=30)
                self._trackers.close()
            except Exception as exc:
                warnings.warn(f"trackers did not close cleanly: {exc}", stacklevel=2)
        if self._panel is not None:
            try:
                self._panel.close_publisher()
            except Exception:
                pass
        self.events.close()
        self._folder_lock.release()
        self._ended = True
        if _current is not None and _current() is self:
            _current = None

    def _refuse_from_engine_threads(self, what: str) -> None:
        """An event listener runs in the thread that logs the event (the engine's or the
        checkpoint writer's); waiting there for the engine to finish would wait forever."""
        if self.engine is not None and self.engine.in_own_thread():
            raise RapidFireError(f"Experiment.{what}() cannot be called from an event listener "
                                 "(it runs in the engine's own threads); call it from your code")

    def _check_open(self) -> None:
        if self._ended:
            raise RapidFireError(f"experiment {self.name!r} has ended; create a new Experiment")

    # -- interactive control ops --------------------------------------------------------------
    def _run(self, run_id) -> ProjectedRun:
        """The run as the ops already queued will leave it (a queued clone's id works at once)."""
        self._check_open()
        if self.engine is None:
            raise OpRefused("no runs yet: call run_fit first")
        if isinstance(run_id, bool) or not isinstance(run_id, int):
            raise OpRefused(f"run_id must be an integer, got {run_id!r}")
        rec = project(self.engine, run_id)
        if rec is None:
            raise OpRefused(f"unknown run {run_id}; runs are {known_ids(self.engine)}")
        return rec

    def stop(self, run_id: int) -> None:
        """Stop a pending or running run at its next chunk boundary; its checkpoint stays.

        Checked at once (a refused op raises ``OpRefused`` and changes nothing), then queued: the
        engine applies it at the next chunk boundary, so ``get_runs_info()`` and the panel show
        the old status until then (``%rapidfire status`` lists the queued ops)."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            rec = self._run(run_id)
            if rec.status not in R.ACTIVE:
                raise OpRefused(f"run {run_id} is {rec.status}; only pending or running runs can be stopped")
            self.engine.submit(Op("stop", run_id))

    def resume(self, run_id: int) -> None:
        """Resume a stopped run from its checkpoint.

        Queued like ``stop``: applied at the next chunk boundary (see ``stop``)."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            rec = self._run(run_id)
            if rec.status != R.STOPPED:
                raise OpRefused(f"run {run_id} is {rec.status}; only stopped runs can be resumed")
            self.engine.submit(Op("resume", run_id))

    def delete(self, run_id: int) -> None:
        """Remove a run from scheduling for good and free its memory and checkpoints (metrics stay).

        Queued like ``stop``: applied at the next chunk boundary, so the run is listed with its
        old status until then (a second ``delete`` of it is refused at once)."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            rec = self._run(run_id)
            if rec.status == R.DELETED:
                raise OpRefused(f"run {run_id} is already deleted (or its delete is queued)")
            self.engine.submit(Op("delete", run_id))

    def validate_clone(self, run_id: int, changes: dict | None = None, warm_start: bool = False) -> RunSpec:
        """Check a clone_modify without creating anything; returns the new run's spec."""
        from rapidfire_nb import automl

        view = self._run(run_id)
        if view.status == R.DELETED:
            raise OpRefused(f"run {run_id} is deleted (or its delete is queued); it cannot be cloned")
        if not isinstance(warm_start, bool):
            raise OpRefused(f"warm_start must be True or False, got {warm_start!r}")
        if warm_start and not view.exists:
            raise OpRefused(f"run {run_id} is a queued clone that has not been created yet; a warm "
                            "start needs its weights: clone it once it has trained a chunk")
        rec = view.record if view.exists else view
        if warm_start and self.engine.weights_missing(rec):
            from rapidfire_nb.engine.controller import weights_lost_reason

            raise OpRefused(weights_lost_reason(rec, self.store))
        if changes is None:
            changes = {}
        if not isinstance(changes, dict):
            raise ConfigError(f"changes must be a dict of knob -> value, got {type(changes).__name__}")
        _refuse_ambiguous_changes(changes)
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
        loaded = self.engine.model_and_tokenizer(spec)
        if loaded is not None:
            check_target_modules(spec, loaded[0])
        self.engine.plan_run(spec)   # num_chunks vs the clone's steps per epoch
        return spec

    def clone_modify(self, run_id: int, changes: dict | None = None, warm_start: bool = False) -> int:
        """A new run from ``run_id``'s config plus ``changes`` (nested or dotted knobs, JSON values).

        ``warm_start=True`` starts from the parent's current weights with a fresh optimizer and
        trains the clone's own full schedule, reading the data from the chunk after the parent's
        last completed chunk (wrapping around). Finished runs can be cloned, warm or cold. Returns
        the new run id.

        Queued like ``stop``: the new run appears in ``get_runs_info()`` and the panel at the
        next chunk boundary, but its id works at once (``stop(new_id)`` may follow right away).
        Calling it again makes a second clone.
        """
        from rapidfire_nb import automl

        spec = self.validate_clone(run_id, changes, warm_start)
        with self.engine.atomically():
            new_id = max(set(self.engine.run_ids()) | self._reserved_ids) + 1
            self._reserved_ids.add(new_id)
        flat = automl.flatten_changes(changes or {})
        self.engine.submit(Op("clone", run_id, spec=spec, warm_start=warm_start, changes=flat,
                              new_run_id=new_id))
        return new_id

    # -- AutoML (issue 18, rapidfire_nb/tuning.py) ---------------------------------------------
    def apply_suggestions(self, run_ids=None) -> list[int]:
        """With ``pruner_mode="suggest"``: stop the runs the pruner marked (all open marks, or the
        given ids) with the pruning reason; returns the ids stopped. Unmarked runs are refused.
        A marked run that is no longer pending/running (completed, failed, deleted, stopped) is
        skipped: its answer is logged as refused and it is not in the returned list."""
        self._check_open()
        if self.automl is None or self.automl.options.mode != "suggest":
            raise OpRefused("apply_suggestions needs a config group with pruner_mode='suggest'")
        return self.automl.apply_suggestions(run_ids)

    def dismiss_suggestions(self, run_ids=None) -> list[int]:
        """With ``pruner_mode="suggest"``: ignore the pruner's marks on these runs (all of them,
        or the given ids), which train on and are not judged again; returns the ids dismissed.
        Each answer is logged as an ``op`` event, like ``apply_suggestions``'s confirms. A marked
        run that ended (completed, failed, deleted) is skipped the same way: logged as refused,
        not returned; its mark stays in ``get_runs_info()``'s ``pruning`` column with the run's
        end, e.g. "...; run completed" or "...; run deleted". A ``stopped`` run is not ended here
        (unlike for ``apply_suggestions``): it can be resumed, so its mark can still be ignored."""
        self._check_open()
        if self.automl is None or self.automl.options.mode != "suggest":
            raise OpRefused("dismiss_suggestions needs a config group with pruner_mode='suggest'")
        return self.automl.dismiss_suggestions(run_ids)

    def get_pareto_front(self):
        """RFOptuna with several objectives: the non-dominated finished trials (run_id, values,
        params)."""
        if self.automl is None or self.automl.tuner is None:
            raise OpRefused("get_pareto_front needs an RFOptuna config group")
        return self.automl.tuner.pareto_front()

    def editable_knobs(self, run_id: int) -> dict:
        """The knobs ``clone_modify(run_id, changes)`` may change, dotted name -> the run's value
        (``{"training_args.learning_rate": 0.0002, "peft_config.r": 8, ...}``); the same list as
        ``%rapidfire knobs ID``. A queued clone's id works too."""
        from rapidfire_nb import automl

        return automl.editable_knobs(self._run(run_id).spec)

    # -- results -----------------------------------------------------------------------------
    def _state(self):
        """The event log folded into the run table (engine/state.py), kept up to date
        incrementally: every reader below folds only the events logged since the last read."""
        live = self.__dict__.get("_live_table")
        if live is None:
            from rapidfire_nb.engine.state import LiveTable

            live = self._live_table = LiveTable(self.events)
        return live

    def get_runs_info(self):
        """One row per run (a pandas DataFrame), in run order. Columns:

        * ``run_id``; ``status``: pending, running, stopped, completed, failed or deleted;
        * one column per knob that varies between runs, by its short name (``learning_rate``, ``r``);
        * ``completed_steps`` / ``total_steps``: optimizer steps; ``samples_seen``: training samples
          read so far; ``chunks_done``: chunks this run trained; ``epoch``: 0-based epoch of the
          run's next chunk in its data stream (= epochs finished; the panel and ``%rapidfire
          status`` count epochs and chunks from 1);
        * ``parent_run_id`` (``<NA>`` unless a clone) and ``warm_start``: a clone's lineage;
        * ``eval_loss``: the latest eval loss (NaN or None before the first eval;
          ``get_results()`` has every eval metric at every chunk);
        * ``error``: a failed run's traceback (``%rapidfire status`` shows its last line), else
          None;
        * ``worker`` (only with Ray workers, ``num_workers``): the worker that trained the run's
          last chunk, None before its first;
        * ``pruning`` (only when the config group has a pruner or is RFOptuna): why the run was
          pruned, or its open suggestion in ``pruner_mode="suggest"``; None otherwise.
        """
        import pandas as pd

        if self.engine is None:
            return pd.DataFrame(columns=["run_id", "status"])
        from rapidfire_nb.engine.state import runs_by_id

        fields = ("run_id", "status", "completed_steps", "total_steps", "samples_seen",
                  "chunks_done", "parent_run_id", "warm_start", "error")
        runs = self._state().read(lambda t: [
            {**{k: r[k] for k in fields}, "epoch": r["next_epoch"], "config": r["config"],
             "knobs": list(r["knobs"]), "eval_loss": r["latest"].get("eval_loss"),
             "worker": r["worker"]}
            for r in runs_by_id(t)])
        # Ray workers (num_workers): the worker that trained each run's last chunk
        on_workers = any(run["worker"] is not None for run in runs)
        knob_keys: list[str] = []
        for run in runs:
            for k in run["knobs"]:
                if k not in knob_keys:
                    knob_keys.append(k)
        short = _short_names(knob_keys)
        rows = []
        for run in runs:
            row = {"run_id": run["run_id"], "status": run["status"]}
            for k in knob_keys:
                row[short[k]] = _cell(_get_knob(run["config"], k))
            row.update({k: run[k] for k in ("completed_steps", "total_steps", "samples_seen",
                                            "chunks_done", "epoch", "parent_run_id", "warm_start",
                                            "eval_loss", "error")})
            if on_workers:
                row["worker"] = run["worker"]
            if self.automl is not None:
                row["pruning"] = self.automl.reason_for(run["run_id"])
            rows.append(row)
        df = pd.DataFrame(rows)
        # text columns keep None for "nothing to say": pandas would turn a partly filled one into
        # a string column with NaN, so `error` (all None) and `pruning` would disagree
        for col in ("error", "pruning", "worker"):
            if col in df:
                df[col] = pd.Series([row[col] for row in rows], index=df.index, dtype=object)
        # run ids are integers; a column with missing parents would otherwise read 1.0, 2.0
        df["parent_run_id"] = df["parent_run_id"].astype("Int64")
        return df

    def get_results(self):
        """Every logged metric, long form: run_id, split, step, samples_seen, epoch, chunk, metric,
        value, and deleted (True for the metrics of a run deleted since). Non-finite values read
        NaN; curves (panel, trackers) place each point at samples_seen. ``epoch`` and ``chunk`` are
        0-based (chunk 0 is the panel's and ``%rapidfire status``'s "chunk 1/N")."""
        import pandas as pd

        def rows(t):
            deleted = {r["run_id"] for r in t["runs"].values() if r["status"] == R.DELETED}
            return [{"run_id": p["run_id"], "split": p["split"], "step": p["step"],
                     "samples_seen": p["samples_seen"], "epoch": p["epoch"], "chunk": p["chunk"],
                     "metric": m, "value": float("nan") if v is None else v,
                     "deleted": p["run_id"] in deleted}
                    for p in t["points"] for m, v in p["metrics"].items()]

        return pd.DataFrame(self._state().read(rows),
                            columns=["run_id", "split", "step", "samples_seen", "epoch", "chunk",
                                     "metric", "value", "deleted"])

    def get_timeline(self):
        """One row per trained chunk, in the order they were logged. Columns:

        * ``run_id``; ``epoch``, ``chunk``: the chunk's place in the run's data stream, 0-based
          (chunk 0 is the panel's and ``%rapidfire status``'s "chunk 1/N");
        * ``device``: where it trained (``cuda:0``, ``cpu``; ``w0:cpu`` on a Ray worker);
        * ``start``, ``end``: Unix times in seconds (``pd.to_datetime(tl.start, unit="s")``);
        * where the chunk's time went, in seconds: ``train_s`` (optimizer steps), ``eval_s`` (the
          eval after the chunk), ``swap_s`` (making this run's adapter and state current on the
          device), ``setup_s`` (building or restoring the run's trainer before the chunk),
          ``snapshot_s`` (copying its state at the boundary), ``checkpoint_s`` (writing it to
          disk, in a writer thread: overlaps the next chunk), ``other_s`` (the rest of the
          chunk's wall time);
        * ``completed_steps``, ``samples_seen``: the run's counters after the chunk;
        * ``worker``: the Ray worker that trained it (None in the kernel engine);
        * ``moved``: True when the run came to this worker from another one with this chunk
          (False for a run's first chunk, and always in the kernel engine);
        * ``hop_s``: what Ray added to the chunk: the round trip of the request to the worker and
          the result back, beyond the chunk's own time (NaN in the kernel engine).
        """
        import pandas as pd

        from rapidfire_nb.engine.state import TIMELINE_COLUMNS

        rows = self._state().read(lambda t: [dict(row) for row in t["timeline"]])
        frame = pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS))
        # None (kernel engine, old logs) would make these object columns that cannot filter or sum
        frame["moved"] = frame["moved"].astype(bool)
        frame["hop_s"] = pd.to_numeric(frame["hop_s"], errors="coerce").astype(float)
        return frame

    def time_split(self) -> dict:
        """Seconds spent training, evaluating, swapping and on everything else (engine-measured)."""
        return self._state().read(lambda t: {k: float(v) for k, v in t["time"].items()})

    def export(self, run_id: int, path: str | Path) -> Path:
        """Save a run's weights at its last chunk boundary: a PEFT adapter directory (LoRA runs)
        that ``PeftModel.from_pretrained`` loads, or a full model; plus the tokenizer."""
        rec = self._run(run_id)
        if rec.status == R.DELETED:
            raise OpRefused(f"run {run_id} is deleted; its weights are gone")
        weights = self.engine.boundary_weights(run_id)
        if weights is None:
            if rec.exists and rec.record.chunks_done > 0:
                raise OpRefused(f"run {run_id} ({rec.status}) has trained but its checkpoint "
                                f"{self.store.checkpoint_path(run_id)} is missing; nothing to export")
            raise OpRefused(f"run {run_id} has not finished a chunk yet; nothing to export")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        model, tokenizer = self.engine.model_and_tokenizer(rec.spec)
        if rec.spec.peft_config is not None:
            from rapidfire_nb.engine.export import export_adapter

            lora = build_lora_config(rec.spec)
            lora.base_model_name_or_path = rec.spec.model_name
            export_adapter(model, lora, weights, f"run_{run_id}", path)
        else:
            import copy

            from rapidfire_nb.engine.export import ExportError

            model = copy.deepcopy(self.engine.untouched_model(rec.spec))
            try:
                result = model.load_state_dict(weights, strict=False)   # raises on a shape mismatch
            except RuntimeError as exc:
                raise ExportError(f"the weights of run {run_id} do not fit its model: {exc}") from None
            if result.unexpected_keys:
                raise ExportError(f"the weights of run {run_id} hold tensors its model lacks: "
                                  f"{result.unexpected_keys[:3]}")
            model.save_pretrained(str(path))
            del model
        tokenizer.save_pretrained(str(path))
        return path

    # -- notebook ----------------------------------------------------------------------------
    def panel(self):
        """The live control panel widget (an anywidget)."""
        from rapidfire_nb.notebook.panel import panel_for

        self._panel = panel_for(self)
        return self._panel

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            return self.panel()._repr_mimebundle_(include=include, exclude=exclude)
        except Exception as exc:  # no widget front-end: fall back to a text summary
            return {"text/plain": f"{self!r}\n(panel unavailable: {exc})"}

    def tensorboard(self):
        """Start (once) a TensorBoard on this experiment's logs and show it in the notebook."""
        from rapidfire_nb.notebook.tensorboard import show_tensorboard

        return show_tensorboard(self)

    def __repr__(self) -> str:
        runs = self.engine.snapshot() if self.engine else {}
        n = len(runs)
        counts: dict[str, int] = {}
        for r in runs.values():
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        return f"<Experiment {self.name!r}: {n} runs ({summary}) at {self.path}>"


def _refuse_ambiguous_changes(changes: dict) -> None:
    """A knob given twice (``"training_args.learning_rate"`` and ``{"training_args":
    {"learning_rate": ...}}``) has no stated winner; ``output_dir`` would be silently ignored (every
    run writes under its experiment folder)."""
    from rapidfire_nb.automl import _EDITABLE_SECTIONS

    seen: dict[str, str] = {}

    def walk(d: dict, prefix: str) -> None:
        for key, value in d.items():
            if not isinstance(key, str):
                continue   # apply_changes names it
            full = f"{prefix}.{key}" if prefix else key
            spelled = f"{{{prefix!r}: {{{key!r}: ...}}}}" if prefix else repr(key)
            if isinstance(value, dict) and full in _EDITABLE_SECTIONS:
                walk(value, full)
                continue
            if full in seen:
                raise ConfigError(f"changes set {full!r} twice ({seen[full]} and {spelled}); give "
                                  "each knob once")
            seen[full] = spelled
            if full == "training_args.output_dir":
                raise ConfigError("changes: training_args.output_dir cannot be set; every run writes "
                                  "under its experiment folder (outputs/run_N)")

    walk(changes, "")


def _chunk_key(ev: dict) -> tuple:
    return (ev["run_id"], ev["epoch"], ev["chunk"], ev["completed_steps"])


def _restore_info(run: dict, cached: dict | None) -> dict:
    """A logged run (engine/state.py's table) as the record ``_restore_run`` rebuilds it from;
    ``cached`` (its runs.json record) fills only what logs of older versions did not carry."""
    from rapidfire_nb.engine.state import config_fingerprint

    cached = cached or {}
    chunk = run["next_chunk"]
    if run["chunks_done"] == 0 and run["base_chunk"] is None:
        chunk = cached.get("chunk", 0)
    return {
        "status": run["status"], "parent_run_id": run["parent_run_id"],
        "warm_start": run["warm_start"],
        "changes": run["changes"] if run["changes"] is not None else cached.get("changes"),
        "step_offset": run["base_step"], "completed_steps": run["completed_steps"],
        "samples_seen": run["samples_seen"], "epoch": run["next_epoch"], "chunk": chunk,
        "chunks_done": run["chunks_done"], "error": run["error"],
        "fingerprint": config_fingerprint(run["config"]) if run["config"] else cached.get("fingerprint"),
    }


def _expand(config_group) -> list[RunSpec]:
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


def _norm(v):
    if isinstance(v, (list, tuple, set)):
        return sorted(str(x) for x in v)
    return v


def _get_knob(config: dict, key: str):
    """A dotted knob's value in a run's logged config (``training_args.learning_rate``)."""
    parts = key.split(".")
    obj: Any = config
    for p in parts:
        if isinstance(obj, dict):
            obj = obj.get(p)
        else:
            obj = getattr(obj, p, None)
    return obj


def _cell(v):
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return v


def _short_names(keys: list[str]) -> dict[str, str]:
    last = [k.split(".")[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}
