"""Which run an idle worker trains next (engine/scheduling/workers.py): pure policy, no Ray, no torch."""

from hypothesis import given, settings
from hypothesis import strategies as st

from rapidfire_nb.engine.scheduling import LAG, RunView, choose_for_worker


def v(rid, progress, busy=False, schedulable=True):
    return RunView(rid, progress, schedulable, busy)


def test_fresh_runs_are_shared_out_evenly():
    runs = [v(i, 0) for i in (1, 2, 3, 4)]
    assert choose_for_worker(runs, 0, {}, None, False, 2) == 1
    # worker 0 holds runs 1 and 3 (its share of 4 runs on 2 workers): it takes no third fresh one
    runs = [v(1, 1), v(2, 0, busy=True), v(3, 0, busy=True), v(4, 0)]
    assert choose_for_worker(runs, 0, {1: 0, 3: 0, 2: 1}, 1, False, 2) == 1
    assert choose_for_worker(runs, 1, {1: 0, 3: 0, 2: 1}, 2, False, 2) == 4


def test_a_worker_keeps_its_own_runs_and_prefers_the_one_it_trained_last():
    runs = [v(1, 2), v(2, 2), v(3, 2)]
    assert choose_for_worker(runs, 0, {1: 0, 2: 0, 3: 1}, 2, False, 2) == 2
    assert choose_for_worker(runs, 1, {1: 0, 2: 0, 3: 1}, 3, False, 2) == 3


def test_within_a_worker_least_progress_first():
    runs = [v(1, 3), v(2, 2)]
    assert choose_for_worker(runs, 0, {1: 0, 2: 0}, 1, True, 1) == 2


def test_a_worker_too_far_ahead_takes_a_lagging_run_only_when_moves_are_allowed():
    home = {1: 0, 3: 0, 2: 1, 4: 1}
    runs = [v(1, 3), v(3, 3), v(2, 1), v(4, 1, busy=True)]
    assert choose_for_worker(runs, 0, home, 1, False, 2) is None
    assert choose_for_worker(runs, 0, home, 1, True, 2) == 2
    # one chunk ahead is allowed: it keeps its own run
    runs = [v(1, 2), v(3, 2), v(2, 1), v(4, 1, busy=True)]
    assert choose_for_worker(runs, 0, home, 1, True, 2) == 1


def test_a_worker_with_nothing_left_takes_work_from_a_busy_one():
    home = {1: 0, 2: 1, 3: 1}
    runs = [v(1, 4, schedulable=False), v(2, 2, busy=True), v(3, 2)]
    assert choose_for_worker(runs, 0, home, 1, False, 2) is None
    assert choose_for_worker(runs, 0, home, 1, True, 2) == 3


def test_with_a_barrier_no_run_starts_a_chunk_before_every_run_finished_the_previous_one():
    home = {1: 0, 2: 1, 3: 0}
    runs = [v(1, 2), v(2, 1, busy=True), v(3, 2)]   # run 2 is still training its chunk 1
    assert choose_for_worker(runs, 0, home, 1, True, 2) == 1
    assert choose_for_worker(runs, 0, home, 1, True, 2, barrier=True) is None
    runs = [v(1, 2), v(2, 2, busy=True), v(3, 2)]
    assert choose_for_worker(runs, 0, home, 1, True, 2, barrier=True) == 1


def test_nothing_schedulable():
    assert choose_for_worker([v(1, 0, busy=True), v(2, 0, schedulable=False)], 0, {}, None, True, 2) is None


runs_st = st.lists(st.tuples(st.integers(0, 6), st.booleans(), st.booleans(), st.integers(-1, 2)),
                   min_size=1, max_size=10)


@settings(max_examples=300, deadline=None)
@given(runs_st, st.integers(0, 2), st.booleans(), st.booleans())
def test_properties(spec, worker, allow_move, barrier):
    runs = [v(i + 1, p, busy=b, schedulable=s) for i, (p, b, s, _) in enumerate(spec)]
    home = {i + 1: h for i, (_, _, _, h) in enumerate(spec) if h >= 0}
    rid = choose_for_worker(runs, worker, home, None, allow_move, 3, barrier=barrier)
    free = [r for r in runs if r.schedulable and not r.busy]
    if barrier:
        floor = min((r.progress for r in runs if r.schedulable), default=0)
        free = [r for r in free if r.progress == floor]
    if rid is None:
        # with moves allowed a worker never idles while something is free to train
        assert not free or not allow_move
        return
    chosen = next(r for r in runs if r.run_id == rid)
    assert chosen.schedulable and not chosen.busy
    least = min(r.progress for r in free)
    assert chosen.progress <= least + LAG          # never more than LAG chunks ahead of a waiting run
    if not allow_move:
        assert home.get(rid, worker) == worker     # the first pass moves nothing
    own_free = [r for r in free if home.get(r.run_id) == worker]
    if home.get(rid) == worker:
        assert chosen.progress == min(r.progress for r in own_free)   # fair within the worker


def test_auto_on_a_chosen_cluster_with_under_two_gpus_warns_and_says_how_to_use_it():
    # the decision resolve_num_workers("auto") takes once the chosen cluster's GPUs are counted
    import warnings

    import pytest

    from rapidfire_nb.automl.policy import RapidFireConfigWarning
    from rapidfire_nb.engine.workers import cluster_auto_workers

    for gpus in (0, 1):
        with pytest.warns(RapidFireConfigWarning, match=r"num_workers=n") as rec:
            assert cluster_auto_workers(gpus) == 0
        assert f"has {gpus} GPU(s)" in str(rec[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cluster_auto_workers(2) == 2
        assert cluster_auto_workers(8) == 8


def test_chunk_times_from_a_skewed_worker_clock_land_on_the_controllers():
    """A chunk's start/end are read on its worker's clock; the controller saw it dispatched at 100
    and back at 103. Same clock: untouched. A worker 60 s ahead or 5 s behind: moved by the least
    amount into the window, its duration kept."""
    from rapidfire_nb.engine.workers.executor import on_controller_clock

    assert on_controller_clock(100.5, 102.5, 100.0, 103.0) == 0.0
    for skew in (60.0, -5.0):
        s, e = 100.5 + skew, 102.5 + skew
        shift = on_controller_clock(s, e, 100.0, 103.0)
        assert 100.0 <= s + shift and e + shift <= 103.0
        assert abs(shift + skew) <= 3.0       # off by at most the round trip
    # a chunk longer than the window (clocks running at other rates): starts at the dispatch
    assert on_controller_clock(50.0, 54.0, 100.0, 103.0) == 50.0
