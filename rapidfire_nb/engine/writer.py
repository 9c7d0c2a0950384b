"""Background persistence of chunk-boundary checkpoints.

Serialising a run's state, writing it aside, fsyncing and renaming it used to happen on the engine
thread between chunks, where every millisecond is time the device does not train. The engine now
takes a snapshot (its weights copied, its optimizer/scheduler state by reference) and hands it to
this writer, then trains the next run's chunk while the file is written.

What keeps this exact and crash safe:
- jobs run one at a time, in submission order, so the log receives chunks in the order they ended;
- a job's follow-up (appending the chunk's events, marking a finished run completed) runs only
  after its checkpoint is durable: the log is never ahead of the checkpoints, as before;
- a run with a write in flight is not trained (the snapshot references its live optimizer state),
  and the engine flushes the writer before it applies any op (stop, delete, clone, resume), before
  it leaves, and before anything reads a checkpoint back.
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait


class CheckpointWriter:
    """A one-worker ``ThreadPoolExecutor`` (FIFO: jobs run in submission order), made when a job
    arrives and shut down when the last queued job ends, so an idle engine holds no thread."""

    def __init__(self, name: str = "rapidfire-ckpt-writer"):
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._futures: set[Future] = set()
        self._pending: collections.Counter[int] = collections.Counter()
        self._worker: threading.Thread | None = None
        self.busy_s = 0.0      # time spent writing (off the engine thread)
        # the writer thread's CPU time: the part of busy_s that is not waiting on the disk, an
        # upper bound on how long it held the interpreter (``rapidfire bench`` reports it)
        self.cpu_s = 0.0
        self.jobs_done = 0
        self.errors: list[str] = []

    def submit(self, run_id: int, job: Callable[[], None]) -> None:
        """Queue ``job`` (which must not raise) for ``run_id``; returns at once."""
        with self._lock:
            if self._executor is None:
                # the worker takes the writer's own name (not the pool's "<prefix>_0"): logs and
                # tests know the checkpoint thread by it
                self._executor = ThreadPoolExecutor(max_workers=1, initializer=self._name_worker)
            self._pending[run_id] += 1
            future = self._executor.submit(self._run, run_id, job)
            self._futures.add(future)
        future.add_done_callback(self._forget)

    def _name_worker(self) -> None:
        threading.current_thread().name = self._name

    def pending(self, run_id: int) -> bool:
        with self._lock:
            return self._pending[run_id] > 0

    def is_worker(self, thread: threading.Thread) -> bool:
        return thread is self._worker

    def busy(self) -> bool:
        with self._lock:
            return any(self._pending.values())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job has finished; False on timeout.

        From a job itself (an event listener called while a chunk is logged) this returns at once:
        that job's checkpoint is already on disk, and waiting on itself would never end."""
        if threading.current_thread() is self._worker:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                futures = list(self._futures)
            if not futures:
                return True
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if wait(futures, left).not_done:
                return False

    def _forget(self, future: Future) -> None:
        with self._lock:
            self._futures.discard(future)

    def _run(self, run_id: int, job: Callable[[], None]) -> None:
        self._worker = threading.current_thread()
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            job()
        except Exception:  # jobs handle their own errors; this keeps the writer going
            self.errors.append(traceback.format_exc())
        finally:
            with self._lock:
                self.busy_s += time.perf_counter() - t0
                self.cpu_s += time.thread_time() - c0
                self.jobs_done += 1
                self._pending[run_id] -= 1
                if self._pending[run_id] <= 0:
                    del self._pending[run_id]
                if not self._pending and self._executor is not None:
                    # nothing queued behind this job (submit holds the same lock): the worker
                    # leaves once it returns, and the next submit makes a new executor
                    self._executor.shutdown(wait=False)
                    self._executor = None
