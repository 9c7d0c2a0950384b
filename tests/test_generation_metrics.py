"""Generation-based eval metrics: prompts/references, left-padded generation, the user's compute_metrics."""

import random

import numpy as np
import pytest
import torch
from datasets import Dataset

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_dpo_dataset, make_tiny_model_and_tokenizer, tiny_create_model
from rapidfire_nb.engine import generation as G
from rapidfire_nb.engine.runspec import RunSpec
from rapidfire_nb.engine.rng import capture_rng
from rapidfire_nb.errors import ConfigError

LORA = dict(r=4, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module")
def model_tok():
    model, tok = make_tiny_model_and_tokenizer()
    return model.eval(), tok


def spec(**kw):
    return RunSpec(trainer_type="SFT", model_name="tiny", **kw)


def test_prompts_and_references_from_every_dataset_shape():
    user = {"role": "user", "content": "hi"}
    bot = {"role": "assistant", "content": "hello"}
    assert G.split_example({"prompt": "a", "completion": " b"}) == ("a", " b")
    assert G.split_example({"prompt": "a", "chosen": " b", "rejected": " c"}) == ("a", " b")
    assert G.split_example({"prompt": "What is 1 plus 2?", "answer": "3"}) == ("What is 1 plus 2?", "3")
    assert G.split_example({"prompt": [user], "completion": [bot]}) == ([user], "hello")
    convo = [{"role": "system", "content": "s"}, user, bot, user, bot]
    assert G.split_example({"messages": convo}) == (convo[:4], "hello")
    with pytest.raises(ConfigError, match="a 'messages' column, or 'prompt' with one of completion"):
        G.split_example({"text": "just text"})
    with pytest.raises(ConfigError, match="no assistant message"):
        G.split_example({"messages": [user]})


def test_batched_left_padded_generation_equals_one_prompt_at_a_time(model_tok):
    model, tok = model_tok
    prompts = ["Reverse the word: apple\nAnswer:", "What is 3 plus 4?", "Spell cat in capitals:"]
    kwargs = G.generation_kwargs(spec(generation_config={"max_new_tokens": 5}))
    batched = G.generate(model, tok, prompts, kwargs, batch_size=3, seed=0)
    single = [G.generate(model, tok, [p], kwargs, batch_size=1, seed=0)[0] for p in prompts]
    assert batched == single
    assert len(batched) == 3 and all(isinstance(p, str) and p for p in batched)


def test_chat_template_is_applied_to_conversational_prompts(model_tok):
    model, tok = model_tok
    messages = [{"role": "user", "content": "Reverse the word: river"}]
    kwargs = G.generation_kwargs(spec(generation_config={"max_new_tokens": 6}))
    templated = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert templated.endswith("<|assistant|>")
    assert G.generate(model, tok, [messages], kwargs, 1, 0) == G.generate(model, tok, [templated], kwargs, 1, 0)
    assert G.generate(model, tok, [messages], kwargs, 1, 0) != G.generate(model, tok, ["Reverse the word: river"],
                                                                          kwargs, 1, 0)


def test_generation_leaves_every_rng_untouched_and_sampling_is_reproducible(model_tok):
    model, tok = model_tok
    kwargs = G.generation_kwargs(spec(generation_config={"max_new_tokens": 6, "do_sample": True,
                                                         "temperature": 1.5}))
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    before = capture_rng()
    first = G.generate(model, tok, ["What is 1 plus 1?"] * 4, kwargs, 4, seed=11)
    after = capture_rng()
    assert torch.equal(before["torch"], after["torch"])
    assert before["python"] == after["python"]
    assert np.array_equal(before["numpy"][1], after["numpy"][1]) and before["numpy"][2:] == after["numpy"][2:]
    assert first == G.generate(model, tok, ["What is 1 plus 1?"] * 4, kwargs, 4, seed=11)
    assert len(set(first)) > 1, "sampling should differ between the 4 rows"
    assert model.training is False


def test_compute_metrics_results_are_checked_and_prefixed():
    out = G.run_compute_metrics(lambda pr: {"em": np.float32(0.5), "eval_n": 3, "t": torch.tensor(2.0),
                                            "ok": True}, ["a"], ["a"])
    assert out == {"eval_em": 0.5, "eval_n": 3.0, "eval_t": 2.0, "eval_ok": 1.0}
    seen = []
    G.run_compute_metrics(lambda pr: seen.append(pr) or {}, ["p1", "p2"], ["r1", "r2"])
    assert seen == [(["p1", "p2"], ["r1", "r2"])]
    with pytest.raises(TypeError, match="must return a dict"):
        G.run_compute_metrics(lambda pr: 0.5, ["a"], ["a"])
    with pytest.raises(TypeError, match="for 'bleu'; metric values must be numbers"):
        G.run_compute_metrics(lambda pr: {"bleu": "high"}, ["a"], ["a"])


def test_bad_generation_settings_are_refused_before_training():
    evald = make_dpo_dataset(2)

    def fn(pair):
        return {}

    G.check_eval_dataset(spec(compute_metrics=fn, generation_config={"max_new_tokens": 4}), evald)
    with pytest.raises(ConfigError, match=r"unknown generation setting 'max_new_token' \(did you mean 'max_new_tokens'"):
        G.check_eval_dataset(spec(compute_metrics=fn, generation_config={"max_new_token": 4}), evald)
    # sampling knobs without do_sample: greedy, as transformers does (RapidFire's SFT tutorial
    # sets temperature/top_p/top_k alone), with a warning that says so
    with pytest.warns(UserWarning, match="temperature only apply to sampling.*greedily"):
        G.check_eval_dataset(spec(compute_metrics=fn, generation_config={"temperature": 0.3}), evald)
    with pytest.raises(ConfigError, match="generation_config is invalid"):
        G.check_eval_dataset(spec(compute_metrics=fn, generation_config={"max_new_tokens": -1}), evald)
    with pytest.raises(ConfigError, match="needs an eval_dataset"):
        G.check_eval_dataset(spec(compute_metrics=fn), None)
    with pytest.raises(ConfigError, match="compute_metrics needs prompts and references"):
        G.check_eval_dataset(spec(compute_metrics=fn), Dataset.from_list([{"text": "x"}]))
    assert G.generation_kwargs(spec()) == {"max_new_tokens": 32, "do_sample": False}
    assert G.generation_kwargs(spec(generation_config={"max_length": 20})) == {"max_length": 20, "do_sample": False}


# ---------------------------------------------------------------------------------------------
# Through the engine


def recording_metrics(calls):
    def compute_metrics(pair):
        predictions, references = pair
        calls.append((list(predictions), list(references)))
        hits = [p.strip() == r.strip() for p, r in zip(predictions, references)]
        return {"exact_match": sum(hits) / len(hits),
                "pred_chars": sum(len(p) for p in predictions) / len(predictions)}
    return compute_metrics


def test_dpo_runs_log_compute_metrics_of_their_own_generations(tmp_path):
    train, evald = make_dpo_dataset(8, seed=0), make_dpo_dataset(3, seed=1)
    calls = []
    args = RFDPOConfig(learning_rate=List([1e-3, 5e-2]), per_device_train_batch_size=4, per_device_eval_batch_size=2,
                       num_train_epochs=1, bf16=False, max_length=48)
    gen = {"max_new_tokens": 4}
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args,
                        compute_metrics=recording_metrics(calls), generation_config=gen)
    exp = Experiment("gen-dpo", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald, num_chunks=2, seed=0)
    assert set(exp.get_runs_info().status) == {"completed"}
    res = exp.get_results()
    em = res[res.metric == "eval_exact_match"]
    assert sorted(zip(em.run_id, em.chunk)) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len(calls) == 4
    assert all(refs == list(evald["chosen"]) and len(preds) == 3 for preds, refs in calls)
    # the logged value is the metric of what the run's own final weights generate
    from peft import PeftModel

    tl = exp.get_timeline().sort_values("start")
    order = list(zip(tl.run_id, tl.chunk))  # compute_metrics is called once per chunk, in this order
    for rid in (1, 2):
        base, tok = make_tiny_model_and_tokenizer()
        model = PeftModel.from_pretrained(base, str(exp.export(rid, tmp_path / f"run{rid}")))
        preds = G.generate(model, tok, list(evald["prompt"]), G.generation_kwargs(exp.engine.snapshot()[rid].spec),
                           2, seed=0)
        assert preds == calls[order.index((rid, 1))][0]
        logged = res[(res.run_id == rid) & (res.chunk == 1) & (res.metric == "eval_pred_chars")].value.item()
        assert logged == pytest.approx(sum(len(p) for p in preds) / 3)
    exp.end()


