"""RapidFire AI 0.16.2 code as written: num_shards/num_gpus/monte_carlo_simulations, every Range
argument, RFOptuna(granularity="shard", build_all_indexes=...); compute_metrics on SFT data in
plain-text forms (with and without generation_config); the compat names and paths; the
constructor's positional mode and num_cpus/num_gpus, cancel_current, save_strategy="chunk",
transformers 4's fsdp_transformer_layer_cls_to_wrap, rapidfireai.utils.notebook_ui and
RapidFire's TensorBoard folder."""

from __future__ import annotations

import json
import math
import os
import random
import warnings
from pathlib import Path

import pytest
from datasets import Dataset

from helpers import LR_A, LR_B, on_chunk_done, ops_group
from rapidfire_nb import Experiment
from rapidfire_nb.automl import (List, Range, RFGridSearch, RFLoraConfig, RFModelConfig, RFOptuna,
                                 RFRandomSearch, RFSFTConfig)
from rapidfire_nb.demo_data import make_tiny_model_and_tokenizer, tiny_create_model
from rapidfire_nb.errors import ConfigError, RapidFireConfigWarning, RapidFireError

pytestmark = pytest.mark.slow   # slow tier: trains RapidFire 0.16.2 code as written


def create_model(model_config):
    return make_tiny_model_and_tokenizer()


def rows(n, form, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        w = rng.choice(["cat", "dog", "owl", "bee"])
        q, a = f"name a {w} {i}", f"a {w} it is"
        out.append({"text": {"text": f"Question: {q}\nAnswer: {a}", "response": a},
                    "instruction": {"instruction": q, "response": a},
                    "input": {"input": q, "output": a},
                    "user": {"user": q, "assistant": a}}[form])
    return Dataset.from_list(out)


def sft(**kw):
    base = dict(learning_rate=1e-3, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                max_steps=2)
    base.update(kw)
    return RFSFTConfig(**base)


# -- 0.16.2 keywords ------------------------------------------------------------------------------

def test_range_arguments_have_rapidfires_meanings():
    r = Range(8, 64, step=8)
    assert r.values() == [8, 16, 24, 32, 40, 48, 56, 64] and r.num_values() == 8
    f = Range(0.0, 0.3, step=0.1)
    assert f.values() == [0.0, 0.1, 0.2, 0.3]
    rng = random.Random(0)
    assert all(f.sample(rng) in f.values() for _ in range(50))
    odd = Range(1, 10, step=4)          # the last multiple below end is the top
    assert odd.values() == [1, 5, 9] and odd.top == 9
    with pytest.raises(ConfigError, match="mutually exclusive"):
        Range(1e-4, 1e-3, log=True, step=1e-4)
    with pytest.raises(ConfigError, match="sample_n"):
        Range(1, 4, sample_n=0)
    with pytest.raises(ConfigError, match="integer step"):
        Range(1, 4, dtype="int", step=0.5)
    # seed: the range's own generator; sample(n) draws n distinct sorted values, sample_n by default
    a = Range(1e-4, 1e-3, log=True, seed=3)
    b = Range(1e-4, 1e-3, log=True, seed=3)
    drawn = a.sample(4)
    assert drawn == b.sample(4) and len(drawn) == 4 == len(set(drawn))
    assert drawn == sorted(drawn) and all(1e-4 <= v <= 1e-3 for v in drawn)
    assert a.sample(4) != drawn          # every call draws afresh from the generator, as RapidFire's
    assert len(Range(0.0, 1.0, sample_n=5, seed=1).sample()) == 5
    assert Range(1, 2, dtype="int", seed=0).sample(5) == [1, 2]     # only two distinct values
    c = Range(0.0, 1.0, seed=7)
    first = c.sample(2)
    c.set_seed(7)
    assert c.sample(2) == first
    assert Range(0.0, 1.0, dtype="float", seed=1) == Range(0.0, 1.0)   # the seed is not the space


def test_random_search_with_stepped_and_seeded_ranges_draws_on_the_grid():
    cfg = RFModelConfig(model_name="m", peft_config=RFLoraConfig(r=Range(8, 32, step=8)),
                        training_args=sft(learning_rate=Range(1e-4, 1e-3, log=True, seed=3)))
    specs = RFRandomSearch(cfg, trainer_type="SFT", num_runs=4, seed=5).expand()
    rs = [s.peft_config["r"] for s in specs]
    assert set(rs) <= {8, 16, 24, 32}
    again = RFRandomSearch(cfg, trainer_type="SFT", num_runs=4, seed=5).expand()
    assert [s.knobs for s in specs] == [s.knobs for s in again]


def test_rfoptuna_takes_granularity_shard_and_build_all_indexes():
    pytest.importorskip("optuna")
    cfg = RFModelConfig(model_name="m", training_args=sft(learning_rate=Range(1e-4, 1e-3, log=True),
                                                           per_device_train_batch_size=Range(2, 8, step=2)))
    g = RFOptuna(cfg, trainer_type="SFT", n_initial=3, budget=4, granularity="shard",
                 build_all_indexes=True)
    assert g.pruning.granularity == "chunk" and g.build_all_indexes is True
    assert RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=2, build_all_indexes=False).build_all_indexes is False
    specs = g.expand()
    assert {s.training_args["per_device_train_batch_size"] for s in specs} <= {2, 4, 6, 8}
    assert RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=2, granularity="epoch").pruning.granularity == "epoch"
    with pytest.raises(ConfigError, match="granularity"):
        RFOptuna(cfg, trainer_type="SFT", granularity="round")
    with pytest.raises(ConfigError, match="build_all_indexes"):
        RFOptuna(cfg, trainer_type="SFT", build_all_indexes="yes")
    # RapidFire takes max(budget, n_initial); so does this, and says so
    with pytest.warns(RapidFireConfigWarning, match=r"budget \(2\) is below n_initial \(5\).*= 5 trials"):
        small = RFOptuna(cfg, trainer_type="SFT", n_initial=5, budget=2)
    assert small.budget == 5 and small.n_initial == 5


