"""The in-notebook control panel: one anywidget over an Experiment's event log.

``Panel(exp)`` (or ``panel_for(exp)``, which reuses a live one) is what an Experiment displays as.
Its view is the ESM bundle ``rapidfire_nb/static/panel.js``, built from ``js/`` (TypeScript, its
charts drawn on a 2D canvas) by ``npm run build`` there and committed, so installing needs no Node.js.

How state reaches the view (the wire format is in ``_panel_protocol``):

- ``snapshot`` (a synced trait): experiment name, path, last seq, run statuses and the run on
  the device (``on_device``, also in pull replies); small.
- Deltas are the events of ``exp.events`` themselves, identified by their ``seq``:
  a publisher thread *pushes* new events (coalesced, a few messages a second at most), and the
  view *pulls* "events since N" on a timer, because Colab does not deliver messages sent from
  background threads. Seqs make both idempotent, and a view rendered later rebuilds itself by
  pulling from 0.
- The training thread never touches the widget: its only contact is the EventLog listener, which
  sets a ``threading.Event``.

Front-end messages (button clicks, pulls) are validated against a strict schema, then call the
Experiment's op methods, which themselves only validate and enqueue. Handlers may run on a
subshell thread concurrently with user code, so they hold a lock, return at once, and never let
an exception reach the kernel.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from rapidfire_nb.engine import LiveTable, get_run
from rapidfire_nb.errors import RapidFireError
from rapidfire_nb.experiment_view import ExperimentView, view_of
from rapidfire_nb.notebook import _panel_protocol as proto

__all__ = ["Panel", "panel_for", "bundle_path"]

log = logging.getLogger(__name__)

_BUNDLE = Path(__file__).resolve().parent.parent / "static" / "panel.js"

# Shown instead of the panel when the JavaScript bundle was never built (a source checkout
# installed without the build hook); it tells the user how to build it.
_MISSING_BUNDLE_ESM = """
export default {
  render({ el }) {
    const box = document.createElement("div");
    box.style.cssText = "border:1px solid #c62828;border-radius:4px;padding:8px;color:#c62828;" +
      "font-family:sans-serif;font-size:13px";
    const title = document.createElement("b");
    title.textContent = "rapidfire_nb: the panel's JavaScript bundle is missing";
    const text = document.createElement("div");
    text.textContent = %s;
    box.append(title, text);
    el.append(box);
  },
};
"""
_MISSING_BUNDLE_TEXT = (
    "rapidfire_nb/static/panel.js is missing from this install. It is part of the repository: "
    "reinstall from a complete clone (`pip install .` needs no Node.js), or rebuild it with "
    "`cd js && npm install && npm run build` (Node.js 20+). Training is unaffected: "
    "exp.get_runs_info() and %rapidfire status work."
)

PUSH_INTERVAL_S = 0.3
SNAPSHOT_INTERVAL_S = 1.0
# A view displayed while runs train rebuilds its history by pulling from seq 0, but a pull is
# answered only when the kernel is free: behind a cell that waits (a cell queued behind a
# mode="fit" run_fit, or exp.wait() in the displaying cell) it would show nothing until the wait
# ends, since the live pushes start past what it lacks. So the publisher also pushes the log from
# the start this long after each display (the view has rendered by then); seqs make the repeat
# harmless to views that already have it.
REPLAY_AFTER_DISPLAY_S = (1.0, 4.0)


def _text(value: Any) -> str:
    """A name or a path on the wire; "" where the experiment has none."""
    return "" if value is None else str(value)


def bundle_path() -> Path:
    """Where the built view is expected."""
    return _BUNDLE


def _load_esm() -> str:
    try:
        return _BUNDLE.read_text(encoding="utf-8")
    except FileNotFoundError:
        log.warning(_MISSING_BUNDLE_TEXT)
        import json

        return _MISSING_BUNDLE_ESM % json.dumps(_MISSING_BUNDLE_TEXT)


class Panel(anywidget.AnyWidget):
    """Live curves, a run table and Stop / Resume / Delete / Clone-modify buttons for ``exp``.

    ``exp``: an Experiment or its view (``Experiment.view()``), read through that view only;
    or a stand-in with ``name``, ``path``, ``events`` (an EventLog) and the op methods ``stop``,
    ``resume``, ``delete``, ``clone_modify``, ``validate_clone`` and ``editable_knobs``
    (``rapidfire_nb.experiment_view``).
    """

    snapshot = traitlets.Dict().tag(sync=True)

    def __init__(self, exp: Any, *, push: bool = True, **kwargs: Any):
        """``push=False`` leaves out the publisher thread: the view then lives on its pulls alone,
        which is what it gets in front ends that drop background-thread messages (Colab)."""
        view = view_of(exp)
        events = view.events
        if events is None:
            raise TypeError(
                f"Panel needs an Experiment with an event log (exp.events), got {type(exp).__name__}"
            )
        # anywidget reads `_esm` in __init__; read per instance so a bundle built after import counts.
        self._esm = _load_esm()
        self._view: ExperimentView = view
        self._events = events
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        # the run table (engine/state.py), folded incrementally: the snapshot and traceback
        # requests read it instead of scanning the log
        self._table = LiveTable(events)
        self._closed = False
        super().__init__(**kwargs)
        self.snapshot = self._make_snapshot()
        self.on_msg(self._on_frontend_msg)
        self._publisher = _Publisher(self) if push else None
        if self._publisher is not None:
            self._publisher.start()

    # -- state -------------------------------------------------------------------------------

    def _statuses(self) -> tuple[int, dict[int, str]]:
        """(last seq folded, run id -> status), from the table, up to date."""
        return self._table.read(lambda t: (t["last_seq"], {
            r["run_id"]: r["status"] for r in sorted(t["runs"].values(), key=lambda r: r["run_id"])}))

    def _make_snapshot(self) -> dict:
        last_seq, statuses = self._statuses()
        return {
            "protocol": proto.PROTOCOL_VERSION,
            "experiment": _text(self._view.name),
            "path": _text(self._view.path),
            "last_seq": last_seq,
            "runs": {str(k): v for k, v in statuses.items()},
            "on_device": self._on_device(),
            "queued": self._queued(),
            # opened for its results only (Experiment.open): the view turns its buttons off
            "read_only": self._view.read_only,
        }

    def _queued(self) -> list[list] | None:
        """The stop / resume / delete ops accepted but not applied yet, as ``[[op, run_id], ...]``
        in queue order, so a row can say "stopping…" until the run's next chunk boundary. Read
        from the engine's own op queue; None when the engine is busy holding its lock (the view
        keeps what it last had)."""
        ops = self._view.queued_ops(timeout=0.2)
        if ops is None:
            return None
        return [[op.kind, op.run_id] for op in ops
                if op.kind in ("stop", "resume", "delete") and isinstance(op.run_id, int)]

    def _on_device(self) -> int | None:
        """The run whose adapter is on the device now (the engine's own record), so the view's
        row badges can say which run trains and which wait; None when unknown or idle."""
        return self._view.on_device

    def _refresh_snapshot(self) -> None:
        with self._lock:
            snap = self._make_snapshot()
        if snap != self.snapshot and not self._closed:
            self.snapshot = snap

    def __repr__(self) -> str:
        counts: dict[str, int] = {}
        for status in self._statuses()[1].values():
            counts[status] = counts.get(status, 0) + 1
        detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no runs yet"
        name = self._view.name
        return f"<rapidfire panel: {'?' if name is None else name} ({detail})>"

    def _repr_mimebundle_(self, **kwargs: Any):
        """The widget view plus a static ``text/html`` copy of the run table: front ends with a
        live kernel render the widget, a saved notebook on GitHub or nbviewer shows the table."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if self._publisher is not None:
            self._publisher.replay_soon()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict):
            try:
                from rapidfire_nb.report import fallback_html, snapshot

                table = self._table.read(snapshot)
                table["experiment"] = table["experiment"] or _text(self._view.name)
                data["text/html"] = fallback_html(table)
            except Exception:   # the live view matters more than its static copy
                log.debug("rapidfire panel: no static fallback", exc_info=True)
        return bundle

    # -- Python -> view ------------------------------------------------------------------------

    def _send_custom(self, content: dict) -> None:
        if self._closed:
            return
        with self._send_lock:
            self.send(content)

    def _push(self, events: list[dict]) -> None:
        message = {"type": "events", "events": events, "last_seq": self._events.last_seq}
        queued = self._queued()
        if queued is not None:
            message["queued"] = queued
        self._send_custom(message)

    # -- view -> Python ------------------------------------------------------------------------

    def _on_frontend_msg(self, _widget: Any, content: Any, buffers: Any) -> None:
        """The registered comm callback: answer every message with exactly one reply."""
        try:
            rid = proto.request_id_of(content)
        except Exception:
            rid = None
        try:
            answer = self.handle_message(content, buffers)
        except Exception as exc:  # handle_message catches everything; this is the last fence
            log.exception("rapidfire panel: unexpected error in message handler")
            answer = proto.reply(rid, False, f"internal error: {type(exc).__name__}")
        try:
            self._send_custom(answer)
        except Exception:
            log.exception("rapidfire panel: could not send a reply")

    def handle_message(self, content: Any, buffers: Any = None) -> dict:
        """Validate one front-end message, act on it, and return the reply (never raises)."""
        rid = proto.request_id_of(content)
        try:
            request = proto.parse_message(content, buffers)
        except proto.MessageError as exc:
            return proto.reply(rid, False, f"malformed message: {exc}")
        except Exception as exc:
            return proto.reply(rid, False, f"malformed message ({type(exc).__name__})")
        with self._lock:
            try:
                return self._dispatch(request)
            except RapidFireError as exc:
                return proto.reply(rid, False, str(exc) or type(exc).__name__)
            except (ValueError, KeyError, TypeError, LookupError) as exc:
                msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
                return proto.reply(rid, False, f"{type(exc).__name__}: {msg}")
            except Exception as exc:
                log.exception("rapidfire panel: %s failed", request.type)
                return proto.reply(rid, False, f"internal error: {type(exc).__name__}: {exc}")

    def _dispatch(self, req: proto.Request) -> dict:
        rid = req.request_id
        if req.type == "pull":
            pending = self._events.since(req.since, limit=proto.MAX_BATCH_EVENTS + 1)
            events, more = proto.batch_events(pending)
            extra = {} if (queued := self._queued()) is None else {"queued": queued}
            return proto.reply(rid, True, events=events, last_seq=self._events.last_seq, more=more,
                               on_device=self._on_device(), **extra)
        if req.type == "traceback":
            return self._traceback(req)
        if req.type == "note":
            self._view.note(req.run_id, req.text)
            return proto.reply(rid, True, run_id=req.run_id)
        if req.type == "editable":
            knobs = self._view.editable_knobs(req.run_id)
            if not isinstance(knobs, dict):
                raise TypeError(f"editable_knobs returned {type(knobs).__name__}, not a dict")
            return proto.reply(rid, True, run_id=req.run_id,
                               knobs=proto.to_json(knobs, max_string=proto.MAX_STRING_LEN))
        if req.op == "clone":
            if req.validate_only:
                self._view.validate_clone(req.run_id, dict(req.changes), warm_start=req.warm_start)
                return proto.reply(rid, True, run_id=req.run_id, validated=True)
            new_id = self._view.clone_modify(req.run_id, dict(req.changes), warm_start=req.warm_start)
            return proto.reply(rid, True, run_id=req.run_id, new_run_id=proto.to_json(new_id))
        if req.op in ("confirm_suggestion", "ignore_suggestion"):
            answer = (self._view.apply_suggestions if req.op == "confirm_suggestion"
                      else self._view.dismiss_suggestions)
            answer([req.run_id])
            return proto.reply(rid, True, run_id=req.run_id, op=req.op)
        self._view.status_op(req.op, req.run_id)
        # The op is queued now: the reply carries the queue, so the row says "stopping…" at once.
        extra = {} if (queued := self._queued()) is None else {"queued": queued}
        return proto.reply(rid, True, run_id=req.run_id, op=req.op, **extra)

    def _traceback(self, req: proto.Request) -> dict:
        def lookup(table: dict):
            run = get_run(table, req.run_id)
            return None if run is None or not run["created"] else (run["status"], run["error"])

        found = self._table.read(lookup)
        if found is None:
            return proto.reply(req.request_id, False, f"no run {req.run_id} in this experiment")
        status, traceback = found
        if traceback is not None and len(traceback) > proto.MAX_TRACEBACK_CHARS:
            # The end of a traceback names the error; keep that.
            traceback = "…" + traceback[-proto.MAX_TRACEBACK_CHARS :]
        return proto.reply(req.request_id, True, run_id=req.run_id, status=status, traceback=traceback)

    # -- lifetime ------------------------------------------------------------------------------

    def close_publisher(self) -> None:
        """Stop pushing (the experiment ended); the view can still pull what is in the log."""
        publisher = getattr(self, "_publisher", None)
        if publisher is not None:
            publisher.stop()
        try:
            self._refresh_snapshot()
        except Exception:
            log.debug("rapidfire panel: final snapshot failed", exc_info=True)

    def close(self) -> None:
        self._closed = True
        publisher = getattr(self, "_publisher", None)
        if publisher is not None:
            publisher.stop()
        super().close()


