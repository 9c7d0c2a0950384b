"""DPO and GRPO runs with the real TRL trainers on a tiny model (CPU): grids, isolation, errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (List, RFGridSearch, RFLoraConfig,
                                 RFModelConfig)
from rapidfire_nb.demo_data import make_dpo_dataset, make_grpo_dataset, tiny_create_model
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.adapters import trainer_class
from rapidfire_nb.engine.adapters.grpo import GenerationPlan
from rapidfire_nb.errors import ConfigError

from helpers import PREFERENCE_LORA, dpo_args, grpo_args, short_answer

TIMING_METRICS = {"step_time"}


def exact_match(pair):
    predictions, references = pair
    hits = [p.strip() == str(r).strip() for p, r in zip(predictions, references)]
    return {"exact_match": sum(hits) / len(hits), "n": len(hits)}


def renamed(weights):
    """Adapter keys without the run's adapter name, so runs can be compared."""
    out = {}
    for k, v in weights.items():
        parts = k.split(".")
        out[".".join("run_X" if i > 0 and parts[i - 1] in ("lora_A", "lora_B") else p
                     for i, p in enumerate(parts))] = v
    return out


def logged(exp, run_id, split="train"):
    """Every logged metric of a run as {(step, metric): value}, timings left out."""
    df = exp.get_results()
    df = df[(df.run_id == run_id) & (df.split == split) & ~df.metric.isin(TIMING_METRICS)]
    return {(int(r.step), r.metric): r.value for r in df.itertuples()}


def assert_same_run(exp_a, id_a, exp_b, id_b, common_eval_only=False):
    wa, wb = renamed(exp_a.engine.run_weights(id_a)), renamed(exp_b.engine.run_weights(id_b))
    assert wa.keys() == wb.keys() and len(wa) > 0
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    la, lb = logged(exp_a, id_a), logged(exp_b, id_b)
    assert any(m == "loss" for _, m in la)
    assert la == lb
    ea, eb = logged(exp_a, id_a, "eval"), logged(exp_b, id_b, "eval")
    if common_eval_only:  # different chunkings evaluate at different steps; compare the shared ones
        ea = {k: v for k, v in ea.items() if k in eb}
        eb = {k: v for k, v in eb.items() if k in ea}
    assert ea == eb


def assert_eval_after_every_chunk(exp, run_ids, metrics, num_chunks):
    res = exp.get_results()
    ev = res[res.split == "eval"]
    for rid in run_ids:
        for m in metrics:
            chunks = sorted(ev[(ev.run_id == rid) & (ev.metric == m)].chunk.tolist())
            assert chunks == list(range(num_chunks)), (rid, m, chunks)


def build_trainers(group, train, evald, tmp_path, lora: bool):
    """RunTrainers for every run of ``group`` on one shared base, built as the engine builds them
    (one PeftModel holding every run's adapter, or one model copy per full fine-tuning run)."""
    import copy

    from peft import get_peft_model

    from rapidfire_nb.engine.runs import RunRecord
    from rapidfire_nb.automl import build_lora_config, build_training_args

    base, tok = tiny_create_model({"model_kwargs": {}})
    pristine = copy.deepcopy(base)
    peft_model, out = None, []
    for rid, spec in enumerate(group.expand(), start=1):
        name = f"run_{rid}" if lora else None
        if lora:
            if peft_model is None:
                peft_model = get_peft_model(base, build_lora_config(spec), adapter_name=name)
            else:
                peft_model.add_adapter(name, build_lora_config(spec))
            model = peft_model
        else:
            model = copy.deepcopy(pristine)
        cls = trainer_class(spec.trainer_type)
        out.append(cls(RunRecord(run_id=rid, spec=spec), model, tok, train, evald, 2, 0,
                       str(tmp_path / f"out{rid}"), name, build_training_args))
    return out, pristine


# ---------------------------------------------------------------------------------------------
# DPO


