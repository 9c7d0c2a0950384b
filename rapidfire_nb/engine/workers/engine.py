"""``WorkerEngine``: the in-kernel controller, with chunks trained by Ray workers.

Everything the kernel's engine does stays as it is: the op queue, the event log, the checkpoint
writer (checkpoint first, then the chunk's events), runs.json, the AutoML boundary hook, recovery.
Two things change:

- the chunk executor (engine/executor.py) is ``RemoteChunkExecutor``: ``dispatch`` starts a chunk
  on a worker, and ``train_chunk`` hands the engine the result of the one that came back, so the
  engine books it with its own code (``Engine._train_chunk``);
- the loop keeps every live worker busy with one chunk, and books whichever finishes first.

Where a run trains (see policy.py): on the worker that holds its trainer while it can; it moves only
at a chunk boundary, by shipping its last checkpoint to the new worker. The experiment folder is
the controller's alone; state travels through Ray's object store, so workers on other machines need
no shared file system.

Ops that touch a run whose chunk is in flight (stop, resume, delete, a clone of it) are held until
that chunk has come back and its checkpoint is written, then applied in order: they see the run at
a chunk boundary, as in the kernel.

A worker that dies loses only the chunk it was training: a run's counters move only when a chunk's
result is booked, so the run is simply scheduled again, on another worker, from its last checkpoint;
the other runs the dead worker held continue the same way. A ``worker_lost`` event says what
happened. With no worker left the active runs are stopped (resumable); resuming one starts
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
from rapidfire_nb.engine.executor import ChunkExecutor, ChunkResult
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.scheduler import RunView
from rapidfire_nb.engine.workers.policy import choose_for_worker
from rapidfire_nb.engine.workers.pool import RayWorkerPool, WorkerSlot, plain, root_line
from rapidfire_nb.engine.workers.worker import COUNTERS, pack_tensors, unpack_tensors
from rapidfire_nb.errors import RapidFireError

_PLACEMENT_S = 300.0   # how long a new worker may take to start (imports, a node to come up)
# replacements of dead workers stop after this many workers in a row died before training a
# chunk (a create_model the workers cannot unpickle, a GPU that fails at once): no endless loop
MAX_FAILED_STARTS = 3
_POLL_S = 0.1          # how long the loop waits for a chunk before looking at the op queue again
_WRITE_POLL_S = 0.005  # ... and before looking whether the checkpoint writer is done


def on_controller_clock(start: float, end: float, lo: float, hi: float) -> float:
    """The shift that puts a chunk's [start, end], read on its worker's clock, on the controller's.

    The chunk ran between the controller's dispatch (``lo``) and the moment it saw the reply
    (``hi``), both on the controller's clock; a worker on another node may have a clock that is off
    by more than that. Shifting by the least amount that brings the chunk inside [lo, hi] leaves
    a worker with the same clock alone (0.0) and otherwise errs by at most the hop, so the
    timeline places chunks and the controller's own events (worker_lost) consistently."""
    if end - start >= hi - lo:
        return lo - start
    if start < lo:
        return lo - start
    if end > hi:
        return hi - end
    return 0.0


def _root_cause(exc: BaseException) -> str:
    """One plain line for a stop reason (see ``pool.root_line``), after the error's type."""
    return f"{type(exc).__name__}: {root_line(exc)}"[:300]


class WorkerTrainingError(RapidFireError):
    """A run's chunk raised on its worker: ``reason`` is the kernel's one line ("Type: message"),
    ``traceback`` the worker's traceback (the run's ``error``, as in the kernel)."""

    def __init__(self, reason: str, tb: str = ""):
        super().__init__(reason)
        self.reason, self.traceback = reason, tb or reason


@dataclass
class Flight:
    run_id: int
    slot: WorkerSlot
    ref: object
    epoch: int
    chunk: int
    sent: float
    moved: bool
    arrived: float = 0.0   # when the controller saw the reply ready (perf_counter)
    sent_wall: float = 0.0  # time.time() at dispatch, against the worker's own clock readings
    noticed_wall: float = 0.0
    got_s: float = 0.0      # ray.get of the reply: transfer and unpickling of the snapshot