def test_run_fit_with_0162_keywords(tmp_path):
    train, evald = rows(16, "text"), rows(4, "text", seed=1)
    group = RFGridSearch(RFModelConfig(model_name="tiny", training_args=sft(
        learning_rate=List([1e-3, 1e-4]), max_steps=4)), trainer_type="SFT")   # one epoch: 4 steps
    exp = Experiment("kw", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match="num_shards is RapidFire AI 0.16.2's name"):
        exp.run_fit(group, create_model, train, evald, num_chunks=2, num_shards=2)
    with pytest.raises(ConfigError, match="num_shards must be an integer"):
        exp.run_fit(group, create_model, train, evald, num_shards=0)
    with pytest.raises(ConfigError, match="num_gpus"):
        exp.run_fit(group, create_model, train, evald, num_shards=2, num_gpus=0)
    assert exp.engine is None     # refused before anything started
    exp.run_fit(group, create_model, train, evald, num_shards=2, seed=42, num_gpus=1,
                monte_carlo_simulations=1000)
    exp.end()
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"} and set(info.chunks_done) == {2}
    assert json.loads((exp.path / "experiment.json").read_text())["num_chunks"] == 2


def test_num_gpus_above_one_without_fsdp_is_refused_as_in_0162(tmp_path):
    # RapidFire AI 0.16.2: more than one GPU per run is FSDP, and needs its settings
    train = rows(8, "text")
    group = RFGridSearch(RFModelConfig(model_name="tiny", training_args=sft(max_steps=1)), trainer_type="SFT")
    exp = Experiment("gpus", experiment_path=tmp_path)
    with pytest.raises(ConfigError, match=r"num_gpus=2 without FSDP settings"):
        exp.run_fit(group, create_model, train, None, num_shards=1, num_gpus=2)
    assert exp.engine is None


# -- compute_metrics on plain-text SFT data -------------------------------------------------------

def overlap(eval_preds):
    predictions, labels = eval_preds
    assert all(isinstance(p, str) for p in predictions) and all(isinstance(r, str) for r in labels)
    return {"word_overlap": sum(len(set(p.split()) & set(r.split())) for p, r in zip(predictions, labels))}


def token_accuracy(eval_pred):
    import numpy as np

    logits, labels = eval_pred.predictions, eval_pred.label_ids
    pred = np.argmax(logits[:, :-1], axis=-1)
    gold = labels[:, 1:]
    mask = gold != -100
    return {"next_token_accuracy": float((pred[mask] == gold[mask]).mean())}


def to_text(row):          # the user/assistant form needs a formatting_func to train at all
    return {"text": f"User: {row['user']}\nAssistant: {row['assistant']}"}


def to_text_from_instruction(row):
    return {"text": f"Question: {row['instruction']}\nAnswer: {row['response']}"}


def to_text_from_input(row):
    return {"text": f"Question: {row['input']}\nAnswer: {row['output']}"}


FORMS = {"text": None, "instruction": to_text_from_instruction, "input": to_text_from_input, "user": to_text}


