"""``RemoteChunkExecutor``: chunks trained by Ray workers, for the engine's one loop.

The engine (controller.py) is the same whatever trains its chunks: the op queue, the event log,
the checkpoint writer (checkpoint first, then the chunk's events), runs.json, the AutoML boundary
hook, recovery. This executor is what changes with Ray, through the executor seam
(engine/executor.py):

- one slot per worker: ``dispatch`` starts a chunk on a worker, ``collect`` gathers the replies
  that came back, and the engine books them with its own code, as it books the kernel's;
- its lifecycle hooks start the workers (``prepare``, ``open``), replace lost ones (``begin``,
  ``tick``, ``recovering``: ``pool.Replacements`` says when, and when to give up), and handle a
  lost chunk (``lost``) and a worker's failure text (``failure``).

Where a run trains (engine/scheduling/): on the worker that holds its trainer while it can; it
moves only at a chunk boundary, by shipping its last checkpoint to the new worker. The experiment
folder is the controller's alone; state travels through Ray's object store, so workers on other
machines need no shared file system.

Ops that touch a run whose chunk is in flight (stop, resume, delete, a clone of it) are held until
that chunk has come back and its checkpoint is written, then applied in order: they see the run at
a chunk boundary, as in the kernel.

A worker that dies loses only the chunk it was training: a run's counters move only when a chunk's
result is booked, so the run is simply scheduled again, on another worker, from its last checkpoint;
the other runs the dead worker held continue the same way. A worker that cannot build a run's base
(its environment: create_model raises there) is treated as lost too, and killed: the run goes back
to the healthy workers instead of failing. A ``worker_lost`` event says what happened. With no
worker left the active runs are stopped (resumable); resuming one starts replacement workers.
"""
from __future__ import annotations

import copy
import time

from rapidfire_nb.engine import runs as R
from rapidfire_nb.engine.executor import ChunkExecutor, ChunkResult, Flight
from rapidfire_nb.engine.inputs import TrainingInputs
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.scheduling import DispatchView, GangForm, GangView, PlacedRun, WorkerView, plan_dispatch
from rapidfire_nb.engine.sharding import devices_of
from rapidfire_nb.engine.workers.pool import Gang, RayWorkerPool, WorkerSlot, plain, root_line
from rapidfire_nb.engine.workers.worker import COUNTERS, pack_tensors, unpack_tensors
from rapidfire_nb.errors import RapidFireError


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


class WorkerUnfit(RapidFireError):
    """A worker's environment cannot train a run (create_model raises there): the worker is
    excluded like a dead one and the run goes back to the others, not failed."""


