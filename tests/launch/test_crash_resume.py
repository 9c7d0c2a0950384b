"""Nothing lost: a training process is SIGKILLed at random moments and inside file
writes; ``Experiment(name, resume=True)`` plus the same ``run_fit`` arguments, in a new process,
finishes every run bit-identically to an uninterrupted one, with every metric point logged once.

The killed processes are children of ``crash_worker.py serve`` (forked after the imports, so a
trial costs its training time, not 6 s of imports); the resumes run in this test process. Also
here: resume keeps stopped runs stopped, appends to the same log, and refuses different data.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import crash_worker as W
import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.errors import ConfigError, OpRefused

pytestmark = pytest.mark.slow   # slow tier: SIGKILLed training subprocesses, resumed

TOTAL_CHUNKS = 18   # 3 runs x 2 epochs x 3 chunks
FIGURES: list[dict] = []


class WorkerServer:
    def __init__(self):
        env = dict(os.environ, RF_TENSORBOARD_ENABLED="0", TOKENIZERS_PARALLELISM="false",
                   HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.proc = subprocess.Popen([sys.executable, str(Path(W.__file__)), "serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=str(Path(W.__file__).parent))
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "crash_worker server died"
        return json.loads(line)

    def start(self, root: Path, resume: bool = False, pause: str | None = None,
              clone: bool = False) -> int:
        return self._ask({"cmd": "start", "root": str(root), "name": W.NAME, "resume": resume,
                          "pause": pause, "clone": clone})["pid"]

    def reap(self, pid: int) -> int:
        return self._ask({"cmd": "reap", "pid": pid})["exit"]

    def close(self):
        self.proc.stdin.close()   # EOF ends the server's request loop
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server():
    s = WorkerServer()
    yield s
    s.close()
    if FIGURES:
        print("\ncrash trials:")
        for f in FIGURES:
            print("  " + json.dumps(f))


def read_log(root: Path) -> list[dict]:
    """The log as a fresh process reads it from disk."""
    log = EventLog(root / W.NAME / "events.jsonl")
    try:
        return log.since(0)
    finally:
        log.close()


def chunks_logged(root: Path) -> int:
    try:
        return (root / W.NAME / "events.jsonl").read_text().count('"type": "chunk_done"')
    except FileNotFoundError:
        return 0


def metric_points(events: list[dict]) -> dict:
    """run_id -> Counter of (split, step) -> and the metrics logged there."""
    counts = collections.defaultdict(collections.Counter)
    values = {}
    for ev in events:
        if ev["type"] == "metric":
            counts[ev["run_id"]][(ev["split"], ev["step"])] += 1
            values[(ev["run_id"], ev["split"], ev["step"])] = ev["metrics"]
    return counts, values


def final_weights(root: Path, runs=(1, 2, 3)) -> dict:
    from rapidfire_nb.engine.store import ExperimentStore

    store = ExperimentStore(root / W.NAME)
    return {rid: store.load_checkpoint(rid)["trainer"]["weights"] for rid in runs}


def chunk_keys(events: list[dict]) -> collections.Counter:
    return collections.Counter((e["run_id"], e["epoch"], e["chunk"]) for e in events
                               if e["type"] == "chunk_done")


def make_reference(server, root: Path, clone: bool = False) -> dict:
    pid = server.start(root, clone=clone)
    assert server.reap(pid) == 0, (root / f"worker-{pid}.log").read_text()
    events = read_log(root)
    counts, values = metric_points(events)
    runs = (1, 2, 3, 4) if clone else (1, 2, 3)
    assert tuple(sorted(counts)) == runs
    for rid in (1, 2, 3):
        # 6 optimizer steps and 6 evaluations per run, each logged once
        assert sorted(counts[rid].values()) == [1] * 12
    if clone:
        # the warm clone (made after run 1's first chunk) trains its own full schedule, from run
        # 1's second chunk on, wrapping into the next epoch: 6 steps, 6 evaluations
        assert sorted(counts[4].values()) == [1] * 12
    chunks = chunk_keys(events)
    assert set(chunks.values()) == {1} and len(chunks) == TOTAL_CHUNKS + (6 if clone else 0)
    return {"weights": final_weights(root, runs), "counts": counts, "values": values,
            "runs": runs, "chunks": set(chunks)}


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    return make_reference(server, tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def clone_reference(server, tmp_path_factory):
    return make_reference(server, tmp_path_factory.mktemp("clone-reference"), clone=True)


def resume_here(root: Path, runs=(1, 2, 3)):
    """The user's recovery after a dead kernel, in this (another) process."""
    t0 = time.perf_counter()
    exp = W.run_experiment(root, resume=True)
    info = exp.get_runs_info()
    live = {rid: exp.engine.run_weights(rid) for rid in runs}
    exp.end()
    return info, live, time.perf_counter() - t0


