"""Findings of the hostile review of main (notes/review_hostile.md), each reproduced on real
training: ops queued at end(wait=False), warm clones whose parent's weights are gone, a lost event
log on resume, checkpoints swapped between runs, and TRL string formatting functions."""

from __future__ import annotations

import time

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch
from rapidfire_nb.demo_data import tiny_create_model

from _dropin import customer_support_rows
from test_dropin_semantics import model, sft, to_chat

DATA = (customer_support_rows(16), customer_support_rows(4, seed=1))


def grp():
    return RFGridSearch(model(sft(List([1e-2, 1e-3])), formatting_func=to_chat), trainer_type="SFT")


def evs(exp, type_, **match):
    return [e for e in exp.events.since(0) if e["type"] == type_ and all(e.get(k) == v for k, v in match.items())]


# -- #3: end(wait=False) with ops still queued ---------------------------------------------------

def test_end_without_waiting_applies_the_ops_queued_before_it(tmp_path):
    exp = Experiment("E", experiment_path=tmp_path, tracking=[])
    fired, ids = [], []

    def listener(ev):
        # the writer thread, as run 1's first chunk is logged: ops are queued, then the engine is
        # held here until end(wait=False) has asked it to leave, so they are still queued then
        if ev["type"] != "chunk_done" or ev["run_id"] != 1 or fired:
            return
        try:
            ids.append(exp.clone_modify(1, {"training_args.learning_rate": 5e-3}))
            exp.stop(2)
            fired.append(True)
        except Exception as exc:  # noqa: BLE001 - surfaced below
            fired.append(exc)
        deadline = time.monotonic() + 60
        while not exp.engine.draining and time.monotonic() < deadline:
            time.sleep(0.01)

    exp.events.subscribe(listener)
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2, block=False)
    deadline = time.monotonic() + 120
    while not fired and time.monotonic() < deadline:
        time.sleep(0.01)
    exp.end(wait=False)
    assert fired == [True] and ids == [3], fired
    ops = [(o["op"], o["run_id"], o["accepted"]) for o in evs(exp, "op")]
    assert ops == [("clone", 1, True), ("stop", 2, True)], ops
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.index) == [1, 2, 3]
    assert info.loc[2, "status"] == "stopped" and info.loc[3, "status"] == "stopped"
    assert evs(exp, "run_status", run_id=2)[-1]["reason"] == "stopped by user"

    again = Experiment("E", experiment_path=tmp_path, tracking=[], resume=True)
    again.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    info = again.get_runs_info().set_index("run_id")
    assert info.loc[2, "status"] == "stopped"          # the user's stop outlives the restart
    assert info.loc[1, "status"] == "completed" and info.loc[3, "status"] == "completed"
    again.end()


# -- #2: a warm clone whose parent's weights are gone --------------------------------------------

def _own(weights):
    from test_dropin_semantics import own

    return own(weights)


def _equal(a, b):
    import torch

    a, b = _own(a), _own(b)
    return a.keys() == b.keys() and len(a) > 0 and all(torch.equal(a[k], b[k]) for k in a)


def test_warm_clone_of_a_run_whose_checkpoint_is_gone_is_refused(tmp_path):
    import shutil

    from rapidfire_nb.engine.controller import Op
    from rapidfire_nb.errors import OpRefused

    exp = Experiment("D", experiment_path=tmp_path, tracking=[])
    exp.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    exp.end()
    ckpt = tmp_path / "D" / "checkpoints" / "run_2" / "state.safetensors"
    shutil.rmtree(ckpt.parent)
    with pytest.warns(UserWarning, match=r"run 2 is completed but its checkpoint .*state.safetensors is missing"):
        again = Experiment("D", experiment_path=tmp_path, tracking=[], resume=True)
        again.run_fit(grp(), tiny_create_model, *DATA, num_chunks=2)
    with pytest.raises(OpRefused, match=r"run 2 .*no weights to warm-start from.*state.safetensors"):
        again.clone_modify(2, {"training_args.learning_rate": 0.0}, warm_start=True)
    with pytest.raises(OpRefused, match=r"run 2 \(completed\) has trained but its checkpoint"):
        again.export(2, tmp_path / "out")
    # the engine re-checks when it applies the op (the file may go between submit and apply)
    spec = again.validate_clone(1, {"training_args.learning_rate": 0.0}, warm_start=True)
    ckpt1 = tmp_path / "D" / "checkpoints" / "run_1" / "state.safetensors"
    shutil.rmtree(ckpt1.parent)
    again.engine.submit(Op("clone", 1, spec=spec, warm_start=True, changes={}, new_run_id=3))
    assert again.wait(timeout=120)
    op = evs(again, "op", op="clone")[-1]
    assert not op["accepted"] and "no weights to warm-start from" in op["reason"], op
    assert 3 not in set(again.get_runs_info().run_id)
    again.end()


