"""The tutorial notebooks in ``notebooks/``: their shape, and every one executed end to end.

Execution uses nbclient with a real ipykernel (kernel ``python3``) in smoke mode (``RF_SMOKE=1``:
the offline tiny model and a few rows of look-alike data), in a temporary working folder, with the
Hugging Face hub switched offline so that a notebook that tried to download would fail here.
A notebook passes when no cell raises, no run of its experiment failed, its final cell printed the
leaderboard and exported an adapter directory that PEFT can load, the TensorBoard it started
answered and went away with the kernel, and the kernel exits on a plain shutdown request.

The Colab badges and install cells are derived from the one ``Repository:`` line of the README,
and the notebooks are committed without outputs; both are checked without a kernel.
"""

from __future__ import annotations

import json
import os
import re
import resource
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: executes every tutorial notebook in a kernel

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))
# a hang guard per cell, not a speed target (those live in `rapidfire bench`)
CELL_TIMEOUT = 600
EXPORT_RE = re.compile(r"Adapter exported to (\S+?):")


def _repo_slug() -> str | None:
    """The one repository setting (docs/pages/contributing.md): ``owner/name``, or None while the
    project has no published home (``Repository: unset``)."""
    text = (ROOT / "docs" / "pages" / "contributing.md").read_text(encoding="utf-8")
    found = re.findall(r"^Repository:\s*(\S+?)/?\s*$", text, re.M)
    assert len(found) == 1, "contributing.md must hold the repository setting once: 'Repository: unset' or a GitHub URL"
    if found[0] == "unset":
        return None
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", found[0]), found[0]
    return found[0].removeprefix("https://github.com/")


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


def _outputs_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(str(out["data"].get("text/plain", "")))
    return "".join(parts)


def test_there_are_the_four_tutorials():
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "sft_customer_support", "dpo_preferences", "grpo_math_reasoning"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean_and_complete(path):
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code:
        assert cell.outputs == [], f"{path.name}: outputs must be stripped (cell {_source(cell)[:40]!r})"
        assert cell.execution_count is None, f"{path.name}: execution_count must be null"
    sources = [_source(c) for c in code]
    everything = "\n".join(_source(c) for c in nb.cells)

    slug = _repo_slug()
    assert "OWNER" not in everything, f"{path.name}: a placeholder repository"
    colab = f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}"
    links = re.findall(r"https://colab\.research\.google\.com/github/[^)\s\"']+", everything)
    if slug:
        assert colab in _source(nb.cells[0]), f"{path.name}: the first cell needs the Colab badge {colab}"
        assert all(link == colab for link in links), f"{path.name}: Colab links {links} are not {colab}"
    else:
        assert links == [], f"{path.name}: a Colab badge while the repository is unset: {links}"

    install = [s for s in sources if "%pip install" in s]
    assert len(install) == 1, f"{path.name}: one install cell"
    assert 'if "google.colab" in sys.modules:' in install[0], f"{path.name}: %pip must be guarded for Colab"
    url = f"https://github.com/{slug}" if slug else ""
    assert f'REPO, REF = "{url}", "main"' in install[0] and "git+{REPO}@{REF}" in install[0], \
        f"{path.name}: the install cell must install from {url or 'an unset REPO'} (its REPO setting)"

    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "RF_SMOKE" in _source(params[0]), f"{path.name}: a parameters cell reading RF_SMOKE"
    assert any("torch.cuda.is_available()" in s and "fp16" in s.lower() for s in sources), \
        f"{path.name}: a GPU check that picks fp16 on a T4"
    assert any(s.lstrip().startswith("%load_ext rapidfire") for s in sources), f"{path.name}: %load_ext rapidfire"
    assert any(s.strip() == "%rapidfire tensorboard" for s in sources), f"{path.name}: %rapidfire tensorboard"
    fit = [s for s in sources if ".run_fit(" in s]
    assert len(fit) == 1 and fit[0].strip().splitlines()[-1].strip() == "exp", \
        f"{path.name}: the run_fit cell must end with `exp` (the panel)"
    final = [c for c in code if "final" in c.metadata.get("tags", [])]
    assert len(final) == 1, f"{path.name}: one cell tagged 'final'"
    src = _source(final[0])
    assert "exp.wait()" in src and "exp.export(" in src and "Leaderboard" in src, \
        f"{path.name}: the final cell waits, prints the leaderboard and exports the best run"


