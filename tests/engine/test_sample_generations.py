"""Sample generations: every run answers the same prompts after every chunk, for the panel's
side-by-side view and the report, without changing what any run trains."""

import re

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine.generation import MAX_SAMPLE_PROMPTS
from rapidfire_nb.errors import ConfigError

PROMPTS = ["What color is the cat?", [{"role": "user", "content": "What color is the dog?"}]]


def grid(**kw):
    return RFGridSearch(RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([3e-2, 1e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False), **kw),
        trainer_type="SFT")


def fit(tmp_path, name, data, group=None, **kw):
    exp = Experiment(name, experiment_path=tmp_path, tracking=[])
    exp.run_fit(group or grid(), tiny_create_model, *data, num_chunks=2, seed=5, **kw)
    return exp


def test_sample_generations_leave_every_run_bit_identical_and_survive_reopening(tmp_path, tiny_data):
    plain = fit(tmp_path, "plain", tiny_data)
    sampled = fit(tmp_path, "sampled", tiny_data, sample_prompts=PROMPTS)
    for rid in (1, 2):
        a, b = plain.engine.run_weights(rid), sampled.engine.run_weights(rid)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (rid, k)
    ra, rb = plain.get_results(), sampled.get_results()
    assert ra[["run_id", "split", "step", "metric", "value"]].equals(rb[["run_id", "split", "step", "metric", "value"]])

    gens = sampled.get_generations()
    # two runs x two chunks x two prompts, the chat prompt shown as "role: content"
    assert len(gens) == 8
    assert sorted(set(gens.prompt)) == ["What color is the cat?", "user: What color is the dog?"]
    assert gens.reference.isna().all()
    assert sorted(set(zip(gens.run_id, gens.chunk))) == [(1, 1), (1, 2), (2, 1), (2, 2)]   # from 1, as the panel
    assert all(isinstance(t, str) for t in gens.text)
    # logged at the chunk's eval point: the same samples_seen as that chunk's eval metric
    evals = rb[(rb.split == "eval") & (rb.metric == "eval_loss")]
    assert set(zip(gens.run_id, gens.samples_seen)) == set(zip(evals.run_id, evals.samples_seen))
    # its time is its own slice, taken from "other"
    assert sampled.time_split()["generate"] > 0 and plain.time_split()["generate"] == 0
    assert plain.get_generations().empty
    tl = sampled.get_timeline()
    assert (tl.gen_s > 0).all() and (tl.other_s >= 0).all()
    sampled.end()
    plain.end()
    again = Experiment.open(sampled.path)
    assert again.get_generations().equals(gens)


def test_a_generation_config_samples_the_first_eval_prompts_with_their_references(tmp_path, tiny_data):
    train, evald = tiny_data
    exp = fit(tmp_path, "gc", tiny_data, group=grid(generation_config={"max_new_tokens": 3}))
    gens = exp.get_generations()
    first = [evald[i] for i in range(4)]
    assert list(gens[(gens.run_id == 1) & (gens.chunk == 1)].prompt) == [r["prompt"] for r in first]
    assert list(gens[(gens.run_id == 1) & (gens.chunk == 1)].reference) == [r["completion"] for r in first]
    exp.end()
    off = fit(tmp_path, "off", tiny_data, group=grid(generation_config={"max_new_tokens": 3}), sample_prompts=[])
    assert off.get_generations().empty and off.time_split()["generate"] == 0
    off.end()


