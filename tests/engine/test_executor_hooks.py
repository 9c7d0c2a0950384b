"""The executor's lifecycle hooks: the one engine calls them in the order their docstrings promise,
with the kernel's executor (the reference implementation) underneath, training for real.

The Ray executor lives on the same hooks (its own tests train through real Ray workers, in
test_ray_workers.py); here a recording subclass of the local executor shows the engine's side of
the contract: ``prepare`` once before any run exists, ``open`` in the caller's thread before the
loop, ``begin`` once per loop in the engine thread, ``tick`` before every dispatch, ``leaving``
when nothing is left to train, ``failure`` for a run that fails, ``close`` once at the end.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine import controller
from rapidfire_nb.engine.executor import LocalChunkExecutor
from rapidfire_nb.engine.inputs import TrainingInputs

pytestmark = pytest.mark.slow   # trains two small runs


class _Recording(LocalChunkExecutor):
    calls: list = []

    def _note(self, name, engine=None):
        runs = len(engine.runs) if engine is not None else None
        self.calls.append((name, threading.current_thread().name, runs))

    def prepare(self, specs):
        self.calls.append(("prepare", threading.current_thread().name, len(specs)))
        super().prepare(specs)

    def open(self):
        self._note("open")
        super().open()

    def begin(self, engine):
        self._note("begin", engine)
        super().begin(engine)

    def tick(self, engine):
        self._note("tick", engine)
        return super().tick(engine)

    def leaving(self, engine):
        self._note("leaving", engine)
        super().leaving(engine)

    def failure(self, exc):
        self._note("failure")
        return super().failure(exc)

    def close(self):
        self._note("close")
        super().close()


def _group():
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-3, 2e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False))
    return RFGridSearch(cfg, trainer_type="SFT")


def test_the_engine_calls_the_executor_hooks_in_their_order(tmp_path, tiny_data, monkeypatch):
    monkeypatch.setattr(controller, "LocalChunkExecutor", _Recording)
    calls = _Recording.calls = []
    train, evald = tiny_data
    exp = Experiment("hooks", experiment_path=tmp_path)
    exp.run_fit(_group(), tiny_create_model, train, evald, num_chunks=2, seed=3, block=True)
    assert isinstance(exp.engine.executor, _Recording)
    names = [c[0] for c in calls]
    me = threading.current_thread().name
    # prepare: once, in the caller's thread, with both specs, before anything started
    assert names[0] == "prepare" and calls[0][1] == me and calls[0][2] == 2
    # open in the caller's thread, then the loop: begin in the engine thread with both runs made
    assert names[1] == "open" and calls[1][1] == me
    assert names[2] == "begin" and calls[2][1] == "rapidfire-engine" and calls[2][2] == 2
    chunks = sum(1 for ev in exp.events.since(0) if ev["type"] == "chunk_done")
    assert chunks == 4
    # a tick before every dispatch (and more: turns that collect, flush or apply ops)
    assert names.count("tick") >= chunks
    assert all(c[1] == "rapidfire-engine" for c in calls if c[0] in ("tick", "leaving"))
    assert names.index("leaving") > max(i for i, n in enumerate(names) if n == "tick")
    assert "close" not in names and "failure" not in names
    exp.end()
    after = [c[0] for c in calls]
    assert after.count("close") == 1 and after[-1] == "close"


def test_a_run_that_fails_reads_as_its_executor_says(tmp_path, tiny_data, monkeypatch):
    """The run's reason and error come from ``failure``: the kernel's reads the exception."""
    monkeypatch.setattr(controller, "LocalChunkExecutor", _Recording)
    calls = _Recording.calls = []
    train, evald = tiny_data

    # a LoRA config PEFT refuses when the run's adapter is injected: its trainer fails to build
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                 layers_to_transform=[99]),
        training_args=RFSFTConfig(learning_rate=1e-3, per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False))
    exp = Experiment("hooks-fail", experiment_path=tmp_path)
    exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald,
                num_chunks=2, seed=3, block=True)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "failed"
    assert [c[0] for c in calls].count("failure") == 1
    failed = [ev for ev in exp.events.since(0) if ev["type"] == "run_status" and ev["status"] == "failed"]
    assert len(failed) == 1 and "layers_to_transform" in failed[0]["error"]
    # the kernel's reading: "Type: message" as the reason, the whole traceback as the error
    kind = failed[0]["reason"].split(":")[0]
    assert kind.isidentifier() and kind in failed[0]["error"]
    assert failed[0]["error"].startswith("Traceback (most recent call last)")
    exp.end()


def test_training_inputs_are_one_frozen_value_a_worker_gets_without_its_data(tiny_data):
    train, evald = tiny_data
    cache: dict = {}
    inputs = TrainingInputs(tiny_create_model, train, evald, 4, 7, build_args=print, build_lora=repr,
                            offload="never", prep_cache=cache, sample_prompts=[("hi", None)])
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.seed = 8
    sent = inputs.without_data()
    assert (sent.create_model, sent.train_dataset, sent.eval_dataset) == (None, None, None)
    assert sent.prep_cache == {} and sent.prep_cache is not cache
    assert (sent.num_chunks, sent.seed, sent.offload, sent.sample_prompts) == (4, 7, "never", [("hi", None)])
    back = sent.with_data(tiny_create_model, train, evald)
    assert back.create_model is tiny_create_model and back.train_dataset is train
    assert back == dataclasses.replace(inputs, prep_cache={})
