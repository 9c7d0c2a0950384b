"""Suggest mode in a real browser: the pruner marks runs, the user answers each from the panel.

A grid of four tiny-model LoRA runs with ``pruner="sha", pruner_mode="suggest"`` trains in a
JupyterLab kernel. After the first chunk the pruner marks the two worst runs; each marked row shows
the reason with Confirm and Ignore. The test clicks Confirm on one and Ignore on the other, and
checks the page and the experiment's event log on disk: the confirmed run stops with the pruning
reason (its row reads "pruned"), the ignored one trains on with no question left, and both answers
are ``op`` events like any other.
"""

from __future__ import annotations

from browser_helpers import experiment_events, row_status, run_first_cell, trace_points, waiter, write_notebook

from pathlib import Path

import pytest

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

EXPERIMENT = "browser-suggest"

CODE = """\
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evals = make_demo_datasets(96, 16)
config = RFModelConfig(
    model_name="tiny-llama",
    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=List([3e-2, 3e-3, 1e-4, 1e-5]), per_device_train_batch_size=8,
                              num_train_epochs=8, bf16=False, max_length=64),
)
exp = Experiment("{name}", experiment_path="experiments")
exp.run_fit(RFGridSearch(config, trainer_type="SFT", pruner="sha", pruner_mode="suggest"),
            tiny_create_model, train, evals, num_chunks=4)
"""

_wait = waiter("suggest_timeout.png", full_page=True)


def _row(page, run_id: int):
    return page.locator(f'[data-testid=rf-runs] tr[data-run-id="{run_id}"]')


def _row_ids(rows) -> list[int]:
    """The run ids of the rows ``rows`` matches, read in one go in the page: reading them one by
    one (``.all()`` then each row) races the table's re-render, and a row gone meanwhile (a
    question just answered) would be waited for until the read times out."""
    return [int(i) for i in rows.evaluate_all("(trs) => trs.map((tr) => tr.dataset.runId)")]


def _open_questions(page) -> list[int]:
    return sorted(_row_ids(page.locator("[data-testid=rf-runs] tr.rf-suggested")))