@pytest.mark.parametrize("form", list(FORMS))
def test_sft_compute_metrics_on_plain_text_forms(form, tmp_path):
    """Both of RapidFire's meanings on each form: generations scored against the references it
    finds (generation_config given) and the Trainer's compute_metrics on logits (none given)."""
    train, evald = rows(8, form), rows(4, form, seed=1)
    configs = List([
        RFModelConfig(model_name="tiny", training_args=sft(), formatting_func=FORMS[form],
                      compute_metrics=overlap,
                      # with the prompt settings RapidFire 0.16.2 reads from generation_config
                      generation_config={"max_new_tokens": 3, "max_input_length": 256,
                                         "truncation_side": "left", "add_generation_prompt": True}),
        RFModelConfig(model_name="tiny", training_args=sft(), formatting_func=FORMS[form],
                      compute_metrics=token_accuracy)])
    exp = Experiment(f"metrics-{form}", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(configs, trainer_type="SFT"), create_model, train, evald, num_chunks=2)
    exp.end()
    info = exp.get_runs_info()
    assert set(info.status) == {"completed"}, info.error.tolist()
    res = exp.get_results()
    gen = res[(res.run_id == 1) & (res.metric == "eval_word_overlap")]
    acc = res[(res.run_id == 2) & (res.metric == "eval_next_token_accuracy")]
    assert len(gen) == 2 and len(acc) == 2                     # after each of the 2 chunks
    assert all(0.0 <= v <= 1.0 for v in acc.value)
    assert not len(res[(res.run_id == 2) & (res.metric == "eval_word_overlap")])


def test_formatting_func_keeps_the_original_columns_for_metrics(tmp_path):
    seen = []

    def fmt(row):
        return {"prompt": [{"role": "user", "content": row["instruction"]}],
                "completion": [{"role": "assistant", "content": row["response"]}]}

    def metric(eval_preds):
        seen.append(list(eval_preds[1]))
        return {"n": len(eval_preds[0])}

    from rapidfire_nb.engine.formatting import formatted
    from rapidfire_nb.engine.runspec import RunSpec

    data = rows(4, "instruction")
    spec = RunSpec(model_name="tiny", trainer_type="SFT", formatting_func=fmt)
    out = formatted(spec, data, {}, "train_dataset")
    assert {"instruction", "response", "prompt", "completion"} <= set(out.column_names)
    exp = Experiment("keep", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(RFModelConfig(model_name="tiny", training_args=sft(max_steps=1), formatting_func=fmt,
                                           compute_metrics=metric, generation_config={"max_new_tokens": 2}),
                             trainer_type="SFT"), create_model, data, rows(2, "instruction", seed=1), num_chunks=1)
    exp.end()
    assert seen and all(r.startswith("a ") for r in seen[0])   # references: the response column


# -- report_to / run_name -----------------------------------------------------------------------

