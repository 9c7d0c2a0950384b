"""Tracking: TensorBoard, MLflow and Trackio fed from a real EventLog, read back from their files.

The event log is filled with the events the engine writes (same types and payloads as
``engine/controller.py``) for an experiment with a completed run, a stopped-resumed-stopped run, a
warm-started clone, a failed cold clone and a deleted clone; every backend must then hold the same
metrics at the same steps, the runs' parameters and their lifecycle.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.tracking import (Tracker, TrackerHub, TrackerWarning, metric_tag,
                                   resolve_trackers)
from rapidfire_nb.tracking.base import flatten_config

from helpers import (logged_run_name, RECORDED_NUM_CHUNKS, RECORDED_STEPS_PER_CHUNK, Recorder, track_recorded,
                     trackio_points, trackio_state, trackio_uid)

ALL = ["tensorboard", "mlflow", "trackio"]


@pytest.fixture(autouse=True)
def _local_stores(monkeypatch):
    # A user's MLflow server must not receive test runs; telemetry must not try the network.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")


# -- a recorded experiment ---------------------------------------------------------------------


LIFECYCLES = {1: ["running", "completed"], 2: ["running", "stopped", "resumed", "stopped"],
              3: ["running", "completed"], 4: ["running", "failed"], 5: ["deleted"]}


# -- readers of the real files -----------------------------------------------------------------

def tb_folder(exp_path: Path, run_id: int) -> str:
    """The run's TensorBoard folder: its short name, as the panel calls it."""
    from rapidfire_nb.tracking.naming import folder_name

    name = logged_run_name(exp_path, run_id)
    assert folder_name(run_id, None) == f"run {run_id}" and name.startswith(f"{run_id} · lr ")
    return name


def tb_accumulator(exp_path: Path, run_id: int):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(exp_path / "tensorboard" / tb_folder(exp_path, run_id)),  # the panel's name
                           size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def tb_points(exp_path: Path, run_id: int) -> dict:
    acc = tb_accumulator(exp_path, run_id)
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tb_texts(exp_path: Path, run_id: int, tag: str) -> list[tuple[int, str]]:
    acc = tb_accumulator(exp_path, run_id)
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(f"{tag}/text_summary")]


def tb_hparams(exp_path: Path, run_id: int):
    from tensorboard.plugins.hparams import metadata

    content = tb_accumulator(exp_path, run_id).PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    end = (metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
           if metadata.SESSION_END_INFO_TAG in content else None)
    return start, end


def mlflow_client(exp_path: Path):
    from mlflow.tracking import MlflowClient

    state = json.loads((exp_path / "tracking" / "mlflow.json").read_text())["state"]
    return MlflowClient(tracking_uri=state["tracking_uri"]), state


def mlflow_runs(exp_path: Path, name="exp") -> dict:
    client, _ = mlflow_client(exp_path)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    return {int(r.data.tags["rapidfire.run_id"]): r for r in runs}


def mlflow_points(exp_path: Path, run) -> dict:
    client, _ = mlflow_client(exp_path)
    out = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        out[key] = [(m.step, m.value) for m in history]
    return out


def assert_same_points(actual: dict, expected: dict, where: str):
    assert sorted(actual) == sorted(expected), f"{where}: tags differ"
    for tag, points in expected.items():
        got = actual[tag]
        assert [s for s, _ in got] == [s for s, _ in points], f"{where} {tag}: steps differ"
        for (_, a), (_, b) in zip(got, points):
            assert a == pytest.approx(b, rel=1e-6), f"{where} {tag}: {a} != {b}"


# -- choosing trackers -------------------------------------------------------------------------