def assert_matches_reference(root: Path, ref: dict, live: dict, info) -> None:
    runs = ref["runs"]
    assert list(info.status) == ["completed"] * len(runs), info[["run_id", "status", "error"]]
    assert (info.completed_steps == info.total_steps).all()
    on_disk = final_weights(root, runs)
    for rid in runs:
        for source in (live[rid], on_disk[rid]):
            assert source.keys() == ref["weights"][rid].keys()
            for k, v in ref["weights"][rid].items():
                assert torch.equal(source[k], v), f"run {rid}: {k} differs from the uninterrupted run"
    events = read_log(root)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    counts, values = metric_points(events)
    for rid in runs:
        dup = {k: n for k, n in counts[rid].items() if n != 1}
        assert not dup, f"run {rid}: metric points logged more than once: {dup}"
        assert set(counts[rid]) == set(ref["counts"][rid]), (
            f"run {rid}: lost {sorted(set(ref['counts'][rid]) - set(counts[rid]))}, "
            f"extra {sorted(set(counts[rid]) - set(ref['counts'][rid]))}")
    assert values == ref["values"], "logged metric values differ from the uninterrupted run"
    chunk_done = chunk_keys(events)
    assert set(chunk_done) == ref["chunks"] and set(chunk_done.values()) == {1}
    created = collections.Counter(e["run_id"] for e in events if e["type"] == "run_created")
    assert created == {rid: 1 for rid in runs}, f"run_created events: {dict(created)}"
    leftovers = [p for p in (root / W.NAME).rglob(".*.tmp-*")]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def kill_at_random(server, root: Path, rng: random.Random, resume: bool = False) -> dict:
    """Start a child; SIGKILL it after a random number of logged chunks plus a random delay."""
    start_chunks = chunks_logged(root)
    k = rng.randint(0, TOTAL_CHUNKS - 2 - start_chunks) if start_chunks < TOTAL_CHUNKS - 2 else 0
    delay = rng.uniform(0.0, 0.3)
    pid = server.start(root, resume=resume)
    deadline = time.monotonic() + 120
    meta = root / W.NAME / "experiment.json"
    while time.monotonic() < deadline:
        if meta.exists() and chunks_logged(root) >= start_chunks + k:
            break
        time.sleep(0.005)
    time.sleep(delay)
    os.kill(pid, signal.SIGKILL)
    code = server.reap(pid)
    return {"killed_after_chunks": chunks_logged(root), "wanted": start_chunks + k,
            "delay_s": round(delay, 3), "exit": code}


def kill_in_pause(server, root: Path, pause: str, clone: bool = False) -> dict:
    pid = server.start(root, pause=pause, clone=clone)
    marker = root / "PAUSED"
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert marker.exists(), f"the worker never reached the pause point {pause}"
    os.kill(pid, signal.SIGKILL)
    code = server.reap(pid)
    assert code == -signal.SIGKILL
    return {"pause": pause, "at": marker.read_text().split("/")[-1], "killed_after_chunks": chunks_logged(root)}


