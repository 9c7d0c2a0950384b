"""The seam between the engine loop and the place where a chunk trains.

The loop (controller.py) decides *which* run trains its next chunk; a ``ChunkExecutor`` trains
it, asynchronously: the loop ``dispatch``es a chunk to one of the executor's slots, ``collect``s
the chunks that finished, and ``book``s each one (counters, checkpoint, events) in its turn.
``LocalChunkExecutor`` is the one-slot case in this process: it holds the shared bases (through
the trainer factory), every live ``RunTrainer`` and the residency policy, and its chunk is done
as soon as it is collected. The Ray executor (workers/executor.py) has one slot per worker, each
holding its own bases and trainers.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine.adapters.base import RunTrainer, merge_window, read_step_metrics
from rapidfire_nb.engine.factory import TrainerFactory
from rapidfire_nb.engine.generation import sample_generations
from rapidfire_nb.engine.hfstate import HF_STATE_LOCK
from rapidfire_nb.engine.residency import Residency
from rapidfire_nb.engine.resources import MemoryMeter
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.safeformat import SnapshotBuffers, flat_snapshot
from rapidfire_nb.engine.store import ExperimentStore

COUNTERS = ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done")


@dataclass
class ChunkResult:
    """What training one chunk of one run produced (see ``ChunkExecutor.train_chunk``)."""

    counters: dict           # the run's COUNTERS after the chunk (its next stream position)
    events: list             # [("metric", payload), ...] in order: train windows, then evals
    chunk_event: dict        # the chunk_done payload: timings, device, steps (no checkpoint_s yet)
    state: dict              # the checkpoint payload: trainer state, counters, events, chunk_event
    eval_metrics: dict       # the end-of-chunk evaluation ({} without an eval set)
    done: bool               # the run reached its total steps
    restored: dict = field(default_factory=dict)   # record fields the executor (re)set, see below


@dataclass
class Flight:
    """One chunk dispatched to a slot and not booked yet."""

    run_id: int
    slot: Any
    ref: object = None       # the executor's handle (a Ray object ref; the record in the kernel)
    epoch: int = 0
    chunk: int = 0
    sent: float = 0.0        # perf_counter at dispatch
    moved: bool = False      # the run arrived on this slot with this chunk
    arrived: float = 0.0     # when the controller saw the reply ready (perf_counter)
    sent_wall: float = 0.0   # time.time() at dispatch, against the worker's own clock readings
    noticed_wall: float = 0.0
    got_s: float = 0.0       # fetching the reply (transfer, unpickling)


@dataclass
class Slot:
    """Where one chunk at a time trains (the kernel's device, or a Ray worker)."""

    name: str
    busy_with: int | None = None   # run id of the chunk in flight
    last: int | None = None        # the run it trained last
    alive: bool = True


class ChunkExecutor:
    """Trains chunks of runs; the engine loop's only way to touch models and trainers.

    The asynchronous seam the loop drives (under the engine lock unless said otherwise):

    - ``assignments(engine)`` yields ``(slot, run_id)``: which free slot should train which run's
      next chunk (the policy of this executor: the fair rule on one device, the workers' and gang
      rules across workers: engine/scheduling/); each one is dispatched before the next is
      yielded, and a dispatch that fails leaves its slot free for the next.
    - ``dispatch(slot, record, load_checkpoint)`` starts that chunk; it is in ``inflight`` until
      booked or dropped.
    - ``collect(timeout)`` (outside the lock) waits up to ``timeout`` for chunks in flight and
      returns ``(flight, reply, error)`` for each one that finished; ``arrive`` then keeps a reply
      in ``arrived`` until the loop books it (``book(flight, reply) -> ChunkResult``, which raises
      when the chunk failed) or ``drop``s it (its run was deleted meanwhile).
    - ``is_death(error)``: the slot itself is gone (a dead worker), not just this chunk;
      ``reorders()``: replies may come back in another order than the kernel trains chunks, so the
      loop books them in the kernel's order when AutoML decides at boundaries.

    Training itself (what the engine relies on; the Ray worker trains with the local executor):

    ``train_chunk(record) -> ChunkResult`` trains the next chunk of ``record`` (a ``RunRecord``
    whose ``epoch``/``chunk``/``completed_steps``/``samples_seen`` give the stream position and
    ``total_steps``/``step_offset`` the run's schedule). On the first call for a run, or after
    ``release``, it builds the run's trainer and restores its state from, in this order: the
    run's chunk-boundary checkpoint in the store, else the start weights set by
    ``set_start_weights`` (a warm clone), else fresh (adapter init seeded by seed and config).
    Fields of the record it changed while building (counters read from the checkpoint,
    ``total_steps``/``steps_per_epoch`` re-planned on TRL's prepared data) are returned in
    ``ChunkResult.restored``; the local executor also sets them on the record it was given.
    It does not change the record's counters for the chunk it trained: the engine applies
    ``ChunkResult.counters`` under its lock. ``ChunkResult.state`` is the chunk-boundary checkpoint
    (``{"trainer": ..., "counters": ..., "events": ..., "chunk_event": ...}``) that the engine's
    writer saves with ``ExperimentStore.save_checkpoint``; its tensors live in a reusable host
    buffer (``safeformat.flat_snapshot``) that is not handed out again, and the run not trained
    again, until the write is done (``may_move``). Errors: any
    exception means this run failed (the engine marks it failed, with the reason and error text
    ``failure`` reads from the exception, and calls ``release``); other runs are not affected.
    Results are bit-identical whatever ran before on the executor (exactness): everything a run
    owns is restored at its swap-in.

    ``release(record)`` frees a run's trainer, adapter and device memory (idempotent).
    ``live_weights(run_id)`` is the run's current trainable weights (CPU-copyable tensors) or None
    if it has no live trainer. ``set_start_weights``/``start_weights`` hold a warm clone's
    starting weights until its trainer is built. ``live_run_ids()`` lists runs with a trainer.
    ``on_device`` is the run whose state is active on the device, or None.
    """

    on_device: int | None = None

    def __init__(self):
        self.inflight: dict[int, Flight] = {}
        # replies back but not booked yet; their flights stay in ``inflight`` until booked, so
        # ops on those runs still wait for them
        self.arrived: dict[int, tuple[Flight, Any]] = {}

    # -- the asynchronous seam ------------------------------------------------------------------
    def assignments(self, engine):
        raise NotImplementedError

    def dispatch(self, slot, record: RunRecord, load_checkpoint) -> None:
        raise NotImplementedError

    def collect(self, timeout: float) -> list[tuple[Flight, Any, BaseException | None]]:
        raise NotImplementedError

    def book(self, flight: Flight, reply) -> ChunkResult:
        raise NotImplementedError

    def is_death(self, exc: BaseException) -> bool:
        return False

    def reorders(self) -> bool:
        return False

    def waiting(self) -> bool:
        """True while a chunk trains whose reply has not come back."""
        return any(rid not in self.arrived for rid in self.inflight)

    def arrive(self, flight: Flight, reply) -> None:
        """A reply came back: the slot is free; the engine books the reply in its turn."""
        if flight.slot.busy_with == flight.run_id:
            flight.slot.busy_with = None
        self.arrived[flight.run_id] = (flight, reply)

    def drop(self, flight: Flight) -> None:
        """A chunk nobody books (its run was deleted meanwhile, or it failed)."""
        self.inflight.pop(flight.run_id, None)
        self.arrived.pop(flight.run_id, None)
        if flight.slot.busy_with == flight.run_id:
            flight.slot.busy_with = None

    # -- lifecycle hooks: when the engine calls them, and what the kernel's executor does --------
    # The engine is one class whatever trains its chunks; what another executor adds to the loop
    # (Ray's: starting workers, replacing lost ones) lives in these hooks. The defaults below are
    # the kernel's executor's, the reference implementation: nothing to start, nothing to replace.
    # ``engine`` is the one calling; under its lock unless said otherwise.

    #: whether ``release`` frees memory in this process (the engine then collects garbage)
    frees_local_memory: bool = True

    def prepare(self, specs) -> None:
        """run_fit's thread, once the bases are loaded and before any run exists: check that the
        executor can train these run specs (its errors show in the cell, and change nothing)."""

    def open(self) -> None:
        """Acquire what trains, at every ``Engine.start`` (every submitted op calls it, so it must
        be idempotent and cheap once done): the first call is in the caller's thread, so that its
        errors show in the caller's cell before any run moves; later ones may come from the
        engine thread, under the lock (a boundary policy's op)."""

    def begin(self, engine) -> None:
        """The engine thread, outside the lock, before the first turn of each loop."""

    def tick(self, engine) -> bool:
        """Every turn, before the free slots get chunks: False when none may get one this turn
        (no slot is up)."""
        return True

    def recovering(self, engine) -> bool:
        """Nothing in flight and nothing to dispatch: True while a slot is coming back (the loop
        waits for it instead of leaving)."""
        return False

    def leaving(self, engine) -> None:
        """The loop leaves: nothing is left to train."""

    def lost(self, engine, flight: Flight, exc: BaseException) -> bool:
        """A dispatched chunk came back as ``exc`` instead of a reply. True when the executor took
        it as the loss of the slot (``is_death``), which it handles (the run trains again from
        its last checkpoint elsewhere); False when the chunk failed for its run, which the engine
        then fails (the kernel's case: an exception in a run's chunk is that run's)."""
        return False

    def failure(self, exc: BaseException) -> tuple[str, str]:
        """How a run's failure reads: (its one-line reason, its error text), from the exception
        that failed it. Not necessarily under the lock: it reads the exception, nothing else."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return f"{type(exc).__name__}: {exc}", tb

    def close(self) -> None:
        """The engine closes, every run released: give back what ``open`` acquired."""

    #: the Ray workers this executor trains on (0: none, the kernel trains itself)
    worker_count: int = 0

    def training_now(self) -> dict[str, int]:
        """Under the lock: worker name -> the run whose chunk trains there, for a status line
        that names workers; {} where there are none to name (the kernel trains on its own
        device, which the panel shows already)."""
        return {}

    # -- training and run state -----------------------------------------------------------------
    def train_chunk(self, record: RunRecord) -> ChunkResult:
        raise NotImplementedError

    def release(self, record: RunRecord) -> None:
        raise NotImplementedError

    def live_weights(self, run_id: int) -> dict | None:
        raise NotImplementedError

    def set_start_weights(self, run_id: int, weights: dict) -> None:
        raise NotImplementedError

    def start_weights(self, run_id: int) -> dict | None:
        raise NotImplementedError

    def live_run_ids(self) -> list[int]:
        raise NotImplementedError


class LocalChunkExecutor(ChunkExecutor):
    """Trains in this process on one device, runs sharing their bases (engine/factory.py).

    As the loop's executor it has one slot; a dispatched chunk trains when it is collected (in the
    engine thread, outside the lock), so it is back at once and booked before anything else."""

    def __init__(self, factory: TrainerFactory, store: ExperimentStore, device_name: str,
                 residency: Residency, may_move: Callable[[int], bool],
                 progress_of: Callable[[int], float]):
        super().__init__()
        self.slot = Slot(device_name)
        self.factory = factory
        self.store = store
        self.device_name = device_name
        self.residency = residency
        self._may_move = may_move          # False while a run's checkpoint is being written
        self._progress_of = progress_of
        self.trainers: dict[int, RunTrainer] = {}
        self.pending_weights: dict[int, dict] = {}
        self.on_device: int | None = None
        # host buffers for the boundary snapshots, least recently used first: (the run whose
        # snapshot it holds, the buffer). At most one checkpoint is written at a time, so two
        # serve every run, instead of one copy of its state per run held in host memory
        self.snapshot_pool: list[tuple[int, SnapshotBuffers]] = []

    # -- interface ---------------------------------------------------------------------------
    def live_weights(self, run_id: int) -> dict | None:
        rt = self.trainers.get(run_id)
        return rt.weights() if rt is not None else None

    def set_start_weights(self, run_id: int, weights: dict) -> None:
        self.pending_weights[run_id] = weights

    def start_weights(self, run_id: int) -> dict | None:
        return self.pending_weights.get(run_id)

    def live_run_ids(self) -> list[int]:
        return list(self.trainers)

    def release(self, rec: RunRecord) -> None:
        rt = self.trainers.pop(rec.run_id, None)
        self.pending_weights.pop(rec.run_id, None)
        if self.on_device == rec.run_id:
            self.on_device = None
        if rt is not None:
            self.factory.drop_adapter(rec.spec, rt)
            rt.close()

    # -- the loop's seam: one slot ----------------------------------------------------------------
    def assignments(self, engine):
        """The fair rule's choice, unless its last chunk's checkpoint is still being written
        (then nothing: the loop flushes the writer first, so the training order never depends on
        the writer's speed)."""
        if self.slot.busy_with is not None or self.inflight:
            return
        choice = engine.fair_choice()
        if choice is not None and not engine.persistence.writer.pending(choice):
            yield self.slot, choice

    def dispatch(self, slot, rec: RunRecord, load_checkpoint) -> None:
        slot.busy_with = slot.last = rec.run_id
        self.inflight[rec.run_id] = Flight(rec.run_id, slot, ref=rec, epoch=rec.epoch,
                                           chunk=rec.chunk, sent=time.perf_counter())

    def collect(self, timeout: float) -> list[tuple[Flight, Any, BaseException | None]]:
        out = []
        for rid, flight in list(self.inflight.items()):
            if rid in self.arrived:
                continue
            try:
                out.append((flight, self.train_chunk(flight.ref), None))
            except Exception as exc:   # this run failed; the loop fails it, the others go on
                out.append((flight, None, exc))
        return out

    def book(self, flight: Flight, reply: ChunkResult) -> ChunkResult:
        self.drop(flight)
        return reply

    # -- building ----------------------------------------------------------------------------
    def _trainer_for(self, rec: RunRecord, restored: dict) -> RunTrainer:
        rt = self.trainers.get(rec.run_id)
        if rt is not None:
            return rt
        rt = self.factory.build(rec)
        if rec.completed_steps == 0 and rec.step_offset == 0:
            # TRL may drop examples while preparing the data (fully masked rows, packing): the
            # plan follows the prepared dataset, which is what the run actually walks
            total = rt.total_steps()
            if total != rec.total_steps or rt.plan.steps_per_epoch != rec.steps_per_epoch:
                rec.total_steps, rec.steps_per_epoch = total, rt.plan.steps_per_epoch
                restored.update(total_steps=total, steps_per_epoch=rt.plan.steps_per_epoch)
        rt.build_optimizer(rec.total_steps - rec.step_offset)
        for other in self.trainers.values():
            other.keep_parked()   # the new trainer's model.to(device) moved every adapter back
        ckpt = self.store.load_checkpoint(rec.run_id)
        if ckpt is not None:
            rt.load_state_dict(ckpt["trainer"])
            for key in COUNTERS:
                setattr(rec, key, ckpt["counters"][key])
                restored[key] = ckpt["counters"][key]
        elif rec.run_id in self.pending_weights:
            rt.load_weights(self.pending_weights.pop(rec.run_id))
        self.trainers[rec.run_id] = rt
        return rt

    def _snapshot_buffers(self, run_id: int) -> SnapshotBuffers:
        """A host buffer for ``run_id``'s boundary snapshot: the run's own from its last boundary
        when nobody took it since (same layout: nothing to reallocate), else the least recently
        used one whose checkpoint is written (``may_move``: no write pending for its run); a new
        one only when every buffer's write is still in flight."""
        pool = self.snapshot_pool
        free = [i for i, (owner, _) in enumerate(pool) if owner == run_id or self._may_move(owner)]
        own = [i for i in free if pool[i][0] == run_id]
        if own or free:
            _, buffers = pool.pop((own or free)[0])
        else:
            buffers = SnapshotBuffers()
        pool.append((run_id, buffers))
        return buffers

    # -- one chunk ---------------------------------------------------------------------------
    def train_chunk(self, rec: RunRecord) -> ChunkResult:
        t_start = time.time()
        restored: dict = {}
        with HF_STATE_LOCK:
            rt = self._trainer_for(rec, restored)
        t_built = time.time()
        # swap: make this run's adapter active and its RNG current (the previous run's RNG was
        # captured at its chunk boundary; building a trainer since then may have reseeded)
        t0 = time.perf_counter()
        others = [(other, self._progress_of(rid)) for rid, other in self.trainers.items()
                  if rid != rec.run_id and not other.parked and self._may_move(rid)]
        self.residency.make_room(rt, others)
        rt.unpark()
        rt.swap_in()
        self.on_device = rec.run_id
        swap_s = time.perf_counter() - t0
        end_probe = self.residency.memory_probe(rt)

        plan = rt.plan
        epoch, chunk = rec.epoch, rec.chunk
        first = max(rec.completed_steps, plan.chunk_start_step(epoch, chunk))
        if chunk + 1 < plan.num_chunks:
            end = plan.chunk_start_step(epoch, chunk + 1)
        else:
            end = plan.chunk_start_step(epoch + 1, 0)
        end = min(end, rec.total_steps)
        meter = MemoryMeter(self.device_name)
        meter.start()
        batch, samples, train_s, mid_eval_s, tokens = self._steps(rt, rec, first, end)
        peak_mb = meter.peak_mb()
        rt.swap_out()  # capture the RNG at the boundary (it is part of the checkpoint)
        if end_probe is not None:
            end_probe()

        t0 = time.perf_counter()
        with HF_STATE_LOCK:
            eval_metrics = rt.evaluate()
        eval_s = time.perf_counter() - t0 + mid_eval_s
        if eval_metrics:
            batch.append(("metric", dict(run_id=rec.run_id, split="eval", step=end,
                                         samples_seen=samples, epoch=epoch, chunk=chunk,
                                         metrics=eval_metrics)))
        # the same sample prompts for every run, so the panel can set their answers side by side
        t0 = time.perf_counter()
        with HF_STATE_LOCK:
            generated = sample_generations(rt, rec.samples)
        gen_s = time.perf_counter() - t0 if generated is not None else 0.0
        if generated is not None:
            batch.append(("generation", dict(run_id=rec.run_id, epoch=epoch, chunk=chunk, step=end,
                                             samples_seen=samples, **generated, gen_s=gen_s)))
        # advance the stream position
        next_epoch, next_chunk = (epoch, chunk + 1) if chunk + 1 < plan.num_chunks else (epoch + 1, 0)
        counters = dict(completed_steps=end, samples_seen=samples, epoch=next_epoch,
                        chunk=next_chunk, chunks_done=rec.chunks_done + 1)
        done = end >= rec.total_steps
        t_end = time.time()
        chunk_event = dict(run_id=rec.run_id, epoch=epoch, chunk=chunk, device=self.device_name,
                           start=t_start, end=t_end, train_s=train_s, eval_s=eval_s,
                           swap_s=swap_s, setup_s=t_built - t_start, other_s=0.0, gen_s=gen_s,
                           completed_steps=end, total_steps=rec.total_steps, samples_seen=samples,
                           chunks_done=counters["chunks_done"], tokens=tokens,
                           tokens_per_s=tokens / train_s if train_s > 0 else None)
        if peak_mb is not None:
            chunk_event["peak_mem_mb"] = peak_mb
        # the snapshot: every tensor of the run's state copied into a reusable host buffer (on
        # CUDA without waiting: the writer waits for the copies), so the writer thread writes
        # that buffer as it is and never touches the live state
        t0 = time.perf_counter()
        state = flat_snapshot({"trainer": rt.boundary_state(), "counters": counters, "events": batch,
                               "chunk_event": dict(chunk_event)}, self._snapshot_buffers(rec.run_id))
        chunk_event["snapshot_s"] = time.perf_counter() - t0
        chunk_event["end"] = time.time()
        chunk_event["other_s"] = max(0.0, (chunk_event["end"] - t_start) - train_s - eval_s - gen_s - swap_s)
        return ChunkResult(counters=counters, events=batch, chunk_event=chunk_event, state=state,
                           eval_metrics=eval_metrics, done=done, restored=restored)

    def _steps(self, rt: RunTrainer, rec: RunRecord, first: int, end: int):
        """Optimizer steps ``first``..``end`` of the run's stream, with the train metric windows
        and in-chunk evaluations the user's logging/eval steps ask for. Returns (metric events,
        samples seen after the last step, training seconds, in-chunk evaluation seconds, tokens
        trained on)."""
        epoch, chunk = rec.epoch, rec.chunk
        batch: list[tuple[str, dict]] = []
        t0 = time.perf_counter()
        samples = rec.samples_seen
        log_every, eval_every = rt.intervals(rec.total_steps - rec.step_offset)
        window: list[dict] = []
        windows: list[tuple[dict, list[dict]]] = []   # train metric events, filled at the end
        steps: list[dict] = []
        mid_eval_s = 0.0
        tokens = 0
        for g in range(first, end):
            e, s = rt.plan.position(g)
            with HF_STATE_LOCK:
                out = rt.train_step(e, s, g - rec.step_offset)
            samples += out["examples"]
            tokens += out.get("tokens", 0)
            own = g + 1 - rec.step_offset
            window.append(out["metrics"])
            steps.append(out["metrics"])
            if log_every is None or own % log_every == 0 or g + 1 == end:
                payload = dict(run_id=rec.run_id, split="train", step=g + 1, samples_seen=samples,
                               epoch=epoch, chunk=chunk, metrics=None)
                batch.append(("metric", payload))
                windows.append((payload, window))
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
        # what the steps left on the device (gradient norms), read once for the whole chunk
        read_step_metrics(steps)
        for payload, win in windows:
            payload["metrics"] = merge_window(win)
        train_s = time.perf_counter() - t0 - mid_eval_s
        return batch, samples, train_s, mid_eval_s, int(tokens)   # the one read of the token count