class RemoteChunkExecutor(ChunkExecutor):
    """The controller's side of the workers: which worker holds which run, and the results."""

    on_device = None   # several devices: no single one

    def __init__(self, pool: RayWorkerPool):
        self.pool = pool
        self.home: dict[int, WorkerSlot] = {}     # run -> the live worker holding its trainer
        self.inflight: dict[int, Flight] = {}
        self.start: dict[int, dict] = {}          # warm clones' starting weights (shipped on arrival)
        self._collected: dict[int, tuple] = {}    # run -> (result, error) for Engine._train_chunk
        # replies back but not booked yet (with AutoML: booked in the kernel's order); their
        # flights stay in ``inflight`` until booked, so ops on those runs still wait for them
        self.arrived: dict[int, tuple[Flight, dict]] = {}
        self._boundary: dict[int, dict] = {}      # run -> weights of a chunk whose write is pending
        self.write_pending = lambda run_id: False   # set by the engine (its writer)
        self.moves = 0
        self.hops: list[dict] = []                # per chunk: round trip vs time inside the worker

    # -- ChunkExecutor interface ----------------------------------------------------------------
    def live_weights(self, run_id: int) -> dict | None:
        """The weights of a chunk that came back and is being written (the checkpoint on disk is
        older until then); else None: the last checkpoint is the run's boundary."""
        weights = self._boundary.get(run_id)
        if weights is not None and not self.write_pending(run_id):
            del self._boundary[run_id]
            return None
        return weights

    def set_start_weights(self, run_id: int, weights: dict) -> None:
        self.start[run_id] = weights

    def start_weights(self, run_id: int) -> dict | None:
        return self.start.get(run_id)

    def live_run_ids(self) -> list[int]:
        return list(self.home)

    def release(self, rec: RunRecord) -> None:
        slot = self.home.pop(rec.run_id, None)
        if slot is not None:
            self.pool.release(slot, rec.run_id)
        self.start.pop(rec.run_id, None)
        self._boundary.pop(rec.run_id, None)

    def train_chunk(self, rec: RunRecord) -> ChunkResult:
        """The result of the chunk of ``rec`` that came back (the loop collected it)."""
        result, error = self._collected.pop(rec.run_id)
        if error is not None:
            raise WorkerTrainingError(*error)
        return result

    # -- dispatch -------------------------------------------------------------------------------
    def dispatch(self, slot: WorkerSlot, rec: RunRecord, load_checkpoint) -> None:
        """Start the next chunk of ``rec`` on ``slot`` (under the engine lock). A run new to this
        worker brings its last checkpoint, else a warm clone's starting weights, else nothing (a
        fresh run starts from its seeded initialisation there)."""
        rid = rec.run_id
        record = checkpoint = start = None
        if self.home.get(rid) is not slot:
            old = self.home.pop(rid, None)
            if old is not None and old.alive:
                self.pool.release(old, rid)
                self.moves += 1
            checkpoint = load_checkpoint(rid)
            if checkpoint is None:
                start = self.start.get(rid)
            record = copy.copy(rec)
            record.last_metrics = {}
        counters = {k: getattr(rec, k) for k in COUNTERS}
        ref = slot.actor.train_chunk.remote(rid, counters, record, pack_tensors(checkpoint),
                                            pack_tensors(start))
        slot.busy_with, slot.last = rid, rid
        self.home[rid] = slot
        self.inflight[rid] = Flight(rid, slot, ref, rec.epoch, rec.chunk, time.perf_counter(),
                                    moved=record is not None, sent_wall=time.time())

    def waiting(self) -> bool:
        """True while a worker trains a chunk whose reply has not come back."""
        return any(rid not in self.arrived for rid in self.inflight)

    def arrive(self, flight: Flight, reply: dict) -> None:
        """A reply came back: the worker is free; the engine books the reply in its turn."""
        if flight.slot.busy_with == flight.run_id:
            flight.slot.busy_with = None
        self.arrived[flight.run_id] = (flight, reply)

    def collect(self, timeout: float) -> list[tuple[Flight, dict | None, BaseException | None]]:
        """Wait up to ``timeout`` for chunks in flight; (flight, reply, error) of each one back."""
        ray = self.pool.ray
        by_ref = {f.ref: f for rid, f in self.inflight.items() if rid not in self.arrived}
        if not by_ref:
            time.sleep(0.005)   # only replies waiting for their turn: nothing to wait on here
            return []
        if not ray.is_initialized():   # ray.shutdown() under us: every worker is gone
            gone = RuntimeError("the Ray session ended (ray.shutdown())")
            return [(f, None, gone) for f in by_ref.values()]
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=0)
        out = []
        now, now_wall = time.perf_counter(), time.time()
        for ref in ready:
            flight = by_ref[ref]
            flight.arrived, flight.noticed_wall = now, now_wall
            try:
                reply = ray.get(ref)
                if reply.get("ok"):
                    reply["result"].state = unpack_tensors(reply["result"].state)
                flight.got_s = time.perf_counter() - now
                out.append((flight, reply, None))
            except Exception as exc:
                out.append((flight, None, exc))
        return out

    def book(self, flight: Flight, reply: dict) -> None:
        """A reply came back (under the engine lock): keep it for ``train_chunk``."""
        self.inflight.pop(flight.run_id, None)
        self.arrived.pop(flight.run_id, None)
        if flight.slot.busy_with == flight.run_id:
            flight.slot.busy_with = None
        # until it came back, not until its turn to be booked (waiting is not the hop's cost)
        round_trip = (flight.arrived or time.perf_counter()) - flight.sent
        if reply["ok"]:
            try:   # a base built on this worker for the first time (a replacement's)
                for key, fp in reply.get("fingerprints", {}).items():
                    self.pool.note_fingerprint(flight.slot.name, key, fp)
            except RapidFireError as exc:
                self.pool.release(flight.slot, flight.run_id)
                reply = {"ok": False, "reason": f"{type(exc).__name__}: {exc}", "error": str(exc)}
        if not reply["ok"]:
            self.home.pop(flight.run_id, None)   # the worker freed the run already
            self._collected[flight.run_id] = (None, (reply.get("reason") or plain(reply["error"]),
                                                     reply["error"]))
            return
        result: ChunkResult = reply["result"]
        flight.slot.chunks += 1
        event = result.chunk_event
        if flight.sent_wall and flight.noticed_wall and "start" in event and "end" in event:
            shift = on_controller_clock(event["start"], event["end"], flight.sent_wall,
                                        flight.noticed_wall)
            event["start"] += shift
            event["end"] += shift
        event["hop_s"] = max(0.0, round_trip + flight.got_s - reply["worker_s"])
        event["moved"] = flight.moved
        parts = {}
        if "started" in reply:
            # where the hop goes (wall clocks: across machines their skew moves time between
            # the first two parts, never their sum): the call reaching the worker (arguments,
            # scheduling), the reply reaching the controller (pickling the snapshot into the
            # object store, the controller noticing), and ray.get (transfer, unpickling)
            parts = {"hop_call_s": max(0.0, reply["started"] - flight.sent_wall),
                     "hop_back_s": max(0.0, flight.noticed_wall - reply["returned"]),
                     "hop_get_s": flight.got_s}
            event.update(parts)
        self._boundary[flight.run_id] = result.state["trainer"]["weights"]
        self._collected[flight.run_id] = (result, None)
        self.hops.append({"run_id": flight.run_id, "worker": flight.slot.name,
                          "round_trip_s": round_trip, "worker_s": reply["worker_s"],
                          "hop_s": event["hop_s"], "train_s": event.get("train_s", 0.0),
                          "moved": flight.moved, "sent": flight.sent, "arrived": flight.arrived,
                          **parts})

    def drop(self, flight: Flight) -> None:
        """A reply nobody wants (its run was deleted meanwhile)."""
        self.inflight.pop(flight.run_id, None)
        self.arrived.pop(flight.run_id, None)
        if flight.slot.busy_with == flight.run_id:
            flight.slot.busy_with = None

    def lose(self, slot: WorkerSlot) -> list[int]:
        """A worker died: forget what it held and trained; the runs it held, sorted."""
        slot.alive = False
        slot.busy_with = None
        held = sorted(rid for rid, s in self.home.items() if s is slot)
        for rid in held:
            del self.home[rid]
        # a reply already back stays: its chunk is in the controller's hands
        for rid in [rid for rid, f in self.inflight.items() if f.slot is slot and rid not in self.arrived]:
            del self.inflight[rid]
        return held


