"""What a notebook user sees around run_fit: a refused call leaves nothing behind and names the
call that frees what it refused on; a reopened experiment shows its runs before run_fit; and
RapidFire's folder layout (final checkpoints, tensorboard_logs) appears as runs complete.

Tiny offline model and data (demo_data); each experiment trains a few steps on 2 CPU cores.
"""

from __future__ import annotations

import json
import os

import pytest
from datasets import Dataset

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine import ExperimentLocked
from rapidfire_nb.errors import ConfigError
from rapidfire_nb.session import open_experiment


def group(lrs=(1e-3, 2e-2)):
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List(list(lrs)), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False))
    return RFGridSearch(cfg, trainer_type="SFT")


def test_a_refused_run_fit_leaves_the_folder_listing_and_exp_as_they_were(tmp_path, tiny_data):
    train, evald = tiny_data
    listing = sorted(os.listdir(tmp_path))
    exp = Experiment("wrong-cols", experiment_path=tmp_path, tracking=[])
    wrong = Dataset.from_dict({"question": ["a"] * 16, "answer": ["b"] * 16})
    with pytest.raises(ConfigError):
        exp.run_fit(group(), tiny_create_model, wrong, evald, num_chunks=2)
    # no folder, no lock, no renamed experiment: the cell can be fixed and run again
    assert sorted(os.listdir(tmp_path)) == listing
    assert exp.name == "wrong-cols" and exp.engine is None and open_experiment("wrong-cols") is None
    # the fixed cell, run again: the same name, and it trains
    again = Experiment("wrong-cols", experiment_path=tmp_path, tracking=[])
    again.run_fit(group((1e-3,)), tiny_create_model, train, evald, num_chunks=2, block=True)
    assert again.name == "wrong-cols" and set(again.get_runs_info().status) == {"completed"}
    again.end()


def test_a_locked_folder_names_the_call_that_frees_it(tmp_path):
    first = Experiment("same", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ExperimentLocked, match=r"experiment 'same' of this kernel: free it with "
                                               r"`%rapidfire end same` \(or \.end\(wait=False\)"):
        Experiment("same", experiment_path=tmp_path, resume=True, tracking=[])
    assert open_experiment("same") is first      # what `%rapidfire end same` closes
    first.end()
    Experiment("same", experiment_path=tmp_path, resume=True, tracking=[]).end()


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_data):
    """One experiment trained to the end, not yet ended: its folder as a RapidFire notebook reads
    it between training and end()."""
    train, evald = tiny_data
    root = tmp_path_factory.mktemp("layout")
    exp = Experiment("layout", experiment_path=root, tracking=[])
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, block=True)
    yield exp
    exp.end()


def test_a_completed_runs_final_checkpoint_is_there_before_end(finished):
    info = finished.get_runs_info()
    assert set(info.status) == {"completed"}
    for rid, steps in zip(info.run_id, info.completed_steps):
        final = finished.final_checkpoint_path(int(rid))
        state = json.loads((final / "trainer_state.json").read_text())
        assert state["global_step"] == steps == state["max_steps"]
        logged = finished.get_results()
        assert {e["step"] for e in state["log_history"]} == set(logged[logged.run_id == rid].step)



def test_end_adds_each_lora_runs_adapter_to_its_final_checkpoint(tmp_path, tiny_data):
    train, evald = tiny_data
    exp = Experiment("adapters", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group((1e-3,)), tiny_create_model, train, evald, num_chunks=2, block=True)
    final = exp.final_checkpoint_path(1)
    assert (final / "trainer_state.json").exists()
    exp.end()
    assert (final / "adapter_model.safetensors").exists() and (final / "adapter_config.json").exists()


def test_a_reopened_experiment_shows_its_runs_before_run_fit(tmp_path, tiny_data):
    train, evald = tiny_data
    exp = Experiment("reopen", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, block=False)
    exp.wait(timeout=0)     # let the engine start
    import time

    deadline = time.monotonic() + 300
    while exp.get_results().empty:    # one chunk's results, then the kernel "dies" (ends early)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    exp.end(wait=False)
    logged = Experiment.open(exp.path)
    expected = logged.get_runs_info()
    # its panel says it is read-only, so the view turns its buttons off
    assert logged.panel().snapshot["read_only"] is True and exp.panel().snapshot["read_only"] is False
    again = Experiment("reopen", experiment_path=tmp_path, resume=True, tracking=[])
    info = again.get_runs_info()
    assert list(info.run_id) == list(expected.run_id) == [1, 2]
    assert list(info.status) == list(expected.status)
    assert not again.get_results().empty
    unfinished = int((expected.status != "completed").sum())
    text = repr(again)
    assert "2 runs" in text
    if unfinished:
        assert "run_fit(...) with the same arguments continues the" in text, text
        assert f"{unfinished} unfinished" in text, text
    again.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, block=True)
    assert set(again.get_runs_info().status) == {"completed"}
    again.end()


