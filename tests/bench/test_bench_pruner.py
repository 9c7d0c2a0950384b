"""`rapidfire bench --pruner sha` machinery on the seconds-long smoke preset (figures mean nothing
there; the real run is `rapidfire bench --pruner sha`, docs/pages/benchmarks.md)."""

import json

import pytest

from rapidfire_nb import bench

pytestmark = pytest.mark.slow   # slow tier: trains the pruner bench's smoke preset


def test_pruner_bench_trains_fewer_chunks_and_reports_both_sides(capsys, tmp_path):
    out = tmp_path / "r.json"
    code = bench.main(["--pruner", "sha", "--preset", "smoke", "--json", "--output", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    full, pruned = report["full"], report["pruned"]
    assert len(full["runs"]) == len(pruned["runs"]) == 8
    assert full["chunks_trained"] == 8 * report["preset"]["num_chunks"]
    assert pruned["chunks_trained"] < full["chunks_trained"]
    assert {r["status"] for r in full["runs"]} == {"completed"}
    stopped = [r for r in pruned["runs"] if r["status"] == "stopped"]
    assert len(stopped) == 4 and all(r["pruning"].startswith("pruned at chunk 1") for r in stopped)
    # learning rates and ranks really differ, and the pruned grid's best is one of its survivors
    assert len({(r["learning_rate"], r["r"]) for r in full["runs"]}) == 8
    assert pruned["best_run"] in {r["run_id"] for r in pruned["runs"] if r["status"] == "completed"}
    assert report["loss_gap"] == (pruned["best_final_eval_loss"] - full["best_final_eval_loss"]) / abs(
        full["best_final_eval_loss"])
    text = bench.format_pruner_report(report)
    assert "wall-time ratio" in text and "pruned at chunk 1" in text


def test_pruner_bench_refuses_bad_flags(capsys):
    assert bench.main(["--pruner", "sha", "--reduction-factor", "1"]) == 2
    assert "--reduction-factor" in capsys.readouterr().err
