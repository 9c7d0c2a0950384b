"""The workers' rule: which run an idle Ray worker (or gang) trains next. Pure Python, no Ray,
no torch.

Runs stay on the worker that holds their trainer (a swap there is as cheap as in the kernel);
moving one costs a trainer build on the new worker and shipping its checkpoint, so it happens
only to keep the runs level:

- Per worker, of the runs it holds, least progress first; ties go to the run it trained last
  (nothing to swap), then to the lowest id. A run whose checkpoint the kernel is still writing
  counts as busy, so the worker takes another one rather than wait for the write (the kernel's
  rule in fair.py gets the same by putting the run trained last after those it ties with).
- New runs (and runs whose worker died) are shared out: a worker takes one while it holds fewer
  than its share, ``ceil(schedulable runs / live workers)``.
- Across workers, progress may differ by at most ``LAG`` chunks: a worker whose own runs are further
  ahead than that takes (moves) a run of least progress from another worker instead; so does a
  worker with nothing of its own left to train. Such moves are only made in a second pass
  (``allow_move``), after every idle worker had the chance to take its own runs, so two idle
  workers never trade runs.
- ``barrier=True`` (AutoML attached: a pruner judges runs when they reach a rung): no run starts
  chunk k+1 while any schedulable run, in flight or not, has not finished chunk k, so every
  decision taken at a chunk boundary sees the runs where the kernel's engine would show them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from rapidfire_nb.engine.scheduling.fair import RunView

LAG = 1


def choose_for_worker(runs: Iterable[RunView], worker: int, home: Mapping[int, int],
                      last: int | None = None, allow_move: bool = True,
                      live_workers: int = 1, barrier: bool = False) -> int | None:
    """The run that ``worker`` should train next, or None.

    ``home``: run id -> the live worker holding that run's trainer (runs held by no live worker are
    absent). ``last``: the run this worker trained last. ``live_workers``: how many share the runs.
    ``barrier``: see the module docstring."""
    runs = [r for r in runs if r.schedulable]
    candidates = [r for r in runs if not r.busy]
    if barrier and candidates:
        floor = min(r.progress for r in runs)   # in-flight runs count: they have not finished it
        candidates = [r for r in candidates if r.progress == floor]
    if not candidates:
        return None
    share = math.ceil(len(runs) / max(1, live_workers))
    held = sum(1 for r in runs if home.get(r.run_id) == worker)
    mine = [r for r in candidates if home.get(r.run_id) == worker]
    if held < share:
        mine += [r for r in candidates if r.run_id not in home]
    least = min(r.progress for r in candidates)
    if mine:
        least_mine = min(r.progress for r in mine)
        if least_mine <= least + LAG:
            front = [r for r in mine if r.progress == least_mine]
            return min(front, key=lambda r: (r.run_id != last, r.run_id in home and home[r.run_id] != worker,
                                             r.run_id)).run_id
    if not allow_move:
        return None
    front = [r for r in candidates if r.progress == least]
    # a run nobody holds before one that another worker holds
    return min(front, key=lambda r: (r.run_id in home, r.run_id)).run_id
