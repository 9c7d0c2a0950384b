"""The background training thread: mechanism only (policy lives in scheduler.py).

One ``Engine`` owns the shared base models, every run's ``RunTrainer``, the op queue and the
thread. The thread loops: apply queued ops, ask the scheduler for the next run, swap it in, train
one chunk, evaluate, write the chunk-boundary checkpoint, then append the chunk's events. It never
touches a widget or prints: everything it has to say goes into the event log or the run's log file.
"""

from __future__ import annotations

import copy
import gc
import logging
import queue
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.engine.hfstate import HF_STATE_LOCK
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.scheduler import FairScheduler, RunView, parking_order
from rapidfire_nb.engine.store import ExperimentStore, atomic_write_json, durable_write_failure
from rapidfire_nb.engine.trainers import (RunTrainer, derive_seed, merge_window, prepare_quantized_base,
                                          rng_fork, trainer_class)
from rapidfire_nb.engine.writer import CheckpointWriter
from rapidfire_nb.errors import ConfigError, OpRefused, RapidFireError


@dataclass
class Base:
    """One distinct base model, shared by every LoRA run built on it."""

    model: Any
    tokenizer: Any
    pristine: Any = None          # untouched copy for full fine-tuning runs
    peft_model: Any = None        # PeftModel holding the adapters of LoRA runs
    adapters: set = field(default_factory=set)


@dataclass
class Op:
    kind: str                     # stop | resume | delete | clone | add (a new run from spec)
    run_id: int
    spec: RunSpec | None = None
    warm_start: bool = False
    changes: dict | None = None
    new_run_id: int | None = None
    submitted: float = field(default_factory=time.time)
    reason: str | None = None     # why (a pruner's stop); default: the user asked


# ----------------------------------------------------------------------------------------------
# The engine thread must never print into a notebook cell: its warnings and library logs go to
# the experiment's log file. Other threads keep the normal behaviour.

_ENGINE_THREADS: dict[int, Any] = {}
_original_showwarning = warnings.showwarning


def _thread_aware_showwarning(message, category, filename, lineno, file=None, line=None):
    sink = _ENGINE_THREADS.get(threading.get_ident())
    if sink is not None:
        try:
            sink.write(warnings.formatwarning(message, category, filename, lineno, line))
            sink.flush()
        except Exception:
            pass
        return
    _original_showwarning(message, category, filename, lineno, file, line)


class _EngineThreadFilter(logging.Filter):
    """Keeps library log records emitted by engine threads off the console handlers."""

    def filter(self, record):
        return threading.get_ident() not in _ENGINE_THREADS


def _install_output_routing():
    if warnings.showwarning is not _thread_aware_showwarning:
        warnings.showwarning = _thread_aware_showwarning
    for name in ("transformers", "trl", "peft", "accelerate", "datasets", ""):
        lg = logging.getLogger(name)
        for h in lg.handlers:
            if not any(isinstance(f, _EngineThreadFilter) for f in h.filters):
                h.addFilter(_EngineThreadFilter())


def _collect_garbage(full: bool = True) -> None:
    """Free what released runs held: trainers hold reference cycles; CUDA keeps cached blocks.

    ``full=False`` (when the loop goes idle) skips the ~0.25 s full collection: RunTrainer.close
    already freed the big tensors by refcount; the small cyclic rest goes with Python's own gc.
    """
    if full:
        gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


# Deleting a run's adapter while it is the active one is routine here, not a user mistake.
warnings.filterwarnings("ignore", message=r"Adapter \S+ was active which is now deleted")


# ----------------------------------------------------------------------------------------------


def weights_lost(rec: RunRecord) -> bool:
    """A run without live or stored weights whose weights are not just its fresh initialisation:
    it trained (or started warm), so a clone of it that starts fresh would not be warm."""
    return rec.warm_start or rec.completed_steps > rec.step_offset or rec.chunks_done > 0


def weights_lost_reason(rec: RunRecord, store: ExperimentStore) -> str:
    return (f"run {rec.run_id} ({rec.status}, {rec.completed_steps - rec.step_offset} steps trained) "
            f"has no weights to warm-start from: its checkpoint {store.checkpoint_path(rec.run_id)} "
            f"is missing (deleted, or a partial copy of the folder); clone it cold (warm_start=False)")


