"""The checkpoint writer on its own: order, pending bookkeeping, flush, no thread when idle."""

import threading
import time

from rapidfire_nb.engine.writer import CheckpointWriter


def test_jobs_run_in_order_off_the_calling_thread_and_flush_waits_for_them():
    w = CheckpointWriter(name="t-writer")
    gate = threading.Event()
    done: list[tuple[int, str]] = []

    def job(i):
        def run():
            if i == 0:
                gate.wait(5)
            done.append((i, threading.current_thread().name))
        return run

    for i in range(5):
        w.submit(i % 2, job(i))
    assert w.busy() and w.pending(0) and w.pending(1)
    assert not w.flush(timeout=0.05), "flush must report the timeout while a job is blocked"
    assert done == []
    gate.set()
    assert w.flush(timeout=5)
    assert [i for i, _ in done] == [0, 1, 2, 3, 4]
    assert {name for _, name in done} == {"t-writer"}   # one worker thread, named as asked
    assert not w.busy() and not w.pending(0) and not w.pending(1)
    assert w.jobs_done == 5


def test_a_raising_job_does_not_kill_the_writer():
    w = CheckpointWriter()
    out = []
    w.submit(1, lambda: 1 / 0)
    w.submit(1, lambda: out.append("after"))
    assert w.flush(timeout=5)
    assert out == ["after"]
    assert len(w.errors) == 1 and "ZeroDivisionError" in w.errors[0]


def test_the_worker_leaves_when_idle_and_a_later_submit_starts_a_new_one():
    w = CheckpointWriter(name="t-idle")
    w.submit(1, lambda: None)
    assert w.flush(timeout=5)
    deadline = time.monotonic() + 5
    while any(t.name == "t-idle" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "t-idle" for t in threading.enumerate())
    ran = threading.Event()
    w.submit(2, ran.set)
    assert w.flush(timeout=5) and ran.is_set()


def test_flush_from_inside_a_job_returns_instead_of_waiting_on_itself():
    w = CheckpointWriter()
    out = []
    w.submit(1, lambda: out.append(w.flush(timeout=2)))
    assert w.flush(timeout=5)
    assert out == [True]


# -- the writer inside the engine ------------------------------------------------------------------
# Slow checkpoint writes (a spy that sleeps, then does the real write) open the windows where a
# chunk has ended but its checkpoint is not on disk yet.


import pytest  # noqa: E402

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig  # noqa: E402
from rapidfire_nb.demo_data import tiny_create_model  # noqa: E402
from rapidfire_nb.engine import fsio as fsio_mod  # noqa: E402
from rapidfire_nb.engine import store as store_mod  # noqa: E402
from rapidfire_nb.errors import RapidFireError  # noqa: E402


def three_runs():
    lora = RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    args = RFSFTConfig(learning_rate=List([1e-3, 3e-3, 1e-2]), per_device_train_batch_size=8,
                       num_train_epochs=1, bf16=False, max_length=64)
    return RFGridSearch(RFModelConfig(model_name="tiny", peft_config=lora, training_args=args),
                        trainer_type="SFT")


@pytest.fixture
def slow_writes(monkeypatch):
    real = store_mod.ExperimentStore.save_checkpoint

    def save_checkpoint(self, run_id, state):
        time.sleep(0.4)   # longer than one of these one-step chunks, even on a loaded machine
        return real(self, run_id, state)

    monkeypatch.setattr(store_mod.ExperimentStore, "save_checkpoint", save_checkpoint)


def test_runs_json_never_claims_a_chunk_whose_checkpoint_is_not_on_disk(tiny_data, tmp_path,
                                                                          slow_writes, monkeypatch):
    train, evald = tiny_data
    held_back: list[int] = []     # runs.json behind the live record: a chunk was in flight
    violations: list[str] = []
    real_write = fsio_mod.atomic_write_json
    holder: list = []

    def write_json(path, obj):
        if path.name == "runs.json" and holder:
            st = store_mod.ExperimentStore(path.parent)
            for rid, info in obj.items():
                ckpt = st.load_checkpoint(int(rid))
                durable = ckpt["counters"]["chunks_done"] if ckpt else 0
                if info["chunks_done"] > durable:
                    violations.append(f"run {rid}: runs.json says {info['chunks_done']} chunks, "
                                      f"its checkpoint {durable}")
                if holder[0].engine.runs[int(rid)].chunks_done > info["chunks_done"]:
                    held_back.append(int(rid))
        return real_write(path, obj)

    import rapidfire_nb.engine.persistence as persistence_mod
    monkeypatch.setattr(persistence_mod, "atomic_write_json", write_json)
    exp = Experiment("durable-runs-json", experiment_path=tmp_path, tracking=[])
    holder.append(exp)
    exp.run_fit(three_runs(), tiny_create_model, train.select(range(32)), evald, num_chunks=4, seed=3)
    assert set(exp.get_runs_info().status) == {"completed"}
    exp.end()
    assert not violations, violations
    # the windows were there: runs.json was written while some run's chunk was in flight
    assert held_back, "no runs.json write happened while a checkpoint was in flight"


