"""The panel in classic Notebook 6.5.7 with ipywidgets 7 (Colab's versions), pull-only as in Colab.

(notebook 6.5.7 serves nbclassic's classic UI from jupyter_server, as Colab's runtime does.)

Colab's widget manager is not available outside Colab; classic Notebook 6.5.7 with
widgetsnbextension 3 is the nearest front-end we can run. The view here gets *no* pushes (the
widget is built with ``push=False``, no publisher thread): its curves must still grow while the
background thread trains, and its Stop and Clone clicks must reach Python. Then
``%rapidfire tensorboard`` must show TensorBoard itself (never Jupyter's login page) and leave the
notebook's saving working.

Runs only where classic Notebook (< 7) is installed: CI's Colab job (.ci/colab-stack) installs
Colab's stack in its own venv; the main suite skips it. Screenshots go to test-output/browser/ and,
when ``RF_SHOTS_DIR`` is set, there too.
"""

from __future__ import annotations

from browser_helpers import waiter

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

notebook = pytest.importorskip("notebook")
from packaging.version import Version  # noqa: E402

if Version(notebook.__version__) >= Version("7"):
    pytest.skip(f"classic Notebook 6 is not installed here (notebook {notebook.__version__}); "
                "CI's Colab job runs this test", allow_module_level=True)

nbformat = pytest.importorskip("nbformat")

from conftest import OUTPUT, ROOT, _free_port, ensure_bundle  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXPERIMENT = "colab-pull-only"
NEW_LR = 0.002
_wait = waiter("nb6_timeout.png", full_page=True)

SETUP = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.notebook.panel import Panel

train, evals = make_demo_datasets(128, 16)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([3e-3, 1e-3, 3e-4]), per_device_train_batch_size=8,
                              num_train_epochs=40, bf16=False, max_length=64),
)
exp = Experiment("{name}", experiment_path="experiments")
# (40 epochs: no run may finish before the test has clicked; the server's shutdown ends it)
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=6);
view = Panel(exp, push=False)   # no publisher thread: the view lives on its pulls alone
assert view._publisher is None
view
""".replace("{name}", EXPERIMENT)

# A cell busy in Python for 20 s, as user code would be, polling run 2: on ipykernel 6 (no
# subshells) a Stop clicked meanwhile reaches Python only once the cell ends. The cell prints the
# time it ended; the log's op event says when the click was taken.
BUSY = """\
import time
print("BUSY START", flush=True)
give_up = time.monotonic() + 20
while time.monotonic() < give_up and exp.get_runs_info().set_index("run_id").loc[2, "status"] == "running":
    time.sleep(0.2)
print("BUSY END", time.time(), exp.get_runs_info().set_index("run_id").loc[2, "status"])
"""

# the runs left are stopped first (the clicks are done): TensorBoard then loads the logs on
# cores the training thread no longer takes
TENSORBOARD = """\
for run_id in exp.get_runs_info().query("status in ['pending', 'running']").run_id:
    exp.stop(int(run_id))
