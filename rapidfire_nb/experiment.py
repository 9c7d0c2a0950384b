"""Experiment: the user's facade over the engine.

    exp = Experiment("sft-demo")
    exp.run_fit(config_group, create_model, train_dataset, eval_dataset, num_chunks=4)
    exp            # in a notebook: the live control panel
    exp.get_results()

Everything the user calls is validated in the caller's thread; accepted interactive ops are
queued for the engine thread, which applies them at the next chunk boundary. What run_fit does
lives in ``launch/`` (plain values in, an engine out), the AutoML driver in ``tuning/``, the
kernel's experiments in ``session.py``; this class holds the folder and delegates.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from rapidfire_nb import _views, results, session
from rapidfire_nb._environment import cell_number, in_kernel
from rapidfire_nb.engine import Engine, Op, ProjectedRun, RunSpec, check_status_op, checked_run, interruptible
from rapidfire_nb.errors import ConfigError, OpRefused, RapidFireConfigWarning, RapidFireError
from rapidfire_nb.experiment_view import ExperimentView
from rapidfire_nb.folder import give_back, open_read_only
from rapidfire_nb.launch import FitCall, commit, prepare
from rapidfire_nb.launch.arguments import check_clone, check_concurrency_flag
from rapidfire_nb.layout import FinalCheckpoints, export_weights, final_checkpoint_path, log_file_path
from rapidfire_nb.session import current_experiment  # noqa: F401  (public here: the API docs show it with Experiment)


def _parent(experiment_path: str | Path | None) -> Path:
    return Path(experiment_path) if experiment_path is not None else Path("rapidfire_experiments")


_MODES = ("fit", "read", "evals")


def _looks_like_path(value) -> bool:
    return isinstance(value, os.PathLike) or (isinstance(value, str) and ("/" in value or os.sep in value))


def _positional(args: tuple, mode, experiment_path, num_cpus, num_gpus):
    """RapidFire AI 0.16.2's positional order, ``(experiment_name, mode, experiment_path,
    num_cpus, num_gpus)``, onto the keywords. Code written for this package may pass
    ``(experiment_name, experiment_path)``: a second positional that is a path (a ``Path``, or a
    string with a separator) is read as ``experiment_path``, a mode name as ``mode``, anything
    else refused, so a bare folder name can never become a mode nor a mode a folder."""
    if len(args) > 4:
        raise TypeError(f"Experiment() takes at most 5 positional arguments (experiment_name, mode, "
                        f"experiment_path, num_cpus, num_gpus), {len(args) + 1} were given")
    args = list(args)
    if args and _looks_like_path(args[0]) and len(args) == 1:
        if experiment_path is not None:
            raise TypeError("Experiment(): experiment_path given twice (the second positional "
                            f"argument {args[0]!r} and experiment_path=)")
        return mode or "fit", args[0], num_cpus, num_gpus
    names = ("mode", "experiment_path", "num_cpus", "num_gpus")
    given = {name: value for name, value in zip(names, args) if value is not None}   # None: the default
    if "mode" in given and given["mode"] not in _MODES:
        raise ConfigError(
            f"Experiment(name, {given['mode']!r}): the second positional argument is the mode, as in "
            "RapidFire AI 0.16.2 ('fit', or 'read' to open a folder read-only); for a parent folder "
            f"write experiment_path={given['mode']!r}")
    keywords = {"mode": mode, "experiment_path": experiment_path, "num_cpus": num_cpus,
                "num_gpus": num_gpus}
    for name, value in given.items():
        if keywords[name] is not None:
            raise TypeError(f"Experiment(): {name} given twice (positionally and as {name}=)")
        keywords[name] = value
    return (keywords["mode"] or "fit", keywords["experiment_path"], keywords["num_cpus"],
            keywords["num_gpus"])


def _check_num_cpus(num_cpus):
    if num_cpus is not None and (isinstance(num_cpus, bool) or not isinstance(num_cpus, int)
                                 or num_cpus <= 0):
        raise ConfigError(f"num_cpus={num_cpus!r}: give a positive integer, or leave it out")
    return num_cpus


def _workers_for_gpus(num_gpus, num_workers):
    """RapidFire AI 0.16.2's ``Experiment(num_gpus=k)`` (the devices the experiment may use) as
    our ``num_workers``: at most one device trains in this kernel; more are Ray workers, one per
    GPU, capped at the GPUs there are."""
    if num_gpus is None:
        return num_workers
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
        raise ConfigError(f"num_gpus={num_gpus!r}: give the number of GPUs the experiment may use "
                          "(0 or more), or leave it out")
    if num_workers != "auto":
        raise ConfigError(f"Experiment(num_gpus={num_gpus}, num_workers={num_workers!r}): give one of "
                          "them (num_gpus is RapidFire AI's name for the devices to use; num_workers "
                          "the number of Ray workers)")
    if num_gpus <= 1:
        return 0
    import importlib.util

    try:
        import torch

        visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        visible = 0
    if visible < 2 or importlib.util.find_spec("ray") is None:
        why = (f"{visible} GPU(s) are visible" if visible < 2
               else "Ray is not installed (pip install 'ray>=2.60')")
        warnings.warn(f"Experiment(num_gpus={num_gpus}): {why}, so training runs in this kernel, "
                      "on one device", RapidFireConfigWarning, stacklevel=4)
        return 0
    if num_gpus > visible:
        warnings.warn(f"Experiment(num_gpus={num_gpus}): only {visible} GPUs are visible; training "
                      f"uses {visible} (one Ray worker each)", RapidFireConfigWarning, stacklevel=4)
    return min(num_gpus, visible)


class Experiment:
    """A named experiment: a folder, an event log, and the runs trained in it.

    Args:
        experiment_name: folder name under ``experiment_path``. Creating an ``Experiment`` whose
            folder already holds one starts a new folder ``<name>_2``, ``_3``, ... (one printed
            line; ``exp.path`` says where); ``resume=True`` continues the old one instead. Opening
            a folder that a live Experiment holds is refused.
        mode: ``"fit"`` (default: train), or ``"read"`` (open a folder read-only, as
            ``Experiment.open``). The second positional argument is ``mode``, as in RapidFire AI
            0.16.2 (``Experiment("name", "fit")``); a path given there (a ``Path``, or a string
            with a ``/``) is still taken as ``experiment_path``, and anything else is refused.
            ``mode="fit"`` written out, as RapidFire code writes it, also keeps RapidFire's
            blocking ``run_fit`` for a notebook run top to bottom: a cell queued behind the
            ``run_fit`` cell (Run All) starts once the runs are done (one printed line says so;
            Kernel > Interrupt starts it at once), while a cell run by hand reads the runs as
            they train.
        experiment_path: parent folder (default ``./rapidfire_experiments``); the third
            positional argument.
        num_cpus: accepted for RapidFire AI 0.16.2 code (a positive integer); training here uses
            the threads torch is given.
        num_gpus: RapidFire AI 0.16.2's devices the experiment may use, mapped onto
            ``num_workers``: ``0`` or ``1``, train in this kernel (on its GPU if it has one);
            ``k >= 2``, one Ray worker per GPU for up to ``k`` of the visible GPUs (in this
            kernel, with a warning, when fewer than two GPUs are visible or Ray is missing).
            Give ``num_gpus`` or ``num_workers``, not both.
        resume: continue an existing experiment folder after a dead kernel; call ``run_fit`` with
            the same arguments again (datasets and callables cannot be stored).
        tracking: trackers to feed (``["tensorboard", "mlflow", "trackio"]``); default from the
            ``RF_*_ENABLED`` environment switches (TensorBoard on).
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

    def __new__(cls, experiment_name: str = "", *args, mode: str | None = None,
                experiment_path: str | Path | None = None, resume: bool = False, **_kwargs):
        mode, experiment_path, _, _ = _positional(args, mode, experiment_path, None, None)
        # a re-run cell while its experiment still trains gets that one (session.still_training)
        if mode == "fit" and not resume and isinstance(experiment_name, str) and experiment_name:
            training = session.still_training(_parent(experiment_path), experiment_name)
            if training is not None:
                # the same cell's run_fit comes next; a later cell's run_fit is a call of its own,
                # and a script has no cells to re-run
                if cell_number() is not None:
                    training._rerun_cell = ("cell", cell_number())
                return training
        return super().__new__(cls)

    def __init__(self, experiment_name: str, *args, mode: str | None = None,
                 experiment_path: str | Path | None = None, num_cpus: int | None = None,
                 num_gpus: int | None = None, resume: bool = False,
                 tracking: list[str] | None = None, offload: str = "auto",
                 num_workers: int | str = "auto"):
        if self.__dict__.get("asked_as") is not None:
            return   # __new__ handed back the experiment that trains: nothing to open
        from rapidfire_nb.engine import check_experiment_name

        mode_given = mode if mode is not None else (args[0] if args and args[0] in _MODES else None)
        mode, experiment_path, num_cpus, num_gpus = _positional(args, mode, experiment_path,
                                                                 num_cpus, num_gpus)
        check_experiment_name(experiment_name)
        if mode not in ("fit", "read"):
            raise ConfigError(f"mode={mode!r} is not supported: 'fit' (train, or continue with "
                              "resume=True) or 'read' (open a folder read-only for its results)"
                              + ("; RapidFire's evals/RAG mode has no equivalent here"
                                 if mode == "evals" else ""))
        self.num_cpus = _check_num_cpus(num_cpus)
        # RapidFire code must write mode="fit" (its default is "evals"); its notebooks' cells after
        # run_fit expect the runs done (session.follow_fit)
        self._rapidfire_cells = mode_given == "fit"
        num_workers = _workers_for_gpus(num_gpus, num_workers)
        if offload not in ("auto", "always", "never"):
            raise ConfigError(f"offload={offload!r}: use 'auto' (park runs in host memory only when "
                              "the GPU is short of memory), 'always' or 'never'")
        from rapidfire_nb.engine import check_num_workers

        check_num_workers(num_workers)
        parent = _parent(experiment_path)
        root = parent / experiment_name
        self.engine: Engine | None = None
        self.automl = None   # pruning/refill driver of the config group (rapidfire_nb.tuning), if any
        self._trackers = None
        self._panel = None
        self._logged_open = False   # this session's "experiment" event is in the log
        self._live_table = None
        self._final = None   # RapidFire's final checkpoints, written as runs complete
        self._folder = None   # the claimed folder (rapidfire_nb.folder.Claim), None when read-only
        self.read_only = mode == "read"
        if self.read_only:
            self._open_read_only(experiment_name, root)
            return
        self.asked_as = (str(parent.resolve()), experiment_name)
        self.resumed = resume
        self.offload = offload
        self.num_workers = num_workers
        self._tracking = tracking
        self._ended = False
        self._claim(parent, experiment_name)
        session.make_current(self)

    def _claim(self, parent: Path, name: str) -> None:
        c = self._folder = session.claim(parent, name, self.resumed)
        self.name, self.path, self.store, self.events, self.meta = c.name, c.path, c.store, c.events, c.meta
        self._folder_lock = c.lock
        # a re-claim after a refused run_fit: what read the log given back reads this one
        self._live_table = None
        self._panel = None
        session.opened(self)

    def _unclaim(self) -> None:
        """A new experiment's first run_fit was refused before it logged anything: the folder, its
        lock and its name go back as they were, and the next run_fit claims afresh."""
        if self.resumed or self._logged_open or self._folder is None:
            return
        session.tensorboard_unlink(self._folder.path)
        give_back(self._folder)
        session.closed(self)
        self._folder = None
        self._live_table = None   # it read the log just closed
        self.name = self.asked_as[1]
        self.path = Path(self.asked_as[0]) / self.name

    @classmethod
    def open(cls, folder: str | Path, experiment_path: str | Path | None = None) -> Experiment:
        """Open an experiment folder read-only, for its results, plots and reports.

        ``folder`` is the experiment's own folder (``exp.path``, e.g.
        ``rapidfire_experiments/sft-demo``), or its name as ``Experiment(name, experiment_path,
        resume=True)`` takes it: a bare name that is not a folder here is looked up under
        ``experiment_path`` (default ``./rapidfire_experiments``). Nothing is written and no lock
        is taken, so this works on a read-only copy, on a downloaded folder and beside a live
        Experiment that is still training in it (``refresh()`` reads what it logged since).
        ``get_runs_info``, ``get_results``, ``get_timeline``, ``time_split`` and ``table()`` work as on the live
        object; training, ops and ``export`` are refused. The same as
        ``Experiment(name, path, mode="read")``. A damaged log or a folder holding a symbolic
        link is refused with the file, line and field."""
        folder = Path(folder)
        # a bare name (or any name given with experiment_path) means what the constructor means
        # by it, the folder under experiment_path; an experiment's own folder is taken as written
        if experiment_path is not None or (len(folder.parts) == 1 and not (folder / "events.jsonl").is_file()):
            folder = _parent(experiment_path) / folder
        return cls(folder.name, experiment_path=folder.parent, mode="read")

    def _open_read_only(self, name: str, root: Path) -> None:
        self.name, self.resumed, self.offload, self.num_workers = name, False, "never", 0
        self.path, self.store, self.meta, self.events = open_read_only(root)
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
        try:
            from rapidfire_nb.tracking import start_trackers
        except ImportError:
            return
        self._trackers, self.trackio_command = start_trackers(self.events, self.path, self.name,
                                                              self._tracking)

    # -- training ----------------------------------------------------------------------------
    def run_fit(self, config_group, create_model: Callable, train_dataset, eval_dataset=None,
                num_chunks: int | None = None, seed: int = 42, block: bool | None = None, *,
                num_shards: int | None = None, num_gpus: int = 1,
                monte_carlo_simulations: int = 1000, allow_concurrent: bool = False,
                sample_prompts: list | None = None) -> Experiment:
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
                0.16.2's seventh positional argument, ``num_gpus``, and is taken as that. With
                ``None``, an experiment created with ``mode="fit"`` makes the cells queued behind
                this one in a notebook wait for the runs (see the constructor's ``mode``).
            allow_concurrent: ``False`` (default): refuse while another experiment of this
                process (kernel) still has runs pending or running, naming it and how to end it
                (``%rapidfire end NAME``, or ``.end(wait=False)`` on it): two engines would share
                the device (or the GPUs of Ray workers), each slowing the other, and a re-run cell
                would leave the first one training unseen. ``True``: train both at once anyway.
            sample_prompts: up to 8 prompts (strings or chat message lists) every run answers
                after every chunk, shown side by side in the panel's "generations" view and the
                report; greedy unless the run's ``generation_config`` samples, at most its
                ``max_new_tokens`` (32 by default, at most 256) each, and never touching training. ``None`` (the
                default): runs with a ``generation_config`` answer the first 4 eval prompts;
                ``[]``: no sample generations.

        With Ray workers (``num_workers``) the first ``run_fit`` also starts Ray and the workers
        (it prints a line saying so): 10-30 s the first time; it returns once every worker has
        loaded the base model(s) and the functions and data the runs need.

        Every error that can be found before training (configs, data columns, ``num_chunks``,
        ``create_model``'s return value) is raised here and nothing is started.
        """
        if self.__dict__.pop("_rerun_cell", None) == ("cell", cell_number()) \
                and self.engine is not None and not self._ended:
            # the cell that started this experiment, run again while it trains: Experiment(...)
            # handed back this one, and its run_fit leaves it as it is so the cell shows its panel
            print(f"rapidfire: run_fit left experiment {self.name!r} training as it was (this "
                  "call's arguments are not used)")
            return self
        self._may_fit(allow_concurrent)
        try:
            call = FitCall(config_group, create_model, train_dataset, eval_dataset, num_chunks, seed,
                           block, num_shards, num_gpus, monte_carlo_simulations, sample_prompts)
            fit = prepare(call, store=self.store, events=self.events, table=self._state(),
                          name=self.name, stored_meta=self.meta if self.resumed else None,
                          num_workers=self.num_workers, offload=self.offload)
        except BaseException:
            self._unclaim()
            raise
        self._start(fit)
        if fit.args.block if fit.args.block is not None else not in_kernel():
            self.wait()
        elif self.__dict__.get("_rapidfire_cells") and fit.args.block is None:
            session.follow_fit(self)
        return self

    def _may_fit(self, allow_concurrent) -> None:
        """run_fit's refusals that need this Experiment or the kernel's others."""
        from rapidfire_nb._quiet import import_peft_quietly

        import_peft_quietly()   # before trl/peft: no bitsandbytes "pip install kernels" line
        self._check_open()
        self._check_writable("run_fit")
        if self.engine is not None:
            if self.engine.busy(timeout=0.5):
                raise OpRefused(
                    f"run_fit was already called on experiment {self.name!r}, which still trains: add "
                    f"runs with clone_modify, or end it with {session.how_to_free(self.name)} and "
                    "then create a new Experiment")
            raise OpRefused(f"run_fit was already called on experiment {self.name!r}: add runs with "
                            "clone_modify, or create a new Experiment")
        if self._folder is None:     # a refused first run_fit gave its folder back
            self._claim(Path(self.asked_as[0]), self.asked_as[1])
        try:
            if not check_concurrency_flag(allow_concurrent):
                session.refuse_while_another_trains(self)
        except BaseException:
            self._unclaim()   # a refused call leaves no folder, no lock, no renamed experiment
            raise
        session.make_current(self)   # the experiment that trains is the one the magics mean

    def _start(self, fit) -> None:
        """Every check has passed: log, commit the plan and start the engine."""
        from rapidfire_nb.engine import refuse_links, refuse_special_files

        refuse_links(self.path)   # again: a link planted since Experiment() must not be written through
        refuse_special_files(self.path)   # nor a pipe waited on
        self._log_open()   # a resumed folder's first write
        self.engine, self.automl = fit.engine, fit.driver
        self.meta = commit(fit, self.name)
        session.register_engine(fit.engine, self.name, self)
        self._final = FinalCheckpoints(
            self.path, self.events, self._state(), self._export_to,
            is_lora=lambda rid: self.engine.snapshot()[rid].spec.peft_config is not None)
        self.engine.start()

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
            done = interruptible(lambda: self.engine.wait(timeout))
        except KeyboardInterrupt:
            print(self._interrupted_line(), flush=True)
            if in_kernel():
                return False
            raise
        if done and self._final is not None:
            self._final.flush()
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
                    if in_kernel():
                        return
                    raise
            from rapidfire_nb.engine import ENDED_REASON

            self.engine.drain()
            self.engine.end_unfinished(ENDED_REASON)
            if self._final is not None:
                self._final.close()   # runs completed just now included; needs the engine
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
        if self._folder is not None:   # a refused first run_fit gave the folder back already
            self.events.close()
            self._folder_lock.release()
            session.closed(self)
        self._ended = True
        session.forget(self)

    @property
    def ended(self) -> bool:
        """True once ``end()`` has closed the experiment."""
        return self._ended

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
                            "(Experiment.open / mode='read'); steer it with the Experiment that "
                            "trains it, or, when nothing trains it, open it with resume=True")

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
        return checked_run(self.engine, run_id)

    def _queue(self, op: str, run_id) -> None:
        """Check ``op`` against the run as the queued ops leave it, then queue it."""
        with self.engine.atomically() if self.engine else contextlib.nullcontext():
            check_status_op(op, self._run(run_id))
            self.engine.submit(Op(op, run_id))

    def stop(self, run_id: int) -> None:
        """Stop a pending or running run at its next chunk boundary; its checkpoint stays.

        Checked at once (a refused op raises ``OpRefused`` and changes nothing), then queued: the
        engine applies it at the next chunk boundary, so ``get_runs_info()`` and the panel show
        the old status until then (``%rapidfire status`` lists the queued ops)."""
        self._queue("stop", run_id)

    def note(self, run_id: int, text: str) -> None:
        """Attach a note to a run (at most 2000 characters; ``""`` clears it). It stays in the
        event log: ``get_runs_info()``'s ``note``, the panel and the report show it."""
        known = self._state().read(lambda t: {r["run_id"] for r in t["runs"].values()})
        results.note_run(self.events, known, run_id, text, writable=not (self.read_only or self._ended))

    def resume(self, run_id: int) -> None:
        """Resume a stopped run from its checkpoint.

        Queued like ``stop``: applied at the next chunk boundary (see ``stop``)."""
        self._queue("resume", run_id)

    def delete(self, run_id: int) -> None:
        """Remove a run from scheduling for good and free its memory and checkpoints (metrics stay).

        Queued like ``stop``: applied at the next chunk boundary, so the run is listed with its
        old status until then (a second ``delete`` of it is refused at once)."""
        self._queue("delete", run_id)

    def cancel_current(self) -> list[int]:
        """Stop every run of the current ``run_fit`` at its next chunk boundary (RapidFire AI's
        ``cancel_current``); returns the ids stopped.

        Each pending or running run becomes ``stopped`` with its checkpoint kept, as ``stop`` does
        (``resume(run_id)`` continues one); a search group adds no more trials afterwards. The
        experiment stays open: ``clone_modify`` and ``resume`` still work, ``end()`` closes it.
        With nothing training it prints that there is nothing to cancel and changes nothing."""
        self._check_open()
        self._check_writable("cancel_current")
        stopped: list[int] = []
        if self.engine is not None:
            from rapidfire_nb.engine import known_ids, project

            with self.engine.atomically():   # no run changes status between the check and the op
                if self.automl is not None:
                    self.automl.cancelled = True   # the search's refills would start new trials
                for run_id in known_ids(self.engine):
                    view = project(self.engine, run_id)
                    if view is not None and view.status in ("pending", "running"):
                        self.engine.submit(Op("stop", run_id, reason="cancelled (cancel_current)"))
                        stopped.append(run_id)
        if stopped:
            print(f"rapidfire: cancelled run_fit of {self.name!r}: run{'s' if len(stopped) > 1 else ''} "
                  f"{', '.join(map(str, stopped))} stop at the next chunk boundary (checkpoints kept: "
                  "exp.resume(run_id) continues one)")
        else:
            print(f"rapidfire: nothing to cancel: no run of {self.name!r} is pending or running")
        return stopped

    def validate_clone(self, run_id: int, changes: dict | None = None, warm_start: bool = False) -> RunSpec:
        """Check a clone_modify without creating anything; returns the new run's spec."""
        self._run(run_id)
        return check_clone(self.engine, self.store, run_id, changes, warm_start)

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

    # -- AutoML (rapidfire_nb.tuning) ----------------------------------------------------------
    def apply_suggestions(self, run_ids=None) -> list[int]:
        """With ``pruner_mode="suggest"``: stop the runs the pruner marked (all open marks, or the
        given ids) with the pruning reason; returns the ids stopped. Unmarked runs are refused.
        A marked run that is no longer pending/running (completed, failed, deleted, stopped) is
        skipped: its answer is logged as refused and it is not in the returned list."""
        self._check_open()
        self._check_writable("apply_suggestions")
        if self.automl is None or self.automl.options.mode != "suggest":
            raise OpRefused("apply_suggestions needs a config group with pruner_mode='suggest'")
        return self.automl.apply_suggestions(run_ids, self.engine.act_on)

    def dismiss_suggestions(self, run_ids=None) -> list[int]:
        """With ``pruner_mode="suggest"``: ignore the pruner's marks on these runs (all of them,
        or the given ids), which train on and are not judged again; returns the ids dismissed.
        Each answer is logged as an ``op`` event, like ``apply_suggestions``'s confirms. A marked
        run that ended (completed, failed, deleted) is skipped the same way: logged as refused,
        not returned; its mark stays in ``get_runs_info()``'s ``pruning`` column with the run's
        end, e.g. "...; run completed" or "...; run deleted". A ``stopped`` run is not ended here
        (unlike for ``apply_suggestions``): it can be resumed, so its mark can still be ignored."""
        self._check_open()
        self._check_writable("dismiss_suggestions")
        if self.automl is None or self.automl.options.mode != "suggest":
            raise OpRefused("dismiss_suggestions needs a config group with pruner_mode='suggest'")
        return self.automl.dismiss_suggestions(run_ids, self.engine.act_on)

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
        if self._live_table is None:
            from rapidfire_nb.engine import LiveTable

            self._live_table = LiveTable(self.events)
        return self._live_table

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

        if self.engine is None and not self._from_log:
            return pd.DataFrame(columns=["run_id", "status"])
        pruning_of = results.pruning_notes(self.automl, self.meta, self._from_log, self._state())
        return results.runs_frame(self._state().read(), pruning_of)

    def get_results(self):
        """Every logged metric, long form: run_id, split, step, samples_seen, epoch, chunk, metric,
        value, and deleted (True for the metrics of a run deleted since). Non-finite values read
        NaN; curves (panel, trackers) place each point at samples_seen. ``epoch`` and ``chunk`` are
        0-based (chunk 0 is the panel's and ``%rapidfire status``'s "chunk 1/N")."""
        return self._state().read(results.results_frame)

    def get_timeline(self):
        """One row per trained chunk, in the order they were logged. Columns:

        * ``run_id``; ``epoch``, ``chunk``: the chunk's place in the run's data stream, 0-based
          (chunk 0 is the panel's and ``%rapidfire status``'s "chunk 1/N");
        * ``device``: where it trained (``cuda:0``, ``cpu``; ``w0:cpu`` on a Ray worker);
        * ``start``, ``end``: Unix times in seconds (``pd.to_datetime(tl.start, unit="s")``);
        * where the chunk's time went, in seconds: ``train_s`` (optimizer steps), ``eval_s`` (the
          eval after the chunk), ``gen_s`` (answering the sample prompts, NaN when none were
          asked), ``swap_s`` (making this run's adapter and state current on the
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
        return self._state().read(results.timeline_frame)

    def time_split(self) -> dict:
        """Seconds spent training, evaluating, answering the sample prompts (``generate``),
        swapping and on everything else (engine-measured)."""
        return self._state().read(results.time_split)

    def get_generations(self):
        """Every run's answers to the sample prompts (``run_fit(sample_prompts=...)``), one row per
        run, chunk and prompt: run_id, name (the run's short name), epoch, chunk (from 1, as the panel counts), step,
        samples_seen, prompt, reference (None where the prompt has none) and text (the new
        tokens, decoded; "" when the run's first new token ended the answer)."""
        return self._state().read(results.generations_frame)

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
        """``export`` into a checked ``path``; the final checkpoints (RapidFire's layout, inside
        the experiment folder) are written through it too."""
        return export_weights(self.engine, self.store, self._run(run_id), run_id, path)

    def final_checkpoint_path(self, run_id: int) -> Path:
        """``<experiment>/runs/<id>/checkpoints/final_checkpoint/``, where RapidFire AI keeps a
        run's final weights; written when the run completes (see ``rapidfire_nb.layout``)."""
        return final_checkpoint_path(self.path, run_id)

    # -- results that need no kernel --------------------------------------------------------
    def plot(self, metric: str = "loss", split: str | None = None, runs=None, **options):
        """A plotly Figure of ``metric``, one curve per run, in the panel's colours and names
        (``report.figures.plot_figure`` lists the options: ``smoothing``, ``log_y``, ``x``,
        ``kind``); ``split="eval"`` plots eval metrics (``"loss"`` there means ``eval_loss``), and
        the default ``None`` takes the train metric of that name, else the eval one (so
        ``plot("eval_loss")`` works); ``runs`` limits it to some run ids. It renders wherever
        plotly does (a saved notebook, Colab, VS Code) and ``fig.write_html(...)`` / ``fig.show()`` work in scripts."""
        from rapidfire_nb.report import plot_figure, snapshot

        return plot_figure(self._state().read(snapshot), metric, split, runs, **options)

    def report(self, path: str | Path) -> Path:
        """Write one self-contained HTML file (plotly.js inside, nothing loaded from the network):
        the curves of every metric, the leaderboard, the engine time split and the chunk
        timeline. An existing file at ``path`` is replaced (re-running the cell refreshes it);
        ``rapidfire report <experiment folder>`` writes the same from a folder."""
        from rapidfire_nb.report import snapshot, write_report

        return write_report(self._state().read(snapshot), path, source=str(self.path),
                            outside=self.path)

    # -- notebook ----------------------------------------------------------------------------
    def view(self) -> ExperimentView:
        """A read-only view of this experiment (``rapidfire_nb.experiment_view``): what the panel,
        the magics and the notebook controls read of it, and the ops they may ask for."""
        return ExperimentView(self)

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
        return log_file_path(self.store, log_type)

    def tensorboard(self):
        """Start (once) a TensorBoard on this experiment's logs and show it in the notebook."""
        return _views.show("tensorboard", self)

    @property
    def _from_log(self) -> bool:
        """No engine, but runs to show: read-only, or reopened (resume=True) before run_fit."""
        return self.engine is None and (self.read_only or self.resumed)

    def __repr__(self) -> str:
        if self.engine is None and not self.read_only and self._folder is None:
            # a refused first run_fit gave its folder back: ``path`` is only the name asked for,
            # whose folder may well hold another experiment's runs, so count none of them
            return (f"<Experiment {self.name!r}: no runs, no folder yet (its next run_fit claims "
                    f"{self.path} or, if that holds an experiment, the next free name)>")
        if self.engine is not None:
            runs = [(r.status, None) for r in self.engine.snapshot().values()]
        elif self._from_log:   # no engine yet: the runs as the event log tells them
            runs = self._state().read(results.statuses)
        else:
            runs = []
        return results.summary_line(self.name, self.path, runs,
                                    continues=self._from_log and not self.read_only)

