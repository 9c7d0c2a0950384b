"""`rapidfire bench --vs optuna,ray-tune`: the figures computed from each side's trace, and the
whole machinery end to end on the seconds-long smoke preset (its numbers mean nothing and are not
asserted; the real run is in docs/pages/benchmarks.md with its command)."""

from __future__ import annotations

import json

import pytest

from rapidfire_nb import bench
from rapidfire_nb.bench import vs

FULL = 64   # samples of a whole run in the hand-made traces below: rungs at 16, 32, 64


def _trace(evals, ends, excluded=(), t0=100.0, t_end=None):
    """A trace from (t, run, samples, loss) and (t, run, status) tuples, times after ``t0``."""
    tr = vs.Trace("hand-made")
    tr.t0 = t0
    for t, run, samples, loss in evals:
        tr.eval(run, f"cfg-{run}", samples, loss, t=t0 + t)
    for t, run, status in ends:
        tr.end(run, f"cfg-{run}", status, t=t0 + t)
    for a, b in excluded:
        tr.exclude(t0 + a, t0 + b)
    tr.t_end = t0 + (t_end if t_end is not None else max(e["t"] - t0 for e in tr.events))
    return tr


def test_sequential_trace_the_winner_is_known_only_once_it_leads_and_the_rest_are_done():
    # a, then b (the eventual winner), then c, one after another, each to the end
    evals = [(1, "a", 32, 3.0), (2, "a", 64, 2.5),
             (3, "b", 32, 2.8), (4, "b", 64, 2.0),
             (5, "c", 32, 2.9), (6, "c", 64, 2.2)]
    ends = [(2, "a", "finished"), (4, "b", "finished"), (6, "c", "finished")]
    s = vs.summarize(_trace(evals, ends), ref_loss=2.0, full_samples=FULL)
    assert s["winner"] == "cfg-b" and s["best_final_eval_loss"] == 2.0
    assert s["t_lead_s"] == 4          # first at its end, and stays first while c trains
    assert s["t_last_out_s"] == 6      # c still might have beaten it until c finished
    assert s["t_winner_s"] == 6
    assert s["t_within_1pct_s"] == 4   # 2.0 <= 1.01 x 2.0
    assert (s["runs"], s["finished"], s["pruned"]) == (3, 3, 0)


def test_a_run_that_leads_early_and_loses_the_lead_restarts_the_clock():
    evals = [(1, "a", 32, 1.0), (2, "b", 32, 2.0), (3, "a", 64, 3.0), (4, "b", 64, 1.5)]
    s = vs.summarize(_trace(evals, [(3, "a", "finished"), (4, "b", "finished")]), 1.5, FULL)
    assert s["winner"] == "cfg-b" and s["t_lead_s"] == 3   # led from a's final eval on, not before
    # a run's intermediate loss within 1 % counts: the first time any run gets there
    assert s["t_within_1pct_s"] == 1


def test_pruned_trace_the_winner_is_identified_when_the_last_competitor_is_pruned():
    # interleaved with SHA: rung 16 keeps b, c; rung 32 keeps b; b trains on alone
    evals = [(1, "a", 16, 3.0), (2, "b", 16, 2.5), (3, "c", 16, 2.7),
             (4, "b", 32, 2.2), (5, "c", 32, 2.4), (7, "b", 64, 2.0)]
    ends = [(3.1, "a", "pruned"), (5.1, "c", "pruned"), (7, "b", "finished")]
    s = vs.summarize(_trace(evals, ends, t_end=7.5), ref_loss=1.9, full_samples=FULL)
    assert s["winner"] == "cfg-b" and s["finished"] == 1 and s["pruned"] == 2
    assert s["t_lead_s"] == 2 and s["t_last_out_s"] == pytest.approx(5.1)
    assert s["t_winner_s"] == pytest.approx(5.1)     # before the winner's own end
    assert s["wall_s"] == pytest.approx(7.5)
    assert s["t_within_1pct_s"] is None              # never within 1 % of 1.9


def test_excluded_intervals_come_off_the_clock_once_even_when_they_overlap():
    evals = [(2, "a", 64, 1.0), (10, "b", 64, 2.0)]
    tr = _trace(evals, [(2, "a", "finished"), (10, "b", "finished")],
                excluded=[(0.5, 1.5), (1.0, 1.5), (4, 6), (20, 30)])
    s = vs.summarize(tr, 1.0, FULL)
    assert s["t_lead_s"] == pytest.approx(1.0)       # 2 s less the 1 s excluded before it
    assert s["t_winner_s"] == pytest.approx(7.0)     # 10 - 1 - 2
    assert s["excluded_s"] == pytest.approx(3.0)     # nothing after the end counts


def test_trace_round_trips_through_json():
    tr = _trace([(1, "a", 64, 1.0)], [(1, "a", "finished")], excluded=[(0.2, 0.4)])
    tr.steps, tr.peak = 8, {"rss_growth_mb": 3.0}
    back = vs.Trace.from_json("again", json.loads(json.dumps(tr.to_json())))
    assert vs.summarize(back, 1.0, FULL) == vs.summarize(tr, 1.0, FULL)


def _side(t, loss):
    return {"t_winner_s": t, "best_final_eval_loss": loss}


