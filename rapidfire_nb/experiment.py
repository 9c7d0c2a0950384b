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
import numbers
import threading
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rapidfire_nb import _views, recovery
from rapidfire_nb._version import __version__
from rapidfire_nb.engine import (
    COMPLETED,
    DELETED,
    Engine,
    EventLog,
    ExperimentStore,
    FolderLock,
    Op,
    ProjectedRun,
    RunSpec,
    atomic_write_json,
    check_before_training,
    check_experiment_meta,
    check_target_modules,
    known_ids,
    project,
    read_json,
    refusal,
    trainer_class,
)
from rapidfire_nb.errors import ConfigError, OpRefused, RapidFireError

_current: weakref.ref[Experiment] | None = None
# Every engine this process started, with its experiment's name: a second experiment must not
# train on the same device unseen (the engine, not the Experiment, is what keeps training: a
# re-run cell rebinds `exp`, and the old Experiment object may be collected while it trains).
_ENGINES: weakref.WeakKeyDictionary[Engine, tuple[str, weakref.ref]] = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


def current_experiment() -> Experiment | None:
    """The most recently created, not yet ended Experiment of this process."""
    exp = _current() if _current is not None else None
    return exp if exp is not None and not exp._ended else None


def _interruptible(wait: Callable[[], Any]) -> Any:
    """``wait()`` run in a helper thread while this one waits on an Event. An interrupt (Ctrl-C,
    Kernel > Interrupt) then lands in ``Event.wait``, which it leaves intact; landing inside
    ``Thread.join`` instead, CPython 3.11 can mark the engine's thread stopped while it still runs
    (its tstate lock is released by the interrupted join), and every later wait believes the
    engine dead. The helper finishes on its own once the engine is idle."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = wait()
        except BaseException as exc:   # handed to the caller's thread
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="rapidfire-wait", daemon=True).start()
    while not finished.wait(0.2):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def training_engines() -> list[tuple[str, Engine, Experiment | None]]:
    """(name, engine, its Experiment or None if that was collected) for each engine of this
    process that still has runs pending or running (or ops queued), oldest first."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.items())
    out = []
    for engine, (name, ref) in engines:
        try:
            if not engine.closed and engine.busy():
                out.append((name, engine, ref()))
        except Exception:   # an engine half torn down trains nothing
            continue
    return out


def training_experiments() -> list[str]:
    """Names of this process's experiments that still train, oldest first."""
    return [name for name, _engine, _exp in training_engines()]


def end_training(name: str | None = None) -> list[str]:
    """End (as ``end(wait=False)``: unfinished runs stop at their next chunk boundary, resumable)
    the experiment called ``name`` that trains in this process, or every one when ``name`` is
    None; returns the names ended. An engine whose Experiment object is gone is stopped the same
    way."""
    from rapidfire_nb.engine import ENDED_REASON

    ended = []
    for n, engine, exp in training_engines():
        if name is not None and n != name:
            continue
        if exp is not None:
            exp.end(wait=False)
        else:
            engine.drain()
            engine.end_unfinished(ENDED_REASON)
            engine.close()
        ended.append(n)
    return ended


_QUEUED_WORDS = {"stopped": "stopping", "pending": "resuming", "deleted": "deleting"}


def _is_now(view) -> str:
    """"is stopped", or, when a queued op makes the difference, "is stopping (a queued op ...)":
    a second Stop before the boundary must not read as if the run had stopped already."""
    now = view.record.status if view.record is not None else None
    if now is None or now == view.status:
        return f"is {view.status}"
    going = _QUEUED_WORDS.get(view.status, f"becoming {view.status}")
    return f"is {going} (still {now} until the queued op applies at its next chunk boundary)"


