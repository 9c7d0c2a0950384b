"""The run table at a common laptop size: 1280 x 900 in JupyterLab with the file browser open.

Four runs that differ in learning rate and LoRA adapter (the quickstart's grid, with its 16 fixed
knobs). Every row's run id, status and Stop/Clone buttons must be in view together, without
sideways scrolling: the table is no wider than its box, and each of those elements lies inside the
notebook's visible area. The clone form opens in view, shows the knobs that vary first with
readable labels, hides the auto-added ``use_cpu``, and keeps Create disabled while a field is
invalid. A knob column sorts on a click (ascending, then descending); at 900 px wide, where the
table no longer fits, a note says columns lie past its right edge (then its left, once scrolled).
Measured widths go to test-output/browser/fit_1280.json, screenshots beside it.
"""

from __future__ import annotations

from browser_helpers import run_cell, waiter

import json
from pathlib import Path

import nbformat
import pytest

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXPERIMENT = "browser-fit"

CODE = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(256, 16)
loras = List([
    RFLoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"]),
    RFLoraConfig(r=32, lora_alpha=64, lora_dropout=0.05, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
])
config = RFModelConfig(
    model_name="tiny-llama-offline", peft_config=loras,
    training_args=RFSFTConfig(learning_rate=List([2e-2, 2e-3]), per_device_train_batch_size=16,
                              num_train_epochs=3, max_length=64, lr_scheduler_type="linear",
                              bf16=False, fp16=False),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=4)
exp
"""

# Where each row's essentials are, relative to the notebook's visible area and the table's box.
MEASURE = """() => {
  const panel = document.querySelector('[data-testid=rf-panel]');
  const wrap = panel.querySelector('.rf-table-wrap');
  const table = panel.querySelector('[data-testid=rf-runs]');
  const scroller = panel.closest('.jp-WindowedPanel-outer') || panel.closest('.jp-Notebook');
  const view = scroller.getBoundingClientRect();
  const box = wrap.getBoundingClientRect();
  const left = Math.max(view.left, box.left), right = Math.min(view.right, box.right, window.innerWidth);
  const rows = [];
  for (const tr of table.querySelectorAll('tbody tr[data-run-id]')) {
    const parts = {
      id: tr.querySelector('td'),
      status: tr.querySelector('[data-testid=rf-status]'),
      stop: tr.querySelector('button[data-op=stop]'),
      clone: tr.querySelector('button[data-op=clone]'),
      eval: tr.querySelector('[data-testid=rf-eval-cell]'),
    };
    const out = {run: tr.dataset.runId};
    for (const [k, el] of Object.entries(parts)) {
      const r = el.getBoundingClientRect();
      out[k] = {left: Math.round(r.left), right: Math.round(r.right), inView: r.width > 0 && r.left >= left - 0.5 && r.right <= right + 0.5};
    }
    rows.push(out);
  }
  const fb = document.querySelector('#filebrowser');
  return {
    window: window.innerWidth,
    fileBrowserWidth: fb ? Math.round(fb.getBoundingClientRect().width) : 0,
    panelWidth: Math.round(panel.getBoundingClientRect().width),
    wrapClientWidth: wrap.clientWidth,
    tableScrollWidth: wrap.scrollWidth,
    tableWidth: Math.round(table.getBoundingClientRect().width),
    visibleLeft: Math.round(left), visibleRight: Math.round(right),
    rows,
  };
}"""


_wait = waiter("fit_timeout.png")


def test_run_table_fits_at_1280_with_file_browser(lab, browser):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(CODE.replace("{name}", EXPERIMENT))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "fit.ipynb")
    OUTPUT.mkdir(parents=True, exist_ok=True)

    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    try:
        page.goto(f"{lab.url}/lab/tree/fit.ipynb?token={lab.token}")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        if not page.locator("#filebrowser").is_visible():
            page.locator('.jp-SideBar [data-id="filebrowser"]').click()
        page.locator("#filebrowser").wait_for(state="visible")
        run_cell(page, 0, key="Shift+Enter", click=True)
        panel = page.locator("[data-testid=rf-panel]")
        panel.wait_for(timeout=180_000)
        _wait(lambda: page.locator("[data-testid=rf-runs] tr[data-run-id]").count() == 4, 180, "four rows", page)
        # the first chunk's numbers are in: every column the table will have is there
        _wait(lambda: page.locator('[data-testid=rf-runs] [data-testid=rf-latest]').first.inner_text() not in ("", "–"),
              300, "an eval value in the table", page)
        panel.scroll_into_view_if_needed()
        m = page.evaluate(MEASURE)
        (OUTPUT / "fit_1280.json").write_text(json.dumps(m, indent=1))
        page.screenshot(path=str(OUTPUT / "fit_1280.png"))
        assert m["fileBrowserWidth"] > 150, m
        assert m["tableScrollWidth"] <= m["wrapClientWidth"] + 1, (
            f"run table {m['tableScrollWidth']} px wide in a {m['wrapClientWidth']} px box")
        for row in m["rows"]:
            for part in ("id", "status", "stop", "clone", "eval"):
                assert row[part]["inView"], f"run {row['run']}: {part} out of view {row[part]} ({m['visibleLeft']}..{m['visibleRight']})"

        more = page.locator("[data-testid=rf-more-columns]")
        assert more.is_hidden(), "the table fits, yet the panel says columns lie past its edge"

        # --- a knob column sorts: by value, ascending first, then descending -------------------
        head = page.locator('[data-testid=rf-runs] th[data-sort="knob:training_args.learning_rate"]')
        lrs = """() => [...document.querySelectorAll('[data-testid=rf-runs] tbody tr[data-run-id]')].map((tr) =>
            parseFloat(tr.querySelector('[title^="training_args.learning_rate = "]').title.split(' = ')[1]))"""
        page.mouse.move(5, 5)
        head.click()
        page.mouse.move(5, 5)   # the order is held while the pointer is on the table
        _wait(lambda: head.get_attribute("data-sorted") == "asc", 10, "the learning-rate column sorted", page)
        _wait(lambda: page.evaluate(lrs) == sorted(page.evaluate(lrs)), 10, "rows in learning-rate order", page)
        assert len(set(page.evaluate(lrs))) == 2, page.evaluate(lrs)
        head.click()
        page.mouse.move(5, 5)
        _wait(lambda: head.get_attribute("data-sorted") == "desc", 10, "the learning-rate column reversed", page)
        _wait(lambda: page.evaluate(lrs) == sorted(page.evaluate(lrs), reverse=True), 10, "rows reversed", page)

        # --- narrower: columns past the right edge are announced, and the note follows the scroll
        page.set_viewport_size({"width": 900, "height": 900})
        _wait(lambda: more.is_visible(), 10, "the more-columns note in a narrow notebook", page)
        assert "right" in more.inner_text(), more.inner_text()
        page.locator("[data-testid=rf-panel] .rf-table-wrap").evaluate("(w) => { w.scrollLeft = w.scrollWidth; }")
        _wait(lambda: "left" in more.inner_text(), 10, "the note after scrolling to the last column", page)
        page.locator("[data-testid=rf-filters]").scroll_into_view_if_needed()
        page.screenshot(path=str(OUTPUT / "fit_900_more_columns.png"))
        page.locator("[data-testid=rf-panel] .rf-table-wrap").evaluate("(w) => { w.scrollLeft = 0; }")
        page.set_viewport_size({"width": 1280, "height": 900})
        _wait(lambda: more.is_hidden(), 10, "the note gone once the table fits again", page)

        # --- the clone form: in view, varying knobs first, readable labels, Create gated -------
        page.locator('[data-testid=rf-runs] tr[data-run-id="2"] button[data-op="clone"]').click()
        editor = page.locator("[data-testid=rf-clone-editor]")
        lr = editor.locator('input[data-knob="training_args.learning_rate"]')
        lr.wait_for(timeout=60_000)
        _wait(lambda: page.evaluate("""() => {
            const r = document.querySelector('[data-testid=rf-clone-editor]').getBoundingClientRect();
            return r.top >= 0 && r.top < window.innerHeight - 40; }"""), 10, "the clone form scrolled into view", page)
        labels = editor.locator(".rf-form-main label").all_inner_texts()
        assert labels[:2] and "learning rate" in [t.strip() for t in labels], labels
        assert not any("training_args." in t for t in labels), labels
        assert editor.locator('input[data-knob="training_args.use_cpu"]').count() == 0
        assert editor.locator('input[data-knob="training_args.per_device_train_batch_size"]').is_hidden()
        create = editor.locator("[data-testid=rf-clone-create]")
        lr.fill("fast")
        _wait(lambda: create.is_disabled(), 10, "Create disabled while a field is invalid", page)
        page.screenshot(path=str(OUTPUT / "fit_1280_clone.png"))
        lr.fill("0.001")
        _wait(lambda: create.is_enabled(), 30, "Create enabled again", page)
        assert errors == [], errors
    finally:
        context.close()
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