class WorkerEngine(Engine):
    def __init__(self, store, events, create_model, train_dataset, eval_dataset, num_chunks: int,
                 seed: int, build_args, build_lora, *, num_workers: int, offload: str = "auto",
                 **kwargs):
        pool = RayWorkerPool(num_workers, create_model, train_dataset, eval_dataset, num_chunks,
                             seed, build_args, build_lora, offload)
        self.remote = RemoteChunkExecutor(pool)
        super().__init__(store, events, create_model, train_dataset, eval_dataset, num_chunks,
                         seed, build_args, build_lora, offload=offload, executor=self.remote,
                         **kwargs)
        self.pool = pool
        self.remote.write_pending = self.persistence.writer.pending
        self._held_ops: list = []
        self._last_booked: int | None = None
        self.placement_s = _PLACEMENT_S
        self._starting: dict = {}         # describe() ref -> replacement worker not yet up
        self._owed = 0                    # dead workers to replace once the cluster has room
        self._owed_since = 0.0
        self._failed_starts = 0           # workers in a row lost before training a chunk
        self._not_replaced: str | None = None   # why replacements stopped, for the stop reason

    @property
    def inflight(self) -> dict[int, Flight]:
        return self.remote.inflight

    # -- thread ---------------------------------------------------------------------------------
    def start_workers(self, specs) -> None:
        """Before any run exists (run_fit's thread): start the workers and check, with one round
        trip, that each loads every callable the runs need and builds the same base models;
        a ConfigError naming the field otherwise."""
        blobs = {}
        for i, spec in enumerate(specs):
            where = f"config {i + 1}" if len(specs) > 1 else "the config"
            for name in ("formatting_func", "compute_metrics"):
                if getattr(spec, name, None) is not None:
                    blobs[f"{name} ({where})"] = getattr(spec, name)
            for j, fn in enumerate(getattr(spec, "reward_funcs", None) or []):
                blobs[f"reward_funcs[{j}] ({where})"] = fn
        from rapidfire_nb.engine.workers.pool import dumps_for_workers

        blobs = {k: dumps_for_workers(k, v) for k, v in blobs.items()}
        for i, spec in enumerate(specs):   # the rest of a config travels with its runs too
            dumps_for_workers(f"config {i + 1}", spec)
        need_pristine: dict = {}
        for spec in specs:
            need_pristine[spec.base_key()] = need_pristine.get(spec.base_key(), False) or spec.peft_config is None
        bases, seen = [], set()
        for spec in specs:
            if spec.base_key() not in seen:
                seen.add(spec.base_key())
                bases.append((spec, need_pristine[spec.base_key()]))
        self.pool.start(blobs, bases)

    def start(self) -> None:
        self.pool.start()   # Ray and the actors: the first time in run_fit's thread, errors show
        super().start()

    def busy(self) -> bool:
        with self.lock:
            return super().busy() or bool(self._held_ops) or bool(self.inflight)

    def ops_pending(self) -> bool:
        return super().ops_pending() or bool(self._held_ops)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.pool.shutdown()

    def _describe_workers(self) -> None:
        """At each loop start: replace dead workers, learn where each one runs, log it."""
        ray = self.pool.ray
        with self.lock:
            # a loop (re)starts: a user's resume asks to try again after replacements gave up
            self._owed, self._failed_starts, self._not_replaced = 0, 0, None
            self._starting.clear()
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
            except Exception as exc:   # it could not start (or load create_model): gone
                self.pool.kill(slot)
                with self.lock:
                    self._worker_lost(slot, exc, None)
        for ref in late:               # never placed: it would hold its chunks forever
            slot = refs[ref]
            self.pool.kill(slot)
            with self.lock:
                self._worker_lost(slot, TimeoutError(
                    f"worker {slot.name} was not placed on the Ray cluster within {_PLACEMENT_S:.0f} s "
                    f"(it asks for {self.pool.resources})"), None)
        self.events.append("workers", workers=[{"worker": s.name, **s.info} for s in slots if s.info],
                           resources=dict(self.pool.resources))

    def _replace_workers(self) -> None:
        """Under the lock, every loop turn: start replacements owed for dead workers when the
        cluster has room, and take in those that came up (or died starting). Never blocks."""
        ray = self.pool.ray
        if self._starting:
            refs = list(self._starting)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            up = []
            for ref in ready:
                slot = self._starting.pop(ref)
                if not slot.alive:      # killed meanwhile (end())
                    continue
                try:
                    slot.info = ray.get(ref)
                    up.append(slot)
                except Exception as exc:   # it could not start (or load create_model): gone
                    self.pool.kill(slot)
                    self._worker_lost(slot, exc, None)
            for ref, slot in list(self._starting.items()):
                if time.monotonic() - slot.created > self.placement_s:
                    del self._starting[ref]
                    self.pool.kill(slot)
                    self._worker_lost(slot, TimeoutError(
                        f"replacement worker {slot.name} was not up on the Ray cluster within "
                        f"{self.placement_s:.0f} s (it asks for {self.pool.resources})"), None)
            if up:
                self.events.append("workers", workers=[{"worker": s.name, **s.info} for s in up],
                                   resources=dict(self.pool.resources))
        while self._owed and not self._draining:
            if not any(r.status in R.ACTIVE for r in self.runs.values()):
                self._owed = 0   # nothing left to train: no replacement needed
                break
            if not self.pool.resources_free():
                if time.monotonic() - self._owed_since > self.placement_s:
                    self._not_replaced = (f"the Ray cluster had no room for a replacement worker "
                                          f"within {self.placement_s:.0f} s")
                    self._owed = 0
                break
            slot = self.pool.add_worker()
            self._starting[slot.actor.describe.remote()] = slot
            self._owed -= 1
            self._owed_since = time.monotonic()

    def _loop(self) -> None:
        self._describe_workers()
        boundary = True    # the AutoML hook runs at chunk boundaries, not at every poll
        while True:
            flush = pause = False
            with self.lock:
                if boundary and self.boundary_hook is not None and not self._draining:
                    try:
                        self.boundary_hook()
                    except Exception:   # a policy bug must not kill training: logged, ignored
                        self._log_file.write("boundary hook failed:\n" + traceback.format_exc())
                boundary = False
                writer = self.persistence.writer
                if self._draining:
                    flush = not self.inflight   # chunks in flight come back first, and are booked
                elif self.ops_pending() and writer.busy():
                    flush = True   # ops see every finished chunk on disk and in the log
                else:
                    self._settle_writes()
                    if not writer.busy():
                        self._apply_ops()
                    self._dispatch()
                    if not self.inflight:
                        if writer.busy():
                            flush = True
                        elif self.ops_pending():
                            continue
                        elif (self._starting or self._owed) and any(
                                r.status in R.ACTIVE for r in self.runs.values()):
                            pause = True   # every worker died: their replacements are starting
                        else:
                            self._drop_replacements()   # nothing left to train: not needed
                            self._leaving = True
                            return
                    elif not self.remote.waiting() and writer.busy() and self._reply_due() is None:
                        flush = True   # the reply due next waits for its run's checkpoint write
            if pause:
                time.sleep(_POLL_S)
                continue
            if flush:
                self.persistence.flush()   # outside the lock: the writer's follow-ups take it
                with self.lock:
                    if self._draining and not self.inflight:
                        self._settle_writes()
                        self._apply_ops()
                        return
                # back to the top: ops that waited for this flush are applied before any other
                # reply is booked (a pruner's stop lands where the kernel puts it)
                continue
            with self.lock:
                writing = self.persistence.writer.busy()
                # booking a reply while the previous checkpoint is still being written would wait
                # for that write here, deaf to the workers: while they train, book once it is done
                due = self._next_reply() if not (writing and self.remote.waiting()) else None
            if due is None:
                wait = _WRITE_POLL_S if writing and self.remote.arrived else _POLL_S
                results = self.remote.collect(wait)
                with self.lock:   # every death seen in this batch counts before any is logged
                    for flight, _, exc in results:
                        if exc is not None and self._is_death(exc):
                            flight.slot.alive = False
                for flight, reply, exc in results:
                    with self.lock:
                        if exc is None:
                            self.remote.arrive(flight, reply)
                        else:
                            boundary = True
                            self._lost_or_failed(flight, self.runs.get(flight.run_id), exc)
                continue
            flight, reply = due
            boundary = True
            with self.lock:
                rec = self.runs.get(flight.run_id)
                if rec is None or rec.status == R.DELETED:
                    # deleted while its chunk trained: dropped, as its checkpoints were
                    self.remote.drop(flight)
                    continue
                self.remote.book(flight, reply)
                self._last_booked = flight.run_id
                if reply.get("ok"):
                    self._failed_starts = 0   # a worker trained a chunk: starts work again
            try:
                self._train_chunk(rec)   # books the result: counters, checkpoint, events
            except Exception as exc:     # failure isolation: this run fails, the others go on
                self._fail(rec, exc)

    def _next_reply(self) -> tuple[Flight, dict] | None:
        """Under the lock: the reply to book now (``_reply_due``), taken out of ``remote.arrived``."""
        rid = self._reply_due()
        return None if rid is None else self.remote.arrived.pop(rid)

    def _reply_due(self) -> int | None:
        """Under the lock: the run whose reply is to be booked now, or None.

        Without AutoML, replies are booked as they come back. With a boundary hook (pruners,
        RFOptuna) what the hook decides depends on the order in which it sees chunks, so replies
        are booked in the order the kernel's engine trains chunks (``Engine.fair_choice``, the run
        booked last breaking ties as the run on the device does there); a reply that comes back
        early waits for its turn. The hook then sees the same sequence of states as in the kernel
        and decides the same. With no live worker, or while draining, nothing more is
        dispatched: whatever came back is booked as it is."""
        arrived = self.remote.arrived
        if not arrived:
            return None
        if self.boundary_hook is None or self._draining or not self.pool.live():
            return next(iter(arrived))
        rid = self.fair_choice(last=self._last_booked)
        return rid if rid in arrived else None

    # -- dispatch -------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Under the lock: give every idle worker the chunk the policy picks for it."""
        self._replace_workers()
        live = [s for s in self.pool.live() if s.info]
        if not live:
            if not self.remote.arrived and not self._starting and not self._owed:
                self._no_worker_left()   # replies back are booked first; replacements awaited
            return
        writer = self.persistence.writer
        for allow_move in (False, True):
            for slot in self.pool.idle():
                views = [RunView(r.run_id, r.progress, r.status in R.ACTIVE,
                                 busy=r.run_id in self.inflight or writer.pending(r.run_id))
                         for r in self.runs.values()]
                home = {rid: s.index for rid, s in self.remote.home.items() if s.alive}
                rid = choose_for_worker(views, slot.index, home, slot.last, allow_move, len(live),
                                        barrier=self.boundary_hook is not None)
                if rid is None:
                    continue
                rec = self.runs[rid]
                try:
                    self.remote.dispatch(slot, rec, self.store.load_checkpoint)
                except Exception as exc:   # an unreadable checkpoint fails this run, not the engine
                    self._fail(rec, exc)
                    continue
                if rec.status == R.PENDING:
                    self._set_status(rec, R.RUNNING)

    def _no_worker_left(self) -> None:
        why = f" ({self._not_replaced})" if self._not_replaced else ""
        for rec in self.runs.values():
            if rec.status in R.ACTIVE:
                self._set_status(rec, R.STOPPED, reason="every Ray worker was lost (see the "
                                 f"worker_lost events){why}; resume the run to continue it on new "
                                 "workers")

    # -- deaths and failures --------------------------------------------------------------------
    def _is_death(self, exc: BaseException) -> bool:
        return self.pool.is_death(exc) or not self.pool.ray.is_initialized()

    def _drop_replacements(self) -> None:
        """Under the lock, when the loop leaves: replacements still starting are killed (they would
        hold a GPU until end()), and none is owed any more; a later loop tops up again."""
        for slot in self._starting.values():
            self.pool.kill(slot)
        self._starting.clear()
        self._owed = 0

    def _lost_or_failed(self, flight: Flight, rec: RunRecord | None, exc: BaseException) -> None:
        if self._is_death(exc):
            self._worker_lost(flight.slot, exc, flight)
            return
        # a Ray-level error of this call alone (e.g. an argument that cannot be unpickled there)
        self.remote.drop(flight)
        if rec is not None:
            self._fail(rec, exc)

    def _notice_other_deaths(self, slot: WorkerSlot) -> None:
        """Under the lock: workers killed with ``slot`` (a node lost, ray.kill of several) whose
        errors are back already count as dead before ``workers_left`` is logged (no waiting)."""
        ray = self.pool.ray
        others = {f.ref: f.slot for rid, f in self.inflight.items()
                  if f.slot is not slot and f.slot.alive and rid not in self.remote.arrived}
        if not others or not ray.is_initialized():
            return
        ready, _ = ray.wait(list(others), num_returns=len(others), timeout=0)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception as exc:
                if self.pool.is_death(exc):
                    others[ref].alive = False

    def _worker_lost(self, slot: WorkerSlot, exc: BaseException, flight: Flight | None) -> None:
        held = self.remote.lose(slot)
        self._notice_other_deaths(slot)
        lost = None
        if flight is not None:
            lost = {"run_id": flight.run_id, "epoch": flight.epoch, "chunk": flight.chunk}
        reason = plain(f"{type(exc).__name__}: {exc}")[:2000]
        if slot.chunks == 0:
            self._failed_starts += 1
        if self._failed_starts >= MAX_FAILED_STARTS:
            self._not_replaced = (f"not replaced: {self._failed_starts} workers in a row died before "
                                  f"training a chunk; the last one: {_root_cause(exc)}")
            self._owed = 0
            replacement = self._not_replaced
        elif self._draining or self.closed:
            replacement = None
        elif not any(r.status in R.ACTIVE for r in self.runs.values()):
            replacement = "none: no run is left to train"
        else:
            if not self._owed:
                self._owed_since = time.monotonic()
            self._owed += 1
            replacement = "a replacement worker starts as soon as the Ray cluster has room"
        self.events.append("worker_lost", worker=slot.name, node=slot.info.get("node"),
                           reason=reason, runs=held, chunk_lost=lost,
                           workers_left=len([s for s in self.pool.live() if s.info]),
                           replacement=replacement)

    # -- ops ------------------------------------------------------------------------------------
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

    def _fail(self, rec: RunRecord, exc: BaseException) -> None:
        if not isinstance(exc, WorkerTrainingError):
            if self.pool.ray is not None and isinstance(exc, self.pool.ray.exceptions.RayError):
                exc = WorkerTrainingError(_root_cause(exc), plain(str(exc)))
            else:
                return super()._fail(rec, exc)
        with self.lock:   # as the kernel: the one line as reason, the traceback as error
            self._release(rec)
            if rec.status not in R.TERMINAL:
                self._set_status(rec, R.FAILED, error=exc.traceback, reason=exc.reason)

    def _release(self, rec: RunRecord, collect: bool = True) -> None:
        super()._release(rec, collect=False)   # nothing trains here: no local memory to collect
