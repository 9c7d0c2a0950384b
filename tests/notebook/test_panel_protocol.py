"""The control panel's Python side: wire protocol, push/pull, op handling and a hostile-message fuzz.

Messages are delivered the way anywidget delivers them: through the callback the Panel registered
with ``on_msg`` (called as ``callback(widget, content, buffers)``), or through ipywidgets'
``_handle_msg`` with a full comm message; what the panel sends back is captured at ``send``.

Most tests use ``OpsOverLog``: an object with the documented Experiment op methods over a real
EventLog that applies ops the way the engine's controller does (status rules, op events), so the
protocol can be fuzzed fast; ``test_real_experiment_*`` drive the real Experiment.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.errors import ConfigError, OpRefused
from rapidfire_nb.notebook import _panel_protocol as proto
from rapidfire_nb.notebook import panel as panel_mod
from rapidfire_nb.notebook.panel import Panel, panel_for

EDITABLE = {"training_args.learning_rate": 1e-3, "training_args.lr_scheduler_type": "linear", "peft_config.r": 8}


class OpsOverLog:
    """The Experiment's op surface over a real EventLog: validates like the engine and logs ops."""

    def __init__(self, path: Path | None = None, runs: int = 3):
        self.name = "panel-test"
        self.path = path or Path("/nonexistent")
        self.events = EventLog(None if path is None else path / "events.jsonl")
        self.calls: list[tuple] = []
        self.events.append("experiment", name=self.name, path=str(self.path), resumed=False)
        for run_id in range(1, runs + 1):
            self._create(run_id, parent=None, knobs={"training_args.learning_rate": 10.0**-run_id})

    def _create(self, run_id, parent, knobs, warm=False):
        self.events.extend(
            [
                ("run_created", dict(run_id=run_id, trainer_type="SFT", config={"big": "x" * 5000}, knobs=knobs,
                                     parent_run_id=parent, warm_start=warm, total_steps=8, steps_per_epoch=8,
                                     num_chunks=4, base_samples_seen=0)),
                ("run_status", dict(run_id=run_id, status="pending", error=None, reason=None)),
            ]
        )

    def status(self, run_id):
        status = None
        for e in self.events.since(0):
            if e.get("run_id") == run_id and e["type"] == "run_status":
                status = e["status"]
        if status is None:
            raise OpRefused(f"no run {run_id}")
        return status

    def _set(self, run_id, status, error=None):
        self.events.append("run_status", run_id=run_id, status=status, error=error, reason=None)

    def stop(self, run_id):
        self.calls.append(("stop", run_id))
        if self.status(run_id) not in ("pending", "running"):
            raise OpRefused(f"cannot stop run {run_id}: it is {self.status(run_id)}")
        self.events.append("op", op="stop", run_id=run_id, accepted=True, reason=None, new_run_id=None)
        self._set(run_id, "stopped")

    def resume(self, run_id):
        self.calls.append(("resume", run_id))
        if self.status(run_id) != "stopped":
            raise OpRefused(f"cannot resume run {run_id}: it is {self.status(run_id)}")
        self._set(run_id, "pending")

    def delete(self, run_id):
        self.calls.append(("delete", run_id))
        if self.status(run_id) == "deleted":
            raise OpRefused(f"run {run_id} is already deleted")
        self._set(run_id, "deleted")

    def validate_clone(self, run_id, changes, warm_start=False):
        self.calls.append(("validate_clone", run_id, changes, warm_start))
        if self.status(run_id) == "deleted":
            raise OpRefused(f"run {run_id} is deleted")
        for key, value in changes.items():
            if key not in EDITABLE:
                raise ConfigError(f"unknown knob {key!r}")
            if key == "training_args.learning_rate" and not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"training_args.learning_rate must be a positive number, got {value!r}")

    def clone_modify(self, run_id, changes, warm_start=False):
        self.validate_clone(run_id, changes, warm_start)
        self.calls.append(("clone_modify", run_id, changes, warm_start))
        new_id = 1 + max(e["run_id"] for e in self.events.since(0) if e["type"] == "run_created")
        self._create(new_id, parent=run_id, knobs=dict(changes), warm=warm_start)
        return new_id

    def editable_knobs(self, run_id):
        self.status(run_id)
        return dict(EDITABLE)


