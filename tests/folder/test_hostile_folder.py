"""A hostile experiment folder: planted models, symbolic links, crafted counters, logs and
automl.json, a read-only disk, a log deleted while runs train, exports over other files. Each is
refused with a reason that names the file (and line and field), or handled, and changes nothing.
(Damaged logs, the folder lock, pickles and swapped checkpoints: tests/folder/test_folder_safety.py.)"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import RapidFireError

from helpers import customer_support_rows, model, sft, to_chat

DATA = (customer_support_rows(16), customer_support_rows(4, seed=1))


def grp(**kw):
    return RFGridSearch(model(sft(), formatting_func=to_chat), trainer_type="SFT", **kw)


def trained(tmp_path, name="x", num_chunks=2, group=None):
    exp = Experiment(name, experiment_path=tmp_path, tracking=[])
    exp.run_fit(group or grp(), tiny_create_model, *DATA, num_chunks=num_chunks, block=True)
    spec = exp.engine.snapshot()[1].spec
    exp.end()
    return tmp_path / name, spec


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".lock"}


def append_events(folder: Path, *events: dict) -> None:
    path = folder / "events.jsonl"
    seq = len([line for line in path.read_text().splitlines() if line.strip()])
    with open(path, "a") as f:
        for ev in events:
            seq += 1
            f.write(json.dumps({"seq": seq, "time": time.time(), **ev}) + "\n")


# -- a planted model chosen by the folder -----------------------------------------------------

def plant_model(folder: Path, marker: Path) -> Path:
    evil = folder / "outputs" / "evil"
    evil.mkdir(parents=True)
    (evil / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilModel"],
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}}))
    (evil / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('planted code ran')\n"
        "from transformers import PretrainedConfig, PreTrainedModel\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
        "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n")
    return evil


def readme_create_model(model_config):
    """The README quick start's shape: whatever the config names is loaded with its kwargs."""
    if model_config["model_name"] == "tiny":
        return tiny_create_model(model_config)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, kwargs = model_config["model_name"], model_config["model_kwargs"]
    return AutoModelForCausalLM.from_pretrained(name, **kwargs), AutoTokenizer.from_pretrained(name)


@pytest.mark.parametrize("with_config", [False, True])
def test_a_clone_planted_in_the_log_never_chooses_what_create_model_loads(tmp_path, with_config):
    from rapidfire_nb import automl

    folder, spec = trained(tmp_path)
    marker = tmp_path / "MARKER"
    evil = plant_model(folder, marker)
    changes = {"model_name": str(evil), "model_kwargs.trust_remote_code": True}
    clone = automl.apply_changes(spec, changes)
    event = {"type": "run_created", "run_id": 2, "trainer_type": "SFT", "knobs": {},
             "parent_run_id": 1, "warm_start": False, "total_steps": 4, "steps_per_epoch": 4,
             "num_chunks": 2, "base_samples_seen": 0, "changes": changes}
    if with_config:       # the config that matches the changes, so its fingerprint fits
        event["config"] = clone.config_dict()
    append_events(folder, event, {"type": "run_status", "run_id": 2, "status": "pending",
                                  "error": None, "reason": None})
    if not with_config:
        before = snapshot(folder)
        # a run_created without its config is not an event the engine writes
        with pytest.raises(RapidFireError, match=r"events.jsonl, line \d+ \(seq \d+\): "
                                                 r"run_created: missing 'config'"):
            Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
        assert snapshot(folder) == before
    else:
        exp = Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
        exp.run_fit(grp(), readme_create_model, *DATA, num_chunks=2, block=True)
        info = exp.get_runs_info().set_index("run_id")
        assert info.loc[1, "status"] == "completed"
        assert info.loc[2, "status"] == "failed"
        assert "model_kwargs" in info.loc[2, "error"] and "model_name" in info.loc[2, "error"]
        assert "run_fit" in info.loc[2, "error"]
        exp.end()
    assert not marker.exists(), "code planted in the folder ran"


# -- symbolic links ---------------------------------------------------------------------------

def test_a_lock_link_leaves_its_target_untouched(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"x" * 19000)
    folder = tmp_path / "exps" / "x"
    folder.mkdir(parents=True)
    os.symlink(victim, folder / ".lock")
    with pytest.raises(RapidFireError, match=r"\.lock is a symbolic link"):
        Experiment("x", experiment_path=tmp_path / "exps", tracking=[])
    assert victim.read_bytes() == b"x" * 19000


@pytest.mark.parametrize("dangling", [False, True])
def test_an_events_link_leaves_its_target_untouched(tmp_path, dangling):
    folder, _ = trained(tmp_path)
    token = tmp_path / "token"
    if not dangling:
        token.write_bytes(b"secret-token-without-newline")
    (folder / "events.jsonl").unlink()
    os.symlink(token, folder / "events.jsonl")
    for resume in (True, False):
        with pytest.raises(RapidFireError, match="symbolic link"):
            Experiment("x", experiment_path=tmp_path, resume=resume, tracking=[]) if resume \
                else Experiment.open(folder)
    if dangling:
        assert not token.exists(), "a log was created outside the folder"
    else:
        assert token.read_bytes() == b"secret-token-without-newline"
    assert not list(folder.glob("events.jsonl.torn-*"))