def test_report_to_and_run_name_are_warned_once(tmp_path):
    group = RFGridSearch(RFModelConfig(model_name="tiny", training_args=sft(
        max_steps=1, learning_rate=List([1e-3, 1e-4]), report_to=["wandb"], run_name="mine")), trainer_type="SFT")
    exp = Experiment("rep", experiment_path=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp.run_fit(group, create_model, rows(8, "text"), None, num_chunks=1, block=True)
    exp.end()
    msgs = [str(w.message) for w in caught if issubclass(w.category, RapidFireConfigWarning)]
    assert sum("report_to=['wandb']" in m and "not a tracker here" in m for m in msgs) == 1, msgs
    assert sum("run_name='mine' is not used" in m for m in msgs) == 1, msgs


# -- compat names and paths ---------------------------------------------------------------------

def test_compat_names_and_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from rapidfire_nb.compat import Experiment as CompatExperiment
    from rapidfire_nb.compat.automl import RFGridSearch as G
    from rapidfire_nb.compat.fit.db.rf_db import RfDb
    from rapidfire_nb.compat.fit.utils.interactive_controller import InteractiveController
    from rapidfire_nb.compat.utils.metric_rfmetric_manager import RFMetricLogger

    assert CompatExperiment is Experiment and G is RFGridSearch
    exp = Experiment(experiment_name="paths", mode="fit", tracking=["tensorboard"])
    assert exp.experiment_name == "paths"
    experiment_path = RfDb().get_experiments_path("paths")
    tensorboard_log_dir = f"{experiment_path}/tensorboard_logs/paths"
    group = RFGridSearch(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
                                       training_args=sft()), trainer_type="SFT")
    exp.run_fit(group, create_model, rows(8, "text"), rows(4, "text", seed=1), num_chunks=2)
    panel = InteractiveController(dispatcher_url="http://127.0.0.1:8851").display()
    assert panel is exp.panel()
    exp.end()
    from pathlib import Path

    tb = Path(tensorboard_log_dir)
    assert tb.is_dir() and any(tb.rglob("events.out.tfevents.*"))
    final = exp.path / "runs" / "1" / "checkpoints" / "final_checkpoint"
    state = json.loads((final / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and any("eval_loss" in h for h in state["log_history"])
    assert (final / "adapter_config.json").exists() and (final / "adapter_model.safetensors").exists()
    log = exp.get_log_file_path()
    assert log.exists() and json.loads(log.read_text().splitlines()[-1])["type"] == "experiment_end"
    training = exp.get_log_file_path("training")
    assert training == exp.path / "logs" / "engine.log" and training.exists()
    with pytest.raises(ConfigError, match="log_type"):
        exp.get_log_file_path("debug")
    metrics = RFMetricLogger(experiment=exp).get_run_metrics(1)
    assert [s for s, _ in metrics["eval_loss"]] == sorted(s for s, _ in metrics["eval_loss"]) and metrics["loss"]
    assert all(math.isfinite(v) for _, v in metrics["eval_loss"])
    monkeypatch.setenv("RF_TENSORBOARD_ENABLED", "true")
    assert list(RFMetricLogger.get_default_metric_loggers("paths")) == ["rf_tensorboard"]
    with pytest.raises(AttributeError, match="get_results"):
        RFMetricLogger().log_metric("1", "x", 1.0)


def test_unmapped_rapidfire_modules_say_what_to_use():
    with pytest.raises(ImportError, match="run_evals.*no equivalent"):
        import rapidfire_nb.compat.evals.experiment  # noqa: F401
    with pytest.raises(ImportError, match="no dispatcher server"):
        from rapidfire_nb.compat.fit.dispatcher import dispatcher  # noqa: F401
    with pytest.raises(ImportError, match="not mapped in rapidfire_nb.compat.*Porting RapidFire AI code"):
        import rapidfire_nb.compat.fit.ml.trainer  # noqa: F401


def test_trackio_show_command_names_the_directory(tmp_path, monkeypatch):
    from rapidfire_nb.tracking.trackio_tracker import show_command

    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    monkeypatch.delitem(__import__("sys").modules, "trackio", raising=False)
    cmd = show_command(tmp_path / "e", "proj")
    assert cmd == f"TRACKIO_DIR={(tmp_path / 'e' / 'trackio').resolve()} trackio show --project proj"
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "mine"))
    assert show_command(tmp_path / "e", "proj") is None


# -- review: 0.16.2 code as its users write it, and hostile values --------------------------------

def test_run_fit_positional_0162_call_and_numpy_integers(tmp_path):
    np = pytest.importorskip("numpy")
    train = rows(8, "text")
    group = RFGridSearch(RFModelConfig(model_name="tiny", training_args=sft(max_steps=2)), trainer_type="SFT")
    exp = Experiment("positional", experiment_path=tmp_path)
    # RapidFire 0.16.2's order: (param_config, create_model_fn, train, eval, num_shards, seed, num_gpus)
    with pytest.raises(ConfigError, match="block must be None, True or False, got 'yes'"):
        exp.run_fit(group, create_model, train, None, 2, 42, "yes")
    with pytest.raises(ConfigError, match="seventh positional argument .* num_gpus"):
        exp.run_fit(group, create_model, train, None, 2, 42, 1, num_gpus=2)
    with pytest.raises(ConfigError, match="num_gpus must be an integer >= 1, got 0"):
        exp.run_fit(group, create_model, train, None, 2, 42, 0)
    for bad in ("2", -1, 2.0, None):
        with pytest.raises(ConfigError, match=f"num_gpus must be an integer >= 1, got {bad!r}"):
            exp.run_fit(group, create_model, train, None, num_shards=2, num_gpus=bad)
    with pytest.raises(ConfigError, match="num_shards must be an integer >= 1, got '4'"):
        exp.run_fit(group, create_model, train, None, num_shards="4")
    assert exp.engine is None and not (exp.path / "runs.json").exists()   # refused, nothing started
    exp.run_fit(group, create_model, train, None, np.int64(2), 42, 1)
    exp.end()
    meta = json.loads((exp.path / "experiment.json").read_text())
    assert meta["num_chunks"] == 2 and list(exp.get_runs_info().chunks_done) == [2]