class Wire:
    """Drives a Panel like anywidget does and records what it sends back."""

    def __init__(self, panel: Panel):
        self.panel = panel
        self.sent: list[dict] = []
        self.send_threads: list[str] = []
        self._lock = threading.Lock()
        panel.send = self._capture  # the comm boundary: everything the panel sends passes here

    def _capture(self, content, buffers=None):
        with self._lock:
            self.sent.append(content)
            self.send_threads.append(threading.current_thread().name)

    def deliver(self, content, buffers=None):
        """Call the registered msg callbacks exactly as ipywidgets' CallbackDispatcher would,
        but without its exception swallowing, so an escaping exception fails the test."""
        callbacks = list(self.panel._msg_callbacks.callbacks)
        assert callbacks, "the panel registered no msg callback"
        for callback in callbacks:
            callback(self.panel, content, buffers or [])

    def ask(self, content, buffers=None) -> dict:
        before = len(self.replies())
        self.deliver(content, buffers)
        replies = self.replies()
        assert len(replies) == before + 1, f"expected exactly one reply to {content!r}"
        return replies[-1]

    def replies(self) -> list[dict]:
        with self._lock:
            return [m for m in self.sent if m.get("type") == "reply"]

    def pushes(self) -> list[dict]:
        with self._lock:
            return [m for m in self.sent if m.get("type") == "events"]


@pytest.fixture
def exp():
    return OpsOverLog()


@pytest.fixture
def wire(exp):
    panel = Panel(exp)
    w = Wire(panel)
    yield w
    panel.close()


def pull_all(wire: Wire, since: int = 0) -> list[dict]:
    """What a late-rendered view does: pull from `since` until the panel says there is no more."""
    events: list[dict] = []
    for _ in range(1000):
        r = wire.ask({"type": "pull", "since": since, "request_id": "p"})
        assert r["ok"], r
        events += r["events"]
        if r["events"]:
            since = r["events"][-1]["seq"]
        if not r["more"]:
            return events
    raise AssertionError("pull never finished")


# ---------------------------------------------------------------------------------------------
# pull / push / snapshot


