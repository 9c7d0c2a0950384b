"""Failure isolation and checkpoint write failures.

A run that fails — here a NaN loss at its second chunk from a real misconfiguration, a
formatting function that raises while the run's trainer is built, and a compute_metrics that
raises in the run's second evaluation — ends ``failed`` with its
traceback, its adapter leaves the shared model, and every other run ends bit-identical to an
experiment without it. A checkpoint write that dies mid-file (disk full) fails only that run,
leaves its previous checkpoint intact, and the run continues from that checkpoint on resume.
"""

from __future__ import annotations

import errno
import time

import crash_worker as W
import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import (
    List,
    RFGridSearch,
    RFLoraConfig,
    RFModelConfig,
    RFSFTConfig,
)
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.engine import fsio as fsio_mod
from rapidfire_nb.engine.events import EventLog

pytestmark = pytest.mark.slow   # slow tier: trains experiments whose runs fail

LORA = RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)


def sft(lr, **kw):
    args = dict(learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1, bf16=False,
                max_length=64)
    args.update(kw)
    return RFSFTConfig(**args)


def healthy_configs():
    return [RFModelConfig(model_name="tiny", peft_config=LORA, training_args=sft(lr)) for lr in (1e-3, 1e-2)]


def nan_at_second_chunk():
    # adam_epsilon=0: LoRA's A matrices get exactly zero gradient on the first step (B starts at
    # zero), so AdamW divides 0 by 0 and A becomes NaN; the next step's loss is NaN. With batch 8
    # on 24 rows and 3 chunks, each chunk of this run is one step: it fails at chunk 2.
    return RFModelConfig(model_name="tiny", peft_config=LORA,
                         training_args=sft(1e-3, adam_epsilon=0.0, per_device_train_batch_size=8))


def fails_while_building():
    # passes every check run_fit makes (its target modules exist in the base), then PEFT finds no
    # module to adapt while the run's adapter is added in the engine thread. (A formatting_func
    # can no longer fail there: it is called once per row in run_fit, as TRL calls it.)
    lora = RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, layers_to_transform=[99])
    return RFModelConfig(model_name="tiny", peft_config=lora, training_args=sft(1e-3))


def train_losses(exp, run_id):
    df = exp.get_results()
    sel = df[(df.run_id == run_id) & (df.metric == "loss")]
    return list(zip(sel.step, sel.value))


@pytest.fixture(scope="module")
def data():
    return make_demo_datasets(24, 8, seed=3)


@pytest.fixture(scope="module")
def without_failures(data, tmp_path_factory):
    exp = Experiment("healthy", experiment_path=tmp_path_factory.mktemp("h"), tracking=[])
    exp.run_fit(RFGridSearch(List(healthy_configs()), trainer_type="SFT"), tiny_create_model, *data,
                num_chunks=3, seed=5)
    out = {rid: exp.engine.run_weights(rid) for rid in (1, 2)}, {rid: train_losses(exp, rid) for rid in (1, 2)}
    exp.end()
    return out


def assert_bit_identical(exp, expected, run_ids=(1, 2)):
    weights, losses = expected
    for rid in run_ids:
        w = exp.engine.run_weights(rid)
        assert w.keys() == weights[rid].keys()
        for k in w:
            assert torch.equal(w[k], weights[rid][k]), f"run {rid}: {k}"
        assert train_losses(exp, rid) == losses[rid]


def test_run_failing_at_chunk_2_is_isolated(data, without_failures, tmp_path):
    configs = healthy_configs() + [nan_at_second_chunk()]
    exp = Experiment("with-nan", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List(configs), trainer_type="SFT"), tiny_create_model, *data,
                num_chunks=3, seed=5)
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed", "completed", "failed"]
    err = info.loc[3, "error"]
    assert err.startswith("Traceback (most recent call last)")
    assert "FloatingPointError: training loss is nan at step 2" in err
    assert info.loc[3, "chunks_done"] == 1, "the NaN run must fail in its second chunk"

    # the failure is in the log too, for the panel and trackers
    failed = [e for e in exp.events.since(0) if e["type"] == "run_status" and e["status"] == "failed"]
    assert [e["run_id"] for e in failed] == [3] and failed[0]["error"] == err

    # its memory is released: no trainer, no adapter left in the shared model
    base = next(iter(exp.engine.factory.bases.values()))
    assert 3 not in exp.engine.executor.trainers and "run_3" not in base.peft_model.peft_config

    # the others ended as if the failing run had never existed
    assert_bit_identical(exp, without_failures)
    exp.end()


def test_run_failing_while_its_trainer_is_built_is_isolated(data, without_failures, tmp_path):
    # its TrainingArguments reset accelerate's global state before the build failed: the next
    # healthy step must not go down with it
    configs = healthy_configs() + [fails_while_building()]
    exp = Experiment("with-bad-adapter", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List(configs), trainer_type="SFT"), tiny_create_model, *data,
                num_chunks=3, seed=5)
    info = exp.get_runs_info().set_index("run_id")
    err = info.loc[3, "error"]
    assert info.loc[3, "status"] == "failed" and info.loc[3, "chunks_done"] == 0
    assert "NoMatchingPeftModuleError" in err and "layers_to_transform" in err, err
    assert list(info.status) == ["completed", "completed", "failed"], info.error.tolist()
    assert_bit_identical(exp, without_failures)
    exp.end()


