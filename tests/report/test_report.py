"""Results outside the live kernel: exp.plot(), exp.report(), `rapidfire report` on a finished and
on a SIGKILLed folder, the panel's static fallback, and one palette/downsampling rule with the panel."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapidfire_nb.tracking.naming import short_name

from rapidfire_nb.engine.events import read_events
from rapidfire_nb.engine.state import fold, new_run, new_table
from rapidfire_nb.report import (ReportError, curves_figure, fallback_html, read_folder,
                                 report_html, write_report)
from rapidfire_nb.report import style

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests"))
import crash_worker as W  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           RF_TENSORBOARD_ENABLED="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")


def fixture_table(name: str) -> dict:
    return fold(read_events(FIXTURES / "events" / f"{name}.jsonl"))


def folder_digest(folder: Path) -> dict:
    """Every file under the folder with its bytes' hash and mtime: what 'nothing written' means."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


# -- one palette, one downsampling rule --------------------------------------------------------

def test_palette_json_and_downsample_fixture_are_the_python_rules():
    sys.path.insert(0, str(FIXTURES / "report"))
    import make_downsample

    rules = json.loads((ROOT / "rapidfire_nb" / "report" / "palette.json").read_text())
    assert list(style.PALETTE) == rules["palette"] and len(style.PALETTE) == 24
    assert [style.run_dash(r) for r in (1, 24, 25, 49, 73, 97)] == ["solid", "solid", "dash", "dot", "dashdot", "solid"]
    assert style.run_color(25) == style.run_color(1) and style.run_color(2) != style.run_color(1)
    # js/test/palette.test.ts checks palette.ts and chartplan.ts against this very file: it must be current
    on_disk = json.loads((FIXTURES / "report" / "downsample.json").read_text())
    assert on_disk == json.loads(json.dumps(make_downsample.build())), \
        "downsample.json is stale: run python tests/fixtures/report/make_downsample.py"
    assert any(c["drawn"]["sampled"] for c in on_disk["series"])


def test_lttb_keeps_ends_and_spikes_and_drops_gaps():
    x = list(range(0, 50000, 5))
    y = [math.sin(i / 500) for i in range(len(x))]
    y[7000] = 40.0
    y[123] = None
    dx, dy = style.lttb(x, y, 500)
    assert len(dx) == 500 and dx[0] == 0 and dx[-1] == x[-1]
    assert 35000 in dx and None not in dy and 615 not in dx


# -- exp.plot / exp.report on a real tiny experiment ---------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real 3-run SFT experiment (crash_worker's), trained to the end; its lock still held."""
    root = tmp_path_factory.mktemp("report-exp")
    exp = W.run_experiment(root)
    assert exp.wait(timeout=600)
    yield exp
    exp.end()


def test_plot_draws_each_run_in_the_panels_colour_at_samples_seen(finished):
    fig = finished.plot()   # train loss
    import plotly.graph_objects as go

    assert isinstance(fig, go.Figure)
    results = finished.get_results()
    names = [short_name(rid, {"training_args.learning_rate": W.LEARNING_RATES[rid - 1]})
             for rid in (1, 2, 3)]
    assert [t.name for t in fig.data] == names and names[0].startswith("1 · lr ")
    for rid, trace in zip((1, 2, 3), fig.data):
        assert trace.line.color == style.PALETTE[rid - 1] and trace.line.dash == "solid"
        want = results[(results.run_id == rid) & (results.split == "train") & (results.metric == "loss")]
        assert list(trace.x) == list(want.samples_seen) and len(trace.x) > 3
        assert list(trace.y) == pytest.approx(list(want.value))
        # the hover lists every run at the pointer's x, each by its short name (the knob that
        # differs between runs)
        assert names[rid - 1] in trace.hovertemplate
    assert fig.layout.hovermode == "x unified"
    assert fig.layout.xaxis.title.text == "samples seen"
    ev = finished.plot("loss", split="eval", runs=[2])
    assert [t.name for t in ev.data] == [names[1]] and ev.layout.yaxis.title.text == "eval_loss"
    assert len(ev.data[0].x) == 6   # one eval per chunk: 2 epochs x 3 chunks


