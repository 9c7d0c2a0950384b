"""The gang rule (engine/scheduling/gangs.py): pure, property-tested, no Ray (and no torch but in
the last test, which drives the Ray executor's own generator with fake workers).

``Pool`` below is the Ray executor's state written out as plain mutable objects (workers, gangs,
which worker holds which run, what is in flight), and ``dispatch_as_you_go`` is the dispatch loop
as the executor ran it before the rule was pulled out of it: each decision read the live state and
was dispatched (changing that state) before the next one. The rule must give the same sequence
from a frozen snapshot, failed dispatches included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings, strategies as st

from rapidfire_nb.engine.scheduling import (
    Assignment,
    DispatchView,
    GangForm,
    GangView,
    PlacedRun,
    Plan,
    RunView,
    WorkerView,
    choose_for_worker,
    plan_dispatch,
)


@dataclass(eq=False)
class Worker:
    index: int
    alive: bool = True
    up: bool = True                 # described: its node and device known
    busy_with: int | None = None
    last: int | None = None
    gang: Gang | None = None


@dataclass(eq=False)
class Gang:
    index: int
    members: list
    alive: bool = True
    busy_with: int | None = None
    last: int | None = None

    def idle(self) -> bool:
        return self.busy_with is None and all(m.alive and m.up and m.busy_with is None
                                              for m in self.members)


@dataclass(eq=False)
class Run:
    run_id: int
    progress: int
    active: bool = True
    devices: int = 1
    writing: bool = False           # its checkpoint is being written
    breaks: bool = False            # its dispatch fails (an unreadable checkpoint)


@dataclass(eq=False)
class Pool:
    workers: list                   # the pool's order
    runs: list
    gangs: dict = field(default_factory=dict)    # size -> Gang
    home: dict = field(default_factory=dict)     # run -> Worker or Gang
    inflight: set = field(default_factory=set)
    barrier: bool = False
    gang_count: int = 0

    def view(self) -> DispatchView:
        """What the executor hands the rule (as RemoteChunkExecutor.assignments builds it)."""
        live = [w for w in self.workers if w.alive and w.up]
        held = {rid: s.index for rid, s in self.home.items() if s.alive}
        return DispatchView(
            workers=tuple(WorkerView(w.index, idle=w.busy_with is None, last=w.last,
                                     gang=w.gang.index if w.gang is not None and w.gang.alive else None)
                          for w in live),
            gangs=tuple(GangView(g.index, tuple(m.index for m in g.members),
                                 usable=g.alive and all(m.alive for m in g.members),
                                 busy=g.busy_with is not None, last=g.last) for g in self.gangs.values()),
            runs=tuple(PlacedRun(r.run_id, r.progress, r.active,
                                 busy=r.run_id in self.inflight or r.writing, devices=r.devices,
                                 home=held.get(r.run_id)) for r in self.runs),
            barrier=self.barrier, gangs_formed=self.gang_count)


def dispatch_as_you_go(pool: Pool):
    """The sequence of (("gang", k) or ("worker", index), run) the live loop produced, and the
    gangs it formed as (size, index, members); ``pool`` is changed as the dispatches change it."""
    runs = {r.run_id: r for r in pool.runs}
    live = [w for w in pool.workers if w.alive and w.up]
    sharded = {r.run_id: r.devices for r in pool.runs if r.devices > 1}
    out, forms = [], []

    def views(keep):
        return [RunView(r.run_id, r.progress, r.active and keep(r.run_id),
                        busy=r.run_id in pool.inflight or r.writing) for r in pool.runs]

    def gang_of(k):
        gang = pool.gangs.get(k)
        if gang is not None and gang.alive and all(m.alive for m in gang.members):
            return gang
        free = [w for w in live if w.gang is None or not w.gang.alive]
        if len(free) < k:
            return None
        pool.gang_count += 1
        gang = Gang(-pool.gang_count, sorted(free, key=lambda w: w.index)[:k])
        for m in gang.members:
            m.gang = gang
        pool.gangs[k] = gang
        forms.append((k, gang.index, tuple(m.index for m in gang.members)))
        return gang

    def dispatch(slot, rid):
        out.append((("gang", len(slot.members)) if isinstance(slot, Gang) else ("worker", slot.index), rid))
        if pool.home.get(rid) is not slot:
            pool.home.pop(rid, None)
        if runs[rid].breaks:   # the run fails: freed, no longer schedulable; the slot stays idle
            pool.home.pop(rid, None)
            runs[rid].active = False
            return
        if isinstance(slot, Gang):
            for m in slot.members:
                m.busy_with = m.last = rid
        slot.busy_with = slot.last = rid
        pool.home[rid] = slot
        pool.inflight.add(rid)

    reserved = set()
    for k in sorted(set(sharded.values())):
        gang = gang_of(k)
        if gang is None:
            continue
        waiting = [v for v in views(lambda rid, k=k: sharded.get(rid) == k) if v.schedulable and not v.busy]
        others = [v for v in views(lambda rid, k=k: sharded.get(rid) != k) if v.schedulable and not v.busy]
        if not waiting:
            continue
        if others and min(v.progress for v in waiting) > min(v.progress for v in others):
            continue
        reserved.update(m.index for m in gang.members)
        if gang.idle():
            home = {rid: s.index for rid, s in pool.home.items() if s.alive}
            rid = choose_for_worker(views(lambda rid, k=k: sharded.get(rid) == k), gang.index, home,
                                    gang.last, True, 1, barrier=pool.barrier)
            if rid is not None:
                dispatch(gang, rid)
    singles = [w for w in live if w.index not in reserved]
    for allow_move in (False, True):
        for w in [w for w in pool.workers if w.alive and w.up and w.busy_with is None]:
            if w.index in reserved:
                continue
            home = {rid: s.index for rid, s in pool.home.items() if s.alive}
            rid = choose_for_worker(views(lambda rid: rid not in sharded), w.index, home, w.last,
                                    allow_move, len(singles), barrier=pool.barrier)
            if rid is not None:
                dispatch(w, rid)
    return out, forms


def as_pairs(plan):
    return [(("gang", a.gang) if a.gang is not None else ("worker", a.worker), a.run_id)
            for a in plan.assignments]


def replanned(view: DispatchView, breaks: set[int]):
    """The executor's loop: follow the plan; after a dispatch that failed, plan again from the same
    view, told of the failure, and go on from the next position."""
    plan, failed, out, i = plan_dispatch(view), set(), [], 0
    while i < len(plan.assignments):
        a = plan.assignments[i]
        out.append(a)
        if a.run_id in breaks:
            failed.add(a.run_id)
            plan = plan_dispatch(view, failed)
        i += 1
    return plan.forms, out


# -- random pools -----------------------------------------------------------------------------
@st.composite
def pools(draw):
    n = draw(st.integers(1, 6))
    indices = sorted(draw(st.sets(st.integers(0, 9), min_size=n, max_size=n)))
    order = draw(st.permutations(indices))
    runs_n = draw(st.integers(0, 9))
    rids = list(range(1, runs_n + 1))
    maybe_run = st.one_of(st.none(), st.sampled_from(rids)) if rids else st.none()
    workers = {i: Worker(i, alive=draw(st.integers(0, 9)) > 0, up=draw(st.integers(0, 9)) > 0,
                         busy_with=draw(st.one_of(st.none(), st.none(), maybe_run)), last=draw(maybe_run))
               for i in indices}
    pool = Pool([workers[i] for i in order], [])
    # gangs kept from earlier dispatches: disjoint groups of workers, one per size
    left = list(indices)
    draw(st.randoms()).shuffle(left)
    for k in draw(st.sets(st.sampled_from([2, 3]), max_size=2)):
        if len(left) < k:
            break
        members, left = left[:k], left[k:]
        pool.gang_count += draw(st.integers(1, 2))
        gang = Gang(-pool.gang_count, [workers[i] for i in sorted(members)], alive=draw(st.integers(0, 4)) > 0,
                    busy_with=draw(st.one_of(st.none(), st.none(), maybe_run)), last=draw(maybe_run))
        for m in gang.members:
            m.gang = gang
        pool.gangs[k] = gang
    holders = list(workers.values()) + list(pool.gangs.values())
    for rid in rids:
        run = Run(rid, draw(st.integers(0, 3)), active=draw(st.integers(0, 5)) > 0,
                  devices=draw(st.sampled_from([1, 1, 1, 2, 3])), writing=draw(st.integers(0, 6)) == 0,
                  breaks=draw(st.integers(0, 9)) == 0)
        pool.runs.append(run)
        if draw(st.booleans()):
            pool.home[rid] = draw(st.sampled_from(holders))
        if draw(st.integers(0, 6)) == 0:
            pool.inflight.add(rid)
    pool.barrier = draw(st.booleans())
    return pool


# -- the same sequence as the loop that decided as it dispatched ------------------------------
@settings(max_examples=800, deadline=None)
@given(pools())
def test_the_plan_is_the_sequence_the_dispatch_loop_produced(pool):
    view = pool.view()
    breaks = {r.run_id for r in pool.runs if r.breaks}
    expected, formed = dispatch_as_you_go(pool)
    plan = plan_dispatch(view, breaks)
    assert as_pairs(plan) == expected
    assert [(f.size, f.index, f.members) for f in plan.forms] == formed
    # what the executor does: it learns of a failure only after the dispatch, and plans again
    forms, seq = replanned(view, breaks)
    assert as_pairs(Plan(forms, tuple(seq))) == expected and forms == plan.forms


@settings(max_examples=300, deadline=None)
@given(pools())
def test_a_plan_is_deterministic_and_leaves_its_view_alone(pool):
    view = pool.view()
    again = pool.view()
    assert plan_dispatch(view) == plan_dispatch(view)
    assert view == again


# -- properties -----------------------------------------------------------------------------
@settings(max_examples=800, deadline=None)
@given(pools())
def test_what_a_plan_may_do(pool):
    view = pool.view()
    plan = plan_dispatch(view)
    workers = {w.index: w for w in view.workers}
    runs = {r.run_id: r for r in view.runs}
    gangs = {g.size: g for g in view.gangs}
    taken_by_gangs = set()
    for form in plan.forms:
        # k distinct live workers, up, in no live gang (nor in a gang formed before it), the first by index
        assert len(form.members) == form.size == len(set(form.members))
        assert all(m in workers and workers[m].gang is None for m in form.members)
        assert not taken_by_gangs & set(form.members)
        free = sorted(i for i in workers if workers[i].gang is None and i not in taken_by_gangs)
        assert list(form.members) == free[:form.size]
        taken_by_gangs |= set(form.members)
        old = gangs.get(form.size)
        assert old is None or not old.usable           # a usable gang is kept, not formed again
        gangs[form.size] = GangView(form.index, form.members)
    assert len({f.size for f in plan.forms}) == len(plan.forms)
    assert {f.index for f in plan.forms}.isdisjoint(g.index for g in view.gangs)

    assigned = [a.run_id for a in plan.assignments]
    assert len(assigned) == len(set(assigned))          # no run assigned twice
    busy_workers = []
    for a in plan.assignments:
        r = runs[a.run_id]
        assert r.active and not r.busy                  # a busy or unschedulable run never goes
        assert (a.gang is None) != (a.worker is None)
        if a.gang is not None:                          # a sharded run only on a gang of its size
            assert r.devices == a.gang
            g = gangs[a.gang]
            assert g.usable and not g.busy
            busy_workers += g.members
        else:
            assert r.devices == 1
            busy_workers.append(a.worker)
        assert all(workers[i].idle for i in (g.members if a.gang is not None else (a.worker,)))
    assert len(busy_workers) == len(set(busy_workers))  # no worker trains two runs


@settings(max_examples=800, deadline=None)
@given(pools())
def test_a_gang_ahead_of_a_waiting_run_does_not_keep_its_workers(pool):
    """When every run of a gang's size is ahead of some other waiting run, the gang takes nothing
    and its members stay free for single-device runs; otherwise they take none."""
    view = pool.view()
    plan = plan_dispatch(view)
    ready = [r for r in view.runs if r.active and not r.busy]
    gang_of = {g.size: g for g in view.gangs if g.usable}
    gang_of.update({f.size: GangView(f.index, f.members) for f in plan.forms})
    singles_on = {a.worker for a in plan.assignments if a.worker is not None}
    for k, gang in gang_of.items():
        # what a smaller gang took before this one was looked at is busy by then
        taken = {a.run_id for a in plan.assignments if a.gang is not None and a.gang < k}
        waiting = [r.progress for r in ready if r.devices == k and r.run_id not in taken]
        others = [r.progress for r in ready if r.devices != k and r.run_id not in taken]
        ahead = bool(waiting) and bool(others) and min(waiting) > min(others)
        if ahead or not waiting:
            assert not any(a.gang == k for a in plan.assignments)
        if waiting and not ahead:
            assert singles_on.isdisjoint(gang.members)


# -- concrete cases, worked out by hand --------------------------------------------------------
def w(i, idle=True, last=None, gang=None):
    return WorkerView(i, idle=idle, last=last, gang=gang)


def r(rid, progress, devices=1, home=None, active=True, busy=False):
    return PlacedRun(rid, progress, active, busy=busy, devices=devices, home=home)


def test_two_workers_take_their_own_runs_then_a_new_one():
    view = DispatchView(workers=(w(0, last=1), w(1, last=2)),
                        runs=(r(1, 1, home=0), r(2, 1, home=1), r(3, 0)))
    # worker 0: run 3 is new and behind, its share is ceil(3 / 2) = 2, it holds 1: takes run 3;
    # worker 1 then takes its own run 2; run 1 waits (worker 0 is busy)
    assert plan_dispatch(view).assignments == (Assignment(3, worker=0), Assignment(2, worker=1))


def test_a_gang_is_formed_from_the_first_free_workers_and_takes_its_run():
    view = DispatchView(workers=(w(3), w(1), w(0, gang=-1), w(2)),
                        gangs=(GangView(-1, (0, 5), usable=True, busy=True),),
                        runs=(r(1, 0, devices=3), r(2, 0), r(3, 0, devices=2)),
                        gangs_formed=1)
    plan = plan_dispatch(view)
    # size 2 is kept (busy); size 3 needs three of the free workers 1, 2, 3
    assert plan.forms == (GangForm(3, -2, (1, 2, 3)),)
    # size 2: run 3 waits, nobody is behind it, the gang is busy: members 0 and 5 reserved;
    # size 3: run 1 waits, not ahead: the new gang takes it; nobody is left for run 2
    assert plan.assignments == (Assignment(1, gang=3),)


def test_a_gang_whose_runs_are_ahead_lends_its_workers():
    gang = GangView(-1, (0, 1))
    base = dict(workers=(w(0, gang=-1), w(1, gang=-1)), gangs=(gang,), gangs_formed=1)
    ahead = DispatchView(runs=(r(1, 2, devices=2, home=-1), r(2, 1), r(3, 1)), **base)
    # run 1 (the gang's) has trained more than runs 2 and 3: they go first, on the members
    assert plan_dispatch(ahead).assignments == (Assignment(2, worker=0), Assignment(3, worker=1))
    level = DispatchView(runs=(r(1, 1, devices=2, home=-1), r(2, 1), r(3, 1)), **base)
    # level with them: the gang keeps its members and trains run 1
    assert plan_dispatch(level).assignments == (Assignment(1, gang=2),)


def test_moves_come_after_every_worker_took_its_own():
    view = DispatchView(workers=(w(0, last=1), w(1, last=3)),
                        runs=(r(1, 0, home=0), r(2, 0, home=0), r(3, 5, home=1)))
    # pass 1: worker 0 takes run 1; worker 1's own run 3 is more than LAG ahead: nothing.
    # pass 2: worker 1 moves run 2 (the least progress, held by worker 0) to itself
    assert plan_dispatch(view).assignments == (Assignment(1, worker=0), Assignment(2, worker=1))


def test_a_failed_dispatch_frees_the_worker_for_the_next_choice():
    view = DispatchView(workers=(w(0, last=1),), runs=(r(1, 0, home=0), r(2, 0, home=0)))
    assert plan_dispatch(view).assignments == (Assignment(1, worker=0),)
    # run 1's checkpoint cannot be read: it fails, worker 0 is still idle and takes run 2
    assert plan_dispatch(view, {1}).assignments == (Assignment(1, worker=0), Assignment(2, worker=0))


def test_nothing_to_do():
    assert plan_dispatch(DispatchView(workers=())) == plan_dispatch(DispatchView(workers=(w(0),)))
    view = DispatchView(workers=(w(0, idle=False),), runs=(r(1, 0),))
    assert plan_dispatch(view).assignments == ()
    view = DispatchView(workers=(w(0),), runs=(r(1, 0, busy=True), r(2, 0, active=False)))
    assert plan_dispatch(view).assignments == ()


# -- the Ray executor's side, with fake workers (Ray is not imported) -------------------------
@settings(max_examples=150, deadline=None)
@given(pools())
def test_the_ray_executor_forms_the_gangs_and_sends_the_runs_the_loop_did(pool):
    """``RemoteChunkExecutor.assignments`` builds the views, forms the gangs the rule names and
    yields its assignments; a dispatch that fails (its run fails) has it plan again. What the
    engine's loop sends must be what the loop that decided as it dispatched sent."""
    from types import SimpleNamespace

    from rapidfire_nb.engine import runs as R
    from rapidfire_nb.engine.executor import Flight
    from rapidfire_nb.engine.workers.executor import RemoteChunkExecutor
    from rapidfire_nb.engine.workers.pool import Gang as RayGang, WorkerSlot

    slots = {w.index: WorkerSlot(w.index, f"w{w.index}", None, alive=w.alive,
                                 info={"node": "n"} if w.up else {}, busy_with=w.busy_with, last=w.last)
             for w in pool.workers}
    order = [slots[w.index] for w in pool.workers]
    gangs = {}
    for g in pool.gangs.values():
        gangs[g] = RayGang(g.index, [slots[m.index] for m in g.members], alive=g.alive,
                           busy_with=g.busy_with, last=g.last)
        for m in g.members:
            slots[m.index].gang = gangs[g]

    class Sent(RemoteChunkExecutor):
        def dispatch(self, slot, rec, load_checkpoint):   # what the real one changes, no actor
            rid = rec.run_id
            if self.home.get(rid) is not slot:
                self.home.pop(rid, None)
            if rec.breaks:
                raise OSError("unreadable checkpoint")
            for m in getattr(slot, "members", ()):
                m.busy_with = m.last = rid
            slot.busy_with = slot.last = rid
            self.home[rid] = slot
            self.inflight[rid] = Flight(rid, slot)

    ex = Sent(SimpleNamespace(live=lambda: [s for s in order if s.alive], release=lambda slot, rid: None))
    ex.gangs = {k: gangs[g] for k, g in pool.gangs.items()}
    ex._gang_count = pool.gang_count
    ex.home = {rid: gangs[h] if isinstance(h, Gang) else slots[h.index] for rid, h in pool.home.items()}
    ex.inflight = {rid: Flight(rid, None) for rid in pool.inflight}
    records = {r.run_id: SimpleNamespace(run_id=r.run_id, progress=r.progress, breaks=r.breaks,
                                         status=R.RUNNING if r.active else R.STOPPED,
                                         spec=SimpleNamespace(extra={"num_gpus": r.devices}))
               for r in pool.runs}
    writing = {r.run_id for r in pool.runs if r.writing}
    engine = SimpleNamespace(runs=records, boundary_hook=object() if pool.barrier else None,
                             persistence=SimpleNamespace(writer=SimpleNamespace(pending=writing.__contains__)))
    sent = []
    for slot, rid in ex.assignments(engine):   # as the engine's _dispatch drives it
        sent.append((("gang", slot.size) if isinstance(slot, RayGang) else ("worker", slot.index), rid))
        try:
            ex.dispatch(slot, records[rid], None)
        except OSError:
            ex.release(records[rid])
            records[rid].status = R.FAILED

    expected, _ = dispatch_as_you_go(pool)
    assert sent == expected
    assert {k: (g.index, [m.index for m in g.members]) for k, g in ex.gangs.items()} \
        == {k: (g.index, [m.index for m in g.members]) for k, g in pool.gangs.items()}
    assert ex._gang_count == pool.gang_count
    for w in pool.workers:
        assert (slots[w.index].gang and slots[w.index].gang.index) == (w.gang and w.gang.index)
        assert slots[w.index].busy_with == w.busy_with
