"""The two sides of ``rapidfire bench``: the engine interleaving the runs, and plain TRL one after
another."""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from typing import Any

from rapidfire_nb.bench.presets import Preset, _sync


def run_interleaved(p: Preset, group, base, train, evald, workdir: str, tracking=None,
                    offload: str = "auto", checkpoints: bool = True) -> dict:
    """Train the group through the engine; timings from the engine's own per-chunk split."""
    from rapidfire_nb.engine import checkpoint_writes

    with checkpoint_writes(checkpoints):
        return _run_interleaved(p, group, base, train, evald, workdir, tracking, offload)


def _run_interleaved(p: Preset, group, base, train, evald, workdir: str, tracking, offload) -> dict:
    from rapidfire_nb.experiment import Experiment

    model, tok = base
    exp = Experiment(f"bench-{int(time.time() * 1000)}", experiment_path=workdir,
                     tracking=list(tracking or []), offload=offload)
    try:
        _sync(p.device)
        t0, c0 = time.time(), time.process_time()
        exp.run_fit(group, lambda cfg: (model, tok), train, evald, num_chunks=p.num_chunks,
                    seed=42, block=True)
        _sync(p.device)
        wall, cpu = time.time() - t0, time.process_time() - c0
        info = exp.get_runs_info()
        failed = info[info["status"] != "completed"]
        if len(failed):
            errors = "; ".join(f"run {r.run_id}: {r.status} {str(r.error)[-400:]}"
                               for r in failed.itertuples())
            raise RuntimeError(f"interleaved side: not every run completed: {errors}")
        tl = exp.get_timeline()
        # when each run's first chunk ended (the timeline is the reducer's, engine/state.py)
        first_done = tl.groupby("run_id")["end"].min().to_dict() if len(tl) else {}
        steps = int(info["completed_steps"].sum())
        write_wait = float(exp.engine.write_wait_s)
    finally:
        exp.end()
    # the writer thread's share (after end(): every write has finished); an engine that does not
    # count these (the bench run against another version of the package) reports nan
    writer = exp.engine.persistence.writer
    writer_busy, writer_cpu = float(writer.busy_s), float(getattr(writer, "cpu_s", math.nan))
    writer_encode = float(getattr(exp.engine.store, "encode_s", math.nan))
    writer_jobs = int(writer.jobs_done)
    train_s, eval_s = float(tl["train_s"].sum()), float(tl["eval_s"].sum())
    setup_s, ckpt_s = float(tl["setup_s"].sum()), float(tl["checkpoint_s"].fillna(0).sum())
    snap_s = float(tl["snapshot_s"].fillna(0).sum())
    swap_s, other_s = float(tl["swap_s"].sum()), float(tl["other_s"].sum())
    in_chunks = float((tl["end"] - tl["start"]).sum())
    return {
        "wall_s": wall, "cpu_s": cpu, "steps": steps, "chunks": len(tl),
        "train_s": train_s, "eval_s": eval_s, "swap_s": swap_s, "setup_s": setup_s,
        # the engine thread only snapshots a run's state; the writer thread serialises, writes and
        # fsyncs it while the next chunk trains (checkpoint_s: the writer's time, not the engine's)
        "snapshot_s": snap_s,
        "checkpoint_s": ckpt_s,
        "write_wait_s": write_wait,
        # the checkpoint writer thread: wall time busy, its CPU time (an upper bound on how long it
        # held the interpreter while the engine thread trained), of which encoding the files
        "writer_busy_s": writer_busy, "writer_cpu_s": writer_cpu, "writer_encode_s": writer_encode,
        "writer_jobs": writer_jobs,
        # other_s includes setup and the snapshot; the rest is bookkeeping inside the chunk
        "chunk_misc_s": max(0.0, other_s - setup_s - snap_s),
        "outside_chunks_s": max(0.0, wall - in_chunks),
        "overhead_s": wall - train_s - eval_s,
        "overhead_frac": (wall - train_s - eval_s) / wall,
        # the same less the runs' set-up (TRL trainer construction with its dataset preparation,
        # PEFT adapter injection, optimizer creation), which sequential TRL pays too: what the
        # engine itself adds (swaps, snapshots, scheduling, log and runs.json writes, waits)
        "engine_added_frac": (wall - train_s - eval_s - setup_s) / wall,
        "setup_frac": setup_s / wall,
        "swap_ms_median": 1000 * float(tl["swap_s"].median()),
        "swap_ms_max": 1000 * float(tl["swap_s"].max()),
        "step_ms": 1000 * train_s / max(steps, 1),
        "first_all_s": max(first_done.values()) - t0 if first_done else math.nan,
    }