def test_plot_smooths_logs_and_changes_the_x_axis_as_the_panel_does(finished):
    from rapidfire_nb.report.figures import smoothed

    raw = finished.plot()
    fig = finished.plot(smoothing=0.8, log_y=True)
    # per run: the raw curve (faint, not in the legend, not hovered) and the smoothed one
    faint = [t for t in fig.data if t.showlegend is False and t.hoverinfo == "skip"]
    shown = [t for t in fig.data if t.showlegend is not False]
    assert len(faint) == len(shown) == 3
    for r, f, s in zip(raw.data, faint, shown):
        assert list(f.y) == list(r.y) and f.opacity == pytest.approx(0.25) and f.line.width == 1
        assert list(s.y) == pytest.approx(smoothed(list(r.y), 0.8)) and list(s.y) != list(r.y)
        assert s.y[0] == pytest.approx(r.y[0])   # debiased: the first point is not pulled to 0
    assert fig.layout.yaxis.type == "log" and "smoothed 0.8" in fig.layout.title.text
    results = finished.get_results()
    by_step = finished.plot(x="step")
    want = results[(results.run_id == 1) & (results.split == "train") & (results.metric == "loss")]
    assert list(by_step.data[0].x) == list(want.step) and by_step.layout.xaxis.title.text == "optimizer step"
    by_time = finished.plot(x="time")
    xs = list(by_time.data[0].x)
    assert xs == sorted(xs) and min(min(t.x) for t in by_time.data) == 0.0 and xs[-1] > 0
    assert by_time.layout.xaxis.title.text == "wall time (s)"
    for bad, match in [(dict(smoothing=1.5), "smoothing must be a number from 0"),
                       (dict(smoothing="0.5"), "smoothing must be"),
                       (dict(log_y="yes"), "log_y must be True or False"),
                       (dict(x="epoch"), "x must be one of 'samples', 'step', 'time'")]:
        with pytest.raises(ReportError, match=match):
            finished.plot(**bad)


def test_a_note_stays_in_the_log_and_bad_notes_change_nothing(finished):
    from rapidfire_nb.results import note_run

    before = finished.events.last_seq
    with pytest.raises(ValueError, match=r"at most 2000 characters; this one has 1048576"):
        finished.note(1, "x" * (1 << 20))              # a 1 MB note is refused, clearly
    for args, match in [((99, "hi"), r"no run 99 in this experiment \(runs: 1, 2, 3\)"),
                        (("1", "hi"), "run_id must be a run id"), ((1, b"hi"), "a note is text"),
                        ((1, "a\x00b"), "NUL")]:
        with pytest.raises(ValueError, match=match):
            finished.note(*args)
    with pytest.raises(ValueError, match="read-only or has ended"):
        note_run(finished.events, {1}, 1, "late", writable=False)
    assert finished.events.last_seq == before          # nothing logged
    finished.note(2, "best so far · try a lower lr")
    assert finished.get_runs_info().set_index("run_id").note.to_dict() == {
        1: None, 2: "best so far · try a lower lr", 3: None}
    assert read_folder(finished.path)[0]["runs"]["2"]["note"] == "best so far · try a lower lr"
    finished.note(2, "")                                # an empty note clears it
    assert finished.get_runs_info().set_index("run_id").note[2] is None
    info = finished.get_runs_info()
    assert list(info.columns[:3]) == ["run_id", "name", "status"]
    assert info.name[0] == short_name(1, {"training_args.learning_rate": W.LEARNING_RATES[0]})


def test_each_chunk_logs_its_tokens_per_second_and_peak_memory(finished):
    tl = finished.get_timeline()
    assert len(tl) > 0 and tl.tokens.notna().all() and (tl.tokens > 0).all()
    assert (tl.tokens_per_s - tl.tokens / tl.train_s).abs().max() < 1e-6 * tl.tokens_per_s.max()
    # on this CPU: the process's resident set, tens of MB at least, never more than the machine
    import os as _os
    total_mb = _os.sysconf("SC_PAGE_SIZE") * _os.sysconf("SC_PHYS_PAGES") / 2**20
    assert tl.peak_mem_mb.between(20, total_mb).all()


