"""RapidFire AI semantics that its notebooks rely on (issue 14): formatting_func as a row mapper
and its errors, warm start from any run (finished ones too) with its own schedule, end() that
never leaves a run half-done or shown running, and logging_steps / eval_steps inside chunks."""

from __future__ import annotations

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (List, RFGridSearch, RFGRPOConfig, RFLoraConfig, RFModelConfig,
                                 RFSFTConfig)
from rapidfire_nb.demo_data import make_grpo_dataset, tiny_create_model
from rapidfire_nb.errors import ConfigError

from _dropin import customer_support_rows

LORA = RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


def sft(lr=1e-2, **kw):
    base = dict(learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1, max_length=64,
                lr_scheduler_type="linear")
    base.update(kw)
    return RFSFTConfig(**base)


def to_chat(row):
    return {"prompt": [{"role": "user", "content": row["instruction"]}],
            "completion": [{"role": "assistant", "content": row["response"]}]}


def model(training_args=None, **kw):
    kw.setdefault("peft_config", LORA)
    return RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                         training_args=training_args or sft(), **kw)


def own(weights):
    return {".".join("X" if i > 0 and p[i - 1] in ("lora_A", "lora_B") else x for i, x in enumerate(p)): v
            for k, v in weights.items() for p in [k.split(".")]}


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
     r"train_dataset has columns \['question'\]; SFT needs 'text', 'messages'.*after formatting_func"),
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
    # two runs, one mapping: each row once, plus one first-row probe per dataset
    assert calls["rows"] == len(DATA[0]) + len(DATA[1]) + 2, calls
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