def test_pull_returns_every_event_once_in_wire_form(wire, exp):
    exp.events.append("run_status", run_id=2, status="failed", error="Traceback...\nValueError: boom", reason="ValueError")
    exp.events.append("metric", run_id=1, split="train", step=1, samples_seen=8, epoch=0, chunk=0,
                      metrics={"loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3})
    events = pull_all(wire)
    assert [e["seq"] for e in events] == list(range(1, exp.events.last_seq + 1))
    created = [e for e in events if e["type"] == "run_created"]
    assert created and all("config" not in e for e in created)  # full configs stay in Python
    failed = [e for e in events if e["type"] == "run_status" and e["status"] == "failed"][0]
    assert "error" not in failed and failed["has_error"] is True
    metric = [e for e in events if e["type"] == "metric"][0]
    assert metric["metrics"] == {"loss": None, "grad_norm": None, "lr": 1e-3}  # JSON has no NaN
    # Pulling from the last seq is empty; from the middle gives the rest.
    assert pull_all(wire, exp.events.last_seq) == []
    assert [e["seq"] for e in pull_all(wire, 3)] == list(range(4, exp.events.last_seq + 1))


def test_pull_batches_are_capped(wire, exp):
    exp.events.extend(
        ("metric", dict(run_id=1, split="train", step=i, samples_seen=8 * i, epoch=0, chunk=0, metrics={"loss": 1.0 / i}))
        for i in range(1, 2600)
    )
    first = wire.ask({"type": "pull", "since": 0})
    assert first["more"] is True
    assert len(first["events"]) <= proto.MAX_BATCH_EVENTS
    events = pull_all(wire)
    assert [e["seq"] for e in events] == list(range(1, exp.events.last_seq + 1))


def test_pull_batches_are_capped_in_bytes(wire, exp):
    exp.events.extend(("run_status", dict(run_id=1, status="pending", error=None, reason="r" * 1999)) for _ in range(400))
    first = wire.ask({"type": "pull", "since": 0})
    assert first["more"] is True
    assert len(str(first["events"])) < 2 * proto.MAX_BATCH_BYTES
    assert len(pull_all(wire)) == exp.events.last_seq


def test_publisher_pushes_new_events_coalesced_and_off_the_training_thread(wire, exp):
    start = exp.events.last_seq

    def train():
        for i in range(1, 301):
            exp.events.append("metric", run_id=1, split="train", step=i, samples_seen=8 * i, epoch=0, chunk=0,
                              metrics={"loss": 1.0})

    trainer = threading.Thread(target=train, name="fake-training-thread")
    trainer.start()
    trainer.join()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        pushed = [e["seq"] for m in wire.pushes() for e in m["events"]]
        if pushed and pushed[-1] == exp.events.last_seq:
            break
        time.sleep(0.05)
    pushes = wire.pushes()
    pushed = [e["seq"] for m in pushes for e in m["events"]]
    assert pushed == list(range(start + 1, exp.events.last_seq + 1))  # each new event once, in order
    assert len(pushes) <= 5, f"300 quick events should coalesce into a few pushes, got {len(pushes)}"
    assert all(m["last_seq"] >= m["events"][-1]["seq"] for m in pushes)
    assert "fake-training-thread" not in wire.send_threads
    assert set(wire.send_threads) == {"rapidfire-panel-publisher"}


@pytest.mark.parametrize("training", [True, False])
def test_a_display_while_runs_train_pushes_the_log_from_the_start(monkeypatch, exp, training):
    """A view displayed behind a waiting cell cannot pull (the kernel is busy), and the live
    pushes start past what it lacks: while runs train, each display is followed by a push of the
    whole log. When nothing trains the view's own pull answers, and nothing is sent again."""
    import rapidfire_nb.notebook.panel as panel_mod

    monkeypatch.setattr(panel_mod, "REPLAY_AFTER_DISPLAY_S", (0.1,))
    exp.engine = type("Engine", (), {"busy": lambda self, timeout=-1: training,
                                     "queued_ops": lambda self, timeout=-1: []})()
    panel = Panel(exp)
    w = Wire(panel)
    try:
        panel._repr_mimebundle_()
        deadline = time.monotonic() + (10 if training else 2)
        while time.monotonic() < deadline and not w.pushes():
            time.sleep(0.05)
        pushed = [e["seq"] for m in w.pushes() for e in m["events"]]
        assert pushed == (list(range(1, exp.events.last_seq + 1)) if training else [])
    finally:
        panel.close()


def test_snapshot_tracks_statuses_and_last_seq(wire, exp):
    assert wire.panel.snapshot["experiment"] == "panel-test"
    assert wire.panel.snapshot["runs"] == {"1": "pending", "2": "pending", "3": "pending"}
    exp.stop(2)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and wire.panel.snapshot["last_seq"] != exp.events.last_seq:
        time.sleep(0.05)
    assert wire.panel.snapshot["last_seq"] == exp.events.last_seq
    assert wire.panel.snapshot["runs"]["2"] == "stopped"
    assert "2 pending" in repr(wire.panel) and "1 stopped" in repr(wire.panel)


def test_close_stops_the_publisher(exp):
    panel = Panel(exp)
    publisher = panel._publisher
    panel.close()
    publisher.join(timeout=5)
    assert not publisher.is_alive()
    sent = []
    panel.send = lambda c, b=None: sent.append(c)
    exp.events.append("experiment_end")
    time.sleep(0.5)
    assert sent == []


def test_the_publishers_stop_when_the_process_exits(exp):
    """At a kernel's exit (a restart) a push could go out on the socket the dying kernel also
    writes its stderr to, frames interleaved: the publishers stop first, from an exit handler
    registered after the kernel's own (so run before them)."""
    import atexit

    from rapidfire_nb.notebook import panel as panel_module

    panel = Panel(exp)
    publisher = panel._publisher
    assert publisher.is_alive() and publisher in panel_module._PUBLISHERS
    calls = []
    real = atexit.register
    try:
        atexit.register = lambda fn, *a, **k: calls.append(fn) or fn
        panel_module._at_exit_registered = False
        Panel(exp).close()                         # the next publisher registers the handler
    finally:
        atexit.register = real
    assert calls == [panel_module._stop_all_publishers]
    sent = []
    panel.send = lambda c, b=None: sent.append(c)
    panel_module._stop_all_publishers()
    assert not publisher.is_alive()
    exp.events.append("experiment_end")
    time.sleep(0.5)
    assert sent == []
    panel.close()


def test_pull_only_panel_has_no_publisher_and_still_serves_pulls(exp):
    panel = Panel(exp, push=False)
    wire = Wire(panel)
    try:
        assert panel._publisher is None
        exp.events.append("experiment_end")
        time.sleep(0.5)
        assert wire.pushes() == []
        assert pull_all(wire)[-1]["type"] == "experiment_end"
    finally:
        panel.close()


def test_comm_message_path_reaches_the_handler(wire):
    # What ipykernel hands ipywidgets for a `model.send(...)` from the view.
    wire.panel._handle_msg(
        {"content": {"data": {"method": "custom", "content": {"type": "pull", "since": 0, "request_id": 7}}}, "buffers": []}
    )
    reply = wire.replies()[-1]
    assert reply["request_id"] == 7 and reply["ok"] is True and reply["events"]


# ---------------------------------------------------------------------------------------------
# ops


def test_stop_resume_delete_reach_the_experiment(wire, exp):
    r = wire.ask({"type": "op", "op": "stop", "run_id": 2, "request_id": "a"})
    assert r == {"type": "reply", "request_id": "a", "ok": True, "error": None, "run_id": 2, "op": "stop",
                 "queued": []}  # this op surface applies at once: nothing stays queued
    assert exp.status(2) == "stopped"
    r = wire.ask({"type": "op", "op": "stop", "run_id": 2, "request_id": "b"})
    assert r["ok"] is False and "cannot stop run 2: it is stopped" in r["error"]
    assert wire.ask({"type": "op", "op": "resume", "run_id": 2})["ok"] is True
    assert exp.status(2) == "pending"
    assert wire.ask({"type": "op", "op": "delete", "run_id": 3})["ok"] is True
    assert exp.status(3) == "deleted"
    r = wire.ask({"type": "op", "op": "resume", "run_id": 99})
    assert r["ok"] is False and "no run 99" in r["error"]
    assert exp.calls == [("stop", 2), ("stop", 2), ("resume", 2), ("delete", 3), ("resume", 99)]


def test_clone_validate_only_creates_nothing_then_clone_creates(wire, exp):
    seq = exp.events.last_seq
    msg = {"type": "op", "op": "clone", "run_id": 1, "changes": {"training_args.learning_rate": -1},
           "warm_start": True, "validate_only": True, "request_id": "v"}
    r = wire.ask(msg)
    assert r["ok"] is False and "training_args.learning_rate must be a positive number" in r["error"]
    r = wire.ask({**msg, "changes": {"training_args.learning_rate": 5e-4}})
    assert r["ok"] is True and r["validated"] is True and "new_run_id" not in r
    assert exp.events.last_seq == seq
    r = wire.ask({**msg, "changes": {"training_args.learning_rate": 5e-4}, "validate_only": False})
    assert r["ok"] is True and r["new_run_id"] == 4
    assert exp.calls[-1] == ("clone_modify", 1, {"training_args.learning_rate": 5e-4}, True)
    created = [e for e in exp.events.since(seq) if e["type"] == "run_created"]
    assert created[0]["parent_run_id"] == 1 and created[0]["warm_start"] is True
    r = wire.ask({**msg, "changes": {"training_args.nope": 1}, "validate_only": False})
    assert r["ok"] is False and "unknown knob 'training_args.nope'" in r["error"]


def test_editable_and_traceback(wire, exp):
    r = wire.ask({"type": "editable", "run_id": 1, "request_id": 3})
    assert r["ok"] is True and r["knobs"] == EDITABLE
    assert wire.ask({"type": "editable", "run_id": 42})["ok"] is False
    exp.events.append("run_status", run_id=2, status="failed", error="Traceback (most recent call last):\nValueError: bad lr",
                      reason="ValueError")
    r = wire.ask({"type": "traceback", "run_id": 2})
    assert r["ok"] is True and r["status"] == "failed" and r["traceback"].endswith("ValueError: bad lr")
    r = wire.ask({"type": "traceback", "run_id": 1})
    assert r["ok"] is True and r["traceback"] is None and r["status"] == "pending"
    r = wire.ask({"type": "traceback", "run_id": 77})
    assert r["ok"] is False and "no run 77" in r["error"]
    exp.events.append("run_status", run_id=3, status="failed", error="x" * 50000 + "\nKeyError: end", reason=None)
    tb = wire.ask({"type": "traceback", "run_id": 3})["traceback"]
    assert len(tb) <= proto.MAX_TRACEBACK_CHARS + 1 and tb.endswith("KeyError: end")


def test_traceback_and_snapshot_read_the_folded_table_not_the_whole_log(exp):
    """The panel folds the log once (engine/state.py's reducer); a traceback request or a snapshot
    refresh reads only the events logged since, whatever the log's length."""
    for i in range(300):
        exp.events.append("metric", run_id=1, split="train", step=i + 1, samples_seen=8 * (i + 1),
                          epoch=0, chunk=0, metrics={"loss": 1.0})
    exp.events.append("run_status", run_id=2, status="failed", error="Traceback ...\nValueError: x",
                      reason="ValueError")
    asked: list[int] = []
    since = exp.events.since
    exp.events.since = lambda seq=0, limit=None: asked.append(seq) or since(seq, limit)
    panel = Panel(exp, push=False)
    wire = Wire(panel)
    try:
        assert asked == [0]                       # the first fold reads the log once
        last = exp.events.last_seq
        r = wire.ask({"type": "traceback", "run_id": 2})
        assert r["traceback"].endswith("ValueError: x") and r["status"] == "failed"
        exp.events.append("run_status", run_id=2, status="deleted", error=None, reason="deleted by user")
        r = wire.ask({"type": "traceback", "run_id": 2})
        assert r["status"] == "deleted" and r["traceback"].endswith("ValueError: x")
        panel._refresh_snapshot()
        assert panel.snapshot["runs"]["2"] == "deleted" and panel.snapshot["last_seq"] == last + 1
        assert 0 not in asked[1:] and all(seq >= last for seq in asked[1:])
    finally:
        panel.close()


def test_unexpected_errors_in_the_experiment_become_error_replies(wire, exp):
    def broken(run_id):
        raise RuntimeError("controller exploded")

    exp.stop = broken
    r = wire.ask({"type": "op", "op": "stop", "run_id": 1, "request_id": "x"})
    assert r["ok"] is False and "RuntimeError" in r["error"] and r["request_id"] == "x"
    exp.editable_knobs = lambda run_id: ["not", "a", "dict"]
    assert wire.ask({"type": "editable", "run_id": 1})["ok"] is False


def test_concurrent_messages_and_appends(wire, exp):
    """Handlers may run on a subshell thread while training appends: nothing raises or is lost."""
    errors: list[BaseException] = []

    def client(n):
        try:
            for i in range(40):
                wire.deliver({"type": "pull", "since": i, "request_id": f"{n}-{i}"})
                wire.deliver({"type": "editable", "run_id": 1 + i % 3, "request_id": f"{n}-e{i}"})
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    def trainer():
        for i in range(400):
            exp.events.append("metric", run_id=1, split="train", step=i, samples_seen=i, epoch=0, chunk=0, metrics={"loss": 1.0})

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)] + [threading.Thread(target=trainer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    replies = wire.replies()
    assert len(replies) == 4 * 80
    assert all(r["ok"] for r in replies)
    assert len({r["request_id"] for r in replies}) == 4 * 80


# ---------------------------------------------------------------------------------------------
# hostile messages


def _valid_messages():
    run = st.integers(1, 3)
    rid = st.one_of(st.none(), st.integers(0, 10**6), st.text(min_size=1, max_size=20).filter(str.isprintable))
    simple = st.builds(lambda op, r, q: {"type": "op", "op": op, "run_id": r, "request_id": q},
                       st.sampled_from(["stop", "resume", "delete"]), run, rid)
    clone = st.builds(lambda r, lr, w, q: {"type": "op", "op": "clone", "run_id": r,
                                           "changes": {"training_args.learning_rate": lr},
                                           "warm_start": w, "validate_only": True, "request_id": q},
                      run, st.floats(1e-6, 1.0), st.booleans(), rid)
    other = st.builds(lambda t, r, q: {"type": t, "run_id": r, "request_id": q},
                      st.sampled_from(["traceback", "editable"]), run, rid)
    pull = st.builds(lambda s, q: {"type": "pull", "since": s, "request_id": q}, st.integers(0, 50), rid)
    return st.one_of(simple, clone, other, pull)


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                      st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                        max_leaves=12)
hostile_leaf = st.one_of(
    json_leaf,
    st.sampled_from([True, False, -1, 0, 2**64, 1.5, float("nan"), "1", "__import__('os').system('touch /tmp/pwned')",
                     "x" * 10000, [1], {"$gt": 1}, b"bytes", object(), {1, 2}, (1,), Path("/etc/passwd")]),
)


@st.composite
def invalid_messages(draw):
    """Messages that break the schema in one known way each."""
    base = draw(_valid_messages())
    kind = draw(st.sampled_from(
        ["drop_required", "bad_type_value", "extra_key", "bad_field", "not_a_dict", "bad_request_id",
         "bad_op", "bad_changes", "buffers", "non_str_key"]))
    msg = dict(base)
    buffers = None
    if kind == "drop_required":
        required = {"pull": "since", "traceback": "run_id", "editable": "run_id"}.get(msg["type"], "run_id")
        if msg.get("op") == "clone" and draw(st.booleans()):
            required = "changes"
        del msg[required]
    elif kind == "bad_type_value":
        msg["type"] = draw(st.one_of(hostile_leaf.filter(lambda v: v not in ("pull", "op", "traceback", "editable")
                                                         if isinstance(v, str) else True)))
    elif kind == "extra_key":
        key = draw(st.text(min_size=1, max_size=20).filter(
            lambda k: k not in {"type", "request_id", "op", "run_id", "since", "changes", "warm_start", "validate_only"}))
        msg[key] = draw(json_any)
    elif kind == "bad_field":
        field = "since" if msg["type"] == "pull" else "run_id"
        low, high = (0, proto.MAX_SEQ) if field == "since" else (1, proto.MAX_RUN_ID)
        msg[field] = draw(st.one_of(
            hostile_leaf.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool) and low <= v <= high)),
            st.integers(max_value=low - 1), st.integers(min_value=high + 1)))
    elif kind == "not_a_dict":
        return draw(st.one_of(hostile_leaf, st.lists(json_any, max_size=3))), None
    elif kind == "bad_request_id":
        msg["request_id"] = draw(st.one_of(st.just(""), st.just("r" * 65), st.just("a\nb"), st.just(-1), st.just(1.5),
                                           st.just(True), st.just([1]), st.just({"a": 1})))
    elif kind == "bad_op":
        msg = {"type": "op", "op": draw(hostile_leaf.filter(lambda v: v not in proto.OPS if isinstance(v, str) else True)),
               "run_id": 1}
    elif kind == "bad_changes":
        msg = {"type": "op", "op": "clone", "run_id": 1, "validate_only": draw(st.booleans())}
        msg["changes"] = draw(st.one_of(
            hostile_leaf.filter(lambda v: not isinstance(v, dict)),
            st.dictionaries(st.sampled_from(["", "1abc", "a..b", "a.", "__import__('os')", "a b", "x" * 201, "__class__", "training_args.__init__", "_private"]),
                            json_any, min_size=1, max_size=2),
            st.just({"training_args.learning_rate": float("nan")}),
            st.just({"training_args.learning_rate": "x" * 5000}),
            st.just({"training_args.learning_rate": [[[[[[1]]]]]]}),
            st.just({"training_args.learning_rate": list(range(2000))}),
            st.just({f"k{i}": 1 for i in range(65)}),
            st.just({"training_args.learning_rate": b"1"}),
            st.just({1: 2}),
        ))
        if draw(st.booleans()):
            msg["warm_start"] = draw(hostile_leaf.filter(lambda v: not isinstance(v, bool)))
    elif kind == "buffers":
        buffers = [b"\x00" * draw(st.integers(1, 64))]
    elif kind == "non_str_key":
        msg[draw(st.one_of(st.integers(), st.none(), st.tuples(st.integers())))] = 1
    return msg, buffers


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=invalid_messages())
def test_fuzz_malformed_messages_get_an_error_reply_and_change_nothing(wire, exp, case):
    content, buffers = case
    seq = exp.events.last_seq
    calls = len(exp.calls)
    snapshot = dict(wire.panel.snapshot)
    reply = wire.ask(content, buffers)  # an exception escaping here fails the test
    assert reply["type"] == "reply"
    assert reply["ok"] is False, f"accepted a malformed message: {content!r}"
    assert isinstance(reply["error"], str) and reply["error"]
    assert reply["request_id"] is None or reply["request_id"] == content.get("request_id")
    assert exp.events.last_seq == seq
    assert len(exp.calls) == calls
    assert wire.panel.snapshot == snapshot
    assert not Path("/tmp/pwned").exists()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(json_any, st.dictionaries(st.sampled_from(
    ["type", "op", "run_id", "since", "changes", "warm_start", "validate_only", "request_id", "x"]), hostile_leaf, max_size=6)))
