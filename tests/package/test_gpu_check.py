"""The GPU check (tests/gpu/run) in its CPU dry run, so it cannot rot while no GPU is at hand.

The dry run is the real script at tiny sizes: the same orchestration (wheel install, one process
per section, time limits, the report and its summary) and the same measurements through the
Experiment API and ``rapidfire bench``; only what needs CUDA (pinned copies, the grad scaler,
CUDA peak memory, CUDA activity in the profile) is skipped, and the report says so. On a CPU the
engine promises bit-identical results, so the dry run's exactness figures must be exactly zero.
Each section's figures are checked, not only that it ran; no assertion depends on a timing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: the GPU check's whole CPU dry run

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "tests" / "gpu" / "run"
SECTIONS = ("env", "exactness", "offload", "precision", "memory", "bench", "profile", "packing", "vs", "ray")


def load_run():
    loader = importlib.machinery.SourceFileLoader("gpu_check_run", str(RUN))
    spec = importlib.util.spec_from_loader("gpu_check_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def make_wheel(folder: Path) -> Path:
    """A real (tiny, pure-Python) wheel: a package, a module under .data/purelib, one need that is
    met, one that is not, and one behind an extra that does not count."""
    folder.mkdir(parents=True)
    path = folder / "rfgpu_probe-1.2.3-py3-none-any.whl"
    info = "rfgpu_probe-1.2.3.dist-info"
    files = {
        "rfgpu_probe/__init__.py": "VALUE = 42\n",
        "rfgpu_probe-1.2.3.data/purelib/rfgpu_probe_extra.py": "EXTRA = 'purelib'\n",
        f"{info}/METADATA": ("Metadata-Version: 2.1\nName: rfgpu-probe\nVersion: 1.2.3\n"
                             "Requires-Dist: packaging>=20\nRequires-Dist: rfgpu-no-such-dist>=1\n"
                             "Requires-Dist: rfgpu-only-with-extra; extra == \"x\"\n"),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/top_level.txt": "rfgpu_probe\nrfgpu_probe_extra\n",
        f"{info}/RECORD": "",
    }
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def run_check(tmp: Path, *args: str, timeout: float = 1500) -> tuple[subprocess.CompletedProcess, dict, float]:
    out = tmp / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("OUT", None)
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(RUN), "--dry-run", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp)
    wall = time.time() - t0
    report = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
    return proc, report, wall


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu-check")
    make_wheel(tmp / "wheels")
    proc, report, wall = run_check(tmp, "--wheels", str(tmp / "wheels"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"GPU check dry run: {wall:.0f} s")
    return tmp / "out", report, wall


def ok(report: dict, name: str) -> dict:
    sec = report["sections"][name]
    assert sec["status"] == "ok", f"{name}: {sec.get('error')}\n{sec.get('traceback') or sec.get('log_tail')}"
    assert sec["seconds"] > 0 and sec["cpu_s"] > 0
    return sec["result"]


def exact(pair: dict) -> None:
    assert pair["all_completed"], pair["status"]
    assert pair["weights"]["compared"] > 0 and pair["weights"]["bitwise"] and pair["weights"]["max_abs_diff"] == 0
    assert pair["train_loss"]["points"] >= 2 and pair["train_loss"]["bitwise"]
    assert pair["train_loss"]["max_abs_diff"] == 0 and pair["train_loss"]["finite"]
    assert pair["eval_loss"]["points"] >= 2 and pair["eval_loss"]["bitwise"]
    assert pair["runs_among"] == 2 and pair["swaps_among"] == 4   # 2 runs x 2 chunks


def test_dry_run_report_structure(dry_run):
    out, report, wall = dry_run
    assert report["schema"] == 1 and report["mode"] == "dry-run" and report["finished"]
    assert list(report["sections"]) == list(SECTIONS)
    assert 0 < report["wall_s"] <= wall and report["wall_s"] < report["budget_s"]
    summary = (out / "gpu_check_summary.txt").read_text()
    assert summary.splitlines() == report["summary"]
    for name in SECTIONS:
        assert any(line.startswith(f"{name}: {report['sections'][name]['status']}") for line in report["summary"])
    assert "summary failed" not in summary and "must show: failed" not in summary
    log = (out / "gpu_check.log").read_text()
    assert all(f"===== {name}" in log for name in SECTIONS)
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check_summary.txt", "raw"]
    raw = sorted(p.name for p in (out / "raw").iterdir())
    ran = [k for k, r in report["sections"]["bench"]["result"]["items"].items() if r["status"] == "ok"]
    assert raw == sorted([f"bench-{name}.json" for name in ran] + ["profile-engine.txt", "profile-trl.txt", "vs.json"])


def test_dry_run_goals_side_by_side(dry_run):
    """Every "must show" figure is measured in the dry run (CPU stand-ins where CUDA is missing)
    and written beside its goal."""
    out, report, _ = dry_run
    run = load_run()
    rows = {g["figure"]: g for g in report["goals"]}
    for name in run.TABLE_VARIANTS:
        g = rows[f"engine step / TRL step, {name}"]
        assert g["value"] > 0 and g["goal"] == 1.03 and g["met"] == (g["value"] <= 1.03)
    assert rows["wall ratio interleaved / sequential TRL, eval_4x8"]["goal"] == 0.97
    assert rows["wall ratio interleaved / sequential TRL, noeval_16x2"]["goal"] == 1.03
    for what in ("park", "unpark"):
        g = rows[f"{what} / one plain pinned copy of the same bytes"]
        assert g["value"] > 0 and g["goal"] == 2.0 and "no CUDA" in g["note"]
    assert rows["time to the winner / Optuna + TRL's best side"]["value"] > 0
    assert rows["final loss gap to that side"]["goal"] == 0.01
    assert rows["packing: 4 adapters in one batch vs 4 steps, speed-up"]["value"] > 0
    assert all(g["value"] is not None for g in report["goals"]), [g for g in report["goals"] if g["value"] is None]
    summary = (out / "gpu_check_summary.txt").read_text()
    assert summary.count("engine step / TRL step,") == len(run.TABLE_VARIANTS)


def test_dry_run_installs_the_wheels_and_checks_their_needs(dry_run):
    _, report, _ = dry_run
    inst = report["install"]
    assert [w["file"] for w in inst["installed"]] == ["rfgpu_probe-1.2.3-py3-none-any.whl"] and not inst["error"]
    env = ok(report, "env")
    probe = env["carried"]["rfgpu-probe"]
    assert probe["version"] == "1.2.3" and probe["resolved_from_target"]
    assert probe["imports"] == {"rfgpu_probe": "ok", "rfgpu_probe_extra": "ok"}
    assert probe["unmet"] == ["rfgpu-no-such-dist>=1 (missing)"]
    assert env["cuda"] is False and env["versions"]["torch"] and env["versions"]["trl"]
    assert env["rapidfire_version_problems"] == [] and env["rapidfire_nb"]["path"] == str(REPO / "rapidfire_nb")


def test_dry_run_exactness_is_bitwise_on_cpu(dry_run):
    _, report, _ = dry_run
    res = ok(report, "exactness")
    exact(res["default"])
    # deterministic kernels only explain a difference; there is none on the CPU
    assert res["deterministic"] == {"skipped": "the default kernels were bitwise identical already"}
    assert res["cublas_workspace_config"] == ":4096:8"


def test_dry_run_precision(dry_run):
    _, report, _ = dry_run
    res = ok(report, "precision")
    for prec in ("fp16", "bf16"):
        exact(res[prec])
        assert res[prec]["precision"] == prec and res[prec]["scaler_in_use"] is False
    assert "no CUDA" in res["note"]


def test_dry_run_offload(dry_run):
    _, report, _ = dry_run
    res = ok(report, "offload")
    assert res["all_completed"] and res["bitwise_weights"] and res["bitwise_losses"]
    assert len(res["weights"]) == 2 and all(w["compared"] > 0 for w in res["weights"].values())
    # every chunk waits for the checkpoint writer (settled_writes), so the idle run is parked at
    # each of the two swaps whatever the machine's load: run 1 when run 2 starts, then run 2
    assert res["parks_done"]["never"] == 0 and res["parks_done"]["always"] >= 2
    assert res["bytes_per_parked_run"] > 0
    assert res["parks"] == res["parks_done"]["always"] and res["unparks"] >= 1
    assert res["park_ms_median"] > 0 and res["unpark_ms_median"] > 0
    assert res["swap"]["always"]["swaps"] == 2 and res["swap"]["always"]["median_ms"] > 0
    ref = res["reference"]
    assert ref["bytes"] == res["bytes_per_parked_run"] and ref["same_bytes_round_trip_ms"] > 0
    assert ref["pinned"] == "skipped: no CUDA" and res["swap_vs_reference"] > 0


def test_dry_run_memory(dry_run):
    _, report, _ = dry_run
    res = ok(report, "memory")
    assert res["runs_compared"] == [1, 3]
    for n in (1, 3):
        x = res[f"n{n}"]
        assert x["runs"] == n and x["all_completed"] and x["parks_done"] == 0 and x["rss_peak_mb"] > 100
        assert x["model_params"] > 0 and "cuda_peak_mb" not in x
    assert res["ratio"] == res["n3"]["rss_peak_mb"] / res["n1"]["rss_peak_mb"]
    assert res["measure"].startswith("process RSS")


def test_dry_run_bench_variants_through_the_cli(dry_run):
    out, report, _ = dry_run
    res = ok(report, "bench")
    sec = report["sections"]["bench"]
    assert sec["launches"] == 1   # every variant in one process
    items = load_run().bench_items(True)
    assert list(res["items"]) == [it["name"] for it in items]
    for it in items:
        rec = res["items"][it["name"]]
        if it.get("needs") and rec["status"] == "skipped":   # the flag is another change's
            assert rec["result"]["reason"].startswith("flag not available")
            continue
        assert rec["status"] == "ok", rec
        r = rec["result"]
        assert r["command"].startswith("rapidfire bench --preset smoke --repeats 1 --no-memory")
        assert ("--no-warmup" in r["command"]) == (it is not items[0])   # one warm-up per process
        rep = r["report"]
        assert rep == json.loads((out / "raw" / f"bench-{it['name']}.json").read_text())
        med = rep["median"]
        assert med["ratio"] > 0 and med["engine_step_ms"] > 0 and med["trl_step_ms"] > 0
        assert set(med["engine_split_s"]) >= {"train_s", "swap_s", "setup_s", "snapshot_s", "checkpoint_s"}
        assert rep["eval"] == ("both" if it["name"] == "eval_4x8" else "none")
        assert rep["preset"]["n_configs"] == (1 if it["name"] == "one_4x8" else 2)
        assert rep["preset"]["num_chunks"] * rep["preset"]["steps_per_chunk"] == 4
        assert rep["offload"] == ("never" if it["name"] == "never_4x8" else "auto")
        if it.get("needs"):
            assert rep["checkpoints"] is False and med["engine_split_s"]["checkpoint_s"] < 0.01
    summary = (out / "gpu_check_summary.txt").read_text()
    assert all(f"  {it['name']} (" in summary for it in items)


def test_dry_run_profile(dry_run):
    """The engine's chunks and TRL's steps under torch.profiler: every step found, its ops
    counted in the training thread, the boundary work timed, the two sides compared."""
    _, report, _ = dry_run
    res = ok(report, "profile")
    assert res["preset"]["n_configs"] == 2 and res["device_activity"] is False
    n_steps = 2 * 2 * 3   # 2 configs x 2 chunks x 3 steps on both sides
    eng, trl = res["engine"], res["trl"]
    assert eng["steps"]["chunks"] == 4 and eng["steps"]["steps"] == n_steps
    assert trl["steps"]["chunks"] == 2 and trl["steps"]["steps"] == n_steps
    for side in (eng, trl):
        st = side["steps"]
        assert st["first_step_ms"] > 0 and st["steady_step_ms"] > 0 and st["first_vs_steady"] > 0
        assert side["all_threads"] and side["ops"]["captured"]
        assert side["ops"]["steps"] == n_steps and side["ops"]["first_steps"] == st["chunks"]
        steady = side["ops"]["per_step_steady"]
        assert steady["aten_ops"] > 0 and steady["copies"] > 0
        assert len(side["ops"]["self_us_per_step"]) > 10
    b = eng["boundary_ms"]
    assert b["checkpoint_handoff"]["calls"] == 4 and b["checkpoint_write"]["calls"] == 4
    assert b["swap_in"]["calls"] == 4 and b["checkpoint_write"]["median_ms"] > 0
    assert any(b.get(k, {}).get("calls") == 4 for k in ("snapshot", "snapshot_flat"))   # one per chunk
    assert "steady_steps_writer_busy" in eng["steps"]
    assert eng["ops"]["boundary_ops"]["checkpoint_write"]["calls"] == 4
    cmp_ = res["compare"]
    assert cmp_["steady_step_ratio"] > 0 and len(cmp_["ops_differing_most"]) == 12
    assert set(cmp_["per_steady_step"]) >= {"aten_ops", "copies"}


def test_dry_run_packing_probe(dry_run):
    _, report, _ = dry_run
    res = ok(report, "packing")
    assert res["runs"] == 4 and res["sequential_ms"] > 0
    for name in ("peft_mixed_batch", "row_slices"):
        path = res["paths"][name]
        # fp32 on the CPU: the packed gradients of every adapter match the sequential ones
        assert path["grads_allclose"] and path["grads_max_rel_err"] < 1e-4, path
        assert path["ms"] > 0 and path["speedup"] == res["sequential_ms"] / path["ms"]
    assert res["speedup"] == res["paths"][res["best_path"]]["speedup"]


def test_dry_run_vs_optuna(dry_run):
    out, report, _ = dry_run
    res = ok(report, "vs")
    assert res["command"].startswith("rapidfire bench --vs optuna --preset smoke")
    rep = res["report"]
    assert set(rep["stats"]) == {"sequential", "optuna-grid-sha", "rapidfire-sha"}
    assert rep["target"]["available"] and rep["target"]["optuna_side"] == "optuna-grid-sha"
    assert rep["target"]["time_ratio"] > 0
    assert "per_repeat" in json.loads((out / "raw" / "vs.json").read_text())


def test_dry_run_ray_is_skipped_with_its_reason(dry_run):
    _, report, _ = dry_run
    sec = report["sections"]["ray"]
    assert sec["status"] == "skipped"
    res = sec["result"]
    if res["importable"]:
        assert "dry run" in res["reason"]
    else:
        assert "not carried" in res["reason"]


def test_a_failing_or_hanging_section_leaves_the_others_running(tmp_path):
    """An error is recorded and the next section runs; a hang is killed at the time limit; what
    no longer fits the budget is skipped, and the report is complete."""
    proc, report, wall = run_check(tmp_path, "--wheels", str(tmp_path / "none"), "--budget", "25",
                                   "--only", "env,bench,ray", "--inject", "env:error", "--inject", "bench:hang",
                                   timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env, bench, ray = (report["sections"][n] for n in ("env", "bench", "ray"))
    assert env["status"] == "error" and "failure injected" in env["error"]
    # the section's limit leaves the 3 s that ray needs at least
    assert bench["status"] == "timeout" and bench["seconds"] >= bench["limit_s"] - 1
    assert bench["limit_s"] <= 25 - 3
    first, *rest = bench["result"]["items"].values()
    assert first["status"] == "timeout" and "section's time limit" in first["error"]
    assert rest and all(r["status"] == "skipped" and r["reason"].startswith("time budget") for r in rest)
    assert ray["status"] == "skipped" and ray["reason"].startswith("time budget")
    assert report["finished"] and wall < 60
    assert "no wheels in" in report["install"]["error"]
    assert list(report["sections"]) == ["env", "bench", "ray"]


def run_selftest(tmp_path, plan, **params):
    run = load_run()
    out = tmp_path / "out"
    out.mkdir()
    runner = run.Runner(out, budget=60, reserve=0, env=dict(os.environ), inject={})
    runner.log.write_text("")
    params = dict(params, items=[{"name": n, "do": d} for n, d in plan], item_cap=4)
    saved = []
    rec = runner.items("selftest", params, cap=40, minimum=1, workdir=tmp_path, later=0,
                       progress=lambda r: saved.append({k: v["status"] for k, v in r["result"]["items"].items()}))
    assert len(saved) == len(plan) and list(saved[-1]) == [n for n, _ in plan]   # saved as each ends
    return rec, rec["result"]["items"]


def test_items_isolated_from_each_other(tmp_path):
    """The items of a section run in one process; one that fails is recorded and the next runs
    there, one that takes its process down or runs past its own limit is recorded and a fresh
    process goes on with the rest; the report is saved as each item ends."""
    plan = [("a", "ok"), ("b", "error"), ("c", "ok"), ("d", "crash"), ("e", "ok"), ("f", "hang"), ("g", "ok")]
    rec, items = run_selftest(tmp_path, plan)
    assert {k: v["status"] for k, v in items.items()} == dict(
        a="ok", b="error", c="ok", d="error", e="ok", f="timeout", g="ok")
    assert "failed on purpose" in items["b"]["error"] and "exited 9 during this item" in items["d"]["error"]
    assert "an item's time limit" in items["f"]["error"]
    assert rec["launches"] == 3 and rec["status"] == "error"
    pids = [items[k]["result"]["pid"] for k in "aceg"]
    assert pids[0] == pids[1] != pids[2] != pids[3]   # a, c in the first process; e, g each in a fresh one
    assert [items[k]["result"]["first_in_process"] for k in "aceg"] == [True, False, True, True]


def test_items_after_a_failure_go_on_in_a_fresh_process(tmp_path):
    """On CUDA a failed item ends its process (a CUDA error can spoil the context): the next
    item runs in a fresh one, none is lost."""
    rec, items = run_selftest(tmp_path, [("a", "ok"), ("b", "error"), ("c", "ok"), ("d", "ok")],
                              fresh_after_error=True)
    assert {k: v["status"] for k, v in items.items()} == dict(a="ok", b="error", c="ok", d="ok")
    assert rec["launches"] == 2 and items["c"]["result"]["first_in_process"]
    assert items["a"]["result"]["pid"] != items["c"]["result"]["pid"] == items["d"]["result"]["pid"]


def load_sections():
    spec = importlib.util.spec_from_file_location("gpu_check_sections", REPO / "tests" / "gpu" / "sections.py")
    sections = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sections)
    return sections


def test_profile_analysis_of_cuda_events():
    """What the profile reads from a CUDA trace, on made-up events of the kinds torch.profiler
    gives there (the dry run has none): host syncs and launches per step in the training thread,
    the device's kernels and copies by time, the ops inside a boundary range, other threads."""
    from types import SimpleNamespace as E

    sections = load_sections()

    def ev(name, thread, a, b, device=False, self_us=None):
        return E(name=name, thread=thread, time_range=E(start=a, end=b), self_cpu_time_total=self_us or (b - a),
                 device_type="DeviceType.CUDA" if device else "DeviceType.CPU")

    events = [
        ev("rfcheck::chunk_steps", 1, 0, 300),
        ev("aten::mm", 1, 5, 15), ev("cudaLaunchKernel", 1, 6, 7), ev("aten::_local_scalar_dense", 1, 20, 30),
        ev("cudaStreamSynchronize", 1, 21, 29), ev("rfcheck::step_end", 1, 100, 100),   # step 1 (first)
        ev("aten::mm", 1, 105, 115), ev("cudaLaunchKernel", 1, 106, 107), ev("cudaLaunchKernel", 1, 108, 109),
        ev("rfcheck::step_end", 1, 200, 200),                                               # step 2
        ev("aten::copy_", 1, 205, 215), ev("cudaMemcpyAsync", 1, 206, 207),
        ev("rfcheck::step_end", 1, 300, 300),                                               # step 3
        ev("rfcheck::snapshot_refs", 1, 310, 350), ev("aten::copy_", 1, 315, 320), ev("aten::item", 1, 321, 330),
        ev("aten::_local_scalar_dense", 1, 322, 329),
        ev("aten::copy_", 2, 150, 160),                                                     # the writer thread
        ev("gemm_kernel", 0, 10, 50, device=True), ev("gemm_kernel", 0, 110, 130, device=True),
        ev("Memcpy DtoH (Device -> Pageable)", 0, 210, 212, device=True),
        ev("Memcpy DtoH (Device -> Pinned)", 0, 316, 318, device=True),
    ]
    out = sections.profile_analysis(events, "chunk_steps", boundary=True)
    assert out["captured"] and out["thread"] == 1 and out["steps"] == 3
    assert out["first_steps"] == 1 and out["steady_steps"] == 2
    first, steady = out["per_step_first"], out["per_step_steady"]
    assert first["item_reads"] == 1 and first["device_syncs"] == 1 and first["launches"] == 1
    assert first["device_us"] == 40
    assert steady["launches"] == 1 and steady["copies"] == 0.5 and steady["memcpy_calls"] == 0.5
    assert steady["memcpy DtoH pageable"] == 0.5 and steady["device_us"] == 11
    assert out["other_threads_per_steady_step"] == {"aten_ops": 0.5, "copies": 0.5}
    assert out["profiled_step_ms"] == {"first": 0.1, "steady": 0.1}
    assert out["self_us_per_step"]["aten::mm"] == (20 / 3, 2 / 3)
    snap = out["boundary_ops"]["snapshot_refs"]
    assert snap["calls"] == 1 and snap["copies"] == 1 and snap["item_reads"] == 1 and snap["aten_ops"] == 3
    assert snap["memcpy DtoH"] == 1
    assert sections.profile_analysis([ev("aten::mm", 1, 0, 1)], "chunk_steps", False)["captured"] is False


