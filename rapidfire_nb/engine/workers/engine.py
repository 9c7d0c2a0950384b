"""``WorkerEngine``: the in-kernel controller, with chunks trained by Ray workers.

Everything the kernel's engine does stays here and unchanged: the op queue, the event log, the
checkpoint writer (checkpoint first, then the chunk's events), runs.json, the AutoML boundary
hook, recovery. What changes is the loop: instead of training one chunk itself it keeps every
live worker busy with one chunk, collects whichever finishes first, and hands its snapshot to the
writer exactly as the kernel's engine hands its own.

Where a run trains (see policy.py): on the worker that holds its trainer while it can; it moves
only at a chunk boundary, by shipping its last checkpoint to the new worker. The experiment folder
is the controller's alone; state travels through Ray's object store, so workers on other machines
need no shared file system.

Ops that touch a run whose chunk is in flight (stop, resume, delete, clone of it) are held until
that chunk has come back and its checkpoint is written, then applied in their order: they see the
run at a chunk boundary, as in the kernel.

A worker that dies loses only the chunk it was training: the run's counters move only when a
chunk's result arrives, so the run is simply scheduled again, on another worker, from its last
checkpoint; the runs the dead worker held continue the same way. A ``worker_lost`` event says what
happened. If no worker is left, the active runs are stopped (resumable); resuming one starts
replacement workers.
"""

from __future__ import annotations

import copy
import queue
import time
import traceback
from dataclasses import dataclass

from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.controller import Engine
from rapidfire_nb.engine.scheduler import RunView
from rapidfire_nb.engine.workers.policy import choose_for_worker
from rapidfire_nb.engine.workers.pool import RayWorkerPool, WorkerSlot
from rapidfire_nb.engine.workers.worker import COUNTERS

# what a chunk advances (the kernel's engine restores these if the checkpoint write fails)
_CHUNK_COUNTERS = ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done")
_PLACEMENT_S = 300.0   # how long a new worker may take to start (imports, a node to come up)
_POLL_S = 0.1   # how long the loop waits for a chunk before looking at the op queue again


@dataclass
class _Flight:
    run_id: int
    slot: WorkerSlot
    ref: object
    epoch: int
    chunk: int
    sent: float
    moved: bool