def test_fuzz_arbitrary_messages_never_raise(wire, exp, content):
    """Anything at all: one reply, no exception; if refused, nothing happened."""
    seq = exp.events.last_seq
    calls = len(exp.calls)
    reply = wire.ask(content)
    assert isinstance(reply["ok"], bool)
    if not reply["ok"]:
        assert isinstance(reply["error"], str) and reply["error"]
        assert exp.events.last_seq == seq or len(exp.calls) > calls  # only an accepted call changes the log


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msg=_valid_messages())
def test_fuzz_valid_messages_are_accepted_or_refused_by_the_experiment(wire, exp, msg):
    reply = wire.ask(msg)
    assert reply["request_id"] == msg.get("request_id")
    if not reply["ok"]:
        # Well-formed but illegal now (e.g. resume a pending run): the refusal is the engine's.
        assert not reply["error"].startswith("malformed")


# ---------------------------------------------------------------------------------------------
# the view bundle


def test_esm_is_the_built_bundle_or_a_fallback_that_says_how_to_build(monkeypatch, tmp_path, exp):
    bundle = tmp_path / "panel.js"
    bundle.write_text("export default { render() {} }; // built", encoding="utf-8")
    monkeypatch.setattr(panel_mod, "_BUNDLE", bundle)
    p = Panel(exp)
    assert p._esm.endswith("// built")
    p.close()
    monkeypatch.setattr(panel_mod, "_BUNDLE", tmp_path / "missing.js")
    p = Panel(exp)
    assert "bundle is missing" in p._esm and "npm run build" in p._esm
    p.close()


