"""The engine: one background thread that applies ops and trains chunks (mechanism only; policy
lives in scheduling/).

The thread loops: apply queued ops, give each free slot of the chunk executor (engine/executor.py:
one in the kernel, one per Ray worker) the chunk its policy picks, collect the chunks that come
back, and hand each one's checkpoint and events to the writer (engine/persistence.py). It never
touches a widget or prints: everything it has to say goes into the event log or the experiment's
log file (engine/routing.py).

The rest of the package talks to it through a narrow API: ``submit`` an op, ``snapshot`` the
run table, ``wait``, ``drain`` and ``close``; plus ``load_base``/``plan_run``/``add_run`` while
``run_fit`` sets it up and ``boundary_weights``/``weights_missing`` for export and warm clones.
``runs`` and ``lock`` are the loop's own state: readers outside the engine package use
``snapshot()``.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import gc
import logging
import io
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine import ops
from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.engine.fsio import open_append_text
from rapidfire_nb.engine.executor import ChunkExecutor, LocalChunkExecutor
from rapidfire_nb.engine.factory import TrainerFactory
from rapidfire_nb.engine.inputs import TrainingInputs
from rapidfire_nb.engine.ops import weights_lost
from rapidfire_nb.engine.persistence import Persistence
from rapidfire_nb.engine.residency import Residency
from rapidfire_nb.engine.routing import LIBRARY_LOGGERS, routed_to
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.scheduling import RunView, choose_fair
from rapidfire_nb.engine.store import ExperimentStore
from rapidfire_nb.engine.view import EngineView
from rapidfire_nb.errors import RapidFireError

_POLL_S = 0.1          # how long the loop waits for a chunk before looking at the op queue again
_WRITE_POLL_S = 0.005  # ... and before looking whether the checkpoint writer is done


class _Next(enum.Enum):
    """What the control loop does after a turn's ops and dispatch."""
    COLLECT = "collect"   # wait for a chunk to come back and book it
    FLUSH = "flush"       # wait for the checkpoint writer first
    AGAIN = "again"       # ops came in: a new turn, at a boundary
    PAUSE = "pause"       # nothing in flight, replacement workers starting
    LEAVE = "leave"       # nothing left to train


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
    pruned: bool = False          # a pruner's stop: the run record says so, whatever the reason text


@dataclass
class Note:
    """An event a boundary policy wants logged (a pruner's suggestion, a trial that could not be
    added): the engine appends it, in the order the policy returned it among its ops."""
    type: str
    fields: dict


def _collect_garbage(full: bool = True) -> None:
    """Free what released runs held: trainers hold reference cycles; CUDA keeps cached blocks.

    ``full=False`` (when the loop goes idle) skips the full collection (slow with transformers
    loaded): RunTrainer.close already freed the big tensors by refcount; the small cyclic rest
    goes with Python's own gc.
    """
    if full:
        gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass


def _devices(spec: RunSpec) -> dict:
    """``devices`` of a run sharded over several (engine/sharding.py); nothing for one."""
    from rapidfire_nb.engine.sharding import devices_of

    k = devices_of(spec)
    return {"devices": k} if k > 1 else {}


class _DiscardedLog(io.StringIO):
    """Where the engine's warnings go when its log file cannot be opened: nowhere."""

    def write(self, text: str) -> int:
        return len(text)