@pytest.fixture(scope="module")
def dpo_data():
    return make_dpo_dataset(16, seed=0), make_dpo_dataset(4, seed=1)


@pytest.fixture(scope="module")
def dpo_grid(tmp_path_factory, dpo_data):
    train, evald = dpo_data
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                        training_args=dpo_args(List([1e-3, 2e-2]), List([0.1, 0.5])),
                        compute_metrics=exact_match, generation_config={"max_new_tokens": 4})
    exp = Experiment("dpo-grid", experiment_path=tmp_path_factory.mktemp("dpo"))
    exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald, num_chunks=2, seed=5)
    yield exp
    exp.end()


def test_dpo_grid_completes_with_metrics_after_every_chunk(dpo_grid):
    info = dpo_grid.get_runs_info()
    assert list(info.run_id) == [1, 2, 3, 4]
    assert set(info.status) == {"completed"}, info.error.tolist()
    assert (info.completed_steps == info.total_steps).all() and (info.total_steps == 4).all()
    assert_eval_after_every_chunk(dpo_grid, range(1, 5), [
        "eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen",
        "eval_exact_match", "eval_n"], num_chunks=2)
    res = dpo_grid.get_results()
    train = res[res.split == "train"]
    for rid in range(1, 5):
        metrics = set(train[train.run_id == rid].metric)
        assert {"loss", "rewards/margins", "rewards/accuracies", "learning_rate"} <= metrics
    # beta scales the implicit rewards: the runs learned differently
    finals = res[(res.metric == "eval_rewards/margins") & (res.chunk == 1)].set_index("run_id").value
    assert finals.nunique() == 4
    assert (res[res.metric == "eval_n"].value == 4).all()


def test_dpo_lora_reference_is_the_shared_base(dpo_grid):
    engine = dpo_grid.engine
    base = engine.factory.bases[engine.snapshot()[1].spec.base_key()]
    assert base.pristine is None, "LoRA runs must not keep a second copy of the base"
    assert not {"ref", "default"} & set(base.peft_model.peft_config)
    # the margin at the first step is exactly 0: the reference is the initial policy (LoRA B = 0)
    res = dpo_grid.get_results()
    first = res[(res.metric == "rewards/margins") & (res.step == 1)].value
    assert len(first) == 4 and (first == 0.0).all()
    second = res[(res.metric == "rewards/margins") & (res.step == 2)].value
    assert (second != 0.0).all()


def test_dpo_references_as_built(dpo_data, tmp_path):
    """LoRA: TRL's PEFT path (adapters disabled), no extra adapter or copy; full fine-tuning: one
    frozen copy of the pristine base shared by the runs; precomputed log-probs where asked."""
    train, evald = dpo_data
    lora_group = RFGridSearch(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                                            training_args=dpo_args(List([1e-3, 1e-2]), 0.1)), trainer_type="DPO")
    rts, _ = build_trainers(lora_group, train, evald, tmp_path, lora=True)
    assert all(rt.trainer.ref_model is None for rt in rts)
    assert set(rts[0].model.peft_config) == {"run_1", "run_2"}
    for rt in rts:
        rt.close()

    full_group = RFGridSearch(RFModelConfig(model_name="tiny", training_args=dpo_args(
        1e-2, 0.1, precompute_ref_log_probs=List([False, True]))), trainer_type="DPO")
    (r1, r2), pristine = build_trainers(full_group, train, evald, tmp_path, lora=False)
    assert r1.trainer.ref_model is r2.trainer.ref_model, "one frozen reference per base"
    ref = r1.trainer.ref_model
    assert ref is not r1.model and ref is not r2.model
    assert all(not p.requires_grad for p in ref.parameters())
    for (n, p), (_, q) in zip(ref.named_parameters(), pristine.named_parameters()):
        assert torch.equal(p, q), n
    assert "ref_chosen_logps" not in r1.train_data.column_names
    assert {"ref_chosen_logps", "ref_rejected_logps"} <= set(r2.train_data.column_names)
    assert "ref_chosen_logps" in r2.eval_data.column_names
    r1.close()
    r2.close()


