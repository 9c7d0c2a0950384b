"""Scheduler and chunk-plan properties (pure Python, no torch)."""

import pytest
from hypothesis import given, settings, strategies as st

from rapidfire_nb.engine.chunks import ChunkPlan
from rapidfire_nb.engine.scheduling import RunView, choose_fair, parking_order
from rapidfire_nb.errors import ConfigError


def simulate(num_runs, num_chunks, epochs, stops):
    """Drive the policy like the controller does; return the trained (run, epoch, chunk) order."""
    progress = {r: 0 for r in range(1, num_runs + 1)}
    limit = {r: epochs[r - 1] * num_chunks for r in progress}
    stopped = set()
    order, on_device = [], None
    for _ in range(10_000):
        views = [RunView(r, progress[r], r not in stopped and progress[r] < limit[r]) for r in progress]
        choice = choose_fair(views, on_device)
        if choice is None:
            return order, progress, limit, stopped
        order.append((choice, progress[choice]))
        progress[choice] += 1
        on_device = choice
        if (choice, progress[choice]) in stops:
            stopped.add(choice)
    raise AssertionError("scheduler did not terminate")


@settings(max_examples=300, deadline=None)
@given(num_runs=st.integers(1, 12), num_chunks=st.integers(1, 6),
       epochs=st.lists(st.integers(1, 3), min_size=12, max_size=12),
       stops=st.sets(st.tuples(st.integers(1, 12), st.integers(1, 18)), max_size=4))
def test_fair_and_terminates(num_runs, num_chunks, epochs, stops):
    order, progress, limit, stopped = simulate(num_runs, num_chunks, epochs, stops)
    # every schedulable run reached its end; stopped runs stayed where they stopped
    for r in progress:
        if r not in stopped:
            assert progress[r] == limit[r]
    # fairness: when a run starts chunk p, no schedulable run still has progress < p
    done = {r: 0 for r in progress}
    halted = set()
    for run, p in order:
        for other in progress:
            if other != run and other not in halted and done[other] < limit[other]:
                assert done[other] >= p, f"run {run} started chunk {p} before run {other} finished {done[other]}"
        done[run] = p + 1
        if (run, done[run]) in stops:
            halted.add(run)


@settings(max_examples=200, deadline=None)
@given(num_runs=st.integers(1, 8), num_chunks=st.integers(1, 5))
def test_runs_that_start_together_go_round_in_id_order(num_runs, num_chunks):
    """So the run just trained never goes again while another could: it would first wait for its
    own checkpoint write, which overlaps the next chunk when another run trains it."""
    order, *_ = simulate(num_runs, num_chunks, [1] * 12, set())
    assert [run for run, _ in order] == list(range(1, num_runs + 1)) * num_chunks


def test_the_run_trained_last_goes_after_those_it_ties_with():
    views = [RunView(r, 3, True) for r in (1, 2, 3)]
    assert choose_fair(views, last=1) == 2
    assert choose_fair(views, last=3) == 1
    assert choose_fair(views[:1], last=1) == 1   # alone, it goes on
    # a run behind the others still goes first, whichever ran last
    assert choose_fair([RunView(1, 3, True), RunView(2, 2, True)], last=2) == 2


def test_a_resumed_run_never_trains_twice_in_a_row_while_another_could():
    """Run 1 stopped after its first chunk and resumed later: it catches up alone, then the two
    alternate (not in id order any more: 2, 1 each round), never one run twice in a row."""
    progress, order, last = {1: 1, 2: 4}, [], 2
    while min(progress.values()) < 8:
        rid = choose_fair([RunView(r, p, p < 8) for r, p in progress.items()], last=last)
        order.append(rid)
        progress[rid] += 1
        last = rid
    assert order[:3] == [1, 1, 1]                      # alone behind: no one else could go
    rest = order[3:]
    assert sorted(rest) == [1] * 4 + [2] * 4
    assert all(a != b for a, b in zip(rest, rest[1:]))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 500), bs=st.integers(1, 16), ga=st.integers(1, 4), seed=st.integers(0, 99))
def test_chunk_plan_partitions_the_epoch(n, bs, ga, seed):
    micro_batches = -(-n // bs)   # ceiling divisions
    steps = -(-micro_batches // ga)
    chunks = min(steps, 1 + seed % 5)
    plan = ChunkPlan(n, bs, ga, chunks, seed)
    bounds = plan.chunk_bounds()
    assert bounds[0] == 0 and bounds[-1] == plan.steps_per_epoch == steps
    assert all(b2 > b1 for b1, b2 in zip(bounds, bounds[1:]))  # no empty chunk
    seen = [i for s in range(plan.steps_per_epoch) for mb in plan.step_micro_batches(0, s) for i in mb]
    assert sorted(seen) == list(range(n))  # every example exactly once per epoch
    # the order depends on (seed, epoch) only, not on the number of chunks
    other = ChunkPlan(n, bs, ga, 1, seed)
    assert [other.step_micro_batches(1, s) for s in range(steps)] == [plan.step_micro_batches(1, s) for s in range(steps)]


def test_too_many_chunks_is_a_clear_error():
    with pytest.raises(ConfigError, match="num_chunks=9 is larger than the 8 optimizer steps"):
        ChunkPlan(64, 8, 1, 9, 0)
    with pytest.raises(ConfigError, match="num_chunks must be an integer >= 1"):
        ChunkPlan(64, 8, 1, 0, 0)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_parking_order_is_the_schedulers_order_reversed(progress):
    """What to move off a full device first is what the fair policy will train last."""
    views = [RunView(run_id=i + 1, progress=p, schedulable=True) for i, p in enumerate(progress)]
    order, left = [], list(views)
    while left:   # one chunk each, in the order the scheduler picks them (nothing on the device)
        rid = choose_fair(left, last=None)
        order.append(rid)
        left = [v for v in left if v.run_id != rid]
    assert parking_order(views) == order[::-1]


@given(st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.booleans()), max_size=8),
       st.one_of(st.none(), st.integers(1, 8)))
@settings(max_examples=300, deadline=None)
def test_the_fair_choice_is_a_free_run_of_least_progress(runs, last):
    """Never a busy or unschedulable run; always one of least progress among the others; the run
    trained last only when it is alone in front."""
    views = [RunView(i + 1, p, sched, busy) for i, (p, sched, busy) in enumerate(runs)]
    free = [v for v in views if v.schedulable and not v.busy]
    rid = choose_fair(views, last=last)
    if not free:
        assert rid is None
        return
    least = min(v.progress for v in free)
    front = [v.run_id for v in free if v.progress == least]
    assert rid in front
    assert rid != last or front == [last]
