"""Interactive-control ops (stop, resume, delete, clone-modify cold/warm) on real SFT training.

A tiny Llama on CPU, LoRA, the real TRL SFTTrainer. Ops that must land at an exact point of the
data stream are submitted from an event-log listener, which runs in the engine thread right when a
chunk's events are appended: that is "a user clicked just as chunk k ended", reproducibly. The
op-latency test submits from the test's own thread while training goes on, as a user does.
"""

from __future__ import annotations

import gc
import threading
import time
import warnings

import pytest
import torch

from rapidfire_nb import Experiment
from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import ConfigError, OpRefused

from helpers import LR_A, LR_B, events_of, on_chunk_done, ops_group

LR_TINY = 1e-6        # a clone trained at this rate barely moves from where it started
NUM_CHUNKS = 4        # 64 examples, batch 8: 8 steps, 2 per chunk


def renamed(weights):
    """Adapter weights keyed without the run's adapter name, to compare runs."""
    out = {}
    for k, v in weights.items():
        parts = k.split(".")
        out[".".join("run_X" if i > 0 and parts[i - 1] in ("lora_A", "lora_B") else p
                     for i, p in enumerate(parts))] = v
    return out


def assert_same_weights(a, b):
    a, b = renamed(a), renamed(b)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert torch.equal(a[k], b[k]), k


def evals(exp, run_id):
    res = exp.get_results()
    sel = res[(res.run_id == run_id) & (res.metric == "eval_loss")]
    return list(zip(sel.chunk, sel.samples_seen, sel.value))


def train_losses(exp, run_id):
    res = exp.get_results()
    sel = res[(res.run_id == run_id) & (res.split == "train") & (res.metric == "loss")]
    return list(zip(sel.step, sel.value))


def assert_ops_within_one_chunk(exp):
    """The timeline check for op latency: between an op's submission and its application at most
    one chunk boundary passes (the chunk in flight), and that chunk had started before the op."""
    chunks = events_of(exp, "chunk_done")
    for op in events_of(exp, "op"):
        submitted = op["time"] - op["latency_s"]
        ended_between = [c for c in chunks if submitted < c["end"] and c["seq"] < op["seq"]]
        assert len(ended_between) <= 1, (op, ended_between)
        for c in ended_between:
            assert c["start"] <= submitted, (op, c)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_data):
    """Runs A and B trained to the end with no op at all."""
    train, evald = tiny_data
    exp = Experiment("reference", experiment_path=tmp_path_factory.mktemp("ref"))
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=5)
    assert set(exp.get_runs_info().status) == {"completed"}
    yield exp
    exp.end()


# -- stop / resume ---------------------------------------------------------------------------------

def test_stop_then_resume_ends_with_the_weights_of_a_run_never_stopped(reference, tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("stop-resume", experiment_path=tmp_path)
    fired = on_chunk_done(exp, 1, 1, lambda: exp.stop(1))
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=5)
    assert fired == [True]
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "stopped" and info.loc[2, "status"] == "completed"

    # the stopped run trained no chunk after the stop took effect
    stop_op = events_of(exp, "op", op="stop", run_id=1)[0]
    assert stop_op["accepted"]
    after = [c for c in events_of(exp, "chunk_done", run_id=1) if c["seq"] > stop_op["seq"]]
    assert after == []
    assert [c["chunk"] for c in events_of(exp, "chunk_done", run_id=1)] == [0, 1]
    assert int(info.loc[1, "chunks_done"]) == 2
    assert exp.store.load_checkpoint(1) is not None, "a stopped run keeps its checkpoint"

    # every run is terminal or stopped: the engine thread has ended; resume starts it again
    first_thread = exp.engine.thread
    assert not first_thread.is_alive()
    exp.resume(1)
    assert exp.wait(timeout=300)
    assert exp.engine.thread is not first_thread
    assert exp.get_runs_info().set_index("run_id").loc[1, "status"] == "completed"
    assert [c["chunk"] for c in events_of(exp, "chunk_done", run_id=1)] == [0, 1, 2, 3]

    for rid in (1, 2):
        assert_same_weights(exp.engine.run_weights(rid), reference.engine.run_weights(rid))
        assert train_losses(exp, rid) == train_losses(reference, rid)
    statuses = [e["status"] for e in events_of(exp, "run_status", run_id=1)]
    assert statuses == ["pending", "running", "stopped", "pending", "running", "completed"]
    assert_ops_within_one_chunk(exp)
    exp.end()