def test_export_from_a_listener_while_a_checkpoint_is_in_flight(tiny_data, tmp_path, monkeypatch):
    """A listener runs in the thread that logs (here the engine's, holding its lock): export must
    not wait for the writer, and it returns the run's weights at its last chunk boundary."""
    import torch
    from safetensors.torch import load_file

    first_snapshot: dict = {}
    real = store_mod.ExperimentStore.save_checkpoint

    def save_checkpoint(self, run_id, state):
        if run_id == 1 and not first_snapshot:
            # copies: the state's tensors live in the run's snapshot buffers, reused at its next
            # chunk boundary
            first_snapshot.update({k: v.clone() for k, v in state["trainer"]["weights"].items()})
        time.sleep(0.15)
        return real(self, run_id, state)

    monkeypatch.setattr(store_mod.ExperimentStore, "save_checkpoint", save_checkpoint)
    train, evald = tiny_data
    exp = Experiment("export-in-listener", experiment_path=tmp_path, tracking=[])
    out: list = []

    def on_event(ev):
        if ev["type"] == "run_status" and ev["run_id"] == 2 and ev["status"] == "running" and not out:
            pending = exp.engine.persistence.writer.pending(1)
            try:
                out.append((pending, exp.export(1, tmp_path / "run1-adapter")))
            except Exception as exc:  # noqa: BLE001 - surfaced below
                out.append((pending, exc))

    exp.events.subscribe(on_event)
    exp.run_fit(three_runs(), tiny_create_model, train.select(range(32)), evald, num_chunks=4,
                seed=3, block=False)
    assert exp.wait(timeout=300), "the engine is stuck"
    exp.end()
    assert len(out) == 1
    pending, path = out[0]
    assert pending, "run 1's first checkpoint should still have been in flight"
    assert not isinstance(path, Exception), path
    exported = load_file(str(path / "adapter_model.safetensors"))
    expected = {k.replace(".run_1.", "."): v for k, v in first_snapshot.items()}
    assert exported.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(exported[k], v), f"{k}: not run 1's weights after its first chunk"


