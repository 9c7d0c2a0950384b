"""Append-only event log with sequence numbers: the single source of truth.

Trackers, the panel and ``get_results`` all read this log; the engine only appends.
Each event is a JSON-able dict ``{"seq": int, "time": float, "type": str, **payload}``;
``seq`` starts at 1 and increases by one per event, so readers ask for
"everything after seq N" and pushes/pulls are idempotent.

Event types and payloads (``run_id`` is an int where present):

- ``experiment``    {name, path, resumed: bool}
- ``run_created``   {run_id, trainer_type, config, knobs, parent_run_id, warm_start,
                     total_steps, steps_per_epoch, num_chunks, base_samples_seen}
                     ``config`` is the run's full JSON leaf config (see RunSpec.config_dict),
                     ``knobs`` the flat {dotted.key: value} of what varies in the group.
- ``run_status``    {run_id, status, error (traceback text or None), reason (str or None)}
                     status in pending/running/stopped/completed/failed/deleted
- ``metric``        {run_id, split ("train"|"eval"), step, samples_seen, epoch, chunk,
                     metrics: {name: float}}
                     train metrics (loss, learning_rate, grad_norm, ...) per logging step,
                     eval metrics (eval_loss, user metrics, rewards) after every chunk.
- ``chunk_done``    {run_id, epoch, chunk, device, start, end, train_s, eval_s, swap_s,
                     other_s, completed_steps, total_steps, samples_seen, chunks_done}
- ``op``            {op, run_id, accepted: bool, reason, new_run_id (clone)} an IC op
                     as applied by the controller.
- ``experiment_end`` {}

The log lives in memory and, when a path is given, in ``events.jsonl`` (one JSON per line,
flushed and fsynced per event batch) so a dead kernel loses nothing already logged.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable


class EventLog:
    """Thread-safe append-only log. ``append`` from any thread; readers poll ``since``."""

    def __init__(self, path: str | os.PathLike | None = None):
        self._lock = threading.Condition()
        self._events: list[dict] = []
        self._path = Path(path) if path is not None else None
        self._file = None
        self._listeners: list[Callable[[dict], None]] = []
        if self._path is not None:
            if self._path.exists():
                self._events = list(_read_events(self._path))
                _truncate_partial_tail(self._path)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._path, "a", encoding="utf-8")

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._events[-1]["seq"] if self._events else 0

    def append(self, type: str, **payload: Any) -> dict:
        return self.extend([(type, payload)])[-1]

    def extend(self, items: Iterable[tuple[str, dict]]) -> list[dict]:
        """Append several events atomically (one write + fsync)."""
        with self._lock:
            seq = self._events[-1]["seq"] if self._events else 0
            now = time.time()
            new = []
            for type_, payload in items:
                seq += 1
                new.append({"seq": seq, "time": now, "type": type_, **payload})
            if self._file is not None:
                self._file.write("".join(json.dumps(e, default=_json_default) + "\n" for e in new))
                self._file.flush()
                os.fsync(self._file.fileno())
            self._events.extend(new)
            self._lock.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            for event in new:
                try:
                    listener(event)
                except Exception:  # a listener never breaks the writer
                    pass
        return new

    def since(self, seq: int = 0, limit: int | None = None) -> list[dict]:
        """Events with ``seq`` greater than the given one, oldest first."""
        with self._lock:
            # seqs are dense and start at 1 (index = seq - 1)
            start = max(0, min(int(seq), len(self._events)))
            out = self._events[start:]
            return list(out if limit is None else out[:limit])

    def wait_for(self, seq: int, timeout: float | None = None) -> bool:
        """Block until an event with a seq greater than ``seq`` exists."""
        with self._lock:
            return self._lock.wait_for(lambda: self.last_seq_unlocked() > seq, timeout)

    def last_seq_unlocked(self) -> int:
        return self._events[-1]["seq"] if self._events else 0

    def subscribe(self, listener: Callable[[dict], None]) -> Callable[[], None]:
        """Call ``listener(event)`` for each new event, in the appending thread.

        Keep listeners tiny (enqueue and return); exceptions are swallowed.
        Returns a function that unsubscribes.
        """
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:  # pragma: no cover
        pass
    return repr(obj)


def _read_events(path: Path) -> Iterable[dict]:
    """Complete lines only: a line cut by a crash mid-write is ignored."""
    expected = 1
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break
            if event.get("seq") != expected:
                break
            expected += 1
            yield event


def _truncate_partial_tail(path: Path) -> None:
    """Drop bytes after the last complete, valid line so appends stay line-aligned."""
    good = 0
    expected = 1
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                event = json.loads(raw)
            except ValueError:
                break
            if event.get("seq") != expected:
                break
            expected += 1
            good += len(raw)
    if good != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
            f.flush()
            os.fsync(f.fileno())
