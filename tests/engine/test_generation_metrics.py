"""Generation-based eval metrics: prompts/references, left-padded generation, the user's compute_metrics."""

import random

import numpy as np
import pytest
import torch
from datasets import Dataset

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, Range, RFDPOConfig, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
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
    # RapidFire's plain-text forms (its GenerationMetricsCallback): input/output, text, instruction/response
    assert G.split_example({"input": "q", "output": "a"}) == ("q", "a")
    assert G.split_example({"text": "just text"}) == ("just text", "just text")
    assert G.split_example({"text": "Q: q A: a", "response": "a", "instruction": "q"}) == ("Q: q A: a", "a")
    assert G.split_example({"instruction": "q", "response": "a"}) == ("q", "a")
    with pytest.raises(ConfigError, match="a 'messages' column, 'input'/'output', 'prompt' with one of completion"):
        G.split_example({"user": "q", "assistant": "a"})
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


def test_rapidfire_prompt_settings_shape_the_prompts_generated_from(model_tok):
    # RapidFire 0.16.2's GenerationMetricsCallback reads max_input_length, truncation_side and
    # add_generation_prompt from generation_config; they never reach generate()
    model, tok = model_tok
    prompt = "Reverse the word: apple\nAnswer: elppa\nReverse the word: river\nAnswer:"
    ids = tok(prompt)["input_ids"]
    assert len(ids) > 8
    gc = {"max_new_tokens": 4, "max_input_length": 6, "truncation_side": "right", "add_generation_prompt": False}
    kwargs = G.generation_kwargs(spec(generation_config=gc))
    assert kwargs == {"max_new_tokens": 4, "do_sample": False}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def direct(kept):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([kept]), attention_mask=torch.ones(1, len(kept), dtype=torch.long),
                                 pad_token_id=pad, eos_token_id=tok.eos_token_id, **kwargs)
        return tok.decode(out[0, len(kept):], skip_special_tokens=True)

    left = G.generate(model, tok, [prompt], kwargs, 1, 0, {"max_input_length": 6})     # RapidFire's default side
    right = G.generate(model, tok, [prompt], kwargs, 1, 0, G.prompt_settings(spec(generation_config=gc)))
    assert left == [direct(ids[-6:])] and right == [direct(ids[:6])]
    # unset: the tokenizer's context less what is generated (RapidFire's rule), never under 64
    assert tok.model_max_length == 512
    assert G.prompt_limit(tok, G.prompt_settings(spec()), {"max_new_tokens": 32}) == 480
    assert G.prompt_limit(tok, G.prompt_settings(spec()), {"max_new_tokens": 500}) == 64
    assert G.generate(model, tok, [prompt], kwargs, 1, 0) == [direct(ids)]
    # add_generation_prompt=False: the chat template without the assistant cue
    messages = [{"role": "user", "content": "Reverse the word: river"}]
    bare = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert not bare.endswith("<|assistant|>")
    assert G.generate(model, tok, [messages], kwargs, 1, 0, {"add_generation_prompt": False}) == \
        G.generate(model, tok, [bare], kwargs, 1, 0)


def test_a_truncated_prompt_keeps_the_bos_the_tokenizer_adds(model_tok):
    # RapidFire truncates with the tokenizer itself (truncation=True, max_length): the BOS a
    # Llama-style tokenizer puts first stays first on either side, and the tokenizer's own
    # truncation_side is left as it was
    from tokenizers.processors import TemplateProcessing

    from rapidfire_nb.demo_data import make_tokenizer

    model, _ = model_tok
    tok = make_tokenizer()
    tok._tokenizer.post_processor = TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", tok.bos_token_id)])
    prompt = "Reverse the word: apple\nAnswer: elppa\nReverse the word: river\nAnswer:"
    ids = tok(prompt)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) > 8
    kwargs = G.generation_kwargs(spec(generation_config={"max_new_tokens": 4}))

    def direct(kept):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([kept]), attention_mask=torch.ones(1, len(kept), dtype=torch.long),
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, **kwargs)
        return tok.decode(out[0, len(kept):], skip_special_tokens=True)

    tok.truncation_side = "right"
    left = G.generate(model, tok, [prompt], kwargs, 1, 0, {"max_input_length": 6})
    right = G.generate(model, tok, [prompt], kwargs, 1, 0, {"max_input_length": 6, "truncation_side": "right"})
    assert left == [direct([tok.bos_token_id] + ids[-5:])]
    assert right == [direct(ids[:6])]
    assert tok.truncation_side == "right"


