"""The one reducer (engine/state.py) against the shared fixtures, which js/test/state_fixtures.test.ts
folds too: real event logs recorded by tests/fixtures/events/make_fixtures.py, their expected run
tables, and the event schema (engine/events_schema.json) both sides check them against."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidfire_nb.engine import state as S
from rapidfire_nb.engine.events import EventLog, read_events

FIXTURES = Path(__file__).parent.parent / "fixtures" / "events"
NAMES = sorted(p.name[: -len(".jsonl")] for p in FIXTURES.glob("*.jsonl"))
SCENARIOS = {"sft_basic", "stop_resume", "clone_delete", "failed", "pruned", "suggested",
             "crash_resume", "dpo", "grpo", "ray_workers"}


def events_of(name: str) -> list[dict]:
    return read_events(FIXTURES / f"{name}.jsonl")


def expected_of(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.table.json").read_text())


def as_json(table: dict) -> dict:
    return json.loads(json.dumps(table))


def test_every_scenario_has_a_log_and_a_table():
    assert set(NAMES) == SCENARIOS
    for name in NAMES:
        assert (FIXTURES / f"{name}.table.json").exists()


@pytest.mark.parametrize("name", NAMES)
def test_fixture_events_fit_the_schema(name):
    schema = S.load_schema()
    problems = [f"seq {ev.get('seq')}: {p}" for ev in events_of(name) for p in S.check_event(ev, schema)]
    assert problems == []


def test_the_schema_check_names_what_is_wrong():
    schema = S.load_schema()
    good = events_of("sft_basic")
    metric = next(ev for ev in good if ev["type"] == "metric")
    assert S.check_event(metric, schema) == []
    assert S.check_event({**metric, "samples_seen": "8"}, schema) == [
        "metric.samples_seen: '8' is not int"]
    no_split = {k: v for k, v in metric.items() if k != "split"}
    assert S.check_event(no_split, schema) == ["metric: missing 'split'"]
    assert S.check_event({**metric, "split": "test"}, schema) == [
        "metric.split: 'test' is not one of ['train', 'eval']"]
    assert S.check_event({"seq": 1, "time": 0.0, "type": "nope"}, schema) == ["unknown event type 'nope'"]


@pytest.mark.parametrize("name", NAMES)
def test_fold_gives_the_expected_table(name):
    assert as_json(S.fold(events_of(name))) == expected_of(name)


def test_tables_say_what_each_scenario_did():
    """What the recorded experiments did, read from the tables (the recorder also checked each
    table against the engine's own run records)."""
    def runs(name):
        return {r["run_id"]: r for r in expected_of(name)["runs"].values()}

    r = runs("clone_delete")
    assert (r[2]["status"], r[3]["parent_run_id"], r[3]["warm_start"], r[4]["warm_start"]) == \
        ("deleted", 1, True, False)
    assert r[3]["changes"] == {"training_args.learning_rate": 5e-3}
    assert r[3]["base_step"] > 0 and r[3]["samples_seen"] > r[3]["base_samples_seen"] > 0
    r = runs("failed")
    assert r[2]["status"] == "failed" and "Traceback" in r[2]["error"] and r[2]["has_error"]
    assert r[2]["series"]["eval"]["eval_loss"]["y"] == [None]     # NaN, folded to null
    assert "eval_loss" not in r[2]["best"]
    assert sum(r["pruned"] for r in runs("pruned").values()) == 3
    r = runs("stop_resume")
    assert r[1]["last_op"] == {"op": "resume", "accepted": True, "reason": None}
    table = expected_of("crash_resume")
    assert table["resumed"] and all(r["status"] == "completed" for r in table["runs"].values())
    assert "rewards/_short_answer/mean" in expected_of("grpo")["train_metrics"]
    assert "eval_rewards/margins" in expected_of("dpo")["eval_metrics"]


def test_ray_workers_table_names_each_runs_worker_and_the_lost_one():
    """ray_workers.jsonl: 3 runs on Ray workers w0, w1; w1 was killed (ray.kill) while it trained
    run 1's chunk 1, so every later chunk (that one included) was trained by w0."""
    events = events_of("ray_workers")
    table = expected_of("ray_workers")
    assert [(w["worker"], w["lost"]) for w in table["workers"]] == [("w0", False), ("w1", True)]
    assert all(w["device"] == f"{w['worker']}:cpu" and w["node"] for w in table["workers"])
    (lost,) = table["lost_workers"]
    (event,) = [e for e in events if e["type"] == "worker_lost"]
    assert lost == {"worker": "w1", "node": event["node"], "reason": event["reason"], "runs": [1, 2],
                    "chunk_lost": {"run_id": 1, "epoch": 0, "chunk": 1}, "workers_left": 1,
                    "time": event["time"], "until": None}
    assert "ray.kill" in lost["reason"]
    # each run's worker is the one of its last chunk_done, not of its first
    for run in table["runs"].values():
        chunks = [e for e in events if e["type"] == "chunk_done" and e["run_id"] == run["run_id"]]
        assert run["worker"] == chunks[-1]["worker"] == "w0"
    assert {e["worker"] for e in events if e["type"] == "chunk_done" and e["run_id"] == 2} == {"w0", "w1"}
    assert [row["worker"] for row in table["timeline"]] == \
        [e["worker"] for e in events if e["type"] == "chunk_done"]
    # mid-way (before the loss), the table names w1 for the runs it trained
    before = S.fold(e for e in events if e["seq"] < event["seq"])
    assert S.get_run(before, 2)["worker"] == "w1" and not before["lost_workers"]
    assert not any(w["lost"] for w in before["workers"])


def test_the_kernel_engine_logs_no_workers():
    table = expected_of("sft_basic")
    assert table["workers"] == [] and table["lost_workers"] == []
    assert all(r["worker"] is None for r in table["runs"].values())
    assert all(row["worker"] is None for row in table["timeline"])


def test_worker_events_from_a_damaged_or_partial_log():
    """A worker that died in its constructor is lost without ever being listed; malformed
    entries are skipped, never raised."""
    table = S.fold([
        {"seq": 1, "time": 1.0, "type": "workers", "workers": [{"worker": "w0", "node": "n1"}, "junk", {"node": "x"}]},
        {"seq": 2, "time": 2.0, "type": "worker_lost", "worker": "w3", "node": None, "reason": "boom",
         "runs": [1, "2", 3], "chunk_lost": {"run_id": 1}, "workers_left": 1},
        {"seq": 3, "time": 3.0, "type": "worker_lost", "node": "n1"},
        {"seq": 4, "time": 4.0, "type": "workers", "workers": None},
    ])
    assert table["workers"] == [{"worker": "w0", "node": "n1", "device": None, "lost": False},
                                {"worker": "w3", "node": None, "device": None, "lost": True}]
    assert table["lost_workers"] == [{"worker": "w3", "node": None, "reason": "boom", "runs": [1, 3],
                                      "chunk_lost": None, "workers_left": 1, "time": 2.0, "until": None}]


def test_every_metric_point_is_at_samples_seen():
    """One x axis for train and eval curves (the panel's charts and the trackers' steps)."""
    for name in NAMES:
        events = events_of(name)
        table = S.fold(events)
        for split in ("train", "eval"):
            for run in table["runs"].values():
                for metric, series in run["series"][split].items():
                    want = [ev["samples_seen"] for ev in events if ev["type"] == "metric"
                            and ev["run_id"] == run["run_id"] and ev["split"] == split
                            and metric in ev["metrics"]]
                    assert series["x"] == want, (name, run["run_id"], metric)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
       roundtrip=st.booleans())
