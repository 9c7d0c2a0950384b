"""The experiment folder survives damage, sharing and hostile files.

A damaged log line is refused, never cuts the history short; a second process cannot train the
same folder; a planted pickle is refused, never run; damaged metadata is named; names with control
characters make no folder; a resume refuses an event log emptied or deleted under runs that have
history; a checkpoint swapped between runs, or copied from another experiment, is refused naming
the file. (Crafted content of a folder, links and read-only disks: tests/folder/test_hostile_folder.py.)
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine.events import EventLog, EventLogError, read_events
from rapidfire_nb.engine.lock import ExperimentLocked
from rapidfire_nb.engine.store import CheckpointReadError, ExperimentStore, MetadataError
from rapidfire_nb.errors import ConfigError

from helpers import customer_support_rows, model, sft, to_chat
from helpers import events_of as evs
from helpers import two_chat_runs as grp

REPO = Path(__file__).resolve().parents[2]


def make_log(path: Path, n: int = 46) -> bytes:
    log = EventLog(path)
    for i in range(n):
        log.append("metric", run_id=1 + i % 3, split="train", step=i, samples_seen=i, epoch=0,
                   chunk=0, metrics={"loss": 1.0 / (i + 1)})
    log.close()
    return path.read_bytes()


def replace_line(data: bytes, number: int, new: bytes) -> bytes:
    lines = data.split(b"\n")
    lines[number - 1] = new
    return b"\n".join(lines)


# -- 1. opening a log never deletes valid history ------------------------------------------------

@pytest.mark.parametrize("damage, message", [
    (b'{"seq": 20, "time": 1, "type": "metric", "run_id": 2, ', "line 20: not valid JSON"),
    (b'{"seq": 20, "type": "metric", "note": "\xff\xfe"}', "line 20: not UTF-8"),
    (b'{"seq": 19, "time": 1, "type": "metric"}', "line 20: sequence number 19 where 20"),
    (b'[1, 2, 3]', "line 20: not an event"),
])
def test_damage_in_the_middle_refuses_the_open_and_leaves_the_file(tmp_path, damage, message):
    path = tmp_path / "events.jsonl"
    damaged = replace_line(make_log(path), 20, damage)
    path.write_bytes(damaged)
    with pytest.raises(EventLogError, match=message) as err:
        EventLog(path)
    assert str(path) in str(err.value)
    with pytest.raises(EventLogError, match=message):
        read_events(path)
    assert path.read_bytes() == damaged, "a refused open must not change the file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl"]


def test_only_a_torn_final_line_is_dropped_and_its_bytes_are_kept_aside(tmp_path):
    path = tmp_path / "events.jsonl"
    data = make_log(path)
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    torn = data[: -len(last) // 2]            # a crash in the middle of the last write
    path.write_bytes(torn)
    log = EventLog(path)
    assert [e["seq"] for e in log.since(0)] == list(range(1, 46))
    log.append("experiment_end")
    log.close()
    assert [e["seq"] for e in read_events(path)] == list(range(1, 47))
    aside = list(tmp_path.glob("events.jsonl.torn-*"))
    assert len(aside) == 1 and torn.endswith(aside[0].read_bytes())


def test_a_whole_last_event_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "events.jsonl"
    data = make_log(path)
    path.write_bytes(data[:-1])               # the crash came between the event and its newline
    log = EventLog(path)
    assert log.last_seq == 46
    log.append("experiment_end")
    log.close()
    assert [e["seq"] for e in read_events(path)] == list(range(1, 48))


def test_an_experiment_with_a_damaged_log_refuses_to_resume_and_keeps_it(tmp_path):
    exp = Experiment("dmg", experiment_path=tmp_path, tracking=[])
    for i in range(10):
        exp.events.append("op", op="stop", run_id=i, accepted=False, reason="x", new_run_id=None)
    exp.end()
    path = tmp_path / "dmg" / "events.jsonl"
    original = path.read_bytes()
    damaged = replace_line(original, 5, b"garbage")
    path.write_bytes(damaged)
    with pytest.raises(EventLogError, match=r"events.jsonl, line 5: not valid JSON"):
        Experiment("dmg", experiment_path=tmp_path, resume=True, tracking=[])
    assert path.read_bytes() == damaged
    # the refused open let go of the folder: once repaired, it opens with all its history
    path.write_bytes(original)
    again = Experiment("dmg", experiment_path=tmp_path, resume=True, tracking=[])
    assert sum(e["type"] == "op" for e in again.events.since(0)) == 10
    again.end()


# -- 2. one live engine per folder ---------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {tests!r})
    import crash_worker as W
    from rapidfire_nb import Experiment
    from rapidfire_nb.demo_data import tiny_create_model

    root = Path(sys.argv[1])
    exp = Experiment(W.NAME, experiment_path=root, tracking=[])

    def hold(ev):
        # training: a chunk is on disk; stay in the middle of the experiment until killed
        if ev["type"] == "chunk_done":
            (root / "TRAINING").write_text(str(ev["seq"]))
            time.sleep(600)

    exp.events.subscribe(hold)
    train, evald = W.make_data()
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, block=True, **W.RUN_FIT_KW)
""")


