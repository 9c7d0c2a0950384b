"""Hostile clicks on the panel, in real JupyterLab + Chromium: a double click on Stop sends one
stop (no refusal of a second one shows up), and a double click on Delete is not its own
confirmation (the run is only deleted by a second, later click).

Screenshot: test-output/browser/clicks_double.png.
"""

from __future__ import annotations

from browser_helpers import run_cell, waiter

import time
from pathlib import Path

import nbformat
import pytest

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_FIT = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(384, 16)
config = RFModelConfig(
    model_name="tiny-llama", peft_config=RFLoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([3e-4, 3e-3, 1e-3]), per_device_train_batch_size=8,
                              num_train_epochs=3, bf16=False, max_length=64),
)
exp = Experiment("browser-clicks", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=4)
exp
"""

_wait = waiter("clicks_timeout.png")


def test_double_clicks_send_one_op(lab, browser):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(RUN_FIT)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "clicks.ipynb")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        page.goto(f"{lab.url}/lab/tree/clicks.ipynb?token={lab.token}")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        run_cell(page, 0)
        panel = page.locator("[data-testid=rf-panel]")
        panel.wait_for(timeout=180_000)
        rows = page.locator("[data-testid=rf-runs] tbody tr[data-run-id]")
        _wait(lambda: rows.count() == 3, 180, "three rows", page)
        _wait(lambda: page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").count() == 1, 120,
              "the kernel idle", page)
        panel.scroll_into_view_if_needed()
        messages = page.locator("[data-testid=rf-messages]")

        # Stop, double-clicked, on a run that is not on the device (it stays stopping… a while)
        def off_device(rid: str) -> bool:
            row = page.locator(f'[data-testid=rf-runs] tr[data-run-id="{rid}"]')
            return (row.get_attribute("data-status") in ("pending", "running")
                    and row.locator("[data-testid=rf-on-device]").is_hidden())

        _wait(lambda: sum(off_device(r) for r in ("1", "2", "3")) >= 2, 120, "two runs off the device", page)
        stop_id, delete_id = [r for r in ("3", "2", "1") if off_device(r)][:2]
        row = page.locator(f'[data-testid=rf-runs] tr[data-run-id="{stop_id}"]')
        row.locator('button[data-op="stop"]').dblclick()
        seen: list[str] = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            text = messages.inner_text()
            if not seen or seen[-1] != text:
                seen.append(text)
            time.sleep(0.05)
        assert any("accepted" in t for t in seen), seen
        assert not any("only pending or running" in t or "refused" in t for t in seen), seen
        assert row.locator("[data-testid=rf-status]").inner_text() in ("stopping…", "stopped")

        # Delete, double-clicked: armed ("Confirm?"), not deleted
        drow = page.locator(f'[data-testid=rf-runs] tr[data-run-id="{delete_id}"]')
        delete = drow.locator('button[data-op="delete"]')
        delete.dblclick()
        time.sleep(1.0)
        page.screenshot(path=str(OUTPUT / "clicks_double.png"))
        assert delete.inner_text() == "Confirm?"
        assert drow.locator("[data-testid=rf-status]").inner_text() not in ("deleting…", "deleted")
        # armed says so ("click Confirm? within 4 s"); no delete was sent
        assert f"delete run {delete_id}: accepted" not in messages.inner_text()
        assert "Confirm? within" in messages.inner_text()
        if delete.inner_text() != "Confirm?":   # a loaded machine took over 4 s since the double click
            delete.click()
        delete.click()   # the real confirmation, a moment later
        _wait(lambda: f"delete run {delete_id}: accepted" in messages.inner_text(), 30, "the delete accepted", page)
    finally:
        context.close()
        for kernel in lab.api("/api/kernels") or []:
            lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