def test_folding_in_any_batches_equals_folding_all_at_once(name, cuts, roundtrip):
    """The panel, the CLI and the trackers fold events as they arrive, in batches of any size;
    the table must not depend on where the batches fall, nor on being saved (as JSON) between."""
    events = events_of(name)
    bounds = sorted({min(c, len(events)) for c in cuts} | {0, len(events)})
    table = S.new_table()
    for lo, hi in itertools.pairwise(bounds):
        for ev in events[lo:hi]:
            table = S.reduce(table, ev)
        if roundtrip:
            table = as_json(table)
    assert as_json(table) == as_json(S.fold(events))


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(NAMES), sizes=st.lists(st.integers(min_value=1, max_value=15), min_size=1))
def test_live_table_folds_only_new_events(name, sizes):
    """LiveTable over a growing EventLog ends where fold(all) is, reading between appends."""
    events = events_of(name)
    log = EventLog()
    live = S.LiveTable(log)
    i = 0
    k = 0
    while i < len(events):
        n = sizes[k % len(sizes)]
        k += 1
        log.extend((ev["type"], {key: v for key, v in ev.items() if key not in ("seq", "time", "type")})
                   for ev in events[i:i + n])
        i = min(i + n, len(events))
        assert live.read(lambda t: t["last_seq"]) == i
    # the log re-stamped each event's time (a lost worker's notice keeps it)
    assert as_json(live.read()) == as_json(S.fold(log.since(0)))