# -- a crafted counter, and wait(timeout) -----------------------------------------------------

def test_a_crafted_chunk_count_is_refused_naming_file_line_and_field(tmp_path):
    folder, _ = trained(tmp_path, group=grp(pruner="sha"))
    (folder / "checkpoints" / "run_1" / "state.safetensors").unlink()
    path = folder / "events.jsonl"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        ev = json.loads(line)
        if ev["type"] == "chunk_done":
            ev["chunks_done"] = 10 ** 12
            lines[i] = json.dumps(ev)
    path.write_text("\n".join(lines) + "\n")
    before = snapshot(folder)
    exp = Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
    t0 = time.monotonic()
    with pytest.raises(RapidFireError, match=r"events.jsonl, line \d+ \(seq \d+, field "
                                             r"chunk_done.chunks_done\).*chunks_done=1000000000000"):
        exp.run_fit(grp(pruner="sha"), tiny_create_model, *DATA, num_chunks=2, block=True)
    assert time.monotonic() - t0 < 120
    exp.end()
    assert snapshot(folder) == before, "a refused resume changed the folder"
    # an ended experiment still reads as ended: the refused resume logged nothing
    assert Experiment.open(folder).table()["ended"] is True


def test_wait_returns_by_its_deadline_while_the_engine_holds_its_lock(tmp_path):
    import threading

    exp = Experiment("w", experiment_path=tmp_path, tracking=[])
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2, block=False)
    held, release = threading.Event(), threading.Event()

    def hog():
        with exp.engine.lock:
            held.set()
            release.wait(60)

    t = threading.Thread(target=hog)
    t.start()
    held.wait(10)
    t0 = time.monotonic()
    done = exp.wait(timeout=1.0)
    took = time.monotonic() - t0
    release.set()
    t.join()
    assert not done and took < 3.0, f"wait(timeout=1) took {took:.1f} s"
    exp.end()


# -- crafted logs and automl.json -------------------------------------------------------------

def _edit(kind, change):
    """A line edit: the first event of ``kind`` changed by ``change(event)``."""
    def edit(ev, line):
        if ev["type"] != kind:
            return None
        change(ev)
        return json.dumps(ev)
    return edit


CRAFTED = {
    # json.dumps itself refuses such an int: the line is edited as text
    "huge int": (lambda ev, line: line.replace('"step": ', '"step": ' + "9" * 5000 + ', "x": ', 1)
                 if ev["type"] == "metric" else None, r"not readable JSON"),
    "deep array": (lambda ev, line: line[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}"
                   if ev["type"] == "metric" else None, r"not readable JSON \(nested too deeply\)"),
    "deep config": (_edit("run_created", lambda ev: ev.update(config=_deep(900))),
                    r"nested more than 32 levels"),
    "no split": (_edit("metric", lambda ev: ev.pop("split")), r"metric: missing 'split'"),
    "no status": (_edit("run_status", lambda ev: ev.pop("status")), r"run_status: missing 'status'"),
    "status": (_edit("run_status", lambda ev: ev.update(status=["completed"])),
               r"run_status.status: \['completed'\] is not string"),
    "run id 0": (_edit("run_created", lambda ev: ev.update(run_id=0)), r"run_created.run_id: 0 is below 1"),
    "run id -1": (_edit("run_status", lambda ev: ev.update(run_id=-1)), r"run_status.run_id: -1 is below 1"),
    # a pruning_suggested event without its rung
    "no rung": (lambda ev, line: None if ev["type"] != "run_created" else line.replace(
        '"type": "run_created"', '"type": "pruning_suggested", "rank": 1, "of": 2, "reason": "r"', 1),
                r"pruning_suggested: missing 'rung'"),
}


def _deep(n):
    obj: dict = {}
    for _ in range(n):
        obj = {"a": obj}
    return obj


@pytest.mark.parametrize("name", list(CRAFTED))
def test_crafted_logs_are_refused_with_file_line_and_field_and_nothing_changes(tmp_path, name):
    folder, _ = trained(tmp_path)
    path = folder / "events.jsonl"
    edit, message = CRAFTED[name]
    out, done = [], False
    for line in path.read_text().splitlines():
        new = None if done else edit(json.loads(line), line)
        done = done or new is not None
        out.append(line if new is None else new)
    assert done
    path.write_text("\n".join(out) + "\n")
    before = snapshot(folder)
    for opener in (lambda: Experiment("x", experiment_path=tmp_path, resume=True, tracking=[]),
                   lambda: Experiment.open(folder)):
        with pytest.raises(RapidFireError, match=message) as err:
            opener()
        assert f"{path}, line " in str(err.value)
    assert snapshot(folder) == before