def _refuse_while_another_trains(name: str) -> None:
    """run_fit's guard: one engine per device unless asked (``allow_concurrent=True``)."""
    global _current
    training = [(n, exp) for n, _engine, exp in training_engines() if n != name]
    busy = [n for n, _exp in training]
    if not busy:
        return
    # The refused Experiment (the re-run cell's) trains nothing: `%rapidfire status`, `panel` and
    # a bare `%rapidfire end` keep meaning the one that trains, not this empty one.
    newest = next((exp for _n, exp in reversed(training) if exp is not None), None)
    if newest is not None:
        _current = weakref.ref(newest)
    listed = ", ".join(repr(n) for n in busy)
    ends = " and ".join(f"%rapidfire end {n}" for n in busy)
    raise RapidFireError(
        f"experiment {listed} is still training in this kernel; a second engine would share the "
        f"device with it (or its Ray workers' GPUs). End it first with `{ends}` (or .end(wait=False) "
        "on it: runs stop at their next chunk boundary, resumable), then run this cell again; or "
        "pass run_fit(..., allow_concurrent=True) to train both at once. Until then %rapidfire "
        f"status and %rapidfire panel show {busy[-1]!r}.")


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
        from rapidfire_nb.engine import check_experiment_name

        check_experiment_name(experiment_name)
        if mode not in ("fit", "read"):
            raise ConfigError(f"mode={mode!r} is not supported: 'fit' (train, or continue with "
                              "resume=True) or 'read' (open a folder read-only for its results)")
        if offload not in ("auto", "always", "never"):
            raise ConfigError(f"offload={offload!r}: use 'auto' (park runs in host memory only when "
                              "the GPU is short of memory), 'always' or 'never'")
        from rapidfire_nb.engine import check_num_workers, refuse_links

        check_num_workers(num_workers)
        parent = Path(experiment_path) if experiment_path is not None else Path("rapidfire_experiments")
        root = parent / experiment_name
        self.engine: Engine | None = None
        self.automl = None   # pruning/refill driver of the config group (tuning.py), if any
        self._trackers = None
        self._panel = None
        self._tb = None
        self._logged_open = False   # this session's "experiment" event is in the log
        self.read_only = mode == "read"
        if self.read_only:
            self._open_read_only(experiment_name, root)
            return
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
        # a link anywhere in the folder could make a read or a write land outside it
        refuse_links(root)
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
        self._ended = False
        self._tracking = tracking
        if not resume:
            atomic_write_json(self.store.meta_path, {"name": self.name, "version": __version__})
            self._log_open()
        # a resumed folder is written only once run_fit has checked every argument against it:
        # a refused resume leaves every byte as it was (the "experiment" event included, which
        # would make an ended experiment read as open)
        _current = weakref.ref(self)

    @classmethod
    def open(cls, folder: str | Path) -> Experiment:
        """Open an experiment folder read-only, for its results, plots and reports.

        ``folder`` is the experiment's own folder (``exp.path``, e.g.
        ``rapidfire_experiments/sft-demo``). Nothing is written and no lock is taken, so this
        works on a read-only copy, on a downloaded folder and beside a live Experiment that is
        still training in it (``refresh()`` reads what it logged since). ``get_runs_info``,
        ``get_results``, ``get_timeline``, ``time_split`` and ``table()`` work as on the live
        object; training, ops and ``export`` are refused. The same as
        ``Experiment(name, path, mode="read")``. A damaged log or a folder holding a symbolic
        link is refused with the file, line and field."""
        folder = Path(folder)
        return cls(folder.name, folder.parent, mode="read")

    def _open_read_only(self, name: str, root: Path) -> None:
        from rapidfire_nb.engine import ReadOnlyLog, refuse_links

        if not (root / "experiment.json").exists() and not (root / "events.jsonl").exists():
            raise ConfigError(f"mode='read' but there is no experiment at {root}")
        refuse_links(root, writing=False)
        self.name = name
        self.path = root.resolve()
        self.resumed = False
        self.offload, self.num_workers = "never", 0
        self.store = ExperimentStore(self.path)
        self.meta = check_experiment_meta(read_json(self.store.meta_path, {}), self.store.meta_path)
        self.events = ReadOnlyLog(self.store.events_path)
        self._ended = False
        self._tracking = []

    def refresh(self) -> int:
        """Read-only: read what the folder's log gained since it was opened (another process may
        still train there); returns the number of new events."""
        if not self.read_only:
            return 0
        return self.events.reload()

    def table(self) -> dict:
        """The folded run table (engine/state.py's format, a deep copy): what the panel, the
        trackers and the frames read, for figures and reports."""
        return self._state().read()

    def _log_open(self) -> None:
        """This session's start in the log, and its trackers; once."""
        if self._logged_open:
            return
        self._logged_open = True
        self.events.append("experiment", name=self.name, path=str(self.path), resumed=bool(self.resumed))
        self._start_trackers(self._tracking)

    def _refuse_lost_history(self) -> None:
        """Resuming on an empty or missing event log while runs.json or checkpoints show that runs
        were created would silently drop every logged loss, metric and op: refused, nothing written.
        A folder where run_fit never created a run (no runs.json, no checkpoint) is fresh."""
        from rapidfire_nb.engine import EventLogError

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
        self.trackio_command = None
        if "trackio" in names:
            try:
                from rapidfire_nb.tracking.trackio_tracker import show_command

                self.trackio_command = show_command(self.path, self.name)
            except ImportError:
                pass
            if self.trackio_command:
                # decided before the tracker thread imports trackio; one line, in this cell
                print(f"rapidfire: Trackio dashboard of this experiment: {self.trackio_command}")
        if names:
            self._trackers = TrackerHub(self.events, self.path, self.name, names)
            self._trackers.start()

    # -- training ----------------------------------------------------------------------------
    def run_fit(self, config_group, create_model: Callable, train_dataset, eval_dataset=None,
                num_chunks: int | None = None, seed: int = 42, block: bool | None = None, *,
                num_shards: int | None = None, num_gpus: int = 1,
                monte_carlo_simulations: int = 1000, allow_concurrent: bool = False) -> Experiment:
        """Expand and validate ``config_group``, then train every run, chunk by chunk.

        Args:
            config_group: an ``RFGridSearch``, ``RFRandomSearch`` or ``RFOptuna`` (from
                ``rapidfire_nb.automl``): each configuration it expands to is one run.
            create_model: ``model_config -> (model, tokenizer)``; called once per distinct base
                model, in this thread (its errors show here).
            train_dataset, eval_dataset: ``datasets.Dataset``; the eval set is evaluated after every
                chunk (optional unless a pruner, RFOptuna or ``compute_metrics`` needs it).
            num_chunks: chunks per epoch (default 4). The training data is cut into
                ``num_chunks`` equal parts -- chunks, which RapidFire 0.16.2 calls shards -- and
                every run trains chunk k of the data before any run trains chunk k+1, so all runs
                can be compared after each chunk. More chunks: earlier comparisons, more swaps.
            num_shards: RapidFire AI 0.16.2's name for ``num_chunks`` (give one of the two).
            num_gpus: devices *per run*, as in RapidFire AI: ``1`` (the default) trains each run on
                one device; ``k > 1`` shards every run (without its own
                ``RFModelConfig(num_gpus=...)``) with FSDP over a gang of k Ray workers, and needs
                ``fsdp``/``fsdp_config`` in its training args and ``Experiment(num_workers>=k)``;
                anything else is refused here, before anything trains.
            monte_carlo_simulations: accepted for RapidFire AI 0.16.2 code and has no effect here
                (RapidFire's scheduler uses it to estimate run times; ours interleaves chunks in
                lockstep and needs no estimate).
            seed: the seed of every run's data order (per epoch) and of its initialisation (a
                LoRA adapter's weights, derived from the seed and the run's config): the same
                seed, data and configs train the same weights.
            block: ``None`` (default): in a Jupyter/Colab kernel return at once while training goes
                on in a background thread (the returned Experiment displays as the live panel; ops
                such as ``stop`` work meanwhile); in a plain script or terminal IPython block until
                every run is finished. ``False``: return at once everywhere (call ``wait()`` or
                ``end()`` later); ``True``: block everywhere. An integer here is RapidFire
                0.16.2's seventh positional argument, ``num_gpus``, and is taken as that.
            allow_concurrent: ``False`` (default): refuse while another experiment of this
                process (kernel) still has runs pending or running, naming it and how to end it
                (``%rapidfire end NAME``, or ``.end(wait=False)`` on it): two engines would share
                the device (or the GPUs of Ray workers), each slowing the other, and a re-run cell
                would leave the first one training unseen. ``True``: train both at once anyway.

        With Ray workers (``num_workers``) the first ``run_fit`` also starts Ray and the workers
        (it prints a line saying so): 10-30 s the first time; it returns once every worker has
        loaded the base model(s) and the functions and data the runs need.

        Every error that can be found before training (configs, data columns, ``num_chunks``,
        ``create_model``'s return value) is raised here and nothing is started.
        """
        from rapidfire_nb._quiet import import_peft_quietly

        import_peft_quietly()   # before trl/peft: no bitsandbytes "pip install kernels" line
        self._check_open()
        self._check_writable("run_fit")
        if self.engine is not None:
            raise RapidFireError("run_fit was already called on this Experiment; use clone_modify "
                                 "to add runs, or create a new Experiment")
        if not isinstance(allow_concurrent, bool):
            raise ConfigError(f"allow_concurrent must be True or False, got {allow_concurrent!r}")
        if not allow_concurrent:
            _refuse_while_another_trains(self.name)
        global _current
        # the experiment that trains is the one the magics and `%rapidfire panel` mean
        _current = weakref.ref(self)
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
        num_chunks = _chunks_from(num_chunks, num_shards)
        num_gpus, monte_carlo_simulations = _check_rapidfire_only_knobs(num_gpus, monte_carlo_simulations)
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
        from rapidfire_nb.engine import warn_engine_owned_knobs

        for spec in specs:     # in the caller's cell: the engine thread's warnings go to run logs
            warn_engine_owned_knobs(spec)
        if eval_dataset is None and any(s.compute_metrics is not None for s in specs):
            raise ConfigError("compute_metrics needs an eval_dataset: pass eval_dataset= to run_fit")
        from rapidfire_nb.engine import check_run_data

        prep_cache: dict = {}   # formatting_func's mapped data, shared by the runs' trainers
        for spec in specs:
            check_run_data(spec, trainer_class(spec.trainer_type), train_dataset, eval_dataset,
                           prep_cache)

        from rapidfire_nb.engine import resolve_num_workers

        workers = resolve_num_workers(self.num_workers)
        from rapidfire_nb.engine.sharding import apply_num_gpus, check_sharding

        apply_num_gpus(specs, num_gpus)   # a config's own RFModelConfig(num_gpus=...) wins
        check_sharding(specs, workers=workers)
        if workers:   # Ray is imported only on this path
            from rapidfire_nb.engine import WorkerEngine

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
            recovery.check_resume(self, specs, data_fp, num_chunks, seed, config_group)
        # -- AutoML at chunk boundaries: pruners, RFOptuna --------------------------
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
        if self.resumed:
            if automl is not None:
                automl.load()      # reads automl.json only; a damaged one refuses here
            restore = recovery.plan_restore(self, specs, engine, automl)   # refuses before any write
            self._log_open()
        self.engine = engine
        with _ENGINES_LOCK:
            _ENGINES[engine] = (self.name, weakref.ref(self))
        self.automl = automl
        if self.resumed:
            recovery.restore_runs(self, specs, restore)
        else:
            for spec in specs:
                engine.add_run(spec)
            meta = {"name": self.name, "version": __version__, "num_chunks": num_chunks, "seed": seed,
                    "data": data_fp, "runs": [s.fingerprint() for s in specs],
                    "pruning": pruning_settings(config_group)}
            atomic_write_json(self.store.meta_path, meta)
            self.meta = meta
        if automl is not None:
            automl.attach(engine, self.resumed)
        engine.start()
        if block is None:
            block = not _in_kernel()
        if block:
            self.wait()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is pending or running; True if so, False on timeout.

        Panel buttons are handled by the kernel only between cell executions, so while a cell is
        blocked here clicks wait until it returns; in a notebook, prefer to let ``run_fit`` return
        and call ``wait`` only at the end.

        Interrupting it (Kernel > Interrupt, Ctrl-C) stops the waiting, not the training: one line
        says that the runs go on in the background and how to stop them; in a kernel ``wait``
        then returns False (no traceback), elsewhere the KeyboardInterrupt goes on up.
        """
        if self.engine is None:
            return True
        self._refuse_from_engine_threads("wait")
        try:
            done = _interruptible(lambda: self.engine.wait(timeout))
        except KeyboardInterrupt:
            print(self._interrupted_line(), flush=True)
            if _in_kernel():
                return False
            raise
        if done and self._trackers is not None:
            self._trackers.flush(timeout=30)
        return done

    def _interrupted_line(self) -> str:
        return (f"rapidfire: interrupted the wait only; the runs of {self.name!r} go on training in "
                "the background (the panel and %rapidfire status show them). Stop them at the next "
                f"chunk boundary with %rapidfire end {self.name} or exp.end(wait=False); "
                "exp.stop(run_id) stops one.")

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
        if self.read_only:
            self._ended = True
            return
        if self.engine is not None:
            self._refuse_from_engine_threads("end")
            if wait:
                from rapidfire_nb.engine import wait_with_progress

                try:
                    wait_with_progress(self.engine)
                except KeyboardInterrupt:
                    # nothing ended yet: the experiment stays open and trains, as after wait()
                    print(self._interrupted_line(), flush=True)
                    if _in_kernel():
                        return
                    raise
            from rapidfire_nb.engine import ENDED_REASON

            self.engine.drain()
            self.engine.end_unfinished(ENDED_REASON)
            self._write_final_checkpoints()
            self.engine.close()
        if self._logged_open:
            # a resumed folder that never got past run_fit's checks was not written to
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

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise OpRefused(f"{what}: experiment {self.name!r} was opened read-only "
                            "(Experiment.open / mode='read'); open it with resume=True to train")

    # -- interactive control ops --------------------------------------------------------------
    def _run(self, run_id) -> ProjectedRun:
        """The run as the ops already queued will leave it (a queued clone's id works at once)."""
        self._check_open()
        self._check_writable("ops")
        if self.engine is None:
            if self.resumed:
                # The panel of a reopened folder lists its runs before anything trains them.
                raise OpRefused(f"experiment {self.name!r} was reopened and nothing trains its runs yet: "
                                "call exp.run_fit(...) with the same arguments to continue them, then retry")
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
            refused = refusal("stop", rec.status, run_id, is_now=_is_now(rec))
            if refused:
                raise OpRefused(refused)
            self.engine.submit(Op("stop", run_id))

    def note(self, run_id: int, text: str) -> None:
        """Attach a note to a run (at most 2000 characters; ``""`` clears it). It stays in the event log: ``get_runs_info()``'s ``note``, the panel and the report show it."""
        from rapidfire_nb.results import note_run

        note_run(self.events, self._state().read(lambda t: {r["run_id"] for r in t["runs"].values()}), run_id, text, writable=not (self.read_only or self._ended))

    def resume(self, run_id: int) -> None:
        """Resume a stopped run from its checkpoint.

        Queued like ``stop``: applied at the next chunk boundary (see ``stop``)."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            rec = self._run(run_id)
            refused = refusal("resume", rec.status, run_id, is_now=_is_now(rec))
            if refused:
                raise OpRefused(refused)
            self.engine.submit(Op("resume", run_id))

    def delete(self, run_id: int) -> None:
        """Remove a run from scheduling for good and free its memory and checkpoints (metrics stay).

        Queued like ``stop``: applied at the next chunk boundary, so the run is listed with its
        old status until then (a second ``delete`` of it is refused at once)."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            rec = self._run(run_id)
            refused = refusal("delete", rec.status, run_id)
            if refused:
                raise OpRefused(refused)
            self.engine.submit(Op("delete", run_id))

    def validate_clone(self, run_id: int, changes: dict | None = None, warm_start: bool = False) -> RunSpec:
        """Check a clone_modify without creating anything; returns the new run's spec."""
        from rapidfire_nb import automl

        view = self._run(run_id)
        refused = refusal("clone", view.status, run_id)
        if refused:
            raise OpRefused(refused)
        if not isinstance(warm_start, bool):
            raise OpRefused(f"warm_start must be True or False, got {warm_start!r}")
        if warm_start and not view.exists:
            raise OpRefused(f"run {run_id} is a queued clone that has not been created yet; a warm "
                            "start needs its weights: clone it once it has trained a chunk")
        rec = view.record if view.exists else view
        if warm_start and self.engine.weights_missing(rec):
            from rapidfire_nb.engine import weights_lost_reason

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
        new_id = self.engine.reserve_run_id()
        flat = automl.flatten_changes(changes or {})
        self.engine.submit(Op("clone", run_id, spec=spec, warm_start=warm_start, changes=flat,
                              new_run_id=new_id))
        return new_id

    # -- AutoML (rapidfire_nb/tuning.py) --------------------------------------------------------
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
            from rapidfire_nb.engine import LiveTable

            live = self._live_table = LiveTable(self.events)
        return live

    def get_runs_info(self):
        """One row per run (a pandas DataFrame), in run order. Columns:

        * ``run_id``; ``name``: its short name, the id and its knobs (``3 · lr 1e-3 · r 32``), as
          the panel, the report and the trackers call it; ``status``: pending, running, stopped,
          completed, failed or deleted;
        * one column per knob that varies between runs, by its short name (``learning_rate``, ``r``);
        * ``completed_steps`` / ``total_steps``: optimizer steps, as positions in the run's data
          stream (a warm clone's start at its parent's step at the branch point; the panel and
          ``%rapidfire status`` show the clone's own steps); ``samples_seen``: training samples
          read so far; ``chunks_done``: chunks this run trained; ``epoch``: 0-based epoch of the
          run's next chunk in its data stream (= epochs finished; the panel and ``%rapidfire
          status`` count epochs and chunks from 1);
        * ``parent_run_id`` (``<NA>`` unless a clone) and ``warm_start``: a clone's lineage;
        * ``eval_loss``: the latest eval loss (NaN or None before the first eval;
          ``get_results()`` has every eval metric at every chunk);
        * ``error``: a failed run's traceback (``%rapidfire status`` shows its last line), else
          None; ``note``: the user's note on the run (``exp.note``), else None;
        * ``worker`` (only with Ray workers, ``num_workers``): the worker that trained the run's
          last chunk (``w0+w1``: the gang of a sharded run), None before its first;
        * ``devices`` (only when a run is sharded with FSDP, ``num_gpus=k``): the devices each
          run trains on (1 for the others);
        * ``pruning`` (only when the config group has a pruner or is RFOptuna): why the run was
          pruned, or its open suggestion in ``pruner_mode="suggest"``; None otherwise.
        """
        import pandas as pd

        from rapidfire_nb import results

        if self.engine is None and not self.read_only:
            return pd.DataFrame(columns=["run_id", "status"])
        if self.automl is not None:
            pruning_of = self.automl.reason_for
        elif self.read_only and ((self.meta.get("pruning") or {}).get("pruner") is not None
                                 or "budget" in (self.meta.get("pruning") or {})):
            # no driver when read-only: the notes as the log tells them
            pruning_of = lambda rid: self._state().read(lambda t: results.logged_pruning_note(t, rid))  # noqa: E731
        else:
            pruning_of = None
        table = self._state().read()
        return results.runs_frame(table, pruning_of)

    def get_results(self):
        """Every logged metric, long form: run_id, split, step, samples_seen, epoch, chunk, metric,
        value, and deleted (True for the metrics of a run deleted since). Non-finite values read
        NaN; curves (panel, trackers) place each point at samples_seen. ``epoch`` and ``chunk`` are
        0-based (chunk 0 is the panel's and ``%rapidfire status``'s "chunk 1/N")."""
        from rapidfire_nb.results import results_frame

        return self._state().read(results_frame)

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
          the result back, beyond the chunk's own time (NaN in the kernel engine);
        * ``tokens``, ``tokens_per_s``: non-padding tokens the chunk trained on, and per second of
          ``train_s``; ``peak_mem_mb``: the chunk's peak memory in MB (CUDA max allocated on a
          GPU, the process's resident set size on a CPU); NaN in logs from older versions.
        """
        from rapidfire_nb.results import timeline_frame

        return self._state().read(timeline_frame)

    def time_split(self) -> dict:
        """Seconds spent training, evaluating, swapping and on everything else (engine-measured)."""
        from rapidfire_nb.results import time_split

        return self._state().read(time_split)

    def export(self, run_id: int, path: str | Path, *, overwrite: bool = False) -> Path:
        """Save a run's weights at its last chunk boundary: a PEFT adapter directory (LoRA runs)
        that ``PeftModel.from_pretrained`` loads, or a full model; plus the tokenizer.

        ``path`` is a directory that does not exist yet or is empty, outside the experiment
        folder or a directory of its own inside it (``exp.path / "best-adapter"``); an existing
        file, a directory holding files (another export, say), the experiment folder itself and
        what the experiment writes there are refused with ``ExportError`` and left alone.
        ``overwrite=True`` writes over an earlier export (files of the same names are replaced),
        never over a directory without one."""
        from rapidfire_nb.engine import check_export_path

        if self.read_only:
            raise OpRefused("export needs the run's base model (create_model): open the folder with "
                            "resume=True and call run_fit, then export")
        return self._export_to(run_id, check_export_path(path, self.path, overwrite))

    def _export_to(self, run_id: int, path: Path) -> Path:
        """``export`` into a checked ``path``; ``end()`` calls it directly for the final
        checkpoints, which RapidFire's layout puts inside the experiment folder."""
        rec = self._run(run_id)
        if rec.status == DELETED:
            raise OpRefused(f"run {run_id} is deleted; its weights are gone")
        weights = self.engine.boundary_weights(run_id)
        if weights is None:
            if rec.exists and rec.record.chunks_done > 0:
                raise OpRefused(f"run {run_id} ({rec.status}) has trained but its checkpoint "
                                f"{self.store.checkpoint_path(run_id)} is missing; nothing to export")
            raise OpRefused(f"run {run_id} has not finished a chunk yet; nothing to export")
        path.mkdir(parents=True, exist_ok=True)
        model, tokenizer = self.engine.model_and_tokenizer(rec.spec)
        if rec.spec.peft_config is not None:
            from rapidfire_nb.engine import export_adapter

            lora = build_lora_config(rec.spec)
            lora.base_model_name_or_path = rec.spec.model_name
            with warnings.catch_warnings():
                # transformers 5 deprecates a name PEFT still calls while it saves; the user can do
                # nothing about it, and it was the one line an export printed
                warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                        category=FutureWarning)
                export_adapter(model, lora, weights, f"run_{run_id}", path)
        else:
            import copy

            from rapidfire_nb.engine import ExportError

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

    def final_checkpoint_path(self, run_id: int) -> Path:
        """``<experiment>/runs/<id>/checkpoints/final_checkpoint/``, where RapidFire AI keeps a
        run's final weights; ``end()`` fills it for every completed run (see there)."""
        return self.path / "runs" / str(int(run_id)) / "checkpoints" / "final_checkpoint"

    def _write_final_checkpoints(self) -> None:
        """RapidFire's layout, for notebooks that read it: each completed run's
        ``trainer_state.json`` (its logged metrics as transformers' ``log_history``) and, for a
        LoRA run, its adapter. A full fine-tuned model is not copied there (it can be many GB):
        ``export(run_id, path)`` saves it."""
        try:
            results = self.get_results()
            info = self.get_runs_info()
        except Exception as exc:  # noqa: BLE001 - never lose end() to this convenience copy
            warnings.warn(f"final checkpoints not written: {exc}", stacklevel=3)
            return
        for _, row in info.iterrows():
            rid = int(row["run_id"])
            if row["status"] != COMPLETED:
                continue
            path = self.final_checkpoint_path(rid)
            try:
                rec = self._run(rid)
                if rec.spec.peft_config is not None:
                    self._export_to(rid, path)
                mine = results[results.run_id == rid]
                history = [{"step": int(step), **{m: float(v) for m, v in zip(g.metric, g.value)}}
                           for step, g in mine.groupby("step", sort=True)]
                path.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path / "trainer_state.json", {
                    "global_step": int(row["completed_steps"]), "max_steps": int(row["total_steps"]),
                    "epoch": float(row["epoch"]) if row.get("epoch") is not None else None,
                    "log_history": history})
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"final checkpoint of run {rid} not written to {path}: {exc}", stacklevel=3)

    # -- results that need no kernel --------------------------------------------------------
    def plot(self, metric: str = "loss", split: str | None = None, runs=None, **options):
        """A plotly Figure of ``metric``, one curve per run, in the panel's colours and names
        (``report.figures.plot_figure`` lists the options: ``smoothing``, ``log_y``, ``x``,
        ``kind``); ``split="eval"`` plots eval metrics (``"loss"`` there means ``eval_loss``), and
        the default ``None`` takes the train metric of that name, else the eval one (so
        ``plot("eval_loss")`` works); ``runs`` limits it to some run ids. It renders wherever plotly does (a saved notebook,
        Colab, VS Code) and ``fig.write_html(...)`` / ``fig.show()`` work in scripts."""
        from rapidfire_nb.report import plot_figure, snapshot

        return plot_figure(self._state().read(snapshot), metric, split, runs, **options)

    def report(self, path: str | Path) -> Path:
        """Write one self-contained HTML file (plotly.js inside, nothing loaded from the network):
        the curves of every metric, the leaderboard, the engine time split and the chunk
        timeline. An existing file at ``path`` is replaced (re-running the cell refreshes it);
        ``rapidfire report <experiment folder>`` writes the same from a folder."""
        from rapidfire_nb.report import snapshot, write_report

        return write_report(self._state().read(snapshot), path, source=str(self.path))

    # -- notebook ----------------------------------------------------------------------------
    def panel(self):
        """The live control panel widget (an anywidget)."""
        self._panel = _views.show("panel", self)
        return self._panel

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            return self.panel()._repr_mimebundle_(include=include, exclude=exclude)
        except Exception as exc:  # no widget front-end: fall back to a text summary
            return {"text/plain": f"{self!r}\n(panel unavailable: {exc})"}

    @property
    def experiment_name(self) -> str:
        """The experiment's name (RapidFire AI's attribute; ``name`` is the same)."""
        return self.name

    def get_log_file_path(self, log_type: str | None = None) -> Path:
        """A log file to read, as RapidFire AI's notebooks read theirs (the last lines of it).

        ``None``, ``"main"`` or ``"experiment"``: ``<experiment>/events.jsonl``, the experiment's
        event log (one JSON object a line: runs created, chunks trained, metrics, ops, errors).
        ``"training"``: ``<experiment>/logs/engine.log``, what the training thread printed
        (transformers and TRL output, warnings, tracebacks of failed runs). Anything else is a
        ``ConfigError``.
        """
        kind = "main" if log_type is None else str(log_type).lower()
        if kind in ("main", "experiment"):
            return self.store.events_path
        if kind != "training":
            raise ConfigError(f"get_log_file_path: log_type must be None, 'main', 'experiment' or "
                              f"'training', got {log_type!r}")
        return self.store.root / "logs" / "engine.log"

    def tensorboard(self):
        """Start (once) a TensorBoard on this experiment's logs and show it in the notebook."""
        return _views.show("tensorboard", self)

    def __repr__(self) -> str:
        if self.engine is not None:
            statuses = [r.status for r in self.engine.snapshot().values()]
        elif self.read_only:   # no engine when read-only: the runs as the event log tells them
            from rapidfire_nb.engine import runs_by_id

            statuses = self._state().read(lambda t: [r["status"] for r in runs_by_id(t)])
        else:
            statuses = []
        n = len(statuses)
        counts: dict[str, int] = {}
        for status in statuses:
            counts[status] = counts.get(status, 0) + 1
        summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
        return f"<Experiment {self.name!r}: {n} runs ({summary}) at {self.path}>"


def _chunks_from(num_chunks, num_shards) -> int:
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


def _check_rapidfire_only_knobs(num_gpus, monte_carlo_simulations) -> tuple[int, int]:
    for name, value in (("num_gpus", num_gpus), ("monte_carlo_simulations", monte_carlo_simulations)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    num_gpus, monte_carlo_simulations = int(num_gpus), int(monte_carlo_simulations)
    return num_gpus, monte_carlo_simulations


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