def test_stopping_a_pending_run_takes_effect_before_it_trains(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("stop-pending", experiment_path=tmp_path)
    # run 2 has not trained at all while run 1 trains its first chunk
    fired: list = []

    def listener(ev):
        if ev["type"] == "run_status" and ev["run_id"] == 1 and ev["status"] == "running" and not fired:
            fired.append(True)
            exp.stop(2)

    exp.events.subscribe(listener)
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train.select(range(32)), evald, num_chunks=2,
                seed=5)
    assert fired == [True]
    assert events_of(exp, "chunk_done", run_id=2) == []
    assert exp.get_runs_info().set_index("run_id").loc[2, "status"] == "stopped"
    exp.end()


# -- clones ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cloned(tmp_path_factory, tiny_data):
    """Run 1 (LR_A) is cloned after its chunk 1: run 2 warm at LR_TINY, run 3 cold at LR_TINY,
    run 4 cold at LR_B (the reference's run 2 config)."""
    train, evald = tiny_data
    exp = Experiment("clones", experiment_path=tmp_path_factory.mktemp("clones"))
    ids = []

    def branch():
        ids.append(exp.clone_modify(1, {"training_args.learning_rate": LR_TINY}, warm_start=True))
        ids.append(exp.clone_modify(1, {"training_args": {"learning_rate": LR_TINY}}))
        ids.append(exp.clone_modify(1, {"training_args.learning_rate": LR_B}))

    fired = on_chunk_done(exp, 1, 1, branch)
    exp.run_fit(ops_group(LR_A), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS, seed=5)
    assert fired == [True], fired
    assert ids == [2, 3, 4]
    yield exp
    exp.end()


def test_warm_clone_starts_where_its_parent_is(cloned):
    exp = cloned
    info = exp.get_runs_info().set_index("run_id")
    assert set(info.status) == {"completed"}
    assert info.loc[2, "parent_run_id"] == 1 and bool(info.loc[2, "warm_start"])
    # run ids stay integers (not 1.0) with a missing parent shown as <NA>
    assert str(info["parent_run_id"].dtype) == "Int64" and info["parent_run_id"].isna().loc[1]
    assert info.loc[3, "parent_run_id"] == 1 and not bool(info.loc[3, "warm_start"])

    parent = evals(exp, 1)
    branch_chunk, branch_samples, parent_latest = parent[1]      # after the parent's chunk 1
    initial_like = evals(exp, 3)[0][2]                           # cold clone, barely trained
    warm_first = evals(exp, 2)[0]
    # RapidFire's warm start: the clone's data starts at the chunk after the parent's last
    # completed one and it trains its own full schedule (8 steps = 4 chunks), wrapping around
    assert warm_first[0] == branch_chunk + 1
    assert [(c["epoch"], c["chunk"]) for c in events_of(exp, "chunk_done", run_id=2)] == [(0, 2), (0, 3), (1, 0), (1, 1)]
    created = events_of(exp, "run_created", run_id=2)[0]
    assert created["total_steps"] - created["base_step"] == 8
    # its curve continues the parent's samples-seen axis from the branch point
    assert created["base_samples_seen"] == branch_samples
    assert warm_first[1] == branch_samples + 16
    # its curve picks up at the parent's loss, far from where an untrained adapter is
    # (a LoRA on a random tiny base learns slowly: ~0.1 nats in 4 steps, but deterministically)
    gap = abs(initial_like - parent_latest)
    assert gap > 0.05, f"the parent did not learn enough to tell warm from cold ({gap})"
    assert abs(warm_first[2] - parent_latest) < 0.02 * gap
    assert abs(initial_like - warm_first[2]) > 0.9 * gap