def test_a_second_process_cannot_train_a_folder_in_use_and_a_killed_one_releases_it(tmp_path):
    import crash_worker as W
    from rapidfire_nb.demo_data import tiny_create_model

    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(tests=str(Path(__file__).parent.parent)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (tmp_path / "TRAINING").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        log_before = (tmp_path / W.NAME / "events.jsonl").read_bytes()
        with pytest.raises(ExperimentLocked, match=rf"in use by another live process \(pid {proc.pid}"):
            Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
        assert (tmp_path / W.NAME / "events.jsonl").read_bytes() == log_before, \
            "the refused Experiment must not write to the folder"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        proc.stderr.close()
    # the OS dropped the dead process's lock: the folder resumes and finishes
    train, evald = W.make_data()
    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    assert set(again.get_runs_info().status) == {"completed"}
    seqs = [e["seq"] for e in read_events(again.store.events_path)]
    assert seqs == list(range(1, len(seqs) + 1))
    again.end()


def test_two_experiments_of_one_process_on_one_folder(tmp_path):
    first = Experiment("same", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ExperimentLocked, match="already open in this process"):
        Experiment("same", experiment_path=tmp_path, resume=True, tracking=[])
    first.end()
    second = Experiment("same", experiment_path=tmp_path, resume=True, tracking=[])
    second.end()


# -- 4. nothing read from the folder can run code ------------------------------------------------

class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_checkpoint_is_refused_not_run(tmp_path):
    import crash_worker as W
    from rapidfire_nb.demo_data import tiny_create_model

    exp = Experiment(W.NAME, experiment_path=tmp_path, tracking=[])
    # the folder of a kernel that died as run_fit began: its start logged, no run created yet
    exp.events.append("experiment", name=exp.name, path=str(exp.path), resumed=False)
    exp.end()
    store = ExperimentStore(tmp_path / W.NAME)
    marker = tmp_path / "PWNED"
    payload = pickle.dumps({"trainer": _Exploit(marker), "counters": {}})
    for rid in (1, 2):   # the old name, and a pickle disguised under the new one
        store.checkpoint_path(rid).parent.mkdir(parents=True)
    store.checkpoint_path(1).with_suffix(".pt").write_bytes(payload)
    store.checkpoint_path(2).write_bytes(payload)
    store.warm_start_path(3).parent.mkdir(parents=True)
    store.warm_start_path(3).write_bytes(payload)

    with pytest.raises(CheckpointReadError, match="pickle"):
        store.load_checkpoint(1)
    with pytest.raises(CheckpointReadError, match="pickle"):
        store.load_checkpoint(2)
    with pytest.raises(CheckpointReadError, match="pickle"):
        store.load_warm_start(3)
    train, evald = W.make_data()
    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(W.make_group(), tiny_create_model, train, evald, block=False, **W.RUN_FIT_KW)
    info = again.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "failed" and "pickle" in info.loc[1, "error"]
    assert info.loc[2, "status"] == "failed" and "pickle" in info.loc[2, "error"]
    assert again.wait(timeout=300)
    again.end()
    assert not marker.exists(), "a pickle from the experiment folder was executed"


# The one unpickling the package does on purpose: a Ray worker loading the functions and datasets
# the controller cloudpickled in memory moments before (the same bytes Ray's own transport would
# unpickle), to name the field that fails. Nothing read from a file goes through it.
RAY_TRANSPORT = {("rapidfire_nb/engine/workers/worker.py", "pickle.load"): 1}


def test_the_package_never_unpickles():
    offenders = []
    for path in (REPO / "rapidfire_nb").rglob("*.py"):
        text = path.read_text()
        rel = path.relative_to(REPO).as_posix()
        for needle in ("weights_only=False", "pickle.load", "import pickle", "torch.load("):
            if text.count(needle) > RAY_TRANSPORT.get((rel, needle), 0):
                offenders.append(f"{rel}: {needle}")
    assert offenders == []
    # the allowed one loads bytes handed over by the controller, never a path
    worker = (REPO / "rapidfire_nb/engine/workers/worker.py").read_text()
    assert "def load_blob(blob: bytes):" in worker and "cloudpickle.loads(blob)" in worker


# -- 5. damaged metadata -------------------------------------------------------------------------

def _fresh(tmp_path, name="meta"):
    exp = Experiment(name, experiment_path=tmp_path, tracking=[])
    exp.end()
    return tmp_path / name


@pytest.fixture(scope="module")
def trained_crash_folder(tmp_path_factory):
    """crash_worker's experiment trained to the end once; each test damages its own copy (runs.json
    is only ever written by a run_fit that logged its start, so the damage meets a real log)."""
    import crash_worker as W

    parent = tmp_path_factory.mktemp("trained")
    W.run_experiment(parent).end()
    return parent / W.NAME


@pytest.mark.parametrize("content, message", [
    (b"{not json", r"runs.json is not valid JSON: .* line 1 column 2"),
    (b"[1, 2]", r"runs.json holds a JSON array where an object"),
    (b'{"1": {"status": "runing"}}', r"runs.json: run 1 has unknown status 'runing'"),
    (b'{"1": {"status": "pending", "completed_steps": "3"}}', r"runs.json: run 1 has completed_steps='3'"),
    (b'{"x": {"status": "pending"}}', r"runs.json: key 'x' is not a run id"),
    (b'{"1": "pending"}', r"runs.json: run 1 is not an object"),
    (b'\xff\xfe{}', r"runs.json is not UTF-8"),
])
def test_damaged_runs_json_is_named(trained_crash_folder, tmp_path, content, message):
    import shutil

    import crash_worker as W
    from rapidfire_nb.demo_data import tiny_create_model

    root = tmp_path / W.NAME
    shutil.copytree(trained_crash_folder, root)
    (root / "runs.json").write_bytes(content)
    train, evald = W.make_data()
    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(MetadataError, match=message):
        again.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    assert again.engine is None or again.engine.thread is None, "nothing may start"
    again.end()
    assert (root / "runs.json").read_bytes() == content


@pytest.mark.parametrize("content, message", [
    (b'{"name": "meta", ', r"experiment.json is not valid JSON"),
    (b'"meta"', r"experiment.json holds a JSON string where an object"),
    (b'{"name": "meta", "seed": "11"}', r"experiment.json: 'seed' is a JSON string"),
    (b'\x80abc', r"experiment.json is not UTF-8"),
])
def test_damaged_experiment_json_is_named(tmp_path, content, message):
    root = _fresh(tmp_path)
    (root / "experiment.json").write_bytes(content)
    log = (root / "events.jsonl").read_bytes()
    with pytest.raises(MetadataError, match=message):
        Experiment("meta", experiment_path=tmp_path, resume=True, tracking=[])
    assert (root / "experiment.json").read_bytes() == content
    assert (root / "events.jsonl").read_bytes() == log
    # the refused open let go of the folder
    (root / "experiment.json").write_text('{"name": "meta"}')
    Experiment("meta", experiment_path=tmp_path, resume=True, tracking=[]).end()


# -- 9. names and HTML ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["ok\n", "ok\r", "a/b", "a\\b", "x\x00y", "tab\there", "..", "",
                                  ".hidden", "é" * 3])
