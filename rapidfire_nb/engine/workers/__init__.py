"""Chunks trained on several devices: one Ray actor per GPU, under the kernel's controller.

The kernel's engine thread stays the controller (scheduler, op queue, event log, checkpoints); a
chunk ("run R, chunk c") is trained by a long-lived worker that keeps the shared base model(s) and
its resident runs' trainers, exactly as the in-kernel engine keeps them, and sends back the chunk's
events and the state to checkpoint.

- ``worker.py``  ``ChunkWorker``: the actor's body; it trains chunks with the in-kernel engine's
  own chunk executor (``LocalChunkExecutor.train_chunk``), nothing re-implemented.
- ``pool.py``    connecting to Ray (or starting it), the actors, their deaths, and the
  replacement policy (``Replacements``).
- ``executor.py``  ``RemoteChunkExecutor``: one slot per worker under the engine's one loop
  (engine/controller.py), starting and replacing workers through the executor's lifecycle hooks.

Which run a worker or a gang of workers trains next is decided in ``engine/scheduling/`` (pure).

Nothing here imports Ray at module level, and ``rapidfire_nb`` imports this package only when
an experiment asks for workers: the single-device path never loads Ray.
"""

from __future__ import annotations

import os
import sys

from rapidfire_nb.engine.workers.pool import RAY_MISSING  # no Ray import there at module level
from rapidfire_nb.errors import ConfigError


def check_num_workers(num_workers) -> None:
    """Refuse a bad ``num_workers`` when the Experiment is created."""
    if num_workers == "auto":
        return
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"num_workers={num_workers!r}: use 'auto' (one Ray worker per GPU when "
                          "there are several, else the in-kernel engine), 0 (the in-kernel engine) "
                          "or a number of Ray workers >= 1")


def ray_cluster_requested() -> bool:
    """True when the user already chose a Ray cluster: ``ray.init(...)`` done in this process
    (Ray imported and initialised) or ``RAY_ADDRESS`` set. Never imports Ray itself."""
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        return True
    return bool(os.environ.get("RAY_ADDRESS"))


def ray_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


def cluster_auto_workers(gpus: int) -> int:
    """``"auto"`` on a Ray cluster the user chose: one worker per cluster GPU when there are two or
    more. With fewer, training stays in this kernel, which the user who just connected to a cluster
    does not expect, so it is said, with the way to train on the cluster anyway."""
    if gpus >= 2:
        return gpus
    import warnings

    from rapidfire_nb.errors import RapidFireConfigWarning

    warnings.warn(f"num_workers='auto': the Ray cluster chosen (ray.init or RAY_ADDRESS) has {gpus} "
                  "GPU(s), fewer than 2, so training runs in this kernel, not on the cluster; pass "
                  "Experiment(..., num_workers=n) to train on n Ray workers of the cluster",
                  RapidFireConfigWarning, stacklevel=4)
    return 0


def resolve_num_workers(num_workers) -> int:
    """How many Ray workers to start; 0 means the in-kernel engine (no Ray).

    ``"auto"``: with a Ray cluster chosen by the user (``ray.init`` or ``RAY_ADDRESS``), one worker
    per GPU of that cluster (the in-kernel engine, with a warning, if it has at most one GPU); otherwise one worker
    per visible GPU when there are two or more, else 0. Explicit ``n``: n workers."""
    check_num_workers(num_workers)
    if num_workers != "auto":
        if num_workers > 0 and not ray_available():
            raise ConfigError(f"num_workers={num_workers}: {RAY_MISSING}")
        return num_workers
    if ray_cluster_requested():
        if not ray_available():
            raise ConfigError(f"RAY_ADDRESS is set: {RAY_MISSING}")
        from rapidfire_nb.engine.workers.pool import connect

        return cluster_auto_workers(int(connect().cluster_resources().get("GPU", 0)))
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        gpus = 0
    if gpus < 2:
        return 0
    if not ray_available():
        import warnings

        warnings.warn(f"{gpus} GPUs are visible but {RAY_MISSING}; training on one GPU in the kernel",
                      stacklevel=3)
        return 0
    return gpus
