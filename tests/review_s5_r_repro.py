"""Review s5_r (hostile user of issue 19's Ray workers): failing regression tests for the findings
in /work/notes/review_s5_r.md. Each one fails on main 300ddc3; see the notes for the probes."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import ray  # noqa: E402

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch  # noqa: E402
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model  # noqa: E402
from rapidfire_nb.errors import ConfigError  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from test_ray_workers import LR_A, config, events, kernel_reference  # noqa: E402


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def data():
    return make_demo_datasets(64, 16)


_LOCK = threading.Lock()


def _fmt_holding_a_lock(row):
    with _LOCK:   # a closure over a lock: fine in the kernel, cannot be pickled for a worker
        return {"prompt": row["prompt"], "completion": row["completion"]}


def test_unpicklable_formatting_func_is_refused_before_any_run(ray_session, data, tmp_path):
    """F2: the kernel trains it; on workers the run is created and then fails with Ray's
    'Could not serialize the argument RunRecord(...)'. Bad input: a clear error naming
    formatting_func at run_fit, nothing created."""
    train, evald = data
    cfg = config(LR_A)
    cfg.formatting_func = _fmt_holding_a_lock
    exp = Experiment("unpicklable", experiment_path=tmp_path, num_workers=2)
    try:
        with pytest.raises(ConfigError, match="formatting_func"):
            exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald,
                        num_chunks=2, seed=1)
        assert not (exp.path / "runs.json").exists()
    finally:
        exp.end()


def test_formatting_func_the_workers_cannot_import_is_refused_before_any_run(ray_session, data, tmp_path):
    """F2: a formatting_func from a module only on the driver's sys.path: each run fails at its
    first chunk with a reason full of Ray's wrapper and ANSI colour codes."""
    train, evald = data
    (tmp_path / "rf_driver_only_fmt.py").write_text(
        "def fmt(row):\n    return {'prompt': row['prompt'], 'completion': row['completion']}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import rf_driver_only_fmt

        cfg = config(LR_A)
        cfg.formatting_func = rf_driver_only_fmt.fmt
        exp = Experiment("driver-only", experiment_path=tmp_path / "exp", num_workers=2)
        try:
            with pytest.raises(ConfigError, match="rf_driver_only_fmt"):
                exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evald,
                            num_chunks=2, seed=1)
        finally:
            exp.end()
        for e in events(exp, "run_status", status="failed"):
            assert "\x1b[" not in e["reason"], "a stop/failure reason must be plain text"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rf_driver_only_fmt", None)


def test_a_run_failing_on_a_worker_gets_the_kernels_reason(ray_session, data, tmp_path):
    """F1: a diverging run (loss NaN) fails on both engines; the kernel's reason is the one line
    'FloatingPointError: training loss is nan at step N', the worker's is
    'WorkerTrainingError: Traceback (most recent call last): ...' (the whole traceback)."""
    train, evald = data

    def group():
        return RFGridSearch(config(List([LR_A, 1e6])), trainer_type="SFT")

    exp = Experiment("nan-w", experiment_path=tmp_path, num_workers=2)
    try:
        exp.run_fit(group(), tiny_create_model, train, evald, num_chunks=2, seed=1)
    finally:
        exp.end()
    ref = kernel_reference("nan-k", tmp_path, group(), tiny_create_model, train, evald, num_chunks=2, seed=1)
    ref.end()
    got = [(e["run_id"], e["reason"]) for e in events(exp, "run_status", status="failed")]
    want = [(e["run_id"], e["reason"]) for e in events(ref, "run_status", status="failed")]
    assert want and want[0][1].startswith("FloatingPointError")
    assert got == want
    (fail,) = events(exp, "run_status", status="failed")
    assert "Traceback" in fail["error"], "the worker's traceback stays in the error field"


def _per_process_create_model(cfg):
    model, tok = tiny_create_model(cfg)
    with torch.no_grad():   # an init that differs per process (seeded by the pid)
        g = torch.Generator().manual_seed(os.getpid())
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model, tok


def test_create_model_that_differs_per_worker_is_not_silently_mixed(ray_session, data, tmp_path):
    """F3: each worker calls create_model; if it builds different bases, a run that moves between
    workers silently continues its LoRA on another base. Expected: the workers' bases are
    compared (a fingerprint in describe()) and the user is told (ConfigError or a warning)."""
    train, evald = data
    exp = Experiment("pid-model", experiment_path=tmp_path, num_workers=2)
    try:
        with pytest.warns(UserWarning, match="create_model"):
            try:
                exp.run_fit(RFGridSearch(config(List([LR_A, 1e-2, 2e-2, 3e-3])), trainer_type="SFT"),
                            _per_process_create_model, train, evald, num_chunks=3, seed=1)
            except ConfigError as exc:   # refusing is fine too, if it names create_model
                assert "create_model" in str(exc)
                import warnings
                warnings.warn("create_model: " + str(exc), UserWarning)
    finally:
        exp.end()
