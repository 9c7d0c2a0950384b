"""A hostile folder, part 4: files that are not regular files (a named pipe, a device node) or
are larger than any engine writes, and events larger than any engine writes.

Opening a named pipe for reading waits until some process opens it for writing, which may be
never; a device node such as /dev/zero never ends. The cases that would hang run in a child
process, so that a regression fails here instead of holding the whole suite.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from rapidfire_nb.errors import RapidFireError

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "events"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def digest(folder: Path) -> dict:
    """Every entry of a folder: its kind and, for a regular file, its bytes' hash."""
    out = {}
    for p in sorted([folder, *folder.rglob("*")]):
        st = os.lstat(p)
        rel = str(p.relative_to(folder))
        if stat.S_ISREG(st.st_mode):
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[rel] = (stat.filemode(st.st_mode)[0],)
    return out


def fixture_folder(parent: Path, name: str = "x", fixture: str = "sft_basic") -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / f"{fixture}.jsonl", folder / "events.jsonl")
    (folder / "experiment.json").write_text(json.dumps({"name": name}))
    return folder


# Each case: put something at one file of a copied folder, then open it read-only and resume it;
# every attempt must be refused naming the file, and the folder must be left as it was.
_CHILD = r"""
import json, os, sys
from pathlib import Path
from rapidfire_nb import Experiment
from rapidfire_nb.engine import fsio

fsio.MAX_LOG_BYTES = 1 << 20   # the bound of the oversized case, without writing a GB
parent, name = Path(sys.argv[1]), sys.argv[2]
out = {}
for how in ("open", "resume"):
    try:
        if how == "open":
            Experiment.open(parent / name)
        else:
            Experiment(name, experiment_path=parent, resume=True, tracking=[])
        out[how] = "no error"
    except Exception as exc:
        out[how] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def _attempt(parent: Path, name: str = "x") -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(parent), name], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("target", ["events.jsonl", "experiment.json"])
def test_a_named_pipe_in_the_folder_is_refused_naming_it_and_nothing_changes(tmp_path, target):
    folder = fixture_folder(tmp_path / "exps")
    os.unlink(folder / target)
    os.mkfifo(folder / target)
    before = digest(folder)
    out = _attempt(tmp_path / "exps")
    for how, said in out.items():
        assert f"{folder / target} is a named pipe (FIFO), not a regular file" in said, (how, said)
        assert said.count(str(folder / target)) == 1, said
    assert digest(folder) == before


def test_a_device_node_as_the_event_log_is_refused_before_it_is_read(tmp_path):
    folder = fixture_folder(tmp_path / "exps")
    os.unlink(folder / "events.jsonl")
    try:   # /dev/zero's own numbers: it never ends
        os.mknod(folder / "events.jsonl", stat.S_IFCHR | 0o644, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device node needs root here")
    before = digest(folder)
    out = _attempt(tmp_path / "exps")
    for how, said in out.items():
        assert f"{folder / 'events.jsonl'} is a character device, not a regular file" in said, (how, said)
    assert digest(folder) == before


def test_a_lock_that_is_a_named_pipe_is_refused(tmp_path):
    folder = fixture_folder(tmp_path / "exps")
    os.mkfifo(folder / ".lock")
    before = digest(folder)
    said = _attempt(tmp_path / "exps")["resume"]
    assert f"{folder / '.lock'} is a named pipe (FIFO), not a regular file" in said
    assert digest(folder) == before


def test_an_event_log_larger_than_the_bound_is_refused_unread(tmp_path):
    """A sparse file costs no disk: its size alone is refused, before a byte of it is read (the
    child lowers the 1 GiB bound to 1 MiB)."""
    folder = fixture_folder(tmp_path / "exps")
    with open(folder / "events.jsonl", "r+b") as f:
        f.truncate((1 << 20) + 1)
    before = digest(folder)
    out = _attempt(tmp_path / "exps")
    for how, said in out.items():
        assert (f"{folder / 'events.jsonl'} is 1,048,577 bytes or more, larger than the 1,048,576 "
                "bytes rapidfire reads of an event log") in said, (how, said)
    assert digest(folder) == before


def test_the_bounded_reader_refuses_what_is_not_a_regular_file_and_reads_up_to_its_bound(tmp_path):
    from rapidfire_nb.engine.fsio import NotRegularFileError, read_regular

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(NotRegularFileError, match="pipe is a named pipe"):
        read_regular(pipe, 10)
    with pytest.raises(NotRegularFileError, match="is a directory"):
        read_regular(tmp_path, 10)
    f = tmp_path / "f"
    f.write_bytes(b"x" * 10)
    assert read_regular(f, 10) == b"x" * 10
    with pytest.raises(RapidFireError, match="f is 10 bytes or more, larger than the 9 bytes"):
        read_regular(f, 9, "note")
    (tmp_path / "link").symlink_to(f)
    with pytest.raises(OSError):
        read_regular(tmp_path / "link", 10)


# -- every event's texts are bounded where the log is read, as where it is written -------------

def append_events(folder: Path, *events: dict) -> None:
    path = folder / "events.jsonl"
    seq = len([line for line in path.read_text().splitlines() if line.strip()])
    with open(path, "a") as f:
        for ev in events:
            seq += 1
            f.write(json.dumps({"seq": seq, "time": 1.0, **ev}) + "\n")


def generation(n: int = 1, prompt: str = "p", text: str = "a", ref: str | None = None) -> dict:
    return {"type": "generation", "run_id": 1, "epoch": 0, "chunk": 1, "step": 4, "samples_seen": 16,
            "prompts": [prompt] * n, "references": [ref] * n, "texts": [text] * n}


CRAFTED = [
    ("9 prompts", generation(9), r"generation\.prompts: 9 entries, more than the 8 sample prompts"),
    ("200k prompts", generation(200_000), r"generation\.prompts: 200,000 entries"),
    ("a long prompt", generation(prompt="p" * 2001),
     r"generation\.prompts\[0\]: 2,001 characters, more than the 2,000 logged of one"),
    ("a long reference", generation(ref="r" * 2001), r"generation\.references\[0\]: 2,001 characters"),
    ("a long answer", generation(text="a" * 100_001),
     r"generation\.texts\[0\]: 100,001 characters, more than the 100,000"),
    ("a 10 MB note", {"type": "note", "run_id": 1, "text": "n" * 10_000_000},
     r"note\.text: 10,000,000 characters, more than the 2,000 a note holds"),
]


@pytest.mark.parametrize("event,match", [c[1:] for c in CRAFTED], ids=[c[0] for c in CRAFTED])
def test_crafted_texts_are_refused_where_the_log_is_read_naming_file_and_line(tmp_path, event, match):
    from rapidfire_nb import Experiment
    from rapidfire_nb.report import read_folder

    folder = fixture_folder(tmp_path / "exps")
    append_events(folder, event)
    before = digest(folder)
    where = rf"{folder / 'events.jsonl'}, line 27 \(seq 27\): {match}"
    with pytest.raises(RapidFireError, match=where):
        Experiment.open(folder)
    with pytest.raises(RapidFireError, match=where):
        Experiment("x", experiment_path=tmp_path / "exps", resume=True, tracking=[])
    with pytest.raises(RapidFireError, match=where):
        read_folder(folder)
    assert digest(folder) == before


def test_the_largest_texts_the_engine_writes_are_read(tmp_path):
    from rapidfire_nb import Experiment

    folder = fixture_folder(tmp_path / "exps")
    append_events(folder, generation(8, prompt="p" * 2000, text="a" * 100_000, ref="r" * 2000),
                  {"type": "note", "run_id": 1, "text": "n" * 2000})
    exp = Experiment.open(folder)
    assert exp.get_runs_info().set_index("run_id").note[1] == "n" * 2000


def test_texts_beyond_the_bounds_are_refused_where_they_are_written(tmp_path):
    from rapidfire_nb.engine.events import EventLog, EventTextsError

    log = EventLog(tmp_path / "events.jsonl")
    log.append("note", run_id=1, text="fine")
    data = (tmp_path / "events.jsonl").read_bytes()
    for kind, payload in (("note", {"run_id": 1, "text": "n" * 2001}),
                          ("generation", {k: v for k, v in generation(9).items() if k != "type"})):
        with pytest.raises(EventTextsError, match="run 1: .*nothing of it was logged"):
            log.append(kind, **payload)
    assert (tmp_path / "events.jsonl").read_bytes() == data and log.last_seq == 1
    log.close()


def test_the_read_bounds_are_the_write_bounds():
    from rapidfire_nb import results
    from rapidfire_nb.engine import events, generation as gen
    from rapidfire_nb.notebook import _panel_protocol

    assert events.MAX_NOTE_CHARS == results.MAX_NOTE_CHARS == _panel_protocol.MAX_NOTE_CHARS
    assert events._sample_bounds() == (gen.MAX_SAMPLE_PROMPTS, gen.MAX_SAMPLE_PROMPT_CHARS)
    # an answer is at most MAX_SAMPLE_NEW_TOKENS tokens: the character bound leaves hundreds a token
    assert events.MAX_ANSWER_CHARS >= 300 * gen.MAX_SAMPLE_NEW_TOKENS


def test_a_log_naming_too_many_workers_is_refused_naming_file_and_line(tmp_path):
    """The reducer finds a worker's row by its name: a crafted event of 20,000 workers took 8 s
    to fold. One event lists at most 4,096, and a log names at most 4,096 distinct workers."""
    from rapidfire_nb import Experiment

    def workers(names):
        return {"type": "workers", "workers": [{"worker": n} for n in names], "resources": {}}

    folder = fixture_folder(tmp_path / "exps")
    append_events(folder, workers([f"w{i}" for i in range(4_097)]))
    with pytest.raises(RapidFireError, match=r"line 27 \(seq 27\): workers\.workers: 4,097 workers "
                                             r"in one event, more than the 4,096"):
        Experiment.open(folder)
    folder = fixture_folder(tmp_path / "exps2")
    append_events(folder, workers([f"w{i}" for i in range(4_000)]),
                  {"type": "worker_lost", "worker": "w0", "node": None, "reason": "x", "runs": [],
                   "chunk_lost": None, "workers_left": 1},
                  workers([f"v{i}" for i in range(97)]))
    with pytest.raises(RapidFireError, match=r"line 29 \(seq 29\): workers: this event brings the "
                                             r"log to 4,097 distinct worker names"):
        Experiment.open(folder)
    folder = fixture_folder(tmp_path / "exps3")
    append_events(folder, workers([f"w{i}" for i in range(4_096)]))
    assert len(Experiment.open(folder).get_runs_info()) == 2


@pytest.mark.parametrize("target", ["logs/engine.log", "checkpoints/run_1/state.safetensors",
                                    "runs/1/checkpoints/final_checkpoint/trainer_state.json"])
def test_a_named_pipe_deeper_in_the_folder_is_refused_before_training(tmp_path, target):
    """Files opened only once the engine runs (a resumed run's checkpoint, the engine's log):
    a pipe there held run_fit for ever, or ended the engine's thread after run_fit returned,
    leaving runs pending with no error. The resume is refused naming it, nothing changed."""
    folder = fixture_folder(tmp_path / "exps")
    (folder / target).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / target)
    before = digest(folder)
    said = _attempt(tmp_path / "exps")["resume"]
    assert f"{folder / target} is a named pipe (FIFO), not a regular file" in said, said
    assert digest(folder) == before


def test_a_checkpoint_larger_than_memory_or_not_a_file_is_refused_by_name(tmp_path):
    """A run's checkpoint is read whole: a sparse file larger than the machine's memory is
    refused naming it (not a bare MemoryError), and a named pipe there is refused before any
    read (a read would wait for a writer for ever)."""
    from rapidfire_nb.engine import CheckpointReadError, ExperimentStore

    store = ExperimentStore(tmp_path / "exp")
    path = store.checkpoint_path(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") + 1)
    with pytest.raises(CheckpointReadError, match="more than this machine's memory"):
        store.load_checkpoint(1)
    assert path.stat().st_blocks == 0          # nothing was read into or written to it
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(CheckpointReadError, match="named pipe"):
        store.load_checkpoint(1)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_log_folder_that_cannot_be_made_costs_the_log_not_the_runs(tmp_path):
    """A file named ``logs`` where the engine's log folder goes: the engine thread used to die
    opening its log, leaving a clone pending for ever while the engine still said it was busy.
    Now the runs train and the log is what is lost."""
    from rapidfire_nb.automl import List, RFGridSearch, RFModelConfig, RFSFTConfig
    from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

    from rapidfire_nb import Experiment

    train, evald = make_demo_datasets(n_train=16, n_eval=4)
    group = RFGridSearch(List([RFModelConfig(model_name="tiny", training_args=RFSFTConfig(
        learning_rate=1e-3, per_device_train_batch_size=4, max_steps=2, report_to="none"))]),
        trainer_type="SFT")
    exp = Experiment("nolog", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=1, block=True)
    exp.end()
    shutil.rmtree(tmp_path / "nolog" / "logs")
    (tmp_path / "nolog" / "logs").write_text("a file where the log folder goes")
    again = Experiment("nolog", experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(group, tiny_create_model, train, evald, num_chunks=1, block=True)
    clone = again.clone_modify(1, {"training_args.learning_rate": 5e-4})
    assert again.wait(120)
    info = again.get_runs_info().set_index("run_id")
    assert info.status[clone] == "completed", info.error.tolist()
    again.end()
    assert (tmp_path / "nolog" / "logs").read_text() == "a file where the log folder goes"
