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


class CheckpointWriter:
    """One worker thread, started on demand, that leaves after a short idle spell."""

    IDLE_EXIT_S = 2.0

    def __init__(self, name: str = "rapidfire-ckpt-writer"):
        self._name = name
        self._cv = threading.Condition()
        self._jobs: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self._pending: collections.Counter[int] = collections.Counter()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0      # time spent writing (off the engine thread)
        self.jobs_done = 0
        self.errors: list[str] = []

    def submit(self, run_id: int, job: Callable[[], None]) -> None:
        """Queue ``job`` (which must not raise) for ``run_id``; returns at once."""
        with self._cv:
            self._jobs.append((run_id, job))
            self._pending[run_id] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def pending(self, run_id: int) -> bool:
        with self._cv:
            return self._pending[run_id] > 0

    def is_worker(self, thread: threading.Thread) -> bool:
        with self._cv:
            return thread is self._thread

    def busy(self) -> bool:
        with self._cv:
            return bool(self._jobs) or any(self._pending.values())

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job has finished; False on timeout.

        From a job itself (an event listener called while a chunk is logged) this returns at once:
        that job's checkpoint is already on disk, and waiting on itself would never end."""
        if threading.current_thread() is self._thread:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._jobs or any(self._pending.values()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._jobs:
                    self._cv.wait(self.IDLE_EXIT_S)
                if not self._jobs:
                    self._thread = None   # under the lock: the next submit starts a new worker
                    return
                run_id, job = self._jobs.popleft()
            t0 = time.perf_counter()
            try:
                job()
            except Exception:  # jobs handle their own errors; this keeps the worker alive
                self.errors.append(traceback.format_exc())
            finally:
                job = None   # drop the snapshot now, not when the next job arrives
                with self._cv:
                    self.busy_s += time.perf_counter() - t0
                    self.jobs_done += 1
                    self._pending[run_id] -= 1
                    if self._pending[run_id] <= 0:
                        del self._pending[run_id]
                    self._cv.notify_all()