def test_panel_for_reuses_the_live_panel(exp):
    a = panel_for(exp)
    assert panel_for(exp) is a
    a.close()
    b = panel_for(exp)
    assert b is not a
    b.close()


def test_panel_rejects_objects_without_an_event_log():
    with pytest.raises(TypeError, match="exp.events"):
        Panel(object())


def test_to_json_makes_engine_values_wire_safe():
    import numpy as np

    out = proto.to_json({"a": np.float32(1.5), "b": np.int64(3), "c": float("nan"), "d": (1, 2), 4: "x" * 3000})
    assert out["a"] == 1.5 and out["b"] == 3 and out["c"] is None and out["d"] == [1, 2]
    assert len(out["4"]) == proto.MAX_WIRE_STRING and not any(isinstance(v, float) and math.isnan(v) for v in out.values())


# ---------------------------------------------------------------------------------------------
# the real Experiment


def test_real_experiment_driven_from_the_panel(tmp_path):
    from rapidfire_nb import Experiment
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
    from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

    train, evals = make_demo_datasets(32, 8)
    config = RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([3e-3, 1e-3]), per_device_train_batch_size=8,
                                  num_train_epochs=1, bf16=False, max_length=64),
    )
    exp = Experiment("panel-real", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=2, block=False)
    try:
        panel = exp.panel()
        assert isinstance(panel, Panel) and exp.panel() is panel
        wire = Wire(panel)
        hostile = [
            {"type": "op", "op": "stop", "run_id": True},
            {"type": "op", "op": "exec", "run_id": 1},
            {"type": "op", "op": "clone", "run_id": 1, "changes": {"__class__.__init__": 1}},
            {"type": "op", "op": "clone", "run_id": 1, "changes": {"training_args.learning_rate": 1e-3}, "extra": 1},
            {"type": "editable", "run_id": "1; import os"},
        ]
        for msg in hostile:
            reply = wire.ask(msg)
            assert reply["ok"] is False and reply["error"].startswith("malformed"), reply

        knobs = wire.ask({"type": "editable", "run_id": 1})["knobs"]
        assert knobs["training_args.learning_rate"] == pytest.approx(3e-3) and knobs["peft_config.r"] == 4
        r = wire.ask({"type": "op", "op": "clone", "run_id": 1, "changes": {"training_args.learning_rate": -1},
                      "validate_only": True})
        assert r["ok"] is False and "learning_rate" in r["error"]
        r = wire.ask({"type": "op", "op": "clone", "run_id": 1, "changes": {"peft_config.r": 16},
                      "warm_start": True, "validate_only": True})
        assert r["ok"] is False and "warm start" in r["error"].lower() and "16" in r["error"]
        # Holding the engine's lock keeps the stop queued while the panel answers (the engine
        # applies ops under it), so the reply, a pull and the snapshot must all show it queued.
        with exp.engine.atomically():
            r = wire.ask({"type": "op", "op": "stop", "run_id": 2})
            assert r["ok"] is True and r["queued"] == [["stop", 2]], r
            assert wire.ask({"type": "pull", "since": exp.events.last_seq})["queued"] == [["stop", 2]]
            wire.panel._refresh_snapshot()
            assert wire.panel.snapshot["queued"] == [["stop", 2]]
        r = wire.ask({"type": "op", "op": "clone", "run_id": 1, "changes": {"training_args.learning_rate": 5e-4}})
        assert r["ok"] is True and r["new_run_id"] == 3
        # The badges' "training" row: pull replies and the snapshot name the run on the device.
        seen = set()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen and not exp.wait(timeout=0.01):
            on = wire.ask({"type": "pull", "since": exp.events.last_seq})["on_device"]
            if on is not None:
                seen.add(on)
        assert seen and seen <= {1, 2, 3}, seen
        assert exp.wait(timeout=600)
        last = wire.ask({"type": "pull", "since": exp.events.last_seq})
        assert last["on_device"] is None and last["queued"] == []   # applied: nothing queued
        wire.panel._refresh_snapshot()
        assert wire.panel.snapshot["on_device"] is None and wire.panel.snapshot["queued"] == []

        info = exp.get_runs_info().set_index("run_id")
        assert info.loc[2, "status"] == "stopped"
        assert info.loc[3, "status"] == "completed" and info.loc[3, "parent_run_id"] == 1
        events = pull_all(wire)
        assert [e["seq"] for e in events] == list(range(1, exp.events.last_seq + 1))
        created = {e["run_id"] for e in events if e["type"] == "run_created"}
        assert created == {1, 2, 3}  # the refused and malformed clones created nothing
        ops = [(e["op"], e["run_id"]) for e in events if e["type"] == "op"]
        assert sorted(ops) == [("clone", 1), ("stop", 2)]
        assert any(e["type"] == "metric" and e["run_id"] == 3 for e in events)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not wire.pushes():
            time.sleep(0.1)
        assert wire.pushes(), "the publisher pushed nothing during training"
        assert wire.ask({"type": "traceback", "run_id": 1})["traceback"] is None
    finally:
        exp.end()
    panel._publisher.join(timeout=5)
    assert not panel._publisher.is_alive()
    # After end() the view can still pull the whole log.
    assert pull_all(wire)[-1]["type"] == "experiment_end"