def test_dpo_isolation_bit_identical_to_training_alone(dpo_grid, dpo_data, tmp_path):
    train, evald = dpo_data
    # run 4 = lr 2e-2, beta 0.5 (grid order: learning_rate outer, beta inner)
    assert dpo_grid.engine.snapshot()[4].spec.training_args["beta"] == 0.5
    assert dpo_grid.engine.snapshot()[4].spec.training_args["learning_rate"] == 2e-2
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA), training_args=dpo_args(2e-2, 0.5),
                        compute_metrics=exact_match, generation_config={"max_new_tokens": 4})
    alone = Experiment("dpo-alone", experiment_path=tmp_path)
    alone.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald, num_chunks=2, seed=5)
    assert_same_run(dpo_grid, 4, alone, 1)
    alone.end()


def test_dpo_full_fine_tuning_with_a_frozen_reference(dpo_data, tmp_path):
    train, evald = dpo_data
    cfg = RFModelConfig(model_name="tiny", training_args=dpo_args(1e-2, 0.1, max_steps=2,
                                                                  precompute_ref_log_probs=List([False, True])))
    exp = Experiment("dpo-full", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald, num_chunks=2, seed=1)
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    assert exp.engine.snapshot()[2].spec.training_args["precompute_ref_log_probs"] is True
    l_fly, l_pre = logged(exp, 1), logged(exp, 2)
    assert l_fly.keys() == l_pre.keys() and len(l_fly) > 0
    # the reference is the initial policy, and precomputing it changes nothing
    assert l_fly[(1, "rewards/margins")] == 0.0 and l_pre[(1, "rewards/margins")] == 0.0
    for k in l_fly:
        assert l_fly[k] == pytest.approx(l_pre[k], rel=1e-4, abs=1e-6), k
    e_fly, e_pre = logged(exp, 1, "eval"), logged(exp, 2, "eval")
    assert e_fly.keys() == e_pre.keys() and (2, "eval_rewards/margins") in e_fly
    for k in e_fly:
        assert e_fly[k] == pytest.approx(e_pre[k], rel=1e-4, abs=1e-6), k
    w1, w2 = exp.engine.run_weights(1), exp.engine.run_weights(2)
    assert len(w1) > 0 and all(torch.allclose(w1[k], w2[k], atol=1e-5) for k in w1)
    exp.end()


def test_dpo_dropout_setting_stays_per_run_on_a_shared_base(dpo_data, tmp_path):
    """DPOTrainer zeroes every dropout of the model it is given (disable_dropout=True); on a shared
    base that must not reach a run that keeps its LoRA dropout."""
    train, _ = dpo_data

    def cfg(disable, **kw):
        return RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                             training_args=dpo_args(1e-2, 0.1, max_steps=2, disable_dropout=disable, **kw))

    # run 2 also precomputes its reference log-probs (adapters disabled) before training
    both = Experiment("dropout", experiment_path=tmp_path)
    both.run_fit(RFGridSearch(List([cfg(False), cfg(True, precompute_ref_log_probs=True)]), trainer_type="DPO"),
                 tiny_create_model, train, None, num_chunks=4, seed=6)
    alone = Experiment("dropout-alone", experiment_path=tmp_path)
    alone.run_fit(RFGridSearch(cfg(False), trainer_type="DPO"), tiny_create_model, train, None,
                  num_chunks=4, seed=6)
    assert set(both.get_runs_info().status) == {"completed"}
    order = both.get_timeline().sort_values("start").run_id.tolist()
    assert order.index(2) < len(order) - 1 - order[::-1].index(1), order
    assert_same_run(both, 1, alone, 1)
    # the precomputed reference is the initial policy: zero implicit rewards at the first step
    first = logged(both, 2)
    assert first[(1, "rewards/chosen")] == 0.0 and first[(1, "rewards/rejected")] == 0.0
    assert first[(2, "rewards/chosen")] != 0.0
    both.end()
    alone.end()


