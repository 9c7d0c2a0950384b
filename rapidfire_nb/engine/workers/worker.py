"""The body of a Ray worker: one device, the shared base model(s), its resident runs' trainers.

``ChunkWorker`` holds an in-kernel ``Engine`` of its own (no thread, no op queue, no event log file)
and trains with its code: ``_trainer_for`` builds or reuses a run's ``RunTrainer`` on the shared
base exactly as in the kernel, ``_train_chunk`` trains one chunk, evaluates and snapshots. What
the kernel's engine would hand to its checkpoint writer is returned to the controller instead,
which writes the checkpoint and then logs the events (the log is never ahead of the checkpoints,
as in the kernel).

A run's state reaches a worker only when the run (re)arrives there: its last checkpoint, or a warm
clone's starting weights, shipped by the controller through Ray's object store. While a run stays
on the same worker nothing but a few counters travels, and a swap costs what it costs in the
kernel. The class is plain Python: the pool wraps it with ``ray.remote``; tests may also drive it
directly.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import traceback
from pathlib import Path

from rapidfire_nb.engine.controller import (_ENGINE_THREADS, Engine, _collect_garbage,
                                            _install_output_routing)
from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.store import ExperimentStore

# counters the controller owns and sends with every chunk (the worker's copy follows them)
COUNTERS = ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done", "total_steps",
            "steps_per_epoch", "step_offset")


class _ShippedStore(ExperimentStore):
    """The worker's store: a private scratch folder (TRL's output dirs), and checkpoints that are
    the ones the controller shipped with the chunk request, never files: the experiment folder
    lives with the controller and need not be visible from this node."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.shipped: dict[int, dict] = {}

    def load_checkpoint(self, run_id: int):
        return self.shipped.pop(run_id, None)

    def load_warm_start(self, run_id: int):
        return None

    def save_checkpoint(self, run_id: int, state: dict) -> int:   # pragma: no cover - never called
        raise RuntimeError("a worker never writes checkpoints; the controller does")


class _Inline:
    """Stands in for the checkpoint writer: runs the job at once, in the training thread (the
    job only captures the snapshot, see ``_WorkerEngine._persist``)."""

    def submit(self, run_id, job):
        job()

    def busy(self):
        return False

    def pending(self, run_id):
        return False

    def flush(self, timeout=None):
        return True

    def is_worker(self, thread):
        return False


class _WorkerEngine(Engine):
    """The in-kernel engine's chunk code, with the snapshot handed back instead of persisted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writer = _Inline()
        self.captured: tuple | None = None

    def _persist(self, rec, state, batch, chunk_event, done, before):
        self.captured = (state, batch, chunk_event, done)


class ChunkWorker:
    """A long-lived worker; ``train_chunk`` is called by the controller, one call at a time."""

    def __init__(self, name: str, create_model, train_dataset, eval_dataset, num_chunks: int,
                 seed: int, build_args, build_lora, offload: str = "auto",
                 torch_threads: int | None = None):
        import torch

        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"rapidfire-{name}-"))
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
        self.engine = _WorkerEngine(_ShippedStore(self.root), EventLog(None), create_model,
                                    train_dataset, eval_dataset, num_chunks, seed, build_args,
                                    build_lora, devices=(f"{name}:{device}",), offload=offload)
        self.node = _node_ip()
        self._log = open(self.root / "worker.log", "a", encoding="utf-8")
        _install_output_routing()

    def describe(self) -> dict:
        import torch

        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        except Exception:   # driven directly, outside Ray
            node_id = None
        return {"name": self.name, "node": self.node, "node_id": node_id, "pid": os.getpid(),
                "device": self.engine.device_name, "torch_threads": torch.get_num_threads(),
                "log": str(self.root / "worker.log")}

    def holds(self) -> list[int]:
        return sorted(self.engine.trainers)

    def train_chunk(self, run_id: int, counters: dict, record: RunRecord | None = None,
                    checkpoint: dict | None = None, warm_weights: dict | None = None) -> dict:
        """Train the next chunk of run ``run_id``.

        ``record`` (with ``checkpoint`` or ``warm_weights``) comes when the run arrives here: a
        trainer this worker may still hold for it is dropped, and the run continues from what was
        shipped. Returns the chunk's snapshot (the checkpoint to write), its events, and the run's
        counters after it; a training error comes back as ``{"ok": False, ...}``, the run's
        trainer already freed here (failure isolation: the worker goes on)."""
        t0 = time.perf_counter()
        eng = self.engine
        me = threading.get_ident()
        _ENGINE_THREADS[me] = self._log   # TRL/transformers warnings go to the worker's log
        try:
            rec = eng.runs.get(run_id)
            if record is not None:
                if rec is not None:
                    eng._release(rec, collect=False)
                rec = record
                eng.runs[run_id] = rec
                if checkpoint is not None:
                    eng.store.shipped[run_id] = checkpoint
                if warm_weights is not None:
                    eng.pending_weights[run_id] = warm_weights
            elif rec is None:
                raise RuntimeError(f"worker {self.name} does not hold run {run_id} and got no state for it")
            for k, v in counters.items():
                setattr(rec, k, v)
            eng.captured = None
            eng._train_chunk(rec)
            state, batch, chunk_event, done = eng.captured
            eng.captured = None
            chunk_event["worker"] = self.name
            chunk_event["node"] = self.node
            return {"ok": True, "state": state, "events": batch, "chunk_event": chunk_event,
                    "done": done, "counters": {k: getattr(rec, k) for k in COUNTERS},
                    "last_metrics": dict(rec.last_metrics), "worker_s": time.perf_counter() - t0}
        except Exception as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.release(run_id)
            return {"ok": False, "error": tb, "reason": f"{type(exc).__name__}: {exc}",
                    "worker_s": time.perf_counter() - t0}
        finally:
            eng.store.shipped.pop(run_id, None)
            _ENGINE_THREADS.pop(me, None)

    def release(self, run_id: int) -> bool:
        """Free a run's trainer, adapter and optimizer here (it moved, finished, or was deleted)."""
        eng = self.engine
        rec = eng.runs.pop(run_id, None)
        eng.store.shipped.pop(run_id, None)
        eng.pending_weights.pop(run_id, None)
        if rec is None:
            return False
        eng._release(rec, collect=False)
        return True

    def collect(self) -> None:
        _collect_garbage()


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    import socket

    return socket.gethostname()