def test_status_shows_a_warm_clones_progress_as_the_panel_does(cloned):
    """``%rapidfire status`` and the panel (js/src/format.ts chunkText, stepText) both show the
    run's own progress: its own steps from 0 and its own epoch of its schedule, with the chunk of
    data it trained last. The warm clone (run 2, 1 epoch) read chunks 3, 4 of the stream's epoch 1
    then 1, 2 of epoch 2: that is "epoch 1/1 · chunk 2/4" and 8/8 steps, not "epoch 2" and the
    parent's step count added; where its data starts is a separate fact, beside its parent."""
    from rapidfire_nb.notebook.status_text import status_table

    table = status_table(cloned)
    for rid in (1, 2, 3, 4):
        last = events_of(cloned, "chunk_done", run_id=rid)[-1]
        assert table.loc[rid, "progress"] == f"epoch 1/1 · chunk {last['chunk'] + 1}/{NUM_CHUNKS}", rid
    created = events_of(cloned, "run_created", run_id=2)[0]
    assert created["base_step"] > 0     # the engine's counters start at the parent's position
    assert table.loc[2, "steps"] == "8/8"
    assert table.loc[2, "progress"] == f"epoch 1/1 · chunk 2/{NUM_CHUNKS}"
    assert table.loc[2, "from"] == f"1 (warm, data from chunk 3/{NUM_CHUNKS})"
    assert table.loc[3, "from"] == "1 (cold)"
    assert table.loc[1, "steps"] == "8/8"


def test_warm_clone_has_its_own_optimizer_and_schedule(cloned):
    exp = cloned
    res = exp.get_results()
    lrs = res[(res.run_id == 2) & (res.metric == "learning_rate")].sort_values("step")
    # a fresh linear schedule over the clone's own 8 steps, at the clone's own rate (its steps are
    # numbered in the data stream: it starts at the parent's chunk 2, step 5)
    assert lrs.value.iloc[0] == pytest.approx(LR_TINY)
    assert list(lrs.step) == list(range(5, 13))
    assert lrs.value.iloc[4] == pytest.approx(LR_TINY / 2)   # linear decay over 8 steps, not 4


def test_cold_clone_trains_from_scratch(cloned, reference):
    exp = cloned
    assert [c["chunk"] for c in events_of(exp, "chunk_done", run_id=4)] == [0, 1, 2, 3]
    assert train_losses(exp, 4)[0][0] == 1
    # a cold clone of run 1 at LR_B is the reference's LR_B run, bit for bit
    assert_same_weights(exp.engine.run_weights(4), reference.engine.run_weights(2))
    assert train_losses(exp, 4) == train_losses(reference, 2)
    # and the parent went on undisturbed by its clones
    assert_same_weights(exp.engine.run_weights(1), reference.engine.run_weights(1))


def test_clone_ops_were_applied_before_any_further_chunk(cloned):
    exp = cloned
    ops = events_of(exp, "op", op="clone")
    assert [o["new_run_id"] for o in ops] == [2, 3, 4] and all(o["accepted"] for o in ops)
    branch = [c for c in events_of(exp, "chunk_done", run_id=1) if c["chunk"] == 1][0]
    later = [c for c in events_of(exp, "chunk_done") if c["seq"] > branch["seq"]]
    assert all(o["seq"] < later[0]["seq"] for o in ops)
    assert_ops_within_one_chunk(exp)


# -- refused ops ---------------------------------------------------------------------------------

def _snapshot(exp):
    runs = {rid: (r.status, r.completed_steps, r.spec.fingerprint()) for rid, r in exp.engine.snapshot().items()}
    return runs, exp.events.last_seq, not exp.engine.ops_pending(), set(exp.engine.reserved_ids)