def tear_log_tail(root: Path, run_id: int) -> int:
    """Simulate a torn log append: half of the chunk's events, then half a line."""
    from rapidfire_nb.engine.store import ExperimentStore

    ckpt = ExperimentStore(root / W.NAME).load_checkpoint(run_id)
    batch = ckpt["events"] + [("chunk_done", ckpt["chunk_event"])]
    seq = read_log(root)[-1]["seq"]
    lines = []
    for type_, payload in batch:
        seq += 1
        lines.append(json.dumps({"seq": seq, "time": time.time(), "type": type_, **payload}) + "\n")
    keep = max(1, len(lines) // 2)
    with open(root / W.NAME / "events.jsonl", "a") as f:
        f.write("".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2])
    return keep


PAUSE_TRIALS = [
    "state:1:mid",        # the very first checkpoint, half written: nothing to fall back on
    "state:7:mid",        # a later checkpoint half written: the previous one must be used
    "state:4:renamed",    # checkpoint in place, its chunk's events not yet in the log
    "state:18:renamed",   # the last chunk of the last run: done on disk, not in the log
    "runs:3:mid",         # killed while run_fit was still creating the runs
    "runs:1:mid",         # killed before runs.json ever existed
]


@pytest.mark.parametrize("pause", PAUSE_TRIALS)
def test_sigkill_inside_a_write_then_resume(server, reference, tmp_path, pause):
    fig = kill_in_pause(server, tmp_path, pause)
    (tmp_path / "PAUSED").unlink()
    info, live, resume_s = resume_here(tmp_path)
    fig["resume_s"] = round(resume_s, 2)
    FIGURES.append(fig)
    assert_matches_reference(tmp_path, reference, live, info)


CLONE_PAUSES = [
    # the clone exists (runs.json, warm-start weights) but has not finished a chunk
    ("state:5:mid", False),
    # the clone has a checkpoint; a later chunk is on disk but not yet in the log
    ("state:8:renamed", True),
]


@pytest.mark.parametrize("pause,clone_has_checkpoint", CLONE_PAUSES)
def test_sigkill_with_a_warm_clone_then_resume(server, clone_reference, tmp_path, pause,
                                               clone_has_checkpoint):
    # run 4 is a warm-start clone of run 1, made after run 1's first chunk; the clone is applied
    # before the second round of chunks, so from the 4th checkpoint on it exists on disk
    from rapidfire_nb.engine.store import ExperimentStore

    fig = kill_in_pause(server, tmp_path, pause, clone=True)
    (tmp_path / "PAUSED").unlink()
    store = ExperimentStore(tmp_path / W.NAME)
    assert store.warm_start_path(4).exists()
    assert store.checkpoint_path(4).exists() == clone_has_checkpoint
    info, live, resume_s = resume_here(tmp_path, runs=(1, 2, 3, 4))
    fig["resume_s"] = round(resume_s, 2)
    FIGURES.append(fig)
    assert list(info.run_id) == [1, 2, 3, 4]
    assert info.set_index("run_id").loc[4, "parent_run_id"] == 1
    assert_matches_reference(tmp_path, clone_reference, live, info)


def test_sigkill_with_torn_log_tail(server, reference, tmp_path):
    fig = kill_in_pause(server, tmp_path, "state:8:renamed")
    run_id = int(fig["at"].split()[-1])
    fig["torn_lines_kept"] = tear_log_tail(tmp_path, run_id)
    info, live, resume_s = resume_here(tmp_path)
    fig["resume_s"] = round(resume_s, 2)
    FIGURES.append(fig)
    assert_matches_reference(tmp_path, reference, live, info)


@pytest.mark.parametrize("trial", range(6))
def test_sigkill_at_a_random_moment_then_resume(server, reference, tmp_path, trial):
    rng = random.Random(1000 + trial)
    fig = kill_at_random(server, tmp_path, rng)
    fig["trial"] = trial
    info, live, resume_s = resume_here(tmp_path)
    fig["resume_s"] = round(resume_s, 2)
    FIGURES.append(fig)
    assert_matches_reference(tmp_path, reference, live, info)