def test_confirm_and_ignore_suggestions_from_the_panel(lab, page):
    for kernel in lab.api("/api/kernels") or []:   # another test's kernel: free the cores
        lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
    write_notebook(lab.root, EXPERIMENT, "suggest.ipynb", CODE)
    # a workspace of its own: another test's notebook, restored hidden, must not take the clicks
    page.goto(f"{lab.url}/lab/workspaces/suggest/tree/suggest.ipynb?reset&token={lab.token}")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    run_first_cell(page)
    page.locator("[data-testid=rf-panel]").wait_for(timeout=180_000)

    def page_agrees_with_log():
        # the runs keep training while marked, so the next rung may add a mark at any moment:
        # read the page and the log until they agree, then answer the first rung's two marks
        q = _open_questions(page)
        log = {e["run_id"]: e for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "pruning_suggested"}
        return (q, log) if len(q) >= 2 and set(q) == set(log) else None

    asked, logged = _wait(page_agrees_with_log, 300, "two rows with a pruning suggestion", page)
    first_rung = sorted(rid for rid in asked if "at chunk 1 " in logged[rid]["reason"])
    assert len(first_rung) == 2, logged        # sha keeps 2 of 4 at the first rung
    confirm_id, ignore_id = first_rung
    for rid in asked:
        box = _row(page, rid).locator("[data-testid=rf-suggestion]")
        assert box.is_visible()
        assert logged[rid]["reason"] in box.inner_text()          # "pruned at chunk 1 (rank r of 4)"
    for rid in first_rung:
        assert row_status(page, rid) in ("pending", "running", "completed")   # only marked, not stopped
    count = page.locator("[data-testid=rf-suggested-count]")
    _wait(lambda: count.inner_text() == f"{len(_open_questions(page))} suggested to stop", 30,
          "the header to count the open marks", page)
    page.screenshot(path=str(OUTPUT / "suggest_01_marked.png"), full_page=True)

    _row(page, confirm_id).locator('button[data-op="confirm_suggestion"]').click()
    # a pruned run folds into the group row below the live runs
    _wait(lambda: page.locator("[data-testid=rf-group]").count() and "1 pruned" in page.locator("[data-testid=rf-group]").inner_text(),
          180, f"run {confirm_id} to stop as pruned", page)
    assert confirm_id not in _open_questions(page)
    # a suggestion is answerable only while its run trains (a finished run's box hides): the
    # runs are long enough (8 epochs) that the marked ones still train when the clicks land
    _row(page, ignore_id).locator('button[data-op="ignore_suggestion"]').click()
    _wait(lambda: ignore_id not in _open_questions(page), 120, f"run {ignore_id}'s question to close", page)
    page.screenshot(path=str(OUTPUT / "suggest_02_answered.png"), full_page=True)

    events = experiment_events(lab.root, EXPERIMENT)
    answers = [(e["op"], e["run_id"], e["accepted"]) for e in events
               if e["type"] == "op" and e["op"] in ("confirm_suggestion", "ignore_suggestion")]
    assert answers == [("confirm_suggestion", confirm_id, True), ("ignore_suggestion", ignore_id, True)]
    stopped = [e for e in events if e["type"] == "run_status" and e["run_id"] == confirm_id
               and e["status"] == "stopped"]
    assert stopped and stopped[-1]["reason"] == logged[confirm_id]["reason"]
    page.locator("[data-testid=rf-group]").click()
    _row(page, confirm_id).wait_for(timeout=30_000)
    assert row_status(page, confirm_id) == "stopped"
    assert _row(page, confirm_id).locator("[data-testid=rf-status]").inner_text() == "pruned"
    assert _row(page, confirm_id).locator("[data-testid=rf-status]").get_attribute("title") == logged[confirm_id]["reason"]
    assert not _row(page, confirm_id).locator("[data-testid=rf-suggestion]").is_visible()
    # the ignored run trains on to its last step, like a run that was never marked: waiting for
    # "one more point" would race a fast machine, where the run may finish before the click lands
    _wait(lambda: row_status(page, ignore_id) == "completed", 300,
          f"run {ignore_id} to train to the end after Ignore", page)
    points = _wait(lambda: (lambda p: p if p.get(f"run {ignore_id}", 0) == max(p.values()) else None)(
        trace_points(page, "train")), 60, f"run {ignore_id}'s curve to reach the last step", page)
    assert points[f"run {ignore_id}"] == max(points.values()) > 0, points
    assert not [e for e in experiment_events(lab.root, EXPERIMENT) if e["type"] == "run_status"
                and e["run_id"] == ignore_id and e["status"] == "stopped"]
    assert not _row(page, ignore_id).locator("[data-testid=rf-suggestion]").is_visible()

    # --- the set-up survives a re-render: hide pruned runs, sort by run id, show the panel again --
    panel = page.locator("[data-testid=rf-panel]").first
    panel.locator('[data-testid=rf-filters] input[data-filter="pruned"]').check()
    panel.locator('[data-testid=rf-runs] th[data-sort="id"]').click()
    _wait(lambda: panel.locator('th[data-sort="id"]').get_attribute("data-sorted") == "asc", 30,
          "the table sorted by run id", page)
    page.locator(".jp-Cell").last.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")  # a new cell below
    page.locator(".jp-Cell").last.locator(".jp-InputArea-editor").click()
    page.keyboard.type("exp")
    page.keyboard.press("Shift+Enter")
    again = page.locator("[data-testid=rf-panel]").nth(1)
    again.wait_for(timeout=120_000)
    _wait(lambda: again.locator("[data-testid=rf-runs] tr[data-run-id]").count() >= 3, 120,
          "the re-rendered panel's rows", page)
    assert again.locator('[data-testid=rf-filters] input[data-filter="pruned"]').is_checked()
    assert not again.locator('[data-testid=rf-filters] input[data-filter="stopped"]').is_checked()
    assert again.locator('th[data-sort="id"]').get_attribute("data-sorted") == "asc"
    assert again.locator(f'tr[data-run-id="{confirm_id}"]').count() == 0      # hidden: pruned
    ids = _row_ids(again.locator("[data-testid=rf-runs] tr[data-run-id]"))
    assert ids == sorted(ids)
    again.scroll_into_view_if_needed()
    page.screenshot(path=str(OUTPUT / "suggest_03_rerendered.png"), full_page=True)

    errors = [line for line in page.console_log if line.startswith("pageerror")]
    assert errors == [], errors
    for kernel in lab.api("/api/kernels") or []:   # leave the cores to the next test
        lab.api(f"/api/kernels/{kernel['id']}", method="DELETE")
