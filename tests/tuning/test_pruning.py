"""Pruning policy at chunk boundaries (tuning/pruners.py): pure, property-tested, no torch."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidfire_nb.tuning.pruners import (
    Hyperband,
    MedianRule,
    SuccessiveHalving,
    make_policy,
)

values_st = st.floats(min_value=-100, max_value=100, allow_nan=False)


def lockstep(policy, table, stop_user=(), total=None):
    """Drive ``policy`` like the fair scheduler does: chunk 1 for every live run, then chunk 2...
    ``table[run][c]`` is the run's objective after c+1 chunks. Returns all decisions in order and
    the chunks each run trained."""
    n_chunks = total or len(next(iter(table.values())))
    for rid in table:
        policy.add_run(rid)
    trained = {rid: 0 for rid in table}
    decisions = []
    for chunk in range(1, n_chunks + 1):
        for rid in sorted(table):
            m = policy.members[rid]
            if not m.live:
                continue
            policy.report(rid, chunk, table[rid][chunk - 1])
            trained[rid] = chunk
            if rid in stop_user and chunk == 1:
                policy.set_state(rid, live=False)
            if chunk == n_chunks:
                policy.set_state(rid, live=False, finished=True)
            decisions += policy.decide()
    return decisions, trained


@st.composite
def tables(draw, min_runs=2, max_runs=12, max_chunks=8):
    n = draw(st.integers(min_runs, max_runs))
    c = draw(st.integers(1, max_chunks))
    return {rid: draw(st.lists(values_st, min_size=c, max_size=c)) for rid in range(1, n + 1)}


@settings(max_examples=200, deadline=None)
@given(tables(), st.integers(2, 4), st.integers(1, 3), st.sampled_from(["minimize", "maximize"]))
def test_sha_keeps_the_best_ceil_n_over_eta_at_each_rung(table, eta, min_chunks, direction):
    policy = SuccessiveHalving(direction, min_chunks=min_chunks, reduction_factor=eta)
    decisions, trained = lockstep(policy, table)
    n_chunks = len(table[1])
    sign = 1 if direction == "minimize" else -1
    alive = set(table)
    rung = min_chunks
    by_rung = {}
    for d in decisions:
        by_rung.setdefault(d.rung, []).append(d)
    assert set(by_rung) <= {min_chunks * eta ** i for i in range(10)}
    while rung <= n_chunks:
        ranked = sorted(alive, key=lambda r: (sign * table[r][rung - 1], r))
        keep = math.ceil(len(ranked) / eta)
        # the finished (last-chunk) rung only ranks; it never stops a finished run
        losers = set(ranked[keep:]) if rung < n_chunks else set()
        got = {d.run_id for d in by_rung.get(rung, [])}
        assert got == losers
        for d in by_rung.get(rung, []):
            assert d.of == len(ranked) and d.rank == ranked.index(d.run_id) + 1
            assert d.reason == f"pruned at chunk {rung} (rank {d.rank} of {len(ranked)})"
            assert trained[d.run_id] == rung    # stopped right at the rung: equal samples seen
        alive -= losers
        rung *= eta
    assert alive, "someone always survives"


@settings(max_examples=150, deadline=None)
@given(tables(min_runs=3), st.data())
def test_user_stopped_runs_are_not_pruned_and_do_not_hold_the_bracket(table, data):
    stopped = set(data.draw(st.lists(st.sampled_from(sorted(table)), max_size=len(table) - 1)))
    policy = SuccessiveHalving(min_chunks=1)
    decisions, trained = lockstep(policy, table, stop_user=stopped)
    assert not {d.run_id for d in decisions} & stopped
    for rid in stopped:
        assert not policy.is_pruned(rid)
        assert trained[rid] == 1
    # the bracket went on without them: the best remaining run trained to the end
    assert max(trained[r] for r in table if r not in stopped) == len(table[1])


@settings(max_examples=150, deadline=None)
@given(tables(), st.sampled_from(["sha", "median", "hyperband"]))
def test_decisions_are_deterministic_and_never_stop_the_leader(table, name):
    a = lockstep(make_policy(name, max_chunks=len(table[1])), table)[0]
    b = lockstep(make_policy(name, max_chunks=len(table[1])), table)[0]
    assert a == b
    for d in a:
        # at every decision some run ranked better than the pruned one
        assert d.rank > 1


@settings(max_examples=150, deadline=None)
@given(tables(min_runs=3))
def test_median_stops_only_runs_worse_than_the_rung_median(table):
    policy = MedianRule(min_chunks=1)
    decisions, _ = lockstep(policy, table)
    for d in decisions:
        vals = sorted(m.values[d.rung] for m in policy.members.values() if d.rung in m.values)
        n = len(vals)
        median = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
        assert table[d.run_id][d.rung - 1] > median


def test_a_bracket_waits_for_its_slowest_live_run():
    p = SuccessiveHalving(min_chunks=1)
    for rid in (1, 2, 3, 4):
        p.add_run(rid)
    for rid, v in ((1, 1.0), (2, 2.0), (3, 3.0)):
        p.report(rid, 1, v)
        assert p.decide() == []            # run 4 has not reached rung 1
    p.report(4, 1, 4.0)
    ds = p.decide()
    assert [(d.run_id, d.rank) for d in ds] == [(3, 3), (4, 4)]


def test_a_clone_joins_its_parents_bracket_and_a_warm_clone_is_not_ranked_at_passed_rungs():
    p = SuccessiveHalving(min_chunks=1)
    p.add_run(1, bracket="a")
    p.add_run(2, bracket="b")
    assert p.add_run(3, parent=1) == "a"
    # a warm clone entering at chunk 1: not judged at rung 1 (no value there), judged at rung 2
    p.report(1, 1, 5.0)
    p.add_run(4, parent=1, chunks=1)
    p.report(3, 1, 1.0)
    ds = p.decide()
    assert [d.run_id for d in ds] == [1]          # 1 vs 3 at rung 1; 4 not ranked
    p.report(3, 2, 2.0)
    p.report(4, 2, 1.0)
    assert [d.run_id for d in p.decide()] == [3]


def test_nan_ranks_last_and_maximize_flips():
    p = SuccessiveHalving("maximize", min_chunks=1)
    for rid, v in ((1, 0.2), (2, float("nan")), (3, 0.9), (4, 0.5)):
        p.add_run(rid)
        p.report(rid, 1, v)
    assert sorted(d.run_id for d in p.decide()) == [1, 2]


def test_hyperband_spreads_runs_over_brackets_with_later_first_rungs():
    p = Hyperband(min_chunks=1, reduction_factor=2, max_chunks=8)
    assert p.n_brackets == 3
    brackets = [p.add_run(rid) for rid in range(1, 7)]
    assert brackets == ["hb0", "hb1", "hb2", "hb0", "hb1", "hb2"]
    assert p._first_rung("hb2") == 4


def test_state_round_trips_through_json():
    import json

    p = SuccessiveHalving(min_chunks=1)
    for rid, v in ((1, 1.0), (2, 2.0)):
        p.add_run(rid)
        p.report(rid, 1, v)
    p.decide()
    q = SuccessiveHalving(min_chunks=1)
    q.load_json(json.loads(json.dumps(p.to_json())))
    assert q.to_json() == p.to_json()
    assert q.is_pruned(2) and not q.is_pruned(1)


@pytest.mark.parametrize("kw", [dict(reduction_factor=1), dict(min_chunks=0), dict(direction="up")])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        SuccessiveHalving(**kw)


def _history_policy(eta=2):
    """Four runs started together (bracket 0) ran 4 chunks; runs 1, 2 were pruned at rung 1,
    run 3 at rung 2, run 4 finished: the rung history a lone refill is judged against."""
    policy = SuccessiveHalving("minimize", min_chunks=1, reduction_factor=eta)
    table = {1: [5.0, 4.0, 3.0, 2.0], 2: [4.0, 3.0, 2.0, 1.0],
             3: [2.0, 1.5, 1.0, 0.5], 4: [1.0, 0.8, 0.6, 0.4]}
    decisions, _ = lockstep(policy, table)
    assert sorted((d.run_id, d.rung) for d in decisions) == [(1, 1), (2, 1), (3, 2)]
    return policy


def _lone(policy, rid, values):
    """A refill asked alone (its own bracket), trained chunk after chunk; its decisions."""
    policy.add_run(rid, bracket=f"t{rid}")
    out = []
    for chunk, v in enumerate(values, 1):
        if not policy.members[rid].live:
            break
        policy.report(rid, chunk, v)
        if chunk == len(values):
            policy.set_state(rid, live=False, finished=True)
        out += policy.decide()
    return out


def test_a_lone_late_run_worse_than_the_rung_history_is_pruned():
    policy = _history_policy()
    # rung 1 history: 5, 4, 2, 1 and the refill's 3.0 -> rank 3 of 5, keep ceil(5/2) = 3: goes on;
    # rung 2 history (runs 1, 2 stopped at rung 1): 1.5, 0.8 and its 2.5 -> rank 3 of 3, keep 2
    [d] = _lone(policy, 5, [3.0, 2.5, 0.1, 0.1])
    assert (d.run_id, d.rung, d.rank, d.of) == (5, 2, 3, 3)
    assert d.reason == "pruned at chunk 2 (rank 3 of 3)"
    assert policy.members[5].chunks == 2 and policy.is_pruned(5)


def test_a_lone_late_run_better_than_the_rung_history_continues():
    policy = _history_policy()
    assert _lone(policy, 5, [0.9, 0.7, 0.5, 0.3]) == []
    assert policy.members[5].finished and not policy.is_pruned(5)
    # the old rule (a bracket of one keeps ceil(1/2) = 1) never pruned even the worst refill
    [d] = _lone(policy, 6, [9.0, 9.0, 9.0, 9.0])
    assert (d.run_id, d.rung, d.rank, d.of) == (6, 1, 6, 6)


def test_brackets_of_runs_started_together_stay_synchronous():
    # two runs in one bracket with eta=2 are ranked against each other only, whatever the history
    policy = _history_policy()
    for rid in (5, 6):
        policy.add_run(rid, bracket="t5")
    policy.report(5, 1, 0.01)
    assert policy.decide() == []            # waits for run 6: lockstep
    policy.report(6, 1, 0.02)               # better than all the history, but worse than run 5
    [d] = policy.decide()
    assert (d.run_id, d.rank, d.of) == (6, 2, 2)


@settings(max_examples=100, deadline=None)
@given(tables(min_runs=2, max_runs=6, max_chunks=4), st.lists(values_st, min_size=4, max_size=4),
       st.integers(2, 3), st.sampled_from(["sha", "hyperband"]))
def test_lone_run_decisions_are_a_function_of_the_values_seen(table, late, eta, name):
    table = {rid: (vals * 4)[:4] for rid, vals in table.items()}

    def play(via_json):
        policy = make_policy(name, "minimize", 1, eta, max_chunks=4)
        decisions, _ = lockstep(policy, table)
        if via_json:           # a restart between the study's start and the refill
            fresh = make_policy(name, "minimize", 1, eta, max_chunks=4)
            fresh.load_json(json.loads(json.dumps(policy.to_json())))
            policy = fresh
        return decisions + _lone(policy, 99, late), policy

    (a, pa), (b, pb) = play(False), play(True)
    assert a == b and pa.to_json() == pb.to_json()
    late_ds = [d for d in a if d.run_id == 99]
    # the rule itself, recomputed from the values: rank among every value recorded at that rung
    for rung in range(1, len(late) + 1):
        if late_ds and rung > late_ds[0].rung:
            break
        history = sorted([(v[rung - 1], rid) for rid, v in table.items()
                          if rung in pa.members[rid].values] + [(late[rung - 1], 99)])
        rank = history.index((late[rung - 1], 99)) + 1
        first = pa.rungs(pa.members[99].bracket)
        judged_here = rung in first and rung < len(late)   # a run that finished is not stopped
        pruned_here = bool(late_ds) and late_ds[0].rung == rung
        assert pruned_here == (judged_here and rank > math.ceil(len(history) / eta))
        if pruned_here:
            assert (late_ds[0].rank, late_ds[0].of) == (rank, len(history))


def test_median_judges_a_lone_late_run_against_the_median_of_the_rung_history():
    policy = MedianRule("minimize", min_chunks=1)
    lockstep(policy, {1: [1.0, 1.0], 2: [2.0, 2.0], 3: [3.0, 3.0]})
    # alone in its bracket it would be "the best of its bracket" and never stop
    [d] = _lone(policy, 4, [2.5, 0.0])            # median of 1, 2, 2.5, 3 is 2.25
    assert (d.run_id, d.rung, d.rank, d.of) == (4, 1, 3, 4)
    assert _lone(policy, 5, [1.5, 0.0]) == []     # median of 1, 1.5, 2, 2.5, 3 is 2


def test_a_hyperband_refill_gets_its_own_bracket_with_a_grace_period_and_the_history():
    policy = Hyperband("minimize", min_chunks=1, reduction_factor=2, max_chunks=8)   # 3 brackets
    lockstep(policy, {1: [1.0] * 4, 2: [2.0] * 4, 3: [3.0] * 4, 4: [4.0] * 4})
    bracket = policy.new_bracket("t4")
    assert bracket == "hb1:t4" and policy.rungs(bracket) == []     # 4 runs added: hb(4 % 3)
    policy.add_run(5, bracket=bracket)
    policy.report(5, 1, 9.0)
    assert policy.decide() == []            # hb1's first rung is 2 chunks: grace period
    policy.report(5, 2, 9.0)
    [d] = policy.decide()
    assert (d.run_id, d.rung) == (5, 2) and d.rank == d.of