@pytest.mark.parametrize("call,error,needle", [
    (lambda e: e.stop(9), OpRefused, "unknown run 9"),
    (lambda e: e.resume(9), OpRefused, "unknown run 9"),
    (lambda e: e.delete(9), OpRefused, "unknown run 9"),
    (lambda e: e.clone_modify(9, {"training_args.learning_rate": 1e-3}), OpRefused, "unknown run 9"),
    (lambda e: e.stop("1"), OpRefused, "run_id must be an integer"),
    (lambda e: e.stop(1), OpRefused, "run 1 is completed"),
    (lambda e: e.resume(1), OpRefused, "only stopped runs can be resumed"),
    (lambda e: e.clone_modify(1, {"training_args.no_such_knob": 1}), ConfigError, "no_such_knob"),
    (lambda e: e.clone_modify(1, {"nonsense.learning_rate": 1}), ConfigError, "not an editable knob"),
    (lambda e: e.clone_modify(1, {"training_args.learning_rate": "fast"}), ConfigError, "learning_rate"),
    (lambda e: e.clone_modify(1, {"training_args.learning_rate": -1.0}), ConfigError, "learning_rate"),
    (lambda e: e.clone_modify(1, {"training_args.per_device_train_batch_size": 0}), ConfigError,
     "per_device_train_batch_size"),
    (lambda e: e.clone_modify(1, {"training_args.learning_rate": print}), ConfigError, "JSON"),
    (lambda e: e.clone_modify(1, {"peft_config.r": 4}, warm_start=True), OpRefused, r"\br\b.*8 -> 4"),
    (lambda e: e.clone_modify(1, {"peft_config.target_modules": ["q_proj"]}, warm_start=True),
     OpRefused, "target_modules"),
    (lambda e: e.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start="yes"),
     OpRefused, "warm_start"),
    (lambda e: e.clone_modify(1, "lr=1e-3"), ConfigError, "dict"),
], ids=["stop-unknown", "resume-unknown", "delete-unknown", "clone-unknown", "stop-str-id",
        "stop-completed", "resume-completed", "unknown-knob", "unknown-section", "string-lr",
        "negative-lr", "zero-batch", "callable-value", "warm-rank", "warm-targets", "warm-not-bool",
        "changes-not-dict"])
def test_refused_ops_raise_and_change_nothing(reference, call, error, needle):
    before = _snapshot(reference)
    with pytest.raises(error, match=needle):
        call(reference)
    assert _snapshot(reference) == before
    assert not reference.engine.thread_alive()


def test_ops_on_a_deleted_run_are_refused(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("deleted-ops", experiment_path=tmp_path)
    exp.run_fit(ops_group(LR_A), tiny_create_model, train.select(range(32)), evald, num_chunks=2, seed=5)
    exp.delete(1)
    assert exp.wait(timeout=60)
    for call, needle in [(lambda: exp.delete(1), "already deleted"), (lambda: exp.stop(1), "deleted"),
                         (lambda: exp.resume(1), "deleted"),
                         (lambda: exp.clone_modify(1, {"training_args.learning_rate": 1e-3}), "deleted")]:
        with pytest.raises(OpRefused, match=needle):
            call()
    exp.end()
    with pytest.raises(Exception, match="ended"):
        exp.stop(1)


def test_warm_clone_raced_by_the_deletion_of_its_parent_is_refused(tiny_data, tmp_path):
    train, evald = tiny_data
    exp = Experiment("warm-vs-delete", experiment_path=tmp_path)
    ids = []

    def race():
        # the delete is queued, not applied yet: the warm clone is validated against the state
        # the queue will produce, so it is refused at once instead of returning an id
        # that never exists
        exp.delete(1)
        ids.append(exp.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start=True))

    fired = on_chunk_done(exp, 1, 0, race)
    exp.run_fit(ops_group(LR_A), tiny_create_model, train.select(range(32)), evald, num_chunks=2, seed=5)
    assert fired[0] is True and isinstance(fired[1], OpRefused) and ids == [], fired
    assert "delete is queued" in str(fired[1])
    assert events_of(exp, "op", op="clone") == []
    assert 2 not in exp.engine.snapshot() and events_of(exp, "run_created", run_id=2) == []
    exp.end()