def test_results_read_after_a_refusal_do_not_blind_the_fixed_run_fit(tmp_path, tiny_data):
    """Reading results (or showing the panel) of a new experiment whose run_fit was refused, then
    the fixed run_fit: the runs it trains are in its results and its final checkpoints."""
    train, evald = tiny_data
    exp = Experiment("read-between", experiment_path=tmp_path, tracking=[])
    wrong = Dataset.from_dict({"question": ["a"] * 16, "answer": ["b"] * 16})
    with pytest.raises(ConfigError):
        exp.run_fit(group(), tiny_create_model, wrong, evald, num_chunks=2)
    assert len(exp.get_results()) == 0 and len(exp.get_runs_info()) == 0
    exp.panel().close()
    exp.run_fit(group((1e-3,)), tiny_create_model, train, evald, num_chunks=2, block=True)
    assert list(exp.get_runs_info().status) == ["completed"]
    assert len(exp.get_results()) > 0
    panel = exp.panel()
    assert panel._statuses()[1] == {1: "completed"}
    panel.close()
    assert exp.final_checkpoint_path(1).exists()
    exp.end()


def test_a_folder_holding_only_a_log_is_an_experiment_a_new_one_moves_aside(tmp_path, tiny_data):
    train, evald = tiny_data
    old = tmp_path / "y"
    old.mkdir()
    log = b'{"seq": 1, "time": 1.0, "type": "experiment", "name": "y", "path": "y", "resumed": false}\n'
    (old / "events.jsonl").write_bytes(log)
    exp = Experiment("y", experiment_path=tmp_path, tracking=[])
    assert exp.name == "y_2"
    wrong = Dataset.from_dict({"question": ["a"] * 16, "answer": ["b"] * 16})
    with pytest.raises(ConfigError):
        exp.run_fit(group(), tiny_create_model, wrong, evald, num_chunks=2)
    assert sorted(os.listdir(tmp_path)) == ["y"] and os.listdir(old) == ["events.jsonl"]
    assert (old / "events.jsonl").read_bytes() == log


def test_a_long_name_moved_aside_stays_a_name_that_opens_and_resumes(tmp_path):
    name = "n" * 128
    Experiment(name, experiment_path=tmp_path, tracking=[]).end()
    (tmp_path / name / "events.jsonl").write_text(
        '{"seq": 1, "time": 1.0, "type": "experiment", "name": "n", "path": "n", "resumed": false}\n')
    second = Experiment(name, experiment_path=tmp_path, tracking=[])
    assert second.name == "n" * 126 + "_2" and second.path.name == second.name
    second.events.append("experiment", name=second.name, path=str(second.path), resumed=False)
    second.end()
    Experiment(second.name, experiment_path=tmp_path, resume=True, tracking=[]).end()
    assert Experiment.open(tmp_path / second.name).name == second.name


def test_a_refused_resume_leaves_no_lock_file_behind(tmp_path):
    folder = tmp_path / "d"
    Experiment("d", experiment_path=tmp_path, tracking=[]).end()
    (folder / ".lock").unlink(missing_ok=True)
    (folder / "runs.json").write_text('{"1": {"status": "completed"}}')   # runs but an empty log
    before = sorted(os.listdir(folder))
    with pytest.raises(Exception, match="events.jsonl is empty"):
        Experiment("d", experiment_path=tmp_path, resume=True, tracking=[])
    assert sorted(os.listdir(folder)) == before


def test_a_link_planted_after_experiment_and_before_run_fit_is_refused(tmp_path, tiny_data):
    from rapidfire_nb.engine import FolderLinkError

    train, evald = tiny_data
    outside = tmp_path / "outside"
    outside.mkdir()
    exp = Experiment("planted", experiment_path=tmp_path, tracking=[])
    (exp.path / "runs").symlink_to(outside)
    with pytest.raises(FolderLinkError):
        exp.run_fit(group((1e-3,)), tiny_create_model, train, evald, num_chunks=2, block=True)
    assert exp.engine is None and os.listdir(outside) == []
