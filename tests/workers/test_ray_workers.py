"""Chunks trained by Ray workers, on a real local Ray with CPU "GPUs".

One Ray session for the module: ``ray.init(num_cpus=2, num_gpus=2)`` declares two GPUs that the
workers claim (``num_gpus=1`` each) and then train on as CPUs. Every result is compared with the
in-kernel engine (``num_workers=0``) training the same configs: final weights with ``torch.equal``
and the logged losses with ``==``. Each worker trains with one torch thread (it claims one of the
two CPUs), so the kernel reference trains with one thread too: on a CPU the number of intra-op
threads changes the order of float reductions, and the kernel engine with 1 and with 2 threads
differs in the last bits itself (measured on these configs).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import ray  # noqa: E402  (the test extra installs it: no skip)

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig  # noqa: E402
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model  # noqa: E402
from rapidfire_nb.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.slow   # slow tier: a real local Ray

LR_A, LR_B, LR_TINY = 3e-2, 1e-2, 1e-6

# the workers cannot import this module (the Ray workers' sys.path lacks tests/): the callables
# defined here travel by value, as a notebook's do
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def config(lr, targets=("q_proj", "v_proj"), r=8, adam_epsilon=None, **model):
    return RFModelConfig(
        model_name="tiny", model_kwargs=model or {"hidden_size": 32},
        peft_config=RFLoraConfig(r=r, lora_alpha=16, target_modules=list(targets), lora_dropout=0.1),
        training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                                  max_length=64, bf16=False, lr_scheduler_type="linear", warmup_steps=1,
                                  **({} if adam_epsilon is None else {"adam_epsilon": adam_epsilon})))


def four_runs():
    loras = List([RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1),
                  RFLoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                               lora_dropout=0.1)])
    return RFGridSearch(List([RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32}, peft_config=loras,
        training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                                  max_length=64, bf16=False, warmup_steps=2))
        for lr in (1e-3, 1e-2)]), trainer_type="SFT")


def renamed(weights):
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


def train_losses(exp, run_id):
    res = exp.get_results()
    sel = res[(res.run_id == run_id) & (res.split == "train") & (res.metric == "loss")]
    return list(zip(sel.step, sel.value))


def events(exp, type_, **match):
    return [e for e in exp.events.since(0)
            if e["type"] == type_ and all(e.get(k) == v for k, v in match.items())]


@contextlib.contextmanager
def one_thread():
    """The kernel engine with the workers' torch thread count (see the module docstring)."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(was)


def kernel_reference(name, path, group, create, train, evald, **kw):
    with one_thread():
        ref = Experiment(name, experiment_path=path, num_workers=0)
        ref.run_fit(group, create, train, evald, **kw)
    return ref


def assert_identical(exp, ref, run_ids):
    for rid in run_ids:
        assert_same_weights(exp.engine.run_weights(rid), ref.engine.run_weights(rid))
        losses = train_losses(exp, rid)
        assert losses and losses == train_losses(ref, rid), rid


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")   # loopback only, as rapidfire's own start
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def data():
    return make_demo_datasets(64, 16)


@pytest.fixture(scope="module")
def four_ref(data, tmp_path_factory):
    train, evald = data
    ref = kernel_reference("kernel", tmp_path_factory.mktemp("k4"), four_runs(), tiny_create_model,
                           train, evald, num_chunks=4, seed=7)
    yield ref
    ref.end()


def three_runs():
    return RFGridSearch(config(List([LR_A, LR_B, 2e-2]), hidden_size=64), trainer_type="SFT")


@pytest.fixture(scope="module")
def three_data():
    return make_demo_datasets(192, 16)


@pytest.fixture(scope="module")
def three_ref(three_data, tmp_path_factory):
    train, evald = three_data
    ref = kernel_reference("killed-ref", tmp_path_factory.mktemp("k3"), three_runs(),
                           tiny_create_model, train, evald, num_chunks=3, seed=3)
    yield ref
    ref.end()


def kill_when_in_flight(exp, run_id, chunks_done=1):
    """ray.kill the worker training ``run_id`` once it has finished ``chunks_done`` chunks and is
    training the next one; returns that worker's slot."""
    eng = exp.engine
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with eng.lock:
            flight = eng.executor.inflight.get(run_id)
            if (flight is not None and run_id not in eng.executor.arrived
                    and eng.runs[run_id].chunks_done >= chunks_done):
                ray.kill(flight.slot.actor, no_restart=True)
                return flight.slot
        time.sleep(0.002)
    raise AssertionError(f"run {run_id} never trained chunk {chunks_done}")


