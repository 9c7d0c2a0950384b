"""Configuration errors are raised by run_fit (or by the config's constructor), before training.

Each case would otherwise surface late in the engine thread (LoRA targets matching nothing, a row
that cannot be tokenized) or never: an unknown RFModelConfig keyword kept silently, a
generation_config key that clone_modify refuses accepted at construction.
"""

from __future__ import annotations

import pytest
from datasets import Dataset

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.errors import ConfigError


def group(lora=None, **model):
    lora = dict(r=4, target_modules=["q_proj", "v_proj"]) if lora is None else lora
    return RFGridSearch(RFModelConfig(
        model_name="tiny", peft_config=RFLoraConfig(**lora),
        training_args=RFSFTConfig(per_device_train_batch_size=4, num_train_epochs=1, max_length=64,
                                  bf16=False), **model), trainer_type="SFT")


def refused(tmp_path, grp, train, evald, match):
    exp = Experiment("early", experiment_path=tmp_path, tracking=[])
    with pytest.raises(ConfigError, match=match):
        exp.run_fit(grp, tiny_create_model, train, evald, num_chunks=2)
    assert exp.engine is None, "nothing may start"
    assert not any(e["type"] in ("run_created", "chunk_done") for e in exp.events.since(0))
    exp.end()
    assert not (exp.path / "checkpoints").exists()


@pytest.mark.parametrize("lora, match", [
    (dict(r=4, target_modules=[]), r"run 1: peft_config.target_modules=\[\] adapts no module"),
    (dict(r=4, target_modules=["q_proj", "qproj"]), r"\['qproj'\] match no module of base model 'tiny'.*q_proj"),
    (dict(r=4, target_modules=r".*\.attn_q"), r"matches no module of base model"),
])
def test_lora_targets_that_match_nothing(tmp_path, lora, match):
    train, evald = make_demo_datasets(16, 4)
    refused(tmp_path, group(lora), train, evald, match)


def test_a_row_that_cannot_be_tokenized(tmp_path):
    train, evald = make_demo_datasets(16, 4)
    rows = train.to_list()
    rows[2]["completion"] = None
    bad = Dataset.from_list(rows)
    refused(tmp_path, group(), bad, evald, r"train_dataset row 2, column 'completion' is NoneType")
    conv = Dataset.from_list([{"messages": [{"role": "user", "content": "hi"},
                                            {"role": None, "content": "no role"}]}] * 8)
    refused(tmp_path, group(), conv, None, r"train_dataset row 0, column 'messages': message 1 is dict")


def test_rows_whose_prompt_fills_max_length_are_named_before_training(tmp_path):
    """TRL's SFT preparation truncates to max_length and drops the rows left without a completion
    token: a dataset of only such rows is refused with why, not failed later as "empty"."""
    import warnings

    from rapidfire_nb.errors import RapidFireConfigWarning

    train, evald = make_demo_datasets(16, 4)
    long = "word " * 100   # > max_length=64 tokens with the tiny tokenizer
    rows = [dict(r, prompt=long + r["prompt"]) for r in train.to_list()[:8]]
    refused(tmp_path, group(), Dataset.from_list(rows), evald,
            r"run 1: train_dataset: TRL would drop every row \(8\): its prompt alone has at least "
            r"max_length=64 tokens \(row \d: [\d,]+\).*Raise max_length")
    # some rows only: trained, with the count named
    some = Dataset.from_list(rows[:2] + train.to_list()[2:])
    exp = Experiment("some-long", experiment_path=tmp_path, tracking=[])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exp.run_fit(group(), tiny_create_model, some, evald, num_chunks=2, block=True)
    said = [str(w.message) for w in seen if issubclass(w.category, RapidFireConfigWarning)]
    assert any("TRL will drop 2 of the first 8 rows checked (of 16)" in m for m in said), said
    assert set(exp.get_runs_info().status) == {"completed"}
    exp.end()


@pytest.mark.parametrize("bad_row", [0, 3])
def test_a_formatting_func_that_breaks_on_a_row(tmp_path, bad_row):
    """A row mapper that raises on one row is refused before training, whether the row is the
    first (the probe that tells RapidFire's form from TRL's) or a later one (the mapping)."""
    train, evald = make_demo_datasets(16, 4)
    train = train.add_column("row_index", list(range(len(train))))

    def fmt(row):
        if row.get("row_index") == bad_row:
            raise KeyError("answer")
        return {"prompt": row["prompt"], "completion": row["completion"]}

    where = "raised on the first row of train_dataset" if bad_row == 0 else "failed while mapping train_dataset"
    refused(tmp_path, group(formatting_func=fmt), train, evald, rf"formatting_func '[\w.<>]*fmt' {where}: KeyError")


def test_generation_config_is_checked_like_clone_modify_checks_it(tmp_path):
    with pytest.raises(ConfigError, match=r"'generation_config.max_new_tokenz' is not a generation setting.*max_new_tokens"):
        RFModelConfig(model_name="tiny", generation_config={"max_new_tokenz": 8})
    train, evald = make_demo_datasets(16, 4)
    refused(tmp_path, group(generation_config={"max_new_tokens": -3}), train, evald,
            r"run 1: generation_config rejected by transformers.GenerationConfig")


@pytest.mark.parametrize("kwargs", [dict(learning_rate=1e-3), dict(foo=1), dict(num_gpu=1)])
def test_unknown_model_config_keywords_are_refused(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ConfigError, match=rf"RFModelConfig: unknown argument '{name}'"):
        RFModelConfig(model_name="tiny", **kwargs)
    # RapidFire AI's own fields stay accepted
    RFModelConfig(model_name="tiny", num_gpus=1, tokenizer="tiny")