def test_compute_metrics_that_breaks_fails_only_its_run(tmp_path):
    train, evald = make_dpo_dataset(8, seed=0), make_dpo_dataset(2, seed=1)

    def broken(pair):
        return ["not", "a", "dict"]

    args = RFDPOConfig(learning_rate=1e-3, per_device_train_batch_size=4, num_train_epochs=1, bf16=False,
                       max_length=48)
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args,
                        compute_metrics=List([recording_metrics([]), broken]),
                        generation_config={"max_new_tokens": 2})
    exp = Experiment("gen-broken", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald, num_chunks=2, seed=0)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "completed"
    assert info.loc[2, "status"] == "failed" and "compute_metrics must return a dict" in info.loc[2, "error"]
    exp.end()


def test_bad_eval_columns_for_compute_metrics_are_refused_by_run_fit(tmp_path):
    train = make_dpo_dataset(8)
    evald = make_dpo_dataset(2)
    args = RFDPOConfig(learning_rate=1e-3, per_device_train_batch_size=4, bf16=False, max_length=48)
    # a bad generation_config key is refused when the config is built (issue 15), as clone_modify does
    with pytest.raises(ConfigError, match="max_new_tokns"):
        RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args,
                      compute_metrics=recording_metrics([]), generation_config={"max_new_tokns": 2})
    # a value transformers refuses is caught by run_fit, before anything trains
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args,
                        compute_metrics=recording_metrics([]), generation_config={"max_new_tokens": -2})
    exp = Experiment("gen-bad", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match="generation_config"):
        exp.run_fit(RFGridSearch(cfg, trainer_type="DPO"), tiny_create_model, train, evald)
    assert exp.engine is None
    exp.end()


def test_sft_runs_log_compute_metrics_on_conversational_data(tmp_path):
    rows = [{"messages": [{"role": "user", "content": f"Reverse the word: {w}"},
                          {"role": "assistant", "content": w[::-1]}]}
            for w in ["apple", "river", "stone", "cloud", "light", "sugar", "tiger", "piano"]]
    train, evald = Dataset.from_list(rows), Dataset.from_list(rows[:3])
    calls = []
    args = RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=4, num_train_epochs=1, bf16=False,
                       max_length=48)
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), training_args=args,
                        compute_metrics=recording_metrics(calls), generation_config={"max_new_tokens": 3})
    exp = Experiment("gen-sft", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2, seed=0)
    res = exp.get_results()
    assert sorted(res[res.metric == "eval_exact_match"].chunk) == [0, 1]
    assert calls[0][1] == ["elppa", "revir", "enots"]
    exp.end()