class MetricsFailOnSecondEval:
    """A compute_metrics that works once, then raises (a bug hit by the second chunk's outputs)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, pred):
        predictions, references = pred
        self.calls += 1
        if self.calls == 2:
            raise ValueError("references and predictions differ in length")
        return {"n": float(len(predictions))}


def test_run_failing_in_its_evaluation_is_isolated(data, without_failures, tmp_path):
    # generation-based eval runs in the middle of the shared model's life (left padding, eval
    # mode, RNG fork): a raise there must leave nothing behind for the other runs
    metrics = MetricsFailOnSecondEval()
    bad = RFModelConfig(model_name="tiny", peft_config=LORA, training_args=sft(1e-3),
                        compute_metrics=metrics, generation_config={"max_new_tokens": 3})
    exp = Experiment("with-bad-metrics", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List(healthy_configs() + [bad]), trainer_type="SFT"), tiny_create_model,
                *data, num_chunks=3, seed=5)
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed", "completed", "failed"], info.error.tolist()
    err = info.loc[3, "error"]
    assert "ValueError: references and predictions differ in length" in err and "__call__" in err
    assert metrics.calls == 2 and info.loc[3, "chunks_done"] == 1
    res = exp.get_results()
    assert list(res[(res.run_id == 3) & (res.metric == "eval_n")].value) == [8.0]
    assert_bit_identical(exp, without_failures)
    exp.end()


def test_validating_a_clone_during_training_breaks_no_run(data, without_failures, tmp_path):
    # building a TRL config resets accelerate's process-global state, which live trainers read
    exp = Experiment("validate-while-training", experiment_path=tmp_path, tracking=[])
    exp.run_fit(RFGridSearch(List(healthy_configs()), trainer_type="SFT"), tiny_create_model, *data,
                num_chunks=3, seed=5, block=False)
    validations = 0
    while exp.engine.busy():
        # what the panel's clone dialog does while the user edits a knob
        exp.validate_clone(1, {"training_args.learning_rate": 1e-4})
        validations += 1
        time.sleep(0.05)
    exp.wait()
    info = exp.get_runs_info()
    assert validations > 0
    assert list(info.status) == ["completed", "completed"], info.error.tolist()
    assert_bit_identical(exp, without_failures)
    exp.end()


# -- checkpoint write failures ------------------------------------------------------------------

class DiskFull:
    """A writer that fills half of the new file, then fails as a full disk does."""

    def __init__(self, run_id: int, nth: int):
        self.marker = f"run_{run_id}/.state.safetensors.tmp-"
        self.nth, self.calls, self.plain = nth, 0, fsio_mod._plain_write

    def __call__(self, f, data):
        if self.marker in f.name:
            self.calls += 1
            if self.calls == self.nth:
                f.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
        self.plain(f, data)


def test_checkpoint_write_failure_keeps_previous_checkpoint_and_resume_continues(tmp_path, monkeypatch):
    train, evald = W.make_data()
    disk_full = DiskFull(run_id=2, nth=2)
    monkeypatch.setattr(fsio_mod, "_plain_write", disk_full)
    exp = Experiment(W.NAME, experiment_path=tmp_path, tracking=[])
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    assert disk_full.calls == 2
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed", "failed", "completed"]
    # the chunk whose checkpoint failed does not count: run 2 stands where its checkpoint is
    assert info.loc[2, "chunks_done"] == 1 and info.loc[2, "completed_steps"] == 1
    err = info.loc[2, "error"]
    assert "CheckpointWriteError" in err and "No space left on device" in err
    assert "run 2" in err and "previous checkpoint is intact" in err

    # the previous (chunk 1) checkpoint is intact and loads; no half-written file is left
    ckpt = exp.store.load_checkpoint(2)
    assert ckpt["counters"]["chunks_done"] == 1 and ckpt["counters"]["completed_steps"] == 1
    assert not list(exp.path.rglob(".*.tmp-*"))
    logged_steps = sorted(e["step"] for e in exp.events.since(0)
                          if e["type"] == "metric" and e["run_id"] == 2 and e["split"] == "train")
    assert logged_steps == [1], "the chunk whose checkpoint failed must not be in the log"
    exp.end()
    monkeypatch.undo()  # the disk has space again

    again = Experiment(W.NAME, experiment_path=tmp_path, resume=True, tracking=[])
    again.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    info = again.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed"] * 3 and info.loc[2, "error"] is None
    resumed_weights = again.engine.run_weights(2)
    log = EventLog(again.store.events_path)
    steps = [(e["split"], e["step"]) for e in log.since(0) if e["type"] == "metric" and e["run_id"] == 2]
    log.close()
    again.end()
    assert sorted(steps) == sorted(set(steps)) and len(steps) == 12, steps

    # and it ends exactly where it would have without the failure: run 2's config alone
    alone = Experiment("alone", experiment_path=tmp_path, tracking=[])
    alone.run_fit(W.make_group().expand()[1:2], tiny_create_model, train, evald, **W.RUN_FIT_KW)
    ref = alone.engine.run_weights(1)
    alone.end()
    ren = {k.replace(".run_1.", ".run_2."): v for k, v in ref.items()}
    assert ren.keys() == resumed_weights.keys()
    for k, v in ren.items():
        assert torch.equal(resumed_weights[k], v), k