def test_four_runs_on_two_workers_end_bit_identical_to_the_kernel_engine(ray_session, data, tmp_path,
                                                                          four_ref):
    from rapidfire_nb.engine.workers.executor import RemoteChunkExecutor

    train, evald = data
    exp = Experiment("workers", experiment_path=tmp_path, num_workers=2)
    exp.run_fit(four_runs(), tiny_create_model, train, evald, num_chunks=4, seed=7)
    ref = four_ref
    assert isinstance(exp.engine.executor, RemoteChunkExecutor)
    assert not isinstance(ref.engine.executor, RemoteChunkExecutor)
    info = exp.get_runs_info()
    assert list(info.status) == ["completed"] * 4
    assert (info.completed_steps == info.total_steps).all()
    assert_identical(exp, ref, [1, 2, 3, 4])
    # the eval curves too: same points, same values
    cols = ["run_id", "chunk", "samples_seen", "value"]
    res, rres = exp.get_results(), ref.get_results()
    ev = res[res.metric == "eval_loss"][cols].sort_values(["run_id", "chunk"])
    rev = rres[rres.metric == "eval_loss"][cols].sort_values(["run_id", "chunk"])
    assert len(ev) == 16 and ev.values.tolist() == rev.values.tolist()

    # both workers trained, and the log says which trained what
    chunks = events(exp, "chunk_done")
    assert len(chunks) == 16
    assert {c["worker"] for c in chunks} == {"w0", "w1"}
    assert all(c["device"].startswith(c["worker"] + ":") for c in chunks)
    assert all(c["hop_s"] >= 0 for c in chunks)
    # the hop's parts: the call reaching the worker, the reply coming back, ray.get
    assert all(min(c["hop_call_s"], c["hop_back_s"], c["hop_get_s"]) >= 0 for c in chunks)
    (workers,) = events(exp, "workers")
    assert sorted(w["worker"] for w in workers["workers"]) == ["w0", "w1"]
    assert all(w["torch_threads"] == 1 for w in workers["workers"])
    assert len({w["pid"] for w in workers["workers"]}) == 2
    # each run trained its chunks in order, never two at once; runs stayed where they started
    for rid in (1, 2, 3, 4):
        mine = sorted((c for c in chunks if c["run_id"] == rid), key=lambda c: c["start"])
        assert [c["chunk"] for c in mine] == [0, 1, 2, 3]
        assert all(a["end"] <= b["start"] for a, b in zip(mine, mine[1:]))
    timeline = exp.get_timeline()
    assert set(timeline.device) == {"w0:cpu", "w1:cpu"}
    assert (timeline.device == timeline.worker + ":cpu").all()
    # get_runs_info names the worker of each run's last chunk (the kernel engine has no column)
    last = {c["run_id"]: c["worker"] for c in sorted(chunks, key=lambda c: c["seq"])}
    assert dict(zip(info.run_id, info.worker)) == last
    assert "worker" not in ref.get_runs_info().columns
    exp.end()
    assert not any(s.alive for s in exp.engine.executor.pool.slots), "end() releases the workers"
    from pathlib import Path

    scratch = [Path(w["log"]).parent for w in workers["workers"]]
    assert not any(p.exists() for p in scratch), "end() removes the workers' scratch folders"


def test_ops_with_workers_match_the_kernel_engine(ray_session, data, tmp_path):
    """stop, warm and cold clones at the end of run 1's chunk 1, resume, delete: the same final
    weights and losses as the in-kernel engine given the same ops at the same point."""
    train, evald = data

    def scenario(name, workers):
        exp = Experiment(name, experiment_path=tmp_path, num_workers=workers)
        fired: list = []

        def listener(ev):   # runs as chunk 1 of run 1 is logged: "a click just then"
            if ev["type"] == "chunk_done" and ev["run_id"] == 1 and ev["chunk"] == 1 and not fired:
                fired.append(exp.clone_modify(1, {"training_args.learning_rate": LR_TINY}, warm_start=True))
                fired.append(exp.clone_modify(1, {"training_args.learning_rate": LR_B}))
                exp.stop(1)

        exp.events.subscribe(listener)
        exp.run_fit(RFGridSearch(config(List([LR_A, LR_B])), trainer_type="SFT"), tiny_create_model,
                    train, evald, num_chunks=4, seed=5)
        assert fired == [3, 4]
        info = exp.get_runs_info().set_index("run_id")
        assert info.loc[1, "status"] == "stopped" and int(info.loc[1, "chunks_done"]) == 2
        assert set(info.loc[[2, 3, 4], "status"]) == {"completed"}
        exp.resume(1)
        assert exp.wait(timeout=600)
        exp.delete(4)
        assert exp.wait(timeout=60)
        return exp

    exp = scenario("ops-workers", 2)
    with one_thread():
        ref = scenario("ops-kernel", 0)
    assert {c["worker"] for c in events(exp, "chunk_done")} == {"w0", "w1"}
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "completed" and info.loc[4, "status"] == "deleted"
    assert bool(info.loc[3, "warm_start"]) and int(info.loc[3, "parent_run_id"]) == 1
    assert [c["chunk"] for c in events(exp, "chunk_done", run_id=1)] == [0, 1, 2, 3]
    assert_identical(exp, ref, [1, 2, 3])
    assert train_losses(exp, 4) == train_losses(ref, 4)
    # the warm clone started from its parent's chunk-1 weights, not from scratch
    assert events(exp, "chunk_done", run_id=3)[0]["chunk"] == 2
    exp.end()
    ref.end()


