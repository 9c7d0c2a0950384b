"""RapidFire AI 0.16.2's calls that its notebooks make, after changing only the import: the
constructor's positional ``mode`` and its ``num_cpus``/``num_gpus``, ``cancel_current``,
``save_strategy="chunk"``, transformers 4's ``fsdp_transformer_layer_cls_to_wrap``, the notebook
controls of ``rapidfireai.utils.notebook_ui``, and RapidFire's TensorBoard folder. Real engine
runs on the tiny in-process model."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from helpers import LR_A, LR_B, on_chunk_done, ops_group
from rapidfire_nb import Experiment
from rapidfire_nb.automl import (RapidFireConfigWarning, RFGridSearch, RFLoraConfig,
                                 RFModelConfig, RFSFTConfig)
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import ConfigError


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- the constructor -----------------------------------------------------------------------------

def test_the_second_positional_argument_is_the_mode_as_in_0162(here):
    exp = Experiment("name", "fit")
    assert Path(exp.path).resolve() == (here / "rapidfire_experiments" / "name").resolve()
    assert not (here / "fit").exists()
    exp.end()


def test_num_cpus_and_num_gpus_are_accepted_and_mean_the_devices_to_use(here):
    exp = Experiment("name", mode="fit", num_cpus=2, num_gpus=1)
    assert exp.num_workers == 0 and exp.num_cpus == 2       # one device: this kernel's engine
    exp.end()
    exp = Experiment("positional", "fit", "elsewhere", 2, 0)   # 0.16.2's positional order
    assert Path(exp.path).resolve() == (here / "elsewhere" / "positional").resolve()
    assert exp.num_workers == 0
    exp.end()


def test_num_gpus_above_one_without_two_gpus_trains_here_and_says_why(here):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has several GPUs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp = Experiment("two", num_gpus=2)
    assert exp.num_workers == 0
    assert any("num_gpus=2" in str(w.message) and "in this kernel" in str(w.message)
               for w in caught if issubclass(w.category, RapidFireConfigWarning))
    exp.end()


def test_a_path_as_second_positional_argument_is_still_the_parent_folder(here):
    exp = Experiment("p", Path("mine"))
    assert Path(exp.path).resolve() == (here / "mine" / "p").resolve()
    exp.end()
    exp = Experiment("s", "sub/dir")
    assert Path(exp.path).resolve() == (here / "sub" / "dir" / "s").resolve()
    exp.end()


@pytest.mark.parametrize("call, words", [
    (lambda: Experiment("x", "results"), "second positional argument is the mode"),
    (lambda: Experiment("x", "evals"), "evals/RAG mode has no equivalent"),
    (lambda: Experiment("x", num_gpus=-1), "num_gpus=-1"),
    (lambda: Experiment("x", num_gpus=1.5), "num_gpus=1.5"),
    (lambda: Experiment("x", num_cpus=0), "num_cpus=0"),
    (lambda: Experiment("x", num_gpus=1, num_workers=2), "give one of them"),
])
def test_bad_constructor_arguments_are_refused_by_name_and_make_no_folder(here, call, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()
    assert not (here / "rapidfire_experiments" / "x").exists()
    assert not (here / "results").exists()


def test_mode_given_twice_is_a_type_error(here):
    with pytest.raises(TypeError, match="mode given twice"):
        Experiment("x", "fit", mode="fit")


# -- RapidFire's TensorBoard folder ----------------------------------------------------------------

def test_every_experiment_has_rapidfires_tensorboard_folder_with_its_event_files(here, tiny_data, monkeypatch):
    monkeypatch.setenv("RF_TENSORBOARD_ENABLED", "true")
    train, evald = tiny_data
    exp = Experiment("tb")
    folder = here / "rapidfire_experiments" / "tensorboard_logs" / "tb"
    assert folder.is_dir()                          # from the moment it exists, no RfDb call
    exp.run_fit(ops_group(LR_A), tiny_create_model, train.select(range(16)), evald.select(range(4)),
                num_chunks=2, block=True)
    assert list(folder.rglob("events.out.tfevents.*"))
    exp.end()
    again = Experiment("tb")                        # a second one is tb_2, with its own folder
    assert (here / "rapidfire_experiments" / "tensorboard_logs" / again.name).is_dir()
    again.end()


def test_a_refused_first_run_fit_takes_the_tensorboard_folder_back_with_the_experiment_folder(here, tiny_data):
    train, evald = tiny_data
    exp = Experiment("refused")
    with pytest.raises(ConfigError):
        exp.run_fit(ops_group(LR_A), tiny_create_model, train, evald, num_chunks=0)
    assert not (here / "rapidfire_experiments" / "refused").exists()
    assert not os.path.lexists(here / "rapidfire_experiments" / "tensorboard_logs" / "refused")


# -- cancel_current ----------------------------------------------------------------------------------

def test_cancel_current_stops_every_run_of_the_fit_at_its_next_boundary(here, tiny_data):
    train, evald = tiny_data
    exp = Experiment("cancel")
    fired = on_chunk_done(exp, 1, 0, exp.cancel_current)
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=4, seed=5, block=True)
    assert fired == [True]
    info = exp.get_runs_info()
    assert list(info.status) == ["stopped", "stopped"]
    assert (info.completed_steps < info.total_steps).all()
    assert (info.chunks_done <= 2).all()             # the chunk in flight at most, then stopped
    exp.resume(1)                                     # still open, and resumable
    assert exp.wait(timeout=300)
    assert exp.get_runs_info().status.tolist() == ["completed", "stopped"]
    exp.end()


def test_cancel_current_ends_an_optuna_search_without_new_trials(here, tiny_data):
    pytest.importorskip("optuna")
    from rapidfire_nb.automl import List, Range, RFOptuna

    train, evald = tiny_data
    cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                        peft_config=RFLoraConfig(r=List([4, 8]), target_modules=["q_proj", "v_proj"]),
                        training_args=RFSFTConfig(learning_rate=Range(1e-4, 5e-2, log=True),
                                                  per_device_train_batch_size=8, max_length=64))
    group = RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=6, seed=3)
    exp = Experiment("cancel-optuna")
    fired = on_chunk_done(exp, 1, 0, exp.cancel_current)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, seed=3, block=True)
    assert fired == [True]
    info = exp.get_runs_info()
    assert list(info.run_id) == [1, 2] and set(info.status) == {"stopped"}, info
    # resuming one run trains that run alone: the search does not refill the slot of the
    # other (stopped) trial with a new one, as it would for a run stopped by hand
    exp.resume(1)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info()
    assert list(info.run_id) == [1, 2] and list(info.status) == ["completed", "stopped"], info
    exp.end()


def test_cancel_current_with_nothing_training_says_so_and_changes_nothing(here, capsys):
    exp = Experiment("idle")
    assert exp.cancel_current() == []
    assert "nothing to cancel" in capsys.readouterr().out
    exp.end()


# -- knobs of RapidFire 0.16.x and transformers 4 ---------------------------------------------------

def test_save_strategy_chunk_means_the_engines_own_chunk_checkpoints(here, tiny_data):
    train, evald = tiny_data
    for value in ("chunk", "shard"):                 # 0.16.1's name, 0.16.2's
        cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
                            training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=8,
                                                      max_steps=2, save_strategy=value))
        exp = Experiment(f"save-{value}")
        exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train.select(range(16)),
                    evald.select(range(4)), num_chunks=2, block=True)
        assert exp.get_runs_info().status.tolist() == ["completed"]
        assert list((Path(exp.path) / "checkpoints").rglob("*.safetensors"))
        exp.end()
    with pytest.raises(ConfigError, match="save_strategy"):
        RFSFTConfig(save_strategy="chunks")


def test_fsdp_transformer_layer_cls_to_wrap_becomes_the_fsdp_config_entry():
    from rapidfire_nb.engine.sharding import fsdp2_settings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = RFSFTConfig(fsdp="full_shard auto_wrap", fsdp_transformer_layer_cls_to_wrap="Qwen3DecoderLayer",
                          per_device_train_batch_size=2)
    assert any("fsdp_transformer_layer_cls_to_wrap" in str(w.message) for w in caught
               if issubclass(w.category, RapidFireConfigWarning))
    settings, _ = fsdp2_settings(cfg._knobs)
    assert settings["wrap"] == ["Qwen3DecoderLayer"] and settings["auto_wrap"]
    # beside a user's fsdp_config, whichever comes first, the class joins its list
    for kwargs in ({"fsdp_config": {"transformer_layer_cls_to_wrap": ["A"]},
                    "fsdp_transformer_layer_cls_to_wrap": "B"},
                   {"fsdp_transformer_layer_cls_to_wrap": "B",
                    "fsdp_config": {"transformer_layer_cls_to_wrap": ["A"]}}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            both = RFSFTConfig(fsdp="full_shard", **kwargs)
        assert fsdp2_settings(both._knobs)[0]["wrap"] == ["A", "B"]


# -- rapidfireai.utils.notebook_ui ---------------------------------------------------------------------

def test_notebook_ui_and_end_button_import_from_rapidfires_path(here, tiny_data):
    from rapidfire_nb.compat.utils.notebook_ui import NotebookUI, end_experiment_button

    train, evald = tiny_data
    exp = Experiment("ui", mode="fit")
    panel = NotebookUI(mode="fit", dispatcher_url="http://127.0.0.1:8851").display()   # before run_fit
    assert panel.snapshot["experiment"] == exp.name
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=4, seed=5, block=False)
    button = end_experiment_button(exp)               # returns at once, the runs still train
    assert not exp.ended and exp.engine.busy(timeout=1)
    button.click()                                    # ends it: unfinished runs stopped, resumable
    assert button.wait(timeout=300) and exp.ended and button.error is None
    assert set(exp.get_runs_info().status) <= {"stopped", "completed"}
    assert button.button.disabled and button.button.description == "Ended"
    panel._refresh_snapshot()
    assert set(panel.snapshot["runs"]) == {"1", "2"}  # the panel shown before run_fit saw the runs
    with pytest.raises(ValueError, match="mode"):
        NotebookUI(mode="train")


def test_the_end_button_of_an_ended_experiment_says_so_and_without_one_is_refused(here):
    from rapidfire_nb.compat.utils.notebook_ui import end_experiment_button
    from rapidfire_nb.errors import RapidFireError

    exp = Experiment("ended", mode="fit")
    exp.end()
    button = end_experiment_button(exp)
    assert button.button.disabled and "has ended" in button.label.value
    button.click()                                    # nothing more to do, nothing raised
    assert button.wait(timeout=5) and button.error is None
    with pytest.raises(RapidFireError, match="no experiment is open"):
        end_experiment_button()