def test_dpo_dataset_without_preference_columns_is_refused(dpo_data, tiny_data, tmp_path):
    train, evald = dpo_data
    sft_train, _ = tiny_data
    group = RFGridSearch(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                                       training_args=dpo_args(1e-3, 0.1)), trainer_type="DPO")
    exp = Experiment("dpo-bad", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match=r"DPO needs 'chosen' and 'rejected' .*\(missing: chosen, rejected\)"):
        exp.run_fit(group, tiny_create_model, sft_train, None)
    # without 'prompt', chosen and rejected must share their start (TRL's implicit prompt)
    with pytest.raises(ConfigError, match=r"eval_dataset has no 'prompt' column .* share no first turn"):
        exp.run_fit(group, tiny_create_model, train, evald.remove_columns("prompt"))
    assert exp.engine is None and not any(ev["type"] == "run_created" for ev in exp.events.since(0))
    exp.end()


# ---------------------------------------------------------------------------------------------
# GRPO


def correct_answer(prompts, completions, answer, **kw):
    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]


@pytest.fixture(scope="module")
def grpo_data():
    return make_grpo_dataset(8, seed=0), make_grpo_dataset(2, seed=1)


@pytest.fixture(scope="module")
def grpo_grid(tmp_path_factory, grpo_data):
    train, evald = grpo_data
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                        training_args=grpo_args(List([1e-3, 5e-2]), List([2, 4])),
                        reward_funcs=[short_answer, correct_answer],
                        compute_metrics=exact_match, generation_config={"max_new_tokens": 3})
    exp = Experiment("grpo-grid", experiment_path=tmp_path_factory.mktemp("grpo"))
    exp.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, train, evald, num_chunks=2, seed=3)
    yield exp
    exp.end()


def test_grpo_grid_completes_with_per_reward_metrics_after_every_chunk(grpo_grid):
    info = grpo_grid.get_runs_info().set_index("run_id")
    assert list(info.index) == [1, 2, 3, 4]
    assert set(info.status) == {"completed"}, info.error.tolist()
    # 8 prompts, 4 completions per micro-batch: G=2 -> 2 prompts per step, G=4 -> 1 prompt per step
    assert info.loc[1, "num_generations"] == 2 and info.loc[1, "total_steps"] == 4
    assert info.loc[2, "num_generations"] == 4 and info.loc[2, "total_steps"] == 8
    assert (info.samples_seen == 8).all(), "a GRPO chunk is counted in prompts"
    assert_eval_after_every_chunk(grpo_grid, range(1, 5), [
        "eval_reward", "eval_rewards/short_answer/mean", "eval_rewards/correct_answer/mean",
        "eval_loss", "eval_exact_match"], num_chunks=2)
    res = grpo_grid.get_results()
    train = res[res.split == "train"]
    for rid in range(1, 5):
        metrics = set(train[train.run_id == rid].metric)
        assert {"loss", "reward", "rewards/short_answer/mean", "rewards/correct_answer/mean",
                "completions/mean_length"} <= metrics
        steps = sorted(set(train[train.run_id == rid].step))
        assert steps == list(range(1, int(info.loc[rid, "total_steps"]) + 1))
    # both chunks of an epoch hold the same number of prompts
    tl = grpo_grid.get_timeline()
    assert sorted(tl[tl.run_id == 2].samples_seen) == [4, 8]