@pytest.mark.parametrize("bad, says", [
    ("What color is the cat?", "must be a list"),
    (["ok"] * (MAX_SAMPLE_PROMPTS + 1), f"at most {MAX_SAMPLE_PROMPTS}"),
    (["  "], r"sample_prompts\[0\] is blank"),
    (["ok", 3], r"sample_prompts\[1\] must be a string or a list of chat messages"),
    ([[{"role": "user", "content": None}]], r"sample_prompts\[0\]: every chat message"),
    (["x" * 2001], "at most 2000"),
    ([[{"role": "user", "content": "x" * 2001}]], "at most 2000"),
    ([[{"role": None, "content": "hi"}]], r"sample_prompts\[0\]: every chat message needs a string 'role'"),
    ([[{"role": "user", "content": "  "}]], r"sample_prompts\[0\] is blank"),
    (["fine", "a lone surrogate \ud800"], r"run 1: cannot generate for sample_prompts\[1\]"),
])
def test_bad_sample_prompts_are_refused_before_anything_is_written(tmp_path, tiny_data, bad, says):
    exp = Experiment("bad", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match=says):
        exp.run_fit(grid(), tiny_create_model, *tiny_data, num_chunks=2, sample_prompts=bad)
    assert exp.engine is None
    assert not (tmp_path / "bad" / "events.jsonl").exists() or \
        "run_created" not in (tmp_path / "bad" / "events.jsonl").read_text()
    exp.end()


def test_the_report_sets_the_answers_side_by_side_at_every_point(tmp_path, tiny_data):
    import html

    exp = fit(tmp_path, "rep", tiny_data, sample_prompts=["<b>cat</b>?"])
    gens = exp.get_generations()
    page = exp.report(tmp_path / "r.html").read_text()
    exp.end()
    assert "<h2>Generations</h2>" in page
    # the prompt is text, never markup; the latest point open, the earlier folded
    assert "&lt;b&gt;cat&lt;/b&gt;?" in page and "<b>cat</b>?" not in page
    xs = sorted(set(gens.samples_seen), reverse=True)
    assert f'<details data-samples="{xs[0]}" open>' in page and f'<details data-samples="{xs[1]}">' in page
    for text in gens.text:
        shown = "".join(c if c in "\n\t" or ord(c) >= 32 and ord(c) != 127 else "\ufffd" for c in text)
        assert (html.escape(shown) if text.strip() else "(empty answer)") in page
    assert "reference</th>" not in page     # no prompt has a reference: no reference column


def test_the_report_says_empty_answers_marks_matches_and_shows_no_control_characters():
    from rapidfire_nb.engine.state import fold
    from rapidfire_nb.report.page import generations_html

    def ev(seq, type_, **kw):
        return {"seq": seq, "time": float(seq), "type": type_, **kw}

    created = [ev(i, "run_created", run_id=i, trainer_type="SFT", config={}, knobs={"lr": 0.1 * i},
                  parent_run_id=None, warm_start=False, total_steps=4, steps_per_epoch=2, num_chunks=2)
               for i in (1, 2)]
    gen = [ev(3, "generation", run_id=1, epoch=0, chunk=0, step=1, samples_seen=8, prompts=["p?", "q?"],
              references=["orange", None], texts=["orange ", "\x02\ufffdok"]),
           ev(4, "generation", run_id=2, epoch=0, chunk=0, step=1, samples_seen=8, prompts=["p?", "q?"],
              references=["orange", None], texts=["", "x"]),
           ev(5, "generation", run_id=1, epoch=1, chunk=1, step=4, samples_seen=32, prompts=["p?", "q?"],
              references=["orange", None], texts=["red", "y"])]
    page = generations_html(fold(created + gen))
    assert re.search(r">orange\s+✓<", page)         # equal to the reference once trimmed
    assert "(empty answer)" in page and "\x02" not in page and "\ufffd\ufffdok" in page
    assert "reference</th>" in page
    # points named by epoch and chunk; the run that has not reached the latest shows its last answer
    assert "after 32 samples (epoch 2, chunk 2/2) · latest" in page
    assert "after 8 samples (epoch 1, chunk 1/2)" in page
    latest = page.split("after 8 samples")[0]
    assert "red" in latest and "(empty answer)" in latest


@pytest.mark.parametrize("generation_config, says", [
    ({"num_beams": 0}, r"run 1: cannot generate for eval prompt 1 \('Reverse the word: .*'\) with its generation_config"),
    ({"do_sample": True, "temperature": 0.0}, "run 1: cannot generate for eval prompt 1 .* with its generation_config"),
])
def test_settings_that_cannot_generate_are_refused_by_run_fit(tmp_path, tiny_data, generation_config, says):
    exp = Experiment("nogen", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match=says):
        exp.run_fit(grid(generation_config=generation_config), tiny_create_model, *tiny_data, num_chunks=2)
    assert exp.engine is None
    exp.end()
    # without sample prompts nothing generates: the same settings train as before
    ok = fit(tmp_path, "nogen-off", tiny_data, group=grid(generation_config=generation_config), sample_prompts=[])
    assert set(ok.get_runs_info().status) == {"completed"}
    ok.end()


