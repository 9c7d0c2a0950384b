"""Random mutations of real event logs (tests/fixtures/events/) and of automl.json, read the
way a resume or a read-only open reads them: the log parsed and checked, folded by the reducer,
the AutoML driver's scans of it (rung values, applied stops, suggestions) and its automl.json.
Each read gives a clear error (``RapidFireError``, naming the file and the line or field) or a
valid table; never another exception, never a changed file, never more than a second."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapidfire_nb.tuning import pruners as P
from rapidfire_nb.engine.events import ReadOnlyLog
from rapidfire_nb.engine.state import LiveTable, check_event, fold, load_schema
from rapidfire_nb.errors import RapidFireError

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "events").glob("*.jsonl"))
LOGS = {p.name: p.read_bytes() for p in FIXTURES}
SCHEMA = load_schema()

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 3), st.integers(10 ** 12, 10 ** 15),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["constructor", "__proto__", "eval_loss", "completed", "stopped", "eval"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3))


def _mutate_event(ev: dict, data) -> dict:
    ev = dict(ev)
    keys = [k for k in ev if k not in ("seq",)]
    action = data.draw(st.sampled_from(["drop", "set", "add", "nest", "type", "metrics"]))
    if action == "drop" and keys:
        ev.pop(data.draw(st.sampled_from(keys)))
    elif action == "set" and keys:
        ev[data.draw(st.sampled_from(keys))] = data.draw(VALUES)
    elif action == "add":
        ev[data.draw(st.text(max_size=6))] = data.draw(VALUES)
    elif action == "nest" and keys:
        deep: object = data.draw(VALUES)
        for _ in range(data.draw(st.integers(1, 60))):
            deep = [deep]
        ev[data.draw(st.sampled_from(keys))] = deep
    elif action == "type":
        ev["type"] = data.draw(st.sampled_from(sorted(SCHEMA["events"]) + ["nonsense"]))
    elif action == "metrics":
        ev["metrics"] = {data.draw(st.sampled_from(["eval_loss", "loss", "constructor"])): data.draw(VALUES)}
    return ev


def _mutated_bytes(raw: bytes, data) -> bytes:
    lines = raw.split(b"\n")[:-1]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        how = data.draw(st.sampled_from(["event", "event", "event", "bytes", "delete", "dup", "cut"]))
        if how == "event":
            try:
                ev = json.loads(lines[i])
            except ValueError:
                continue          # an earlier mutation already broke this line
            if isinstance(ev, dict):
                lines[i] = json.dumps(_mutate_event(ev, data)).encode()
        elif how == "bytes" and lines[i]:
            b = bytearray(lines[i])
            b[data.draw(st.integers(0, len(b) - 1))] = data.draw(st.integers(0, 255))
            lines[i] = bytes(b)
        elif how == "delete" and len(lines) > 1:
            del lines[i]
        elif how == "dup":
            lines.insert(i, lines[i])
        elif how == "cut":
            lines[i] = lines[i][: data.draw(st.integers(0, len(lines[i])))]
    return b"\n".join(lines) + data.draw(st.sampled_from([b"\n", b""]))


class _Exp:
    """What the AutoML driver reads of an Experiment: its log, its table, its folder."""

    def __init__(self, log, folder):
        self.events, self.path = log, folder
        self._live = LiveTable(log)

    def _state(self):
        return self._live


def _automl_reading(log, folder: Path, metric: str = "eval_loss") -> None:
    """The driver's reading of a resumed folder: automl.json, the rung values and applied stops
    it scans from the log, the replayed suggestions, and a last logged value."""
    from rapidfire_nb.automl.pruning import PruningOptions
    from rapidfire_nb.tuning import ChunkAutoML

    driver = ChunkAutoML.__new__(ChunkAutoML)
    driver.events, driver.table, driver.view = log, _Exp(log, folder)._state(), None
    driver.options = PruningOptions("t", "sha")
    driver.metric, driver.unit, driver.num_chunks = metric, 1, 2
    driver.policy = P.make_policy("sha", "minimize", 1, 2, max_chunks=4)
    driver.state_path = folder / "automl.json"
    driver.suggestions, driver.dismissed, driver.pruned, driver.late = {}, {}, {}, {}
    driver.seen, driver._awaiting_stop, driver._log_seq = {}, set(), 0
    driver.objective_error, driver.tuner = None, None
    import threading

    driver._log_lock = threading.Lock()
    driver.load()
    driver.rung_values_from_log()
    driver._replay_suggestions()
    driver._late_confirms()
    for run in fold(log.since(0))["runs"].values():
        driver.last_logged(run["run_id"], metric)
    driver.attach(SimpleNamespace(boundary_hook=None), resumed=True)


def _check_table(table: dict) -> None:
    assert isinstance(table["runs"], dict)
    for key, run in table["runs"].items():
        assert key == str(run["run_id"]) and run["run_id"] >= 1
        assert run["status"] in ("pending", "running", "stopped", "completed", "failed", "deleted")
    json.dumps(table)   # plain JSON data


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_mutated_log_gives_a_clear_error_or_a_valid_table(tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(LOGS)))
    raw = _mutated_bytes(LOGS[name], data)
    folder = tmp_path_factory.mktemp("f")
    path = folder / "events.jsonl"
    path.write_bytes(raw)
    t0 = time.perf_counter()
    try:
        log = ReadOnlyLog(path)
    except RapidFireError as exc:
        assert str(path) in str(exc) and "line" in str(exc)
    else:
        for ev in log.since(0):      # what passed is what the schema allows
            if ev["type"] in SCHEMA["events"]:
                assert not check_event(ev, SCHEMA), ev
        _check_table(fold(log.since(0)))
        _automl_reading(log, folder)
    assert time.perf_counter() - t0 < 1.0
    assert path.read_bytes() == raw
    assert sorted(p.name for p in folder.iterdir()) == ["events.jsonl"]


AUTOML = {"policy": None, "suggestions": {}, "pruned": {}, "dismissed": {}, "seen": {"1": 2},
          "objective_error": None}
DECISION = {"run_id": 1, "rung": 1, "rank": 2, "of": 2, "reason": "pruned at chunk 1 (rank 2 of 2)"}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_mutated_automl_json_gives_a_clear_error_or_loads(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("a")
    (folder / "events.jsonl").write_bytes(LOGS["pruned.jsonl"])
    state = json.loads(json.dumps(AUTOML))
    state["pruned"] = {"1": dict(DECISION)}
    field = data.draw(st.sampled_from(["suggestions", "pruned", "dismissed", "seen", "policy",
                                       "objective_error", "pruned.1", "pruned.1.rung", "seen.1"]))
    value = data.draw(VALUES)
    if "." in field:
        parts = field.split(".")
        target = state
        for p in parts[:-1]:
            target = target[p]
        target[parts[-1]] = value
    else:
        state[field] = value
    if data.draw(st.booleans()) and isinstance(state["pruned"], dict) \
            and isinstance(state["pruned"].get("1"), dict):
        state["pruned"]["1"][data.draw(st.text(min_size=1, max_size=4))] = 1
    raw = json.dumps(state).encode()
    (folder / "automl.json").write_bytes(raw)
    t0 = time.perf_counter()
    try:
        _automl_reading(ReadOnlyLog(folder / "events.jsonl"), folder)
    except RapidFireError as exc:
        assert "automl.json" in str(exc) and "field" in str(exc)
    assert time.perf_counter() - t0 < 1.0
    assert (folder / "automl.json").read_bytes() == raw