def test_grpo_isolation_bit_identical_to_training_alone(grpo_grid, grpo_data, tmp_path):
    train, evald = grpo_data
    spec = grpo_grid.engine.snapshot()[3].spec      # lr 5e-2, G = 2
    assert spec.training_args["learning_rate"] == 5e-2 and spec.training_args["num_generations"] == 2
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA), training_args=grpo_args(5e-2, 2),
                        reward_funcs=[short_answer, correct_answer],
                        compute_metrics=exact_match, generation_config={"max_new_tokens": 3})
    alone = Experiment("grpo-alone", experiment_path=tmp_path)
    alone.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, train, evald, num_chunks=2, seed=3)
    assert_same_run(grpo_grid, 3, alone, 1)
    alone.end()


def test_grpo_temperature_axis_keeps_each_runs_own_fused_head(grpo_data, tmp_path):
    """TRL wraps the shared base's forward with a fused LM head at the run's temperature: the run
    built last must not impose its temperature on the others."""
    train, _ = grpo_data

    def cfg(temps):
        return RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                             training_args=grpo_args(1e-2, 2, temperature=temps, max_steps=2),
                             reward_funcs=[short_answer])

    # 4 chunks of one step: run 1's second step comes after run 2's trainer was built
    both = Experiment("temps", experiment_path=tmp_path)
    both.run_fit(RFGridSearch(cfg(List([0.5, 2.0])), trainer_type="GRPO"), tiny_create_model, train, None,
                 num_chunks=4, seed=2)
    alone = Experiment("temp-alone", experiment_path=tmp_path)
    alone.run_fit(RFGridSearch(cfg(0.5), trainer_type="GRPO"), tiny_create_model, train, None,
                  num_chunks=4, seed=2)
    assert set(both.get_runs_info().status) == {"completed"}
    order = both.get_timeline().sort_values("start").run_id.tolist()
    assert order.index(2) < len(order) - 1 - order[::-1].index(1), order
    assert_same_run(both, 1, alone, 1)
    both.end()
    alone.end()


def test_grpo_without_reward_functions_is_refused(grpo_data):
    train, _ = grpo_data
    with pytest.raises(ConfigError, match="reward_funcs"):
        RFGridSearch(RFModelConfig(model_name="tiny", training_args=grpo_args(1e-3, 2)), trainer_type="GRPO")
    # a RunSpec built by other means is refused by the trainer itself, before training
    spec = RunSpec(trainer_type="GRPO", model_name="tiny", training_args={"num_generations": 2})
    with pytest.raises(ConfigError, match="GRPO needs reward functions"):
        trainer_class("GRPO").check_dataset(spec, train, "train_dataset")
    spec.reward_funcs = [short_answer]
    with pytest.raises(ConfigError, match="GRPO needs a 'prompt' column"):
        trainer_class("GRPO").check_dataset(spec, train.rename_column("prompt", "question"), "train_dataset")


def test_reward_function_of_wrong_length_fails_only_its_run(grpo_data, tmp_path):
    train, evald = grpo_data

    def one_reward_only(prompts, completions, **kw):
        return [0.0]

    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                        training_args=grpo_args(1e-2, 2, max_steps=2),
                        reward_funcs=List([[short_answer], [one_reward_only]]))
    exp = Experiment("bad-reward", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, train, evald, num_chunks=2, seed=4)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "completed" and info.loc[1, "completed_steps"] == 2
    assert info.loc[2, "status"] == "failed"
    assert "one_reward_only' returned 1 rewards, but 4 were expected" in info.loc[2, "error"]
    status = [ev for ev in exp.events.since(0) if ev["type"] == "run_status" and ev["run_id"] == 2]
    assert status[-1]["status"] == "failed" and "returned 1 rewards" in status[-1]["reason"]
    exp.end()


