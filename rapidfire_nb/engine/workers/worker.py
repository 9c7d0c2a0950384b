"""The body of a Ray worker: one device, the shared base model(s), its resident runs' trainers.

``ChunkWorker`` holds the in-kernel engine's own chunk executor (``LocalChunkExecutor`` over a
``TrainerFactory``, engine/executor.py): a run's trainer is built on the shared base, swapped in and
out, trained and snapshotted by exactly the code that does it in the kernel. What the kernel's
engine would hand to its checkpoint writer (``ChunkResult``) goes back to the controller instead,
which writes the checkpoint and then logs the events, as in the kernel.

A run's state reaches a worker only when the run (re)arrives there: its last checkpoint, or a warm
clone's starting weights, shipped by the controller through Ray's object store. While a run stays
on the same worker only its counters travel, and a swap costs what it costs in the kernel. The
class is plain Python: the pool wraps it with ``ray.remote``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from rapidfire_nb.engine.executor import LocalChunkExecutor
from rapidfire_nb.engine.factory import TrainerFactory
from rapidfire_nb.engine.inputs import TrainingInputs
from rapidfire_nb.engine.hfstate import HF_STATE_LOCK
from rapidfire_nb.engine.residency import Residency
from rapidfire_nb.engine.routing import routed_to
from rapidfire_nb.engine.runs import RunRecord
from rapidfire_nb.engine.store import ExperimentStore

# the record fields the controller owns and sends with every chunk (the worker's copy follows)
COUNTERS = ("completed_steps", "samples_seen", "epoch", "chunk", "chunks_done", "total_steps",
            "steps_per_epoch", "step_offset")


class PackedTensor:
    """A CPU tensor as a numpy array, for the trip through Ray's object store.

    Pickling a torch tensor goes through ``torch.save`` of its storage, about 0.1 ms per tensor
    each way; a chunk's snapshot holds hundreds (adapter weights, two Adam moments each), which
    measured 8 ms to pickle and 7 ms to unpickle for the bench's 0.8 MB LoRA state on a busy
    2-core machine. A numpy array travels as one out-of-band buffer (1 ms and 0.2 ms). Bit-exact:
    dtypes numpy lacks (bfloat16) travel as same-width integers."""

    __slots__ = ("array", "dtype")

    def __init__(self, array, dtype: str):
        self.array, self.dtype = array, dtype

    def __reduce__(self):
        return (PackedTensor, (self.array, self.dtype))


def pack_tensors(obj):
    """``obj`` (dicts, lists, tuples) with every torch tensor replaced by a PackedTensor."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        dtype = str(t.dtype).replace("torch.", "")
        try:
            return PackedTensor(t.numpy(), dtype)
        except TypeError:   # no numpy dtype (bfloat16, float8): its bits as integers
            ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            return PackedTensor(t.contiguous().view(ints).numpy(), dtype)
    if isinstance(obj, dict):
        return {k: pack_tensors(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(pack_tensors(v) for v in obj)
    return obj


def unpack_tensors(obj):
    """The inverse of ``pack_tensors``: owned, writable CPU tensors (the arrays Ray hands back
    may be read-only views of its object store)."""
    import torch

    if isinstance(obj, PackedTensor):
        t = torch.from_numpy(obj.array.copy())
        dtype = getattr(torch, obj.dtype)
        return t if t.dtype == dtype else t.view(dtype)
    if isinstance(obj, dict):
        return {k: unpack_tensors(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(unpack_tensors(v) for v in obj)
    return obj


class _ShippedStore(ExperimentStore):
    """The worker's store: a private scratch folder (TRL's output dirs), and as checkpoints the
    ones the controller shipped with the chunk request, never files: the experiment folder lives
    with the controller and need not be visible from this node."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.shipped: dict[int, dict] = {}

    def load_checkpoint(self, run_id: int):
        return self.shipped.pop(run_id, None)

    def load_warm_start(self, run_id: int):
        return None

    def save_checkpoint(self, run_id: int, state: dict) -> int:
        raise RuntimeError("a worker never writes checkpoints; the controller does")


def model_fingerprint(model) -> str:
    """A cheap fingerprint of a base model as built: parameter and buffer names, shapes, dtypes,
    and the bytes of about 1024 evenly spaced values of each tensor (exact, device-independent:
    no float reduction). Two workers whose create_model builds different weights disagree here."""
    import hashlib

    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
            flat = t.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 1024)][:1024].contiguous().cpu()
            h.update(sample.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def load_blob(blob: bytes):
    from ray import cloudpickle   # what Ray itself pickles with

    return cloudpickle.loads(blob)


class _FingerprintingFactory(TrainerFactory):
    """The kernel's factory, noting each base's fingerprint when it is built (before any adapter
    goes into it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fingerprints: dict[str, str] = {}

    def load_base(self, spec, need_pristine: bool):
        base = super().load_base(spec, need_pristine)
        key = spec.base_key()
        if key not in self.fingerprints:
            self.fingerprints[key] = model_fingerprint(base.model)
        return base


class ChunkWorker:
    """A long-lived worker; the controller calls ``train_chunk``, one call at a time."""

    def __init__(self, name: str, create_model_blob: bytes, train_dataset, eval_dataset,
                 inputs: TrainingInputs, torch_threads: int | None = None):
        """``inputs`` comes without its model builder and datasets (``without_data``): the
        builder comes pickled, the datasets through Ray's object store, as arguments of their own
        (Ray resolves an object reference only when it is an argument)."""
        import peft  # noqa: F401  (imported now, while the worker starts, not in its first chunk)
        import torch
        import trl  # noqa: F401

        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"rapidfire-{name}-"))
        self.store = _ShippedStore(self.root)
        self.runs: dict[int, RunRecord] = {}
        # create_model comes pickled, so that a worker that cannot load it (a module only on the
        # driver's path) still starts and says why (check_loads, describe) instead of dying mute
        self.load_error: str | None = None
        create_model = None
        try:
            create_model = load_blob(create_model_blob)
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
        self.inputs = inputs.with_data(create_model, train_dataset, eval_dataset)
        self.factory = _FingerprintingFactory(self.store, self.inputs)
        device = "cuda:0" if torch.cuda.is_available() else "cpu"   # Ray sets CUDA_VISIBLE_DEVICES
        self.executor = LocalChunkExecutor(
            self.factory, self.store, f"{name}:{device}", Residency(inputs.offload),
            may_move=lambda rid: True,   # no checkpoint is written here: any run may be parked
            progress_of=lambda rid: self.runs[rid].progress)
        from rapidfire_nb.engine.fsio import open_append_text

        self._log = open_append_text(self.root / "worker.log")
        # a gang (engine/fsdp.py): joined once, for the worker's life; its sharded runs train on
        # their own factory (bases sharded over the gang) beside the single-device ones
        self._device = device
        self.gang = None
        self.gang_factory = None
        self.gang_executor = None

    def gang_address(self) -> tuple[str, int]:
        """Where the gang's rendezvous listens when this worker is its rank 0."""
        from rapidfire_nb.engine.fsdp import free_port

        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception:
            host = "127.0.0.1"
        return host, free_port(host)

    def join_gang(self, name: str, rank: int, size: int, addr: str, port: int,
                  timeout_s: float | None = None) -> dict:
        """Join the gang's process group (every member at once: each waits for the others)."""
        from rapidfire_nb.engine.fsdp import GANG_TIMEOUT_S, GangMembership, ShardedFactoryMixin

        membership = GangMembership(name, rank, size, addr, port, timeout_s or GANG_TIMEOUT_S)

        class _GangFactory(ShardedFactoryMixin, _FingerprintingFactory):
            pass

        factory = _GangFactory(self.store, self.inputs)
        factory.membership = membership
        self.gang, self.gang_factory = membership, factory
        self.gang_executor = LocalChunkExecutor(
            factory, self.store, f"{self.name}:{self._device}", Residency(self.inputs.offload),
            may_move=lambda rid: True, progress_of=lambda rid: self.runs[rid].progress)
        return {"gang": name, "rank": rank, "size": size, "backend": membership.backend}

    def _executor_for(self, rec: RunRecord):
        from rapidfire_nb.engine.sharding import is_sharded

        if is_sharded(rec.spec):
            if self.gang_executor is None:
                raise RuntimeError(f"worker {self.name} got a chunk of sharded run {rec.run_id} but "
                                   "is in no gang")
            return self.gang_executor, self.gang_factory
        return self.executor, self.factory

    def check_loads(self, blobs: dict, bases: list) -> dict:
        """The controller's check before any run exists: ``blobs`` (field -> cloudpickled value)
        loaded here, and the ``bases`` ([(spec, need_pristine)], pickled) built here.
        Returns {"errors": {field: "Type: message"}, "fingerprints": {base_key: fingerprint}}."""
        errors = {}
        if self.load_error:
            errors["create_model"] = self.load_error
        for field, blob in blobs.items():
            try:
                load_blob(blob)
            except Exception as exc:
                errors[field] = f"{type(exc).__name__}: {exc}"
        if not errors:
            try:
                for spec, need_pristine in load_blob(bases):
                    with routed_to(self._log):
                        self.factory.load_base(spec, need_pristine)
            except Exception as exc:
                errors["create_model"] = f"{type(exc).__name__}: {exc}"
        return {"errors": errors, "fingerprints": dict(self.factory.fingerprints)}

    def describe(self) -> dict:
        import torch

        if self.load_error:   # a replacement on a node that cannot load create_model
            raise RuntimeError(f"create_model cannot be loaded on worker {self.name}: {self.load_error}")

        try:
            import ray

            node_id = ray.get_runtime_context().get_node_id()
            node = ray.util.get_node_ip_address()
        except Exception:   # driven directly, outside Ray
            import socket

            node_id, node = None, socket.gethostname()
        return {"name": self.name, "node": node, "node_id": node_id, "pid": os.getpid(),
                "device": self.executor.device_name, "torch_threads": torch.get_num_threads(),
                "log": str(self.root / "worker.log")}

    def train_chunk(self, run_id: int, counters: dict, record: RunRecord | None = None,
                    checkpoint: dict | None = None, start_weights: dict | None = None) -> dict:
        """Train the next chunk of run ``run_id``.

        ``record`` (with ``checkpoint`` or ``start_weights``, or neither for a fresh run) comes
        when the run arrives here: a trainer this worker may still hold for it is dropped, and the
        run continues from what was shipped. Returns ``{"ok": True, "result": ChunkResult}``; a
        training error comes back as ``{"ok": False, "error": traceback, "reason": "Type: msg"}``
        (the kernel's run_status fields), the run's trainer
        already freed here (failure isolation: the worker goes on with the other runs); with
        ``"unfit": True`` when it was this worker's ``create_model`` that raised, building the
        run's base (the controller then excludes the worker, and the run trains elsewhere)."""
        t0 = time.perf_counter()
        started = time.time()   # wall clock: the controller splits the hop with it
        try:
            if record is not None:
                old = self.runs.get(run_id)
                if old is not None:
                    self._executor_for(old)[0].release(old)
                self.runs[run_id] = record
                if checkpoint is not None:
                    self.store.shipped[run_id] = unpack_tensors(checkpoint)
                if start_weights is not None:
                    self._executor_for(record)[0].set_start_weights(run_id, unpack_tensors(start_weights))
            rec = self.runs.get(run_id)
            if rec is None:
                raise RuntimeError(f"worker {self.name} holds no run {run_id} and got no state for it")
            for k, v in counters.items():
                setattr(rec, k, v)
            executor, factory = self._executor_for(rec)
            try:   # this worker's environment first: a base it cannot build is not the run's fault
                with routed_to(self._log), HF_STATE_LOCK:
                    factory.load_base(rec.spec, need_pristine=rec.spec.peft_config is None)
            except Exception as exc:
                tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                self.release(run_id)
                return {"ok": False, "unfit": True, "error": tb,
                        "reason": f"create_model raised on worker {self.name}: "
                                  f"{type(exc).__name__}: {exc}",
                        "worker_s": time.perf_counter() - t0}
            with routed_to(self._log):   # TRL/transformers warnings go to the worker's log
                result = executor.train_chunk(rec)
            result.chunk_event["worker"] = self.name
            result.state = pack_tensors(result.state)   # unpacked by the controller's book()
            return {"ok": True, "result": result, "worker_s": time.perf_counter() - t0,
                    "started": started, "returned": time.time(),
                    "fingerprints": dict(factory.fingerprints)}
        except Exception as exc:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.release(run_id)
            return {"ok": False, "error": tb, "reason": f"{type(exc).__name__}: {exc}",
                    "worker_s": time.perf_counter() - t0}
        finally:
            self.store.shipped.pop(run_id, None)

    def release(self, run_id: int) -> bool:
        """Free a run's trainer, adapter and optimizer here (it moved, finished, or was deleted)."""
        rec = self.runs.pop(run_id, None)
        self.store.shipped.pop(run_id, None)
        if rec is None:
            return False
        try:
            self._executor_for(rec)[0].release(rec)
        except RuntimeError:   # a sharded run on a worker in no gang: nothing was built
            pass
        return True

    def close(self) -> None:
        """Remove the scratch folder (TRL's output dirs, the worker log) before the actor is
        killed at ``end()``; a worker that dies keeps its folder (its log may say why). A gang
        member leaves its gang first: its process group, and on rank 0 the rendezvous' socket."""
        if self.gang is not None:
            try:
                self.gang.close()
            except Exception:
                pass   # the kill that follows ends the process, and its sockets, anyway
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def holds(self) -> list[int]:
        gang = self.gang_executor.live_run_ids() if self.gang_executor is not None else []
        return sorted(self.executor.live_run_ids() + gang)
