"""What a chunk costs the host beyond its steps: host syncs counted against TRL's own Trainer, and
the chunk boundary's host buffers reused instead of allocated per chunk.

On a GPU a LoRA step of a 1B model is launch-bound: a host sync (``.item()``, ``.cpu()``, a
device-to-host copy) stalls the kernel queue, and a fresh pinned allocation per boundary costs more
than the copy it serves. Neither shows in CPU wall time, so these tests count instead of timing:
calls of the syncing tensor methods on the training thread (and on the checkpoint writer's, which
must make none on live state), and the data pointers of the snapshot and parking buffers."""

from __future__ import annotations

import collections
import os
import threading

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig, List
from rapidfire_nb.demo_data import tiny_create_model

# methods whose call waits for the device (on a GPU) or copies device memory to the host
SYNCING = ("item", "cpu", "tolist", "numpy", "__float__", "__int__")


class SyncCounter:
    """Counts calls of ``SYNCING`` tensor methods, ``Tensor.to``/``copy_`` that bring device
    memory to the host, and ``torch.cuda.synchronize``, per thread, while ``on``."""

    def __init__(self, monkeypatch):
        self.on = False
        self.counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
        self.names: dict[int, str] = {}
        for name in SYNCING:
            self._wrap(monkeypatch, torch.Tensor, name, name)
        real_to, real_copy = torch.Tensor.to, torch.Tensor.copy_

        def to(t, *args, **kwargs):
            out = real_to(t, *args, **kwargs)
            if out.device.type == "cpu" and t.device.type != "cpu":
                self._note("to(host)")
            return out

        def copy_(t, src, *args, **kwargs):
            if t.device.type == "cpu" and src.device.type != "cpu":
                self._note("copy_(host)")
            return real_copy(t, src, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        self._wrap(monkeypatch, torch.cuda, "synchronize", "cuda.synchronize")

    def _wrap(self, monkeypatch, owner, attr: str, label: str) -> None:
        real = getattr(owner, attr)

        def counted(*args, **kwargs):
            self._note(label)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, attr, counted)

    def _note(self, label: str) -> None:
        if self.on:
            me = threading.current_thread()
            self.counts[me.ident][label] += 1
            self.names[me.ident] = me.name

    def of_thread(self, name: str) -> collections.Counter:
        total: collections.Counter = collections.Counter()
        for ident, c in self.counts.items():
            if self.names[ident] == name:
                total += c
        return total


def one_run(lr: float = 1e-3):
    lora = RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    args = RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1,
                       max_length=64, lr_scheduler_type="linear", bf16=False)
    return RFGridSearch(RFModelConfig(model_name="tiny", peft_config=lora, training_args=args),
                        trainer_type="SFT")


def _trl_counts(counter: SyncCounter, spec, train, out_dir: str) -> tuple[collections.Counter, int]:
    """TRL's own ``SFTTrainer.train()`` on the same run, logging every step as the engine does."""
    from peft import get_peft_model
    from trl import SFTTrainer

    from rapidfire_nb import automl

    model, tok = tiny_create_model({"model_name": "tiny"})
    args = automl.build_training_args(
        spec, output_dir=out_dir, seed=3, report_to="none", save_strategy="no",
        logging_strategy="steps", logging_steps=1, disable_tqdm=True, eval_strategy="no")
    trainer = SFTTrainer(model=get_peft_model(model, automl.build_lora_config(spec)), args=args,
                         train_dataset=train, processing_class=tok)
    counter.on = True
    try:
        result = trainer.train()
    finally:
        counter.on = False
    return counter.of_thread(threading.current_thread().name), int(result.global_step)