def test_resolve_trackers_env_defaults_and_switches(monkeypatch):
    for var in ("RF_TENSORBOARD_ENABLED", "RF_MLFLOW_ENABLED", "RF_TRACKIO_ENABLED"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_trackers() == ["tensorboard"]
    monkeypatch.setenv("RF_MLFLOW_ENABLED", "1")
    monkeypatch.setenv("RF_TRACKIO_ENABLED", "yes")
    monkeypatch.setenv("RF_TENSORBOARD_ENABLED", "false")
    assert resolve_trackers() == ["mlflow", "trackio"]
    monkeypatch.setenv("RF_TENSORBOARD_ENABLED", "maybe")
    with pytest.raises(ConfigError, match="RF_TENSORBOARD_ENABLED"):
        resolve_trackers()


def test_resolve_trackers_argument_wins_and_names_unknown(monkeypatch):
    monkeypatch.setenv("RF_MLFLOW_ENABLED", "1")
    assert resolve_trackers(["TensorBoard", "trackio", "tensorboard"]) == ["tensorboard", "trackio"]
    assert resolve_trackers("mlflow") == ["mlflow"]
    assert resolve_trackers([]) == [] and resolve_trackers(False) == []
    with pytest.raises(ConfigError, match=r"'wandb'.*'comet'.*choose from tensorboard"):
        resolve_trackers(["tensorboard", "wandb", "comet"])
    with pytest.raises(ConfigError, match="tracking"):
        resolve_trackers(42)
    custom = Tracker()
    assert resolve_trackers(["mlflow", custom]) == ["mlflow", custom]


def test_flatten_config_keeps_scalars_and_encodes_the_rest():
    flat = flatten_config({"training_args": {"learning_rate": 1e-3, "bf16": False},
                           "peft_config": {"target_modules": ["q", "v"], "r": 8},
                           "ref_model_name": None, "model_kwargs": {}})
    assert flat == {"training_args.learning_rate": 1e-3, "training_args.bf16": False,
                    "peft_config.target_modules": '["q", "v"]', "peft_config.r": 8,
                    "model_kwargs": "{}"}


# -- every backend, read back ------------------------------------------------------------------

def test_all_backends_hold_the_same_metrics_params_and_lifecycle(tmp_path):
    exp_path = tmp_path / "exp"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrackerWarning)
        rec, hub = track_recorded(exp_path, ALL)
    assert hub.failures == {}

    mruns = mlflow_runs(exp_path)
    assert sorted(mruns) == [1, 2, 3, 4, 5]
    for run_id, expected in rec.expected.items():
        assert_same_points(tb_points(exp_path, run_id), expected, f"tensorboard run_{run_id}")
        assert_same_points(mlflow_points(exp_path, mruns[run_id]), expected, f"mlflow run_{run_id}")
        assert_same_points(trackio_points(exp_path, run_id), expected, f"trackio run_{run_id}")
    assert rec.expected[5] == {} and rec.expected[1]["eval/loss"][-1][0] == 48

    # parameters: the flattened config, knobs, and the clone's lineage, in every backend
    start, end = tb_hparams(exp_path, 3)
    assert start.hparams["training_args.learning_rate"].number_value == pytest.approx(5e-4)
    assert start.hparams["peft_config.target_modules"].string_value == '["q_proj", "v_proj"]'
    assert start.hparams["rapidfire.parent_run_id"].number_value == 1
    assert start.hparams["rapidfire.warm_start"].bool_value is True
    params = mruns[3].data.params
    assert params["training_args.learning_rate"] == "0.0005"
    assert params["rapidfire.parent_run_id"] == "1" and params["rapidfire.warm_start"] == "True"
    assert mruns[3].data.tags["rapidfire.parent_mlflow_run_id"] == mruns[1].info.run_id
    assert mruns[4].data.tags["rapidfire.parent_run_id"] == "2"
    assert mruns[4].data.tags["rapidfire.warm_start"] == "false"
    from trackio.api import Run as TrackioRun

    state = trackio_state(exp_path)
    config = TrackioRun(state["project"], "run_3", run_id=trackio_uid(exp_path, 3)).config
    assert config["training_args.learning_rate"] == pytest.approx(5e-4)
    assert config["rapidfire.parent_run_id"] == 1 and config["rapidfire.warm_start"] is True

    # lifecycle: MLflow statuses, TensorBoard session ends and text, Trackio alerts
    assert {rid: r.info.status for rid, r in mruns.items()} == {
        1: "FINISHED", 2: "KILLED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
    assert mruns[5].data.tags["rapidfire.deleted"] == "true"
    assert "ValueError: boom" in mruns[4].data.tags["rapidfire.error"]
    assert {rid: r.data.tags["rapidfire.status"] for rid, r in mruns.items()} == {
        rid: events[-1] for rid, events in LIFECYCLES.items()}
    from tensorboard.plugins.hparams import api_pb2

    ends = {rid: tb_hparams(exp_path, rid)[1] for rid in LIFECYCLES}
    assert ends[2] is None and ends[1].status == api_pb2.STATUS_SUCCESS
    assert ends[4].status == api_pb2.STATUS_FAILURE and ends[5].status == api_pb2.STATUS_UNKNOWN
    for run_id, lifecycle in LIFECYCLES.items():
        texts = tb_texts(exp_path, run_id, "lifecycle")
        assert [t.split("**")[1] for _, t in texts] == lifecycle
        name = logged_run_name(exp_path, run_id)
        alerts = TrackioRun(state["project"], name, run_id=trackio_uid(exp_path, run_id)).alerts()
        assert sorted(a["title"] for a in alerts) == sorted(f"{name} {e}" for e in lifecycle)
    # the stop/resume of run 2 happen at the samples it had seen (16, then 32)
    assert [s for s, _ in tb_texts(exp_path, 2, "lifecycle")] == [0, 16, 16, 32]
    config_text = tb_texts(exp_path, 3, "config")[0][1]
    assert "clone of run 1 (warm start)" in config_text and '"learning_rate": 0.0005' in config_text


def test_tensorboard_names_runs_as_the_panel_does(tmp_path):
    from rapidfire_nb.tracking.tb_tracker import tb_run_name

    assert tb_run_name(tmp_path, 3) == "run 3"
    knobs = {"training_args.learning_rate": 1e-3, "peft_config.r": 32, "model_name": "org/tiny"}
    # two knobs at most, learning rate and rank first
    assert tb_run_name(tmp_path, 3, knobs) == "3 · lr 1e-3 · r 32"
    # one path part: a model path keeps its last part, a character a folder refuses is replaced
    assert tb_run_name(tmp_path, 3, {"model_name": "org/tiny", "training_args.lr_scheduler_type": "cos:x"}) \
        == "3 · model tiny · sched cos_x"
    (tmp_path / "run_4").mkdir()  # an experiment written with the old naming keeps its folder
    assert tb_run_name(tmp_path, 4, knobs) == "run_4"
    (tmp_path / "run 5").mkdir()
    assert tb_run_name(tmp_path, 5, knobs) == "run 5"


def test_mlflow_and_trackio_name_runs_as_the_panel_does(tmp_path):
    from trackio.sqlite_storage import SQLiteStorage

    exp_path = tmp_path / "exp"
    # a project of its own: Trackio's directory is shared by every test of this process
    track_recorded(exp_path, ["mlflow", "trackio"], name="names")
    mruns = mlflow_runs(exp_path, "names")
    names = {i: logged_run_name(exp_path, i) for i in range(1, 6)}
    assert names[3] == "3 · lr 5e-4"   # the id and the knob that sets it apart
    assert {rid: r.info.run_name for rid, r in mruns.items()} == names
    state = trackio_state(exp_path)
    assert state["run_names"] == {str(i): n for i, n in names.items()}
    assert set(SQLiteStorage.get_runs(state["project"])) == set(names.values())


def test_trackio_experiment_with_old_run_names_keeps_them_on_resume(tmp_path, monkeypatch):
    """A Trackio project written when runs were ``run_<id>`` (tracker state without
    ``run_names``) continues those runs on resume instead of starting ``run <id>`` twins."""
    from rapidfire_nb.tracking import trackio_tracker

    exp_path = tmp_path / "exp"
    events = EventLog(exp_path / "events.jsonl")
    rec = Recorder(events)
    with monkeypatch.context() as m:   # the old version: run_<id> and no run_names in the state
        m.setattr(trackio_tracker, "run_name", lambda run_id, knobs=None: f"run_{run_id}")
        hub = TrackerHub(events, exp_path, "exp", ["trackio"]).start()
        rec.phase1()
        assert hub.flush(120)
        hub.close()
    saved = json.loads((exp_path / "tracking" / "trackio.json").read_text())
    saved["state"].pop("run_names")
    (exp_path / "tracking" / "trackio.json").write_text(json.dumps(saved))
    events.close()

    events = EventLog(exp_path / "events.jsonl")
    rec.events = events
    hub = TrackerHub(events, exp_path, "exp", ["trackio"]).start()
    rec.phase2()
    assert hub.flush(120), hub.failures
    hub.close()
    assert trackio_state(exp_path)["run_names"] == {str(i): f"run_{i}" for i in range(1, 6)}
    for run_id, expected in rec.expected.items():
        assert_same_points(trackio_points(exp_path, run_id, f"run_{run_id}"), expected,
                           f"trackio run_{run_id}")
        assert trackio_points(exp_path, run_id) == {}   # no "run <id>" twin


def test_resume_continues_runs_without_duplicates(tmp_path):
    exp_path = tmp_path / "exp"
    events = EventLog(exp_path / "events.jsonl")
    rec = Recorder(events)
    hub = TrackerHub(events, exp_path, "exp", ALL).start()
    rec.phase1()
    assert hub.flush(120)
    hub.close()
    events.close()
    first_files = sorted((exp_path / "tensorboard" / tb_folder(exp_path, 1)).iterdir())

    # a new session: the log is read back from disk and the experiment goes on
    events = EventLog(exp_path / "events.jsonl")
    assert events.last_seq > 0
    rec.events = events
    hub = TrackerHub(events, exp_path, "exp", ALL).start()
    rec.phase2()
    assert hub.flush(120), hub.failures
    hub.close()

    assert len(sorted((exp_path / "tensorboard" / tb_folder(exp_path, 1)).iterdir())) == len(first_files) + 1
    mruns = mlflow_runs(exp_path)
    assert sorted(mruns) == [1, 2, 3, 4, 5]  # one MLflow run per run, the old ones continued
    for run_id, expected in rec.expected.items():
        assert_same_points(tb_points(exp_path, run_id), expected, f"tensorboard run_{run_id}")
        assert_same_points(mlflow_points(exp_path, mruns[run_id]), expected, f"mlflow run_{run_id}")
        assert_same_points(trackio_points(exp_path, run_id), expected, f"trackio run_{run_id}")
    for run_id in LIFECYCLES:  # the session start (hparams) is written once per run
        assert tb_hparams(exp_path, run_id)[0].group_name == logged_run_name(exp_path, run_id)
    last = {name: json.loads((exp_path / "tracking" / f"{name}.json").read_text())["last_seq"]
            for name in ALL}
    assert last == {name: events.last_seq for name in ALL}


def test_replay_after_a_crash_before_the_seq_was_saved_adds_no_points(tmp_path):
    """MLflow and Trackio writes are idempotent: when the saved seq lags what was written (a
    crash between the write and the save), replaying the gap adds no point twice."""
    exp_path = tmp_path / "exp"
    names = ["mlflow", "trackio"]
    events = EventLog(exp_path / "events.jsonl")
    rec = Recorder(events)
    hub = TrackerHub(events, exp_path, "exp", names).start()
    rec.phase1()
    assert hub.flush(120)
    hub.close()
    saved = {n: (exp_path / "tracking" / f"{n}.json").read_text() for n in names}
    hub = TrackerHub(events, exp_path, "exp", names).start()
    rec.phase2()
    assert hub.flush(120)
    hub.close()
    for name, text in saved.items():  # the crash: phase 2 was written, its seq never saved
        (exp_path / "tracking" / f"{name}.json").write_text(text)
    state = json.loads(saved["mlflow"])
    state["state"]["runs"].pop("1")  # even a run id lost from the state is found by its tags
    (exp_path / "tracking" / "mlflow.json").write_text(json.dumps(state))

    hub = TrackerHub(EventLog(exp_path / "events.jsonl"), exp_path, "exp", names).start()
    assert hub.flush(120) and hub.failures == {}
    hub.close()
    mruns = mlflow_runs(exp_path)
    assert sorted(mruns) == [1, 2, 3, 4, 5]
    for run_id, expected in rec.expected.items():
        assert_same_points(mlflow_points(exp_path, mruns[run_id]), expected, f"mlflow run_{run_id}")
        assert_same_points(trackio_points(exp_path, run_id), expected, f"trackio run_{run_id}")


# -- failures stay inside the tracker ----------------------------------------------------------

class RaisingTracker(Tracker):
    name = "raising"

    def __init__(self, fail_on: str = "log_metrics"):
        super().__init__()
        self.fail_on = fail_on
        self.calls = 0

    def log_metrics(self, run, step, metrics, wall_time):
        self.calls += 1
        if self.fail_on == "log_metrics":
            raise RuntimeError("backend exploded")


class ThreadRecorder(Tracker):
    name = "thread-recorder"

    def __init__(self):
        super().__init__()
        self.threads: set[int] = set()

    def run_created(self, run, wall_time):
        self.threads.add(threading.get_ident())

    def log_metrics(self, run, step, metrics, wall_time):
        self.threads.add(threading.get_ident())


def test_a_raising_tracker_warns_once_and_others_go_on(tmp_path):
    exp_path = tmp_path / "exp"
    raising, watcher = RaisingTracker(), ThreadRecorder()
    with pytest.warns(TrackerWarning) as caught:
        rec, hub = track_recorded(exp_path, ["tensorboard", raising, watcher])
    messages = [str(w.message) for w in caught if issubclass(w.category, TrackerWarning)]
    assert len(messages) == 1
    assert "raising tracker" in messages[0] and "backend exploded" in messages[0]
    assert raising.calls == 1 and hub.failures == {"raising": "RuntimeError: backend exploded"}
    assert hub.names == ["tensorboard", "thread-recorder"]
    for run_id, expected in rec.expected.items():
        assert_same_points(tb_points(exp_path, run_id), expected, f"tensorboard run_{run_id}")
    # trackers never run in the thread that appends events (the training thread)
    assert watcher.threads and threading.get_ident() not in watcher.threads


def test_missing_package_and_unwritable_folder_disable_only_that_tracker(tmp_path, monkeypatch):
    exp_path = tmp_path / "exp"
    exp_path.mkdir()
    (exp_path / "tensorboard").write_text("a file where the TensorBoard folder should be")
    monkeypatch.setitem(sys.modules, "trackio", None)  # what `import trackio` sees when missing
    with pytest.warns(TrackerWarning) as caught:
        rec, hub = track_recorded(exp_path, ALL)
    messages = sorted(str(w.message) for w in caught if issubclass(w.category, TrackerWarning))
    assert len(messages) == 2
    assert "tensorboard tracker failed" in messages[0]
    assert "trackio tracker failed" in messages[1] and "ModuleNotFoundError" in messages[1]
    assert "pip install trackio" in messages[1] and "[trackio] extra" in messages[1]
    assert sorted(hub.failures) == ["tensorboard", "trackio"] and hub.names == ["mlflow"]
    mruns = mlflow_runs(exp_path)
    for run_id, expected in rec.expected.items():
        assert_same_points(mlflow_points(exp_path, mruns[run_id]), expected, f"mlflow run_{run_id}")


@pytest.mark.slow
def test_trackio_store_lives_in_the_experiment_folder(tmp_path):
    # trackio reads TRACKIO_DIR once, at import: a fresh interpreter shows the default placement
    exp_path = tmp_path / "exp"
    code = f"""
import os, sys
os.environ.pop("TRACKIO_DIR", None)
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
from pathlib import Path
import helpers as t
rec, hub = t.track_recorded(Path({str(exp_path)!r}), ["trackio"], name="placement")
assert hub.failures == {{}}, hub.failures
assert "TRACKIO_DIR" not in os.environ, "the tracker left TRACKIO_DIR in the environment"
print(len(t.trackio_points(Path({str(exp_path)!r}), 1)["train/loss"]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(Path(__file__).parent.parent.parent), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == str(RECORDED_STEPS_PER_CHUNK * RECORDED_NUM_CHUNKS)
    assert (exp_path / "trackio" / "placement.db").exists()
    assert trackio_state(exp_path)["trackio_dir"] == str((exp_path / "trackio").resolve())


def test_non_numeric_and_nan_metrics(tmp_path):
    exp_path = tmp_path / "exp"
    events = EventLog(exp_path / "events.jsonl")
    hub = TrackerHub(events, exp_path, "exp", ["tensorboard", "mlflow"]).start()
    rec = Recorder(events)
    rec.create(1, 1e-3)
    events.append("metric", run_id=1, split="train", step=1, samples_seen=4, epoch=0, chunk=0,
                  metrics={"loss": float("nan"), "note": "text", "flag": True, "lr": 0.1})
    assert hub.flush(60) and hub.failures == {}
    hub.close()
    points = tb_points(exp_path, 1)
    assert sorted(points) == ["train/global_step", "train/loss", "train/lr"]
    assert math.isnan(points["train/loss"][0][1])
    mrun = mlflow_runs(exp_path)[1]
    assert sorted(mrun.data.metrics) == ["train/global_step", "train/loss", "train/lr"]


# -- end to end: a real experiment -------------------------------------------------------------

def _sft_group(lrs):
    from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig

    return RFGridSearch(List([
        RFModelConfig(model_name="tiny",
                      peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                      training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8,
                                                num_train_epochs=1, bf16=False, max_length=64,
                                                logging_steps=1))
        for lr in lrs]), trainer_type="SFT")


def _engine_points(exp) -> dict[int, dict[str, list[tuple[int, float]]]]:
    """What the engine itself recorded (get_results), in the trackers' naming and step axis."""
    out: dict[int, dict[str, list]] = {}
    df = exp.get_results()
    for row in df.itertuples():
        value = float(row.value)
        runs = out.setdefault(int(row.run_id), {})
        runs.setdefault(metric_tag(row.split, row.metric), []).append((int(row.samples_seen), value))
    for row in df[df.split == "train"].drop_duplicates(["run_id", "step"]).itertuples():
        out[int(row.run_id)].setdefault("train/global_step", []).append(
            (int(row.samples_seen), float(row.step)))
    return out


def test_real_experiment_with_a_stopped_run_and_clones(tmp_path, tiny_data):
    from rapidfire_nb import Experiment
    from rapidfire_nb.demo_data import tiny_create_model

    train, evald = tiny_data
    exp = Experiment("tracked", experiment_path=tmp_path, tracking=ALL)

    def wait_until(predicate):
        deadline = time.monotonic() + 120
        while not predicate():
            assert time.monotonic() < deadline, exp.get_runs_info()
            time.sleep(0.05)

    def chunks_done(run_id):
        info = exp.get_runs_info().set_index("run_id")
        return int(info.chunks_done.get(run_id, 0)) if run_id in info.index else -1

    # clone_modify is called only while the engine is idle: building a TRL config in another
    # thread while a run trains resets accelerate's global state under it (reported to the lead)
    try:
        exp.run_fit(_sft_group([1e-3, 1e-2]), tiny_create_model, train, evald, num_chunks=4,
                    seed=3, block=False)
        wait_until(lambda: chunks_done(2) >= 1)
        exp.stop(2)
        assert exp.wait(300)
        warm = exp.clone_modify(2, {"training_args.learning_rate": 5e-3}, warm_start=True)
        assert exp.wait(300)
        cold = exp.clone_modify(1, {"training_args": {"learning_rate": 2e-3}})
        wait_until(lambda: chunks_done(cold) >= 0)
        exp.stop(cold)  # at its next chunk boundary: it ends stopped
        assert exp.wait(300)
        exp.resume(2)
        assert exp.wait(300)
        info = exp.get_runs_info().set_index("run_id")
    finally:
        exp.end()
    assert not any(isinstance(e, str) for e in info.error), [e for e in info.error if e]
    assert dict(info.status) == {1: "completed", 2: "completed", warm: "completed",
                                 cold: "stopped"}
    hub_failures = exp._trackers.failures if exp._trackers is not None else {}
    assert hub_failures == {}

    expected = _engine_points(exp)
    assert set(expected) >= {1, 2, warm}
    mruns = mlflow_runs(exp.path, "tracked")
    assert sorted(mruns) == [1, 2, warm, cold]
    for run_id, points in expected.items():
        assert "train/loss" in points and "eval/loss" in points
        assert_same_points(tb_points(exp.path, run_id), points, f"tensorboard run_{run_id}")
        assert_same_points(mlflow_points(exp.path, mruns[run_id]), points, f"mlflow run_{run_id}")
        assert_same_points(trackio_points(exp.path, run_id), points, f"trackio run_{run_id}")

    statuses = {rid: r.info.status for rid, r in mruns.items()}
    assert statuses == {1: "FINISHED", 2: "FINISHED", warm: "FINISHED", cold: "KILLED"}
    assert mruns[warm].data.tags["rapidfire.parent_run_id"] == "2"
    assert mruns[warm].data.params["rapidfire.warm_start"] == "True"
    assert mruns[warm].data.params["training_args.learning_rate"] == "0.005"
    assert mruns[cold].data.params["training_args.learning_rate"] == "0.002"
    lifecycle_2 = [t.split("**")[1] for _, t in tb_texts(exp.path, 2, "lifecycle")]
    assert lifecycle_2 == ["running", "stopped", "resumed", "completed"]
    start, _ = tb_hparams(exp.path, warm)
    assert start.hparams["rapidfire.parent_run_id"].number_value == 2
    # the warm clone's curve continues the parent's samples-seen axis
    assert expected[warm]["train/loss"][0][0] > expected[2]["eval/loss"][0][0]


def test_a_raising_tracker_changes_no_result(tmp_path, tiny_data):
    from rapidfire_nb import Experiment
    from rapidfire_nb.demo_data import tiny_create_model

    train, evald = tiny_data
    results = []
    for name, tracking in (("plain", []), ("raising", ["tensorboard", RaisingTracker()])):
        exp = Experiment(name, experiment_path=tmp_path, tracking=tracking)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exp.run_fit(_sft_group([1e-2]), tiny_create_model, train, evald, num_chunks=2,
                        seed=5)
            exp.end()
        df = exp.get_results().sort_values(["run_id", "split", "step", "metric"])
        results.append(df[~df.metric.isin(["train_runtime", "eval_runtime",
                                           "eval_samples_per_second", "eval_steps_per_second"])])
        if name == "raising":
            assert any(issubclass(w.category, TrackerWarning) and "backend exploded" in str(w.message)
                       for w in caught)
            assert exp._trackers.failures == {"raising": "RuntimeError: backend exploded"}
    plain, raising = results
    assert len(plain) > 0
    assert plain[["run_id", "split", "step", "metric"]].values.tolist() == \
        raising[["run_id", "split", "step", "metric"]].values.tolist()
    assert plain.value.tolist() == raising.value.tolist()


def test_mlflow_store_migrations_are_quiet_without_changing_the_loggers(tmp_path, caplog):
    """The migration notes of a new MLflow store are dropped for the opening call only: the
    loggers' levels and filters are as they were (no process-wide change in the user's kernel)."""
    import logging

    from rapidfire_nb.tracking.base import TrackerContext
    from rapidfire_nb.tracking.mlflow_tracker import MlflowTracker

    names = ("mlflow.store.db.utils", "alembic.runtime.migration")
    before = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names}
    tracker = MlflowTracker()
    with caplog.at_level(logging.INFO):
        tracker.open(TrackerContext(tmp_path / "exp", "quiet", tracker.state, False))
    assert not [r for r in caplog.records if r.name.startswith(("alembic", "mlflow.store.db"))]
    assert {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters)) for n in names} == before
    tracker.close()