def test_range_takes_numpy_bounds_and_step():
    np = pytest.importorskip("numpy")
    r = Range(np.int64(8), np.int64(32), step=np.int64(8))
    assert r.dtype == "int" and r.values() == [8, 16, 24, 32] and type(r.start) is int
    assert Range(np.float32(0.0), 0.3, step=np.float64(0.1)).values() == [0.0, 0.1, 0.2, 0.3]
    for kw, what in ((dict(step=0), "step"), (dict(step=-2), "step"), (dict(dtype="str"), "dtype"),
                     (dict(sample_n=0), "sample_n"), (dict(seed="x"), "seed")):
        with pytest.raises(ConfigError, match=f"Range {what}"):
            Range(1, 10, **kw)
    with pytest.raises(ConfigError, match="Range start must be a finite number, got '1'"):
        Range("1", 10)


def test_rfoptuna_sampler_and_pruner_names_are_case_insensitive_as_in_rapidfire():
    pytest.importorskip("optuna")
    cfg = RFModelConfig(model_name="m", training_args=sft(learning_rate=Range(1e-4, 1e-3, log=True)))
    g = RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=2, sampler="TPE", pruner="Median")
    assert g.sampler == "tpe" and g.pruning.pruner == "median"
    with pytest.raises(ConfigError, match="sampler must be one of"):
        RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=2, sampler="Grid")


def test_compat_module_paths_and_bad_arguments(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import rapidfire_nb
    import rapidfire_nb.automl as ours
    from rapidfire_nb.compat import __version__
    from rapidfire_nb.compat.automl.datatypes import List as L
    from rapidfire_nb.compat.automl.datatypes import Range as R
    from rapidfire_nb.compat.automl.grid_search import RFGridSearch as G
    from rapidfire_nb.compat.automl.model_config import RFModelConfig as M
    from rapidfire_nb.compat.automl.model_config import RFSFTConfig as S
    from rapidfire_nb.compat.automl.random_search import RFRandomSearch as RS
    from rapidfire_nb.compat.experiment import Experiment as E
    from rapidfire_nb.compat.fit.db.rf_db import RfDb
    from rapidfire_nb.compat.utils.metric_rfmetric_manager import RFMetricLogger

    assert (L, R, G, M, S, RS, E) == (ours.List, ours.Range, ours.RFGridSearch, ours.RFModelConfig,
                                      ours.RFSFTConfig, ours.RFRandomSearch, Experiment)
    assert __version__ == rapidfire_nb.__version__
    with pytest.raises(ConfigError, match=r"experiment_name must be .* \(got None\)"):
        RfDb().get_experiments_path(None)
    assert not (tmp_path / "rapidfire_experiments").exists()
    exp = Experiment("m", experiment_path=tmp_path / "e")
    with pytest.raises(RapidFireError, match="run_id must be a run id .* got 'abc'"):
        RFMetricLogger(experiment=exp).get_run_metrics("abc")
    exp.end()
    with pytest.raises(ImportError, match="not mapped in rapidfire_nb.compat"):
        import rapidfire_nb.compat.automl.automl_utils  # noqa: F401


def test_final_checkpoint_is_written_by_end_and_export_still_refuses_the_folder(tmp_path):
    from rapidfire_nb.engine.export import ExportError

    group = RFGridSearch(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj"]),
                                       training_args=sft(max_steps=1)), trainer_type="SFT")
    exp = Experiment("final", experiment_path=tmp_path)
    exp.run_fit(group, create_model, rows(4, "text"), None, num_shards=1)
    exp.wait()
    with pytest.raises(ExportError, match="is the experiment folder itself"):
        exp.export(1, exp.path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)    # no "final checkpoint ... not written"
        exp.end()
    final = exp.final_checkpoint_path(1)
    assert (final / "adapter_model.safetensors").exists() and (final / "trainer_state.json").exists()


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- the constructor -----------------------------------------------------------------------------

def test_the_second_positional_argument_is_the_mode_as_in_0162(here):
    exp = Experiment("name", "fit")
    assert Path(exp.path).resolve() == (here / "rapidfire_experiments" / "name").resolve()
    assert not (here / "fit").exists()
    exp.end()


def test_num_cpus_and_num_gpus_are_accepted_and_mean_the_devices_to_use(here):
    exp = Experiment("name", mode="fit", num_cpus=2, num_gpus=1)
    assert exp.num_workers == 0 and exp.num_cpus == 2       # one device: this kernel's engine
    exp.end()
    exp = Experiment("positional", "fit", "elsewhere", 2, 0)   # 0.16.2's positional order
    assert Path(exp.path).resolve() == (here / "elsewhere" / "positional").resolve()
    assert exp.num_workers == 0
    exp.end()
    exp = Experiment("defaults", None, None, None, None)      # None anywhere: its default
    assert Path(exp.path).resolve() == (here / "rapidfire_experiments" / "defaults").resolve()
    exp.end()