def test_a_worker_killed_mid_chunk_loses_nothing(ray_session, tmp_path, three_data, three_ref):
    """ray.kill of the worker training run 1's second chunk: that chunk is trained again on the
    other worker from run 1's checkpoint; every run ends bit-identical to the kernel engine's."""
    train, evald = three_data
    exp = Experiment("killed", experiment_path=tmp_path, num_workers=2)
    exp.run_fit(three_runs(), tiny_create_model, train, evald, num_chunks=3, seed=3, block=False)
    victim = kill_when_in_flight(exp, 1)
    assert exp.wait(timeout=600)
    (lost,) = events(exp, "worker_lost")
    assert lost["worker"] == victim.name and lost["workers_left"] == 1
    assert lost["chunk_lost"] == {"run_id": 1, "epoch": 0, "chunk": 1}
    assert 1 in lost["runs"]
    info = exp.get_runs_info()
    assert list(info.status) == ["completed"] * 3
    assert lost["replacement"].startswith("a replacement worker starts")
    survivor = ({"w0", "w1"} - {victim.name}).pop()
    # chunks started after the loss trained on the survivor, or on the replacement w2 once it
    # was up (a chunk that came back before the kill may be logged after the worker_lost event:
    # its checkpoint is written first)
    after = [c for c in events(exp, "chunk_done") if c["start"] > lost["time"]]
    assert after and {c["worker"] for c in after} <= {survivor, "w2"}
    # chunk 1 of run 1 was logged once, by another worker, which got run 1's checkpoint
    ones = events(exp, "chunk_done", run_id=1, chunk=1)
    assert len(ones) == 1 and ones[0]["worker"] in (survivor, "w2") and ones[0]["moved"]
    assert_identical(exp, three_ref, [1, 2, 3])
    exp.end()


def test_a_lost_worker_is_replaced_while_training_goes_on(ray_session, tmp_path, three_data, three_ref):
    """The only worker is killed mid-chunk: a replacement (w1) starts at once, without a resume,
    takes every run from its checkpoint, and the runs end bit-identical to the kernel's."""
    train, evald = three_data
    exp = Experiment("replaced", experiment_path=tmp_path, num_workers=1)
    try:
        exp.run_fit(three_runs(), tiny_create_model, train, evald, num_chunks=3, seed=3, block=False)
        kill_when_in_flight(exp, 1)
        assert exp.wait(timeout=600)
        assert list(exp.get_runs_info().status) == ["completed"] * 3
        (lost,) = events(exp, "worker_lost")
        assert lost["worker"] == "w0" and lost["workers_left"] == 0
        assert lost["replacement"].startswith("a replacement worker starts")
        first, second = events(exp, "workers")
        assert [w["worker"] for w in first["workers"]] == ["w0"]
        assert [w["worker"] for w in second["workers"]] == ["w1"]
        assert second["seq"] > lost["seq"]
        after = [c for c in events(exp, "chunk_done") if c["seq"] > second["seq"]]
        assert after and {c["worker"] for c in after} == {"w1"}
        assert not events(exp, "run_status", status="stopped")
        assert_identical(exp, three_ref, [1, 2, 3])
    finally:
        exp.end()


class _CreateUnloadableOnceMarked:
    """create_model (tiny_create_model) that a process cannot unpickle once ``marker`` exists:
    the workers started by run_fit load it, replacements started later cannot."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self, cfg):
        return tiny_create_model(cfg)

    def __setstate__(self, state):
        if os.path.exists(state["marker"]):
            raise RuntimeError("this process cannot load create_model (marker file)")
        self.__dict__.update(state)


def test_workers_dying_at_start_up_are_replaced_a_bounded_number_of_times(ray_session, tmp_path, three_data):
    """Replacements that cannot load create_model die while starting: they stop after
    MAX_FAILED_STARTS deaths in a row, and the runs are stopped with a reason naming the error; a
    resume tries once more, bounded."""
    from rapidfire_nb.engine.workers.pool import MAX_FAILED_STARTS

    train, evald = three_data
    marker = tmp_path / "no-more-loads"
    exp = Experiment("doomed", experiment_path=tmp_path / "exp", num_workers=1)
    try:
        exp.run_fit(three_runs(), _CreateUnloadableOnceMarked(marker), train, evald, num_chunks=3,
                    seed=3, block=False)
        marker.write_text("")
        kill_when_in_flight(exp, 1)
        assert exp.wait(timeout=600)
        assert list(exp.get_runs_info().status) == ["stopped"] * 3
        lost = events(exp, "worker_lost")
        assert 1 + MAX_FAILED_STARTS <= len(lost) <= 2 + MAX_FAILED_STARTS
        assert all("cannot load create_model" in e["reason"] for e in lost[1:])
        assert any(f"not replaced: {MAX_FAILED_STARTS} workers in a row died before training a chunk"
                   in (e["replacement"] or "") for e in lost)
        for e in events(exp, "run_status", status="stopped"):
            assert "died before training a chunk" in e["reason"] and "marker file" in e["reason"]
        exp.resume(1)   # the user asks again: one more bounded round of starts
        assert exp.wait(timeout=600)
        assert exp.get_runs_info().set_index("run_id").loc[1, "status"] == "stopped"
        assert len(events(exp, "worker_lost")) <= 2 * (2 + MAX_FAILED_STARTS)
    finally:
        exp.end()


_LOCK = threading.Lock()


def _fmt_holding_a_lock(row):
    with _LOCK:   # a closure over a lock: fine in the kernel, cannot be pickled for a worker
        return {"prompt": row["prompt"], "completion": row["completion"]}


def test_a_formatting_func_that_cannot_be_pickled_is_refused_before_any_run(ray_session, data, tmp_path):
    """Review s5_r F2: the run was created, then failed with Ray's 'Could not serialize the
    argument RunRecord(...)'. Now a ConfigError names the field and the cause; nothing is created."""
    train, evald = data
    cfg = config(LR_A)
    cfg.formatting_func = _fmt_holding_a_lock
    exp = Experiment("unpicklable", experiment_path=tmp_path, num_workers=2)
    try:
        with pytest.raises(ConfigError, match=r"formatting_func .*cannot be sent to the Ray workers: "
                                              r"TypeError: cannot pickle '_thread.lock'"):
            exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald,
                        num_chunks=2, seed=1)
        assert not (exp.path / "runs.json").exists() and not events(exp, "run_created")
    finally:
        exp.end()