def test_readme_tutorials_link_every_notebook():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Tutorials" in text and "OWNER" not in text
    tutorials = text.split("## Tutorials", 1)[1].split("\n## ", 1)[0]
    assert "repo_links" not in tutorials, "maintainer plumbing belongs in docs/pages/contributing.md"
    for path in NOTEBOOKS:
        assert f"(notebooks/{path.name})" in tutorials, f"README.md: no link to {path.name}"
    slug = _repo_slug()
    links = re.findall(r"https://colab\.research\.google\.com/github/([^/]+/[^/]+)/", text)
    if slug:
        for path in NOTEBOOKS:
            assert f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}" in text
        assert set(links) == {slug}, f"README.md: Colab links to {links}, not to the setting's {slug}"
    else:
        assert links == [], f"README.md: Colab links while the repository is unset: {links}"
        assert "install it from a clone" in text


def _install_cell(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    return next(_source(c) for c in nb.cells if c.cell_type == "code" and "%pip install" in _source(c))


def _run_in_fake_colab(cell: str):
    """Run an install cell as Colab's IPython would (magics transformed by IPython itself), with a
    stand-in ``google.colab`` and a shell that records magics instead of running pip."""
    import sys
    import types

    from IPython.core.inputtransformer2 import TransformerManager

    magics = []
    shell = types.SimpleNamespace(run_line_magic=lambda name, line, *a, **k: magics.append((name, line)))
    colab = types.ModuleType("google.colab")
    colab.output = types.SimpleNamespace(enable_custom_widget_manager=lambda: magics.append(("widgets", "")))
    google = types.ModuleType("google")
    google.colab = colab
    saved = {k: sys.modules.get(k) for k in ("google", "google.colab")}
    sys.modules.update({"google": google, "google.colab": colab})
    try:
        code = TransformerManager().transform_cell(cell)
        exec(compile(code, "<install cell>", "exec"), {"get_ipython": lambda: shell})
        return None, magics
    except Exception as exc:   # what the cell raised, for the test to read
        return exc, magics
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_with_repo_unset_stops_in_one_line_before_pip(path):
    cell = _install_cell(path)
    if _repo_slug():
        pytest.skip("the repository is set")
    exc, magics = _run_in_fake_colab(cell)
    assert magics == [], f"{path.name}: the cell called {magics} with REPO unset"
    assert exc is not None, f"{path.name}: the cell went on with REPO unset"
    shown = exc._render_traceback_()     # what IPython prints instead of a traceback
    assert len(shown) == 1 and "Set REPO" in shown[0] and "https://github.com/" in shown[0], shown
    # set, the same cell installs from it
    exc, magics = _run_in_fake_colab(cell.replace('REPO, REF = ""', 'REPO, REF = "https://github.com/a/b"'))
    assert exc is None, exc
    # (IPython expands {REPO}@{REF} from the cell's variables when it runs the magic)
    assert magics[0][0] == "pip" and "git+{REPO}@{REF}" in magics[0][1], magics


def _tensorboards_under(folder: Path) -> list:
    from tensorboard import manager

    root = os.path.realpath(folder)
    return [i for i in manager.get_all() if os.path.realpath(i.logdir).startswith(root + os.sep)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _events(workdir: Path) -> list[dict]:
    logs = list((workdir / "rapidfire_experiments").glob("*/events.jsonl"))
    assert len(logs) == 1, f"expected one experiment, found {logs}"
    return [json.loads(line) for line in logs[0].read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_end_to_end_in_smoke_mode(path, tmp_path):
    from jupyter_client.manager import KernelManager

    env = dict(os.environ, RF_SMOKE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("VSCODE_PID", None)
    nb = nbformat.read(str(path), as_version=4)
    km = KernelManager(kernel_name="python3")
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    km.start_kernel(cwd=str(tmp_path), env=env)
    t0 = time.monotonic()
    try:
        client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        try:
            client.execute()      # raises CellExecutionError, with the traceback, on any error
        finally:
            elapsed = time.monotonic() - t0
            print(f"\n{path.name}: executed in {elapsed:.1f} s (RF_SMOKE=1)")
            nbformat.write(nb, str(tmp_path / f"executed-{path.name}"))

        # above the panel only what the user should read: no progress bar, no library warning
        fit_cell = next(c for c in nb.cells if c.cell_type == "code" and ".run_fit(" in _source(c))
        above = _outputs_text(fit_cell)
        assert "Loading weights" not in above and "Warning" not in above, f"{path.name}: {above[:500]}"
        everything = "\n".join(_outputs_text(c) for c in nb.cells if c.cell_type == "code")
        assert "FutureWarning" not in everything, f"{path.name}: a FutureWarning in the outputs"

        # no run of the experiment may have failed (a failed run is not a cell error)
        events = _events(tmp_path)
        failed = [e for e in events if e["type"] == "run_status" and e["status"] == "failed"]
        assert not failed, f"{path.name}: run {failed[0]['run_id']} failed: {failed[0].get('error')}"
        created = [e for e in events if e["type"] == "run_created"]
        assert len(created) >= 4, f"{path.name}: expected at least 4 runs, got {len(created)}"

        final = next(c for c in nb.cells if "final" in c.metadata.get("tags", []))
        text = _outputs_text(final)
        assert "Leaderboard" in text, f"{path.name}: the final cell printed no leaderboard:\n{text}"
        board = text.split("Leaderboard", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        ranked = [int(line.split()[0]) for line in board if line.split()]
        assert sorted(ranked) == sorted(e["run_id"] for e in created), \
            f"{path.name}: the leaderboard must rank every run once:\n{text}"
        m = EXPORT_RE.search(text)
        assert m, f"{path.name}: the final cell did not report an export:\n{text}"
        export_dir = Path(m.group(1))
        if not export_dir.is_absolute():
            export_dir = tmp_path / export_dir
        assert (export_dir / "adapter_config.json").is_file(), f"{path.name}: no adapter_config.json in {export_dir}"
        assert (export_dir / "adapter_model.safetensors").stat().st_size > 0
        config = json.loads((export_dir / "adapter_config.json").read_text())
        assert config.get("peft_type") == "LORA"

        if path.stem == "quickstart":
            ops = [e for e in events if e["type"] == "op" and e.get("accepted")]
            assert any(o["op"] == "clone" for o in ops), "quickstart: the clone was not applied"
            clones = [e for e in created if e.get("parent_run_id") is not None]
            assert clones and clones[0]["warm_start"] is True

        boards = _tensorboards_under(tmp_path)
        assert len(boards) == 1, f"{path.name}: expected one TensorBoard on the experiment, found {boards}"
        tb_pid = boards[0].pid
    finally:
        if km.is_alive():
            km.request_shutdown()
            deadline = time.monotonic() + 60
            while km.is_alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            clean = not km.is_alive()
            if not clean:
                km.shutdown_kernel(now=True)
            km.cleanup_resources()
        else:
            clean = False
    assert clean, f"{path.name}: the kernel did not exit within 60 s of a shutdown request"
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{path.name}: kernel CPU time {cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime:.1f} s")
    deadline = time.monotonic() + 15
    while _pid_alive(tb_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pid_alive(tb_pid), f"{path.name}: TensorBoard (pid {tb_pid}) outlived its kernel"


def test_a_rerun_cell_says_its_new_folder_in_one_line(tmp_path, capsys):
    """Re-running the Experiment cell moves to `<name>_2`: one short line in the cell, no warning
    with the kernel's temporary file path."""
    import warnings

    from rapidfire_nb import Experiment

    first = Experiment("quickstart", experiment_path=str(tmp_path), tracking=[])
    first.end()
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = Experiment("quickstart", experiment_path=str(tmp_path), tracking=[])
    second.end()
    out = capsys.readouterr()
    assert second.name == "quickstart_2"
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "quickstart_2" in lines[0] and len(lines[0]) < 200, lines


def test_quickstart_steers_after_the_first_chunk():
    """Read cell by cell, the quickstart waits for the first chunk's results, then stops, resumes
    and warm-clones while runs train. Full mode is sized by time, not steps (a fast GPU gets
    through in seconds what a laptop CPU trains in minutes): far more epochs than any machine
    finishes, trained until MINUTES after run_fit, when the results cell stops what still trains.
    So the steering cells always find runs to steer. And every run answers sample prompts."""
    nb = nbformat.read(str(NB_DIR / "quickstart.ipynb"), as_version=4)
    code = [_source(c) for c in nb.cells if c.cell_type == "code"]

    def first(pattern: str) -> int:
        hits = [i for i, s in enumerate(code) if re.search(pattern, s)]
        assert hits, f"quickstart: no cell matches {pattern!r}"
        return hits[0]

    fit, wait = first(r"\.run_fit\("), first(r"(?m)^info = wait_for_chunk\(exp, 1\)")
    stop, clone, resume = first(r"exp\.stop\("), first(r"warm_start=True"), first(r"exp\.resume\(")
    final = first(r"(?m)^exp\.wait\(\)")
    generations = first(r"exp\.get_generations\(\)")
    assert fit < wait < stop <= clone < resume < final < generations
    everything = "\n".join(code)
    sizes = re.search(r"TRAIN_SIZE, EVAL_SIZE, EPOCHS, BATCH = \(.*\) if SMOKE else \((\d+), \d+, (\d+), (\d+)\)",
                      everything)
    minutes = re.search(r"(?m)^MINUTES = 0 if SMOKE else (\d+)$", everything)
    assert sizes and minutes, "quickstart: the full-mode sizes and MINUTES lines"
    train, epochs, batch = map(int, sizes.groups())
    # 4 runs at 2 ms a step, eval and checkpoints free, would still not finish in the time given
    assert 4 * train * epochs // batch * 0.002 > 60 * int(minutes.group(1)) >= 120, \
        "full mode must train for minutes, on any machine"
    assert re.search(r"TIME_UP = time\.time\(\) \+ 60 \* MINUTES", code[fit])
    assert "exp.wait(timeout=" in code[final] and "TIME_UP" in code[final] and "exp.stop(" in code[final]
    assert "sample_prompts=SAMPLE_PROMPTS" in code[fit]
    assert re.search(r"(?m)^SAMPLE_PROMPTS = .*evald\[\"prompt\"\]", everything), \
        "the sample prompts are eval prompts, so the generations view shows their references"


# What the panel's buttons send, delivered through ipywidgets' comm-message path of the panel that
# the run_fit cell displayed (the same path as tests/notebook/test_panel_protocol.py's comm test).
_PANEL_CLICK = '''
import time as _t
def _click(op, run_id):
    panel = exp._panel if getattr(exp, "_panel", None) is not None else exp.panel()
    panel._handle_msg({"content": {"data": {"method": "custom", "content": {
        "type": "op", "op": op, "run_id": int(run_id), "request_id": f"test-{op}-{run_id}"}}},
        "buffers": []})
def _until(run_id, statuses):
    while exp.get_runs_info().set_index("run_id").loc[run_id, "status"] not in statuses:
        _t.sleep(0.2)
'''


def test_quickstart_survives_panel_ops_between_its_cells(tmp_path):
    """The user clicks in the panel between cells: after the cell that waited for the first chunk,
    Delete on the runs that cell's table ranks worst and best (what the next cell used to stop and
    clone), and Stop on every run still training before the final cell. Every later cell must
    act on the runs as they are now: no op on a deleted run, no wait for a state it never reaches,
    and the final cell still ranks and exports."""
    from jupyter_client.manager import KernelManager

    nb = nbformat.read(str(NB_DIR / "quickstart.ipynb"), as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    waited = next(i for i in code if re.search(r"(?m)^info = wait_for_chunk\(exp, 1\)", _source(nb.cells[i])))
    final = next(i for i in code if "final" in nb.cells[i].metadata.get("tags", []))
    after_chunk = _PANEL_CLICK + '''
_ranked = info.dropna(subset=["eval_loss"]).sort_values("eval_loss")
_deleted = [int(_ranked.run_id.iloc[-1]), int(_ranked.run_id.iloc[0])]
for _r in _deleted:
    _click("delete", _r)
for _r in _deleted:
    _until(_r, ("deleted",))
print("panel deleted", _deleted)
'''
    before_final = '''
_now = exp.get_runs_info()
_stopped = [int(r) for r in _now.run_id[_now.status.isin(["pending", "running"])]]
for _r in _stopped:
    _click("stop", _r)
for _r in _stopped:
    _until(_r, ("stopped", "completed", "failed"))
print("panel stopped", _stopped)
'''
    nb.cells.insert(final, nbformat.v4.new_code_cell(before_final))
    nb.cells.insert(waited + 1, nbformat.v4.new_code_cell(after_chunk))

    env = dict(os.environ, RF_SMOKE="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.pop("VSCODE_PID", None)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    try:
        client = nbclient.NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        try:
            client.execute()
        finally:
            nbformat.write(nb, str(tmp_path / "executed-quickstart-with-clicks.ipynb"))
    finally:
        km.shutdown_kernel(now=True)
        km.cleanup_resources()

    outputs = "\n".join(_outputs_text(c) for c in nb.cells if c.cell_type == "code")
    deleted = [int(x) for x in re.search(r"panel deleted \[(\d+), (\d+)\]", outputs).groups()]
    events = _events(tmp_path)
    ops = [e for e in events if e["type"] == "op"]
    # the panel's deletes went through the engine; nothing the notebook did named a deleted run
    assert {o["run_id"] for o in ops if o["op"] == "delete" and o.get("accepted")} == set(deleted)
    later = [o for o in ops if o["op"] != "delete"]
    assert not [o for o in later if o["run_id"] in deleted], f"an op on a deleted run: {later}"
    assert "refused" not in outputs, outputs
    clones = [e for e in events if e["type"] == "run_created" and e.get("parent_run_id") is not None]
    assert clones and clones[0]["parent_run_id"] not in deleted
    text = _outputs_text(nb.cells[final + 2])
    board = text.split("Leaderboard", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    ranked = [int(line.split()[0]) for line in board if line.split()]
    assert ranked and not set(ranked) & set(deleted), text
    assert EXPORT_RE.search(text), text
