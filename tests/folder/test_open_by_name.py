"""``Experiment.open`` finds a folder by the name the constructor takes, and an Experiment whose
first run_fit was refused does not describe the folder of another experiment as its own."""

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model


def group():
    return RFGridSearch(RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-2, 2e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False)), trainer_type="SFT")


def test_open_takes_the_name_resume_takes_and_a_refused_run_fit_counts_no_one_elses_runs(
        tmp_path, tiny_data, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train, evald = tiny_data
    exp = Experiment("named", tracking=[])             # ./rapidfire_experiments/named
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, sample_prompts=[], block=True)
    exp.end()

    by_name = Experiment.open("named")
    resumed = Experiment("named", resume=True, tracking=[])
    assert by_name.path.resolve() == resumed.path.resolve() == exp.path.resolve()
    assert list(by_name.get_runs_info().status) == ["completed", "completed"]
    assert "2 runs (2 completed)" in repr(by_name) and "2 runs (2 completed)" in repr(resumed)
    resumed.end()
    # the path forms still mean what they say, and a name with experiment_path looks there
    assert Experiment.open(exp.path).path.resolve() == exp.path.resolve()
    assert Experiment.open("rapidfire_experiments/named").path.resolve() == exp.path.resolve()
    assert Experiment.open("named", tmp_path / "rapidfire_experiments").path.resolve() == exp.path.resolve()

    # a new experiment of the same name (named_2) whose first run_fit is refused gives its folder
    # back: its repr must not count the runs of ./rapidfire_experiments/named as its own
    fresh = Experiment("named", tracking=[])
    assert fresh.name == "named_2"
    try:
        fresh.run_fit(group(), tiny_create_model, train.remove_columns(["completion"]), evald, num_chunks=2)
    except Exception as refused:
        assert "completion" in str(refused)
    else:
        raise AssertionError("run_fit should refuse a dataset without completions")
    text = repr(fresh)
    assert "0 runs" not in text and "2 runs" not in text and "no runs, no folder yet" in text, text
    # and the fixed run_fit still trains, in a folder of its own
    fresh.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, sample_prompts=[], block=True)
    assert fresh.name == "named_2" and "2 runs (2 completed)" in repr(fresh)
    fresh.end()