def test_the_target_compares_with_optunas_fastest_side_that_found_a_good_winner():
    sides = {"optuna-grid-sha": _side(100, 2.00), "optuna-grid-median": _side(120, 2.01),
             # fastest, but its winner is 10 % worse: not "Optuna's best pruner"
             "optuna-tpe-sha": _side(40, 2.20),
             "rapidfire-sha": _side(45, 2.00)}
    t = vs.check_target(sides)
    assert t["optuna_side"] == "optuna-grid-sha" and t["time_ratio"] == pytest.approx(0.45)
    assert t["met"] and t["loss_gap"] == pytest.approx(0.0)
    sides["rapidfire-sha"] = _side(45, 2.10)          # fast, but 5 % worse: missed
    t = vs.check_target(sides)
    assert t["met_time"] and not t["met_loss"] and not t["met"]
    assert not vs.check_target({"rapidfire-sha": _side(45, 2.0)})["available"]


def test_a_peer_that_wins_a_figure_is_named():
    def stats(**kw):
        return {k: {"min": v, "median": v, "max": v} for k, v in kw.items()}

    s = {"sequential": stats(t_winner_s=50, steps=256), "optuna-grid-sha": stats(t_winner_s=30, steps=90),
         "rapidfire-sha": stats(t_winner_s=20, steps=120), "rapidfire-optuna": stats(t_winner_s=25, steps=100)}
    wins = vs.peer_wins(s, list(s))
    assert wins == ["optuna-grid-sha beats rapidfire on optimizer steps: 90 vs 100"]


@pytest.mark.parametrize("argv, message", [
    (["--vs", "hyperopt"], "--vs takes a comma-separated list of optuna, ray-tune"),
    (["--vs", "optuna", "--sides", "ray-asha"], "--sides names sides of sequential, optuna-grid-sha"),
    (["--vs", "optuna", "--reduction-factor", "1"], "--reduction-factor >= 2"),
    (["--vs", "optuna", "--chunks", "0"], "--chunks must be >= 1"),
])
def test_vs_rejects_bad_arguments(argv, message, capsys):
    assert bench.main(["--preset", "smoke", *argv]) == 2
    assert message in capsys.readouterr().err


def test_vs_is_in_the_help():
    text = " ".join(bench._parser().format_help().split())
    assert "--vs PEERS" in text and "Ray Tune + TRL (ASHA)" in text


@pytest.mark.slow   # trains the smoke preset on four sides, one of them through a local Ray
def test_vs_smoke_every_kind_of_side_end_to_end(tmp_path, capsys):
    pytest.importorskip("ray.tune")
    out = tmp_path / "vs.json"
    code = bench.main(["--vs", "optuna,ray-tune", "--preset", "smoke", "--repeats", "1", "--no-warmup",
                       "--sides", "optuna-grid-sha,ray-asha,rapidfire-sha", "--output", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    report = json.loads(out.read_text())
    names = ["sequential", "optuna-grid-sha", "ray-asha", "rapidfire-sha"]
    assert report["sides"] == names
    p = report["preset"]
    full_steps = 8 * p["num_chunks"] * p["steps_per_chunk"]
    (row,) = report["per_repeat"]
    space = {vs._key(c["learning_rate"], c["r"]) for c in vs.space()}
    for name in names:
        s = row["sides"][name]
        # every side saw the whole grid once and named a winner from it
        assert s["runs"] == 8 and s["distinct_configs"] == 8 and s["winner"] in space, name
        assert s["finished"] + s["pruned"] == 8, name
        assert 0 < s["steps"] <= full_steps, name
        assert s["t_winner_s"] <= s["wall_s"] + 1e-6, name
        evals = [e for e in row["traces"][name]["events"] if e["kind"] == "eval"]
        # evaluated at the sample counts where the chunks end, on every side
        assert {e["samples"] for e in evals} <= {k * p["steps_per_chunk"] * p["batch"]
                                                 for k in range(1, p["num_chunks"] + 1)}, name
    assert row["sides"]["sequential"]["steps"] == full_steps and row["sides"]["sequential"]["pruned"] == 0
    for name in ("optuna-grid-sha", "ray-asha", "rapidfire-sha"):
        assert row["sides"][name]["pruned"] > 0, name   # the pruners pruned
    # a Ray trial's process start, imports and base build are taken off its clock
    assert row["sides"]["ray-asha"]["excluded_s"] > 0
    assert set(row["sides"]["rapidfire-sha"]["split_s"]) >= {"train_s", "eval_s", "setup_s", "swap_s"}
    assert report["target"]["available"] and report["target"]["optuna_side"] == "optuna-grid-sha"
    assert "winner at s" in text and "rapidfire-sha" in text and "target: rapidfire-sha" in text
    import ray

    assert not ray.is_initialized()   # the bench shut down the Ray it started


def test_a_run_pruned_at_its_last_rung_is_no_finished_trial():
    # Optuna's pruner may judge a trial at its last report: it trained the whole budget, but the
    # study keeps no value for it, so it is neither finished nor the winner
    evals = [(1, "a", 64, 2.0), (2, "b", 64, 1.5)]
    s = vs.summarize(_trace(evals, [(1, "a", "finished"), (2, "b", "pruned")]), 2.0, FULL)
    assert (s["finished"], s["pruned"], s["runs"]) == (1, 1, 2)
    assert s["winner"] == "cfg-a" and s["best_final_eval_loss"] == 2.0