def test_prompt_settings_with_bad_values_are_refused_with_their_name():
    evald = make_dpo_dataset(2)

    def fn(pair):
        return {}

    for gc, named in (({"truncation_side": "middle"}, "truncation_side must be 'left' or 'right'"),
                      ({"max_input_length": 0}, "max_input_length must be a positive int"),
                      ({"max_input_length": True}, "max_input_length must be a positive int"),
                      ({"add_generation_prompt": "yes"}, "add_generation_prompt must be True or False")):
        with pytest.raises(ConfigError, match=named):
            G.check_eval_dataset(spec(compute_metrics=fn, generation_config=gc), evald)
        with pytest.raises(ConfigError, match=named):          # and when the config is written
            RFModelConfig(model_name="tiny", training_args=RFSFTConfig(), compute_metrics=fn, generation_config=gc)
    G.check_eval_dataset(spec(compute_metrics=fn, generation_config={"max_input_length": None}), evald)
    # a grid over a prompt setting: every value is checked when the config is written, since a
    # search (RFOptuna) may draw one only when it refills a slot, after run_fit's checks
    RFModelConfig(model_name="tiny", training_args=RFSFTConfig(), compute_metrics=fn,
                  generation_config={"max_input_length": List([16, 32]), "truncation_side": List(["left", "right"])})
    for gc, named in (({"truncation_side": List(["left", "middle"])}, "truncation_side must be 'left' or 'right'"),
                      ({"max_input_length": List([16, True])}, "max_input_length must be a positive int"),
                      ({"max_input_length": Range(0, 64)}, "max_input_length must be a positive int"),
                      ({"add_generation_prompt": List([True, "no"])}, "add_generation_prompt must be True or False")):
        with pytest.raises(ConfigError, match=named):
            RFModelConfig(model_name="tiny", training_args=RFSFTConfig(), compute_metrics=fn, generation_config=gc)


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
        G.check_eval_dataset(spec(compute_metrics=fn, generation_config={}), None)
    with pytest.raises(ConfigError, match="compute_metrics with generation_config needs prompts and references"):
        G.check_eval_dataset(spec(compute_metrics=fn, generation_config={}), Dataset.from_list([{"user": "x"}]))
    # without generation_config an SFT compute_metrics is the Trainer's (logits): no columns needed
    G.check_eval_dataset(spec(compute_metrics=fn), Dataset.from_list([{"user": "x"}]))
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
    # a bad generation_config key is refused when the config is built, as clone_modify does
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


# ---------------------------------------------------------------------------------------------
# Sample prompts: the defaults taken from the eval set, and references for the user's


def sample_grid(**kw):
    return RFGridSearch(RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(**LORA),
        training_args=RFSFTConfig(learning_rate=1e-2, per_device_train_batch_size=8, num_train_epochs=1,
                                  max_length=64, bf16=False), **kw), trainer_type="SFT")


def test_default_sample_prompts_skip_rows_that_cannot_be_asked_and_cut_long_ones(tmp_path, tiny_data):
    """A run with a generation_config and no sample_prompts: an empty eval prompt (the tiny
    tokenizer adds no BOS, so it encodes to no token and generate refuses it) is skipped with a
    warning, never a refusal, and a prompt or reference past run_fit's 2,000-character limit
    is logged cut, saying so."""
    train, evald = tiny_data
    rows = [dict(evald[i]) for i in range(6)]
    rows[1]["prompt"] = ""
    rows[2]["prompt"] = "Reverse the word: " + "a" * 5000 + "\nAnswer:"
    rows[3]["completion"] = " " + "z" * 3000
    evald = Dataset.from_list(rows)
    exp = Experiment("skip", experiment_path=tmp_path, tracking=[])
    with pytest.warns(UserWarning, match=r"run 1: sample prompts: eval row 2 skipped: its prompt is empty") as seen:
        exp.run_fit(sample_grid(generation_config={"max_new_tokens": 2}), tiny_create_model, train, evald,
                    num_chunks=2, seed=3)
    said = " ".join(str(w.message) for w in seen)
    assert "sample 2's prompt has 5,026 characters" in said and "sample 3's reference has 3,001" in said
    assert set(exp.get_runs_info().status) == {"completed"}
    gens = exp.get_generations()
    first = gens[gens.chunk == gens.chunk.min()]
    picked = [rows[i] for i in (0, 2, 3, 4)]
    assert list(first.prompt)[0] == picked[0]["prompt"] and list(first.prompt)[2:] == [r["prompt"] for r in picked[2:]]
    assert list(first.reference)[:1] + list(first.reference)[3:] == [picked[0]["completion"], picked[3]["completion"]]
    cut_prompt, cut_ref = list(first.prompt)[1], list(first.reference)[2]
    assert cut_prompt.startswith(picked[1]["prompt"][:1900]) and "more characters not shown" in cut_prompt
    assert cut_ref.startswith(picked[2]["completion"][:1900]) and "more characters not shown" in cut_ref
    for e in (e for e in exp.events.since(0) if e["type"] == "generation"):
        assert len(e["prompts"]) == 4
        assert all(len(t) <= G.MAX_SAMPLE_PROMPT_CHARS for t in e["prompts"] + e["references"])
    exp.end()


