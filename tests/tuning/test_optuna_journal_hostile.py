"""RFOptuna's journal (``optuna/journal.log``) read from a folder that may have been edited: it
never chooses a model that ``run_fit``'s own runs do not load, a refused resume leaves it (and
every other byte) as it was, and Optuna's file lock leaves no symbolic link in the folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, Range, RFLoraConfig, RFModelConfig, RFOptuna, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import RapidFireError

from helpers import customer_support_rows, to_chat


pytest.importorskip("optuna")

DATA = (customer_support_rows(16), customer_support_rows(4, seed=1))
NAMES = ["tiny-a", "tiny-b", "tiny-c"]


def group():
    cfg = RFModelConfig(model_name=List(NAMES), model_kwargs={"hidden_size": 32},
                        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                        formatting_func=to_chat,
                        training_args=RFSFTConfig(learning_rate=Range(1e-4, 1e-2, log=True),
                                                  per_device_train_batch_size=4, num_train_epochs=1,
                                                  max_length=64))
    return RFOptuna(cfg, trainer_type="SFT", n_initial=1, budget=2, pruner=None, seed=7)


class Recorder:
    def __init__(self):
        self.names = []

    def __call__(self, model_config):
        self.names.append(model_config["model_name"])
        return tiny_create_model(model_config)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    root = tmp_path_factory.mktemp("optuna-journal")
    exp = Experiment("o", experiment_path=root, tracking=[])
    exp.run_fit(group(), tiny_create_model, *DATA, num_chunks=2, block=True)
    info = exp.get_runs_info().set_index("run_id")
    assert sorted(info.index) == [1, 2] and set(info.status) == {"completed"}
    exp.end()
    return root / "o"


def copy_of(folder: Path, tmp_path: Path) -> Path:
    import shutil

    dest = tmp_path / "o"
    shutil.copytree(folder, dest)
    return dest


def drop_run_config(folder: Path, rid: int) -> None:
    """The refill's run_created with an empty config: no fingerprint to compare with."""
    path = folder / "events.jsonl"
    evs = [json.loads(line) for line in path.read_text().splitlines()]
    for ev in evs:
        if ev["type"] == "run_created" and ev["run_id"] == rid:
            ev["config"] = {}
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


@pytest.mark.parametrize("param", ["model_name", "training_args.learning_rate"])
def test_a_journal_value_outside_the_search_space_is_refused_naming_it(finished, tmp_path, param):
    """The refill's value replaced by one run_fit's group does not list (a model of the
    journal's own choosing), or moved outside its Range (Optuna's FixedTrial only warns)."""
    folder = copy_of(finished, tmp_path)
    journal = folder / "optuna" / "journal.log"
    ops = [json.loads(line) for line in journal.read_text().splitlines()]
    for op in ops:
        if op.get("param_name") == param and op["trial_id"] == 1:
            dist = json.loads(op["distribution"])
            if param == "model_name":
                dist["attributes"]["choices"] = ["/tmp/elsewhere/evil"]
                op["param_value_internal"] = 0
            else:
                dist["attributes"]["high"] = 50.0
                op["param_value_internal"] = 5.0
            op["distribution"] = json.dumps(dist)
    journal.write_text("".join(json.dumps(op) + "\n" for op in ops))
    drop_run_config(folder, 2)     # no logged config to compare the refill with
    before = snapshot(folder)
    rec = Recorder()
    exp = Experiment("o", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(RapidFireError) as err:
        exp.run_fit(group(), rec, *DATA, num_chunks=2, block=True)
    assert "journal.log" in str(err.value) and param in str(err.value)
    assert "/tmp/elsewhere/evil" not in rec.names
    exp.end()
    assert snapshot(folder) == before


def craft_counter(folder: Path) -> None:
    """A chunk count beyond any plan, with no checkpoint to correct it: the plan refuses it."""
    (folder / "checkpoints" / "run_1" / "state.safetensors").unlink()
    path = folder / "events.jsonl"
    evs = [json.loads(line) for line in path.read_text().splitlines()]
    for ev in evs:
        if ev["type"] == "chunk_done":
            ev["chunks_done"] = 10 ** 12
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))


def test_a_refused_optuna_resume_leaves_the_journal_byte_identical(finished, tmp_path):
    folder = copy_of(finished, tmp_path)
    before = snapshot(folder)
    exp = Experiment("o", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(RapidFireError):
        # another num_chunks: refused before the tuner exists
        exp.run_fit(group(), tiny_create_model, *DATA, num_chunks=4, block=True)
    exp.end()
    assert snapshot(folder) == before
    # a crafted counter: refused by the plan, after the tuner was built
    craft_counter(folder)
    before = snapshot(folder)
    exp = Experiment("o", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(RapidFireError, match="chunks_done"):
        exp.run_fit(group(), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    assert snapshot(folder) == before


def test_a_folder_without_a_journal_gets_none_from_a_refused_resume(finished, tmp_path):
    folder = copy_of(finished, tmp_path)
    import shutil

    shutil.rmtree(folder / "optuna")
    craft_counter(folder)
    before = snapshot(folder)
    exp = Experiment("o", experiment_path=tmp_path, resume=True, tracking=[])
    with pytest.raises(RapidFireError):
        exp.run_fit(group(), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    assert snapshot(folder) == before and not (folder / "optuna").exists()


def test_optunas_file_lock_never_puts_a_link_in_the_folder(tmp_path, monkeypatch):
    made = []
    real = os.symlink

    def spy(src, dst, *a, **kw):
        made.append(str(dst))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "symlink", spy)
    exp = Experiment("o", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group(), tiny_create_model, *DATA, num_chunks=2, block=True)
    exp.end()
    # the experiment folder holds no link (RapidFire's tensorboard_logs/<name>, beside it in
    # the experiments folder, is one by design)
    assert not [m for m in made if m.startswith(str(tmp_path / "o") + os.sep)]
    assert made == [str(tmp_path / "tensorboard_logs" / "o")]