class Engine:
    def __init__(self, store: ExperimentStore, events: EventLog, inputs: TrainingInputs,
                 devices=("cpu",), executor: ChunkExecutor | None = None):
        """``executor``: where chunks train; None for the kernel's own (``LocalChunkExecutor``
        on ``devices[0]``). Whatever it is, this loop drives it through its seam and its
        lifecycle hooks (engine/executor.py)."""
        self.store = store
        store.name_runs_by(self._fingerprint_of)
        self.events = events
        self.inputs = inputs
        self.num_chunks = inputs.num_chunks
        if not devices:
            raise ValueError("the engine needs at least one device")
        self.device_name = devices[0]
        self.lock = threading.RLock()
        self.runs: dict[int, RunRecord] = {}
        self.factory = TrainerFactory(store, inputs)
        self.persistence = Persistence(store, events, self.lock, self.runs)
        self.executor = executor if executor is not None else LocalChunkExecutor(
            self.factory, store, self.device_name, Residency(inputs.offload),
            may_move=lambda rid: not self.persistence.writer.pending(rid),
            progress_of=lambda rid: self.runs[rid].progress)
        self.ops: queue.SimpleQueue[Op] = queue.SimpleQueue()
        self._queued: list[Op] = []      # submitted, not yet applied (under self.lock)
        self._held_ops: list[Op] = []    # taken from the queue, waiting for a chunk in flight
        self._last_booked: int | None = None
        self.thread: threading.Thread | None = None
        self.closed = False
        self._draining = False   # drain() asked the loop to leave at the next chunk boundary
        self._log_file = None
        # set (under the lock) when the loop decides to leave: from then on a submit must start
        # a new thread, even though the old one is still alive in its clean-up
        self._leaving = False
        # called by the engine thread, under the lock, before each scheduling decision (i.e. at
        # every chunk boundary) with a read-only view of the engine (view.EngineView); it yields
        # what it decides, as ops and notes, and the engine acts on each before the next chunk
        # (AutoML pruning and refills, rapidfire_nb/tuning/driver.py). The policy never calls
        # the engine.
        self.boundary_hook: Callable[[EngineView], Iterable[Op | Note]] | None = None
        # ids handed out for runs that do not exist yet (a queued clone, a trial's run): a later
        # id never takes one of them
        self.reserved_ids: set[int] = set()

    @property
    def sample_prompts(self) -> list | None:
        """run_fit's sample prompts, checked (None: the eval set's first prompts)."""
        return self.inputs.sample_prompts

    @property
    def stopping(self) -> bool:
        """The loop is leaving for good at its next boundary (``drain``) or the engine closed."""
        return self._draining or self.closed

    def training_now(self, timeout: float = 1.0) -> dict[str, int]:
        """Worker name -> the run whose chunk trains there ({} in the kernel, or when the engine
        holds its lock longer than ``timeout`` seconds: a status line does not wait for it)."""
        if not self.lock.acquire(timeout=timeout):
            return {}
        try:
            return self.executor.training_now()
        finally:
            self.lock.release()

    def has_active_runs(self) -> bool:
        """Under the lock: some run is pending or running."""
        return any(r.status in R.ACTIVE for r in self.runs.values())

    def stop_active(self, reason: str) -> None:
        """Under the lock: every pending or running run becomes ``stopped`` (resumable), for
        ``reason`` (an executor with nothing left to train on)."""
        for rec in self.runs.values():
            if rec.status in R.ACTIVE:
                self._set_status(rec, R.STOPPED, reason=reason)

    # -- set-up (run_fit, in the caller's thread) ---------------------------------------------
    def load_base(self, spec: RunSpec, need_pristine: bool):
        """Call ``create_model`` once per distinct base (in the caller's thread: errors show)."""
        return self.factory.load_base(spec, need_pristine)

    def model_and_tokenizer(self, spec: RunSpec) -> tuple[Any, Any] | None:
        """The loaded base model and tokenizer of ``spec``; None before ``load_base``."""
        return self.factory.model_and_tokenizer(spec)

    def untouched_model(self, spec: RunSpec):
        """The base model of a full fine-tuning run as ``create_model`` returned it."""
        base = self.factory.bases[spec.base_key()]
        return base.pristine if base.pristine is not None else base.model

    def plan_run(self, spec: RunSpec):
        return self.factory.plan_run(spec)

    def next_run_id(self) -> int:
        return max(self.runs, default=0) + 1

    def reserve_run_id(self, avoid: Iterable[int] = ()) -> int:
        """A new run id above every run, every id reserved before and ``avoid``; it stays
        reserved, so an op queued with it keeps it until the op is applied."""
        with self.lock:
            new_id = max(set(self.runs) | self.reserved_ids | set(avoid), default=0) + 1
            self.reserved_ids.add(new_id)
            return new_id

    def log_answer(self, op: str, run_id: int, accepted: bool, reason: str | None,
                   new_run_id: int | None = None, latency_s: float = 0.0) -> None:
        """The ``op`` event that answers an op, applied here or answered by a policy's facade
        (a pruning suggestion confirmed or ignored): every answer has the same shape in the log."""
        self.events.append("op", op=op, run_id=run_id, accepted=accepted, reason=reason,
                           new_run_id=new_run_id, latency_s=latency_s)

    def reserve_run_ids(self, run_ids: Iterable[int]) -> None:
        """Keep ``run_ids`` from being handed out: ids a policy gave out in an earlier session
        (an Optuna trial's run that does not exist yet, or whose add was refused)."""
        with self.lock:
            self.reserved_ids.update(int(r) for r in run_ids)

    def _boundary(self) -> None:
        """Under the lock: act on each decision of the boundary policy as it yields it. A policy
        that fails after deciding (its own bookkeeping raised) has had what it decided acted on,
        as its books say; the failure goes on up to the loop, which logs it."""
        for action in self.boundary_hook(EngineView(self)):
            try:
                self.act_on(action)
            except Exception:   # one bad decision does not drop the ones after it
                self._log_file.write("boundary decision failed:\n" + traceback.format_exc())

    def act_on(self, action: Op | Note) -> None:
        """A policy's decision: an ``Op`` is queued (an ``add`` keeps its run id), a ``Note``
        logged (one that answers an op with a new run id keeps that id too: a refused trial's)."""
        with self.lock:
            if isinstance(action, Op):
                if action.kind == "add":
                    self.reserved_ids.add(action.run_id)
                self.submit(action)
            elif isinstance(action, Note):
                if isinstance(action.fields.get("new_run_id"), int):
                    self.reserved_ids.add(action.fields["new_run_id"])
                self.events.append(action.type, **action.fields)
            else:
                raise TypeError(f"a boundary policy decided {action!r}; expected an Op or a Note")

    def add_run(self, spec: RunSpec, run_id: int | None = None, parent: RunRecord | None = None,
                warm_start: bool = False, changes: dict | None = None, emit: bool = True) -> RunRecord:
        plan, total = self.plan_run(spec)
        with self.lock:
            rid = run_id if run_id is not None else self.next_run_id()
            rec = RunRecord(run_id=rid, spec=spec, parent_run_id=parent.run_id if parent else None,
                            warm_start=warm_start, changes=changes or {}, total_steps=total,
                            steps_per_epoch=plan.steps_per_epoch, samples=self.sample_prompts)
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
                # both in one write and fsync
                self.events.extend([
                    ("run_created", dict(
                        run_id=rid, trainer_type=spec.trainer_type, config=spec.config_dict(),
                        knobs=spec.knobs, parent_run_id=rec.parent_run_id, warm_start=warm_start,
                        total_steps=rec.total_steps, steps_per_epoch=plan.steps_per_epoch,
                        num_chunks=self.num_chunks, base_samples_seen=rec.samples_seen,
                        base_step=rec.completed_steps, base_chunk=rec.chunk, changes=rec.changes,
                        **_devices(spec))),
                    ("run_status", dict(run_id=rid, status=rec.status, error=None, reason=None))])
            self.save_runs()
        return rec

    def set_start_weights(self, run_id: int, weights: dict) -> None:
        """A warm clone restored after a restart: the weights its trainer starts from."""
        with self.lock:
            self.executor.set_start_weights(run_id, weights)

    def save_runs(self) -> bool:
        """Persist every run record to runs.json; False when the write failed (engine/persistence.py)."""
        return self.persistence.save_runs()

    @contextlib.contextmanager
    def runs_writes_deferred(self):
        """Inside, ``save_runs`` writes nothing; the caller writes once afterwards (recovery
        rebuilds many runs and must never leave a runs.json holding only some of them)."""
        self.persistence.defer_runs_writes()
        try:
            yield
        finally:
            self.persistence.resume_runs_writes()

    # -- reading ------------------------------------------------------------------------------
    def atomically(self):
        """Hold while validating an op against ``snapshot``/``ops.project`` and
        submitting it: no op is applied and no run changes status in between."""
        return self.lock

    def run_ids(self) -> list[int]:
        with self.lock:
            return list(self.runs)

    def taken_ids(self) -> set[int]:
        """Every run id in use: the runs', and those reserved for runs not created yet."""
        with self.lock:
            return set(self.runs) | self.reserved_ids

    def queued_ops(self, timeout: float = -1) -> list[Op] | None:
        """The ops submitted and not applied yet, in queue order (a copy); None when the lock is
        not free within ``timeout`` seconds (-1: wait for it), so a reader in the kernel's
        thread never waits on a chunk boundary."""
        if not self.lock.acquire(timeout=timeout):
            return None
        try:
            return list(self._queued)
        finally:
            self.lock.release()

    def snapshot(self) -> dict[int, RunRecord]:
        """A consistent copy of the run table (records are copies: safe to read in any thread)."""
        with self.lock:
            return {rid: copy.copy(rec) for rid, rec in self.runs.items()}

    @property
    def on_device(self) -> int | None:
        """The run whose state is active on the device now, or None."""
        return self.executor.on_device

    @property
    def write_wait_s(self) -> float:
        """Engine time spent waiting for the checkpoint writer (``rapidfire bench``)."""
        return self.persistence.write_wait_s

    @property
    def draining(self) -> bool:
        """True once ``drain`` asked the loop to leave (``Experiment.end``)."""
        return self._draining

    def ops_pending(self) -> bool:
        """True while a submitted op has not been applied yet."""
        return not self.ops.empty() or bool(self._held_ops)

    def thread_alive(self) -> bool:
        t = self.thread
        return t is not None and t.is_alive()

    def busy(self, timeout: float = -1) -> bool:
        """True while a run is pending/running, an op is queued or a chunk is in flight; also
        True when the engine's lock is not free within ``timeout`` seconds (-1: wait for it)."""
        if not self.lock.acquire(timeout=timeout):
            return True
        try:
            return (any(r.status in R.ACTIVE for r in self.runs.values()) or self.ops_pending()
                    or bool(self.executor.inflight))
        finally:
            self.lock.release()

    def in_own_thread(self) -> bool:
        """True in the engine thread or the checkpoint writer's (where event listeners run)."""
        me = threading.current_thread()
        return me is self.thread or self.persistence.writer.is_worker(me)

    def boundary_weights(self, run_id: int) -> dict | None:
        """A run's weights at its last chunk boundary: from its live trainer while that chunk's
        checkpoint is being written (the run cannot train meanwhile), else from its checkpoint."""
        with self.lock:
            # the writer needs this lock to finish the job: pending cannot end while it is held
            if self.persistence.writer.pending(run_id):
                weights = self.executor.live_weights(run_id)
                if weights is not None:
                    return weights
        ckpt = self.store.load_checkpoint(run_id)
        return ckpt["trainer"]["weights"] if ckpt else None

    def run_weights(self, run_id: int) -> dict | None:
        """A run's current weights: live if it has a trainer, else its last checkpoint's."""
        with self.lock:
            weights = self.executor.live_weights(run_id)
            if weights is not None:
                return weights
        ckpt = self.store.load_checkpoint(run_id)
        return ckpt["trainer"]["weights"] if ckpt else None

    def weights_missing(self, rec: RunRecord) -> bool:
        """Cheap (no file read): True when a warm clone of ``rec`` would have nothing to start
        from although ``rec`` has trained or started warm."""
        with self.lock:
            if (rec.run_id in self.executor.live_run_ids()
                    or self.executor.start_weights(rec.run_id) is not None):
                return False
        if self.store.checkpoint_path(rec.run_id).exists():
            return False
        if rec.warm_start and self.store.warm_start_path(rec.run_id).exists():
            return False
        return weights_lost(rec)

    def _fingerprint_of(self, run_id: int) -> str | None:
        rec = self.runs.get(run_id)
        return rec.spec.fingerprint() if rec is not None else None

    # -- status -------------------------------------------------------------------------------
    def _set_status(self, rec: RunRecord, status: str, error: str | None = None,
                    reason: str | None = None, save: bool = True, pruned: bool = False) -> None:
        with self.lock:
            if rec.status == status:
                return
            old = rec.status
            rec.set_status(status)
            if error is not None:
                rec.error = error
            # every stop says whether a pruner made it: a stop without the field is from a log
            # written before it existed (engine/events.py reads those)
            flags = {"pruned": pruned} if status == R.STOPPED else {}
            self.events.append("run_status", run_id=rec.run_id, status=status, error=error, reason=reason,
                               **flags)
            # pending -> running needs no write: a restart reads "running" as "pending" anyway
            if save and not (old == R.PENDING and status == R.RUNNING):
                self.save_runs()

    def _complete(self, rec: RunRecord) -> None:
        """Writer thread, once a run's last chunk is durable."""
        with self.lock:
            if rec.status in R.ACTIVE:
                self._set_status(rec, R.COMPLETED, save=False)  # the engine frees it

    # -- thread -------------------------------------------------------------------------------
    def start(self) -> None:
        with self.lock:
            if self.closed:
                raise RapidFireError("this experiment has ended; create a new Experiment")
        # the executor's own start (Ray and its workers the first time): in the caller's thread,
        # so that its errors show where the loop was asked for
        self.executor.open()
        with self.lock:
            if self.closed:   # closed while the executor opened: no loop on a closed engine
                raise RapidFireError("this experiment has ended; create a new Experiment")
            if self.thread is not None and self.thread.is_alive() and not self._leaving:
                return
            self._leaving = False
            self.thread = threading.Thread(target=self._main, name="rapidfire-engine", daemon=True)
            self.thread.start()

    def submit(self, op: Op) -> None:
        """Queue an op (validated by the caller); the engine applies it at the next chunk boundary."""
        with self.lock:   # the queued list and the queue change together (``project`` reads both)
            self._queued.append(op)
            self.ops.put(op)
        self.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no run is pending or running and no op is queued; False on timeout, or when
        nothing will move the remaining runs (the engine stopped; see logs/engine.log)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            t = self.thread
            if t is None or not t.is_alive():
                if not self.lock.acquire(timeout=-1 if deadline is None
                                         else max(0.0, deadline - time.monotonic())):
                    return False
                try:
                    if self.thread is not t:
                        continue                  # a new thread took over
                    ops_queued = not self.ops.empty()
                    active = any(r.status in R.ACTIVE for r in self.runs.values())
                finally:
                    self.lock.release()
                if not ops_queued and not active:
                    return True
                if t is None or self.closed or self._draining or not ops_queued:
                    return False  # nothing will move these runs (see logs/engine.log)
                # an op is between submit's put() and start(): let it start the thread
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
                continue
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0:
                # by the deadline whatever the engine thread does (it may hold the lock)
                return not self.busy(timeout=0) and not (self.thread and self.thread.is_alive())
            t.join(timeout=0.2 if remaining is None else min(0.2, remaining))

    def drain(self) -> None:
        """Ask the loop to leave at the next chunk boundary and wait for it; ops accepted before
        are applied (or refused, logged), never dropped. The caller's thread, never the engine's."""
        with self.lock:
            self._draining = True
        t = self.thread
        if t is not None:
            t.join()
        # an op submitted while the thread was already leaving (put, but its start() not yet run)
        # is applied here, in this thread: the engine's has gone and the writer is drained first
        while not self.ops.empty():
            t = self.thread
            if t is not None and t.is_alive():
                t.join()
                continue
            self.persistence.writer.flush()
            with self.lock, self._routed_here():
                self._settle_writes()
                self._apply_ops()

    def end_unfinished(self, ended_reason: str) -> list[int]:
        """After ``drain``: runs still pending or running become ``stopped`` (their last
        chunk-boundary checkpoint stays), or ``completed`` when their last chunk is on disk. Returns
        the ids stopped."""
        stopped = []
        with self.lock:
            for rec in self.runs.values():
                if rec.status not in R.ACTIVE:
                    continue
                if rec.completed_steps >= rec.total_steps:   # its last chunk is on disk already
                    self._set_status(rec, R.COMPLETED, reason="finished as the experiment ended")
                else:
                    self._set_status(rec, R.STOPPED, reason=ended_reason)
                    stopped.append(rec.run_id)
        return stopped

    def close(self) -> None:
        try:
            # normally idle already: the loop flushes before it leaves; inside the try so that an
            # interrupt while it waits still gives the executor's resources (Ray's GPUs) back
            self.persistence.writer.flush()
            with self.lock, self._routed_here():
                self.closed = True
                self._settle_writes()
                for rid in list(self.executor.live_run_ids()):
                    self._release(self.runs[rid])
        finally:
            self.executor.close()

    @contextlib.contextmanager
    def _routed_here(self):
        """Engine work done in the caller's thread (after the engine thread left): its warnings go
        to the engine's log, like those of the engine thread."""
        log_path = self.store.root / "logs" / "engine.log"
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open_append_text(log_path)
        except OSError:   # a full or read-only disk: the warnings are not worth failing for
            log_file = None
        try:
            with routed_to(log_file):
                yield
        finally:
            if log_file is not None:
                log_file.close()

    def _main(self) -> None:
        log_path = self.store.root / "logs" / "engine.log"
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # local: a thread started while this one cleans up opens its own file and handler
            log_file = open_append_text(log_path)
        except OSError:
            # a log that cannot be opened (a file named logs, no permission, a full disk) costs
            # the engine's warnings, never the runs: a thread that died here would leave them
            # pending for ever with the engine still reporting itself busy
            log_file = _DiscardedLog()
        self._log_file = log_file
        me = threading.get_ident()
        handler = logging.StreamHandler(log_file)
        handler.addFilter(lambda r: threading.get_ident() == me)
        handler.handleError = lambda record: None   # a full disk: no traceback on stderr
        try:
            # routed first: the console filters go on the handlers that exist then, not on ours
            with routed_to(log_file):
                for name in LIBRARY_LOGGERS:
                    logging.getLogger(name).addHandler(handler)
                try:
                    self._loop()
                except BaseException:  # the loop itself must never die silently
                    log_file.write(traceback.format_exc())
                finally:
                    with self.lock:
                        if threading.current_thread() is self.thread:
                            self._leaving = True
                    for name in LIBRARY_LOGGERS:
                        logging.getLogger(name).removeHandler(handler)
        finally:
            log_file.close()

    def _routed(self, job: Callable[[], None]) -> None:
        """Writer thread: its warnings go to the log, as the engine's do."""
        with routed_to(self._log_file):
            job()

    def _loop(self) -> None:
        """The one control loop, over the executor's slots (one in the kernel, one per Ray worker),
        as named steps. Each turn: at a chunk boundary the AutoML hook (``_boundary_step``); then,
        under the lock, ops and dispatch (``_ops_and_dispatch_step``), which says what comes next:
        flush the writer first, wait for a replacement worker, go round again, leave, or collect
        the chunks that come back and book them (``_collect_and_book_step``)."""
        self.executor.begin(self)
        at_boundary = True    # the AutoML hook runs at chunk boundaries, not at every poll
        while True:
            with self.lock:
                if at_boundary:
                    self._boundary_step()
                step = self._ops_and_dispatch_step()
            if step is _Next.LEAVE:
                return
            if step is _Next.PAUSE:       # every worker died: their replacements are starting
                time.sleep(_POLL_S)
                at_boundary = False
            elif step is _Next.AGAIN:     # ops came in while the turn ran: apply them first
                at_boundary = True
            elif step is _Next.FLUSH:
                if self._flush_step():
                    return
                # back to the top: ops that waited for this flush are applied before any other
                # reply is booked (a pruner's stop lands where the kernel puts it)
                at_boundary = True
            else:
                at_boundary = self._collect_and_book_step()

    def _boundary_step(self) -> None:
        """Under the lock, at a chunk boundary: the AutoML hook's decisions, acted on."""
        if self.boundary_hook is None or self._draining:
            return
        try:
            self._boundary()
        except Exception:   # a policy bug must not kill training: logged, ignored
            self._log_file.write("boundary hook failed:\n" + traceback.format_exc())

    def _ops_and_dispatch_step(self) -> _Next:
        """Under the lock: apply ops (once the writer has caught up), give every free slot a
        chunk, and say what the loop does next."""
        ex = self.executor
        writer = self.persistence.writer
        if self._draining:
            # chunks in flight come back first, and are booked
            return _Next.COLLECT if ex.inflight else _Next.FLUSH
        if self.ops_pending() and writer.busy():
            return _Next.FLUSH   # ops see every finished chunk on disk and in the log
        self._settle_writes()
        if not writer.busy():
            # only this thread submits writes: the writer stays idle while ops apply; an op
            # queued meanwhile waits for the next turn (flush, then apply)
            self._apply_ops()
        self._dispatch()
        if ex.inflight:
            if not ex.waiting() and writer.busy() and self._reply_due() is None:
                return _Next.FLUSH   # the reply due next waits for its run's checkpoint write
            return _Next.COLLECT
        if writer.busy():
            # a finishing run's checkpoint is in flight, or the next choice's own last chunk:
            # its write first, so that the training order (and AutoML's decisions) never
            # depends on the writer's speed
            return _Next.FLUSH
        if self.ops_pending():
            return _Next.AGAIN
        if self.executor.recovering(self):
            return _Next.PAUSE
        self._leave_step()
        return _Next.LEAVE

    def _leave_step(self) -> None:
        """Under the lock: nothing left to train."""
        self.executor.leaving(self)
        self._leaving = True  # under the lock: a later submit starts a new thread
        _collect_garbage(full=False)

    def _flush_step(self) -> bool:
        """Wait for the checkpoint writer (outside the lock: its follow-ups take it). True when
        the loop leaves: a drain found nothing in flight any more."""
        self.persistence.flush()
        with self.lock:
            if self._draining and not self.executor.inflight:
                self._settle_writes()
                # ops accepted before end(wait=False) are applied (or refused, logged), never
                # dropped: a returned clone id must exist, a user stop must stay one
                self._apply_ops()
                return True
        return False

    def _collect_and_book_step(self) -> bool:
        """Wait for a chunk to come back and book the one whose turn it is (counters,
        checkpoint, events). True when a chunk boundary was reached (booked, or lost)."""
        ex = self.executor
        due = self._take_reply()
        if due is None:
            with self.lock:
                wait = _WRITE_POLL_S if self.persistence.writer.busy() and ex.arrived else _POLL_S
            results = ex.collect(wait)
            with self.lock:   # every death seen in this batch counts before any is logged
                for flight, _, exc in results:
                    if exc is not None and ex.is_death(exc):
                        flight.slot.alive = False
            lost = False
            for flight, reply, exc in results:
                with self.lock:
                    if exc is None:
                        ex.arrive(flight, reply)
                    else:
                        lost = True
                        self._chunk_lost(flight, exc)
            due = self._take_reply()
            if due is None:
                return lost
        self._book(*due)
        return True

    def _take_reply(self) -> tuple | None:
        """The reply to book now (``_reply_due``), taken out of ``executor.arrived``. Booking while
        the previous checkpoint is still being written would wait for that write, deaf to the
        slots still training: while they train, a reply is booked once the write is done."""
        with self.lock:
            if self.persistence.writer.busy() and self.executor.waiting():
                return None
            rid = self._reply_due()
            return None if rid is None else self.executor.arrived.pop(rid)

    def _reply_due(self) -> int | None:
        """Under the lock: the run whose reply is to be booked now, or None.

        Without AutoML, replies are booked as they come back. With a boundary hook (pruners,
        RFOptuna) what the hook decides depends on the order in which it sees chunks, so an
        executor whose replies may come back out of order has them booked in the order the
        kernel trains chunks (``fair_choice``, the run booked last breaking ties as the run on the
        device does there); a reply that comes back early waits for its turn. The hook then sees
        the same sequence of states as in the kernel and decides the same. While draining,
        whatever came back is booked as it is."""
        arrived = self.executor.arrived
        if not arrived:
            return None
        if self.boundary_hook is None or self._draining or not self.executor.reorders():
            return next(iter(arrived))
        rid = self.fair_choice(last=self._last_booked)
        return rid if rid in arrived else None

    def _dispatch(self) -> None:
        """Under the lock: every free slot gets the chunk the executor's policy picks for it
        (once the executor's ``tick`` says slots are up)."""
        if not self.executor.tick(self):
            return
        for slot, rid in self.executor.assignments(self):
            rec = self.runs[rid]
            try:
                self.executor.dispatch(slot, rec, self.store.load_checkpoint)
            except Exception as exc:   # an unreadable checkpoint fails this run, not the engine
                self._fail(rec, exc)
                continue
            if rec.status == R.PENDING:
                self._set_status(rec, R.RUNNING)

    def _book(self, flight, reply) -> None:
        """A chunk came back and its turn has come: its counters, checkpoint and events."""
        with self.lock:
            rec = self.runs.get(flight.run_id)
            if rec is None or rec.status == R.DELETED:
                # deleted while its chunk trained: dropped, as its checkpoints were
                self.executor.drop(flight)
                return
            self._last_booked = flight.run_id
            try:
                result = self.executor.book(flight, reply)
            except Exception as exc:   # the chunk failed where it trained
                result, error = None, exc
            else:
                error = None
        if error is not None:
            self._fail(rec, error)
            return
        try:
            self._record_chunk(rec, result)
        except Exception as exc:  # failure isolation: this run fails, the others go on
            self._fail(rec, exc)

    def _chunk_lost(self, flight, exc: BaseException) -> None:
        """Under the lock: a dispatched chunk came back as an error instead of a reply: its slot
        lost (the executor's to handle), or its run failed."""
        if self.executor.lost(self, flight, exc):
            return
        self.executor.drop(flight)
        rec = self.runs.get(flight.run_id)
        if rec is not None:
            self._fail(rec, exc)

    def fair_choice(self, last: int | None = None) -> int | None:
        """Under the lock: the run the fair policy trains next on this device, whatever the
        checkpoint writer is doing (a finished run whose last write is pending is not a choice).
        ``last``: the run trained last, which goes after the runs it ties with (default: the one
        on the device)."""
        views = [RunView(r.run_id, r.progress, r.status in R.ACTIVE
                         and not (0 < r.total_steps <= r.completed_steps))
                 for r in self.runs.values()]
        return choose_fair(views, self.executor.on_device if last is None else last)

    def _record_chunk(self, rec: RunRecord, result) -> None:
        counters = result.counters
        with self.lock:
            for k, v in result.restored.items():
                setattr(rec, k, v)
            before = {k: getattr(rec, k) for k in counters}
            self.persistence.mark_unwritten(rec.run_id, before)
            for k, v in counters.items():
                setattr(rec, k, v)
            if result.eval_metrics:
                rec.last_metrics.update(result.eval_metrics)
        self.persistence.submit_chunk(rec, result.state, result.events, result.chunk_event,
                                      result.done, before, self._complete, self._routed)

    def _settle_writes(self) -> None:
        """Engine thread, under the lock: act on what the writer finished (failed writes, runs that
        completed) - things only this thread may do, because they touch the shared model."""
        for rec, exc, counters in self.persistence.take_failures():
            for k, v in (counters or {}).items():   # the chunk did not count: back to the last checkpoint
                setattr(rec, k, v)
            self._fail(rec, exc)
        for rid in [rid for rid in self.executor.live_run_ids() if self.runs[rid].status == R.COMPLETED]:
            # its final weights are in its checkpoint (export, warm clones and run_weights read
            # them there): memory must not grow with finished runs. No full gc.collect() (slow
            # with transformers loaded): the big tensors go by refcount; cycles when idle.
            self._release(self.runs[rid], collect=False)

    # -- ops ----------------------------------------------------------------------------------
    def _apply_ops(self) -> None:
        """Queued ops applied (engine/ops.py); one collection for a batch that deleted runs: a
        gc.collect() is slow with transformers loaded, and every op queued behind would wait."""
        if ops.apply_queued(self):
            _collect_garbage()

    def _release(self, rec: RunRecord, collect: bool = True) -> None:
        """Free a run's trainer, optimizer, adapter and device memory."""
        self.executor.release(rec)
        if collect and self.executor.frees_local_memory:
            _collect_garbage()

    def _fail(self, rec: RunRecord, exc: BaseException) -> None:
        """Failure isolation: this run fails (its reason and error as its executor reads the
        exception), the others go on."""
        reason, error = self.executor.failure(exc)   # outside the lock: it only reads exc
        with self.lock:
            self._release(rec)
            if rec.status not in R.TERMINAL:
                self._set_status(rec, R.FAILED, error=error, reason=reason)