class WorkerEngine(Engine):
    def __init__(self, *args, num_workers: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = RayWorkerPool(num_workers, self.create_model, self.train_dataset,
                                  self.eval_dataset, self.num_chunks, self.seed, self.build_args,
                                  self.build_lora, self.offload)
        self.inflight: dict[int, _Flight] = {}
        self.home: dict[int, WorkerSlot] = {}   # run id -> the live worker holding its trainer
        self._held_ops: list = []
        self.hops: list[dict] = []              # per chunk: round trip vs time inside the worker
        self.moves = 0
        self._described = False

    # -- thread ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.pool.start()   # Ray and the actors: the first time in run_fit's thread, errors show
        super().start()

    def busy(self) -> bool:
        with self.lock:
            return super().busy() or bool(self._held_ops) or bool(self.inflight)

    def _describe_workers(self) -> None:
        """Once per loop start: replace dead workers, learn where each one runs, log it."""
        ray = self.pool.ray
        with self.lock:
            self.pool.top_up()
            slots = [s for s in self.pool.live() if not s.info]
        if not slots:
            return
        refs = {s.actor.describe.remote(): s for s in slots}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=_PLACEMENT_S)
        for ref in ready:
            slot = refs[ref]
            try:
                slot.info = ray.get(ref)
            except Exception as exc:   # its constructor failed
                with self.lock:
                    self._worker_lost(slot, exc, None)
        for ref in late:               # never placed: it would hold its chunks forever
            slot = refs[ref]
            self.pool.kill(slot)
            with self.lock:
                self._worker_lost(slot, TimeoutError(
                    f"worker {slot.name} was not placed on the Ray cluster within {_PLACEMENT_S:.0f} s "
                    f"(resources it asks for: {self.pool.resources})"), None)
        self.events.append("workers", workers=[{"worker": s.name, **s.info} for s in slots if s.info],
                           resources=dict(self.pool.resources))

    def _loop(self) -> None:
        self._describe_workers()
        boundary = True    # the AutoML hook runs at chunk boundaries, not at every poll
        while True:
            flush = False
            jobs = []
            with self.lock:
                if boundary and self.boundary_hook is not None and not self.stop_all:
                    try:
                        self.boundary_hook()
                    except Exception:   # a policy bug must not kill training: logged, ignored
                        self._log_file.write("boundary hook failed:\n" + traceback.format_exc())
                boundary = False
                ops_waiting = not self.ops.empty() or bool(self._held_ops)
                if self.stop_all:
                    flush = not self.inflight
                elif ops_waiting and self.writer.busy():
                    flush = True   # ops see every finished chunk on disk and in the log
                else:
                    self._settle_writes()
                    if not self.writer.busy():
                        self._apply_ops()
                    self._dispatch()
                    if not self.inflight:
                        if self.writer.busy():
                            flush = True
                        elif self.ops.empty() and not self._held_ops:
                            self._leaving = True
                            return
                        else:
                            continue
            if flush:
                t0 = time.perf_counter()
                self.writer.flush()
                self.write_wait_s += time.perf_counter() - t0
                with self.lock:
                    if self.stop_all and not self.inflight:
                        self._settle_writes()
                        self._apply_ops()
                        return
                if not self.inflight:
                    continue
            for flight, result, exc in self._collect():
                with self.lock:
                    job = self._finish(flight, result, exc)
                if job is not None:
                    jobs.append(job)
                boundary = True
            for job in jobs:
                self._submit_write(*job)

    def _collect(self):
        """Wait up to _POLL_S for chunks in flight; (flight, result, error) of each finished one."""
        ray = self.pool.ray
        with self.lock:
            by_ref = {f.ref: f for f in self.inflight.values()}
        if not by_ref:
            return []
        if not ray.is_initialized():   # ray.shutdown() under us: every worker is gone
            gone = RuntimeError("the Ray session ended (ray.shutdown())")
            return [(f, None, gone) for f in by_ref.values()]
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=_POLL_S)
        if ready:
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        out = []
        for ref in ready:
            flight = by_ref[ref]
            try:
                out.append((flight, ray.get(ref), None))
            except Exception as exc:
                out.append((flight, None, exc))
        return out

    # -- dispatch -----------------------------------------------------------------------------
    def _views(self) -> list[RunView]:
        return [RunView(r.run_id, r.progress, r.status in R.ACTIVE,
                        busy=r.run_id in self.inflight or self.writer.pending(r.run_id))
                for r in self.runs.values()]

    def _dispatch(self) -> None:
        """Under the lock: give every idle worker the chunk the policy picks for it."""
        if not self.pool.live():
            self._no_worker_left()
            return
        live = len(self.pool.live())
        for allow_move in (False, True):
            for slot in self.pool.idle():
                home = {rid: s.index for rid, s in self.home.items() if s.alive}
                rid = choose_for_worker(self._views(), slot.index, home, slot.last, allow_move, live)
                if rid is not None:
                    self._send(slot, self.runs[rid])

    def _send(self, slot: WorkerSlot, rec) -> None:
        rid = rec.run_id
        record = checkpoint = warm = None
        if self.home.get(rid) is not slot:
            # the run (re)arrives on this worker: it continues from its last checkpoint
            old = self.home.pop(rid, None)
            if old is not None and old.alive:
                self.pool.release(old, rid)
                self.moves += 1
            try:
                checkpoint = self.store.load_checkpoint(rid)
                if checkpoint is None:
                    warm = self.pending_weights.get(rid)
                    if warm is None and rec.warm_start:
                        warm = self.store.load_warm_start(rid)
            except Exception as exc:   # an unreadable checkpoint fails this run, not the engine
                self._fail(rec, exc)
                return
            record = copy.copy(rec)
            record.last_metrics = {}
        if rec.status == R.PENDING:
            self._set_status(rec, R.RUNNING)
        counters = {k: getattr(rec, k) for k in COUNTERS}
        ref = slot.actor.train_chunk.remote(rid, counters, record, checkpoint, warm)
        slot.busy_with, slot.last = rid, rid
        self.home[rid] = slot
        self.inflight[rid] = _Flight(rid, slot, ref, rec.epoch, rec.chunk, time.perf_counter(),
                                     moved=record is not None)

    def _no_worker_left(self) -> None:
        for rec in self.runs.values():
            if rec.status in R.ACTIVE:
                self._set_status(rec, R.STOPPED, reason="every Ray worker was lost (see the "
                                 "worker_lost events); resume the run to continue it on new workers")

    # -- results ------------------------------------------------------------------------------
    def _finish(self, flight: _Flight, result: dict | None, exc: BaseException | None):
        """Under the lock: book a finished chunk; returns the write to submit (outside the lock)."""
        round_trip = time.perf_counter() - flight.sent
        rid, slot = flight.run_id, flight.slot
        self.inflight.pop(rid, None)
        slot.busy_with = None
        rec = self.runs.get(rid)
        if exc is not None:
            if self.pool.is_death(exc) or not self.pool.ray.is_initialized():
                self._worker_lost(slot, exc, flight)
            elif rec is not None:
                self._fail_remote(rec, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return None
        if rec is None or rec.status == R.DELETED:
            return None    # deleted while its chunk trained: the chunk is dropped, as its checkpoints
        if not result["ok"]:
            self.home.pop(rid, None)   # the worker freed the run already
            self._fail_remote(rec, result["error"], result["reason"])
            return None
        after = result["counters"]
        before = {k: getattr(rec, k) for k in _CHUNK_COUNTERS}
        self._unwritten[rid] = before
        for k in _CHUNK_COUNTERS + ("total_steps", "steps_per_epoch"):
            setattr(rec, k, after[k])
        rec.last_metrics.update(result["last_metrics"])
        event = result["chunk_event"]
        event["hop_s"] = max(0.0, round_trip - result["worker_s"])
        event["moved"] = flight.moved
        self.hops.append({"run_id": rid, "worker": slot.name, "round_trip_s": round_trip,
                          "worker_s": result["worker_s"], "hop_s": event["hop_s"],
                          "train_s": event.get("train_s", 0.0), "moved": flight.moved})
        return rec, result["state"], result["events"], event, result["done"], before

    def _submit_write(self, rec, state, batch, chunk_event, done, before) -> None:
        if self.writer.busy():
            # at most one checkpoint in flight, as in the kernel's engine
            t0 = time.perf_counter()
            self.writer.flush()
            self.write_wait_s += time.perf_counter() - t0
        self.writer.submit(rec.run_id, lambda: self._persist(rec, state, batch, chunk_event, done, before))

    def _worker_lost(self, slot: WorkerSlot, exc: BaseException, flight: _Flight | None) -> None:
        slot.alive = False
        slot.busy_with = None
        held = sorted(rid for rid, s in self.home.items() if s is slot)
        for rid in held:
            del self.home[rid]
        lost = None
        if flight is not None:
            lost = {"run_id": flight.run_id, "epoch": flight.epoch, "chunk": flight.chunk}
        reason = f"{type(exc).__name__}: {exc}"
        self.events.append("worker_lost", worker=slot.name, node=slot.info.get("node"),
                           reason=reason[:2000], runs=held, chunk_lost=lost,
                           workers_left=len(self.pool.live()))

    def _fail_remote(self, rec, tb: str, reason: str) -> None:
        self._release(rec, collect=False)
        if rec.status not in R.TERMINAL:
            self._set_status(rec, R.FAILED, error=tb, reason=reason)

    # -- ops, releases ------------------------------------------------------------------------
    def _apply_ops(self) -> None:
        """Apply queued ops, holding (in order) those on a run whose chunk is in flight."""
        drained = []
        while True:
            try:
                drained.append(self.ops.get_nowait())
            except queue.Empty:
                break
        blocked = set(self.inflight)
        held, ready = [], []
        for op in self._held_ops + drained:
            ids = {op.run_id} | ({op.new_run_id} if op.new_run_id is not None else set())
            if ids & blocked:
                held.append(op)
                blocked |= ids      # later ops on these runs wait behind it
            else:
                ready.append(op)
        self._held_ops = held
        for op in ready:
            self.ops.put(op)
        super()._apply_ops()

    def _settle_writes(self) -> None:
        super()._settle_writes()
        for rid in [rid for rid in self.home if self.runs[rid].status == R.COMPLETED]:
            self._release(self.runs[rid], collect=False)

    def _release(self, rec, collect: bool = True) -> None:
        slot = self.home.pop(rec.run_id, None)
        if slot is not None:
            self.pool.release(slot, rec.run_id)
        super()._release(rec, collect=False)   # nothing trains here: no local memory to collect

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.pool.shutdown()