exp.wait()
%load_ext rapidfire
%rapidfire tensorboard"""


class Server:
    def __init__(self, url, token, root, proc, log_path):
        self.url, self.token, self.root, self.proc, self.log_path = url, token, root, proc, log_path

    def api(self, path, method="GET", body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None

    def log_tail(self, n=4000):
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""


@pytest.fixture(scope="module")
def nb6(tmp_path_factory):
    ensure_bundle()
    root = tmp_path_factory.mktemp("nb6-root")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    token, port = uuid.uuid4().hex, _free_port()
    log_path = OUTPUT / "notebook6.log"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["JUPYTER_CONFIG_DIR"] = str(root / ".jupyter-config")   # no user settings leak in
    # the suite turns TensorBoard tracking off (tests/conftest.py); here it must write the
    # event files that %rapidfire tensorboard then shows
    env["RF_TENSORBOARD_ENABLED"] = "1"
    cmd = [sys.executable, "-m", "notebook", "--no-browser", "--NotebookApp.ip=127.0.0.1",
           f"--NotebookApp.port={port}", "--NotebookApp.port_retries=0",
           f"--NotebookApp.token={token}", f"--NotebookApp.notebook_dir={root}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", token, root, proc, log_path)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"jupyter notebook exited with {proc.returncode}:\n{server.log_tail()}")
        try:
            server.api("/api/status")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                proc.terminate()
                pytest.fail(f"jupyter notebook did not answer within 90 s:\n{server.log_tail()}")
            time.sleep(0.5)
    yield server
    try:
        server.api("/api/shutdown", method="POST")
        proc.wait(timeout=30)
    except Exception:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    log.close()


def _events(root: Path) -> list[dict]:
    path = root / "experiments" / EXPERIMENT / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return out


def _points(page) -> dict[str, int]:
    return page.evaluate("""() => {
        const div = document.querySelector('[data-testid=rf-chart-train]');
        const out = {};
        for (const t of (div && div.rfInspect ? div.rfInspect().series : [])) out[`run ${t.runId}`] = t.x.length;
        return out;
    }""")


def _status(page, run_id: int):
    loc = page.locator(f'[data-testid=rf-runs] tr[data-run-id="{run_id}"]')
    return loc.get_attribute("data-status") if loc.count() else None


def _shot(page, name: str, locator=None) -> None:
    path = OUTPUT / name
    (locator or page).screenshot(path=str(path), **({} if locator else {"full_page": True}))
    shots = os.environ.get("RF_SHOTS_DIR")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(shots) / name)


def test_pull_only_panel_and_tensorboard_in_classic_notebook_6(nb6, page):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(TENSORBOARD),
                nbformat.v4.new_code_cell(BUSY)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, nb6.root / "colab_like.ipynb")
    forbidden: list[str] = []
    page.on("response", lambda r: forbidden.append(f"{r.status} {r.url}") if r.status == 403 else None)

    # widgetsnbextension 3's manager, once per kernel, loads the kernel's widget state (a
    # comm_info request for "jupyter.widget") and then re-renders every cell output that holds a
    # widget view: a view displayed before that reply arrives is removed, and its output keeps
    # "model_id": "" (the removal blanks the very object the re-render reads). The kernel answers
    # that request only after the cell it is running, so a cell sent before it would lose its
    # panel. Classic Notebook only (Colab's widget manager has no such pass): the test waits, as a
    # user who opens a notebook and then runs a cell does, until the manager has its answer.
    widget_state = {"asked": set(), "answered": False}

    def _kernel_frames(ws):
        def sent(payload):
            if isinstance(payload, str) and '"comm_info_request"' in payload:
                msg = json.loads(payload)
                if msg.get("content", {}).get("target_name") == "jupyter.widget":
                    widget_state["asked"].add(msg["header"]["msg_id"])

        def received(payload):
            if isinstance(payload, str) and '"comm_info_reply"' in payload:
                msg = json.loads(payload)
                if msg.get("parent_header", {}).get("msg_id") in widget_state["asked"]:
                    widget_state["answered"] = True

        ws.on("framesent", sent)
        ws.on("framereceived", received)

    page.on("websocket", _kernel_frames)
    page.goto(f"{nb6.url}/notebooks/colab_like.ipynb?token={nb6.token}")
    page.wait_for_function("() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel"
                           " && Jupyter.notebook.kernel.is_connected()", timeout=120_000)
    # page.evaluate lets Playwright dispatch the websocket events the check reads
    _wait(lambda: page.evaluate("() => true") and widget_state["answered"], 120,
          "the widget manager to load the kernel's widget state (its comm_info reply)", page)
    # notebook 6.5.7 serves the classic UI of nbclassic on jupyter_server, as Colab's does
    assert notebook.__version__ == "6.5.7" and page.locator("#notebook-container").count() == 1
    page.evaluate("() => Jupyter.notebook.execute_cells([0])")

    panel = page.locator("[data-testid=rf-panel]")
    try:
        panel.wait_for(timeout=240_000)
    except Exception as exc:   # say what the cell did show
        outputs = page.evaluate("() => JSON.stringify(Jupyter.notebook.get_cell(0).output_area.outputs)")
        raise AssertionError(f"no panel; the cell's outputs: {outputs[:3000]}\n{nb6.log_tail()}") from exc
    _wait(lambda: (lambda p: p if len(p) >= 2 and min(p.values()) >= 2 else None)(_points(page)),
          300, "train curves of two runs, by pulls alone", page)
    grown_from = sum(_points(page).values())
    _wait(lambda: sum(_points(page).values()) > grown_from + 2, 180,
          "the pull-only curves to grow while the thread trains", page)
    assert page.locator("[data-testid=rf-runs] tr[data-run-id]").count() == 3

    # --- Stop run 1 ------------------------------------------------------------------------
    _wait(lambda: _status(page, 1) in ("running", "pending"), 120, "run 1 to be active", page)
    panel.scroll_into_view_if_needed()
    _shot(page, "nb6_pull_only_before_stop.png")
    _shot(page, "nb6_panel_before_stop.png", panel)
    page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="stop"]').click()
    _wait(lambda: _status(page, 1) == "stopped", 240, "run 1 to show as stopped", page)
    _shot(page, "nb6_pull_only_after_stop.png")
    _shot(page, "nb6_panel_after_stop.png", panel)
    events = _events(nb6.root)
    assert any(e["type"] == "op" and e["op"] == "stop" and e["run_id"] == 1 and e["accepted"]
               for e in events)
    assert any(e["type"] == "run_status" and e["run_id"] == 1 and e["status"] == "stopped"
               for e in events)

    # --- Clone-modify run 2 ------------------------------------------------------------------
    page.locator('[data-testid=rf-runs] tr[data-run-id="2"] button[data-op="clone"]').click()
    editor = page.locator("[data-testid=rf-clone-editor]")
    lr = editor.locator('input[data-knob="training_args.learning_rate"]')
    lr.wait_for(timeout=60_000)
    lr.fill(str(NEW_LR))
    editor.locator("[data-testid=rf-clone-create]").click()
    page.locator('[data-testid=rf-runs] tr[data-run-id="4"]').wait_for(timeout=180_000)
    created = next(e for e in _events(nb6.root) if e["type"] == "run_created" and e["run_id"] == 4)
    assert created["parent_run_id"] == 2
    assert created["config"]["training_args"]["learning_rate"] == pytest.approx(NEW_LR)
    _wait(lambda: _points(page).get("run 4", 0) >= 1, 300, "the clone's curve, pulled", page)

    # --- Stop clicked during a busy cell: ipykernel 6 takes it only once the cell ends ---------
    import ipykernel

    def busy_output() -> str:
        return page.evaluate("() => Jupyter.notebook.get_cell(2).output_area.outputs"
                             ".map(o => o.text || '').join('')")

    _wait(lambda: _status(page, 2) == "running", 240, "run 2 to be running", page)
    page.evaluate("() => Jupyter.notebook.execute_cells([2])")
    _wait(lambda: "BUSY START" in busy_output(), 120, "the busy cell to start", page)
    page.locator('[data-testid=rf-runs] tr[data-run-id="2"] button[data-op="stop"]').click()
    clicked = time.time()
    _wait(lambda: "BUSY END" in busy_output(), 120, "the busy cell to end", page)
    ended, seen = busy_output().split("BUSY END", 1)[1].split()[:2]
    _wait(lambda: any(e["type"] == "op" and e["op"] == "stop" and e["run_id"] == 2 and e.get("accepted")
                      for e in _events(nb6.root)), 240, "run 2's Stop to be taken", page)
    taken = next(e["time"] for e in _events(nb6.root)
                 if e["type"] == "op" and e["op"] == "stop" and e["run_id"] == 2 and e.get("accepted"))
    print(f"\nipykernel {ipykernel.__version__}: Stop clicked during a busy cell at {clicked:.1f}, cell "
          f"ended at {float(ended):.1f} seeing run 2 {seen}, the click taken at {taken:.1f}")
    if int(ipykernel.__version__.split(".")[0]) < 7:
        # no subshell: the click waited for the cell (which never saw run 2 stop)
        assert seen == "running" and taken >= float(ended), (clicked, ended, seen, taken)

    # --- TensorBoard under Notebook 6: TensorBoard itself, and saving still works ------------
    page.evaluate("() => Jupyter.notebook.execute_cells([1])")
    frame_el = page.locator("iframe[title=TensorBoard]")
    try:
        frame_el.wait_for(state="attached", timeout=180_000)
    except Exception as exc:
        outputs = page.evaluate("() => JSON.stringify(Jupyter.notebook.get_cell(1).output_area.outputs)")
        raise AssertionError(f"no TensorBoard frame; the cell's outputs: {outputs[:3000]}") from exc
    frame_el.scroll_into_view_if_needed()
    src = frame_el.get_attribute("src")
    frame = frame_el.element_handle().content_frame()
    frame.wait_for_load_state()
    _wait(lambda: "TensorBoard" in (frame.title() or ""), 120, "TensorBoard in the frame", page)
    assert "login" not in frame.url and not frame.locator("input[type=password]").count(), src
    # TensorBoard's own data reaches the page: the scalars of the experiment's runs
    try:
        _wait(lambda: "scalars" in frame.locator("body").inner_text().lower()
              and "could not be loaded" not in frame.locator("body").inner_text(), 240,
              f"TensorBoard's data in the frame ({src})", page)
    except AssertionError as exc:   # say what TensorBoard and the cell said
        try:
            with urllib.request.urlopen(f"{frame.url}data/plugins_listing", timeout=10) as r:
                listing = r.read().decode()[:1500]
        except Exception as err:
            listing = repr(err)
        outputs = page.evaluate("() => JSON.stringify(Jupyter.notebook.get_cell(1).output_area.outputs)")
        raise AssertionError(f"{exc}; frame at {frame.url}; its plugins_listing: {listing}; "
                             f"the cell's outputs: {outputs[:3000]}") from exc
    _shot(page, "nb6_tensorboard.png")
    # saving resolves only on the server's success; what it wrote holds the frame's output
    saved = page.evaluate("""() => Jupyter.notebook.save_notebook().then(
        () => 'saved', (err) => 'failed: ' + String(err && (err.message || err)))""")
    assert saved == "saved", saved
    on_disk = nb6.api("/api/contents/colab_like.ipynb")["content"]["cells"][1]["outputs"]
    assert any("TensorBoard" in json.dumps(o) for o in on_disk), on_disk
    assert forbidden == [], forbidden
    errors = [line for line in page.console_log if line.startswith("pageerror")]
    assert errors == [], errors
