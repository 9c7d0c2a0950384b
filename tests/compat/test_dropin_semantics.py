"""RapidFire AI semantics that its notebooks rely on: formatting_func as a row mapper (TRL's string
form too) and its errors, also on rows after the first; warm start from any run (finished and
failed ones too) with its own schedule, refused when the parent's weights are gone; end() that
never leaves a run half-done or shown running and applies the ops queued before it; clone changes
that name a knob twice; and logging_steps / eval_steps inside chunks."""

from __future__ import annotations

import time

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFGRPOConfig, RFLoraConfig
from rapidfire_nb.demo_data import make_grpo_dataset, tiny_create_model
from rapidfire_nb.errors import ConfigError

from helpers import customer_support_rows, model, own, sft, to_chat
from helpers import events_of as evs
from helpers import two_chat_runs as grp


def series(exp, rid, metric, split="train"):
    df = exp.get_results()
    sel = df[(df.run_id == rid) & (df.metric == metric) & (df.split == split)].sort_values("step")
    return list(zip(sel.step.astype(int), sel.value))


DATA = (customer_support_rows(16), customer_support_rows(4, seed=1))


# -- formatting_func ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn,trainer,needle", [
    (lambda row: [row["instruction"]], "SFT", r"returned list for the first row of train_dataset; it must return a dict"),
    (lambda row: {}, "SFT", r"returned an empty dict"),
    (lambda row: {"question": row["instruction"]}, "SFT",
     # the original columns stay beside the returned one, as RapidFire's map keeps them
     r"train_dataset has columns \[.*'question'.*\]; SFT needs 'text', 'messages'.*after formatting_func"),
    (lambda row: row["no_such_column"], "SFT", r"raised on the first row of train_dataset: KeyError"),
    (lambda row: row["instruction"], "GRPO", r"returned a string .* GRPO needs a dict of columns"),
], ids=["list", "empty-dict", "missing-columns", "raises", "string-for-grpo"])
def test_bad_formatting_func_is_refused_before_training(fn, trainer, needle, tmp_path):
    if trainer == "SFT":
        cfg = model(formatting_func=fn)
    else:
        cfg = model(RFGRPOConfig(num_generations=2, per_device_train_batch_size=2, max_completion_length=4),
                    formatting_func=fn, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)])
    exp = Experiment("bad-fmt", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match=needle):
        exp.run_fit(RFGridSearch(cfg, trainer_type=trainer), tiny_create_model, *DATA, num_chunks=2)
    assert exp.engine is None and not any(ev["type"] == "run_created" for ev in exp.events.since(0))
    exp.end()


def test_row_mapper_and_trl_string_form_both_train(tmp_path):
    """A dict-returning mapper (RapidFire) and a string-returning one (TRL's SFTTrainer form),
    told apart by the first row; the mapped data is shared by the runs that use one function."""
    calls = {"rows": 0}

    def as_rows(row):
        calls["rows"] += 1
        return to_chat(row)

    def as_text(row):
        return f"Q: {row['instruction']}\nA: {row['response']}"

    cfgs = List([model(sft(lr), formatting_func=as_rows) for lr in (1e-2, 1e-3)]
                + [model(formatting_func=as_text)])
    exp = Experiment("fmt-forms", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfgs, trainer_type="SFT"), tiny_create_model, *DATA, num_chunks=2, seed=3)
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    # two runs, one mapping: each row once, the first-row probe's output serving as row 0's
    assert calls["rows"] == len(DATA[0]) + len(DATA[1]), calls
    assert series(exp, 3, "eval_loss", "eval")     # the string form trained and evaluated too
    exp.end()


def test_grpo_prompts_and_extra_columns_from_formatting_func(tmp_path):
    rows = make_grpo_dataset(8).rename_column("prompt", "question")
    seen = []

    def fmt(row):
        return {"prompt": [{"role": "user", "content": row["question"]}], "solution": row["answer"]}

    def reward(prompts, completions, solution, answer, **kw):
        seen.append((list(solution), list(answer)))
        return [0.0] * len(completions)

    cfg = model(RFGRPOConfig(learning_rate=1e-3, num_generations=2, per_device_train_batch_size=4,
                             max_completion_length=4, max_steps=2), formatting_func=fmt, reward_funcs=[reward])
    exp = Experiment("grpo-fmt", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, rows, None, num_chunks=1)
    assert exp.get_runs_info().status.tolist() == ["completed"]
    # the mapper's new column and the source's own columns both reach the reward function
    assert seen and all(s == a for s, a in seen)
    exp.end()


# -- warm start ------------------------------------------------------------------------------------