def test_wait_or_end_from_a_listener_is_refused_instead_of_hanging(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("wait-in-listener", experiment_path=tmp_path, tracking=[])
    seen: list = []

    def on_event(ev):
        if ev["type"] == "chunk_done" and len(seen) < 2:
            for call in (exp.wait, exp.end):
                try:
                    call()
                    seen.append("returned")
                except Exception as exc:  # noqa: BLE001 - surfaced below
                    seen.append(exc)

    exp.events.subscribe(on_event)
    exp.run_fit(three_runs(), tiny_create_model, train.select(range(16)), evald, num_chunks=2, seed=3)
    assert len(seen) == 2
    for exc in seen:
        assert isinstance(exc, RapidFireError) and "event listener" in str(exc)
    assert set(exp.get_runs_info().status) == {"completed"}
    exp.end()


def test_a_failure_to_log_a_written_chunk_fails_that_run_visibly(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("log-failure", experiment_path=tmp_path, tracking=[])
    real_extend = exp.events.extend
    failed_once: list = []

    def extend(items):
        items = list(items)
        if not failed_once and any(t == "chunk_done" and p["run_id"] == 2 for t, p in items):
            failed_once.append(True)
            raise OSError(28, "No space left on device")
        return real_extend(items)

    exp.events.extend = extend
    exp.run_fit(three_runs(), tiny_create_model, train.select(range(32)), evald, num_chunks=4, seed=3)
    info = exp.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed", "failed", "completed"], info.error.tolist()
    assert "No space left on device" in info.loc[2, "error"]
    # its checkpoint holds the chunk that could not be logged (a restart re-logs it from there)
    assert exp.store.load_checkpoint(2)["counters"]["chunks_done"] == 1
    exp.end()


def test_warnings_in_the_writer_thread_go_to_the_engine_log_not_the_cell(tiny_data, tmp_path, capfd):
    import warnings

    train, evald = tiny_data
    exp = Experiment("writer-warnings", experiment_path=tmp_path, tracking=[])
    where: list[str] = []

    def on_event(ev):
        if ev["type"] == "chunk_done" and not where:
            where.append(threading.current_thread().name)
            warnings.warn("rf-writer-thread-warning-7f3a", UserWarning, stacklevel=1)

    exp.events.subscribe(on_event)
    exp.run_fit(three_runs(), tiny_create_model, train.select(range(16)), evald, num_chunks=2, seed=3)
    exp.end()
    assert where == ["rapidfire-ckpt-writer"]
    out, err = capfd.readouterr()
    assert "rf-writer-thread-warning-7f3a" not in out + err
    assert "rf-writer-thread-warning-7f3a" in (exp.path / "logs" / "engine.log").read_text()


# -- the checkpoint file: flat buffers, and the files of earlier versions ----------------------------


def _run_like_state():
    """What a LoRA run's checkpoint holds: weights, Adam's state, schedule, RNG (numpy too)."""
    import torch

    from rapidfire_nb.engine.rng import capture_rng

    params = [torch.nn.Parameter(torch.randn(4, 8)) for _ in range(6)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    return {"trainer": {"weights": {f"layer.{i}.lora_A.run_1.weight": p for i, p in enumerate(params)},
                        "optimizer": opt.state_dict(), "scheduler": {"last_epoch": 3, "lr": [1e-3]},
                        "scaler": None, "rng": capture_rng(), "odd": float("nan")},
            "counters": {"completed_steps": 2, "chunk": 1}, "events": [("metric", {"loss": 1.5})],
            "chunk_event": {"run_id": 1, "text": "caf\u00e9 \"quoted\""}}


def _same(a, b) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.detach(), b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def test_a_flat_checkpoint_reads_back_exactly_and_older_files_still_load(tmp_path):
    """A chunk's checkpoint is a few flat buffers plus a JSON index (written from the run's reused
    snapshot buffer); a checkpoint of the earlier layout, one safetensors entry per tensor, in a
    folder made by an earlier version, loads the same."""
    from safetensors.torch import load

    from rapidfire_nb.engine.safeformat import SnapshotBuffers, encode, flat_snapshot

    state = _run_like_state()
    store = store_mod.ExperimentStore(tmp_path)
    buffers = SnapshotBuffers()
    flat = flat_snapshot(state, buffers)
    assert _same(state, dict(flat))           # the snapshot is the state, copied
    store.save_checkpoint(1, flat)
    stored = load(store.checkpoint_path(1).read_bytes())
    assert set(stored) == {"flat.float32", "flat.int64", "flat.uint8"}   # one buffer per dtype
    assert _same(state, store.load_checkpoint(1))
    # the same buffer at the next boundary, and the file still reads back what was current then
    state["counters"]["chunk"] = 2
    ptr = buffers.file.data_ptr()
    store.save_checkpoint(1, flat_snapshot(state, buffers))
    assert buffers.file.data_ptr() == ptr and buffers.allocations == 1
    assert store.load_checkpoint(1)["counters"]["chunk"] == 2
    # a file of the per-tensor layout, with its owner, as earlier versions wrote them
    store.checkpoint_path(1).write_bytes(encode(state, owner={"run_id": 1, "fingerprint": None}))
    assert len(load(store.checkpoint_path(1).read_bytes())) > 20
    assert _same(state, store.load_checkpoint(1))


@pytest.mark.parametrize("index, reason", [
    ('{"t0": ["float32", 0, [1000]]}', "does not fit a stored buffer"),
    ('{"t0": ["float64", 0, [2]]}', "does not fit a stored buffer"),
    ('{"t0": ["float32", -1, [2]]}', "does not fit a stored buffer"),
    ('{"t0": ["float32", 0, "2"]}', "does not fit a stored buffer"),
    ('[1]', "index is missing or damaged"),
])
def test_a_flat_checkpoint_with_a_damaged_index_is_refused(tmp_path, index, reason):
    import torch
    from safetensors.torch import save

    store = store_mod.ExperimentStore(tmp_path)
    path = store.checkpoint_path(1)
    path.parent.mkdir(parents=True)
    doc = '{"version": 2, "index": ' + index + ', "state": {"$t": "t0"}}'
    path.write_bytes(save({"flat.float32": torch.zeros(4)}, metadata={"rapidfire_state": doc}))
    with pytest.raises(store_mod.CheckpointReadError, match=reason):
        store.load_checkpoint(1)
