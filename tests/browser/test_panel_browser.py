"""End to end in a real browser: JupyterLab + Chromium, a small real experiment, the panel clicked.

The notebook starts three LoRA runs of a tiny Llama model (``run_fit`` returns at once in a kernel
and the Experiment displays as the panel). The test watches the curves grow, clicks Stop on run 1
and sees it stop while the others go on, then clone-modifies run 2 with another learning rate
(first an invalid one, refused inline) and sees the new run appear and train. What the page shows
is checked against the experiment's event log on disk. Screenshots go to test-output/browser/.
"""

from __future__ import annotations

from browser_helpers import DOCS_IMG, check_docs_screenshot, experiment_events, row_status, run_first_cell, trace_points, waiter, write_notebook

from pathlib import Path

import pytest

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXPERIMENT = "browser-panel"
NEW_LR = 0.002

NOTEBOOK_CODE = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(192, 16)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([3e-3, 1e-3, 3e-4]), per_device_train_batch_size=8,
                              num_train_epochs=3, bf16=False, max_length=64),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=6)
"""


def _all_done(root: Path) -> bool:
    status = {}
    for e in experiment_events(root, EXPERIMENT):
        if e["type"] == "run_status":
            status[e["run_id"]] = e["status"]
    return bool(status) and all(s not in ("pending", "running") for s in status.values())


_wait = waiter("timeout.png", full_page=True)


def panel_shot(page, panel, below, name: str) -> None:
    """The docs' picture of the panel from its header down to ``below`` (the clone form)."""
    panel.evaluate("(el) => el.scrollIntoView({ block: 'start' })")
    box, end = panel.bounding_box(), below.bounding_box()
    page.screenshot(path=str(OUTPUT / name), clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": end["y"] + end["height"] - box["y"] + 8})


def test_panel_in_jupyterlab(lab, page):
    write_notebook(lab.root, EXPERIMENT, "panel_demo.ipynb", NOTEBOOK_CODE)
    page.goto(f"{lab.url}/lab/tree/panel_demo.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    run_first_cell(page)

    # --- the panel appears and the curves grow ------------------------------------------------
    panel = page.locator("[data-testid=rf-panel]")
    panel.wait_for(timeout=180_000)
    points = _wait(lambda: (lambda p: p if len(p) >= 2 and min(p.values()) >= 2 else None)(trace_points(page, "train")),
                   240, "train curves of two runs", page)
    page.screenshot(path=str(OUTPUT / "01_curves.png"), full_page=True)
    before = sum(points.values())
    _wait(lambda: sum(trace_points(page, "train").values()) > before + 4, 120, "the curves to grow", page)
    assert page.locator("[data-testid=rf-runs] tr[data-run-id]").count() == 3
    assert "Traceback" not in page.locator(".jp-OutputArea-output").first.inner_text()

    # --- Stop run 1: it stops, the others go on ------------------------------------------------
    _wait(lambda: row_status(page, 1) in ("running", "pending"), 60, "run 1 to be active", page)
    stop = page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="stop"]')
    assert stop.is_enabled()
    stop.click()
    _wait(lambda: row_status(page, 1) == "stopped", 180, "run 1 to show as stopped", page)
    page.screenshot(path=str(OUTPUT / "02_stopped.png"), full_page=True)
    assert page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="stop"]').is_disabled()
    assert page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="resume"]').is_enabled()
    stopped_points = trace_points(page, "train")
    others_before = {k: v for k, v in stopped_points.items() if k != "run 1"}
    _wait(lambda: any(trace_points(page, "train").get(k, 0) > v + 2 for k, v in others_before.items()),
          180, "other runs to keep training after run 1 stopped", page)
    assert trace_points(page, "train")["run 1"] == stopped_points["run 1"]
    events = experiment_events(lab.root, EXPERIMENT)
    stop_seq = next(e["seq"] for e in events
                    if e["type"] == "run_status" and e["run_id"] == 1 and e["status"] == "stopped")
    later = [e for e in events if e["seq"] > stop_seq and e["type"] == "metric"]
    assert later and all(e["run_id"] != 1 for e in later)
    assert any(e["type"] == "op" and e["op"] == "stop" and e["run_id"] == 1 and e["accepted"] for e in events)

    # --- clone-modify run 2 with another learning rate ---------------------------------------
    page.locator('[data-testid=rf-runs] tr[data-run-id="2"] button[data-op="clone"]').click()
    editor = page.locator("[data-testid=rf-clone-editor]")
    lr = editor.locator('input[data-knob="training_args.learning_rate"]')
    lr.wait_for(timeout=60_000)
    assert float(lr.input_value()) == pytest.approx(1e-3)
    runs_before = {e["run_id"] for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "run_created"}

    lr.fill("fast")  # not a number: refused in the editor, nothing sent
    field_error = editor.locator('[data-error-for="training_args.learning_rate"]')
    _wait(lambda: "not a number" in field_error.inner_text(), 30, "an inline parse error", page)
    lr.fill("-1")  # a number the real config rejects: refused by Python's validate_only
    _wait(lambda: "rf-error" in (editor.locator("[data-testid=rf-clone-status]").get_attribute("class") or "")
          and "learning_rate" in editor.locator("[data-testid=rf-clone-status]").inner_text(),
          60, "a validation error naming learning_rate", page)
    page.screenshot(path=str(OUTPUT / "03_clone_invalid.png"), full_page=True)
    panel_shot(page, panel, editor, "panel_clone_form.png")
    assert {e["run_id"] for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "run_created"} == runs_before

    lr.fill(str(NEW_LR))
    # Click at once, as a user does: the edit's debounced validation starts while the click's
    # create waits for Python. The click must still create the clone.
    editor.locator("[data-testid=rf-clone-create]").click()
    new_row = page.locator('[data-testid=rf-runs] tr[data-run-id="4"]')
    new_row.wait_for(timeout=120_000)
    _wait(lambda: trace_points(page, "train").get("run 4", 0) >= 2, 240, "the clone to train", page)
    assert new_row.locator("[data-testid=rf-status]").inner_text() in ("running", "pending", "completed")
    created = next(e for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "run_created" and e["run_id"] == 4)
    assert created["parent_run_id"] == 2 and created["warm_start"] is False
    assert created["config"]["training_args"]["learning_rate"] == pytest.approx(NEW_LR)
    panel.scroll_into_view_if_needed()
    page.evaluate("() => document.querySelectorAll('.rf-table-wrap').forEach((w) => { w.scrollLeft = 0; })")
    page.screenshot(path=str(OUTPUT / "04_clone_training.png"), full_page=True)
    # The README's and the docs' picture: the panel from its header to the engine time split
    # (below it, the timeline and knob views are folded or empty here), its top at the window's.
    panel.evaluate("(el) => el.scrollIntoView({ block: 'start' })")
    box, split = panel.bounding_box(), panel.locator("[data-testid=rf-time-split]").bounding_box()
    page.screenshot(path=str(OUTPUT / "panel.png"), clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": split["y"] + split["height"] - box["y"] + 8})
    page.screenshot(path=str(OUTPUT / "panel_clone_training.png"), clip={
        "x": box["x"], "y": box["y"], "width": box["width"], "height": split["y"] + split["height"] - box["y"] + 8})

    # --- a view rendered late, living on pulls alone (as in Colab) ------------------------------
    # A second widget without the publisher thread: it must rebuild everything from seq 0 by
    # pulling, and keep up with training without a single push.
    cells = page.locator(".jp-Cell")
    cells.last.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below
    page.locator(".jp-Cell").last.locator(".jp-InputArea-editor").click()
    page.keyboard.type("from rapidfire_nb.notebook.panel import Panel\nPanel(exp, push=False)")
    page.keyboard.press("Shift+Enter")
    late = page.locator("[data-testid=rf-panel]").nth(1)
    late.wait_for(timeout=120_000)
    _wait(lambda: late.locator("[data-testid=rf-runs] tr[data-run-id]").count() == 4, 120,
          "the late view to list all four runs", page)
    first_panel_points = trace_points(page, "train")

    def late_points():
        return page.evaluate(
            """() => {
                const div = document.querySelectorAll('[data-testid=rf-chart-train]')[1];
                const out = {};
                for (const t of (div && div.rfInspect ? div.rfInspect().series : [])) out[`run ${t.runId}`] = t.x.length;
                return out;
            }""")

    _wait(lambda: all(late_points().get(k, 0) >= v for k, v in first_panel_points.items()), 120,
          "the late, pull-only view to catch up with the first one", page)
    caught_up = late_points()
    _wait(lambda: sum(late_points().values()) > sum(caught_up.values()) or _all_done(lab.root), 180,
          "the pull-only view to keep growing", page)
    late.scroll_into_view_if_needed()
    page.screenshot(path=str(OUTPUT / "05_late_pull_only_view.png"), full_page=True)

    errors = [line for line in page.console_log if line.startswith("pageerror")]
    assert errors == [], errors
    check_docs_screenshot(OUTPUT / "panel.png")
    for name in ("panel_clone_form.png", "panel_clone_training.png"):
        check_docs_screenshot(OUTPUT / name, (DOCS_IMG / name,))


NB7_EXPERIMENT = "browser-panel-nb7"


def test_panel_in_notebook_7(lab, page):
    """The same panel in Jupyter Notebook 7 (the classic-style UI, served by the same server):
    it renders, its curves grow, and its Stop button stops one run while the others go on."""
    for kernel in lab.api("/api/kernels") or []:   # the JupyterLab test's kernel: free the cores
        lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    code = NOTEBOOK_CODE.replace("make_demo_datasets(192, 16)", "make_demo_datasets(96, 16)")
    write_notebook(lab.root, NB7_EXPERIMENT, "panel_nb7.ipynb", code)
    page.goto(f"{lab.url}/notebooks/panel_nb7.ipynb?token={lab.token}")
    page.locator(".jp-Cell .jp-InputArea-editor").first.wait_for(timeout=120_000)
    assert page.locator("#jp-top-panel, .jp-NotebookPanel").count() > 0
    # Notebook 7 itself may report a page error while it loads (seen: a settings-schema lookup
    # in its own bundle, before any kernel exists); the panel's page errors come after this mark
    mark = len(page.console_log)
    run_first_cell(page)

    panel = page.locator("[data-testid=rf-panel]")
    panel.wait_for(timeout=180_000)
    _wait(lambda: (lambda p: p if len(p) >= 2 and min(p.values()) >= 2 else None)(trace_points(page, "train")),
          240, "train curves of two runs in Notebook 7", page)
    assert page.locator("[data-testid=rf-runs] tr[data-run-id]").count() == 3

    _wait(lambda: row_status(page, 1) in ("running", "pending"), 60, "run 1 to be active", page)
    page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="stop"]').click()
    _wait(lambda: row_status(page, 1) == "stopped", 180, "run 1 to show as stopped", page)
    stopped = trace_points(page, "train")
    _wait(lambda: any(trace_points(page, "train").get(k, 0) > v for k, v in stopped.items() if k != "run 1")
          or _all_done_in(lab.root, NB7_EXPERIMENT), 180, "other runs to keep training", page)
    assert trace_points(page, "train")["run 1"] == stopped["run 1"]
    events = experiment_events(lab.root, NB7_EXPERIMENT)
    assert any(e["type"] == "op" and e["op"] == "stop" and e["run_id"] == 1 and e["accepted"] for e in events)
    stop_seq = next(e["seq"] for e in events
                    if e["type"] == "run_status" and e["run_id"] == 1 and e["status"] == "stopped")
    assert all(e["run_id"] != 1 for e in events if e["seq"] > stop_seq and e["type"] == "metric")
    page.screenshot(path=str(OUTPUT / "06_notebook7.png"), full_page=True)
    errors = [line for line in page.console_log[mark:] if line.startswith("pageerror")]
    assert errors == [], errors


def _all_done_in(root: Path, name: str) -> bool:
    status = {}
    for e in experiment_events(root, name):
        if e["type"] == "run_status":
            status[e["run_id"]] = e["status"]
    return bool(status) and all(s not in ("pending", "running") for s in status.values())
