"""Random sequences of interactive ops, sent from another thread while the real engine trains.

Each example is a small real experiment (tiny Llama, LoRA, TRL's SFTTrainer, one optimizer step
per chunk) and a list of (op, run id, pause) sent from a second thread as a user clicking around
would: stop, resume, delete, cold and warm clones, on runs that may not exist, may be finished,
deleted or not yet created. Whatever the order and timing:

- every op call returns (accepted) or raises a RapidFireError with a reason; nothing else;
- every accepted op is applied exactly once by the engine (an ``op`` event), or refused there
  with a reason;
- each run's statuses follow the state machine of ``engine/runs.py``;
- nothing deadlocks: the op thread finishes, ``wait()`` returns, ``end()`` returns;
- at the end no run is pending or running, and completed runs did all their steps.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_sft_dataset, tiny_create_model
from rapidfire_nb.engine import runs as R
from rapidfire_nb.errors import RapidFireError

pytestmark = pytest.mark.slow   # slow tier: random op sequences on real trainings

OPS = ("stop", "resume", "delete", "clone", "clone_warm")
PAUSES = (0.0, 0.0, 0.05, 0.3, 1.0)   # seconds before an op: same instant, mid-chunk, later
TRAIN = make_sft_dataset(16, seed=0)  # 2 steps of 8; 2 chunks: one optimizer step per chunk


def group():
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-3, 1e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=48, bf16=False))
    return RFGridSearch(cfg, trainer_type="SFT")


def call(exp, kind, run_id, n):
    if kind == "stop":
        exp.stop(run_id)
    elif kind == "resume":
        exp.resume(run_id)
    elif kind == "delete":
        exp.delete(run_id)
    else:
        return exp.clone_modify(run_id, {"training_args.learning_rate": 1e-3 * (n + 2)},
                                warm_start=kind == "clone_warm")
    return None


def joined(fn, timeout):
    """Run ``fn`` in a thread; False if it has not returned within ``timeout`` (a deadlock)."""
    done = threading.Event()
    errors = []

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, daemon=True).start()
    finished = done.wait(timeout)
    if errors:
        raise errors[0]
    return finished


op_strategy = st.tuples(st.sampled_from(OPS), st.integers(min_value=1, max_value=5),
                        st.sampled_from(PAUSES))


def check_sequence(tmp_path, ops):
    exp = Experiment("prop", experiment_path=tmp_path)
    exp.run_fit(group(), tiny_create_model, TRAIN, None, num_chunks=2, seed=1, block=False)
    outcomes = []

    def user():
        for n, (kind, run_id, pause) in enumerate(ops):
            time.sleep(pause)
            try:
                outcomes.append((kind, run_id, "accepted", call(exp, kind, run_id, n)))
            except RapidFireError as exc:
                outcomes.append((kind, run_id, "refused", str(exc)))

    try:
        assert joined(user, timeout=120), "an op call did not return"
        assert joined(lambda: exp.wait(timeout=300) or pytest.fail("wait() timed out"), timeout=310)
    finally:
        ended = joined(exp.end, timeout=120)
    assert ended, "end() did not return"

    # every call was accepted or refused with a reason
    assert len(outcomes) == len(ops)
    for kind, run_id, verdict, detail in outcomes:
        if verdict == "refused":
            assert isinstance(detail, str) and len(detail) > 10, (kind, run_id, detail)

    # every accepted op was applied exactly once; refusals there carry a reason
    applied = [e for e in exp.events.since(0) if e["type"] == "op"]
    accepted = [o for o in outcomes if o[2] == "accepted"]
    assert [(e["op"], e["run_id"]) for e in applied] == [
        ("clone" if k.startswith("clone") else k, r) for k, r, _, _ in accepted]
    for e in applied:
        assert isinstance(e["accepted"], bool)
        if not e["accepted"]:
            assert isinstance(e["reason"], str) and e["reason"], e
        assert e["latency_s"] >= 0
    new_ids = [d for k, _, v, d in outcomes if v == "accepted" and k.startswith("clone")]
    assert len(set(new_ids)) == len(new_ids), "two clones got the same run id"
    for e in applied:
        if e["op"] == "clone" and e["accepted"]:
            assert e["new_run_id"] in exp.engine.snapshot()

    # the status machine: each run's statuses, as logged, are legal transitions from pending
    history: dict[int, list[str]] = {}
    for e in exp.events.since(0):
        if e["type"] == "run_status":
            history.setdefault(e["run_id"], []).append(e["status"])
    assert set(history) == set(exp.engine.snapshot())
    for run_id, statuses in history.items():
        assert statuses[0] == R.PENDING, (run_id, statuses)
        for a, b in zip(statuses, statuses[1:]):
            assert b in R.TRANSITIONS[a], f"run {run_id}: {a} -> {b} in {statuses}"
        rec = exp.engine.snapshot()[run_id]
        assert rec.status == statuses[-1]
        assert rec.status not in R.ACTIVE, f"run {run_id} still {rec.status} after wait()"
        if rec.status == R.COMPLETED:
            assert rec.completed_steps == rec.total_steps
        if rec.status == R.DELETED:
            assert run_id not in exp.engine.executor.trainers
    # a deleted run trains no chunk after its delete took effect
    for e in applied:
        if e["op"] == "delete" and e["accepted"]:
            later = [c for c in exp.events.since(e["seq"]) if c["type"] == "chunk_done"
                     and c["run_id"] == e["run_id"]]
            assert later == [], e


@settings(max_examples=6, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, min_size=1, max_size=7))
# sequences worth keeping whatever hypothesis draws:
# ops after every run has finished (the thread must start again), and a warm clone raced by the
# deletion of its parent
@example(ops=[("stop", 2, 0.0), ("resume", 2, 1.0), ("clone_warm", 1, 1.0), ("resume", 2, 0.3)])
@example(ops=[("clone_warm", 1, 0.3), ("delete", 1, 0.0), ("clone", 3, 0.05), ("stop", 3, 0.0)])
@example(ops=[("delete", 1, 0.0), ("delete", 2, 0.0), ("clone", 1, 0.0), ("resume", 1, 0.3)])
def test_random_op_sequences_keep_the_engine_sound(tmp_path_factory, ops):
    check_sequence(tmp_path_factory.mktemp("prop"), ops)