def test_experiment_names_with_control_chars_or_separators_are_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="experiment_name"):
        Experiment(name, experiment_path=tmp_path, tracking=[])
    assert list(tmp_path.iterdir()) == []


def test_tensorboard_html_escapes_the_folder_and_the_proxy_url(tmp_path, monkeypatch):
    from rapidfire_nb.errors import RapidFireError
    from rapidfire_nb.notebook.tensorboard import proxy_url, tensorboard_html

    logdir = tmp_path / '<img src=x onerror="alert(1)">'
    monkeypatch.setenv("RF_TENSORBOARD_PROXY_URL", '/p/%PORT%/"><script>alert(2)</script>')
    html = tensorboard_html(proxy_url(6006), logdir)
    assert "<script>" not in html and "<img" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
    assert 'src="/p/6006/&quot;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"' in html
    monkeypatch.setenv("RF_TENSORBOARD_PROXY_URL", "javascript:alert(3)//%PORT%")
    with pytest.raises(RapidFireError, match="must be http"):
        tensorboard_html(proxy_url(6006), logdir)
    ok = tensorboard_html("https://hub.example/user/proxy/6006/", logdir)
    assert 'href="https://hub.example/user/proxy/6006/"' in ok


def test_hostile_safetensors_checkpoints_are_refused_with_a_reason(tmp_path):
    import torch
    from safetensors.torch import save

    from rapidfire_nb.engine import safeformat

    store = ExperimentStore(tmp_path)
    path = store.checkpoint_path(1)
    path.parent.mkdir(parents=True)
    t = {"t0": torch.zeros(3)}
    cases = {
        "no .rapidfire_state. metadata": save(t),
        "not JSON": save(t, metadata={"rapidfire_state": "{"}),
        "format version": save(t, metadata={"rapidfire_state": '{"version": 99, "state": {}}'}),
        "not stored": save(t, metadata={"rapidfire_state": '{"version": 1, "state": {"$t": "t9"}}'}),
        "is not allowed": save(t, metadata={"rapidfire_state":
                                            '{"version": 1, "state": {"$np": "t0", "dtype": "|O"}}'}),
        "damaged skeleton": save(t, metadata={"rapidfire_state": '{"version": 1, "state": {"$map": [1]}}'}),
        "not a safetensors file": b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}",
        "not JSON ": save(t, metadata={"rapidfire_state": "[" * 100000}),
    }
    for reason, data in cases.items():
        path.write_bytes(data)
        with pytest.raises(CheckpointReadError, match=reason.strip()):
            store.load_checkpoint(1)
    # and what the engine writes reads back exactly
    state = {"w": torch.arange(6.0).reshape(2, 3), "steps": (1, 2.5, None), 0: "int key",
             "$odd": float("inf")}
    path.write_bytes(safeformat.encode(state))
    back = store.load_checkpoint(1)
    assert torch.equal(back["w"], state["w"]) and back["steps"] == (1, 2.5, None)
    assert back[0] == "int key" and back["$odd"] == float("inf")