class RemoteChunkExecutor(ChunkExecutor):
    """The controller's side of the workers: which worker holds which run, and the results."""

    on_device = None   # several devices: no single one

    frees_local_memory = False   # trainers live in the workers: nothing here to collect

    @classmethod
    def for_workers(cls, num_workers: int, inputs: TrainingInputs) -> RemoteChunkExecutor:
        """The executor over a new pool of ``num_workers`` workers, none started yet."""
        return cls(RayWorkerPool(num_workers, inputs))

    def __init__(self, pool: RayWorkerPool):
        super().__init__()
        self.pool = pool
        self.home: dict[int, WorkerSlot] = {}     # run -> the live worker holding its trainer
        self.start: dict[int, dict] = {}          # warm clones' starting weights (shipped on arrival)
        self._boundary: dict[int, dict] = {}      # run -> weights of a chunk whose write is pending
        self.write_pending = lambda run_id: False   # the engine's writer's, from ``begin`` on
        self.moves = 0
        self.hops: list[dict] = []                # per chunk: round trip vs time inside the worker
        self.gangs: dict[int, Gang] = {}          # devices -> the live gang of that size
        self._gang_count = 0
        self.gang_start_s: list[float] = []       # forming each gang (the rendezvous round trip)

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

    def is_death(self, exc: BaseException) -> bool:
        ray = self.pool.ray
        return isinstance(exc, WorkerUnfit) or self.pool.is_death(exc) or not ray.is_initialized()

    def reorders(self) -> bool:
        return bool(self.pool.live())   # with none left, whatever came back is booked as it is

    # -- dispatch -------------------------------------------------------------------------------
    def assignments(self, engine):
        """Every idle worker, and every gang of workers for runs sharded over several devices,
        gets the run the gang rule (scheduling/gangs.py) picks for it; the gangs it names are
        formed here. The rule decides over a snapshot of the workers and runs, and each of its
        decisions is dispatched (by the engine, between two yields) before the next one counts:
        the rule assumes each dispatch succeeds, so after one that failed the plan is recomputed
        from the same snapshot, told of the failure, and continued where it was."""
        live = [s for s in self.pool.live() if s.info]
        writer = engine.persistence.writer
        kept = tuple(GangView(g.index, tuple(m.index for m in g.members),
                              usable=g.alive and all(m.alive for m in g.members),
                              busy=g.busy_with is not None, last=g.last)
                     for g in self.gangs.values())
        held = {rid: s.index for rid, s in self.home.items() if s.alive}
        view = DispatchView(
            workers=tuple(WorkerView(s.index, idle=s.busy_with is None, last=s.last,
                                     gang=s.gang.index if s.gang is not None and s.gang.alive else None)
                          for s in live),
            gangs=kept,
            runs=tuple(PlacedRun(r.run_id, r.progress, r.status in R.ACTIVE,
                                 busy=r.run_id in self.inflight or writer.pending(r.run_id),
                                 devices=devices_of(r.spec), home=held.get(r.run_id))
                       for r in engine.runs.values()),
            barrier=engine.boundary_hook is not None, gangs_formed=self._gang_count)
        plan = plan_dispatch(view)
        slots = {s.index: s for s in live}
        for form in plan.forms:
            self._gang(form, slots)
        failed: set[int] = set()
        i = 0
        while i < len(plan.assignments):
            a = plan.assignments[i]
            slot = self.gangs[a.gang] if a.gang is not None else slots[a.worker]
            yield slot, a.run_id
            flight = self.inflight.get(a.run_id)
            if flight is None or flight.slot is not slot:   # the dispatch failed
                failed.add(a.run_id)
                plan = plan_dispatch(view, failed)
            i += 1

    def arrive(self, flight: Flight, reply) -> None:
        if isinstance(flight.slot, Gang):
            for m in flight.slot.members:
                if m.busy_with == flight.run_id:
                    m.busy_with = None
        super().arrive(flight, reply)

    def drop(self, flight: Flight) -> None:
        if isinstance(flight.slot, Gang):
            for m in flight.slot.members:
                if m.busy_with == flight.run_id:
                    m.busy_with = None
        super().drop(flight)

    def _gang(self, form: GangForm, slots: dict[int, WorkerSlot]) -> Gang:
        """The gang the gang rule formed: its workers belong to it from now on, and it is the
        gang kept for its size."""
        self._gang_count += 1
        if form.index != -self._gang_count:   # a bug in the rule, not in a run: say so plainly
            raise RuntimeError(f"the gang rule numbered a new gang {form.index}, the executor "
                               f"{-self._gang_count}")
        gang = Gang(index=form.index, members=[slots[i] for i in form.members])
        for m in gang.members:
            m.gang = gang
        self.gangs[form.size] = gang
        return gang

    def _form(self, gang: Gang) -> None:
        """The members join one process group: rank 0 names the rendezvous; the joins are queued
        on every member before its first chunk (an actor runs its calls in order)."""
        t0 = time.perf_counter()
        ray = self.pool.ray
        addr, port = ray.get(gang.members[0].actor.gang_address.remote(), timeout=120)
        for rank, m in enumerate(gang.members):
            m.actor.join_gang.remote(gang.name, rank, gang.size, addr, port)
        gang.formed = True
        self.gang_start_s.append(time.perf_counter() - t0)

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
        if isinstance(slot, Gang):   # the same call to every member, in lockstep
            if not slot.formed:
                self._form(slot)
            args = (rid, counters, record, pack_tensors(checkpoint), pack_tensors(start))
            ref = [m.actor.train_chunk.remote(*args) for m in slot.members]
            for m in slot.members:
                m.busy_with, m.last = rid, rid
        else:
            ref = slot.actor.train_chunk.remote(rid, counters, record, pack_tensors(checkpoint),
                                                pack_tensors(start))
        slot.busy_with, slot.last = rid, rid
        self.home[rid] = slot
        self.inflight[rid] = Flight(rid, slot, ref, rec.epoch, rec.chunk, time.perf_counter(),
                                    moved=record is not None, sent_wall=time.time())

    def collect(self, timeout: float) -> list[tuple[Flight, dict | None, BaseException | None]]:
        """Wait up to ``timeout`` for chunks in flight; (flight, reply, error) of each one back.
        A gang's chunk is back when every member answered; a member that died fails it at once
        (its peers' collectives would only time out)."""
        ray = self.pool.ray
        flights = [f for rid, f in self.inflight.items() if rid not in self.arrived]
        if not flights:
            time.sleep(0.005)   # only replies waiting for their turn: nothing to wait on here
            return []
        if not ray.is_initialized():   # ray.shutdown() under us: every worker is gone
            gone = RuntimeError("the Ray session ended (ray.shutdown())")
            return [(f, None, gone) for f in flights]
        refs = [r for f in flights for r in _refs(f)]
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(ready)
        out = []
        now, now_wall = time.perf_counter(), time.time()
        for flight in flights:
            mine = _refs(flight)
            if not any(r in ready for r in mine):
                continue
            replies, error = [], None
            for i, ref in enumerate(mine):
                if ref not in ready:
                    replies.append(None)
                    continue
                try:
                    reply = ray.get(ref)
                    if reply.get("ok"):
                        reply["result"].state = unpack_tensors(reply["result"].state)
                    replies.append(reply)
                except Exception as exc:
                    if isinstance(flight.slot, Gang):
                        exc.rf_member = flight.slot.members[i]
                    error = exc
                    break
            if error is None and any(r is None for r in replies):
                continue   # a gang whose other members are still training
            flight.arrived, flight.noticed_wall = now, now_wall
            flight.got_s = time.perf_counter() - now
            if error is not None:
                out.append((flight, None, error))
                continue
            reply = replies[0] if len(replies) == 1 else _gang_reply(replies)
            if reply.get("unfit"):   # this worker cannot build the run's base: exclude it
                out.append((flight, None, WorkerUnfit(reply.get("reason") or plain(reply["error"]))))
            else:
                out.append((flight, reply, None))
        return out

    def book(self, flight: Flight, reply: dict) -> ChunkResult:
        """The result of a reply whose turn has come (under the engine lock); a
        ``WorkerTrainingError`` when the chunk failed on its worker."""
        self.drop(flight)
        # until it came back, not until its turn to be booked (waiting is not the hop's cost)
        round_trip = (flight.arrived or time.perf_counter()) - flight.sent
        if reply["ok"]:
            try:   # a base built on this worker for the first time (a replacement's)
                for key, fp in reply.get("fingerprints", {}).items():
                    self.pool.note_fingerprint(_first(flight.slot).name, key, fp)
            except RapidFireError as exc:
                self.pool.release(flight.slot, flight.run_id)
                reply = {"ok": False, "reason": f"{type(exc).__name__}: {exc}", "error": str(exc)}
        if not reply["ok"]:
            self.home.pop(flight.run_id, None)   # the worker freed the run already
            raise WorkerTrainingError(reply.get("reason") or plain(reply["error"]), reply["error"])
        result: ChunkResult = reply["result"]
        flight.slot.chunks += 1
        if isinstance(flight.slot, Gang):
            for m in flight.slot.members:
                m.chunks += 1
            result.chunk_event["worker"] = flight.slot.name
            result.chunk_event["devices"] = flight.slot.size
        self.pool.replacements.trained()   # a worker trained a chunk: starts work again
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
        self.hops.append({"run_id": flight.run_id, "worker": flight.slot.name,
                          "round_trip_s": round_trip, "worker_s": reply["worker_s"],
                          "hop_s": event["hop_s"], "train_s": event.get("train_s", 0.0),
                          "moved": flight.moved, "sent": flight.sent, "arrived": flight.arrived,
                          **parts})
        return result

    def lose(self, slot: WorkerSlot) -> list[int]:
        """A worker died: forget what it held and trained; the runs it held, sorted. A gang
        member's death ends its gang: its runs (held by every member) are forgotten too, and its
        other members are killed (their process group is broken); the caller replaces them."""
        slot.alive = False
        slot.busy_with = None
        gang = slot.gang
        gone = [slot]
        if gang is not None:   # (the loop may have marked it dead already: its flight failed)
            gone.append(gang)
            if not gang.ended:
                gang.ended, gang.alive, gang.busy_with = True, False, None
                for m in gang.members:
                    if m is not slot and m.alive:
                        self.pool.kill(m)
                        m.busy_with = None
        held = sorted(rid for rid, s in self.home.items() if any(s is g for g in gone))
        for rid in held:
            del self.home[rid]
        # a reply already back stays: its chunk is in the controller's hands
        for rid in [rid for rid, f in self.inflight.items()
                    if any(f.slot is g for g in gone) and rid not in self.arrived]:
            del self.inflight[rid]
        return held

    @property
    def replacements(self):
        """The pool's policy for replacing lost workers (``pool.Replacements``)."""
        return self.pool.replacements

    # -- lifecycle hooks (engine/executor.py): starting, replacing and losing workers -----------
    def prepare(self, specs) -> None:
        """Before any run exists (run_fit's thread): start the workers and check, with one round
        trip, that each loads every callable the runs need and builds the same base models;
        a ConfigError naming the field otherwise."""
        from rapidfire_nb.engine.workers.pool import dumps_for_workers

        n = self.pool.n
        # seconds of silence otherwise: Ray's start, then each worker imports torch and loads
        # the model(s) and what the runs need
        print(f"rapidfire: starting {n} Ray worker{'s' if n > 1 else ''} (Ray itself first if it "
              "is not running: 10-30 s the first time); run_fit returns once each worker has "
              "loaded the model", flush=True)
        blobs = {}
        for i, spec in enumerate(specs):
            where = f"config {i + 1}" if len(specs) > 1 else "the config"
            for name in ("formatting_func", "compute_metrics"):
                if getattr(spec, name, None) is not None:
                    blobs[f"{name} ({where})"] = getattr(spec, name)
            for j, fn in enumerate(getattr(spec, "reward_funcs", None) or []):
                blobs[f"reward_funcs[{j}] ({where})"] = fn
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

    def open(self) -> None:
        self.pool.start()   # Ray and the actors: the first time in the caller's thread, errors show

    def begin(self, engine) -> None:
        """At each loop start: replace dead workers, learn where each one runs, log it."""
        self.write_pending = engine.persistence.writer.pending
        with engine.lock:
            # a loop (re)starts: a user's resume asks to try again after replacements gave up
            slots = self.replacements.restart()
        if not slots:
            return
        up, lost = self.replacements.describe(slots)
        with engine.lock:
            for slot, exc in lost:
                self._worker_lost(engine, slot, exc, None)
        engine.events.append("workers", workers=[{"worker": s.name, **s.info} for s in up],
                             resources=dict(self.pool.resources))

    def tick(self, engine) -> bool:
        """Replacements first (those owed, those that came up); with no worker left and none
        coming, the active runs are stopped (resumable: resuming starts new workers)."""
        up, lost = self.replacements.tick(engine.has_active_runs(), engine.stopping)
        for slot, exc in lost:
            self._worker_lost(engine, slot, exc, None)
        if up:
            engine.events.append("workers", workers=[{"worker": s.name, **s.info} for s in up],
                                 resources=dict(self.pool.resources))
        if any(s.info for s in self.pool.live()):
            return True
        if not self.arrived and not self.replacements.recovering():
            # replies back are booked first; replacements are awaited
            why = self.replacements.not_replaced
            why = f" ({why})" if why else ""
            engine.stop_active("every Ray worker was lost (see the worker_lost events)"
                               f"{why}; resume the run to continue it on new workers")
        return False

    def recovering(self, engine) -> bool:
        return self.replacements.recovering() and engine.has_active_runs()

    def leaving(self, engine) -> None:
        self.replacements.drop()   # nothing left to train: replacements still starting not needed

    def lost(self, engine, flight: Flight, exc: BaseException) -> bool:
        """A dead worker (or one unfit for the run) loses only the chunk it trained: the run goes
        back to the others; a Ray-level error of this call alone (an argument that cannot be
        unpickled there) fails the run, as in the kernel."""
        if not self.is_death(exc):
            return False
        slot = getattr(exc, "rf_member", None) or _first(flight.slot)
        if isinstance(exc, WorkerUnfit):
            self.pool.kill(slot)
        self._worker_lost(engine, slot, exc, flight)
        return True

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """As the kernel: the one line as reason, the worker's traceback as error."""
        if not isinstance(exc, WorkerTrainingError):
            if self.pool.ray is None or not isinstance(exc, self.pool.ray.exceptions.RayError):
                return super().failure(exc)
            exc = WorkerTrainingError(_root_cause(exc), plain(str(exc)))
        return exc.reason, exc.traceback

    def close(self) -> None:
        self.pool.shutdown()

    @property
    def worker_count(self) -> int:
        return self.pool.n

    def training_now(self) -> dict[str, int]:
        return {f.slot.name: rid for rid, f in self.inflight.items()}

    # -- deaths ---------------------------------------------------------------------------------
    def _notice_other_deaths(self, slot: WorkerSlot) -> None:
        """Under the lock: workers killed with ``slot`` (a node lost, ray.kill of several) whose
        errors are back already count as dead before ``workers_left`` is logged (no waiting)."""
        ray = self.pool.ray
        others = {f.ref: f.slot for rid, f in self.inflight.items()
                  if f.slot is not slot and f.slot.alive and rid not in self.arrived
                  and not isinstance(f.slot, Gang)}
        if not others or not ray.is_initialized():
            return
        ready, _ = ray.wait(list(others), num_returns=len(others), timeout=0)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception as exc:
                if self.pool.is_death(exc):
                    others[ref].alive = False

    def _worker_lost(self, engine, slot: WorkerSlot, exc: BaseException, flight: Flight | None) -> None:
        """Under the lock: forget what ``slot`` held, have it replaced, log ``worker_lost`` (and
        one for each member of its gang, which ends with it)."""
        gang = slot.gang if slot.gang is not None and not slot.gang.ended else None
        held = self.lose(slot)
        if gang is not None:   # its peers were killed with it: each is lost, and replaced
            for m in gang.members:
                if m is not slot:
                    why = f"its gang {gang.name} lost worker {slot.name}; a gang ends with a member"
                    replacement = self.replacements.lost(m, why, stopping=engine.stopping,
                                                         active=engine.has_active_runs())
                    engine.events.append("worker_lost", worker=m.name, node=m.info.get("node"),
                                         reason=why, runs=[], chunk_lost=None,
                                         workers_left=len([s for s in self.pool.live() if s.info]),
                                         replacement=replacement)
        self._notice_other_deaths(slot)
        lost = None
        if flight is not None:
            lost = {"run_id": flight.run_id, "epoch": flight.epoch, "chunk": flight.chunk}
        reason = plain(f"{type(exc).__name__}: {exc}")[:2000]
        replacement = self.replacements.lost(slot, _root_cause(exc), stopping=engine.stopping,
                                             active=engine.has_active_runs())
        engine.events.append("worker_lost", worker=slot.name, node=slot.info.get("node"),
                             reason=reason, runs=held, chunk_lost=lost,
                             workers_left=len([s for s in self.pool.live() if s.info]),
                             replacement=replacement)


def _refs(flight: Flight) -> list:
    return flight.ref if isinstance(flight.ref, list) else [flight.ref]


def _first(slot):
    return slot.members[0] if isinstance(slot, Gang) else slot


def _gang_reply(replies: list[dict]) -> dict:
    """The members' replies to one chunk as one: rank 0's result (its weights and optimizer
    state are every rank's: adapters are replicated), one RNG state per rank, the slowest
    member's time; the first failure if a member failed (the chunk failed for the run)."""
    for reply in replies:
        if not reply.get("ok"):
            return reply
    out = dict(replies[0])
    state = out["result"].state
    state["trainer"]["rng_ranks"] = [r["result"].state["trainer"]["rng"] for r in replies]
    out["worker_s"] = max(r["worker_s"] for r in replies)
    out["returned"] = max(r.get("returned", 0.0) for r in replies)
    return out