def test_grpo_kl_reference_is_the_initial_policy(grpo_data, tmp_path):
    """beta != 0: the reference is the base with adapters disabled (LoRA) or a frozen copy (full
    fine-tuning), so the KL to it is exactly 0 at the first step and grows after it."""
    from datasets import Dataset

    train, _ = grpo_data
    chat = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                              for r in train])

    def long_answer(prompts, completions, **kw):  # conversational completions are message lists
        return [float(len(c[0]["content"])) for c in completions]

    args = grpo_args(1e-2, 2, beta=0.1, max_steps=2)
    cfg = List([RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA), training_args=args,
                              reward_funcs=[long_answer]),
                RFModelConfig(model_name="tiny", training_args=args, reward_funcs=[long_answer])])
    exp = Experiment("grpo-kl", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, chat, chat.select(range(2)),
                num_chunks=4, seed=1)
    assert set(exp.get_runs_info().status) == {"completed"}
    res = exp.get_results()
    for rid in (1, 2):
        kl = res[(res.run_id == rid) & (res.metric == "kl")].sort_values("step").value.tolist()
        assert kl[0] == 0.0 and kl[1] > 0.0, (rid, kl)
        assert len(res[(res.run_id == rid) & (res.metric == "eval_kl")]) == 2
    exp.end()
    # as built: LoRA -> TRL's PEFT path (adapters disabled); full fine-tuning -> the frozen copy
    (lora_rt,), _ = build_trainers(RFGridSearch(cfg[0], trainer_type="GRPO"), chat, None, tmp_path, lora=True)
    (full_rt,), pristine = build_trainers(RFGridSearch(cfg[1], trainer_type="GRPO"), chat, None, tmp_path,
                                          lora=False)
    assert lora_rt.trainer.ref_model is None and lora_rt.trainer.beta == 0.1
    ref = full_rt.trainer.ref_model
    assert ref is not None and ref is not full_rt.model and full_rt.trainer.beta == 0.1
    assert all(torch.equal(p, q) for p, q in zip(ref.parameters(), pristine.parameters()))
    lora_rt.close()
    full_rt.close()


def test_grpo_generation_batches_spanning_several_steps_do_not_depend_on_num_chunks(grpo_data, tmp_path):
    """A generation batch feeding two optimizer steps (steps_per_generation=2), or reused
    (num_iterations=2): chunks end only where the batch is used up, and the result is the same
    for 1 or 3 chunks per epoch (with an evaluation, which samples too, after every chunk)."""
    train, evald = grpo_data

    def reward_len(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    cfg = List([RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA), reward_funcs=[reward_len],
                              training_args=grpo_args(1e-2, 2, **extra))
                for extra in ({"per_device_train_batch_size": 2, "steps_per_generation": 2},
                              {"per_device_train_batch_size": 4, "num_iterations": 2})])
    runs = {}
    for chunks in (1, 3):
        exp = Experiment(f"gen-{chunks}", experiment_path=tmp_path)
        exp.run_fit(RFGridSearch(cfg, trainer_type="GRPO"), tiny_create_model, train, evald,
                    num_chunks=chunks, seed=8)
        info = exp.get_runs_info().set_index("run_id")
        assert set(info.status) == {"completed"}
        # 8 prompts, 2 per generation batch, each batch feeds 2 optimizer steps
        assert (info.total_steps == 8).all()
        tl = exp.get_timeline()
        assert len(tl) == 2 * chunks
        assert (tl.completed_steps % 2 == 0).all(), "a chunk ended inside a generation batch"
        runs[chunks] = exp
    for rid in (1, 2):
        assert_same_run(runs[1], rid, runs[3], rid, common_eval_only=True)
        assert any(m == "eval_reward" for _, m in logged(runs[1], rid, "eval"))
    for exp in runs.values():
        exp.end()