# -- resume with the event log emptied or deleted ---------------------------------------------

DATA = (customer_support_rows(16), customer_support_rows(4, seed=1))


@pytest.mark.parametrize("damage", ["empty", "deleted"])
def test_resume_refuses_a_lost_event_log_when_runs_have_history(tmp_path, damage):
    from rapidfire_nb.engine.events import EventLogError

    exp = Experiment("H", experiment_path=tmp_path, tracking=[])
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    exp.end()
    log = tmp_path / "H" / "events.jsonl"
    if damage == "empty":
        log.write_bytes(b"")
    else:
        log.unlink()
    runs_before = (tmp_path / "H" / "runs.json").read_bytes()
    with pytest.raises(EventLogError, match=r"events.jsonl is (empty|missing) but .*runs.json records 2 run"):
        Experiment("H", experiment_path=tmp_path, tracking=[], resume=True)
    assert (tmp_path / "H" / "runs.json").read_bytes() == runs_before
    assert log.exists() == (damage == "empty") and (damage == "deleted" or log.read_bytes() == b"")
    # the folder lock was released: a second try gets the same clear refusal, not "in use"
    with pytest.raises(EventLogError, match="events.jsonl"):
        Experiment("H", experiment_path=tmp_path, tracking=[], resume=True)


def test_resume_of_a_folder_where_no_run_was_created_is_still_allowed(tmp_path):
    Experiment("F", experiment_path=tmp_path, tracking=[]).end()
    (tmp_path / "F" / "events.jsonl").write_bytes(b"")
    again = Experiment("F", experiment_path=tmp_path, tracking=[], resume=True)
    again.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    assert set(again.get_runs_info().status) == {"completed"}
    again.end()