class Engine:
    def __init__(self, store: ExperimentStore, events: EventLog, create_model: Callable,
                 train_dataset, eval_dataset, num_chunks: int, seed: int,
                 build_args: Callable, build_lora: Callable, devices=("cpu",), offload: str = "auto"):
        self.store = store
        store.fingerprint_of = self._fingerprint_of
        self.events = events
        self.create_model = create_model
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.num_chunks = num_chunks
        self.seed = seed
        self.build_args = build_args
        self.build_lora = build_lora
        self.scheduler = FairScheduler(devices)
        self.device_name = devices[0]
        self.lock = threading.RLock()
        self.idle = threading.Condition(self.lock)
        self.runs: dict[int, RunRecord] = {}
        self.bases: dict[str, Base] = {}
        self.references: dict[str, Any] = {}   # DPO/GRPO references named by ref_model_name
        self.trainers: dict[int, RunTrainer] = {}
        self.ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self.queued_ops: list[Op] = []   # submitted, not yet applied (under self.lock)
        self.thread: threading.Thread | None = None
        self.on_device: int | None = None
        self.pending_weights: dict[int, dict] = {}
        self.prep_cache: dict = {}   # prepared (tokenized) datasets shared by the runs' trainers
        self.create_model_calls = 0
        self.closed = False
        self.stop_all = False
        self.op_latencies: list[dict] = []
        self._log_file = None
        # set (under the lock) when the loop decides to leave: from then on a submit must start
        # a new thread, even though the old one is still alive in its clean-up
        self._leaving = False
        # chunk checkpoints are written off the engine thread (engine/writer.py)
        self.writer = CheckpointWriter()
        self._write_failures: list[tuple] = []
        self.write_wait_s = 0.0   # engine time spent waiting for the writer
        self._runs_file_lock = threading.Lock()
        self._unwritten: dict[int, dict] = {}   # run -> its counters as of its last durable chunk
        self.offload = offload
        self.host = "cpu"                          # where parked runs live
        self._chunk_peak_extra = 0                 # largest memory a chunk added (CUDA, bytes)
        self.parks_done = 0
        self._runs_version = self._runs_written = 0
        self.runs_write_error: OSError | None = None
        # called by the engine thread, under the lock, before each scheduling decision (i.e. at
        # every chunk boundary); it may submit ops, applied before the next chunk (AutoML pruning
        # and refills, rapidfire_nb/tuning.py)
        self.boundary_hook: Callable[[], None] | None = None

    # -- bases -------------------------------------------------------------------------------
    def load_base(self, spec: RunSpec, need_pristine: bool) -> Base:
        """Call ``create_model`` once per distinct base (in the caller's thread: errors show)."""
        key = spec.base_key()
        if key in self.bases:
            self.reference_model(spec)
            return self.bases[key]
        result = self.create_model(spec.model_config())
        self.create_model_calls += 1
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(
                f"create_model must return (model, tokenizer); it returned {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, tuple) else ""))
        model, tokenizer = result
        import torch

        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"create_model returned {type(model).__name__} as the model; "
                              "expected a transformers PreTrainedModel")
        if tokenizer is None or not callable(tokenizer):
            raise ConfigError(f"create_model returned {type(tokenizer).__name__} as the tokenizer; "
                              "expected a transformers tokenizer")
        if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None):
            tokenizer.pad_token = tokenizer.eos_token
        model = prepare_quantized_base(model, spec.model_name, need_pristine)
        base = Base(model=model, tokenizer=tokenizer)
        if need_pristine:
            base.pristine = copy.deepcopy(model)
        self.bases[key] = base
        self.reference_model(spec)   # after the base: its vocabulary is checked against the base's
        return base

    def reference_model(self, spec: RunSpec):
        """A DPO/GRPO reference other than the base (``ref_model_name``): ``create_model`` called
        once per distinct reference with its own type and kwargs, frozen, shared by every run that
        names it, and kept apart from the bases (adapters never go into it). None: the base."""
        ref_spec = spec.reference_spec()
        if ref_spec is None:
            return None
        key = ref_spec.base_key()
        if key in self.references:
            return self.references[key]
        result = self.create_model(ref_spec.model_config())
        self.create_model_calls += 1
        if not (isinstance(result, tuple) and len(result) == 2):
            raise ConfigError(f"create_model must return (model, tokenizer); for ref_model_name="
                              f"{spec.ref_model_name!r} it returned {type(result).__name__}")
        ref = result[0]
        ref.requires_grad_(False)
        ref.eval()
        base = self.bases.get(spec.base_key())
        if base is not None:
            want = base.model.get_input_embeddings().num_embeddings
            got = ref.get_input_embeddings().num_embeddings
            if want != got:
                raise ConfigError(f"ref_model_name={spec.ref_model_name!r} has a vocabulary of {got} tokens "
                                  f"and the base {spec.model_name!r} {want}; the reference scores the "
                                  "policy's tokens, so both need the same tokenizer")
        self.references[key] = ref
        return ref

    # -- runs ---------------------------------------------------------------------------------
    def next_run_id(self) -> int:
        return max(self.runs, default=0) + 1

    def plan_run(self, spec: RunSpec):
        cls = trainer_class(spec.trainer_type)
        args = self.build_args(spec, output_dir=str(self.store.root / "outputs" / "_plan"),
                               seed=self.seed, **RunTrainer.ENGINE_ARGS)
        plan = cls.plan_for(args, len(self.train_dataset), self.num_chunks, self.seed)
        return plan, plan.total_steps(args.max_steps, args.num_train_epochs)

    def add_run(self, spec: RunSpec, run_id: int | None = None, parent: RunRecord | None = None,
                warm_start: bool = False, changes: dict | None = None, emit: bool = True) -> RunRecord:
        plan, total = self.plan_run(spec)
        with self.lock:
            rid = run_id if run_id is not None else self.next_run_id()
            rec = RunRecord(run_id=rid, spec=spec, parent_run_id=parent.run_id if parent else None,
                            warm_start=warm_start, changes=changes or {}, total_steps=total,
                            steps_per_epoch=plan.steps_per_epoch)
            if warm_start and parent is not None:
                # RapidFire's warm start: the parent's weights, a fresh optimizer and the clone's
                # own full schedule, reading the data from the chunk after the parent's last
                # completed one (parent.chunk wraps to 0 after an epoch's last chunk). The stream
                # position is kept as an offset, so a chunk still means the same data for all runs
                rec.chunk = parent.chunk
                rec.step_offset = plan.chunk_start_step(0, parent.chunk)
                rec.completed_steps = rec.step_offset
                rec.total_steps = total + rec.step_offset
                # its curves continue the parent's samples-seen axis from the branch point
                rec.samples_seen = parent.samples_seen
            self.runs[rid] = rec
            if emit:
                self.events.append(
                    "run_created", run_id=rid, trainer_type=spec.trainer_type,
                    config=spec.config_dict(), knobs=spec.knobs, parent_run_id=rec.parent_run_id,
                    warm_start=warm_start, total_steps=rec.total_steps, steps_per_epoch=plan.steps_per_epoch,
                    num_chunks=self.num_chunks, base_samples_seen=rec.samples_seen,
                    base_step=rec.completed_steps, base_chunk=rec.chunk, changes=rec.changes)
                self.events.append("run_status", run_id=rid, status=rec.status, error=None, reason=None)
            self.save_runs()
        return rec

    def save_runs(self) -> bool:
        """Persist every run record; False (and ``runs_write_error``) when the write failed. The snapshot is taken under the engine lock; the write (with
        its fsyncs) happens outside it when the caller does not hold the lock, and a snapshot
        older than one already written is dropped, so runs.json never goes back in time."""
        with self.lock:
            self._runs_version += 1
            version = self._runs_version
            data = {str(k): r.to_json() for k, r in self.runs.items()}
            for rid, durable in self._unwritten.items():
                # its checkpoint is still being written: runs.json must not claim the chunk yet
                # (a warm clone without a checkpoint resumes from these counters)
                if str(rid) in data:
                    data[str(rid)].update(durable)
        with self._runs_file_lock:
            if version > self._runs_written:
                try:
                    atomic_write_json(self.store.runs_path, data)
                except OSError as exc:
                    # never fatal here (the engine thread must live on): the previous runs.json is
                    # intact, the next save writes everything; _persist fails the affected run
                    self.runs_write_error = exc
                    return False
                self._runs_written = version
                self.runs_write_error = None
        return True

    def _set_status(self, rec: RunRecord, status: str, error: str | None = None,
                    reason: str | None = None, save: bool = True) -> None:
        with self.lock:
            if rec.status == status:
                return
            old = rec.status
            rec.set_status(status)
            if error is not None:
                rec.error = error
            self.events.append("run_status", run_id=rec.run_id, status=status, error=error, reason=reason)
            # pending -> running needs no write: a restart reads "running" as "pending" anyway
            if save and not (old == R.PENDING and status == R.RUNNING):
                self.save_runs()
            self.idle.notify_all()

    # -- thread -------------------------------------------------------------------------------
    def start(self) -> None:
        with self.lock:
            if self.closed:
                raise RapidFireError("this experiment has ended; create a new Experiment")
            if self.thread is not None and self.thread.is_alive() and not self._leaving:
                return
            _install_output_routing()
            self._leaving = False
            self.thread = threading.Thread(target=self._main, name="rapidfire-engine", daemon=True)
            self.thread.start()

    def submit(self, op: Op) -> None:
        with self.lock:   # queued_ops and the queue change together (engine/queued.py reads both)
            self.queued_ops.append(op)
            self.ops.put(op)
        self.start()

    def busy(self) -> bool:
        with self.lock:
            return any(r.status in R.ACTIVE for r in self.runs.values()) or not self.ops.empty()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            t = self.thread
            if t is None or not t.is_alive():
                with self.lock:
                    if self.thread is not t:
                        continue                  # a new thread took over
                    ops_queued = not self.ops.empty()
                    active = any(r.status in R.ACTIVE for r in self.runs.values())
                if not ops_queued and not active:
                    return True
                if t is None or self.closed or self.stop_all or not ops_queued:
                    return False  # nothing will move these runs (see logs/engine.log)
                # an op is between submit's put() and start(): let it start the thread
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
                continue
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0:
                return not self.busy() and not (self.thread and self.thread.is_alive())
            t.join(timeout=0.2 if remaining is None else min(0.2, remaining))

    def _main(self) -> None:
        log_path = self.store.root / "logs" / "engine.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # local: a thread started while this one cleans up opens its own file and handler
        log_file = self._log_file = open(log_path, "a", encoding="utf-8")
        me = threading.get_ident()
        _ENGINE_THREADS[me] = log_file
        handler = logging.StreamHandler(log_file)
        handler.addFilter(lambda r: threading.get_ident() == me)
        handler.handleError = lambda record: None   # a full disk: no traceback on stderr
        for name in ("transformers", "trl", "peft", "accelerate", "datasets"):
            logging.getLogger(name).addHandler(handler)
        try:
            self._loop()
        except BaseException:  # the loop itself must never die silently
            log_file.write(traceback.format_exc())
        finally:
            with self.lock:
                if threading.current_thread() is self.thread:
                    self._leaving = True
            for name in ("transformers", "trl", "peft", "accelerate", "datasets"):
                logging.getLogger(name).removeHandler(handler)
            _ENGINE_THREADS.pop(me, None)
            log_file.close()
            with self.lock:
                self.idle.notify_all()

    def _loop(self) -> None:
        while True:
            flush = False
            with self.lock:
                if self.boundary_hook is not None and not self.stop_all:
                    try:
                        self.boundary_hook()
                    except Exception:   # a policy bug must not kill training: logged, ignored
                        self._log_file.write("boundary hook failed:\n" + traceback.format_exc())
                if self.stop_all:
                    flush = True
                elif not self.ops.empty() and self.writer.busy():
                    flush = True   # ops see every finished chunk on disk and in the log
                else:
                    self._settle_writes()
                    if not self.writer.busy():
                        # only this thread submits writes: the writer stays idle while ops apply;
                        # an op queued meanwhile waits for the next turn (flush, then apply)
                        self._apply_ops()
                    views = [RunView(r.run_id, r.progress, r.status in R.ACTIVE,
                                     busy=self.writer.pending(r.run_id)) for r in self.runs.values()]
                    choice = self.scheduler.choose(views, self.device_name, self.on_device)
                    if choice is None:
                        if self.writer.busy():
                            flush = True           # a finishing run's checkpoint is in flight
                        elif self.ops.empty():
                            self._leaving = True  # under the lock: a later submit starts a new thread
                            _collect_garbage(full=False)
                            return
                        else:
                            continue
                    else:
                        rec = self.runs[choice]
                        if rec.status == R.PENDING:
                            self._set_status(rec, R.RUNNING)
            if flush:
                t0 = time.perf_counter()
                self.writer.flush()   # outside the lock: the writer's follow-ups take it
                self.write_wait_s += time.perf_counter() - t0
                with self.lock:
                    if self.stop_all:
                        self._settle_writes()
                        # ops accepted before end(wait=False) are applied (or refused, logged),
                        # never dropped: a returned clone id must exist, a user stop must stay one
                        self._apply_ops()
                        return
                continue
            try:
                self._train_chunk(rec)
            except Exception as exc:  # failure isolation: this run fails, the others go on
                self._fail(rec, exc)

    def _settle_writes(self) -> None:
        """Engine thread, under the lock: act on what the writer finished (failed writes, runs that
        completed) - things only this thread may do, because they touch the shared model."""
        failures, self._write_failures = self._write_failures, []
        for rec, exc, counters in failures:
            for k, v in (counters or {}).items():   # the chunk did not count: back to the last checkpoint
                setattr(rec, k, v)
            self._fail(rec, exc)
        for rid in [rid for rid in self.trainers if self.runs[rid].status == R.COMPLETED]:
            # its final weights are in its checkpoint (export, warm clones and run_weights read
            # them there): memory must not grow with finished runs. No full gc.collect() (~0.25 s
            # with transformers loaded): the big tensors go by refcount; cycles when idle.
            self._release(self.runs[rid], collect=False)

    # -- ops ----------------------------------------------------------------------------------
    def _apply_ops(self) -> None:
        freed = False
        while True:
            try:
                op = self.ops.get_nowait()
            except queue.Empty:
                break
            self.queued_ops[:] = [q for q in self.queued_ops if q is not op]
            rec = self.runs.get(op.run_id)
            ok, reason = True, None
            try:
                if rec is None and op.kind != "add":   # a queued clone that was refused when applied
                    raise OpRefused(f"run {op.run_id} does not exist (its clone was refused)")
                if op.kind == "stop":
                    if rec.status in R.ACTIVE:
                        self._set_status(rec, R.STOPPED, reason=op.reason or "stopped by user")
                    else:
                        ok, reason = False, f"run {op.run_id} is {rec.status}"
                elif op.kind == "resume":
                    if rec.status == R.STOPPED:
                        self._set_status(rec, R.PENDING, reason="resumed by user")
                    else:
                        ok, reason = False, f"run {op.run_id} is {rec.status}"
                elif op.kind == "delete":
                    self._delete(rec)
                elif op.kind == "clone":
                    self._clone(op, rec)
                elif op.kind == "add":
                    if op.run_id in self.runs:
                        ok, reason = False, f"run {op.run_id} exists already"
                    else:
                        self.add_run(op.spec, run_id=op.run_id)
            except Exception as exc:
                ok, reason = False, f"{type(exc).__name__}: {exc}"
            latency = time.time() - op.submitted
            self.op_latencies.append({"op": op.kind, "run_id": op.run_id, "latency_s": latency})
            self.events.append("op", op=op.kind, run_id=op.run_id, accepted=ok, reason=reason,
                               new_run_id=op.new_run_id, latency_s=latency)
            freed = freed or (ok and op.kind == "delete")
        if freed:
            # one collection per batch of deletes: a gc.collect() costs 0.1-0.7 s with
            # transformers loaded, and every op queued behind would wait for each one
            _collect_garbage()

    def _delete(self, rec: RunRecord) -> None:
        if rec.status == R.DELETED:
            return
        self._release(rec, collect=False)  # _apply_ops collects once per batch
        self.store.delete_checkpoints(rec.run_id)
        self._set_status(rec, R.DELETED, reason="deleted by user")

    def _release(self, rec: RunRecord, collect: bool = True) -> None:
        """Free a run's trainer, optimizer, adapter and device memory."""
        rt = self.trainers.pop(rec.run_id, None)
        self.pending_weights.pop(rec.run_id, None)
        if self.on_device == rec.run_id:
            self.on_device = None
        if rt is not None:
            base = self.bases.get(rec.spec.base_key())
            if rt.adapter_name is not None and base is not None and base.peft_model is not None:
                try:
                    base.peft_model.delete_adapter(rt.adapter_name)
                except Exception:
                    # PEFT refuses to delete the last adapter; it is then just left inactive
                    pass
                base.adapters.discard(rt.adapter_name)
            rt.close()
        if collect:
            _collect_garbage()

    def _clone(self, op: Op, parent: RunRecord) -> None:
        weights = None
        if op.warm_start:
            # a delete queued before this clone was validated may have been applied first
            if parent.status == R.DELETED:
                raise OpRefused(f"run {parent.run_id} was deleted before this warm clone was "
                                "applied; its weights are gone")
            weights = self.boundary_weights_of(parent)
            if weights is None:
                if weights_lost(parent):
                    # a silent cold start labelled warm would be a wrong result nobody can see
                    raise OpRefused(weights_lost_reason(parent, self.store))
            else:
                # on disk before the run exists: a crash in between leaves only an orphan file
                self.store.save_warm_start(op.new_run_id, weights, op.spec.fingerprint())
        rec = self.add_run(op.spec, run_id=op.new_run_id, parent=parent, warm_start=op.warm_start,
                           changes=op.changes)
        if weights is not None:
            self.pending_weights[rec.run_id] = weights
        return rec

    def boundary_weights_of(self, parent: RunRecord) -> dict | None:
        """Where a warm clone starts: the parent's live weights, else its last checkpoint, else
        (a warm clone that never finished a chunk, whatever its status) the weights it started
        from. None when none of these exist."""
        rt = self.trainers.get(parent.run_id)
        if rt is not None:
            return rt.weights()
        ckpt = self.store.load_checkpoint(parent.run_id)
        if ckpt is not None:
            return ckpt["trainer"]["weights"]
        weights = self.pending_weights.get(parent.run_id)
        if weights is None and parent.warm_start:
            weights = self.store.load_warm_start(parent.run_id)
        return weights

    def _fingerprint_of(self, run_id: int) -> str | None:
        rec = self.runs.get(run_id)
        return rec.spec.fingerprint() if rec is not None else None

    def weights_missing(self, rec: RunRecord) -> bool:
        """Cheap (no file read): True when a warm clone of ``rec`` would have nothing to start
        from although ``rec`` has trained or started warm."""
        with self.lock:
            if rec.run_id in self.trainers or rec.run_id in self.pending_weights:
                return False
        if self.store.checkpoint_path(rec.run_id).exists():
            return False
        if rec.warm_start and self.store.warm_start_path(rec.run_id).exists():
            return False
        return weights_lost(rec)

    def _fail(self, rec: RunRecord, exc: BaseException) -> None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        with self.lock:
            self._release(rec)
            if rec.status not in R.TERMINAL:
                self._set_status(rec, R.FAILED, error=tb, reason=f"{type(exc).__name__}: {exc}")

    # -- one chunk ----------------------------------------------------------------------------
    def _trainer_for(self, rec: RunRecord) -> RunTrainer:
        rt = self.trainers.get(rec.run_id)
        if rt is not None:
            return rt
        spec = rec.spec
        base = self.load_base(spec, need_pristine=spec.peft_config is None)
        cls = trainer_class(spec.trainer_type)
        out_dir = str(self.store.output_dir(rec.run_id))
        init_seed = derive_seed(self.seed, spec.seed_fingerprint())
        if spec.peft_config is not None:
            from peft import get_peft_model

            name = f"run_{rec.run_id}"
            lora = self.build_lora(spec)
            with rng_fork():
                import torch

                torch.manual_seed(init_seed)  # adapter init depends on (seed, config) only
                if base.peft_model is None:
                    base.peft_model = get_peft_model(base.model, lora, adapter_name=name)
                else:
                    base.peft_model.add_adapter(name, lora)
            base.adapters.add(name)
            model, adapter = base.peft_model, name
        else:
            source = base.pristine if base.pristine is not None else base.model
            model, adapter = copy.deepcopy(source), None
        import datasets

        was = datasets.utils.logging.is_progress_bar_enabled()
        datasets.utils.logging.disable_progress_bar()
        try:
            rt = cls(rec, model, base.tokenizer, self.train_dataset, self.eval_dataset,
                     self.num_chunks, self.seed, out_dir, adapter, self.build_args,
                     prep_cache=self.prep_cache, ref_model=self.reference_model(spec))
        finally:
            if was:
                datasets.utils.logging.enable_progress_bar()
        if rec.completed_steps == 0 and rec.step_offset == 0:
            # TRL may drop examples while preparing the data (fully masked rows, packing): the
            # plan follows the prepared dataset, which is what the run actually walks
            total = rt.total_steps()
            if total != rec.total_steps or rt.plan.steps_per_epoch != rec.steps_per_epoch:
                rec.total_steps, rec.steps_per_epoch = total, rt.plan.steps_per_epoch
        rt.build_optimizer(rec.total_steps - rec.step_offset)
        for other in self.trainers.values():
            other.keep_parked()   # the new trainer's model.to(device) moved every adapter back
        ckpt = self.store.load_checkpoint(rec.run_id)
        if ckpt is not None:
            rt.load_state_dict(ckpt["trainer"])
            for key in ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done"):
                setattr(rec, key, ckpt["counters"][key])
        elif rec.run_id in self.pending_weights:
            rt.load_weights(self.pending_weights.pop(rec.run_id))
        self.trainers[rec.run_id] = rt
        return rt

    def _train_chunk(self, rec: RunRecord) -> None:
        t_start = time.time()
        with HF_STATE_LOCK:
            rt = self._trainer_for(rec)
        t_built = time.time()
        # swap: make this run's adapter active and its RNG current (the previous run's RNG was
        # captured at its chunk boundary; building a trainer since then may have reseeded)
        t0 = time.perf_counter()
        self._make_room(rec)
        rt.unpark()
        rt.swap_in()
        self.on_device = rec.run_id
        swap_s = time.perf_counter() - t0
        peak_probe = self._chunk_memory_probe()

        plan = rt.plan
        epoch, chunk = rec.epoch, rec.chunk
        first = max(rec.completed_steps, plan.chunk_start_step(epoch, chunk))
        if chunk + 1 < plan.num_chunks:
            end = plan.chunk_start_step(epoch, chunk + 1)
        else:
            end = plan.chunk_start_step(epoch + 1, 0)
        end = min(end, rec.total_steps)
        batch: list[tuple[str, dict]] = []
        t0 = time.perf_counter()
        samples = rec.samples_seen
        log_every, eval_every = rt.intervals(rec.total_steps - rec.step_offset)
        window: list[dict] = []
        mid_eval_s = 0.0
        for g in range(first, end):
            e, s = plan.position(g)
            with HF_STATE_LOCK:
                out = rt.train_step(e, s, g - rec.step_offset)
            samples += out["examples"]
            own = g + 1 - rec.step_offset
            window.append(out["metrics"])
            if log_every is None or own % log_every == 0 or g + 1 == end:
                batch.append(("metric", dict(run_id=rec.run_id, split="train", step=g + 1,
                                             samples_seen=samples, epoch=epoch, chunk=chunk,
                                             metrics=merge_window(window))))
                window = []
            if eval_every and own % eval_every == 0 and g + 1 < end:
                t1 = time.perf_counter()   # eval_strategy="steps" inside the chunk (RNG untouched)
                with HF_STATE_LOCK:
                    mid = rt.evaluate()
                if mid:
                    batch.append(("metric", dict(run_id=rec.run_id, split="eval", step=g + 1,
                                                 samples_seen=samples, epoch=epoch, chunk=chunk,
                                                 metrics=mid)))
                mid_eval_s += time.perf_counter() - t1
        train_s = time.perf_counter() - t0 - mid_eval_s
        rt.swap_out()  # capture the RNG at the boundary (it is part of the checkpoint)
        if peak_probe is not None:
            self._chunk_peak_extra = max(self._chunk_peak_extra, peak_probe())

        t0 = time.perf_counter()
        with HF_STATE_LOCK:
            eval_metrics = rt.evaluate()
        eval_s = time.perf_counter() - t0 + mid_eval_s
        if eval_metrics:
            batch.append(("metric", dict(run_id=rec.run_id, split="eval", step=end,
                                         samples_seen=samples, epoch=epoch, chunk=chunk,
                                         metrics=eval_metrics)))
        # advance the stream position
        next_epoch, next_chunk = (epoch, chunk + 1) if chunk + 1 < plan.num_chunks else (epoch + 1, 0)
        counters = dict(completed_steps=end, samples_seen=samples, epoch=next_epoch,
                        chunk=next_chunk, chunks_done=rec.chunks_done + 1)
        done = end >= rec.total_steps
        t_end = time.time()
        chunk_event = dict(run_id=rec.run_id, epoch=epoch, chunk=chunk, device=self.device_name,
                           start=t_start, end=t_end, train_s=train_s, eval_s=eval_s,
                           swap_s=swap_s, setup_s=t_built - t_start, other_s=0.0,
                           completed_steps=end, total_steps=rec.total_steps, samples_seen=samples,
                           chunks_done=counters["chunks_done"])
        # the snapshot: weights copied now, optimizer/scheduler state by reference (this run is
        # not trained again until the writer is done with it)
        t0 = time.perf_counter()
        state = {"trainer": rt.state_dict(), "counters": counters, "events": batch,
                 "chunk_event": dict(chunk_event)}
        chunk_event["snapshot_s"] = time.perf_counter() - t0
        chunk_event["end"] = time.time()
        chunk_event["other_s"] = max(0.0, (chunk_event["end"] - t_start) - train_s - eval_s - swap_s)
        with self.lock:
            before = {k: getattr(rec, k) for k in counters}
            self._unwritten[rec.run_id] = before
            for k, v in counters.items():
                setattr(rec, k, v)
            if eval_metrics:
                rec.last_metrics.update(eval_metrics)
        if self.writer.busy():
            # at most one checkpoint in flight: a crash loses the chunk being trained and at most
            # the one chunk whose checkpoint was still being written
            t0 = time.perf_counter()
            self.writer.flush()
            self.write_wait_s += time.perf_counter() - t0
        self.writer.submit(rec.run_id, lambda: self._persist(rec, state, batch, chunk_event, done, before))

    # -- residency ----------------------------------------------------------------------------
    def _make_room(self, rec: RunRecord) -> None:
        """Before ``rec`` trains: park other runs' own state (adapter or model copy, optimizer
        state) in host memory, as the ``offload`` policy says. "never": all stay on the device (a
        swap then moves nothing). "always": only the run in training is on the device. "auto"
        (default): on a CUDA device, park runs only while free memory is short of what this run
        needs, those the scheduler will come back to last first; elsewhere, nothing moves."""
        if self.offload == "never":
            return
        others = [(self.runs[rid], rt) for rid, rt in self.trainers.items()
                  if rid != rec.run_id and not rt.parked and not self.writer.pending(rid)]
        if not others:
            return
        if self.offload == "always":
            for _, rt in others:
                self._park(rt)
            return
        rt = self.trainers[rec.run_id]
        device = rt.args.device
        if device.type != "cuda":
            return
        import torch

        free, total = torch.cuda.mem_get_info(device)
        headroom = self._chunk_peak_extra if self._chunk_peak_extra else int(0.10 * total)
        need = rt.parked_bytes() + headroom

        def available() -> int:
            free, _ = torch.cuda.mem_get_info(device)
            cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
            return free + cached - int(0.05 * total)

        by_id = {r.run_id: other for r, other in others}
        for rid in parking_order(RunView(r.run_id, r.progress, True) for r, _ in others):
            if available() >= need:
                break
            self._park(by_id[rid])

    def _park(self, rt: RunTrainer) -> None:
        try:
            rt.park(self.host)
            self.parks_done += 1
        except Exception as exc:   # e.g. no pinned host memory left: it just stays resident
            warnings.warn(f"run {rt.record.run_id} could not be moved to host memory "
                          f"({type(exc).__name__}: {exc}); it stays on the device")

    def _chunk_memory_probe(self):
        """On CUDA, a function giving what this chunk added on top of the memory allocated when it
        started, known exactly when the chunk set a new process-wide peak (the peak is read, never
        reset: other code, ``rapidfire bench`` or the user's, may be measuring it)."""
        if self.offload != "auto":
            return None
        rt = self.trainers.get(self.on_device) if self.on_device is not None else None
        if rt is None or rt.args.device.type != "cuda":
            return None
        import torch

        device = rt.args.device
        start = torch.cuda.memory_allocated(device)
        peak_before = torch.cuda.max_memory_allocated(device)

        def extra() -> int:
            peak = torch.cuda.max_memory_allocated(device)
            return peak - start if peak > peak_before else self._chunk_peak_extra

        return extra

    def _persist(self, rec: RunRecord, state: dict, batch: list, chunk_event: dict, done: bool,
                 before: dict) -> None:
        """Writer thread: make the chunk durable, then log it (never the other way round)."""
        me = threading.get_ident()
        _ENGINE_THREADS[me] = self._log_file   # its warnings go to the log, as the engine's do
        try:
            self._persist_routed(rec, state, batch, chunk_event, done, before)
        finally:
            _ENGINE_THREADS.pop(me, None)

    def _persist_routed(self, rec: RunRecord, state: dict, batch: list, chunk_event: dict,
                        done: bool, before: dict) -> None:
        t0 = time.perf_counter()
        try:
            self.store.save_checkpoint(rec.run_id, state)
        except Exception as exc:
            with self.lock:
                self._unwritten.pop(rec.run_id, None)
                self._write_failures.append((rec, exc, before))
            return
        chunk_event["checkpoint_s"] = time.perf_counter() - t0
        with self.lock:
            self._unwritten.pop(rec.run_id, None)
        try:
            # the log has its own lock; holding the engine's through an fsync would stall it
            logged = self.events.extend(batch + [("chunk_done", chunk_event)])
            if done:
                with self.lock:
                    if rec.status in R.ACTIVE:
                        self._set_status(rec, R.COMPLETED, save=False)  # the engine frees it
            saved = self.save_runs()
            failure = durable_write_failure(self.events, logged[-1]["seq"], saved,
                                            self.runs_write_error, rec.run_id, self.store)
            if failure is not None:
                raise failure
        except Exception as exc:
            # the checkpoint is on disk (a restart re-logs its events from it); this session
            # cannot log the run any more: it fails, visibly, with its counters as on disk
            with self.lock:
                self._write_failures.append((rec, exc, None))

    def boundary_weights(self, run_id: int) -> dict | None:
        """A run's weights at its last chunk boundary: from its live trainer while that chunk's
        checkpoint is being written (the run cannot train meanwhile), else from its checkpoint."""
        with self.lock:
            # the writer needs this lock to finish the job: pending cannot end while it is held
            rt = self.trainers.get(run_id)
            if rt is not None and self.writer.pending(run_id):
                return rt.weights()
        ckpt = self.store.load_checkpoint(run_id)
        return ckpt["trainer"]["weights"] if ckpt else None

    def in_own_thread(self) -> bool:
        """True in the engine thread or the checkpoint writer's (where event listeners run)."""
        me = threading.current_thread()
        return me is self.thread or self.writer.is_worker(me)

    def run_weights(self, run_id: int) -> dict | None:
        with self.lock:
            rt = self.trainers.get(run_id)
            if rt is not None:
                return rt.weights()
        ckpt = self.store.load_checkpoint(run_id)
        return ckpt["trainer"]["weights"] if ckpt else None

    def close(self) -> None:
        self.writer.flush()   # normally idle already: the loop flushes before it leaves
        with self.lock:
            self.closed = True
            self._settle_writes()
            for rid in list(self.trainers):
                self._release(self.runs[rid])