def test_grpo_resumes_from_checkpoints_to_the_same_result(grpo_data, tmp_path):
    """End an experiment after a few chunks, resume it from disk: the weights and logged losses
    equal the uninterrupted run's (nothing of the generation state lives outside the checkpoint)."""
    import time

    train, _ = grpo_data

    def reward_len(prompts, completions, **kw):
        return [float(len(c)) for c in completions]

    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA), reward_funcs=[reward_len],
                        training_args=grpo_args(List([1e-2, 3e-2]), 2, per_device_train_batch_size=2,
                                                steps_per_generation=2))
    group = RFGridSearch(cfg, trainer_type="GRPO")
    full = Experiment("full", experiment_path=tmp_path)
    full.run_fit(group, tiny_create_model, train, None, num_chunks=3, seed=9)

    part = Experiment("part", experiment_path=tmp_path)
    part.run_fit(group, tiny_create_model, train, None, num_chunks=3, seed=9, block=False)
    deadline = time.monotonic() + 120
    # stop after the second chunk of run 1, which ends halfway through the epoch's generations
    while sum(ev["type"] == "chunk_done" for ev in part.events.since(0)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    part.end(wait=False)   # end() would wait for the runs to finish
    done_before = sum(ev["type"] == "chunk_done" for ev in part.events.since(0))
    assert done_before < 6, "the experiment should have been interrupted"

    resumed = Experiment("part", experiment_path=tmp_path, resume=True)
    resumed.run_fit(group, tiny_create_model, train, None, num_chunks=3, seed=9)
    assert set(resumed.get_runs_info().status) == {"completed"}
    for rid in (1, 2):
        assert_same_run(full, rid, resumed, rid)
    full.end()
    resumed.end()


def test_dpo_prompts_longer_than_max_length_fail_the_run_with_the_reason(dpo_data, tmp_path):
    train, _ = dpo_data
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                        training_args=dpo_args(1e-3, 0.1, max_length=List([48, 4]), max_steps=1))
    exp = Experiment("dpo-long", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, None, num_chunks=1)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "completed"
    assert info.loc[2, "status"] == "failed"
    assert "drops 16 of 16 training pairs whose prompt alone has max_length=4 tokens" in info.loc[2, "error"]
    exp.end()


# ---------------------------------------------------------------------------------------------
# The GRPO stream (pure, no model)

@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 60), bs=st.integers(1, 8), g=st.integers(2, 8), spg=st.integers(1, 4),
       iters=st.integers(1, 3), ga=st.integers(1, 4), chunks=st.integers(1, 6), seed=st.integers(0, 5),
       epoch=st.integers(0, 2))