class _Publisher(threading.Thread):
    """Pushes new events to the view, coalesced: at most one message per PUSH_INTERVAL_S.

    The EventLog listener (which runs on the training thread) only sets ``_wake``; everything that
    touches the widget happens here.
    """

    def __init__(self, panel: Panel):
        super().__init__(name="rapidfire-panel-publisher", daemon=True)
        _stop_publishers_at_exit(self)
        # A weak reference: a panel nobody displays any more can be collected with its thread.
        self._panel = weakref.ref(panel)
        self._events = panel._events
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._last_pushed = self._events.last_seq
        self._replays: list[float] = []   # when to push the log from the start (time.monotonic)
        self._replay_lock = threading.Lock()
        self._unsubscribe = self._events.subscribe(lambda _event: self._wake.set())

    def replay_soon(self) -> None:
        """A view was just displayed: push the whole log to it shortly (REPLAY_AFTER_DISPLAY_S)."""
        now = time.monotonic()
        with self._replay_lock:
            self._replays = sorted(self._replays + [now + d for d in REPLAY_AFTER_DISPLAY_S])
        self._wake.set()

    def _replay_due(self) -> bool:
        """Whether a replay is due now (each is used once); also wakes the loop for the next."""
        now = time.monotonic()
        with self._replay_lock:
            due = [t for t in self._replays if t <= now]
            self._replays = [t for t in self._replays if t > now]
            return bool(due)

    def _next_wait(self) -> float:
        with self._replay_lock:
            upcoming = min(self._replays, default=None)
        if upcoming is None:
            return SNAPSHOT_INTERVAL_S
        return max(0.0, min(SNAPSHOT_INTERVAL_S, upcoming - time.monotonic()))

    def _training(self, panel: Panel) -> bool:
        """Runs train (so a cell may be waiting on them); otherwise the view's own pull answers."""
        try:
            return panel._view.busy(timeout=0.2)
        except Exception:
            return False

    def stop(self) -> None:
        self._halt.set()
        self._wake.set()
        try:
            self._unsubscribe()
        except Exception:
            pass

    def run(self) -> None:
        last_send = 0.0
        last_snapshot = 0.0
        while not self._halt.is_set():
            self._wake.wait(timeout=self._next_wait())
            if self._halt.is_set():
                break
            self._wake.clear()
            # Coalesce: events arriving within the interval go out in one message.
            delay = PUSH_INTERVAL_S - (time.monotonic() - last_send)
            if delay > 0 and self._halt.wait(delay):
                break
            panel = self._panel()
            if panel is None or panel._closed:
                break
            try:
                if self._replay_due() and self._training(panel):
                    self._last_pushed = 0   # from the start: batches follow until caught up
                pending = self._events.since(self._last_pushed, limit=proto.MAX_BATCH_EVENTS + 1)
                if pending:
                    batch, more = proto.batch_events(pending)
                    panel._push(batch)
                    self._last_pushed = batch[-1]["seq"]
                    last_send = time.monotonic()
                    if more:
                        self._wake.set()
                if time.monotonic() - last_snapshot >= SNAPSHOT_INTERVAL_S:
                    panel._refresh_snapshot()
                    last_snapshot = time.monotonic()
            except Exception:
                # A closed comm or a dead kernel connection: the view still pulls.
                log.debug("rapidfire panel: push failed", exc_info=True)
            del panel
        self.stop()