def test_num_gpus_above_one_without_two_gpus_trains_here_and_says_why(here):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has several GPUs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exp = Experiment("two", num_gpus=2)
    assert exp.num_workers == 0
    assert any("num_gpus=2" in str(w.message) and "in this kernel" in str(w.message)
               for w in caught if issubclass(w.category, RapidFireConfigWarning))
    exp.end()


def test_a_path_as_second_positional_argument_is_still_the_parent_folder(here):
    exp = Experiment("p", Path("mine"))
    assert Path(exp.path).resolve() == (here / "mine" / "p").resolve()
    exp.end()
    exp = Experiment("s", "sub/dir")
    assert Path(exp.path).resolve() == (here / "sub" / "dir" / "s").resolve()
    exp.end()


@pytest.mark.parametrize("call, words", [
    (lambda: Experiment("x", "results"), "second positional argument is the mode"),
    (lambda: Experiment("x", "evals"), "evals/RAG mode has no equivalent"),
    (lambda: Experiment("x", num_gpus=-1), "num_gpus=-1"),
    (lambda: Experiment("x", num_gpus=1.5), "num_gpus=1.5"),
    (lambda: Experiment("x", num_cpus=0), "num_cpus=0"),
    (lambda: Experiment("x", num_gpus=1, num_workers=2), "give one of them"),
])
def test_bad_constructor_arguments_are_refused_by_name_and_make_no_folder(here, call, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()
    assert not (here / "rapidfire_experiments" / "x").exists()
    assert not (here / "results").exists()


def test_mode_given_twice_is_a_type_error(here):
    with pytest.raises(TypeError, match="mode given twice"):
        Experiment("x", "fit", mode="fit")


# -- RapidFire's TensorBoard folder ----------------------------------------------------------------

def test_every_experiment_has_rapidfires_tensorboard_folder_with_its_event_files(here, tiny_data, monkeypatch):
    monkeypatch.setenv("RF_TENSORBOARD_ENABLED", "true")
    train, evald = tiny_data
    exp = Experiment("tb")
    folder = here / "rapidfire_experiments" / "tensorboard_logs" / "tb"
    assert folder.is_dir()                          # from the moment it exists, no RfDb call
    exp.run_fit(ops_group(LR_A), tiny_create_model, train.select(range(16)), evald.select(range(4)),
                num_chunks=2, block=True)
    assert list(folder.rglob("events.out.tfevents.*"))
    exp.end()
    again = Experiment("tb")                        # a second one is tb_2, with its own folder
    assert (here / "rapidfire_experiments" / "tensorboard_logs" / again.name).is_dir()
    again.end()


def test_a_refused_first_run_fit_takes_the_tensorboard_folder_back_with_the_experiment_folder(here, tiny_data):
    train, evald = tiny_data
    exp = Experiment("refused")
    with pytest.raises(ConfigError):
        exp.run_fit(ops_group(LR_A), tiny_create_model, train, evald, num_chunks=0)
    assert not (here / "rapidfire_experiments" / "refused").exists()
    assert not os.path.lexists(here / "rapidfire_experiments" / "tensorboard_logs" / "refused")


def test_something_in_the_way_of_the_tensorboard_folder_is_left_alone_with_a_warning(here):
    parent = here / "rapidfire_experiments"
    parent.mkdir()
    (parent / "tensorboard_logs").write_text("a file of the user's")
    with pytest.warns(UserWarning, match="could not link"):
        exp = Experiment("blocked")
    assert (parent / "tensorboard_logs").read_text() == "a file of the user's"
    exp.end()
    (parent / "tensorboard_logs").unlink()
    (parent / "tensorboard_logs" / "other").mkdir(parents=True)   # a RapidFire folder of that name
    with pytest.warns(UserWarning, match="is not this experiment's TensorBoard folder"):
        exp = Experiment("other")
    assert not (parent / "tensorboard_logs" / "other").is_symlink()
    exp.end()


def test_a_file_in_the_way_of_the_experiments_own_tensorboard_folder_warns_on_resume(here):
    """A folder shared with a file named ``tensorboard`` in it: resume=True raised a bare
    FileExistsError while linking RapidFire's TensorBoard folder; it opens, with a warning, and
    the file is left as it was."""
    Experiment("shared").end()
    folder = here / "rapidfire_experiments" / "shared"
    (folder / "tensorboard").rmdir()
    (folder / "tensorboard").write_text("a file of the user's")
    with pytest.warns(UserWarning, match="could not make"):
        exp = Experiment("shared", resume=True)
    assert (folder / "tensorboard").read_text() == "a file of the user's"
    exp.end()


def test_a_tensorboard_logs_link_is_not_written_through(here, tmp_path):
    """A ``tensorboard_logs`` planted as a link to another folder: the experiment's link was made
    in that folder. Nothing is made through it; a warning says where TensorBoard's files are."""
    parent = here / "rapidfire_experiments"
    parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (parent / "tensorboard_logs").symlink_to(elsewhere, target_is_directory=True)
    with pytest.warns(UserWarning, match="tensorboard_logs is a symbolic link"):
        exp = Experiment("linked")
    assert list(elsewhere.iterdir()) == []
    exp.end()


# -- cancel_current ----------------------------------------------------------------------------------

def test_cancel_current_stops_every_run_of_the_fit_at_its_next_boundary(here, tiny_data):
    train, evald = tiny_data
    exp = Experiment("cancel")
    fired = on_chunk_done(exp, 1, 0, exp.cancel_current)
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=4, seed=5, block=True)
    assert fired == [True]
    info = exp.get_runs_info()
    assert list(info.status) == ["stopped", "stopped"]
    assert (info.completed_steps < info.total_steps).all()
    assert (info.chunks_done <= 2).all()             # the chunk in flight at most, then stopped
    exp.resume(1)                                     # still open, and resumable
    assert exp.wait(timeout=300)
    assert exp.get_runs_info().status.tolist() == ["completed", "stopped"]
    exp.end()