def test_warm_clone_of_a_failed_warm_clone_starts_from_its_weights_before_and_after_resume(tmp_path):
    one = lambda: RFGridSearch(model(sft(1e-2), formatting_func=to_chat), trainer_type="SFT")  # noqa: E731
    exp = Experiment("W", experiment_path=tmp_path, tracking=[])
    exp.run_fit(one(), tiny_create_model, *DATA, num_chunks=2)
    parent = exp.engine.run_weights(1)
    # lr 1e30 diverges at its first step: the clone fails before its first checkpoint
    bad = exp.clone_modify(1, {"training_args.learning_rate": 1e30}, warm_start=True)
    assert exp.wait(timeout=120)
    assert exp.get_runs_info().set_index("run_id").loc[bad, "status"] == "failed"
    # a warm clone of it at lr 0 keeps the weights it starts from: run 1's final ones
    same = exp.clone_modify(bad, {"training_args.learning_rate": 0.0}, warm_start=True)
    assert exp.wait(timeout=120)
    assert exp.get_runs_info().set_index("run_id").loc[same, "status"] == "completed"
    assert _equal(exp.engine.run_weights(same), parent)
    exp.end()

    again = Experiment("W", experiment_path=tmp_path, tracking=[], resume=True)
    again.run_fit(one(), tiny_create_model, *DATA, num_chunks=2)
    later = again.clone_modify(bad, {"training_args.learning_rate": 0.0}, warm_start=True)
    assert again.wait(timeout=120)
    assert again.get_runs_info().set_index("run_id").loc[later, "status"] == "completed"
    assert _equal(again.engine.run_weights(later), parent)
    again.end()


# -- #6: resume with the event log emptied or deleted -------------------------------------------

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


# -- #5: checkpoints swapped or copied between runs ---------------------------------------------

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


# -- #4: TRL's string formatting_func and later rows ---------------------------------------------

def _text_then_dict(row):
    if row["instruction"] == FIRST_INSTRUCTION:
        return row["instruction"] + " " + row["response"]
    return to_chat(row)


def _text_raises_late(row):
    if row["instruction"] == DATA[0][9]["instruction"]:
        raise ValueError("boom on row 9")
    return row["instruction"] + " " + row["response"]


def _rows_then_none(row):
    return None if row["instruction"] == DATA[0][3]["instruction"] else to_chat(row)


FIRST_INSTRUCTION = DATA[0][0]["instruction"]


@pytest.mark.parametrize("fn, message", [
    (_text_then_dict, r"'_text_then_dict' returned a string for the first row of train_dataset .* "
                      r"but dict \{'prompt'.* for row 1; it must return a string for every row"),
    (_text_raises_late, r"'_text_raises_late' raised on train_dataset row 9: ValueError: boom on row 9"),
    (_rows_then_none, r"'_rows_then_none' returned NoneType None for train_dataset row 3"),
])
def test_a_formatting_func_that_goes_wrong_on_a_later_row_is_refused_before_training(tmp_path, fn, message):
    from rapidfire_nb.errors import ConfigError

    assert len({r["instruction"] for r in DATA[0]}) == len(DATA[0])   # rows are told apart
    exp = Experiment("T", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match=message):
        exp.run_fit(RFGridSearch(model(formatting_func=fn), trainer_type="SFT"), tiny_create_model,
                    *DATA, num_chunks=2)
    assert exp.engine is None and not (tmp_path / "T" / "checkpoints").exists()
    exp.end()


def test_a_string_formatting_func_for_every_row_still_trains(tmp_path):
    def text(row):
        return row["instruction"] + " " + row["response"]

    exp = Experiment("OK", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(model(formatting_func=text), trainer_type="SFT"), tiny_create_model,
                *DATA, num_chunks=2)
    assert exp.get_runs_info().status.tolist() == ["completed"]
    exp.end()


# -- smaller items: ambiguous clone changes ----------------------------------------------------

def test_clone_changes_that_set_a_knob_twice_or_output_dir_are_refused(tmp_path):
    from rapidfire_nb.errors import ConfigError

    exp = Experiment("C", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(model(formatting_func=to_chat), trainer_type="SFT"), tiny_create_model,
                *DATA, num_chunks=2)
    with pytest.raises(ConfigError, match=r"changes set 'training_args.learning_rate' twice "
                                          r"\('training_args.learning_rate' and \{'training_args': \{'learning_rate'"):
        exp.clone_modify(1, {"training_args.learning_rate": 1e-3, "training_args": {"learning_rate": 2e-3}})
    with pytest.raises(ConfigError, match=r"training_args.output_dir cannot be set"):
        exp.clone_modify(1, {"training_args": {"output_dir": "/etc"}})
    assert exp.get_runs_info().run_id.tolist() == [1] and evs(exp, "op") == []
    # one spelling of each knob is fine, nested and dotted mixed
    n = exp.clone_modify(1, {"training_args.learning_rate": 1e-3, "training_args": {"weight_decay": 0.1}})
    assert exp.wait(timeout=120)
    assert exp.get_runs_info().set_index("run_id").loc[n, "status"] == "completed"
    exp.end()