# ---------------------------------------------------------------------------------------------
# scale: 48 runs, thousands of steps


def test_pruned_runs_are_flagged_on_the_wire_and_their_error_stays_in_python(wire, exp):
    exp.events.append("run_status", run_id=1, status="stopped", error=None, reason="rank 3 of 4 at chunk 2",
                      pruned=True)
    exp.events.append("run_status", run_id=2, status="stopped", error="Pruned at chunk 1: below the median",
                      reason=None, pruned=True)
    exp.events.append("run_status", run_id=3, status="stopped", error=None, reason="pruned by hand", pruned=False)
    exp.events.append("run_status", run_id=3, status="pending", error=None, reason="pruned at chunk 1, resumed by user")
    statuses = [e for e in pull_all(wire) if e["type"] == "run_status"][-4:]
    assert [e.get("pruned", False) for e in statuses] == [True, True, False, False]
    assert all("error" not in e for e in statuses)


def test_history_is_sent_once_at_48_runs(exp):
    """The publisher pushes each event once, pulls from the view's last seq are empty, and the
    snapshot trait does not grow with the steps logged: nothing the view holds is sent again."""
    for run_id in range(4, 49):
        exp._create(run_id, parent=None, knobs={"training_args.learning_rate": run_id * 1e-4})
    panel = Panel(exp)
    w = Wire(panel)
    try:
        start = exp.events.last_seq
        snapshot_sizes = []
        for round_ in range(5):
            step0 = round_ * 40
            exp.events.extend(
                ("metric", dict(run_id=r, split="train", step=s, samples_seen=8 * s, epoch=0, chunk=0,
                                metrics={"loss": 1.0 / s}))
                for r in range(1, 49) for s in range(step0 + 1, step0 + 41)
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                pushed = [e["seq"] for m in w.pushes() for e in m["events"]]
                if pushed and pushed[-1] == exp.events.last_seq:
                    break
                time.sleep(0.05)
            panel._refresh_snapshot()
            snapshot_sizes.append(len(str(panel.snapshot)))
        pushed = [e["seq"] for m in w.pushes() for e in m["events"]]
        assert pushed == list(range(start + 1, exp.events.last_seq + 1)), "an event was pushed twice or never"
        assert exp.events.last_seq - start == 5 * 48 * 40
        # A view that holds everything asks for nothing and gets nothing.
        reply = w.ask({"type": "pull", "since": exp.events.last_seq, "request_id": "p"})
        assert reply["ok"] and reply["events"] == [] and reply["more"] is False
        # The snapshot carries statuses, not history: as big after 9,600 steps as after 1,920.
        assert len(set(snapshot_sizes)) == 1, snapshot_sizes
    finally:
        panel.close()


def test_run_created_carries_the_short_settings_of_its_config_not_the_config():
    from rapidfire_nb.notebook._panel_protocol import MAX_SETTINGS, wire_event

    config = {"model_name": "tiny", "training_args": {"num_train_epochs": 2, "learning_rate": 1e-3,
                                                      "output_dir": "x" * 500},
              "peft_config": {"r": 8, "target_modules": ["q_proj", "v_proj"]},
              "formatting_func": None, "generation_config": {"max_new_tokens": 8}}
    wired = wire_event({"seq": 1, "time": 1.0, "type": "run_created", "run_id": 1, "config": config,
                        "knobs": {"training_args.learning_rate": 1e-3}})
    assert "config" not in wired
    assert wired["settings"] == {
        "model_name": "tiny", "training_args.num_train_epochs": 2, "training_args.learning_rate": 1e-3,
        "peft_config.r": 8, "peft_config.target_modules": ["q_proj", "v_proj"], "formatting_func": None,
        "generation_config.max_new_tokens": 8}
    huge = {"training_args": {f"k{i}": i for i in range(5 * MAX_SETTINGS)}}
    assert len(wire_event({"seq": 2, "time": 1.0, "type": "run_created", "run_id": 2,
                           "config": huge})["settings"]) == MAX_SETTINGS