@pytest.mark.parametrize("damage, field", [
    ({"pruned": {"1": {"run_id": 1, "rung": 1, "rank": 2, "of": 2, "reason": "x", "extra": 1}}},
     "pruned.1"),
    ({"seen": {"1": -10 ** 12}}, "seen.1"),
    ({"seen": {"0": 1}}, "seen.0"),
    ({"suggestions": {"1": {"run_id": "1", "rung": 1, "rank": 2, "of": 2, "reason": "x"}}},
     "suggestions.1.run_id"),
])
def test_a_crafted_automl_json_is_refused_naming_the_field(tmp_path, damage, field):
    exp = Experiment("x", experiment_path=tmp_path, tracking=[])
    exp.run_fit(grp(pruner="sha"), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    folder = tmp_path / "x"
    state = json.loads((folder / "automl.json").read_text())
    state.update(damage)
    (folder / "automl.json").write_text(json.dumps(state))
    before = snapshot(folder)
    exp = Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(RapidFireError, match=rf"automl.json: field {field!r}"):
        exp.run_fit(grp(pruner="sha"), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    assert snapshot(folder) == before


# -- read-only folders, a deleted log, export ---------------------------------------------------

def test_a_read_only_folder_is_refused_clearly_and_opens_for_reading(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes through file permissions")
    folder, _ = trained(tmp_path)
    modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
    for p in modes:
        p.chmod(modes[p] & ~0o222)
    try:
        with pytest.raises(RapidFireError, match=r"read-only.*Experiment.open"):
            Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])
        ro = Experiment.open(folder)
        assert list(ro.get_runs_info().status) == ["completed"]
    finally:
        for p, m in modes.items():
            p.chmod(m)


def test_open_reads_results_without_writing_and_refuses_ops(tmp_path):
    folder, _ = trained(tmp_path)
    live = Experiment("x", experiment_path=tmp_path, resume=True, tracking=[])   # holds the lock
    before = snapshot(folder)
    ro = Experiment.open(folder)
    info = ro.get_runs_info()
    assert list(info.status) == ["completed"] and int(info.chunks_done[0]) == 2
    assert set(ro.get_results().metric) >= {"loss", "eval_loss"}
    assert len(ro.get_timeline()) == 2 and ro.time_split()["train"] > 0
    assert ro.table()["runs"]["1"]["status"] == "completed"
    assert repr(ro) == f"<Experiment 'x': 1 runs (1 completed) at {folder}>"   # as the log tells it
    from rapidfire_nb.errors import OpRefused

    for call in (lambda: ro.stop(1), lambda: ro.clone_modify(1, {}), lambda: ro.export(1, tmp_path / "e"),
                 lambda: ro.run_fit(grp(), tiny_create_model, *DATA)):
        with pytest.raises(OpRefused, match="read-only|resume=True"):
            call()
    ro.end()
    assert snapshot(folder) == before
    live.end()


def test_a_log_deleted_while_runs_train_is_written_again(tmp_path):
    exp = Experiment("d", experiment_path=tmp_path, tracking=[])
    path = exp.store.events_path
    deleted = []

    def listener(ev):
        if ev["type"] == "chunk_done" and not deleted:
            path.unlink()
            deleted.append(ev["seq"])

    exp.events.subscribe(listener)
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    assert deleted
    from rapidfire_nb.engine.events import read_events

    on_disk = read_events(path)
    assert [e["seq"] for e in on_disk] == list(range(1, len(on_disk) + 1))
    assert on_disk == exp.events.since(0)


def test_export_never_overwrites_silently(tmp_path):
    from rapidfire_nb.engine.export import ExportError

    exp = Experiment("e", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(model(sft(), formatting_func=to_chat), trainer_type="SFT"),
                tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.clone_modify(1, {"training_args.learning_rate": 1e-3})
    exp.wait()
    out = exp.export(1, tmp_path / "out")
    first = snapshot(out)
    a_file = tmp_path / "file.bin"
    a_file.write_bytes(b"keep")
    cases = [(tmp_path / "out", "not empty"), (a_file, "not a directory"),
             (exp.path, "the experiment folder itself"),
             (exp.path / "checkpoints" / "adapter", "which the experiment itself writes"),
             (exp.path / "events.jsonl", "which the experiment itself writes"),
             ("", "must be a directory name"), (tmp_path, "contains the experiment folder")]
    for target, message in cases:
        with pytest.raises(ExportError, match=message):
            exp.export(2, target)
    assert snapshot(out) == first and a_file.read_bytes() == b"keep"
    # overwrite=True never lets an export's file names replace anything but an earlier export
    home = tmp_path / "home"
    home.mkdir()
    (home / "README.md").write_text("mine")
    for target, message in [(home, "no earlier export"), (exp.path, "the experiment folder itself"),
                            (Path("/"), "contains the experiment folder")]:
        with pytest.raises(ExportError, match=message):
            exp.export(2, target, overwrite=True)
    assert (home / "README.md").read_text() == "mine" and len(list(home.iterdir())) == 1
    exp.export(2, tmp_path / "out", overwrite=True)
    assert snapshot(out) != first
    # a directory of its own inside the folder, as the tutorials export
    inside = exp.export(1, exp.path / "best-adapter")
    assert (inside / "adapter_model.safetensors").is_file()
    exp.end()