def test_an_op_sent_while_the_engine_thread_leaves_is_not_lost(tiny_data, tmp_path):
    """The engine thread ends when nothing is left to train. An op submitted in its last moments
    (the loop has decided to leave, the thread is still alive) must start a new thread rather
    than sit in the queue with no thread to apply it, and ``wait()`` must not hang on it.

    To make that moment last, a user thread holds the logging module's lock, which the engine
    thread needs for its clean-up (it unregisters its log handlers), and acts meanwhile."""
    import logging

    train, _ = tiny_data
    exp = Experiment("leaving", experiment_path=tmp_path)
    users: list[threading.Thread] = []
    holding = threading.Event()

    def late_user():
        with logging._lock:
            holding.set()
            time.sleep(0.5)                 # the loop returns and blocks in its clean-up
            alive = exp.engine.thread_alive()
            exp.resume(1)
        users.append(alive)

    def listener(ev):
        # the last op the loop applies before it leaves (engine thread, inside the loop)
        if ev["type"] == "op" and ev["op"] == "stop" and ev["run_id"] == 1:
            user = threading.Thread(target=late_user, daemon=True)
            user.start()
            users.append(user)
            holding.wait(30)

    def stop_both():
        exp.stop(2)
        exp.stop(1)

    on_chunk_done(exp, 1, 0, stop_both)
    exp.events.subscribe(listener)
    exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train.select(range(16)), None, num_chunks=2,
                seed=5, block=False)
    deadline = time.monotonic() + 300
    while not users:
        assert time.monotonic() < deadline, "run 1 was never stopped"
        time.sleep(0.01)
    users[0].join(60)
    assert not users[0].is_alive(), "resume() did not return"
    assert users[1] is True, "the engine thread was gone already: this test did not test anything"
    assert joined_within(lambda: exp.wait(timeout=20), 40), "wait() hung"
    assert events_of(exp, "op", op="resume"), "the resume op was never applied"
    assert exp.wait(timeout=0)
    assert exp.engine.snapshot()[1].status == "completed" and exp.engine.snapshot()[2].status == "stopped"
    exp.end()


def joined_within(fn, timeout) -> bool:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(timeout)
    return not t.is_alive()


# -- delete and memory ---------------------------------------------------------------------------

