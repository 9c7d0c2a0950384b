"""Smoke test of ``rapidfire bench``: the machinery runs end to end on the tiny ``smoke`` preset and
reports every field with a sane value. No timing is asserted (shared CI machines are noisy)."""

from __future__ import annotations

import json
import math

import pytest

from rapidfire_nb import bench

pytestmark = pytest.mark.slow   # slow tier: trains the bench's smoke preset end to end


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

    # the checkpoint writer's share: one checkpoint per chunk, its CPU time within its busy time
    w = med["writer"]
    assert report["checkpoints"] is True
    assert w["writer_jobs"] == p["n_configs"] * p["num_chunks"]
    assert 0 < w["writer_encode_s"] <= w["writer_busy_s"] and 0 < w["writer_cpu_s"]

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


def test_bench_without_checkpoints_writes_none_and_says_so(capsys, monkeypatch):
    """--no-checkpoints (measuring only): chunks are still logged, no checkpoint is written, the
    engine's switch is back on afterwards, and the report says why the writer had nothing to do."""
    from rapidfire_nb.engine import store as store_mod
    from rapidfire_nb.engine.persistence import Persistence

    writes = []
    real = store_mod.ExperimentStore.save_checkpoint
    monkeypatch.setattr(store_mod.ExperimentStore, "save_checkpoint",
                        lambda self, rid, state: writes.append(rid) or real(self, rid, state))
    rc = bench.main(["--preset", "smoke", "--repeats", "1", "--no-memory", "--no-warmup",
                     "--no-checkpoints"])
    assert rc == 0
    out = capsys.readouterr().out
    assert writes == [] and Persistence._write_checkpoints is True
    assert "checkpoints off (--no-checkpoints" in out


def test_the_launch_preset_is_the_launch_bound_shape():
    """The shape where a CPU step is mostly host work, as a LoRA step is on a GPU: 22 layers of
    width 64, 4 configs of r=16 on q/k/v/o, 16 chunks of 2 steps, eval off, one torch thread."""
    p = bench.PRESETS["launch"]
    assert (p.hidden, p.layers, p.n_configs, p.lora_r) == (64, 22, 4, 16)
    assert set(p.lora_targets) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert (p.num_chunks, p.steps_per_chunk, p.eval, p.threads) == (16, 2, False, 1)
    args = bench._parser().parse_args(["--preset", "launch", "--no-checkpoints"])
    assert args.no_checkpoints and args.eval is None


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


# -- rapidfire bench --workers: the report's wording (a newcomer review, session 5) -------------------

def _workers_report(hop_frac_median_2: float) -> dict:
    """The shape run_workers_bench returns (rapidfire_nb/bench/workers.py), with chosen medians."""
    side = {"wall_s": 1.0, "train_wall_s": 0.8, "startup_s": 0.2, "load_avg_at_start": 0.5}
    hop = {"hop_ms_median": 4.0, "hop_call_ms": 1.0, "hop_back_ms": 1.0, "hop_get_ms": 2.0,
           "idle_frac": 0.01}
    return {"preset": {"name": "smoke", "n_configs": 8, "num_chunks": 2, "steps_per_chunk": 2},
            "workers": 2, "ray_version": "2.x", "cluster": {"CPU": 2.0}, "ray_start_s": 3.0,
            "cpu_count": 2, "load_avg_before": (0.5, 0, 0), "load_avg_after": (0.6, 0, 0),
            "median": {
                "kernel": {**side, "torch_threads": {"kernel": 1}},
                "workers_1": {**side, **hop, "hop_frac": 0.031, "hop_frac_median": 0.012,
                              "torch_threads": {"w0": 1}},
                "workers_2": {**side, **hop, "hop_frac": 0.087, "hop_frac_median": hop_frac_median_2,
                              "torch_threads": {"w0": 1, "w1": 1}}}}


def test_workers_report_marks_the_median_hop_share_against_its_target():
    from rapidfire_nb.bench.workers import format_workers_report

    text = format_workers_report(_workers_report(0.1026))
    rows = {ln.split()[0]: ln for ln in text.splitlines() if ln.startswith("  workers_") and " hop " not in ln
            and "x the kernel" not in ln}
    # the headline hop % is the median per-chunk share, marked like the other bench figures
    assert "1.20%  [ok  ] < 2 %" in rows["workers_1"], rows
    assert "10.26%  [MISS] < 2 %" in rows["workers_2"], rows
    # the other share is there once, under its own name
    assert rows["workers_2"].rstrip().endswith("8.70%")
    assert "sum hops/sum chunks" in text and "median over chunks" in text
    assert "% of its time" not in text   # no second, unnamed hop percentage (the old hop-parts line)
    assert "start-up: run_fit to the first chunk's start on every side" in text
    # next to the after-start-up speed, the end-to-end one (start-up included), both labelled
    (speed,) = [ln for ln in text.splitlines() if ln.startswith("  workers_2: ")]
    assert "1.00x the kernel engine's speed after start-up (from the first chunk on); 1.00x end to end" in speed
    assert "[ok  ]" not in [ln for ln in text.splitlines() if ln.startswith("  kernel ")][0]


def test_workers_progress_lines_say_which_repeat():
    from rapidfire_nb.bench.workers import progress_line

    kernel = {"workers": 0, "wall_s": 1.18, "train_wall_s": 1.18}
    two = {"workers": 2, "wall_s": 8.6, "train_wall_s": 0.9, "hop_ms_median": 4.0, "hop_frac": 0.08,
           "hop_frac_median": 0.1, "moves": 1}
    assert progress_line(kernel, 0, 3) == "  repeat 1/3, kernel: wall 1.18 s, after start-up 1.18 s"
    assert progress_line(two, 2, 3) == ("  repeat 3/3, 2 worker(s): wall 8.60 s, after start-up 0.90 s, "
                                        "hop 4.0 ms/chunk (10.00 % of a chunk's time, median), moves 1")


def test_bench_help_does_not_promise_seconds_with_workers():
    text = " ".join(bench._parser().format_help().split())
    assert "the smoke preset takes seconds (about a minute with --workers" in text
    assert "with --preset smoke about a minute, not seconds" in text


def test_workers_bench_measures_the_kernels_start_up_like_the_workers(tmp_path):
    """The kernel side's start-up ends at its first chunk's start, as a worker side's does: its
    run_fit checks and one-off imports are not counted as training time (they once were: the
    kernel's 'after start-up' was its whole wall, and 2 workers read 7x faster than the kernel)."""
    from rapidfire_nb.bench.workers import run_side

    p = bench.PRESETS["smoke"]
    with bench._quiet():
        pristine, tok = bench.build_base(p)
        train, evald = bench.make_datasets(p)
        group = bench.make_group(p, 2)
        side = run_side(p, group, pristine, tok, train, evald, str(tmp_path), 0)
    assert side["startup_s"] > 0
    assert side["startup_s"] + side["train_wall_s"] == pytest.approx(side["wall_s"], abs=1e-6)
    assert side["train_wall_s"] < side["wall_s"]
    assert "workers_up_s" not in side   # the kernel side has no workers
