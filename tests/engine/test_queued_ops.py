"""Ops are validated against the state the already-queued ops will produce.

Each op here is issued from an event listener at a chunk boundary, before the engine has applied
the ops queued just before it: exactly "two calls in one notebook cell while a chunk trains".
Judged against the engine's current state instead, each would be refused ("unknown run", "run 1
is running") or, for the warm clone of a run being deleted, accepted with an id that never comes
to exist.
"""

from __future__ import annotations

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import OpRefused

from helpers import LR_A, LR_B, events_of, on_chunk_done, ops_group


def _train(exp, tiny_data, lrs=(LR_A,)):
    train, evald = tiny_data
    exp.run_fit(ops_group(*lrs), tiny_create_model, train.select(range(32)), evald, num_chunks=2, seed=5)


def test_a_clone_id_is_usable_at_once(tiny_data, tmp_path):
    exp = Experiment("clone-stop", experiment_path=tmp_path)
    ids = []

    def act():
        nid = exp.clone_modify(1, {"training_args.learning_rate": 1e-3})
        exp.stop(nid)                       # before the clone exists in the engine
        ids.append(nid)
        other = exp.clone_modify(nid, {"training_args.learning_rate": 2e-3})   # clone of a clone
        exp.delete(other)
        ids.append(other)

    fired = on_chunk_done(exp, 1, 0, act)
    _train(exp, tiny_data)
    assert fired == [True] and ids == [2, 3], fired
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[2, "status"] == "stopped" and info.loc[2, "completed_steps"] == 0
    assert info.loc[3, "status"] == "deleted"
    assert all(op["accepted"] for op in events_of(exp, "op")), events_of(exp, "op")
    assert events_of(exp, "chunk_done", run_id=2) == [] and events_of(exp, "chunk_done", run_id=3) == []
    # and the stopped clone resumes and trains like any run
    exp.resume(2)
    assert exp.wait(timeout=120)
    assert exp.get_runs_info().set_index("run_id").loc[2, "status"] == "completed"
    exp.end()


def test_stop_then_resume_in_one_go_is_accepted(tiny_data, tmp_path):
    exp = Experiment("stop-resume", experiment_path=tmp_path)
    fired = on_chunk_done(exp, 1, 0, lambda: (exp.stop(2), exp.resume(2)))
    _train(exp, tiny_data, (LR_A, LR_B))
    assert fired == [True], fired
    ops = [(op["op"], op["run_id"], op["accepted"]) for op in events_of(exp, "op")]
    assert ops == [("stop", 2, True), ("resume", 2, True)], ops
    assert set(exp.get_runs_info().status) == {"completed"}
    exp.end()


def test_ops_on_a_run_whose_delete_is_queued_are_refused(tiny_data, tmp_path):
    exp = Experiment("queued-delete", experiment_path=tmp_path)
    refused = []

    def act():
        exp.delete(1)
        for call in (lambda: exp.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start=True),
                     lambda: exp.clone_modify(1, {"training_args.learning_rate": 1e-3}),
                     lambda: exp.stop(1), lambda: exp.delete(1)):
            with pytest.raises(OpRefused) as err:
                call()
            refused.append(str(err.value))

    fired = on_chunk_done(exp, 1, 0, act)
    _train(exp, tiny_data)
    assert fired == [True], fired
    assert len(refused) == 4 and all("delet" in r for r in refused), refused
    assert sorted(exp.engine.snapshot()) == [1] and [op["op"] for op in events_of(exp, "op")] == ["delete"]
    exp.end()


def test_warm_clone_of_a_queued_clone_is_refused_with_the_reason(tiny_data, tmp_path):
    exp = Experiment("warm-of-queued", experiment_path=tmp_path)
    refused = []

    def act():
        nid = exp.clone_modify(1, {"training_args.learning_rate": 1e-3})
        with pytest.raises(OpRefused, match="has not been created yet") as err:
            exp.clone_modify(nid, {"training_args.learning_rate": 2e-3}, warm_start=True)
        refused.append(err.value)

    fired = on_chunk_done(exp, 1, 0, act)
    _train(exp, tiny_data)
    assert fired == [True] and len(refused) == 1, fired
    exp.end()