# -- checkpoints swapped or copied between runs -----------------------------------------------

def test_a_checkpoint_swapped_between_runs_is_refused_naming_the_file(tmp_path):
    from rapidfire_nb.engine.store import CheckpointReadError

    exp = Experiment("S", experiment_path=tmp_path, tracking=[])
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    exp.end()
    c1 = tmp_path / "S" / "checkpoints" / "run_1" / "state.safetensors"
    c2 = tmp_path / "S" / "checkpoints" / "run_2" / "state.safetensors"
    b1, b2 = c1.read_bytes(), c2.read_bytes()
    c1.write_bytes(b2)
    c2.write_bytes(b1)
    with pytest.warns(UserWarning, match=r"run 1 is completed but its checkpoint cannot be used: "
                                         r".*run_1/state.safetensors belongs to run 2, not run 1"):
        again = Experiment("S", experiment_path=tmp_path, tracking=[], resume=True)
        again.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    with pytest.raises(CheckpointReadError, match=r"run_1/state.safetensors belongs to run 2"):
        again.engine.run_weights(1)
    with pytest.raises(CheckpointReadError, match=r"run_2/state.safetensors belongs to run 1"):
        again.export(2, tmp_path / "out")
    n = again.clone_modify(1, {"training_args.learning_rate": 0.0}, warm_start=True)
    assert again.wait(timeout=120)
    op = evs(again, "op", op="clone")[-1]
    assert not op["accepted"] and "belongs to run 2" in op["reason"], op
    assert n not in set(again.get_runs_info().run_id)
    again.end()


def test_a_checkpoint_copied_from_another_experiments_run_is_refused(tmp_path):
    from rapidfire_nb.engine.store import CheckpointReadError

    one = lambda lr: RFGridSearch(model(sft(lr), formatting_func=to_chat), trainer_type="SFT")  # noqa: E731
    for name, lr in (("A", 1e-2), ("B", 1e-3)):
        exp = Experiment(name, experiment_path=tmp_path, tracking=[])
        exp.run_fit(one(lr), tiny_create_model, *DATA, num_chunks=2)
        exp.end()
    ca = tmp_path / "A" / "checkpoints" / "run_1" / "state.safetensors"
    cb = tmp_path / "B" / "checkpoints" / "run_1" / "state.safetensors"
    cb.write_bytes(ca.read_bytes())
    with pytest.warns(UserWarning, match=r"B/checkpoints/run_1/state.safetensors was written for another config"):
        again = Experiment("B", experiment_path=tmp_path, tracking=[], resume=True)
        again.run_fit(one(1e-3), tiny_create_model, *DATA, num_chunks=2)
    with pytest.raises(CheckpointReadError, match=r"B/checkpoints/run_1/state.safetensors was written for another config"):
        again.engine.run_weights(1)
    again.end()
