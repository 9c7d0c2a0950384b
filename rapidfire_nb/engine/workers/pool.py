"""The Ray side of the controller: connecting, the worker actors, and noticing their deaths.

Where the workers run:
- Ray already initialised in this process (``ray.init(address=...)``), or ``RAY_ADDRESS`` set:
  that cluster, across its machines;
- otherwise a local Ray started here (no dashboard, worker output kept out of the notebook).
Each worker claims one GPU (``num_gpus=1``) when the cluster has GPUs, else it trains on CPUs;
CPUs are shared out evenly and each worker's torch uses as many threads as it claimed CPUs
(at most ``RAPIDFIRE_WORKER_THREADS`` when that is set: ``rapidfire bench --threads`` sets it).

A worker's death (a killed actor, out of memory, a lost node) shows as ``RayActorError`` on the
chunk it was training: ``WorkerEngine`` then forgets what the worker held and continues its runs
elsewhere from their last checkpoints.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine.workers import RAY_MISSING
from rapidfire_nb.errors import ConfigError


def connect():
    """The ``ray`` module, connected: the user's cluster if they chose one, else a local one."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            # logical CPUs: a worker needs one even on a machine with fewer cores than workers
            ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False)
    return ray


@dataclass
class WorkerSlot:
    index: int
    name: str
    actor: Any
    alive: bool = True
    info: dict = field(default_factory=dict)   # node, pid, device, torch threads (once known)
    busy_with: int | None = None               # run id of the chunk in flight
    last: int | None = None                    # the run it trained last
    chunks: int = 0                            # chunks it trained that were booked
    created: float = field(default_factory=time.monotonic)