@pytest.mark.parametrize("field", ["formatting_func", "create_model"])
def test_callables_the_workers_cannot_import_are_refused_before_any_run(ray_session, data, tmp_path, field):
    """Review s5_r F2: a callable from a module only on the driver's sys.path made each run fail
    at its first chunk (formatting_func: a reason full of Ray's wrapper and ANSI codes) or every
    worker die starting (create_model). Now: a one-line ConfigError at run_fit, nothing created."""
    train, evald = data
    mod = f"rf_driver_only_{field}"
    (tmp_path / f"{mod}.py").write_text(
        "from rapidfire_nb.demo_data import tiny_create_model\n\n\n"
        "def fmt(row):\n    return {'prompt': row['prompt'], 'completion': row['completion']}\n\n\n"
        "def create(cfg):\n    return tiny_create_model(cfg)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(mod)
        cfg = config(LR_A)
        create = tiny_create_model
        if field == "formatting_func":
            cfg.formatting_func = module.fmt
        else:
            create = module.create
        exp = Experiment("driver-only", experiment_path=tmp_path / "exp", num_workers=2)
        try:
            with pytest.raises(ConfigError) as err:
                exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), create, train, evald,
                            num_chunks=2, seed=1)
            msg = str(err.value)
            assert msg.startswith(field) and "cannot be loaded on Ray worker w" in msg
            assert f"ModuleNotFoundError: No module named '{mod}': define it in the notebook or " \
                   "install it on every node" in msg
            assert "\x1b" not in msg and "actor_id" not in msg and "\n" not in msg
            assert not (exp.path / "runs.json").exists() and not events(exp, "run_created")
        finally:
            exp.end()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(mod, None)


def test_a_run_failing_on_a_worker_gets_the_kernels_reason(ray_session, data, tmp_path):
    """Review s5_r F1: a diverging run (loss NaN) fails in both engines; the reason on workers was
    'WorkerTrainingError: Traceback ...'. Now the kernel's one line; the traceback stays in error."""
    train, evald = data

    def group():
        # adam_epsilon=0: LoRA's A matrices get exactly zero gradient on the first step (B starts
        # at zero), so Adam's update is 0/0 and the loss is NaN at step 2 in every torch build (a
        # huge learning rate alone is tamed by RMSNorm in current transformers)
        return RFGridSearch(List([config(LR_A), config(LR_A, adam_epsilon=0.0)]), trainer_type="SFT")

    exp = Experiment("nan-w", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, seed=1)
    finally:
        exp.end()
    ref = kernel_reference("nan-k", tmp_path, group(), tiny_create_model, train, evald, num_chunks=2, seed=1)
    ref.end()
    got = [(e["run_id"], e["reason"]) for e in events(exp, "run_status", status="failed")]
    want = [(e["run_id"], e["reason"]) for e in events(ref, "run_status", status="failed")]
    assert want and want[0][1].startswith("FloatingPointError: training loss is nan")
    assert got == want
    (fail,) = events(exp, "run_status", status="failed")
    assert "Traceback" in fail["error"] and "FloatingPointError" in fail["error"]


def _per_process_create_model(cfg):
    model, tok = tiny_create_model(cfg)
    with torch.no_grad():   # an init that differs per process (seeded by the pid)
        g = torch.Generator().manual_seed(os.getpid())
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model, tok