def test_cancel_current_ends_an_optuna_search_without_new_trials(here, tiny_data):
    pytest.importorskip("optuna")
    train, evald = tiny_data
    cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                        peft_config=RFLoraConfig(r=List([4, 8]), target_modules=["q_proj", "v_proj"]),
                        training_args=RFSFTConfig(learning_rate=Range(1e-4, 5e-2, log=True),
                                                  per_device_train_batch_size=8, max_length=64))
    group = RFOptuna(cfg, trainer_type="SFT", n_initial=2, budget=6, seed=3)
    exp = Experiment("cancel-optuna")
    fired = on_chunk_done(exp, 1, 0, exp.cancel_current)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, seed=3, block=True)
    assert fired == [True]
    info = exp.get_runs_info()
    assert list(info.run_id) == [1, 2] and set(info.status) == {"stopped"}, info
    # resuming one run trains that run alone: the search does not refill the slot of the
    # other (stopped) trial with a new one, as it would for a run stopped by hand
    exp.resume(1)
    assert exp.wait(timeout=300)
    info = exp.get_runs_info()
    assert list(info.run_id) == [1, 2] and list(info.status) == ["completed", "stopped"], info
    exp.end()


def test_cancel_current_with_nothing_training_says_so_and_changes_nothing(here, capsys):
    exp = Experiment("idle")
    assert exp.cancel_current() == []
    assert "nothing to cancel" in capsys.readouterr().out
    exp.end()


# -- knobs of RapidFire 0.16.x and transformers 4 ---------------------------------------------------

def test_save_strategy_chunk_means_the_engines_own_chunk_checkpoints(here, tiny_data):
    train, evald = tiny_data
    for value in ("chunk", "shard"):                 # 0.16.1's name, 0.16.2's
        cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
                            peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
                            training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=8,
                                                      max_steps=2, save_strategy=value))
        exp = Experiment(f"save-{value}")
        exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train.select(range(16)),
                    evald.select(range(4)), num_chunks=2, block=True)
        assert exp.get_runs_info().status.tolist() == ["completed"]
        assert list((Path(exp.path) / "checkpoints").rglob("*.safetensors"))
        exp.end()
    with pytest.raises(ConfigError, match="save_strategy"):
        RFSFTConfig(save_strategy="chunks")


