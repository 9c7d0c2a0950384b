"""Recovery reads the event log (folded by engine/state.py), not runs.json: runs.json is a cache.

A crash between a clone's ``run_created`` reaching the log and the next runs.json write leaves a
runs.json without the clone; a runs.json restored from a backup, or written by hand, may say other
things than the log. Either way the resumed experiment is what the log says."""

from __future__ import annotations

import json

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (
    List,
    RFGridSearch,
    RFLoraConfig,
    RFModelConfig,
    RFSFTConfig,
)
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

RUN_FIT = {"num_chunks": 2, "seed": 4}


def group():
    lora = RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    return RFGridSearch(List([
        RFModelConfig(model_name="tiny", peft_config=lora,
                      training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4,
                                                num_train_epochs=1, bf16=False, max_length=64))
        for lr in (1e-3, 1e-2)]), trainer_type="SFT")


def test_resume_follows_the_log_when_runs_json_lost_a_clone_and_lies_about_a_run(tmp_path):
    train, evald = make_demo_datasets(16, 4, seed=2)
    exp = Experiment("cache", experiment_path=tmp_path, tracking=[])
    done = []

    def at_boundary(ev):
        if ev["type"] == "chunk_done" and ev["run_id"] == 1 and not done:
            done.append(exp.clone_modify(1, {"training_args.learning_rate": 5e-3}))
            exp.stop(2)

    exp.events.subscribe(at_boundary)
    exp.run_fit(group(), tiny_create_model, train, evald, **RUN_FIT)
    before = exp.get_runs_info().set_index("run_id")
    exp.end()
    assert done == [3] and before.loc[2, "status"] == "stopped" and before.loc[3, "status"] == "completed"

    runs_json = tmp_path / "cache" / "runs.json"
    cache = json.loads(runs_json.read_text())
    del cache["3"]                                   # as a crash before its runs.json write leaves it
    cache["2"].update(status="completed", chunks_done=2, completed_steps=cache["2"]["total_steps"])
    runs_json.write_text(json.dumps(cache))

    again = Experiment("cache", experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(group(), tiny_create_model, train, evald, **RUN_FIT)
    after = again.get_runs_info().set_index("run_id")
    again.end()
    assert list(after.index) == [1, 2, 3]
    assert after.loc[3, "parent_run_id"] == 1 and after.loc[3, "learning_rate"] == 5e-3
    assert after.loc[3, "status"] == "completed"
    assert after.loc[2, "status"] == "stopped"       # the log's word, not the cache's
    for col in ("chunks_done", "completed_steps", "samples_seen"):
        assert after.loc[2, col] == before.loc[2, col], col
    assert after.loc[1, "eval_loss"] == before.loc[1, "eval_loss"]   # read from the log too
    # runs.json is rewritten from the restored runs
    assert set(json.loads(runs_json.read_text())) == {"1", "2", "3"}