def test_sigkill_twice_resume_killed_too(server, reference, tmp_path):
    rng = random.Random(77)
    first = kill_at_random(server, tmp_path, rng)
    second = kill_at_random(server, tmp_path, rng, resume=True)
    info, live, resume_s = resume_here(tmp_path)
    FIGURES.append({"double": [first, second], "resume_s": round(resume_s, 2)})
    assert_matches_reference(tmp_path, reference, live, info)


# -- resume semantics, in process ---------------------------------------------------------------

def test_resume_keeps_stopped_runs_stopped_and_appends_to_the_log(tmp_path, reference):
    train, evald = W.make_data()
    exp = Experiment(W.NAME, experiment_path=tmp_path, tracking=[])
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, block=False, **W.RUN_FIT_KW)
    exp.stop(2)
    assert exp.wait(timeout=300)
    before = exp.get_runs_info().set_index("run_id")
    assert before.loc[2, "status"] == "stopped" and before.loc[2, "completed_steps"] < 6
    exp.end()
    n_before = len(read_log(tmp_path))

    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    assert again.path == (tmp_path / W.NAME).resolve(), "resume must reuse the same folder"
    # reopened, nothing trains yet: an op says what continues the runs (the panel lists them)
    n_open = len(read_log(tmp_path))
    with pytest.raises(OpRefused, match=r"was reopened .* call exp\.run_fit\(\.\.\.\) with the same arguments"):
        again.resume(2)
    assert len(read_log(tmp_path)) == n_open, "a refused op writes nothing"
    again.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    info = again.get_runs_info().set_index("run_id")
    assert info.loc[2, "status"] == "stopped"
    assert info.loc[2, "completed_steps"] == before.loc[2, "completed_steps"]
    assert list(info.loc[[1, 3], "status"]) == ["completed", "completed"]
    events = read_log(tmp_path)
    assert len(events) > n_before and [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(e["type"] == "experiment" for e in events) == 2, "one log across both sessions"

    # the stopped run continues from its checkpoint when resumed, and ends exact
    again.resume(2)
    assert again.wait(timeout=300)
    assert again.get_runs_info().set_index("run_id").loc[2, "status"] == "completed"
    w = again.engine.run_weights(2)
    for k, v in reference["weights"][2].items():
        assert torch.equal(w[k], v), k
    counts, _ = metric_points(read_log(tmp_path))
    assert counts[2] == reference["counts"][2]
    again.end()


def test_resume_refuses_different_data_or_settings(tmp_path):
    train, evald = W.make_data()
    exp = Experiment(W.NAME, experiment_path=tmp_path, tracking=[])
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, block=False, **W.RUN_FIT_KW)
    exp.end()
    n_events = len(read_log(tmp_path))
    ckpts = sorted(p.name for p in (tmp_path / W.NAME / "checkpoints").rglob("*"))

    other_train, other_eval = make_demo_datasets(W.N_TRAIN, W.N_EVAL, seed=6)
    cases = [
        (dict(train_dataset=other_train), "train_dataset differs"),
        (dict(eval_dataset=other_eval), "eval_dataset differs"),
        (dict(seed=12), "seed=11"),
        (dict(num_chunks=2), "num_chunks=3"),
    ]
    for change, message in cases:
        args = dict(train_dataset=train, eval_dataset=evald, **W.RUN_FIT_KW)
        args.update(change)
        again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
        with pytest.raises(ConfigError, match=message):
            again.run_fit(W.make_group(), tiny_create_model, **args)
        assert again.engine is None, "a refused resume must start nothing"
        again.end()
    # a different config group (one run fewer)
    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(ConfigError, match="config group"):
        again.run_fit(W.make_group().expand()[:2], tiny_create_model, train, evald, **W.RUN_FIT_KW)
    again.end()
    # nothing was trained or overwritten by the refused attempts
    events = read_log(tmp_path)
    assert not any(e["type"] in ("chunk_done", "metric") for e in events[n_events:])
    assert sorted(p.name for p in (tmp_path / W.NAME / "checkpoints").rglob("*")) == ckpts


def test_resume_of_a_missing_experiment_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no experiment"):
        Experiment("never-made", experiment_path=tmp_path, resume=True, tracking=[])
