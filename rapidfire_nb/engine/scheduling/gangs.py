"""The gang rule: at one dispatch, which gangs to form and which worker or gang trains which run.
Pure Python, no Ray, no torch: it reads frozen views and returns a plan; the Ray executor
(engine/workers/executor.py) forms the gangs it names and sends the chunks in its order.

A run sharded over k devices trains on the gang of k workers: one gang per size, kept while
it and its members live, else formed again from the first k live workers (by index) that belong
to no live gang. Gangs are formed for every size a run asks for, in increasing size, whether or
not such a run waits now, so a gang is ready the moment one does.

Who trains what, in this order:

1. For each gang size k, smallest first: the runs waiting for the gang (schedulable, not busy)
   against every other waiting run. When the least progress among the gang's runs is ahead of
   the least progress among the others, the gang is left alone this time: a run behind trains
   first (on the members, if it is theirs), so no run is starved by a gang that keeps its
   workers. Otherwise the members are reserved for the gang (they take no single-device run,
   so the gang's runs keep pace), and when the gang is idle it takes the run the workers' rule
   (workers.py) picks for it, as for one worker that may move runs.
2. Every idle worker not reserved takes the single-device run the workers' rule picks for it,
   first without moving a run between workers, then, in a second pass, with moves; the runs are
   shared out among the live workers not reserved.

Each decision is followed by its dispatch, which changes what the next decision sees: the run
becomes busy and held by the one that took it, and that worker or gang is no longer idle. The
plan applies the same change to its own copy, so it is the sequence a dispatch-as-you-go loop
produces. A dispatch can fail (an unreadable checkpoint fails its run): then the run is no longer
schedulable, nobody holds it, and the worker stays idle; ``failed`` names such runs so that the
executor, learning of a failure, recomputes the plan from the same views and goes on with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from rapidfire_nb.engine.scheduling.fair import RunView
from rapidfire_nb.engine.scheduling.workers import choose_for_worker


@dataclass(frozen=True)
class WorkerView:
    """A live worker that is up (its node and device known)."""

    index: int
    idle: bool = True           # trains nothing now
    last: int | None = None     # the run it trained last
    gang: int | None = None     # the index of the live gang it belongs to; None: free to join one


@dataclass(frozen=True)
class GangView:
    """The gang kept for runs sharded over ``len(members)`` devices."""

    index: int
    members: tuple[int, ...]    # worker indices, rank order
    usable: bool = True         # the gang and every member still alive
    busy: bool = False          # a chunk of it in flight
    last: int | None = None     # the run it trained last

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class PlacedRun:
    """A run as the gang rule sees it."""

    run_id: int
    progress: int               # as RunView.progress
    active: bool                # pending or running
    busy: bool = False          # its chunk in flight, or its checkpoint being written
    devices: int = 1            # > 1: sharded, trains on the gang of that size; else on one worker
    home: int | None = None     # the live worker or gang holding its trainer


@dataclass(frozen=True)
class DispatchView:
    workers: tuple[WorkerView, ...]      # live and up, in the pool's order
    gangs: tuple[GangView, ...] = ()     # the gangs kept so far, one per size
    runs: tuple[PlacedRun, ...] = ()     # every run of the experiment, in its order
    barrier: bool = False                # a boundary hook is attached (workers.py)
    gangs_formed: int = 0                # gangs formed so far: a new one is index -(count + 1)


@dataclass(frozen=True)
class GangForm:
    """A gang to form: its size, its index and its members (worker indices, rank order)."""

    size: int
    index: int
    members: tuple[int, ...]


@dataclass(frozen=True)
class Assignment:
    """Train ``run_id`` on worker ``worker``, or on the gang of size ``gang`` (one is None)."""

    run_id: int
    worker: int | None = None
    gang: int | None = None


@dataclass(frozen=True)
class Plan:
    forms: tuple[GangForm, ...]
    assignments: tuple[Assignment, ...]


def plan_dispatch(view: DispatchView, failed: Iterable[int] = ()) -> Plan:
    """Which gangs to form and, in order, which run each idle worker or gang trains (see the
    module docstring). ``failed``: runs whose dispatch is known to fail."""
    failed = frozenset(failed)
    runs = {r.run_id: r for r in view.runs}
    home = {r.run_id: r.home for r in view.runs if r.home is not None}
    idle = {w.index for w in view.workers if w.idle}
    last = {w.index: w.last for w in view.workers}
    member_of = {w.index: w.gang for w in view.workers}
    kept = {g.size: g for g in view.gangs}
    forms: list[GangForm] = []
    out: list[Assignment] = []

    def views(keep) -> list[RunView]:
        return [RunView(r.run_id, r.progress, r.active and keep(r), busy=r.busy) for r in runs.values()]

    def took(a: Assignment, holder: int, members: Iterable[int]) -> bool:
        """Book ``a`` in the local copy as its dispatch leaves things; True when it succeeded."""
        out.append(a)
        r = runs[a.run_id]
        if a.run_id in failed:
            runs[a.run_id] = replace(r, active=False)
            home.pop(a.run_id, None)
            return False
        runs[a.run_id] = replace(r, busy=True)
        home[a.run_id] = holder
        idle.difference_update(members)
        return True

    reserved: set[int] = set()
    for k in sorted({r.devices for r in view.runs if r.devices > 1}):
        gang = kept.get(k)
        if gang is None or not gang.usable:
            free = sorted(w.index for w in view.workers if member_of[w.index] is None)
            if len(free) < k:
                continue
            form = GangForm(k, -(view.gangs_formed + len(forms) + 1), tuple(free[:k]))
            forms.append(form)
            for m in form.members:
                member_of[m] = form.index
            gang = kept[k] = GangView(form.index, form.members)
        ready = [v for v in views(lambda r: True) if v.schedulable and not v.busy]
        waiting = [v for v in ready if runs[v.run_id].devices == k]
        others = [v for v in ready if runs[v.run_id].devices != k]
        if not waiting:
            continue
        if others and min(v.progress for v in waiting) > min(v.progress for v in others):
            continue   # a run behind it trains first (on the members, if it is theirs)
        reserved.update(gang.members)
        if not gang.busy and all(m in idle for m in gang.members):
            rid = choose_for_worker(views(lambda r, k=k: r.devices == k), gang.index, home,
                                    gang.last, True, 1, barrier=view.barrier)
            if rid is not None and took(Assignment(rid, gang=k), gang.index, gang.members):
                kept[k] = replace(gang, busy=True, last=rid)
    singles = [w.index for w in view.workers if w.index not in reserved]
    for allow_move in (False, True):
        for w in [w.index for w in view.workers if w.index in idle]:
            if w in reserved:
                continue
            rid = choose_for_worker(views(lambda r: r.devices <= 1), w, home, last[w], allow_move,
                                    len(singles), barrier=view.barrier)
            if rid is not None and took(Assignment(rid, worker=w), w, (w,)):
                last[w] = rid
    return Plan(tuple(forms), tuple(out))