def test_no_askable_eval_row_means_no_samples_not_a_refusal(tmp_path, tiny_data):
    train, _ = tiny_data
    evald = Dataset.from_list([{"prompt": p, "completion": " x"} for p in ("", "   ", "")])
    exp = Experiment("none", experiment_path=tmp_path, tracking=[])
    with pytest.warns(UserWarning, match="no eval row can be asked"):
        exp.run_fit(sample_grid(generation_config={"max_new_tokens": 2}), tiny_create_model, train, evald,
                    num_chunks=2, seed=3)
    assert set(exp.get_runs_info().status) == {"completed"} and exp.get_generations().empty
    exp.end()


def test_a_sample_prompt_equal_to_an_eval_prompt_gets_its_reference(tmp_path, tiny_data):
    train, evald = tiny_data
    asked = [evald[5]["prompt"], "What color is the cat?"]
    exp = Experiment("refs", experiment_path=tmp_path, tracking=[])
    exp.run_fit(sample_grid(), tiny_create_model, train, evald, num_chunks=2, seed=3, sample_prompts=asked)
    gens = exp.get_generations()
    assert len(gens) == 4
    for _, g in gens.iterrows():
        if g.prompt == asked[0]:
            assert g.reference == evald[5]["completion"]
        else:
            assert g.reference is None or g.reference != g.reference   # None, or NaN in the frame
    exp.end()


def test_get_generations_counts_epochs_and_chunks_from_one_as_the_panel_does(tmp_path, tiny_data):
    exp = Experiment("count", experiment_path=tmp_path, tracking=[])
    exp.run_fit(sample_grid(), tiny_create_model, *tiny_data, num_chunks=2, seed=3, sample_prompts=["Hi?"])
    gens = exp.get_generations()
    assert sorted(zip(gens.epoch, gens.chunk)) == [(1, 1), (1, 2)]
    # the same points as the eval metrics (0-based there, as get_results and get_timeline count)
    res = exp.get_results()
    assert set(gens.samples_seen) == set(res[res.metric == "eval_loss"].samples_seen)
    exp.end()


# ---------------------------------------------------------------------------------------------
# The Trainer's compute_metrics (SFT without generation_config): logits without TRL's deprecated path


def token_accuracy(eval_pred):
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    pred = np.argmax(logits[:, :-1], axis=-1)
    gold = labels[:, 1:]
    mask = gold != -100
    return {"next_token_accuracy": float((pred[mask] == gold[mask]).mean()), "logit_sum": float(logits.sum())}


@pytest.mark.filterwarnings("error:`return_outputs=True`:FutureWarning")
def test_logits_for_compute_metrics_without_trls_deprecated_return_outputs(tmp_path, tiny_data):
    """TRL 1.16 deprecates compute_loss(..., return_outputs=True) and the logits it hands to
    compute_metrics (gone in TRL 2): turned into an error here, a run that still used it would
    fail; every run completes with its metric logged after every chunk."""
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(**LORA), compute_metrics=token_accuracy,
                        training_args=RFSFTConfig(learning_rate=List([1e-2, 3e-2]), per_device_train_batch_size=8,
                                                  per_device_eval_batch_size=4, num_train_epochs=1, max_length=64,
                                                  bf16=False))
    exp = Experiment("logits", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, *tiny_data, num_chunks=2, seed=2)
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, list(info.error)
    res = exp.get_results()
    acc = res[res.metric == "eval_next_token_accuracy"]
    assert sorted(zip(acc.run_id, acc.chunk)) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert all(0 <= v <= 1 for v in acc.value)
    exp.end()


def test_the_eval_logits_are_those_trls_deprecated_path_returns(tiny_data):
    """The forward the engine makes for the logits gives, bit for bit, what
    compute_loss(..., return_outputs=True) returns in TRL 1.16, and the same loss: the metrics
    computed from them stay what they were."""
    from trl import SFTConfig, SFTTrainer

    from rapidfire_nb.engine.adapters.base import _eval_logits

    model, tok = make_tiny_model_and_tokenizer()
    _, evald = tiny_data
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=evald, eval_dataset=evald,
                         args=SFTConfig(output_dir="/tmp/rf-unused", max_length=64, bf16=False, use_cpu=True,
                                        report_to="none"))
    model.eval()
    batch = trainer.data_collator([trainer.eval_dataset[i] for i in range(4)])
    with torch.no_grad():
        inputs = trainer._prepare_inputs(dict(batch))
        with pytest.warns(FutureWarning, match="return_outputs=True"):
            old_loss, outputs = trainer.compute_loss(model, inputs, return_outputs=True)
        inputs = trainer._prepare_inputs(dict(batch))
        loss = trainer.compute_loss(model, inputs)
        logits = _eval_logits(model, inputs).logits
    assert torch.equal(loss, old_loss)
    assert torch.equal(logits, outputs.logits)
