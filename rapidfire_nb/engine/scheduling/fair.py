"""The kernel's fair rule: which run the one device trains next. Pure Python, no torch.

Like Ray Tune's TrialScheduler, this module only decides; the engine does the work.
Fairness: on one device, no run starts chunk k+1 while another schedulable run has not finished
chunk k. The rule that guarantees it: always pick the schedulable run with the least progress
(the epoch and chunk it trains next, compared in that order); ties go to the lowest run id, but
the run trained last goes after the others it ties with. So runs that train from the start
together go round in id order, and no run trains two chunks back to back while another could go:
the run just trained would wait for its own checkpoint write (a few ms on a CPU, more for a large
adapter on a GPU), which overlaps the next chunk when another run trains it, and costs more than
the swap it saves.

``parking_order`` is the same rule read backwards: a device short of memory moves off first the
runs this rule comes back to last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class RunView:
    """What the rules need to know about a run."""

    run_id: int
    progress: int          # orders runs by the (epoch, chunk) they train next; only its order counts
    schedulable: bool      # pending or running, with steps left
    busy: bool = False     # being trained on some device right now


def choose_fair(runs: Iterable[RunView], last: int | None = None) -> int | None:
    """The run the device should train next, or None when nothing is schedulable.
    ``last``: the run the device trained last (it goes after the runs it ties with)."""
    candidates = [r for r in runs if r.schedulable and not r.busy]
    if not candidates:
        return None
    least = min(r.progress for r in candidates)
    front = [r.run_id for r in candidates if r.progress == least]
    others = [rid for rid in front if rid != last]
    return min(others or front)


def parking_order(runs: Iterable[RunView]) -> list[int]:
    """Idle runs in the order to move them off a device that is short of memory: the ones the
    fair rule will come back to last go first (most progress, then the highest id), so a run
    is not parked just before it trains."""
    return [r.run_id for r in sorted(runs, key=lambda r: (r.progress, r.run_id), reverse=True)]