def live_tensor_bytes() -> int:
    gc.collect()
    seen, total = set(), 0
    with warnings.catch_warnings():   # isinstance() pokes deprecated torch module attributes
        warnings.simplefilter("ignore")
        objects = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for obj in objects:
        try:
            if not obj.is_meta:
                storage = obj.untyped_storage()
                key = storage.data_ptr()
                if key and key not in seen:
                    seen.add(key)
                    total += storage.nbytes()
        except Exception:  # noqa: BLE001 - some objects refuse inspection; they are not ours
            pass
    return total


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.slow
def test_deleting_ten_runs_frees_their_memory_and_checkpoints(tiny_data, tmp_path, capsys):
    train, evald = tiny_data
    exp = Experiment("delete-ten", experiment_path=tmp_path)
    stopped = []

    def stop_clone(ev):
        # each clone stops after its first chunk: its trainer, optimizer and adapter stay in memory
        if ev["type"] == "chunk_done" and ev["run_id"] > 1 and ev["chunk"] == 0:
            exp.stop(ev["run_id"])
            stopped.append(ev["run_id"])

    # two 1-step chunks per run, no eval
    exp.run_fit(ops_group(LR_A), tiny_create_model, train.select(range(16)), None, num_chunks=2, seed=5)
    base = exp.engine.factory.bases[exp.engine.snapshot()[1].spec.base_key()]
    # the boundary's reusable snapshot buffers are the engine's, not a run's (as many as checkpoint
    # writes overlapped; tests/engine/test_boundary_audit.py bounds them): left out of what must be freed
    def pool_bytes():
        return sum(b.file.numel() for _, b in exp.engine.executor.snapshot_pool if b.file is not None)

    before_tensors, before_rss = live_tensor_bytes() - pool_bytes(), rss_bytes()

    exp.events.subscribe(stop_clone)
    ids = [exp.clone_modify(1, {"training_args.learning_rate": 1e-3 * (i + 1)}) for i in range(10)]
    assert ids == list(range(2, 12))
    assert exp.wait(timeout=600)
    assert sorted(stopped) == ids
    assert set(exp.get_runs_info().set_index("run_id").loc[ids, "status"]) == {"stopped"}
    peak_tensors, peak_rss = live_tensor_bytes() - pool_bytes(), rss_bytes()
    assert set(ids) <= set(exp.engine.executor.trainers)
    assert {f"run_{i}" for i in ids} <= set(base.peft_model.peft_config)
    for rid in ids:
        assert exp.store.load_checkpoint(rid) is not None

    for rid in ids:
        exp.delete(rid)
    assert exp.wait(timeout=120)
    after_tensors, after_rss = live_tensor_bytes() - pool_bytes(), rss_bytes()

    info = exp.get_runs_info().set_index("run_id")
    assert (info.loc[ids, "status"] == "deleted").all() and info.loc[1, "status"] == "completed"
    assert not set(ids) & set(exp.engine.executor.trainers)
    assert not {f"run_{i}" for i in ids} & (set(base.peft_model.peft_config) | base.adapters)
    for rid in ids:
        assert exp.store.load_checkpoint(rid) is None
        assert not exp.store.checkpoint_path(rid).exists()
    # metrics stay, marked deleted
    res = exp.get_results()
    assert set(res[res.deleted].run_id) == set(ids) and not res[res.run_id == 1].deleted.any()
    # memory: what the ten runs added is gone (tensors exactly; RSS loosely, allocators keep pages)
    grown = peak_tensors - before_tensors
    assert grown > 0
    assert after_tensors <= before_tensors + 0.02 * grown, (before_tensors, peak_tensors, after_tensors)
    deletes = events_of(exp, "op", op="delete")
    with capsys.disabled():
        print(f"\n[delete-ten] live tensor bytes: before {before_tensors}, with 10 stopped clones "
              f"{peak_tensors}, after deleting them {after_tensors}; RSS MiB: "
              f"{before_rss / 2**20:.1f} -> {peak_rss / 2**20:.1f} -> {after_rss / 2**20:.1f}; "
              f"delete latencies {[round(d['latency_s'], 3) for d in deletes]} s")
    exp.end()


# -- op latency, from another thread while training goes on ------------------------------------

@pytest.mark.slow
def test_op_latency_is_at_most_one_chunk(tiny_data, tmp_path, capsys):
    train, evald = tiny_data
    exp = Experiment("latency", experiment_path=tmp_path)
    exp.run_fit(ops_group(LR_A, LR_B, 2e-2), tiny_create_model, train, evald, num_chunks=NUM_CHUNKS,
                seed=5, block=False)

    def wait_chunks(n):
        deadline = time.monotonic() + 300
        while len(events_of(exp, "chunk_done")) < n:
            assert time.monotonic() < deadline, "training did not advance"
            exp.events.wait_for(exp.events.last_seq, timeout=1)

    wait_chunks(1)
    exp.stop(3)
    wait_chunks(3)
    new = exp.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start=True)
    wait_chunks(5)
    exp.delete(2)
    exp.resume(3) if exp.engine.snapshot()[3].status == "stopped" else None
    assert exp.wait(timeout=600)

    ops = events_of(exp, "op")
    assert len(ops) >= 3 and all(o["accepted"] for o in ops), ops
    assert_ops_within_one_chunk(exp)
    # a stop takes effect before the run's next chunk: after the stop, run 3 trains nothing
    # until it is resumed
    stop = [o for o in ops if o["op"] == "stop"][0]
    resume = [o for o in ops if o["op"] == "resume"]
    chunks3 = events_of(exp, "chunk_done", run_id=3)
    upto = resume[0]["seq"] if resume else float("inf")
    assert not [c for c in chunks3 if stop["seq"] < c["seq"] < upto]
    # the deleted run trained no chunk after its delete was applied
    delete = [o for o in ops if o["op"] == "delete"][0]
    assert not [c for c in events_of(exp, "chunk_done", run_id=2) if c["seq"] > delete["seq"]]
    assert exp.engine.snapshot()[new].status == "completed"

    durations = [c["end"] - c["start"] for c in events_of(exp, "chunk_done")]
    with capsys.disabled():
        print("\n[op latency] " + ", ".join(f"{o['op']} run {o['run_id']}: {o['latency_s'] * 1000:.0f} ms"
                                            for o in ops)
              + f"; chunk durations {min(durations) * 1000:.0f}-{max(durations) * 1000:.0f} ms")
    exp.end()