def _stop(seq, run_id, reason, **extra):
    return {"seq": seq, "time": 0.0, "type": "run_status", "run_id": run_id, "status": "stopped",
            "error": None, "reason": reason, **extra}


def test_pruned_is_the_stop_events_field_never_its_reason_text(tmp_path):
    """A pruner's stop says so in its ``pruned`` field: its reason is free text (a user's stop
    may say "pruned", a pruner's may not)."""
    log = EventLog(tmp_path / "events.jsonl")
    log.append("run_status", run_id=1, status="stopped", error=None, reason="rank 4 of 4 at the first rung",
               pruned=True)
    log.append("run_status", run_id=2, status="stopped", error=None, reason="pruned by hand: too slow",
               pruned=False)
    log.close()
    for events in (log.since(0), read_events(tmp_path / "events.jsonl")):
        table = S.fold(events)
        assert (S.get_run(table, 1)["pruned"], S.get_run(table, 2)["pruned"]) == (True, False)
    # resumed, a pruned run is an ordinary run again
    table = S.fold([_stop(1, 1, "rank 4 of 4", pruned=True),
                    {**_stop(2, 1, "resumed by user"), "status": "pending"}])
    assert not S.get_run(table, 1)["pruned"]


def test_stops_logged_before_the_pruned_field_are_read_from_their_text_on_load(tmp_path):
    """Older engines said a pruner's stop only in its reason (or error) text: the log's loader
    reads that once; the reducer itself never looks at the text."""
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in [
        _stop(1, 1, "pruned at chunk 1 (rank 4 of 4)"),
        {**_stop(2, 2, None), "error": "Pruned at chunk 1: below the median"},
        _stop(3, 3, "stopped by user"),
        _stop(4, 4, "pruned at chunk 1 (rank 3 of 4)", pruned=False),
        _stop(5, 5, "not pruned; stopped by user"),
        _stop(6, 6, "stopped by user: pruned at chunk 2 would have been too late"),
        # look-alikes those engines never wrote: the Kelvin sign for k, a full-width digit
        _stop(7, 7, "pruned at chun\u212a 2"), _stop(8, 8, "pruned at chunk \uff12")]))
    events = read_events(path)
    assert [e["pruned"] for e in events] == [True, True] + [False] * 6
    table = S.fold(events)
    assert [S.get_run(table, r)["pruned"] for r in range(1, 9)] == [True, True] + [False] * 6
    assert not S.get_run(S.fold([_stop(1, 1, "pruned at chunk 1 (rank 4 of 4)")]), 1)["pruned"]


def test_status_errors_stick_until_the_run_trains_again():
    def ev(seq, status, error=None):
        return {"seq": seq, "time": 0.0, "type": "run_status", "run_id": 1, "status": status,
                "error": error, "reason": None}

    t = S.fold([ev(1, "failed", "Traceback ... OSError: disk full"), ev(2, "deleted")])
    assert S.get_run(t, 1)["error"].endswith("disk full") and S.get_run(t, 1)["has_error"]
    t = S.fold([ev(1, "failed", "Traceback ..."), ev(2, "pending"), ev(3, "running")])
    assert S.get_run(t, 1)["error"] is None and not S.get_run(t, 1)["has_error"]


@pytest.mark.parametrize("name", ["clone_delete", "dpo"])
def test_trackers_log_every_point_where_the_table_plots_it(name, tmp_path):
    """The trackers' step and the panel's x are the same number for every point (samples seen)."""
    from rapidfire_nb.tracking.base import Tracker
    from rapidfire_nb.tracking.hub import TrackerHub

    logged: list[tuple[int, str, int]] = []

    class Recorder(Tracker):
        name = "recorder"

        def log_metrics(self, run, step, metrics, wall_time):
            logged.extend((run.run_id, tag, step) for tag in metrics if tag != "train/global_step")

    log = EventLog()
    events = events_of(name)
    log.extend((ev["type"], {k: v for k, v in ev.items() if k not in ("seq", "time", "type")})
               for ev in events)
    hub = TrackerHub(log, tmp_path, name, [Recorder()]).start()
    assert hub.close(timeout=60) and hub.failures == {}
    table = S.fold(events)
    plotted = []
    for run in table["runs"].values():
        for split, prefix in (("train", "train/"), ("eval", "eval/")):
            for metric, series in run["series"][split].items():
                tag = prefix + (metric[len("eval_"):] if split == "eval" and metric.startswith("eval_") else metric)
                plotted.extend((run["run_id"], tag, x) for x, y in zip(series["x"], series["y"]) if y is not None)
    assert logged and sorted(logged) == sorted(plotted)