def test_a_bench_flag_this_checkout_lacks_is_recorded_not_run(tmp_path):
    """A variant that needs an option ``rapidfire bench --help`` does not list is skipped with
    that reason (the check runs on whatever checkout travels)."""
    sections = load_sections()
    assert "--no-checkpoints" in sections.bench_help()
    item = {"name": "x", "argv": ["--preset", "smoke", "--no-such-flag"], "needs": ["--no-such-flag"]}
    res = sections.bench_item(item, {"raw_dir": str(tmp_path)}, tmp_path, True)
    assert res == {"skipped": True, "reason": "flag not available: rapidfire bench --help has no --no-such-flag "
                                              "in this checkout"}
    assert list(tmp_path.iterdir()) == []


def test_wheel_tags_refused_for_another_python(tmp_path):
    run = load_run()
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert run.wheel_fits(f"x-1-{here}-{here}-manylinux_2_28_x86_64.whl") is None or os.uname().machine != "x86_64"
    assert run.wheel_fits("x-1-py3-none-any.whl") is None
    assert "built for cp39" in run.wheel_fits("x-1-cp39-cp39-manylinux2014_x86_64.whl")
    assert "built for" in run.wheel_fits("x-1-py3-none-win_amd64.whl")


def test_run_needs_an_output_folder(tmp_path):
    env = dict(os.environ)
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(RUN), "--dry-run"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "no output folder" in proc.stderr
    proc = subprocess.run([sys.executable, str(RUN), "--out", str(tmp_path), "--only", "nope"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "unknown section" in proc.stderr