# -- DPO and GRPO clones --------------------------------------------------------------------------

def exact_match(pair):
    predictions, references = pair
    hits = [p.strip() == str(r).strip() for p, r in zip(predictions, references)]
    return {"exact_match": sum(hits) / len(hits)}


def short_answer(prompts, completions, **kw):
    return [1.0 if len(c) < 8 else 0.0 for c in completions]


@pytest.mark.parametrize("trainer_type", ["DPO", "GRPO"])
def test_dpo_and_grpo_clones_inherit_callables(trainer_type, tmp_path):
    from rapidfire_nb.automl import RFDPOConfig, RFGRPOConfig
    from rapidfire_nb.demo_data import make_dpo_dataset, make_grpo_dataset

    lora = RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    common = dict(learning_rate=1e-2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  num_train_epochs=1, bf16=False)
    if trainer_type == "DPO":
        train, evald = make_dpo_dataset(8, seed=0), make_dpo_dataset(4, seed=1)
        cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32}, peft_config=lora,
                            training_args=RFDPOConfig(beta=0.1, max_length=48, **common),
                            compute_metrics=exact_match, generation_config={"max_new_tokens": 3})
        change = {"training_args.beta": 0.5}
    else:
        train, evald = make_grpo_dataset(8, seed=0), make_grpo_dataset(2, seed=1)
        cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32}, peft_config=lora,
                            training_args=RFGRPOConfig(num_generations=2, max_completion_length=4, **common),
                            reward_funcs=[short_answer], compute_metrics=exact_match,
                            generation_config={"max_new_tokens": 3})
        change = {"training_args.temperature": 0.7}
    exp = Experiment(f"{trainer_type}-clones", experiment_path=tmp_path)
    ids = []
    fired = on_chunk_done(exp, 1, 0, lambda: ids.extend([
        exp.clone_modify(1, {"training_args.learning_rate": 1e-3}, warm_start=True),
        exp.clone_modify(1, change)]))
    exp.run_fit(RFGridSearch(cfg, trainer_type=trainer_type), tiny_create_model, train, evald,
                num_chunks=2, seed=3)
    assert fired == [True] and ids == [2, 3]
    info = exp.get_runs_info().set_index("run_id")
    assert set(info.status) == {"completed"}, info.error.tolist()
    parent = exp.engine.snapshot()[1].spec
    for rid in ids:
        spec = exp.engine.snapshot()[rid].spec
        assert spec.trainer_type == trainer_type
        assert spec.compute_metrics is parent.compute_metrics
        assert spec.reward_funcs == parent.reward_funcs
    # warm: from the parent's next chunk, its own full schedule (wrapping to the next epoch)
    assert [c["chunk"] for c in events_of(exp, "chunk_done", run_id=2)] == [1, 0]
    assert [c["chunk"] for c in events_of(exp, "chunk_done", run_id=3)] == [0, 1]    # cold: from scratch
    res = exp.get_results()
    for rid in (1, 2, 3):
        metrics = set(res[res.run_id == rid].metric)
        assert "eval_exact_match" in metrics, (rid, sorted(metrics))   # inherited compute_metrics
        if trainer_type == "GRPO":
            assert any("short_answer" in m for m in metrics), (rid, sorted(metrics))  # inherited reward
    exp.end()