def test_create_model_that_differs_per_worker_is_refused_before_any_run(ray_session, data, tmp_path):
    """Review s5_r F3: runs moved between workers whose create_model built different weights,
    silently. Now each worker builds the bases at start and their fingerprints are compared."""
    train, evald = data
    exp = Experiment("pid-model", experiment_path=tmp_path, num_workers=2)
    try:
        with pytest.raises(ConfigError, match=r"^create_model built a different model on worker w1 "
                                              r"than on w0 \(base "):
            exp.run_fit(RFGridSearch(config(List([LR_A, LR_B])), trainer_type="SFT"),
                        _per_process_create_model, train, evald, num_chunks=2, seed=1)
        assert not (exp.path / "runs.json").exists()
    finally:
        exp.end()


class _CreateNoisyOnceMarked:
    """tiny_create_model, with noise in its weights in a process that builds it once ``marker``
    exists: the workers started by run_fit agree, a replacement started later does not."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self, cfg):
        model, tok = tiny_create_model(cfg)
        if os.path.exists(self.marker):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01)
        return model, tok


def test_a_replacement_whose_base_differs_fails_the_runs_it_gets(ray_session, tmp_path, three_data):
    """F3 for a replacement worker: its first chunk's reply brings its base's fingerprint; a
    different one fails that run with a reason naming create_model, nothing is booked from it."""
    train, evald = three_data
    marker = tmp_path / "noisy-from-now-on"
    exp = Experiment("noisy-replacement", experiment_path=tmp_path / "exp", num_workers=1)
    try:
        exp.run_fit(three_runs(), _CreateNoisyOnceMarked(marker), train, evald, num_chunks=3,
                    seed=3, block=False)
        marker.write_text("")
        kill_when_in_flight(exp, 1)
        assert exp.wait(timeout=600)
        after = [c for c in events(exp, "chunk_done") if c["worker"] != "w0"]
        assert not after, "nothing trained on the different base is booked"
        failed = events(exp, "run_status", status="failed")
        assert failed and all(e["reason"].startswith("ConfigError: create_model built a different "
                                                     "model on worker w1 than on w0") for e in failed)
    finally:
        exp.end()


def test_simultaneous_deaths_are_counted_in_workers_left(ray_session, tmp_path, data):
    """Review s5_r F7: both workers killed at once; the first worker_lost said workers_left=1."""
    train, evald = data
    exp = Experiment("both-die", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(RFGridSearch(config(List([LR_A, LR_B])), trainer_type="SFT"), tiny_create_model,
                    train, evald, num_chunks=3, seed=1, block=False)
        eng = exp.engine
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with eng.lock:
                flights = [f for rid, f in eng.executor.inflight.items() if rid not in eng.executor.arrived]
                if len(flights) == 2:
                    for f in flights:
                        ray.kill(f.slot.actor, no_restart=True)
                    # the loop is held until both deaths are visible to Ray
                    ray.wait([f.ref for f in flights], num_returns=2, timeout=60)
                    break
            time.sleep(0.002)
        else:
            raise AssertionError("never two chunks in flight")
        assert exp.wait(timeout=600)
        lost = events(exp, "worker_lost")[:2]
        assert sorted(e["worker"] for e in lost) == ["w0", "w1"]
        assert [e["workers_left"] for e in lost] == [0, 0]
        assert list(exp.get_runs_info().status) == ["completed"] * 2   # on the replacements
    finally:
        exp.end()


def test_a_replacement_not_needed_any_more_is_not_kept(ray_session, tmp_path, data):
    """Review s5_r F7: a replacement still starting when the last run finished stayed alive
    (holding a GPU) until end(). Now the loop kills it when it leaves."""
    train, evald = data
    exp = Experiment("quick-finish", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(RFGridSearch(config(LR_A), trainer_type="SFT"), tiny_create_model, train, evald,
                    num_chunks=2, seed=1, block=False)
        kill_when_in_flight(exp, 1, chunks_done=0)
        assert exp.wait(timeout=600)
        assert exp.get_runs_info().status.tolist() == ["completed"]
        pool = exp.engine.executor.pool
        assert all(s.info for s in pool.live()), [s.name for s in pool.live() if not s.info]
        assert not exp.engine.executor.replacements.starting and not exp.engine.executor.replacements.owed
    finally:
        exp.end()


def test_end_without_waiting_then_resume_with_workers(ray_session, data, tmp_path, four_ref):
    """end(wait=False) mid-way, then Experiment(resume=True) with workers and the same run_fit."""
    train, evald = data
    exp = Experiment("resumed", experiment_path=tmp_path, num_workers=2)
    exp.run_fit(four_runs(), tiny_create_model, train, evald, num_chunks=4, seed=7, block=False)
    deadline = time.monotonic() + 300
    while len(events(exp, "chunk_done")) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    exp.end(wait=False)
    stopped = [rid for rid, st in zip(exp.get_runs_info().run_id, exp.get_runs_info().status)
               if st == "stopped"]
    assert stopped, "ended mid-way: some runs were stopped"
    again = Experiment("resumed", experiment_path=tmp_path, resume=True, num_workers=2)
    again.run_fit(four_runs(), tiny_create_model, train, evald, num_chunks=4, seed=7, block=False)
    info = again.get_runs_info()
    for rid in info[info.status == "stopped"].run_id:   # runs the end stopped may continue by themselves
        again.resume(int(rid))
    assert again.wait(timeout=600)
    assert list(again.get_runs_info().status) == ["completed"] * 4
    assert_identical(again, four_ref, [1, 2, 3, 4])
    again.end()


def test_too_many_workers_is_refused_and_changes_nothing(ray_session, data, tmp_path):
    train, evald = data
    exp = Experiment("too-many", experiment_path=tmp_path, num_workers=3)
    with pytest.raises(ConfigError, match=r"num_workers=3 but the Ray cluster has 2 GPU"):
        exp.run_fit(RFGridSearch(config(LR_A), trainer_type="SFT"), tiny_create_model, train, evald)
    assert exp.engine is None and not (exp.path / "runs.json").exists()
    exp.end()


def test_auto_uses_the_ray_session_already_started(ray_session, data, tmp_path):
    """ray.init() done by the user: "auto" means one worker per GPU of that cluster (two here)."""
    from rapidfire_nb.engine.workers import resolve_num_workers

    assert resolve_num_workers("auto") == 2
    assert resolve_num_workers(0) == 0


@pytest.mark.parametrize("bad", [-1, "two", 1.5, True, None])
def test_bad_num_workers_is_refused(bad, tmp_path):
    with pytest.raises(ConfigError, match="num_workers"):
        Experiment("bad", experiment_path=tmp_path, num_workers=bad)
    assert not (tmp_path / "bad").exists()


def test_importing_and_training_in_the_kernel_never_imports_ray(tmp_path):
    code = (
        "import sys\n"
        "import rapidfire_nb\n"
        "from rapidfire_nb import Experiment\n"
        "from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig\n"
        "from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model\n"
        "assert 'ray' not in sys.modules, 'import rapidfire_nb imported ray'\n"
        "train, ev = make_demo_datasets(16, 8)\n"
        "cfg = RFModelConfig(model_name='tiny', model_kwargs={'hidden_size': 32},"
        " peft_config=RFLoraConfig(r=4, target_modules=['q_proj']),"
        " training_args=RFSFTConfig(per_device_train_batch_size=8, max_length=32, bf16=False))\n"
        f"exp = Experiment('k', experiment_path={str(tmp_path)!r})\n"
        "exp.run_fit(RFGridSearch(cfg, trainer_type='SFT'), tiny_create_model, train, ev, num_chunks=2)\n"
        "assert set(exp.get_runs_info().status) == {'completed'}\n"
        "exp.end()\n"
        "print('ray' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_bench_workers_flag_is_checked(capsys):
    from rapidfire_nb.bench import main

    assert main(["--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


def test_a_pruned_grid_on_workers_prunes_as_in_the_kernel(ray_session, data, tmp_path):
    """AutoML at chunk boundaries (successive halving) with workers: the same runs pruned at the
    same rungs, with the same reasons, and the survivors bit-identical to the kernel engine's."""
    train, evald = data

    def group():
        return RFGridSearch(config(List([3e-2, 1e-2, 3e-3, 1e-3])), trainer_type="SFT",
                            pruner="sha", reduction_factor=2)

    exp = Experiment("sha-workers", experiment_path=tmp_path, num_workers=2)
    exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, seed=9)
    ref = kernel_reference("sha-kernel", tmp_path, group(), tiny_create_model, train, evald,
                           num_chunks=4, seed=9)

    def outcome(e):
        info = e.get_runs_info().set_index("run_id")
        return {rid: (info.loc[rid, "status"], int(info.loc[rid, "chunks_done"])) for rid in info.index}

    got, want = outcome(exp), outcome(ref)
    assert got == want
    assert sum(1 for st, _ in got.values() if st == "stopped") >= 2, "the pruner stopped runs"
    reasons = lambda e: sorted((x["run_id"], x["reason"]) for x in events(e, "run_status", status="stopped"))  # noqa: E731
    assert reasons(exp) == reasons(ref)
    assert {c["worker"] for c in events(exp, "chunk_done")} == {"w0", "w1"}
    assert_identical(exp, ref, [rid for rid, (st, _) in got.items() if st == "completed"])
    exp.end()
    ref.end()


