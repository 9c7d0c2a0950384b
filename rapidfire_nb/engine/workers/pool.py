"""The Ray side of the controller: connecting, the worker actors, and noticing their deaths.

Where the workers run:
- Ray already initialised in this process (``ray.init(address=...)``), or ``RAY_ADDRESS`` set:
  that cluster, across its machines;
- otherwise a local Ray started here (no dashboard, worker output kept out of the notebook).
Each worker claims one GPU (``num_gpus=1``) when the cluster has GPUs, else it trains on CPUs;
CPUs are shared out evenly and each worker's torch uses as many threads as it claimed CPUs
(at most ``RAPIDFIRE_WORKER_THREADS`` when that is set: ``rapidfire bench --threads`` sets it).

A worker's death (a killed actor, out of memory, a lost node) shows as ``RayActorError`` on the
chunk it was training: the Ray executor (``RemoteChunkExecutor``) then forgets what the worker
held and continues its runs elsewhere from their last checkpoints.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine.inputs import TrainingInputs
from rapidfire_nb.errors import ConfigError

RAY_MISSING = ("Ray is not installed; workers need it: pip install -e '.[ray]' from the clone "
               "(or pip install 'ray>=2.60')")

_PLACEMENT_S = 300.0   # how long a new worker may take to start (imports, a node to come up)
# replacements of lost workers stop after this many workers in a row were lost before training a
# chunk (a create_model the workers cannot unpickle or that raises there, a GPU that fails at
# once): no endless loop
MAX_FAILED_STARTS = 3


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
            init_local_ray(ray)
    _keep_ray_errors_out_of_the_cell(ray)
    return ray


def init_local_ray(ray) -> None:
    """A Ray of our own, for this machine alone: every server it starts (GCS, raylet, object
    manager, workers, the driver's own) listens on the loopback interface only. With
    ``RAY_AUTH_MODE=disabled`` anything that reaches those ports can run code.

    Ray binds its servers to the node's address and turns a loopback address given as
    ``_node_ip_address`` into the machine's network address, unless it runs as a single-machine
    Ray (its mode on macOS and Windows, chosen by ``ray_constants.ENABLE_RAY_CLUSTER``, which
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` sets at import): that mode is chosen for the start."""
    try:
        from ray._private import ray_constants
    except ImportError:   # another Ray layout: the address alone (tests/workers/test_ray_session.py checks)
        ray_constants = None
    was = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if ray_constants is not None and was is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        # logical CPUs: a worker needs one even on a machine with fewer cores than workers
        ray.init(num_cpus=os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1")
    finally:
        if ray_constants is not None and was is not None:
            ray_constants.ENABLE_RAY_CLUSTER = was


# Ray's own error notices about the cluster ("(raylet) A worker died or was killed while executing
# a task..."): kept here, and in the debug log, instead of in the notebook cell that happens to be
# running; the engine says what happened in its ``worker_lost`` event.
RAY_NOTICES: list[str] = []
_NOTICES_KEPT = 200


def _keep_ray_errors_out_of_the_cell(ray) -> None:
    """Ray's driver prints the errors the cluster publishes (``pid`` "raylet") from a thread of
    its own, straight to ``sys.stdout``, even with ``log_to_driver=False``. That thread calls
    ``ray._private.worker.print_to_stdstream`` by name: wrapped, those records go to
    ``RAY_NOTICES`` and the ``rapidfire_nb.ray`` logger (debug level); every other record (the
    workers' own output, when a user's ``ray.init`` asked for it) is printed as before."""
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "_rapidfire_wrapped", False):
        return
    import logging

    log = logging.getLogger("rapidfire_nb.ray")

    def print_to_stdstream(data, *args, **kwargs):
        if isinstance(data, dict) and data.get("pid") == "raylet":
            for line in data.get("lines") or []:
                RAY_NOTICES.append(plain(str(line)))
                log.debug("ray: %s", line)
            del RAY_NOTICES[:-_NOTICES_KEPT]
            return None
        return original(data, *args, **kwargs)

    print_to_stdstream._rapidfire_wrapped = True
    ray_worker.print_to_stdstream = print_to_stdstream


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_CALL = re.compile(r"ray::[\w.]+\(\)\s*(\([^)]*\))?\s*")   # ray::ChunkWorker.f() (pid=.., actor_id=..)
_IDS = re.compile(r",?\s*\b(actor_id|pid|ip|task_id|worker_id|node_id)=[\w.:-]+")


def plain(text: str) -> str:
    """Ray's error text without colour codes, its call wrapper, pids and actor ids."""
    text = _RAY_CALL.sub("", _ANSI.sub("", text))
    return _IDS.sub("", text).strip()


def load_hint(error: str) -> str:
    if error.startswith("ModuleNotFoundError") or "No module named" in error:
        return error + ": define it in the notebook or install it on every node"
    return error


def dumps_for_workers(field: str, value) -> bytes:
    """``value`` pickled as Ray pickles it (cloudpickle); a ConfigError naming ``field`` if not."""
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:
        raise ConfigError(f"{field} cannot be sent to the Ray workers: {type(exc).__name__}: "
                          f"{plain(str(exc)).splitlines()[0] if str(exc) else ''} (what it uses must "
                          "pickle: no locks, open files or live connections)") from None


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
    gang: Any = None                           # the Gang it belongs to (for its life), if any


@dataclass
class Gang:
    """k workers that train the chunks of runs sharded over k devices together, in lockstep
    (one slot of the executor for those runs). Formed once (its members join one process group
    at the first chunk sent to it) and kept across chunks and runs; a member's death ends it."""

    index: int
    members: list
    alive: bool = True
    formed: bool = False
    ended: bool = False      # a member was lost: its peers were stopped and replaced
    busy_with: int | None = None
    last: int | None = None
    chunks: int = 0

    @property
    def name(self) -> str:
        return "+".join(m.name for m in self.members)

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def info(self) -> dict:
        return self.members[0].info if all(m.info for m in self.members) else {}

    def idle(self) -> bool:
        return self.busy_with is None and all(m.alive and m.info and m.busy_with is None
                                              for m in self.members)


def root_line(exc: BaseException | str) -> str:
    """One plain line for a reason: Ray wraps a worker's own error (its traceback as text); the
    last ``SomeError: message`` line of that text is what went wrong."""
    lines = [ln.strip() for ln in plain(str(exc)).splitlines()]
    errors = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit): ", ln)]
    line = errors[-1] if errors else (lines[0] if lines else "")
    return line[:300]


class RayWorkerPool:
    """``n`` ChunkWorker actors, created at ``start`` (in the caller's thread: errors show there)."""

    def __init__(self, n: int, inputs: TrainingInputs):
        self.n = n
        self.inputs = inputs
        self.slots: list[WorkerSlot] = []
        self.ray = None
        self.resources: dict = {}
        self._refs: tuple = ()
        self._next_index = 0
        self.start_s = 0.0
        self.fingerprints: dict[str, tuple[str, str]] = {}   # base key -> (worker, fingerprint)
        self.replacements = Replacements(self)

    # -- start / top up ------------------------------------------------------------------------
    def start(self, blobs: dict | None = None, bases: list | None = None) -> None:
        """Connect, start the workers, and check that they can load what they need: ``blobs``
        (field -> its ``dumps_for_workers`` bytes: the runs' callables) and ``bases`` ([(spec, need_pristine)], built on
        every worker and compared). Any problem is a ConfigError naming the field; the workers
        are then killed again."""
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
        inputs = self.inputs
        create_model, train, evald = inputs.create_model, inputs.train_dataset, inputs.eval_dataset
        fields = dict(blobs or {})
        model_blob = dumps_for_workers("create_model", create_model)
        bases_blob = dumps_for_workers("the run configs", bases or [])
        # put once: every worker (and every replacement) reads the same objects
        refs = [ray.put(model_blob)]
        for what, ds in (("train_dataset", train), ("eval_dataset", evald)):
            try:
                refs.append(ray.put(ds))
            except Exception as exc:
                raise ConfigError(f"{what} cannot be sent to the Ray workers: "
                                  f"{type(exc).__name__}: {plain(str(exc))[:300]}") from None
        self._refs = tuple(refs)
        for _ in range(self.n):
            self._add_worker()
        try:
            self._check_loads(fields, bases_blob)
        except BaseException:
            self.shutdown()
            self.slots.clear()
            raise
        self.start_s = time.perf_counter() - t0

    def _check_loads(self, fields: dict, bases_blob: bytes, timeout_s: float = 300.0) -> None:
        """One round trip to every new worker: it loads each field and builds each base."""
        ray = self.ray
        refs = {s.actor.check_loads.remote(fields, bases_blob): s for s in self.slots}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        if late:
            raise ConfigError(f"the Ray workers did not start within {timeout_s:.0f} s (each asks "
                              f"for {self.resources})")
        for ref in ready:
            slot = refs[ref]
            try:
                reply = ray.get(ref)
            except Exception as exc:   # the actor could not start (e.g. a dataset it cannot load)
                raise ConfigError(f"Ray worker {slot.name} could not start: "
                                  f"{load_hint(root_line(exc))}") from None
            for what, error in reply["errors"].items():
                raise ConfigError(f"{what} cannot be loaded on Ray worker {slot.name}: "
                                  f"{load_hint(plain(error))}")
            for key, fp in reply["fingerprints"].items():
                self.note_fingerprint(slot.name, key, fp)

    def note_fingerprint(self, worker: str, key: str, fp: str) -> None:
        """Remember a worker's base fingerprint; a ConfigError if it differs from another's."""
        first = self.fingerprints.setdefault(key, (worker, fp))
        if first[1] != fp:
            raise ConfigError(f"create_model built a different model on worker {worker} than on "
                              f"{first[0]} (base {key!r}: fingerprint {fp} vs {first[1]}); runs move "
                              "between workers, so create_model must build the same weights in "
                              "every process (fixed weights or a fixed seed)")

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
        threads = max(1, self.resources["num_cpus"])
        cap = os.environ.get("RAPIDFIRE_WORKER_THREADS", "")
        if cap.isdigit() and int(cap) > 0:
            threads = min(threads, int(cap))
        actor = cls.remote(name, *self._refs, self.inputs.without_data(), threads)
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
        if isinstance(slot, Gang):
            for member in slot.members:
                self.release(member, run_id)
            return
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


class Replacements:
    """The pool's replacement policy: workers started in place of lost ones, and when to give up.

    A lost worker is owed a replacement while runs are left to train; it is started once the
    cluster has room (within ``placement_s``, else no more are started). A worker lost before it
    trained a chunk, because it died starting or because its environment could not build a run's
    base, is a failed start: after ``MAX_FAILED_STARTS`` in a row none is started any more (the
    reason is kept in ``not_replaced``), until the next loop start (a user's resume) tries once
    more. Everything runs under the engine lock; only ``describe`` waits."""

    def __init__(self, pool: RayWorkerPool):
        self.pool = pool
        self.placement_s = _PLACEMENT_S
        self.starting: dict = {}          # describe() ref -> replacement worker not yet up
        self.owed = 0                     # lost workers to replace once the cluster has room
        self.owed_since = 0.0
        self.failed_starts = 0            # workers in a row lost before training a chunk
        self.not_replaced: str | None = None   # why replacements stopped, for the stop reason

    def restart(self) -> list[WorkerSlot]:
        """A loop starts: forget earlier give-ups, top the pool up; the workers not yet up."""
        self.owed, self.failed_starts, self.not_replaced = 0, 0, None
        self.starting.clear()
        self.pool.top_up()
        return [s for s in self.pool.live() if not s.info]

    def describe(self, slots: list[WorkerSlot]):
        """Outside the lock: wait for ``slots`` to say where they run. Returns (up, lost), lost
        being (slot, error) of those that could not start or were never placed (killed)."""
        ray = self.pool.ray
        refs = {s.actor.describe.remote(): s for s in slots}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=_PLACEMENT_S)
        up, lost = [], []
        for ref in ready:
            self._came_up(refs[ref], ref, up, lost)
        for ref in late:               # never placed: it would hold its chunks forever
            slot = refs[ref]
            self.pool.kill(slot)
            lost.append((slot, TimeoutError(
                f"worker {slot.name} was not placed on the Ray cluster within {_PLACEMENT_S:.0f} s "
                f"(it asks for {self.pool.resources})")))
        return up, lost

    def _came_up(self, slot: WorkerSlot, ref, up: list, lost: list) -> None:
        """A worker's ``describe`` answered: it is up, or it could not start (or load
        ``create_model``) and is gone."""
        try:
            slot.info = self.pool.ray.get(ref)
            up.append(slot)
        except Exception as exc:
            self.pool.kill(slot)
            lost.append((slot, exc))

    def tick(self, active: bool, draining: bool):
        """Every loop turn, never blocking: take in replacements that came up (or died starting)
        and start those owed when the cluster has room. Returns (up, lost) as ``describe``."""
        ray = self.pool.ray
        up, lost = [], []
        if self.starting:
            refs = list(self.starting)
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                slot = self.starting.pop(ref)
                if slot.alive:      # else killed meanwhile (end())
                    self._came_up(slot, ref, up, lost)
            for ref, slot in list(self.starting.items()):
                if time.monotonic() - slot.created > self.placement_s:
                    del self.starting[ref]
                    self.pool.kill(slot)
                    lost.append((slot, TimeoutError(
                        f"replacement worker {slot.name} was not up on the Ray cluster within "
                        f"{self.placement_s:.0f} s (it asks for {self.pool.resources})")))
        while self.owed and not draining:
            if not active:
                self.owed = 0   # nothing left to train: no replacement needed
                break
            if not self.pool.resources_free():
                if time.monotonic() - self.owed_since > self.placement_s:
                    self.not_replaced = (f"the Ray cluster had no room for a replacement worker "
                                         f"within {self.placement_s:.0f} s")
                    self.owed = 0
                break
            slot = self.pool.add_worker()
            self.starting[slot.actor.describe.remote()] = slot
            self.owed -= 1
            self.owed_since = time.monotonic()
        return up, lost

    def lost(self, slot: WorkerSlot, cause: str, *, stopping: bool, active: bool) -> str | None:
        """A worker was lost (dead, or excluded): owe a replacement or give up. Returns what the
        ``worker_lost`` event says about its replacement."""
        if slot.chunks == 0:
            self.failed_starts += 1
        if self.failed_starts >= MAX_FAILED_STARTS:
            self.not_replaced = (f"not replaced: {self.failed_starts} workers in a row died before "
                                 f"training a chunk (or could not build a run's base); the last "
                                 f"one: {cause}")
            self.owed = 0
            return self.not_replaced
        if stopping:
            return None
        if not active:
            return "none: no run is left to train"
        if not self.owed:
            self.owed_since = time.monotonic()
        self.owed += 1
        return "a replacement worker starts as soon as the Ray cluster has room"

    def trained(self) -> None:
        """A worker trained a chunk: starts work again."""
        self.failed_starts = 0

    def recovering(self) -> bool:
        return bool(self.starting or self.owed)

    def drop(self) -> None:
        """When the loop leaves: replacements still starting are killed (they would hold a GPU
        until end()), and none is owed any more; a later loop tops up again."""
        for slot in self.starting.values():
            self.pool.kill(slot)
        self.starting.clear()
        self.owed = 0