def test_one_answer_per_prompt_whatever_the_generation_config_returns(tmp_path, tiny_data):
    exp = fit(tmp_path, "beams", tiny_data, sample_prompts=["What color is the cat?"],
              group=grid(generation_config={"num_beams": 2, "num_return_sequences": 2, "max_new_tokens": 3}))
    gens = exp.get_generations()
    assert len(gens) == 4 and set(exp.get_runs_info().status) == {"completed"}   # 2 runs x 2 chunks
    exp.end()


def test_answers_are_bounded_and_odd_settings_still_make_a_readable_log(tmp_path, tiny_data):
    # a float max_new_tokens (transformers takes it) and a budget far past the bound: the log
    # holds the integer bound, and the folder opens again
    exp = fit(tmp_path, "bound", tiny_data, sample_prompts=["What color is the cat?"],
              group=grid(generation_config={"max_new_tokens": List([3.0, 2000]), "stop_strings": ["zzz"]}))
    logged = [e for e in exp.events.since(0) if e["type"] == "generation"]
    assert {e["max_new_tokens"] for e in logged} == {3, 256} and len(logged) == 8
    assert all(type(e["max_new_tokens"]) is int for e in logged)
    assert set(exp.get_runs_info().status) == {"completed"}
    gens = exp.get_generations()
    exp.end()
    assert Experiment.open(exp.path).get_generations().equals(gens)


def test_the_report_lists_the_prompts_of_every_answer_after_a_resume_asked_others():
    from rapidfire_nb.engine.state import fold
    from rapidfire_nb.report.page import generations_html

    def ev(seq, type_, **kw):
        return {"seq": seq, "time": float(seq), "type": type_, **kw}

    created = [ev(i, "run_created", run_id=i, trainer_type="SFT", config={}, knobs={"lr": 0.1 * i},
                  parent_run_id=None, warm_start=False, total_steps=4, steps_per_epoch=2, num_chunks=2)
               for i in (1, 2)]
    gen = [ev(3, "generation", run_id=1, epoch=0, chunk=0, step=1, samples_seen=8, prompts=["old?"],
              references=[None], texts=["first"]),
           ev(4, "generation", run_id=2, epoch=0, chunk=1, step=2, samples_seen=16, prompts=["new?"],
              references=[None], texts=["second"])]
    latest = generations_html(fold(created + gen)).split("after 8 samples")[0]
    assert "old?" in latest and "new?" in latest and "first" in latest and "second" in latest


def test_a_clone_whose_settings_cannot_generate_is_refused_when_applied(tmp_path, tiny_data):
    from helpers import events_of, on_chunk_done

    exp = Experiment("clonegen", experiment_path=tmp_path, tracking=[])
    ids = []
    fired = on_chunk_done(exp, 1, 0, lambda: ids.append(
        exp.clone_modify(1, {"generation_config": {"num_beams": 0}})))
    exp.run_fit(grid(), tiny_create_model, *tiny_data, num_chunks=2, seed=5, sample_prompts=["What color is the cat?"])
    assert fired == [True] and ids == [3], fired
    answers = [e for e in events_of(exp, "op", op="clone") if "reason" in e and not e.get("accepted")]
    assert answers and re.search(r"run 3: cannot generate for sample_prompts\[0\] .* with its generation_config",
                                 answers[-1]["reason"]), events_of(exp, "op")
    # nothing of the refused clone exists; the others trained and answered as before
    assert 3 not in set(exp.get_runs_info().run_id)
    assert set(exp.get_runs_info().status) == {"completed"}
    assert set(exp.get_generations().run_id) == {1, 2}
    exp.end()