_PUBLISHERS: weakref.WeakSet = weakref.WeakSet()
_AT_EXIT = threading.Lock()
_at_exit_registered = False


def _stop_publishers_at_exit(publisher: _Publisher) -> None:
    """Publishers stop when the kernel's process exits (a restart, a shutdown), before the
    kernel's own exit handlers run (atexit runs the latest registered first, and this is
    registered after the kernel's). Once the kernel's IOPub thread has stopped, every send goes
    out directly on one socket: a push from this thread could interleave its frames with the
    dying kernel's own stderr output, which the front end then fails to parse."""
    global _at_exit_registered
    import atexit

    with _AT_EXIT:
        _PUBLISHERS.add(publisher)
        if not _at_exit_registered:
            atexit.register(_stop_all_publishers)
            _at_exit_registered = True


def _stop_all_publishers() -> None:
    publishers = list(_PUBLISHERS)
    for publisher in publishers:
        publisher.stop()
    for publisher in publishers:
        if publisher.is_alive() and publisher is not threading.current_thread():
            publisher.join(timeout=1.0)   # a push in flight ends before the kernel's IO stops


_PANELS: weakref.WeakKeyDictionary[Any, Panel] = weakref.WeakKeyDictionary()
_PANELS_LOCK = threading.Lock()


def panel_for(exp: Any) -> Panel:
    """The experiment's live panel, created on first use; displaying it twice shows two views
    of one widget (both stay in sync), rather than two widgets with two publisher threads."""
    view = view_of(exp)
    key = view.key   # one panel per experiment, however many views of it were made
    with _PANELS_LOCK:
        try:
            panel = _PANELS.get(key)
        except TypeError:  # not weak-referenceable: no reuse
            return Panel(view)
        if panel is None or panel._closed or panel.comm is None:
            panel = Panel(view)
            _PANELS[key] = panel
        return panel