def automl_story(exp):
    """What AutoML decided and in which order the engine booked chunks: every run's status,
    chunks done and pruning note, and the sequence of chunk_done / run_created / stop events."""
    info = exp.get_runs_info().set_index("run_id")
    runs = {int(rid): (info.loc[rid, "status"], int(info.loc[rid, "chunks_done"]),
                       info.loc[rid, "pruning"] if isinstance(info.loc[rid, "pruning"], str) else None)
            for rid in info.index}
    order = [(e["type"], e["run_id"], e.get("epoch"), e.get("chunk"), e.get("reason"))
             for e in exp.events.since(0)
             if e["type"] in ("chunk_done", "run_created")
             or (e["type"] == "run_status" and e["status"] == "stopped")]
    return runs, order


@pytest.mark.parametrize("pruner", ["median", "hyperband"])
def test_median_and_hyperband_grids_on_workers_decide_as_in_the_kernel(ray_session, data, tmp_path, pruner):
    """The AutoML hook sees the chunks in the kernel's order (replies that come back early wait for
    their turn): the same chunk sequence, the same pruning decisions, the survivors bit-identical."""
    train, evald = data

    def group():
        return RFGridSearch(config(List([3e-2, 1e-6, 1e-2, 3e-3])), trainer_type="SFT", pruner=pruner)

    exp = Experiment(f"{pruner}-workers", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, seed=9)
    finally:
        exp.end()   # a failure here must not leave the next test without free "GPUs"
    ref = kernel_reference(f"{pruner}-kernel", tmp_path, group(), tiny_create_model, train, evald,
                           num_chunks=4, seed=9)
    (got, got_order), (want, want_order) = automl_story(exp), automl_story(ref)
    assert got == want
    assert got_order == want_order
    assert any(note and note.startswith("pruned") for _, _, note in got.values()), "it pruned"
    assert {c["worker"] for c in events(exp, "chunk_done")} == {"w0", "w1"}
    assert_identical(exp, ref, [rid for rid, (st, _, _) in got.items() if st == "completed"])
    ref.end()