def test_plot_refuses_unknown_metrics_runs_and_splits(finished):
    with pytest.raises(ReportError, match=r"no train metric 'bleu'.*loss"):
        finished.plot("bleu")
    with pytest.raises(ReportError, match="no run 9 in this experiment"):
        finished.plot(runs=[1, 9])
    with pytest.raises(ReportError, match="split must be 'train', 'eval' or None"):
        finished.plot(split="test")
    # the natural spelling of the eval loss works without split=
    assert finished.plot("eval_loss").layout.yaxis.title.text == "eval_loss"
    with pytest.raises(ReportError, match="list of run ids"):
        finished.plot(runs=3)


def test_figures_work_in_a_script_write_html_and_the_report(finished, tmp_path):
    fig = finished.plot()
    fig.write_html(tmp_path / "fig.html", include_plotlyjs=True)
    assert (tmp_path / "fig.html").stat().st_size > 1_000_000
    out = finished.report(tmp_path / "exp.html")
    text = out.read_text()
    from plotly.offline import get_plotlyjs_version

    assert f"plotly.js {get_plotlyjs_version()} is inside this file" in text
    # plotly.js itself (inline in the head) names its CDN in strings; the page loads nothing
    head, body = text.split("</head>", 1)
    assert head.count("<script") == 1 and "<script src" not in head
    assert "src=" not in body and "https://" not in body and "http://" not in body
    assert text.count("Plotly.newPlot") >= 2 + 2   # curves of several metrics, time split, timeline
    assert "Leaderboard" in text and "chunk timeline · 18 chunks" in text