@pytest.mark.slow
def test_a_chunk_makes_no_more_host_syncs_than_trls_own_loop(tiny_data, tmp_path, monkeypatch):
    from rapidfire_nb.engine.executor import LocalChunkExecutor

    train, _ = tiny_data
    train = train.select(range(32))      # 8 steps of 4 rows: 4 chunks of 2 steps
    counter = SyncCounter(monkeypatch)
    chunks = []
    real_chunk, real_build = LocalChunkExecutor.train_chunk, LocalChunkExecutor._trainer_for

    def train_chunk(self, rec):
        # the chunk: swap, steps, snapshot; not the trainer's build, which TRL does before train()
        counter.on = True
        try:
            return real_chunk(self, rec)
        finally:
            counter.on = False
            chunks.append(threading.current_thread().name)

    def trainer_for(self, rec, restored):
        was, counter.on = counter.on, False
        try:
            return real_build(self, rec, restored)
        finally:
            counter.on = was

    monkeypatch.setattr(LocalChunkExecutor, "train_chunk", train_chunk)
    monkeypatch.setattr(LocalChunkExecutor, "_trainer_for", trainer_for)
    exp = Experiment("sync-audit", experiment_path=tmp_path, tracking=[])
    exp.run_fit(one_run(), tiny_create_model, train, None, num_chunks=4, seed=3, block=True)
    steps = int(exp.get_runs_info()["completed_steps"].sum())
    exp.end()
    assert len(chunks) == 4 and steps == 8
    engine = counter.of_thread(chunks[0])
    writer = counter.of_thread("rapidfire-ckpt-writer")
    counter.counts.clear()
    spec = one_run().expand()[0]
    trl, trl_steps = _trl_counts(counter, spec, train, os.fspath(tmp_path / "trl"))
    assert trl_steps == steps
    # every counted call is one wait for the device on a GPU: the engine's chunks (their
    # boundaries included) make no more than TRL's own loop over the same steps
    assert sum(engine.values()) <= sum(trl.values()), (
        f"over {steps} steps the engine's chunks made {dict(engine)}, TRL's own loop {dict(trl)}")
    assert not engine["cpu"] and not engine["numpy"] and not engine["to(host)"], dict(engine)
    # the writer writes the snapshot's host buffers as they are: it never reads a tensor back
    assert not writer - collections.Counter(numpy=writer["numpy"]), dict(writer)


@pytest.mark.slow
@pytest.mark.parametrize("offload", ["auto", "always"])
def test_the_chunk_boundary_reuses_its_host_buffers(tiny_data, tmp_path, monkeypatch, offload):
    """The boundary snapshots go through two host buffers shared by the runs, each made once, and
    a run parked between chunks reuses its one parking buffer: nothing is allocated per chunk."""
    from rapidfire_nb.engine.adapters.base import RunTrainer
    from rapidfire_nb.engine.persistence import Persistence

    snapshots: dict[int, list] = collections.defaultdict(list)
    parks: dict[int, list] = collections.defaultdict(list)
    real_submit, real_park = Persistence.submit_chunk, RunTrainer.park

    def submit_chunk(self, rec, state, *args, **kwargs):
        snapshots[rec.run_id].append((state.cache.file.data_ptr(), state.cache.allocations))
        return real_submit(self, rec, state, *args, **kwargs)

    def park(self, host):
        moved = real_park(self, host)
        views = self._park_buffer.views
        parks[self.record.run_id].append((self._park_buffer.allocations,
                                          tuple(v.data_ptr() for v in views)))
        return moved

    monkeypatch.setattr(Persistence, "submit_chunk", submit_chunk)
    monkeypatch.setattr(RunTrainer, "park", park)
    lora = RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    # three runs: a run whose checkpoint is being written stays where it is, so with two the
    # other one would never be free to park
    args = RFSFTConfig(learning_rate=List([1e-3, 3e-3, 1e-2]), per_device_train_batch_size=4,
                       num_train_epochs=1, max_length=64, bf16=False)
    group = RFGridSearch(RFModelConfig(model_name="tiny", peft_config=lora, training_args=args),
                         trainer_type="SFT")
    train, evald = tiny_data
    exp = Experiment(f"buffers-{offload}", experiment_path=tmp_path, tracking=[], offload=offload)
    exp.run_fit(group, tiny_create_model, train.select(range(32)), evald, num_chunks=4, seed=3,
                block=True)
    info = exp.get_runs_info()
    exp.end()
    assert set(info["status"]) == {"completed"}
    assert sorted(snapshots) == [1, 2, 3] and all(len(seen) == 4 for seen in snapshots.values())
    # one checkpoint is written at a time: two buffers, each made once, serve all 12 boundaries
    buffers = {ptr for seen in snapshots.values() for ptr, _ in seen}
    assert len(buffers) <= 2 and {n for seen in snapshots.values() for _, n in seen} == {1}, snapshots
    if offload == "always":
        assert sorted(parks) == [1, 2, 3] and all(len(p) >= 2 for p in parks.values()), parks
        for rid, seen in parks.items():
            assert len(set(seen)) == 1 and seen[0][0] == 1, f"run {rid}: parking buffers {seen}"
    else:
        assert not parks   # on a CPU "auto" never parks