def test_rfoptuna_on_workers_asks_the_same_trials_and_prunes_as_in_the_kernel(ray_session, data, tmp_path):
    """RFOptuna refills a freed slot at the boundary where it frees: the kernel's booking order
    decides which trials the study has seen when it asks the next one, and the history a refill
    asked alone is judged against (median rule). Workers book in that order too."""
    from rapidfire_nb.automl import Range, RFOptuna

    train, evald = data

    def group():
        cfg = RFModelConfig(
            model_name="tiny", model_kwargs={"hidden_size": 32},
            peft_config=RFLoraConfig(r=List([4, 8]), target_modules=["q_proj", "v_proj"]),
            training_args=RFSFTConfig(learning_rate=Range(1e-6, 5e-2, log=True),
                                      per_device_train_batch_size=8, num_train_epochs=1,
                                      max_length=64, bf16=False))
        return RFOptuna(cfg, trainer_type="SFT", n_initial=3, budget=6, pruner="median", seed=5)

    g_exp, g_ref = group(), group()
    exp = Experiment("optuna-workers", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(g_exp, tiny_create_model, train, evald, num_chunks=4, seed=3)
    finally:
        exp.end()
    ref = kernel_reference("optuna-kernel", tmp_path, g_ref, tiny_create_model, train, evald,
                           num_chunks=4, seed=3)
    (got, got_order), (want, want_order) = automl_story(exp), automl_story(ref)
    assert len(got) == 6
    assert got == want
    assert got_order == want_order
    trials = lambda g: [(t.user_attrs["run_id"], t.state.name, t.params, t.intermediate_values,  # noqa: E731
                         t.user_attrs.get("bracket")) for t in g._study.trials]
    assert trials(g_exp) == trials(g_ref)
    assert_identical(exp, ref, [rid for rid, (st, _, _) in got.items() if st == "completed"])
    ref.end()


def test_snapshots_travel_as_numpy_buffers_bit_exact():
    """What a worker sends back holds no torch tensor (pickling those costs ~0.1 ms each way per
    tensor); unpacked, every tensor is bit-equal, of its dtype (bfloat16 too), and writable."""
    import pickle

    import numpy as np

    from rapidfire_nb.engine.workers.worker import pack_tensors, unpack_tensors

    g = torch.Generator().manual_seed(0)
    state = {"weights": {"a": torch.randn(4, 8, generator=g).to(torch.bfloat16),
                         "b": torch.randn(8, 4, generator=g)[:, ::2]},   # not contiguous
             "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, generator=g)}},
                           "param_groups": [{"lr": 1e-3, "params": [0]}]},
             "rng": {"torch": torch.get_rng_state(), "numpy": ("MT19937", np.arange(4), 2),
                     "python": (3, (1, 2), None)},
             "steps": [torch.tensor([1, 2], dtype=torch.int64)]}
    wire = pickle.loads(pickle.dumps(pack_tensors(state), protocol=5))

    def tensors(o):
        if isinstance(o, torch.Tensor):
            return [o]
        if isinstance(o, dict):
            return [t for v in o.values() for t in tensors(v)]
        if isinstance(o, (list, tuple)):
            return [t for v in o for t in tensors(v)]
        return []

    assert tensors(wire) == []
    back = unpack_tensors(wire)
    pairs = list(zip(tensors(state), tensors(back)))
    assert len(pairs) == 6
    for a, b in pairs:
        assert a.dtype == b.dtype and torch.equal(a, b)
    back["weights"]["a"].add_(1)      # owned and writable
    assert back["rng"]["numpy"][0] == "MT19937" and back["rng"]["python"] == (3, (1, 2), None)
    assert back["optimizer"]["param_groups"] == [{"lr": 1e-3, "params": [0]}]