def test_the_reducer_pulls_in_no_torch_and_no_engine_machinery():
    """Readers (the CLI, the panel, trackers, a notebook reading a finished folder) fold logs
    without loading the training stack."""
    import subprocess
    import sys

    code = ("import sys, rapidfire_nb.engine.state; "
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'rapidfire_nb.engine.controller') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_workers_event_listing_a_lost_worker_again_makes_it_live():
    """A resumed experiment's new pool names its workers w0, w1 again: the later `workers` event
    marks w1 live; the loss stays in lost_workers, ended (by log order) at that event's time."""
    events = events_of("ray_workers")
    last = events[-1]
    listing = {**next(e for e in events if e["type"] == "workers"), "seq": last["seq"] + 1, "time": last["time"] + 5}
    table = S.fold(events + [listing])
    assert [(w["worker"], w["lost"]) for w in table["workers"]] == [("w0", False), ("w1", False)]
    (lost,) = table["lost_workers"]
    assert lost["worker"] == "w1" and lost["until"] == listing["time"]
    # a later loss of the new w1 is a second entry, open again
    again = {**next(e for e in events if e["type"] == "worker_lost"), "seq": last["seq"] + 2, "time": last["time"] + 9}
    table = S.fold(events + [listing, again])
    assert table["workers"][1]["lost"] is True
    assert [(x["time"], x["until"]) for x in table["lost_workers"]] == [
        (lost["time"], listing["time"]), (again["time"], None)]


def test_moved_is_false_for_a_runs_first_chunk_and_in_the_kernel_engine():
    """The engine logs moved=True when a run arrives on a worker, its very first chunk included;
    get_timeline's `moved` means it came from another worker (or its checkpoint), so a run's first
    chunk says False, and the kernel engine (no moved field) says False too: tl[tl.moved] works."""
    events = events_of("ray_workers")
    rows = S.fold(events)["timeline"]
    first = {}
    for e in events:
        if e["type"] == "chunk_done":
            first.setdefault(e["run_id"], e["seq"])
    done = [e for e in events if e["type"] == "chunk_done"]
    assert [r["moved"] for r in rows] == [e["moved"] and first[e["run_id"]] != e["seq"] for e in done]
    assert sum(r["moved"] for r in rows) == 3       # run 3 w1->w0, run 1 after the loss, run 2 w1->w0
    assert sum(e["moved"] for e in done) == 6       # what the engine logged
    kernel = S.fold(events_of("sft_basic"))["timeline"]
    assert kernel and all(r["moved"] is False for r in kernel)


def test_get_timeline_moved_can_filter_the_kernel_engines_timeline(tmp_path):
    from rapidfire_nb import Experiment

    folder = tmp_path / "sft_basic"
    folder.mkdir()
    (folder / "events.jsonl").write_text((FIXTURES / "sft_basic.jsonl").read_text())
    (folder / "experiment.json").write_text(json.dumps({"name": "sft_basic", "version": "0"}))
    e = Experiment("sft_basic", experiment_path=tmp_path, resume=True)
    try:
        tl = e.get_timeline()
        assert len(tl) == 4
        assert len(tl[tl.moved]) == 0     # None there raised: Cannot mask with non-boolean array
        assert tl.hop_s.dtype == float and tl.hop_s.isna().all()
    finally:
        e.end()



def test_a_creation_write_torn_between_its_two_lines_leaves_a_pending_run(tmp_path):
    """A run's run_created and first run_status are one write, but two lines: a crash that tears
    the write between them leaves the run_created alone, read as the pending run it was."""
    from rapidfire_nb import Experiment

    lines = (FIXTURES / "sft_basic.jsonl").read_bytes().split(b"\n")
    assert b'"run_created", "run_id": 2' in lines[3] and b'"run_status", "run_id": 2' in lines[4]
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "events.jsonl").write_bytes(b"\n".join(lines[:4]) + b"\n" + lines[4][:20])
    assert S.fold(read_events(folder / "events.jsonl"))["runs"]["2"]["status"] == "pending"
    info = Experiment.open(folder).get_runs_info().set_index("run_id")
    assert list(info.status) == ["pending", "pending"]
