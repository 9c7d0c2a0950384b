"""Persistence: runs.json writes and making each finished chunk durable before it is logged.

The engine thread snapshots a chunk's state; the writer thread (engine/writer.py) saves the
checkpoint, then appends the chunk's events, then rewrites runs.json: a crash between any two of
these steps is mended on resume because the checkpoint carries the chunk's events. Failures are
collected here and acted on by the engine thread (``take_failures``), the only thread that may
release a run's trainer.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.engine.export import write_final_checkpoint
from rapidfire_nb.engine.fsio import atomic_write_json
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.store import (
    ExperimentStore,
    durable_write_failure,
)
from rapidfire_nb.engine.writer import CheckpointWriter


@contextlib.contextmanager
def checkpoint_writes(on: bool):
    """Measuring only (``rapidfire bench --no-checkpoints``): with ``on=False``, engines made
    inside log their chunks without writing a checkpoint, to size what writing costs. Never a mode
    to train in: without checkpoints a crash would lose every chunk."""
    if on:
        yield
        return
    Persistence._write_checkpoints = False
    try:
        yield
    finally:
        Persistence._write_checkpoints = True


class Persistence:
    # set by ``checkpoint_writes`` alone
    _write_checkpoints = True

    def __init__(self, store: ExperimentStore, events: EventLog, lock: threading.RLock,
                 runs: dict[int, RunRecord]):
        self.store = store
        self.events = events
        self._lock = lock          # the engine's lock: it guards ``runs`` and what is below
        self._runs = runs
        # chunk checkpoints are written off the engine thread
        self.writer = CheckpointWriter()
        self.write_wait_s = 0.0   # engine time spent waiting for the writer
        self._failures: list[tuple] = []
        self._unwritten: dict[int, dict] = {}   # run -> its counters as of its last durable chunk
        self._runs_file_lock = threading.Lock()
        self._runs_version = self._runs_written = 0
        self.runs_write_error: OSError | None = None
        self._deferred = 0

    # -- runs.json ---------------------------------------------------------------------------
    def save_runs(self) -> bool:
        """Persist every run record; False (and ``runs_write_error``) when the write failed. The
        snapshot is taken under the engine lock; the write (with its fsyncs) happens outside it
        when the caller does not hold the lock, and a snapshot older than one already written is
        dropped, so runs.json never goes back in time."""
        if self._deferred:
            return True
        with self._lock:
            self._runs_version += 1
            version = self._runs_version
            data = {str(k): r.to_json() for k, r in self._runs.items()}
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
                    # intact, the next save writes everything; persist() fails the affected run
                    self.runs_write_error = exc
                    return False
                self._runs_written = version
                self.runs_write_error = None
        return True

    def defer_runs_writes(self) -> None:
        self._deferred += 1

    def resume_runs_writes(self) -> None:
        self._deferred -= 1

    # -- chunk writes ------------------------------------------------------------------------
    def mark_unwritten(self, run_id: int, before: dict) -> None:
        """Under the engine lock, before a run's counters advance past its durable chunk: until
        the checkpoint is written, runs.json keeps ``before``."""
        self._unwritten[run_id] = before

    def submit_chunk(self, rec: RunRecord, state: dict, batch: list, chunk_event: dict, done: bool,
                     before: dict, complete: Callable[[RunRecord], None], routed) -> None:
        """Engine thread, after ``mark_unwritten`` and advancing ``rec``'s counters: queue the
        chunk's checkpoint write. At most one checkpoint is in flight: a crash loses the chunk
        being trained and at most the one chunk whose checkpoint was still being written."""
        if self.writer.busy():
            t0 = time.perf_counter()
            self.writer.flush()
            self.write_wait_s += time.perf_counter() - t0
        self.writer.submit(rec.run_id, lambda: routed(
            lambda: self._persist(rec, state, batch, chunk_event, done, before, complete)))

    def flush(self) -> None:
        """Wait for the writer (outside the engine lock: its follow-ups take it)."""
        t0 = time.perf_counter()
        self.writer.flush()
        self.write_wait_s += time.perf_counter() - t0

    def _persist(self, rec: RunRecord, state: dict, batch: list, chunk_event: dict, done: bool,
                 before: dict, complete: Callable[[RunRecord], None]) -> None:
        """Writer thread: make the chunk durable, then log it (never the other way round)."""
        t0 = time.perf_counter()
        try:
            if self._write_checkpoints:
                self.store.save_checkpoint(rec.run_id, state)
        except Exception as exc:
            with self._lock:
                self._unwritten.pop(rec.run_id, None)
                self._failures.append((rec, exc, before))
            return
        chunk_event["checkpoint_s"] = time.perf_counter() - t0
        with self._lock:
            self._unwritten.pop(rec.run_id, None)
        try:
            # the log has its own lock; holding the engine's through an fsync would stall it
            logged = self.events.extend(batch + [("chunk_done", chunk_event)])
            if done:
                # RapidFire's final checkpoint, whole before the run reads as completed
                write_final_checkpoint(self.store, rec)
                complete(rec)
            saved = self.save_runs()
            failure = durable_write_failure(self.events, logged[-1]["seq"], saved,
                                            self.runs_write_error, rec.run_id, self.store)
            if failure is not None:
                raise failure
        except Exception as exc:
            # the checkpoint is on disk (a restart re-logs its events from it); this session
            # cannot log the run any more: it fails, visibly, with its counters as on disk
            with self._lock:
                self._failures.append((rec, exc, None))

    def take_failures(self) -> list[tuple]:
        """Under the engine lock: (record, exception, counters to go back to or None) of every
        chunk write that failed since the last call."""
        failures, self._failures = self._failures, []
        return failures
