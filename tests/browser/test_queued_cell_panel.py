"""RapidFire-style code run with Run All in real JupyterLab + Chromium: the cell queued behind a
``mode="fit"`` run_fit waits for the runs (docs/pages/porting.md), and meanwhile the panel that the
run_fit cell displayed draws them live. That panel is rendered after its cell ended, while the
kernel already holds the next one, so its own pull of the history cannot be answered until the
wait ends; it lives on what the publisher thread pushes (the log from the start, after a display).

Kernel > Interrupt then starts the waiting cell at once, as documented, and the cell after it
ends the experiment. The runs are far longer than the test lets them train, so they train
whenever the panel is looked at, however fast the machine.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from browser_helpers import dismiss_dialogs, row_status, waiter

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"

RUN_FIT = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(1024, 8)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([1e-3, 3e-4]), per_device_train_batch_size=8,
                              num_train_epochs=1000, bf16=False, max_length=48),
)
experiment = Experiment(experiment_name="browser-queued", experiment_path="experiments", mode="fit")
experiment.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=64)
"""

RESULTS = 'print("RESULTS", experiment.get_runs_info().status.tolist())'
END = 'experiment.end(wait=False)\nprint("ENDED")'

_wait = waiter("queued_cell_timeout.png", full_page=True)


def test_run_fit_panel_draws_live_behind_a_queued_cell(lab, page):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in (RUN_FIT, RESULTS, END)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "queued.ipynb")
    page.goto(f"{lab.url}/lab/tree/queued.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    page.wait_for_timeout(2000)
    dismiss_dialogs(page)

    page.locator(".lm-MenuBar-item", has_text="Run").first.click()
    page.locator(".lm-Menu-item", has_text="Run All Cells").first.click()

    cells = page.locator(".jp-Notebook .jp-Cell")
    _wait(lambda: "queued behind run_fit" in cells.nth(1).locator(".jp-OutputArea").inner_text(), 300,
          "the queued cell to say it waits for the runs", page, lab=lab)
    # the run_fit cell's own panel fills in while the queued cell still waits
    _wait(lambda: row_status(page, 1) == "running" and row_status(page, 2) in ("pending", "running"), 120,
          "the run_fit cell's panel to show the runs", page, lab=lab)
    assert "[*]" in cells.nth(1).locator(".jp-InputPrompt").inner_text(), "the queued cell no longer waits"
    assert "RESULTS" not in cells.nth(1).locator(".jp-OutputArea").inner_text()
    page.screenshot(path=str(OUTPUT / "queued_cell_panel.png"), full_page=True)

    # Kernel > Interrupt: the waiting cell starts now, and the one after it ends the experiment
    page.locator(".lm-MenuBar-item", has_text="Kernel").first.click()
    page.locator(".lm-Menu-item", has_text="Interrupt Kernel").first.click()
    _wait(lambda: "ENDED" in cells.nth(2).locator(".jp-OutputArea").inner_text(), 300,
          "the cells after the interrupt to run", page, lab=lab)
    assert "running" in cells.nth(1).locator(".jp-OutputArea").inner_text().split("RESULTS", 1)[1]
