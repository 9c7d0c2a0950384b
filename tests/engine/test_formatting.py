"""``formatting_func`` (engine/formatting.py): RapidFire's row mapper and TRL's string form are
called as their own libraries call them, no more, so a function that keeps state trains on the
same text as there."""

import datasets
from trl import SFTConfig, SFTTrainer

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_tiny_model_and_tokenizer, tiny_create_model


def numbered(calls: list, kind: str = "text"):
    """A formatting function that numbers the rows it is handed: each call gives the next number,
    so the text of every row says how many calls came before it."""
    def fmt(row):
        if kind == "text":
            calls.append(row["question"])
            return f"#{len(calls)} {row['question']}{row['answer']}"
        calls.append(row["prompt"])
        return {"prompt": f"#{len(calls)} {row['prompt']}", "completion": row["completion"]}
    return fmt


def qa(dataset):
    """Rows TRL's string form is for: columns SFTTrainer cannot read by itself (prompt-completion
    rows would turn on its completion-only loss, which refuses a formatting function)."""
    return dataset.rename_columns({"prompt": "question", "completion": "answer"})


def prepared_rows(dataset) -> list:
    cols = [c for c in ("input_ids", "completion_mask", "labels", "text", "prompt") if c in dataset.column_names]
    return [{c: row[c] for c in cols} for row in dataset]


def test_a_stateful_text_formatting_func_trains_on_the_text_plain_trl_gives_it(tmp_path, tiny_data):
    train, evald = (qa(d) for d in tiny_data)
    trl_calls: list = []
    model, tok = make_tiny_model_and_tokenizer()
    plain = SFTTrainer(model=model, processing_class=tok, train_dataset=train, eval_dataset=evald,
                       formatting_func=numbered(trl_calls),
                       args=SFTConfig(output_dir=str(tmp_path / "trl"), max_length=64, bf16=False, use_cpu=True,
                                      report_to="none", per_device_train_batch_size=8))
    assert len(trl_calls) == len(train) + len(evald)

    calls: list = []
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                        formatting_func=numbered(calls),
                        training_args=RFSFTConfig(learning_rate=List([1e-2, 3e-2]), per_device_train_batch_size=8,
                                                  num_train_epochs=1, max_length=64, bf16=False))
    exp = Experiment("fmt", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2, seed=1)
    assert set(exp.get_runs_info().status) == {"completed"}
    # the same calls, on the same rows, in the same order: train rows, then eval rows, once each
    # (two runs share the prepared data, as two plain trainers each would make it)
    assert calls == trl_calls
    # SFTTrainer's prepared data, as the engine keeps it for its runs: (source, prepared) by a key
    # whose fifth item is TRL's dataset name
    prepared = {key[4]: value[1] for key, value in exp.engine.inputs.prep_cache.items()
                if isinstance(key, tuple) and len(key) == 6 and len(value) == 2
                and isinstance(value[1], datasets.Dataset)}
    assert prepared_rows(prepared["train"]) == prepared_rows(plain.train_dataset)
    assert prepared_rows(prepared["eval"]) == prepared_rows(plain.eval_dataset)
    assert prepared_rows(prepared["train"])[0]["input_ids"] == tok("#1 " + train[0]["question"] + train[0]["answer"]
                                                               + tok.eos_token)["input_ids"]
    exp.end()


def test_a_row_mapper_is_called_once_per_row(tmp_path, tiny_data):
    train, evald = tiny_data
    calls: list = []
    cfg = RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                        formatting_func=numbered(calls, kind="rows"),
                        training_args=RFSFTConfig(learning_rate=1e-2, per_device_train_batch_size=8,
                                                  num_train_epochs=1, max_length=64, bf16=False))
    exp = Experiment("rows", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald, num_chunks=2, seed=1)
    assert set(exp.get_runs_info().status) == {"completed"}
    assert calls == list(train["prompt"]) + list(evald["prompt"])
    exp.end()
