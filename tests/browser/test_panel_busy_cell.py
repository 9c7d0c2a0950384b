"""What a Stop click does while a cell runs, measured in real JupyterLab + Chromium.

A notebook trains two long runs, then a cell busy in Python for at most a minute (polling run 1's
status, as user code would) and a cell blocked in ``exp.wait(timeout=60)``; the test clicks Stop on
run 1 during the first and on run 2 during the second, and reads from the event log when each
click was taken: during its cell (JupyterLab >= 4.4 can send widget messages on a kernel
subshell, which ipykernel 7 serves beside the running cell) or only once the cell ended (older
kernels; and, with ipykernel 7.4 and JupyterLab 4.6, every message JupyterLab sent on the main
shell instead: logging the handling thread showed one click of a run on a subshell and the other
on the main thread, which way round changing between runs). It prints which, and asserts what
must hold either way: each click is taken, and a cell sees the stop exactly when the click was
taken before it ended. On a kernel without subshells the click must wait (Colab's kernel is
measured in ``test_notebook6.py``).

No timed assertions: the runs are far longer (a thousand epochs) than the test lets them train, so
they are still training whenever a click lands, however fast the machine; every wait is on a
condition, and the test stops both runs itself.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from browser_helpers import experiment_events, run_cell, waiter

pytestmark = [pytest.mark.browser, pytest.mark.slow]

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"
EXPERIMENT = "browser-busy-cell"

RUN_FIT = """\
import ipykernel
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

print("ipykernel", ipykernel.__version__)
train, evals = make_demo_datasets(4096, 8)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([1e-3, 3e-4]), per_device_train_batch_size=8,
                              num_train_epochs=1000, bf16=False, max_length=48),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=128)
exp
"""

# Busy in Python until run 1 stops, for at most a minute: where the click is taken during the cell
# it ends it early; where it waits for the cell to end, the cell gives up still seeing run 1
# running (the runs are far too long to finish meanwhile). It prints the time it ended.
BUSY = """\
import time
def status(run_id):
    return exp.get_runs_info().set_index("run_id").loc[run_id, "status"]
give_up = time.monotonic() + 60
while status(1) in ("pending", "running") and time.monotonic() < give_up:
    time.sleep(0.2)
print("BUSY CELL SAW run 1", status(1), "at", time.time())
"""

# Blocked in exp.wait(), for at most a minute.
WAIT = """\
done = exp.wait(timeout=60)
print("WAIT RETURNED", done, "run 2", status(2), "at", time.time())
"""

_wait = waiter("busy_timeout.png", full_page=True)


def _output(page, index: int) -> str:
    return page.locator(".jp-Cell").nth(index).locator(".jp-OutputArea").inner_text()


def _accepted_stop(root: Path, run_id: int) -> float | None:
    """When the Stop of ``run_id`` was taken (its op event's time), or None before."""
    return next((e["time"] for e in experiment_events(root, EXPERIMENT)
                 if e["type"] == "op" and e["op"] == "stop" and e["run_id"] == run_id and e.get("accepted")),
                None)


def test_stop_clicked_during_a_busy_cell_and_during_wait(lab, page):
    import ipykernel

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(RUN_FIT.replace("{name}", EXPERIMENT)),
                nbformat.v4.new_code_cell(BUSY), nbformat.v4.new_code_cell(WAIT)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root / "busy.ipynb")
    page.goto(f"{lab.url}/lab/tree/busy.ipynb?token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    run_cell(page, 0)
    stop1 = page.locator('[data-testid=rf-runs] tr[data-run-id="1"] button[data-op="stop"]')
    stop2 = page.locator('[data-testid=rf-runs] tr[data-run-id="2"] button[data-op="stop"]')
    _wait(lambda: stop1.count() and stop1.is_visible(), 300, "run 1's row in the panel", page, lab=lab)
    _wait(lambda: any(e["type"] == "chunk_done" for e in experiment_events(lab.root, EXPERIMENT)), 300,
          "the first chunk", page, lab=lab)
    kernel = _output(page, 0).split("ipykernel", 1)[1].split()[0]
    subshells = int(ipykernel.__version__.split(".")[0]) >= 7

    run_cell(page, 1)
    prompt1 = page.locator(".jp-Cell .jp-InputPrompt").nth(1)
    _wait(lambda: "[*]" in prompt1.inner_text(), 60, "the busy cell to run", page, lab=lab)
    _wait(lambda: stop1.is_enabled(), 60, "run 1's Stop", page, lab=lab)
    stop1.click()
    _wait(lambda: "BUSY CELL SAW run 1" in _output(page, 1), 600, "the busy cell to end", page, lab=lab)
    seen1, ended1 = _said(_output(page, 1), "BUSY CELL SAW run 1")
    _wait(lambda: _accepted_stop(lab.root, 1) is not None, 600, "run 1's Stop to be taken", page, lab=lab)
    during1 = _accepted_stop(lab.root, 1) < ended1

    run_cell(page, 2)
    prompt2 = page.locator(".jp-Cell .jp-InputPrompt").nth(2)
    _wait(lambda: "[*]" in prompt2.inner_text(), 60, "exp.wait() to run", page, lab=lab)
    _wait(lambda: stop2.is_enabled(), 60, "run 2's Stop", page, lab=lab)
    stop2.click()
    _wait(lambda: "WAIT RETURNED" in _output(page, 2), 600, "exp.wait() to return", page, lab=lab)
    page.screenshot(path=str(OUTPUT / "busy_cell.png"), full_page=True)
    returned, ended2 = _said(_output(page, 2), "WAIT RETURNED")
    _wait(lambda: _accepted_stop(lab.root, 2) is not None, 600, "run 2's Stop to be taken", page, lab=lab)
    during2 = _accepted_stop(lab.root, 2) < ended2
    print(f"\nipykernel {kernel}: Stop during a busy cell taken {'during' if during1 else 'after'} it "
          f"(the cell saw run 1 {seen1}); Stop during exp.wait() taken {'during' if during2 else 'after'} "
          f"it (wait returned {returned})")
    # what must hold whichever way the kernel served the click
    # (a click taken late in the cell may be applied only after it: its chunk had to end first)
    assert (seen1 == "stopped") <= during1 and (during1 or seen1 == "running"), (seen1, during1)
    assert returned.startswith("True") <= during2, (returned, during2)
    if not during2:
        assert returned.startswith("False run 2 running"), returned
    if not subshells:   # no subshell: nothing reaches Python while a cell runs
        assert not during1 and not during2


def _said(output: str, marker: str) -> tuple[str, float]:
    """What a cell printed after ``marker``, and the time it printed at its end."""
    text, at = output.split(marker, 1)[1].rsplit(" at ", 1)
    return text.strip(), float(at.split()[0])