def test_fsdp_transformer_layer_cls_to_wrap_becomes_the_fsdp_config_entry():
    from rapidfire_nb.engine.sharding import fsdp2_settings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = RFSFTConfig(fsdp="full_shard auto_wrap", fsdp_transformer_layer_cls_to_wrap="Qwen3DecoderLayer",
                          per_device_train_batch_size=2)
    assert any("fsdp_transformer_layer_cls_to_wrap" in str(w.message) for w in caught
               if issubclass(w.category, RapidFireConfigWarning))
    settings, _ = fsdp2_settings(cfg._knobs)
    assert settings["wrap"] == ["Qwen3DecoderLayer"] and settings["auto_wrap"]
    # beside a user's fsdp_config, whichever comes first, the class joins its list
    for kwargs in ({"fsdp_config": {"transformer_layer_cls_to_wrap": ["A"]},
                    "fsdp_transformer_layer_cls_to_wrap": "B"},
                   {"fsdp_transformer_layer_cls_to_wrap": "B",
                    "fsdp_config": {"transformer_layer_cls_to_wrap": ["A"]}}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            both = RFSFTConfig(fsdp="full_shard", **kwargs)
        assert fsdp2_settings(both._knobs)[0]["wrap"] == ["A", "B"]


def test_fsdp_transformer_layer_cls_to_wrap_none_is_its_default_and_odd_values_are_config_errors():
    """None is transformers 4's default (code that spells every knob passes it): nothing to
    wrap, as there. Anything but a name or a list of names is a ConfigError naming the knob,
    not a TypeError from inside the mapping."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = RFSFTConfig(fsdp_transformer_layer_cls_to_wrap=None, per_device_train_batch_size=2)
        assert "fsdp_config" not in cfg._knobs
        for value in (123, ["A", 3]):
            with pytest.raises(ConfigError, match="fsdp_transformer_layer_cls_to_wrap"):
                RFSFTConfig(fsdp_transformer_layer_cls_to_wrap=value)
        with pytest.raises(ConfigError, match="transformer_layer_cls_to_wrap'. is 5"):
            RFSFTConfig(fsdp_config={"transformer_layer_cls_to_wrap": 5},
                        fsdp_transformer_layer_cls_to_wrap="A")


def test_an_interrupt_outside_the_queued_cells_wait_still_frees_the_cells_queued_after_it():
    """Kernel > Interrupt can land before the wait itself (while the engine is asked whether it
    trains): IPython printed it as a failed callback, and the cells queued after kept waiting.
    It means what an interrupted wait means: this cell and the ones after run now."""
    import time
    import weakref
    from types import SimpleNamespace

    from rapidfire_nb import session

    def busy(timeout=None):
        raise KeyboardInterrupt

    class Queued(SimpleNamespace):   # weakly referenced, as the chain holds an Experiment
        pass

    exp = Queued(ended=False, name="q", engine=SimpleNamespace(busy=busy),
                 _interrupted_line=lambda: "interrupted the wait only")
    session._Cells.chain, session._Cells.last_end = weakref.ref(exp), time.monotonic()
    try:
        session._pre_run_cell()
    except KeyboardInterrupt:
        pytest.fail("the interrupt left the queued cell's hook")
    finally:
        chain, session._Cells.chain, session._Cells.last_end = session._Cells.chain, None, None
    assert chain is None


# -- rapidfireai.utils.notebook_ui ---------------------------------------------------------------------

def test_notebook_ui_and_end_button_import_from_rapidfires_path(here, tiny_data):
    from rapidfire_nb.compat.utils.notebook_ui import NotebookUI, end_experiment_button

    train, evald = tiny_data
    exp = Experiment("ui", mode="fit")
    panel = NotebookUI(mode="fit", dispatcher_url="http://127.0.0.1:8851").display()   # before run_fit
    assert panel.snapshot["experiment"] == exp.name
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=4, seed=5, block=False)
    button = end_experiment_button(exp)               # returns at once, the runs still train
    assert not exp.ended and exp.engine.busy(timeout=1)
    button.click()                                    # ends it: unfinished runs stopped, resumable
    assert button.wait(timeout=300) and exp.ended and button.error is None
    assert set(exp.get_runs_info().status) <= {"stopped", "completed"}
    assert button.button.disabled and button.button.description == "Ended"
    panel._refresh_snapshot()
    assert set(panel.snapshot["runs"]) == {"1", "2"}  # the panel shown before run_fit saw the runs
    with pytest.raises(ValueError, match="mode"):
        NotebookUI(mode="train")


def test_the_end_button_of_an_ended_experiment_says_so_and_without_one_is_refused(here):
    from rapidfire_nb.compat.utils.notebook_ui import end_experiment_button
    from rapidfire_nb.errors import RapidFireError

    exp = Experiment("ended", mode="fit")
    exp.end()
    button = end_experiment_button(exp)
    assert button.button.disabled and "has ended" in button.label.value
    button.click()                                    # nothing more to do, nothing raised
    assert button.wait(timeout=5) and button.error is None
    with pytest.raises(RapidFireError, match="no experiment is open"):
        end_experiment_button()