def test_warm_clone_of_a_finished_run_trains_its_own_schedule_from_the_final_weights(tmp_path):
    train, evald = DATA
    exp = Experiment("warm-finished", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(model(formatting_func=to_chat), trainer_type="SFT"), tiny_create_model, train,
                evald, num_chunks=2, seed=3)
    parent_final = exp.engine.run_weights(1)
    # learning rate 0: a warm clone must end exactly where it started, at the parent's weights
    frozen = exp.clone_modify(1, {"training_args.learning_rate": 0.0}, warm_start=True)
    moving = exp.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start=True)
    cold = exp.clone_modify(1, {"training_args.learning_rate": 1e-3})
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    assert set(info.status) == {"completed"}, info.error.tolist()
    for a, b in zip(own(exp.engine.run_weights(frozen)).values(), own(parent_final).values()):
        assert torch.equal(a, b)
    # its own full schedule: as many steps as the parent (same config), a fresh LR schedule
    for rid in (frozen, moving, cold):
        assert info.loc[rid, "completed_steps"] - exp.engine.snapshot()[rid].step_offset == 4
    lrs = series(exp, moving, "learning_rate")
    assert [v for _, v in lrs] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])
    moved = own(exp.engine.run_weights(moving))
    assert any(not torch.equal(a, b) for a, b in zip(moved.values(), own(parent_final).values()))
    exp.end()


# -- end() -------------------------------------------------------------------------------------

def test_end_waits_for_the_runs_and_shows_progress(tmp_path, capsys):
    exp = Experiment("end-wait", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(model(sft(List([1e-2, 1e-3])), formatting_func=to_chat), trainer_type="SFT"),
                tiny_create_model, *DATA, num_chunks=2, block=False)
    exp.end()
    statuses = exp.get_runs_info().status.tolist()
    assert statuses == ["completed", "completed"]
    out = capsys.readouterr().out
    assert "end(): waiting for" in out and "every run finished (8/8 steps)" in out


def test_end_without_waiting_stops_runs_resumably(tmp_path):
    group = RFGridSearch(model(sft(List([1e-2, 1e-3]), num_train_epochs=3), formatting_func=to_chat),
                         trainer_type="SFT")
    exp = Experiment("end-stop", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group, tiny_create_model, *DATA, num_chunks=2, block=False)
    exp.end(wait=False)
    info = exp.get_runs_info()
    assert not set(info.status) & {"running", "pending"}, info.status.tolist()
    assert "stopped" in set(info.status)
    statuses = [ev["status"] for ev in exp.events.since(0) if ev["type"] == "run_status"]
    assert statuses[-1] in ("stopped", "completed")
    # resume=True and the same run_fit: the runs end() stopped go on and finish
    again = Experiment("end-stop", experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(group, tiny_create_model, *DATA, num_chunks=2)
    assert set(again.get_runs_info().status) == {"completed"}
    again.end()


# -- logging_steps and eval_steps inside chunks ------------------------------------------------

def test_logging_and_eval_steps_inside_chunks_leave_training_bit_identical(tmp_path):
    # lora_dropout: training draws from the run's RNG, which evaluations must leave alone; the
    # logging knobs do not seed the adapter init, so both runs start from the same weights
    lora = RFLoraConfig(r=4, lora_alpha=8, lora_dropout=0.2, target_modules=["q_proj", "v_proj"])
    plain = model(sft(num_train_epochs=2), formatting_func=to_chat, peft_config=lora)
    knobs = model(sft(num_train_epochs=2, logging_steps=3, eval_strategy="steps", eval_steps=1),
                  formatting_func=to_chat, peft_config=lora)
    out = {}
    for name, cfg in (("plain", plain), ("knobs", knobs)):
        exp = Experiment(name, experiment_path=tmp_path, tracking=[])
        exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, *DATA, num_chunks=2, seed=3)
        out[name] = exp
    a, b = out["plain"], out["knobs"]
    for x, y in zip(own(a.engine.run_weights(1)).values(), own(b.engine.run_weights(1)).values()):
        assert torch.equal(x, y)                       # evaluating mid-chunk changes nothing
    # 8 steps in chunks of 2: a point every 3 steps, plus what is left at each chunk end
    assert [s for s, _ in series(b, 1, "loss")] == [2, 3, 4, 6, 8]
    every = dict(series(a, 1, "loss"))
    assert dict(series(b, 1, "loss"))[3] == pytest.approx(every[3])                  # window of one
    assert dict(series(b, 1, "loss"))[6] == pytest.approx((every[5] + every[6]) / 2)  # mean of two
    assert [s for s, _ in series(b, 1, "eval_loss", "eval")] == list(range(1, 9))     # every step
    assert [s for s, _ in series(a, 1, "eval_loss", "eval")] == [2, 4, 6, 8]          # chunk ends
    a.end()
    b.end()


# -- end(wait=False) with ops still queued ----------------------------------------------------

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


# -- a warm clone whose parent's weights are gone ---------------------------------------------

def _equal(a, b):
    import torch

    a, b = own(a), own(b)
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


# -- TRL's string formatting_func, and rows it fails on after the first -----------------------

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


# -- clone changes that are ambiguous ---------------------------------------------------------

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