def test_cli_reads_a_live_folder_without_its_lock_and_writes_nothing_there(finished, tmp_path):
    # the experiment still holds its folder lock (end() not called): the CLI must not need it
    folder = Path(finished.path)
    before = folder_digest(folder)
    proc = run_cli(str(folder), "-o", str(tmp_path / "r.html"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "3 runs" in proc.stdout
    assert folder_digest(folder) == before
    html = (tmp_path / "r.html").read_text()
    assert "ended (the log closes" not in html   # run_fit finished, but end() has not been logged
    table, _ = read_folder(folder)
    assert [r["status"] for r in table["runs"].values()] == ["completed"] * 3
    # default output: <name>-report.html in the current folder
    proc = run_cli(str(folder), cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / f"{W.NAME}-report.html").is_file()


def test_panel_display_carries_a_static_table_beside_the_widget(finished):
    from rapidfire_nb.notebook.panel import Panel

    panel = Panel(finished, push=False)
    try:
        bundle = panel._repr_mimebundle_()
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        assert "application/vnd.jupyter.widget-view+json" in data
        static = data["text/html"]
        assert "3 completed" in static and "needs a running kernel" in static
        assert static.count("<tr>") == 1 + 3 and "learning_rate" in static
    finally:
        panel.close()


@pytest.mark.slow
def test_a_saved_notebook_shows_the_table_in_nbconvert(finished):
    # what nbviewer and GitHub do with a saved notebook: no widget state, so the HTML shows
    nbformat = pytest.importorskip("nbformat")
    nbconvert = pytest.importorskip("nbconvert")
    from rapidfire_nb.notebook.panel import Panel

    panel = Panel(finished, push=False)
    try:
        bundle = panel._repr_mimebundle_()
    finally:
        panel.close()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("exp", outputs=[
        nbformat.v4.new_output("display_data", data=data)]))
    nbformat.validate(nb)
    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    assert "needs a running kernel" in body and "learning_rate" in body


# -- a SIGKILLed experiment, read from a read-only copy ----------------------------------------

@pytest.mark.slow
def test_cli_reports_a_sigkilled_experiment_from_a_read_only_copy(tmp_path):
    root = tmp_path / "killed"
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import crash_worker as W; "
            f"W.run_experiment({str(root)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = root / W.NAME / "events.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().count('"chunk_done"') >= 4:
            break
        assert proc.poll() is None, "the experiment ended before it was killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    copy = tmp_path / "sent" / W.NAME
    shutil.copytree(root / W.NAME, copy)
    with open(copy / "events.jsonl", "ab") as f:
        f.write(b'{"seq": 99999, "time": 1.0, "type": "met')     # a torn last line
    for p in [copy, *copy.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    before = folder_digest(copy)
    try:
        proc = run_cli(str(copy), "-o", str(tmp_path / "killed.html"), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert folder_digest(copy) == before
        assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in (root / W.NAME).iterdir())
    finally:
        for p in [copy, *copy.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    html = (tmp_path / "killed.html").read_text()
    table = fold(read_events(root / W.NAME / "events.jsonl"))
    chunks = len(table["timeline"])
    assert chunks >= 4 and f"chunk timeline · {chunks} chunks" in html
    assert "not ended: the experiment is still training, or its process stopped" in html
    assert "Plotly.newPlot" in html


def test_cli_errors_name_the_problem(tmp_path):
    proc = run_cli(str(tmp_path / "nope"), cwd=tmp_path)
    assert proc.returncode == 2 and "is not a folder" in proc.stderr
    parent = tmp_path / "rapidfire_experiments"
    (parent / "demo").mkdir(parents=True)
    shutil.copy(FIXTURES / "events" / "pruned.jsonl", parent / "demo" / "events.jsonl")
    proc = run_cli(str(parent), cwd=tmp_path)
    assert proc.returncode == 2 and "not an experiment folder; experiments inside it: demo" in proc.stderr
    proc = run_cli(str(parent / "demo"), "-o", str(tmp_path / "missing" / "r.html"), cwd=tmp_path)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    with open(parent / "demo" / "events.jsonl", "a") as f:
        f.write("not json\n{}\n")
    proc = run_cli(str(parent / "demo"), cwd=tmp_path)
    assert proc.returncode == 2 and "line 54: not valid JSON" in proc.stderr
    assert not (tmp_path / "demo-report.html").exists()


# -- what the report shows ---------------------------------------------------------------------

def test_pruned_runs_end_in_a_mark_with_the_reason():
    table = fixture_table("pruned")
    pruned = [r for r in table["runs"].values() if r["pruned"]]
    assert pruned
    fig = curves_figure(table, "loss", "eval")
    for run in pruned:
        line = next(t for t in fig.data if t.name == f"{short_name(run['run_id'], run['knobs'])} (pruned)")
        assert line.opacity == pytest.approx(0.35)
        mark = next(t for t in fig.data if t.mode == "markers" and t.legendgroup == line.legendgroup)
        assert mark.marker.symbol == "x" and run["reason"] in mark.hovertemplate
        assert mark.x[0] == run["series"]["eval"]["eval_loss"]["x"][-1]


def test_leaderboard_best_first_with_lineage_and_reasons():
    table = fixture_table("clone_delete")
    html = report_html(table)
    clones = [r for r in table["runs"].values() if r["parent_run_id"] is not None]
    assert clones
    for c in clones:
        assert ("warm clone of " if c["warm_start"] else "clone of ") + str(c["parent_run_id"]) in html
    from rapidfire_nb.report.model import leaderboard

    board = [r["best"].get("eval_loss") for r in leaderboard(table)]
    ranked = [v for v in board if v is not None]
    assert ranked == sorted(ranked) and board[: len(ranked)] == ranked
    assert "deleted" in fallback_html(table)


def test_leaderboard_cells_never_break_inside_a_value():
    """A number or a name split over two lines misreads ("0.64" over "21"): cells stay on one
    line, a long one cut with an ellipsis and whole in its title."""
    import re

    from rapidfire_nb.report.page import leaderboard_html

    table = fixture_table("clone_delete")
    board = leaderboard_html(table)
    rows = re.findall(r"<tr>(.*?)</tr>", board.split("<tbody>")[1])
    assert rows and "word-break" not in board and "overflow-wrap:anywhere" not in board
    for row in rows:
        cells = re.findall(r"<td ([^>]*)>", row)
        *values, note = cells
        for attrs in values:
            assert "white-space:nowrap" in attrs and "text-overflow:ellipsis" in attrs and 'title="' in attrs
        # the note is the user's prose: it wraps between words (a word longer than the column
        # alone may break), so the last column stays inside the window
        assert "white-space:normal" in note and "overflow-wrap:break-word" in note and 'title="' in note
    ths = re.findall(r"<th ([^>]*)>", board)
    # headers wrap between their words only
    assert ths and all("white-space:normal" in a and "overflow-wrap" not in a for a in ths)
    run = next(iter(table["runs"].values()))
    assert f'title="{run["status"]}"' in board


def test_logged_strings_stay_text_in_the_report(tmp_path):
    hostile = "</script><script>alert(1)</script><img src=x onerror=alert(2)>"
    events = read_events(FIXTURES / "events" / "pruned.jsonl")
    for ev in events:
        if ev["type"] == "experiment":
            ev["name"] = hostile
        if ev["type"] == "run_created" and ev["run_id"] == 1:
            ev["config"]["training_args"]["learning_rate"] = hostile
        if ev["type"] == "run_status" and ev.get("reason"):
            ev["reason"] = "pruned " + hostile
    html = report_html(fold(events))
    assert hostile not in html and "<img src=x" not in html
    assert "&lt;/script&gt;" in html   # shown, as text


# -- downsampling at scale -----------------------------------------------------------------------

def test_48_runs_of_10000_points_stay_within_the_point_budget():
    table = new_table()
    table["train_metrics"] = ["loss"]
    for rid in range(1, 49):
        run = new_run(rid)
        run["created"] = True
        run["knobs"] = {"training_args.learning_rate": None}
        run["config"] = {"training_args": {"learning_rate": 1e-4 * rid}}
        xs = list(range(8, 80008, 8))
        ys = [5 * math.exp(-i / 3000) + 0.01 * ((i * rid) % 7) for i in range(10000)]
        ys[5000] = 9.0   # a spike the thinning must keep
        run["series"]["train"]["loss"] = {"x": xs, "y": ys}
        table["runs"][str(rid)] = run
    t0 = time.perf_counter()
    fig = curves_figure(table)
    built = time.perf_counter() - t0
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 48
    total = sum(len(t.x) for t in lines)
    assert total <= style.POINT_BUDGET == 9600
    assert all(len(t.x) == style.trace_point_limit(48) == 200 for t in lines)
    assert all(t.x[0] == 8 and t.x[-1] == 80000 and 9.0 in t.y for t in lines)
    assert [t.line.color for t in lines] == [style.run_color(r) for r in range(1, 49)]
    assert [t.line.dash for t in lines][23:25] == ["solid", "dash"]
    t0 = time.perf_counter()
    size = len(fig.to_json())
    print(f"\n48 runs x 10,000 points: figure built in {built:.2f} s, {total} points drawn, "
          f"JSON {size / 1e6:.2f} MB in {time.perf_counter() - t0:.2f} s")


def test_write_report_refuses_a_folder_as_the_file(tmp_path):
    with pytest.raises(ReportError, match="is a folder"):
        write_report(fixture_table("sft_basic"), tmp_path)


# -- hostile input to the CLI and to plot: one-line errors, the folder untouched -------------------

def _fixture_folder(tmp_path: Path, name: str = "demo", events: str = "pruned") -> Path:
    folder = tmp_path / "exps" / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "events" / f"{events}.jsonl", folder / "events.jsonl")
    (folder / "checkpoints").mkdir()
    (folder / "experiment.json").write_text(json.dumps({"name": name, "num_chunks": 3}))
    return folder


def _one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_cli_never_writes_into_the_experiment_folder(tmp_path):
    folder = _fixture_folder(tmp_path)
    (tmp_path / "link.html").symlink_to(folder / "events.jsonl")
    before = folder_digest(folder)
    for out in (folder / "report.html", folder / "checkpoints" / ".." / "r.html", folder / "events.jsonl"):
        _one_line_error(run_cli(str(folder), "-o", str(out), cwd=tmp_path), "inside the experiment folder")
    # a link that leads into the folder is refused too, even with --force
    _one_line_error(run_cli(str(folder), "-o", "link.html", "--force", cwd=tmp_path),
                    "inside the experiment folder")
    # and the folder reached through a link of its own
    (tmp_path / "alias").symlink_to(folder)
    _one_line_error(run_cli("alias", "-o", "alias/r.html", cwd=tmp_path), "inside the experiment folder")
    assert folder_digest(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoints", "events.jsonl", "experiment.json"]


def test_cli_refuses_an_existing_output_unless_forced(tmp_path):
    folder = _fixture_folder(tmp_path)
    out = tmp_path / "mine.html"
    out.write_text("my own notes")
    _one_line_error(run_cli(str(folder), "-o", str(out), cwd=tmp_path), "mine.html already exists", "--force")
    assert out.read_text() == "my own notes"
    proc = run_cli(str(folder), "-o", str(out), "--force", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Plotly.newPlot" in out.read_text()
    # the default name is refused the same way the second time
    assert run_cli(str(folder), cwd=tmp_path).returncode == 0
    _one_line_error(run_cli(str(folder), cwd=tmp_path), "demo-report.html already exists")


def test_cli_default_name_is_the_folders_not_the_logs(tmp_path):
    # a crafted log's experiment name must not steer the report out of the current folder
    folder = _fixture_folder(tmp_path, name="sent ünï 名前")
    events = read_events(folder / "events.jsonl")
    for ev in events:
        if ev["type"] == "experiment":
            ev["name"] = "../../escaped"
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "experiment.json").write_text(json.dumps({"name": "../../escaped"}))
    cwd = tmp_path / "here"
    cwd.mkdir()
    proc = run_cli(str(folder), cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in cwd.iterdir()] == ["sent_ünï_名前-report.html"]
    assert not list(tmp_path.parent.glob("escaped*")) and not list(tmp_path.glob("escaped*"))


def test_cli_refuses_links_out_of_the_folder_and_odd_files(tmp_path):
    outside = _fixture_folder(tmp_path, name="elsewhere")
    a = tmp_path / "a"
    a.mkdir()
    (a / "events.jsonl").symlink_to(outside / "events.jsonl")
    _one_line_error(run_cli(str(a), "-o", "a.html", cwd=tmp_path),
                    "events.jsonl is a symbolic link", "does not follow links")
    b = _fixture_folder(tmp_path, name="b")
    (b / "experiment.json").unlink()
    (b / "experiment.json").symlink_to(outside / "experiment.json")
    _one_line_error(run_cli(str(b), "-o", "b.html", cwd=tmp_path), "experiment.json is a symbolic link")
    c = tmp_path / "c"
    c.mkdir()
    os.mkfifo(c / "events.jsonl")
    _one_line_error(run_cli(str(c), "-o", "c.html", cwd=tmp_path), "is not a regular file")
    # as the engine does, a link is refused even when it stays inside the folder
    d = _fixture_folder(tmp_path, name="d")
    (d / "events.jsonl").rename(d / "log.jsonl")
    (d / "events.jsonl").symlink_to("log.jsonl")
    _one_line_error(run_cli(str(d), "-o", "d.html", cwd=tmp_path), "events.jsonl is a symbolic link")
    assert not any((tmp_path / f"{n}.html").exists() for n in "abcd")
    # the CLI given a file, not a folder
    _one_line_error(run_cli(str(d / "log.jsonl"), cwd=tmp_path), "is not a folder")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_unwritable_output_names_the_file_not_a_temporary(tmp_path):
    folder = _fixture_folder(tmp_path)
    proc = run_cli(str(folder), "-o", "/proc/report.html", cwd=tmp_path)
    _one_line_error(proc, "cannot write /proc/report.html")
    assert ".tmp" not in proc.stderr


def test_plot_takes_the_split_that_logs_the_metric():
    table = fixture_table("sft_basic")
    assert "eval_loss" in table["eval_metrics"] and "eval_loss" not in table["train_metrics"]
    fig = curves_figure(table, "eval_loss")   # no split: the eval side has it
    assert fig.layout.yaxis.title.text == "eval_loss" and "(eval)" in fig.layout.title.text
    assert "(train)" in curves_figure(table, "loss").layout.title.text
    with pytest.raises(ReportError, match=r"'eval_loss' is logged in the eval split: pass split='eval'"):
        curves_figure(table, "eval_loss", split="train")
    with pytest.raises(ReportError, match="runs is empty"):
        curves_figure(table, "loss", runs=[])


SMALL = {"peft_config.r": 8, "peft_config.lora_alpha": 16, "peft_config.target_modules": ["q_proj", "v_proj"]}
BIG = {"peft_config.r": 32, "peft_config.lora_alpha": 64,
       "peft_config.target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def knob_table(knobs: list[dict]) -> dict:
    """The pruned fixture's table with its first runs given ``knobs`` (the others deleted)."""
    table = fixture_table("pruned")
    ids = sorted(table["runs"])
    for rid, k in zip(ids, knobs):
        table["runs"][rid]["knobs"] = k
    for rid in ids[len(knobs):]:
        table["runs"][rid]["status"] = "deleted"
    return table


def test_knobs_that_vary_together_share_one_plot_and_long_labels_wrap():
    """The quickstart's grid: two LoRA configs (r, lora_alpha and target_modules set at once) x two
    learning rates. Three identical plots would repeat the same points; one plot on r names the
    other two. A lone target_modules knob gets its lists as words wrapped to the plot's width."""
    from rapidfire_nb.report.figures import KNOB_COLUMNS, knobs_figure, linked_knobs, wrap_label

    grid = [{**lora, "training_args.learning_rate": lr} for lr in (2e-2, 5e-3) for lora in (SMALL, BIG)]
    fig = knobs_figure(knob_table(grid))
    assert [t.name for t in fig.data] == ["r", "learning_rate"]
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["r · lora_alpha · target_modules", "learning_rate"], titles
    assert "target_modules q_proj, k_proj, v_proj" in fig.data[0].text[1]   # the hover has the linked knobs
    runs = list(knob_table(grid)["runs"].values())[:4]
    assert linked_knobs(runs, ["peft_config.lora_alpha", "peft_config.r", "peft_config.target_modules",
                               "training_args.learning_rate"]) == [
        ("peft_config.r", ["peft_config.lora_alpha", "peft_config.target_modules"]),
        ("training_args.learning_rate", [])]

    # target_modules alone varies against r: its own plot, labels as lists of words, wrapped
    alone = [SMALL, {**BIG, "peft_config.lora_alpha": 16, "peft_config.r": 8},
             {**SMALL, "peft_config.r": 32, "peft_config.target_modules": ["q_proj"]}, {**SMALL, "peft_config.r": 32}]
    fig = knobs_figure(knob_table(alone))
    assert [t.name for t in fig.data] == ["r", "target_modules"]
    axis = fig.layout.xaxis2
    assert axis.type == "category" and axis.tickangle == 0
    assert list(axis.tickvals) == ["q_proj", "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj", "q_proj, v_proj"]
    chars = int(1100 / 2 / 3 / 7) - 1
    for text in axis.ticktext:
        assert all(len(line) <= chars for line in text.split("<br>")), axis.ticktext
        assert "[" not in text and '"' not in text
    assert wrap_label("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj", 16) == \
        "q_proj, k_proj,<br>v_proj, o_proj,<br>gate_proj…"

    # many knobs: rows of at most KNOB_COLUMNS plots
    # six knobs over four runs, no two splitting the runs alike
    columns = [[0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 1, 0], [0, 0, 0, 1], [0, 1, 1, 1], [0, 1, 0, 0]]
    many = [{f"training_args.k{j}": col[i] for j, col in enumerate(columns)} for i in range(4)]
    fig = knobs_figure(knob_table(many))
    assert len(fig.data) == 6 and {t.xaxis for t in fig.data} == {"x", "x2", "x3", "x4", "x5", "x6"}
    assert fig.layout.xaxis5.domain == fig.layout.xaxis.domain   # the fifth starts the second row
    assert KNOB_COLUMNS == 4


def test_resources_say_the_memory_on_a_cpu_is_the_process_s():
    from rapidfire_nb.report.figures import resources_figure

    table = fixture_table("pruned")
    assert all(not str(r.get("device")).startswith("cuda") for r in table["timeline"])
    assert "process peak memory" in resources_figure(table).layout.annotations[0].text
    for r in table["timeline"]:
        r["device"] = "cuda:0"
    assert resources_figure(table).layout.annotations[0].text == "peak memory (MB)"


def test_knob_views_show_each_varying_knob_against_the_metric():
    from rapidfire_nb.report.figures import knobs_figure, plot_figure

    table = fixture_table("pruned")
    runs = [r for r in table["runs"].values() if r["status"] != "deleted"]
    fig = knobs_figure(table)
    # one scatter per varying knob; a knob whose values never vary is left out
    assert [t.name for t in fig.data] == ["learning_rate"]
    assert {r["knobs"]["training_args.learning_rate"] for r in runs} == set(fig.data[0].x)
    symbols = dict(zip(fig.data[0].text, fig.data[0].marker.symbol))
    pruned = [r for r in runs if r["pruned"]]
    assert pruned and all(symbols[f"{short_name(r['run_id'], r['knobs'])} (pruned) · pruned"] == "x" for r in pruned)
    assert fig.data[0].y == tuple(r["best"]["eval_loss"] for r in sorted(runs, key=lambda r: r["run_id"]))
    par = plot_figure(table, kind="parcoords")
    assert [d.label for d in par.data[0].dimensions] == ["learning_rate (log)", "status", "eval_loss"] or \
        [d.label for d in par.data[0].dimensions] == ["learning_rate", "status", "eval_loss"]
    latest = knobs_figure(table, value="latest")
    assert latest.data[0].y == tuple(r["latest"]["eval_loss"] for r in sorted(runs, key=lambda r: r["run_id"]))
    # a metric NaN or missing for some runs: those runs are named, the others drawn
    for r in table["runs"].values():
        if r["run_id"] == 1:
            r["best"]["eval_loss"] = None
    some = knobs_figure(table)
    assert "no value for run 1" in some.layout.title.text and len(some.data[0].y) == len(runs) - 1
    with pytest.raises(ReportError, match="value must be 'best' or 'latest'"):
        knobs_figure(table, value="mean")
    with pytest.raises(ReportError, match="kind must be one of"):
        plot_figure(table, kind="pie")


def test_report_curves_switch_x_axis_between_samples_step_and_wall_time():
    """The report's curves have the panel's three x axes as buttons; each button's data is that
    axis's own drawing of the same curves."""
    from rapidfire_nb.report.figures import X_AXES, curves_with_x_menu

    table = fixture_table("stop_resume")
    fig = curves_with_x_menu(table, "loss", "train")
    (menu,) = fig.layout.updatemenus
    assert [b.label for b in menu.buttons] == list(X_AXES.values())
    for button, x in zip(menu.buttons, X_AXES):
        drawn = curves_figure(table, "loss", "train", x=x)
        assert button.args[0]["x"] == [list(t.x) for t in drawn.data]
        assert button.args[1] == {"xaxis.title.text": X_AXES[x]}
    time_xs = menu.buttons[2].args[0]["x"]
    assert min(xs[0] for xs in time_xs if xs) == 0   # seconds from the first metric
    assert menu.buttons[1].args[0]["x"] != menu.buttons[0].args[0]["x"]       # steps are not samples
    html = report_html(table)
    assert html.count('"label":"wall time (s)"') == len(table["train_metrics"]) + len(table["eval_metrics"])


def test_the_report_cuts_long_texts_as_the_panel_does_and_says_so(tmp_path):
    """An answer may be 100,000 characters in the log; the report shows its first 2,000, as the
    panel does, and how many it left out; a prompt, a reference and a note are cut the same way."""
    table = fixture_table("sft_basic")
    long_answer, long_prompt = "a" * 99_000 + "END-OF-ANSWER", "q" * 1_990 + "END-OF-PROMPT"
    table["runs"]["1"]["generations"].append(
        {"epoch": 0, "chunk": 1, "step": 4, "samples_seen": 16, "texts": [long_answer, "short"],
         "prompts": [long_prompt, "p2"], "references": [None, "r" * 2_500]})
    table["runs"]["1"]["note"] = "n" * 3_000
    page = report_html(table)
    assert "END-OF-ANSWER" not in page and "END-OF-PROMPT" not in page
    assert "a" * 2_000 + "\u2026 [97,013 more characters not shown]" in page
    assert "q" * 1_990 + "END-OF-PRO\u2026 [3 more characters not shown]" in page
    assert "r" * 2_000 + "\u2026 [500 more characters not shown]" in page
    assert "n" * 2_000 + "\u2026 [1,000 more characters not shown]" in page
    assert "n" * 2_001 not in page and "a" * 2_001 not in page


def test_the_generations_section_finds_each_answer_of_many_prompts(tmp_path):
    """Each answer is found by its prompt in one pass (a table of where each prompt is), also
    when runs answered the prompts in different orders."""
    table = fixture_table("sft_basic")
    prompts = [f"prompt {i}" for i in range(8)]
    for rid, order in (("1", prompts), ("2", prompts[::-1])):
        table["runs"][rid]["generations"].append(
            {"epoch": 0, "chunk": 1, "step": 4, "samples_seen": 16,
             "texts": [f"run {rid} answers {p}" for p in order], "prompts": order,
             "references": [None] * 8})
    page = report_html(table)
    for p in prompts:
        row = page.split(f">{p}</td>", 1)[1].split("</tr>", 1)[0]
        assert f"run 1 answers {p}<" in row and f"run 2 answers {p}<" in row