class RayWorkerPool:
    """``n`` ChunkWorker actors, created at ``start`` (in the caller's thread: errors show there)."""

    def __init__(self, n: int, create_model, train_dataset, eval_dataset, num_chunks: int, seed: int,
                 build_args, build_lora, offload: str = "auto"):
        self.n = n
        self._worker_args = (create_model, train_dataset, eval_dataset, num_chunks, seed,
                             build_args, build_lora, offload)
        self.slots: list[WorkerSlot] = []
        self.ray = None
        self.resources: dict = {}
        self._refs: tuple = ()
        self._next_index = 0
        self.start_s = 0.0

    # -- start / top up ------------------------------------------------------------------------
    def start(self) -> None:
        if self.ray is not None:
            return
        t0 = time.perf_counter()
        ray = connect()
        self.ray = ray
        total = ray.cluster_resources()
        gpus, cpus = int(total.get("GPU", 0)), int(total.get("CPU", 0))
        if gpus and gpus < self.n:
            raise ConfigError(f"num_workers={self.n} but the Ray cluster has {gpus} GPU(s); each "
                              f"worker owns one GPU: use num_workers<={gpus} (or 'auto')")
        per_cpu = cpus // self.n if cpus >= self.n else 0
        if not gpus and not per_cpu:
            raise ConfigError(f"num_workers={self.n} but the Ray cluster has {cpus} CPU(s) and no "
                              f"GPU; use num_workers<={cpus}")
        self.resources = {"num_gpus": 1 if gpus else 0, "num_cpus": per_cpu}
        self._wait_for_free_resources(ray, gpus, cpus)
        create_model, train, evald, *rest = self._worker_args
        # put once: every worker (and every replacement) reads the same objects
        self._refs = (ray.put(create_model), ray.put(train), ray.put(evald))
        self._rest = rest
        for _ in range(self.n):
            self._add_worker()
        self.start_s = time.perf_counter() - t0

    def _wait_for_free_resources(self, ray, gpus: int, cpus: int, patience_s: float = 15.0) -> None:
        """Workers that cannot be placed would wait forever: refuse now if the cluster's GPUs (or
        CPUs) are held by others, e.g. the workers of an Experiment not yet ended (an ended one's
        are freed within seconds, hence the short patience)."""
        need = self.n * self.resources["num_gpus"]
        need_cpu = self.n * self.resources["num_cpus"]
        deadline = time.monotonic() + patience_s
        while True:
            free = ray.available_resources()
            ok = free.get("GPU", 0) >= need and free.get("CPU", 0) >= need_cpu
            if ok or time.monotonic() >= deadline:
                break
            time.sleep(0.25)
        if not ok:
            held = (f"{int(free.get('GPU', 0))} of its {gpus} GPUs" if gpus and free.get("GPU", 0) < need
                    else f"{int(free.get('CPU', 0))} of its {cpus} CPUs")
            raise ConfigError(f"num_workers={self.n}: only {held} are free on the Ray cluster (other "
                              "work holds the rest: an Experiment with workers holds them until its "
                              "end()); end it, or ask for fewer workers")

    def _add_worker(self) -> WorkerSlot:
        from rapidfire_nb.engine.workers.worker import ChunkWorker

        ray = self.ray
        index = self._next_index
        self._next_index += 1
        name = f"w{index}"
        cls = ray.remote(ChunkWorker).options(
            num_gpus=self.resources["num_gpus"], num_cpus=self.resources["num_cpus"],
            max_restarts=0, max_task_retries=0, name=None)
        num_chunks, seed, build_args, build_lora, offload = self._rest
        threads = max(1, self.resources["num_cpus"])
        cap = os.environ.get("RAPIDFIRE_WORKER_THREADS", "")
        if cap.isdigit() and int(cap) > 0:
            threads = min(threads, int(cap))
        actor = cls.remote(name, *self._refs, num_chunks, seed, build_args, build_lora, offload,
                           threads)
        slot = WorkerSlot(index=index, name=name, actor=actor)
        self.slots.append(slot)
        return slot

    def top_up(self) -> list[WorkerSlot]:
        """Replace dead workers (when a loop starts again after losing some): new actors."""
        if self.ray is None:
            return []
        return [self._add_worker() for _ in range(self.n - len(self.live()))]

    # -- state ----------------------------------------------------------------------------------
    def live(self) -> list[WorkerSlot]:
        return [s for s in self.slots if s.alive]

    def idle(self) -> list[WorkerSlot]:
        """Live workers that are up (described) and train nothing now."""
        return [s for s in self.slots if s.alive and s.info and s.busy_with is None]

    def resources_free(self, count: int = 1) -> bool:
        """True when the cluster has room for ``count`` more workers now."""
        free = self.ray.available_resources()
        return (free.get("GPU", 0) >= count * self.resources["num_gpus"]
                and free.get("CPU", 0) >= count * self.resources["num_cpus"])

    def add_worker(self) -> WorkerSlot:
        """One more actor (a replacement); it is up once its ``describe`` answers."""
        return self._add_worker()

    def release(self, slot: WorkerSlot, run_id: int) -> None:
        """Ask a worker to drop a run (ordered after the chunk it may be training; no wait)."""
        if slot.alive:
            try:
                slot.actor.release.remote(run_id)
            except Exception:
                pass

    def is_death(self, exc: BaseException) -> bool:
        ray = self.ray
        return isinstance(exc, (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                                ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                                ray.exceptions.ObjectLostError))

    def kill(self, slot: WorkerSlot) -> None:
        slot.alive = False
        try:
            self.ray.kill(slot.actor, no_restart=True)
        except Exception:
            pass

    def shutdown(self) -> None:
        """Kill the workers (the Ray session itself stays: starting one costs seconds)."""
        if self.ray is None:
            return
        if not self.ray.is_initialized():
            return
        live = [s for s in self.slots if s.alive]
        try:   # let them remove their scratch folders first (a few seconds at most)
            refs = [s.actor.close.remote() for s in live]
            self.ray.wait(refs, num_returns=len(refs), timeout=5)
        except Exception:
            pass
        for s in live:
            self.kill(s)
