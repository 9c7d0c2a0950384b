"""Smoke test of ``rapidfire bench``: the machinery runs end to end on the tiny ``smoke`` preset and
reports every field with a sane value. No timing is asserted (shared CI machines are noisy)."""

from __future__ import annotations

import json
import math

import pytest

from rapidfire_nb import bench


def _finite_positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_bench_smoke_json(capsys):
    rc = bench.main(["--preset", "smoke", "--repeats", "2", "--json"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)

    p = report["preset"]
    assert p["name"] == "smoke" and report["repeats"] == 2 and report["eval"] == "both"
    assert len(report["per_repeat"]) == 2
    # repeats alternate which side goes first
    assert [r["order"][0] for r in report["per_repeat"]] == ["interleaved", "sequential"]
    steps_per_run = p["steps_per_chunk"] * p["num_chunks"]
    for row in report["per_repeat"]:
        i, s = row["interleaved"], row["sequential"]
        # apples to apples: both sides trained exactly the same number of optimizer steps
        assert i["steps"] == s["steps"] == p["n_configs"] * steps_per_run
        assert i["chunks"] == p["n_configs"] * p["num_chunks"]
        for key in ("wall_s", "train_s", "eval_s"):
            assert _finite_positive(i[key]) and _finite_positive(s[key]), key
        # the engine's split never claims more train+eval time than the wall clock saw
        assert i["train_s"] + i["eval_s"] <= i["wall_s"]
        assert 0 <= i["overhead_frac"] < 1
        assert i["swap_ms_median"] >= 0
        # every run's first eval point comes before the end of the interleaved run
        assert 0 < i["first_all_s"] <= i["wall_s"]
        assert 0 < s["first_all_s"] <= s["wall_s"]
        assert row["ratio"] == pytest.approx(i["wall_s"] / s["wall_s"])

    med = report["median"]
    for key in ("ratio", "overhead_frac", "first_all_frac", "interleaved_wall_s", "sequential_wall_s"):
        assert _finite_positive(med[key]), key
    assert med["swap_ms"] >= 0

    mem = report["memory"]
    assert mem["n1"]["runs"] == 1 and mem["n8"]["runs"] == 8
    assert mem["n1"]["rss_peak_mb"] > 50 and mem["n8"]["rss_peak_mb"] > 50
    assert mem["ratio"] == pytest.approx(mem["n8"]["rss_peak_mb"] / mem["n1"]["rss_peak_mb"])

    t = report["targets"]
    assert set(t) == {"ratio", "overhead_frac", "first_all_frac", "memory_ratio"}
    assert t["first_all_frac"]["target"] == pytest.approx(1 / p["num_chunks"] + 0.05)
    for v in t.values():
        assert v["met"] == (v["value"] <= v["target"])


def test_bench_human_report_without_eval(capsys):
    rc = bench.main(["--preset", "smoke", "--repeats", "1", "--eval", "none", "--no-memory",
                     "--no-warmup", "--configs", "3"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "wall-time ratio" in out and "engine overhead" in out and "time per swap" in out
    assert "3 LoRA configs" in out and "eval: none" in out
    assert "peak memory" not in out      # --no-memory


@pytest.mark.parametrize("argv, message", [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--configs", "9"], "--configs must be between 1 and 8"),
    (["--chunks", "0"], "--chunks must be >= 1"),
])
def test_bench_rejects_bad_arguments(argv, message, capsys):
    assert bench.main(["--preset", "smoke", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_unknown_preset_names_the_choices(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--preset", "nope"])
    err = capsys.readouterr().err
    assert "nope" in err and "tinyllama" in err