class _CreateRaisingOnceMarked:
    """tiny_create_model, raising in a process that builds it once ``marker`` exists: the workers
    started by run_fit built their bases already, a replacement started later cannot."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self, cfg):
        if os.path.exists(self.marker):
            raise OSError(f"model files not found on this node (marker {self.marker})")
        return tiny_create_model(cfg)


def test_a_replacement_that_cannot_build_the_base_is_excluded_and_its_runs_go_to_healthy_workers(
        ray_session, tmp_path, three_data):
    """A worker of 2 killed; create_model raises on every replacement: the replacements are
    excluded (lost, killed, counted towards the cut-off) and the healthy worker trains every run to
    the end; no run fails. A long run keeps training (so a replacement is owed and starts) while
    the two short ones wait, stopped, for the replacement to come up: it then gets runs, however
    slowly it starts."""
    from rapidfire_nb.engine.workers.pool import MAX_FAILED_STARTS

    train, evald = three_data
    marker = tmp_path / "no-model-here"
    group = RFGridSearch(List([config(LR_A, hidden_size=64), config(LR_B, hidden_size=64)]
                              + [RFModelConfig(
                                  model_name="tiny", model_kwargs={"hidden_size": 64},
                                  peft_config=RFLoraConfig(r=8, lora_alpha=16,
                                                           target_modules=["q_proj", "v_proj"]),
                                  training_args=RFSFTConfig(
                                      learning_rate=LR_B, per_device_train_batch_size=8,
                                      num_train_epochs=40, max_length=64, bf16=False))]),
                         trainer_type="SFT")
    exp = Experiment("unfit-replacement", experiment_path=tmp_path / "exp", num_workers=2)
    try:
        exp.run_fit(group, _CreateRaisingOnceMarked(marker), train, evald, num_chunks=3, seed=3,
                    block=False)
        marker.write_text("")
        killed = kill_when_in_flight(exp, 1, chunks_done=0)
        exp.stop(1)
        exp.stop(2)
        deadline = time.monotonic() + 600
        while len(events(exp, "workers")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(events(exp, "workers")) >= 2, "the replacement never came up"
        exp.resume(1)
        exp.resume(2)
        assert exp.wait(timeout=900)
        info = exp.get_runs_info()
        assert list(info.status) == ["completed"] * 3, info[["run_id", "status", "error"]]
        assert not events(exp, "run_status", status="failed")
        lost = events(exp, "worker_lost")
        assert lost[0]["worker"] == killed.name
        unfit = lost[1:]
        assert unfit, "the replacement was never given a run"
        assert all("create_model raised on worker" in e["reason"] and "model files not found" in e["reason"]
                   for e in unfit)
        # excluded for good: the actor is killed, never used again
        names = {e["worker"] for e in unfit}
        assert not any(s.alive for s in exp.engine.executor.pool.slots if s.name in names)
        assert len(unfit) <= MAX_FAILED_STARTS
        assert {c["worker"] for c in events(exp, "chunk_done")} <= {"w0", "w1"}   # none from them
    finally:
        exp.end()


def test_runs_stopped_by_workers_that_cannot_build_the_base_stay_resumable(
        ray_session, tmp_path, three_data, three_ref):
    """One worker, killed; every replacement's create_model raises: the cut-off counts them (they
    raise, they do not die), the runs are stopped, not failed; once the node is fixed, resuming
    them trains them to the kernel's result."""
    from rapidfire_nb.engine.workers.pool import MAX_FAILED_STARTS

    train, evald = three_data
    marker = tmp_path / "no-model-here"
    exp = Experiment("unfit-only", experiment_path=tmp_path / "exp", num_workers=1)
    try:
        exp.run_fit(three_runs(), _CreateRaisingOnceMarked(marker), train, evald, num_chunks=3,
                    seed=3, block=False)
        marker.write_text("")
        kill_when_in_flight(exp, 1)
        assert exp.wait(timeout=600)
        assert list(exp.get_runs_info().status) == ["stopped"] * 3
        assert not events(exp, "run_status", status="failed")
        lost = events(exp, "worker_lost")
        assert len(lost) == 1 + MAX_FAILED_STARTS
        assert f"not replaced: {MAX_FAILED_STARTS} workers in a row" in lost[-1]["replacement"]
        for e in events(exp, "run_status", status="stopped"):
            assert "model files not found" in e["reason"], e["reason"]
        marker.unlink()
        for rid in (1, 2, 3):
            exp.resume(rid)
        assert exp.wait(timeout=600)
        assert list(exp.get_runs_info().status) == ["completed"] * 3
        assert_identical(exp, three_ref, [1, 2, 3])
    finally:
        exp.end()
