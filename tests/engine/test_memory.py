"""Memory does not grow with finished or deleted runs.

Twenty LoRA runs pass through one experiment, at most four alive at a time: the others wait,
stopped before they ever start, and are resumed one by one as runs complete or are deleted after
their first chunk. Live tensor bytes (every torch
tensor reachable by the garbage collector, each storage counted once), live trainer objects,
adapters in the shared model and RSS are sampled at every chunk boundary.
"""

from __future__ import annotations

import gc
import time
import warnings

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
from rapidfire_nb.engine.hfstate import HF_STATE_LOCK
from rapidfire_nb.engine.adapters.base import RunTrainer

pytestmark = pytest.mark.slow   # slow tier: twenty runs through one experiment

TOTAL_RUNS = 20
ALIVE = 4
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def live_objects() -> tuple[int, int]:
    """(bytes of every live tensor's storage, each counted once; live RunTrainer objects)."""
    seen, total, trainers = set(), 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on some lazy module proxies warns
        for obj in gc.get_objects():
            if isinstance(obj, RunTrainer):
                trainers += 1
                continue
            try:
                if not isinstance(obj, torch.Tensor) or obj.device.type == "meta":
                    continue
                storage = obj.untyped_storage()
            except Exception:
                continue
            key = storage.data_ptr()
            if key and key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total, trainers


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def sample(exp, label: str) -> dict:
    base = next(iter(exp.engine.factory.bases.values()))
    adapters = len(base.peft_model.peft_config) if base.peft_model is not None else 0
    statuses = [(r.run_id, r.status) for r in exp.engine.snapshot().values()]
    # measure between steps with no checkpoint in flight: a step's activations and the writer's
    # snapshot copies are transients of the run training now, not memory that grows with runs
    exp.engine.persistence.writer.flush(timeout=60)
    with HF_STATE_LOCK:
        gc.collect()
        tensor_bytes, trainers = live_objects()
        # the boundary's reusable snapshot buffers (as many as checkpoint writes overlap, held in
        # tests/engine/test_boundary_audit.py) are the engine's, not a run's: left out of what must not grow
        pool = getattr(exp.engine.executor, "snapshot_pool", [])
        tensor_bytes -= sum(b.file.numel() * b.file.element_size() for _, b in pool if b.file is not None)
    return {"at": label, "tensor_bytes": tensor_bytes, "run_trainers": trainers,
            "adapters": adapters, "rss": rss_bytes(),
            "finished": {rid for rid, s in statuses if s in ("completed", "deleted", "failed")},
            "alive": sum(s in ("pending", "running") for _, s in statuses)}


def test_memory_does_not_grow_with_finished_or_deleted_runs(tmp_path):
    train, evald = make_demo_datasets(16, 4, seed=2)
    lora = RFLoraConfig(r=64, lora_alpha=64, target_modules=ALL_LINEAR)

    def sft(lr):
        # 4 steps in 2 chunks per run
        return RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4, num_train_epochs=1,
                           bf16=False, max_length=48)

    group = RFGridSearch(List([RFModelConfig(model_name="tiny", peft_config=lora, training_args=sft(lr))
                               for lr in [1e-4 * (i + 1) for i in range(TOTAL_RUNS)]]), trainer_type="SFT")
    exp = Experiment("memory", experiment_path=tmp_path, tracking=[])
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, seed=1, block=False)
    # a rolling window: runs 5-20 wait (stopped, never started) and are resumed one by one as
    # others complete or are deleted
    for rid in range(ALIVE + 1, TOTAL_RUNS + 1):
        exp.stop(rid)
    t0 = time.perf_counter()
    samples = [sample(exp, "start")]
    waiting = list(range(ALIVE + 1, TOTAL_RUNS + 1))
    to_delete = {3, 6, 9, 12, 15, 18}      # deleted after their first chunk; the rest complete
    finished, seq = set(), 0
    deadline = time.monotonic() + 600
    while len(finished) < TOTAL_RUNS and time.monotonic() < deadline:
        exp.events.wait_for(seq, timeout=1.0)
        events = exp.events.since(seq)
        seq = events[-1]["seq"] if events else seq
        for ev in events:
            if ev["type"] == "chunk_done" and ev["run_id"] in to_delete and ev["chunks_done"] == 1:
                exp.delete(ev["run_id"])
            elif ev["type"] == "run_status" and ev["status"] in ("completed", "deleted", "failed"):
                finished.add(ev["run_id"])
                samples.append(sample(exp, f"run {ev['run_id']} {ev['status']}"))
                if waiting:
                    exp.resume(waiting.pop(0))
    assert exp.wait(timeout=60)
    elapsed = time.perf_counter() - t0
    end = sample(exp, "end")
    samples.append(end)

    info = exp.get_runs_info()
    errors = [e.strip().splitlines()[-1] for e in info.error if isinstance(e, str)]
    assert len(info) == TOTAL_RUNS and set(info.status) == {"completed", "deleted"}, errors
    assert set(info[info.status == "deleted"].run_id) == to_delete
    assert max(s["alive"] for s in samples[1:]) <= ALIVE   # (the stops apply at the first boundary)

    # one run's share: its adapter (r=64 on every linear layer) and AdamW's two moments
    adapter_bytes = sum(v.numel() * v.element_size() for v in exp.engine.run_weights(1).values())
    per_run = 3 * adapter_bytes
    start = samples[0]
    first_half = [s for s in samples[1:-1] if len(s["finished"]) <= TOTAL_RUNS // 2]
    second_half = [s for s in samples[1:-1] if len(s["finished"]) > TOTAL_RUNS // 2]
    peak1 = max(s["tensor_bytes"] for s in first_half)
    peak2 = max(s["tensor_bytes"] for s in second_half)
    print(f"\n{TOTAL_RUNS} runs in {elapsed:.1f}s; adapter {adapter_bytes / 1e6:.2f} MB, "
          f"per run ~{per_run / 1e6:.2f} MB")
    for s in samples:
        print(f"  {s['at']:>18}: tensors {s['tensor_bytes'] / 1e6:6.2f} MB, RSS {s['rss'] / 1e6:6.1f} MB, "
              f"trainers {s['run_trainers']}, adapters {s['adapters']}, finished {len(s['finished'])}, "
              f"alive {s['alive']}")
    print(f"  peak tensors while runs 1-10 finished {peak1 / 1e6:.2f} MB, runs 11-20 {peak2 / 1e6:.2f} MB")

    # while runs come and go, memory follows the runs alive, not the runs that ever existed: a
    # bound from ALIVE, not from how high the first half's samples happened to catch it (a sample
    # may land while a finished run's trainer is still being released: one run more)
    bound = start["tensor_bytes"] + (ALIVE + 1) * per_run
    assert peak1 <= bound and peak2 <= bound, (peak1, peak2, bound)
    assert max(s["run_trainers"] for s in samples) <= ALIVE
    # when everything has finished, what remains is the base model (+ at most PEFT's last adapter,
    # which it refuses to delete)
    assert end["run_trainers"] == 0, "finished runs keep their trainers"
    assert end["adapters"] <= 1
    assert end["tensor_bytes"] <= start["tensor_bytes"] + adapter_bytes + 64 * 1024, (start, end)
    exp.end()