def test_generation_plan_walks_whole_generation_batches(n, bs, g, spg, iters, ga, chunks, seed, epoch):
    try:
        plan = GenerationPlan(n_examples=n, micro_batch_size=bs, grad_accum=ga, num_chunks=chunks, seed=seed,
                              num_generations=g, steps_per_generation=spg, num_iterations=iters)
    except ConfigError as exc:
        msg = str(exc)
        cycle, rows = spg * iters, bs * spg
        assert (rows % g or n < rows // g or (cycle % ga and ga % cycle) or "num_chunks" in msg), msg
        return
    per, cycle = plan.prompts_per_generation, plan.micro_steps_per_generation
    starts, micro = [], 0
    for step in range(plan.steps_per_epoch):
        mbs = plan.step_micro_batches(epoch, step)
        assert 1 <= len(mbs) <= ga
        for mb in mbs:
            if micro % cycle == 0:
                assert len(mb) == per
                starts += mb
            else:
                assert mb == []
            micro += 1
    assert micro == plan.generations_per_epoch * cycle
    # every prompt at most once per epoch, in the (seed, epoch) order; only an incomplete tail is left
    assert starts == plan.epoch_order(epoch)[:len(starts)] and n - len(starts) < per
    bounds = plan.chunk_bounds()
    assert bounds[0] == 0 and bounds[-1] == plan.steps_per_epoch and len(bounds) == chunks + 1
    assert all(a < b for a, b in zip(bounds, bounds[1:])), "no empty chunk"
    for b in bounds:  # a chunk starts where a generation batch starts: nothing buffered crosses it
        assert (b * ga) % cycle == 0 or b == plan.steps_per_epoch


def test_generation_plan_errors_name_the_knobs():
    with pytest.raises(ConfigError, match=r"steps_per_generation x num_iterations \(3\) and gradient_accumulation_steps \(2\)"):
        GenerationPlan(n_examples=16, micro_batch_size=2, grad_accum=2, num_chunks=1, seed=0, num_generations=2,
                       steps_per_generation=3)
    with pytest.raises(ConfigError, match="num_chunks=5 is larger than the 4 generation batches"):
        GenerationPlan(n_examples=8, micro_batch_size=4, grad_accum=1, num_chunks=5, seed=0, num_generations=2)
    with pytest.raises(ConfigError, match="3 prompts, fewer than one generation batch \\(4 prompts x 2"):
        GenerationPlan(n_examples=3, micro_batch_size=8, grad_accum=1, num_chunks=1, seed=0, num_generations=2)


def _first_step(exp, run_id, metric):
    df = exp.get_results()
    sel = df[(df.run_id == run_id) & (df.split == "train") & (df.metric == metric)].sort_values("step")
    return float(sel.value.iloc[0])


@pytest.mark.parametrize("trainer_type", ["DPO", "GRPO"])
def test_a_reference_model_named_by_ref_model_name_is_loaded_and_used(trainer_type, tmp_path, dpo_data,
                                                                      grpo_data):
    """ref_model_name other than the base: create_model is called with that name (and
    ref_model_kwargs) and the run scores against it. At step 1 a fresh LoRA policy equals its base,
    so against the base the DPO rewards (the GRPO KL) are exactly 0; against another model not."""
    calls = []

    def create_model(model_config):
        calls.append((model_config["model_name"], dict(model_config["model_kwargs"])))
        return tiny_create_model(model_config)

    lora = RFLoraConfig(**PREFERENCE_LORA)
    if trainer_type == "DPO":
        args, data, metric, extra = dpo_args(1e-3, 0.1, max_steps=2), dpo_data, "rewards/margins", {}
    else:
        args = grpo_args(1e-3, 2, beta=0.5, max_steps=2)
        data, metric, extra = grpo_data, "kl", {"reward_funcs": [short_answer]}
    cfgs = List([RFModelConfig(model_name="tiny", ref_model_name=ref, ref_model_kwargs=kw, peft_config=lora,
                               training_args=args, **extra)
                 for ref, kw in ((None, None), ("tiny-other", {"seed": 7}))])
    exp = Experiment(f"ref-{trainer_type}", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfgs, trainer_type=trainer_type), create_model, data[0], None, num_chunks=1, seed=5)
    exp.end()
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    assert calls == [("tiny", {}), ("tiny-other", {"seed": 7})]
    assert _first_step(exp, 1, metric) == 0.0
    assert abs(_first_step(exp, 2, metric)) > 1e-4
    # the reference stayed frozen and adapter-free: the engine keeps it apart from the bases
    (ref,) = exp.engine.factory.references.values()
    assert not any(p.requires_grad for p in ref.parameters())
    assert not any("lora" in n for n, _ in ref.named_parameters())


def test_a_reference_with_another_vocabulary_is_refused(tmp_path, dpo_data):
    cfg = RFModelConfig(model_name="tiny", ref_model_name="tiny-other", peft_config=RFLoraConfig(**PREFERENCE_LORA),
                        training_args=dpo_args(1e-3, 0.1, max_steps=2))

    def create_model(model_config):
        model, tok = tiny_create_model(model_config)
        if model_config["model_name"] == "tiny-other":
            model.resize_token_embeddings(len(tok) + 8)
        return model, tok

    exp = Experiment("ref-vocab", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match="ref_model_name='tiny-other' has a vocabulary of"):
        exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), create_model, dpo_data[0], None, num_chunks=1)
    assert exp.engine is None
    exp.end()
