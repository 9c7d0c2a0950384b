"""TrackerHub: feeds the experiment's event log to the enabled trackers, off the training thread.

Each tracker gets its own daemon thread (a slow or hung backend delays nobody else) that replays
the event log from the start through the one reducer (``engine/state.py``) to rebuild the run
table, and calls the tracker only for events after the last seq that tracker handled. That seq
is persisted per tracker in ``<experiment>/tracking/<name>.json`` (written atomically, after the tracker flushed), so a
resumed experiment continues the trackers' existing runs without logging a point twice. A
tracker that raises, at import, open or any event, warns once and is disabled; nothing it does
reaches the training thread or the other trackers.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Iterable

from ..engine import EventLog, atomic_write_json, get_run, metric_x, new_table, read_json, reduce
from .base import RunState, Tracker, TrackerContext, metric_tag, numeric, run_params

STATE_DIR = "tracking"
# how many events a worker hands its tracker between two flushes
_BATCH = 1000


class TrackerWarning(UserWarning):
    """A tracker failed and was disabled; training goes on."""


def _make_tracker(name: str) -> Tracker:
    # Imported lazily: a backend whose package is missing fails here, inside its worker thread,
    # and is disabled with a warning like any other tracker failure.
    if name == "tensorboard":
        from .tb_tracker import TensorBoardTracker

        return TensorBoardTracker()
    if name == "mlflow":
        from .mlflow_tracker import MlflowTracker

        return MlflowTracker()
    if name == "trackio":
        from .trackio_tracker import TrackioTracker

        return TrackioTracker()
    raise ValueError(f"unknown tracker {name!r}")


class TrackerHub:
    """Consumes ``events`` and feeds every tracker in ``names``.

    ``names`` holds tracker names (see ``resolve_trackers``) or Tracker instances.
    Call ``start()`` once; ``flush(timeout)`` waits until every event appended so far is handled
    (and persisted) by every live tracker; ``close()`` flushes, stops the threads and closes the
    backends. ``failures`` maps a disabled tracker's name to its error.
    """

    def __init__(self, events: EventLog, experiment_path: str | os.PathLike,
                 experiment_name: str, names: Iterable[str | Tracker]):
        self.events = events
        self.experiment_path = Path(experiment_path)
        self.experiment_name = str(experiment_name)
        self.failures: dict[str, str] = {}
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        seen: set[str] = set()
        for item in names:
            tracker_name = item.name if isinstance(item, Tracker) else str(item)
            if tracker_name in seen:
                continue
            seen.add(tracker_name)
            self._workers.append(_Worker(self, item, tracker_name))
        self._unsubscribe = None
        self._started = False
        self._closed = False

    @property
    def names(self) -> list[str]:
        """Trackers that are enabled and have not failed."""
        return [w.name for w in self._workers if w.error is None]

    def start(self) -> TrackerHub:
        with self._lock:
            if self._started or self._closed:
                return self
            self._started = True
        # The listener runs in the appending (training) thread: it only sets events.
        self._unsubscribe = self.events.subscribe(self._wake_all)
        for worker in self._workers:
            worker.start()
        return self

    def _wake_all(self, _event: dict) -> None:
        for worker in self._workers:
            worker.wake.set()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until every event appended so far is handled; True if all trackers caught up."""
        if not self._started:
            return not self._workers
        target = self.events.last_seq
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = True
        for worker in self._workers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = worker.wait_handled(target, left) and ok
        return ok

    def close(self, timeout: float | None = 30.0) -> bool:
        """Flush, then stop and close every tracker. Safe to call twice."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
            started = self._started
        ok = self.flush(timeout) if started else True
        if self._unsubscribe is not None:
            self._unsubscribe()
        deadline = None if timeout is None else time.monotonic() + timeout
        for worker in self._workers:
            worker.stop.set()
            worker.wake.set()
        for worker in self._workers:
            if worker.thread is not None:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                worker.thread.join(left)
        return ok

    def _failed(self, worker: _Worker, exc: BaseException) -> None:
        message = f"{type(exc).__name__}: {exc}"
        self.failures[worker.name] = message
        if isinstance(exc, ImportError) and worker.name in ("mlflow", "trackio"):
            message += (f"; install it with: pip install {worker.name} (or install rapidfire-nb "
                        f"with the [{worker.name}] extra: pip install -e '.[{worker.name}]' from the clone)")
        try:
            warnings.warn(
                f"rapidfire_nb: the {worker.name} tracker failed and is disabled for experiment "
                f"{self.experiment_name!r} ({message}); training is not affected.",
                TrackerWarning, stacklevel=2,
            )
        except Exception:  # warnings turned into errors must not kill the thread noisily
            pass


class _Worker:
    """One tracker and the thread that feeds it."""

    def __init__(self, hub: TrackerHub, item: str | Tracker, name: str):
        self.hub = hub
        self.item = item
        self.name = name
        self.tracker: Tracker | None = None
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.stop = threading.Event()
        self.error: str | None = None
        self.table = new_table()              # the reducer's run table (engine/state.py)
        self.runs: dict[int, RunState] = {}   # the trackers' view of each created run
        self.seen_seq = 0          # every event up to here is applied (and, if new, persisted)
        self.persisted_seq = 0     # the tracker handled events up to here in an earlier flush
        self._cond = threading.Condition()
        self.state_path = hub.experiment_path / STATE_DIR / f"{name}.json"

    def start(self) -> None:
        self.thread = threading.Thread(target=self._main, name=f"rapidfire-tracker-{self.name}",
                                       daemon=True)
        self.thread.start()

    def wait_handled(self, seq: int, timeout: float | None) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: self.error is not None or self.seen_seq >= seq
                or (self.thread is not None and not self.thread.is_alive()), timeout)

    # -- the thread ---------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._open()
            while True:
                batch = self.hub.events.since(self.seen_seq, limit=_BATCH)
                if batch:
                    self._handle(batch)
                    continue
                if self.stop.is_set():
                    break
                self.wake.wait(0.5)
                self.wake.clear()
        except BaseException as exc:  # noqa: BLE001 - a tracker must never take anything down
            self.error = f"{type(exc).__name__}: {exc}"
            self.hub._failed(self, exc)
        finally:
            tracker, self.tracker = self.tracker, None
            if tracker is not None:
                try:
                    tracker.close()
                except Exception:  # already failing or closing; the warning was given
                    pass
            with self._cond:
                self._cond.notify_all()

    def _open(self) -> None:
        stored = _read_state(self.state_path)
        self.persisted_seq = int(stored.get("last_seq", 0))
        self.tracker = self.item if isinstance(self.item, Tracker) else _make_tracker(self.item)
        self.tracker.state = dict(stored.get("state") or {})
        self.tracker.open(TrackerContext(
            experiment_path=self.hub.experiment_path,
            experiment_name=self.hub.experiment_name,
            state=self.tracker.state,
            resumed=self.persisted_seq > 0,
        ))

    def _handle(self, batch: list[dict]) -> None:
        tracker = self.tracker
        for event in batch:
            self._apply(event, tracker if event["seq"] > self.persisted_seq else None)
        last = batch[-1]["seq"]
        if last > self.persisted_seq:
            tracker.flush()
            atomic_write_json(self.state_path, {"last_seq": last, "state": tracker.state})
            self.persisted_seq = last
        with self._cond:
            self.seen_seq = last
            self._cond.notify_all()

    def _apply(self, event: dict, tracker: Tracker | None) -> None:
        """Fold one event into the run table; call the tracker when the event is new to it."""
        reduce(self.table, event)
        kind = event.get("type")
        wall = float(event.get("time") or time.time())
        row = get_run(self.table, _int_or_none(event.get("run_id")))
        if row is None:
            return
        if kind == "run_created":
            run = RunState(
                run_id=row["run_id"], trainer_type=row["trainer_type"], config=dict(row["config"]),
                knobs=dict(row["knobs"]), params=run_params(row),
                parent_run_id=row["parent_run_id"], warm_start=row["warm_start"],
                samples_seen=row["samples_seen"])
            self.runs[run.run_id] = run
            if tracker is not None:
                tracker.run_created(run, wall)
            return
        run = self.runs.get(row["run_id"])
        if run is None:
            return
        run.samples_seen, run.status, run.error = row["samples_seen"], row["status"], row["error"]
        if kind == "metric":
            split = str(event.get("split") or "train")
            metrics: dict[str, float] = {}
            for key, value in (event.get("metrics") or {}).items():
                number = numeric(value)
                if number is not None:
                    metrics[metric_tag(split, key)] = number
            if split == "train" and event.get("step") is not None:
                metrics["train/global_step"] = float(event["step"])
                run.global_step = int(event["step"])
            run.last_metrics.update(metrics)
            run.metric_events += 1
            if metrics and tracker is not None:
                # the one x axis (engine/state.py): samples seen, as in the panel's charts
                tracker.log_metrics(run, metric_x(event) or 0, metrics, wall)
        elif kind == "run_status":
            status = row["status"]
            events = [_lifecycle(run, status)]
            if events[0] == "resumed" and status == "running" and not run.started:
                events.append("running")
            for lifecycle in events:
                if lifecycle is None:
                    continue
                if lifecycle == "running":
                    run.started = True
                run.lifecycle = lifecycle
                run.lifecycle_events += 1
                detail = event.get("error") if status == "failed" else event.get("reason")
                if tracker is not None:
                    tracker.lifecycle(run, lifecycle, run.samples_seen, detail, wall)


def _lifecycle(run: RunState, status: str) -> str | None:
    """The lifecycle event a status change means, or None (e.g. pending/running swaps).

    ``running`` marks the first time the run is on the device, also when that comes after a
    stop and resume of a run that had not started yet.
    """
    if status in ("pending", "running") and run.lifecycle == "stopped":
        return "resumed"
    if status == "running" and not run.started:
        return "running"
    if status in ("stopped", "completed", "failed", "deleted") and run.lifecycle != status:
        return status
    return None


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _read_state(path: Path) -> dict:
    from rapidfire_nb.errors import RapidFireError

    try:
        # a regular file, read up to a bound (a named pipe there would hold the open for ever)
        data = read_json(path, {})
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RapidFireError):
        # written atomically, so a broken file means someone else touched it: start over
        # rather than refuse to track
        return {}