def _in_worker_thread(fn, *args, **kwargs):
    """Run ``fn`` in a fresh thread and return its result (re-raising its exception).

    The engine trains in a background thread. On an oversubscribed CPU (a shared 2-core machine
    with other work), the same small torch ops measured 2-6x more CPU time and ~3x more wall time
    in the main thread than in a worker thread (OpenMP spin-waiting); running the sequential
    baseline in a worker thread too keeps the comparison about the engine, not about threads.
    """
    import threading

    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    th = threading.Thread(target=target, name="bench-sequential")
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def run_sequential(p: Preset, specs, pristine, tok, train, evald, workdir: str, use_eval: bool,
                   main_thread: bool = False) -> dict:
    """Each config alone with plain ``SFTTrainer(...).train()``, one after the other (in a worker
    thread like the engine's, unless ``main_thread``)."""
    if not main_thread:
        return _in_worker_thread(run_sequential, p, specs, pristine, tok, train, evald, workdir,
                                 use_eval, main_thread=True)
    import torch
    from peft import get_peft_model
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    from rapidfire_nb import automl

    class Marks(TrainerCallback):
        """The wall-clock moment a run first has something to compare (eval or first chunk)."""

        def __init__(self):
            self.first = None

        def on_evaluate(self, args, state, control, **kw):
            if self.first is None:
                self.first = time.time()

        def on_step_end(self, args, state, control, **kw):
            if not use_eval and self.first is None and state.global_step >= p.steps_per_chunk:
                self.first = time.time()

    out = {"wall_s": 0.0, "cpu_s": 0.0, "build_s": 0.0, "train_s": 0.0, "eval_s": 0.0, "steps": 0}
    first_all = math.nan
    for i, spec in enumerate(specs):
        model = copy.deepcopy(pristine)          # a fresh base per run, outside the timed region
        args = automl.build_training_args(
            spec, output_dir=os.path.join(workdir, f"seq_{i}"), seed=42, report_to="none",
            save_strategy="no", logging_strategy="steps", logging_steps=1, disable_tqdm=True,
            eval_strategy="steps" if use_eval else "no", eval_steps=p.steps_per_chunk)
        lora = automl.build_lora_config(spec)
        marks = Marks()
        _sync(p.device)
        t0, c0 = time.time(), time.process_time()
        elapsed_before = out["wall_s"]
        with rng_guard(spec):
            peft_model = get_peft_model(model, lora)
        trainer = SFTTrainer(model=peft_model, args=args, train_dataset=train,
                             eval_dataset=evald if use_eval else None, processing_class=tok,
                             callbacks=[marks])
        # disable_tqdm=True makes Trainer print every log dict; the engine prints nothing
        trainer.remove_callback(PrinterCallback)
        evaluate, eval_time = trainer.evaluate, [0.0]

        def timed_evaluate(*a, _f=evaluate, _acc=eval_time, **k):
            s = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                _acc[0] += time.perf_counter() - s

        trainer.evaluate = timed_evaluate         # Trainer calls self.evaluate(): per-instance timer
        t1 = time.time()
        result = trainer.train()
        _sync(p.device)
        t2 = time.time()
        out["wall_s"] += t2 - t0
        out["cpu_s"] += time.process_time() - c0
        out["build_s"] += t1 - t0
        out["eval_s"] += eval_time[0]
        out["train_s"] += (t2 - t1) - eval_time[0]
        out["steps"] += int(result.global_step)
        if i == len(specs) - 1 and marks.first is not None:
            # every run has a comparison point once the last one has its first: on the
            # sequential clock (the sum of each run's own time) that is here
            first_all = elapsed_before + (marks.first - t0)
        # gaps between runs (freeing the previous run) are not on the clock: the sum of each
        # run's own time is what a user running them one by one would wait
        del trainer, peft_model, model
        if p.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out["first_all_s"] = first_all
    out["step_ms"] = 1000 * out["train_s"] / max(out["steps"], 1)
    return out


@contextlib.contextmanager
def rng_guard(spec):
    """Adapter init seeded per config as the engine seeds it (the same seed: the adapters start
    from the same weights on both sides), without touching the global stream."""
    import torch

    from rapidfire_nb.engine import derive_seed, rng_fork

    with rng_fork():
        torch.manual_seed(derive_seed(42, spec.seed_fingerprint()))
        yield
