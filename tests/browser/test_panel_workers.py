"""The panel's worker column and lost-worker notice in a real Chromium, fed the recorded Ray log
(tests/fixtures/events/ray_workers.jsonl: 3 runs on workers w0, w1; w1 killed while it trained
run 1's second chunk) in the wire form Python sends (``batch_events``), through a stand-in for the
anywidget model: no JupyterLab is needed to check what the bundle renders."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from rapidfire_nb.engine.events import read_events
from rapidfire_nb.notebook._panel_protocol import PROTOCOL_VERSION, batch_events

# this folder's conftest (its bundle check), by path: tests/conftest.py is also a "conftest"
_spec = importlib.util.spec_from_file_location("rf_browser_conftest", Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
BUNDLE, ensure_bundle = _conftest.BUNDLE, _conftest.ensure_bundle

pytestmark = pytest.mark.browser   # a real Chromium, though no JupyterLab

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "events"
ORIGIN = "http://rf-panel.test"

# A model that answers every pull with the events after `since` and ignores other requests.
PAGE = """<!doctype html><html><body><div id="host"></div><script type="module">
import panel from "./panel.js";
const events = %s;
const handlers = {};
const model = {
  get: (k) => k === "snapshot" ? {protocol: %d, experiment: "ray_workers", path: "/x", last_seq: 0, runs: {}, on_device: null} : null,
  set() {}, save_changes() {},
  on: (name, fn) => { (handlers[name] ??= []).push(fn); },
  off() {},
  send(content) {
    if (content.type !== "pull") return;
    const batch = events.filter((e) => e.seq > content.since);
    const last = events.length ? events[events.length - 1].seq : 0;
    setTimeout(() => (handlers["msg:custom"] ?? []).forEach((fn) => fn(
      {type: "reply", request_id: content.request_id, ok: true, error: null, events: batch, last_seq: last, more: false})), 0);
  },
};
panel.render({model, el: document.getElementById("host")});
</script></body></html>"""


def _open(browser, events: list[dict]):
    ensure_bundle()
    wired, more = batch_events(events)
    assert not more
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    html = PAGE % (json.dumps(wired), PROTOCOL_VERSION)
    # on the context: a second page of it (a later view of the same experiment) gets them too
    context.route(f"{ORIGIN}/index.html", lambda r: r.fulfill(body=html, content_type="text/html"))
    context.route(f"{ORIGIN}/panel.js", lambda r: r.fulfill(path=str(BUNDLE), content_type="text/javascript"))
    page.goto(f"{ORIGIN}/index.html")
    return context, page, errors


def _rows(page) -> dict[int, str]:
    page.wait_for_selector('[data-testid="rf-runs"] tbody tr[data-run-id]')
    return {int(tr.get_attribute("data-run-id")): (tr.query_selector('[data-testid="rf-worker"]').inner_text())
            for tr in page.query_selector_all('[data-testid="rf-runs"] tbody tr[data-run-id]')}


def test_worker_column_and_lost_worker_notice(browser):
    events = read_events(FIXTURES / "ray_workers.jsonl")
    lost_at = next(e["seq"] for e in events if e["type"] == "worker_lost")
    # before the loss: runs 2 and 3 last trained on w1, run 1 on w0; no notice
    context, page, errors = _open(browser, [e for e in events if e["seq"] < lost_at])
    try:
        page.wait_for_function("document.querySelectorAll('[data-testid=rf-worker]').length === 3")
        assert _rows(page) == {1: "w0", 2: "w1", 3: "w1"}
        heads = page.eval_on_selector_all('[data-testid="rf-runs"] thead th', "ths => ths.map(t => t.textContent)")
        assert "worker" in heads
        assert page.locator('[data-testid="rf-worker-lost"]').is_hidden()
    finally:
        context.close()
    assert errors == []
    context, page, errors = _open(browser, events)
    try:
        notice = page.locator('[data-testid="rf-worker-lost"]')
        notice.wait_for(state="visible")
        assert notice.locator(".rf-notice span").inner_text() == ("worker w1 lost (node 192.0.2.2): runs 1, 2 continue from their last "
                                       "checkpoints on the other workers; run 1's chunk 2 (epoch 1) is trained again")
        page.wait_for_function(
            "[...document.querySelectorAll('[data-testid=rf-worker]')].every(td => td.textContent === 'w0')")
        assert _rows(page) == {1: "w0", 2: "w0", 3: "w0"}
        _conftest.OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(_conftest.OUTPUT / "workers.png"), full_page=True)
    finally:
        context.close()
    assert errors == []


def test_no_worker_column_in_the_kernel_engine(browser):
    context, page, errors = _open(browser, read_events(FIXTURES / "sft_basic.jsonl"))
    try:
        page.wait_for_selector('[data-testid="rf-runs"] tbody tr[data-run-id]')
        heads = page.eval_on_selector_all('[data-testid="rf-runs"] thead th', "ths => ths.map(t => t.textContent)")
        assert "progress" in heads and "worker" not in heads
        assert page.locator('[data-testid="rf-worker"]').count() == 0
        assert page.locator('[data-testid="rf-worker-lost"]').is_hidden()
    finally:
        context.close()
    assert errors == []


# -- the chunk timeline and the notice's dismiss button ------------------------------------------

TIMELINE = '[data-testid="rf-timeline"]'


def _timeline(page, draws: int = 1) -> dict:
    """What the canvas drew (the view's read-only inspection hook), once it has drawn."""
    page.wait_for_function(f"(document.querySelector('{TIMELINE}')?.rfTimeline?.draws ?? 0) >= {draws}")
    return page.eval_on_selector(TIMELINE, "el => JSON.parse(JSON.stringify(el.rfTimeline))")


def test_chunk_timeline_one_lane_per_worker_and_the_lost_one(browser):
    events = read_events(FIXTURES / "ray_workers.jsonl")
    done = [e for e in events if e["type"] == "chunk_done"]
    (loss,) = [e for e in events if e["type"] == "worker_lost"]
    origin = min(e["start"] for e in done)
    context, page, errors = _open(browser, events)
    try:
        # a Ray experiment opens the section by itself once its workers are known
        page.wait_for_function(f"document.querySelector('{TIMELINE}').closest('details').open")
        page.wait_for_function("document.querySelectorAll('[data-testid=rf-worker]').length === 3")
        tl = _timeline(page)
        assert [(ln["key"], ln["title"]) for ln in tl["lanes"]] == [
            ("w0", "worker w0 (w0:cpu, node 192.0.2.2)"), ("w1", "worker w1 (w1:cpu, node 192.0.2.2)")]
        assert tl["lanes"][0]["lost"] == []
        assert [(s["from"], s["to"]) for s in tl["lanes"][1]["lost"]] == [(loss["time"] - origin, None)]
        trained = [b for b in tl["blocks"] if not b["lost"]]
        # a run's first chunk started where it is (the engine logs it moved): not a move
        firsts = {}
        for e in done:
            firsts.setdefault(e["run_id"], e["seq"])
        assert [(b["lane"], b["run"], b["epoch"], b["chunk"], b["moved"]) for b in trained] == \
            [(e["worker"], e["run_id"], e["epoch"], e["chunk"], e["moved"] and firsts[e["run_id"]] != e["seq"])
             for e in done]
        for b, e in zip(trained, done):
            assert abs(b["t0"] - (e["start"] - origin)) < 1e-6 and abs(b["t1"] - (e["end"] - origin)) < 1e-6
        (lost,) = [b for b in tl["blocks"] if b["lost"]]
        c = loss["chunk_lost"]
        assert (lost["lane"], lost["run"], lost["epoch"], lost["chunk"]) == ("w1", c["run_id"], c["epoch"], c["chunk"])
        # at this width every chunk is a rectangle of its own, in its lane's row
        assert len(tl["rects"]) == len(tl["blocks"]) and all(r["blocks"] == 1 for r in tl["rects"])
        summary = page.locator(f"details:has({TIMELINE}) > summary").inner_text()
        assert summary.startswith("chunk timeline: 9 chunks on 2 workers (1 lost)")
        # hovering a block names its run, chunk and worker
        box = page.locator(f"{TIMELINE} canvas").bounding_box()
        r = max(tl["rects"], key=lambda r: r["w"])
        page.mouse.move(box["x"] + r["x"] + r["w"] / 2, box["y"] + r["y"] + r["h"] / 2)
        tip = page.locator(".rf-timeline-tip")
        tip.wait_for(state="visible")
        block = next(b for b in tl["blocks"] if b["lane"] == r["lane"] and b["run"] == r["run"])
        assert tip.inner_text() == block["title"]
        assert f"run {r['run']} · epoch 1 · chunk " in tip.inner_text() and f"worker {r['lane']}" in tip.inner_text()
        page.mouse.move(box["x"] + 2, box["y"] + box["height"] - 2)
        tip.wait_for(state="hidden")
        # the hatched end of w1's lane says when and why it was lost
        w1 = next(r for r in tl["rects"] if r["lane"] == "w1")
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + w1["y"] + w1["h"] / 2)
        tip.wait_for(state="visible")
        assert tip.inner_text().startswith("worker w1 lost at ") and "ray.kill" in tip.inner_text()
        _conftest.OUTPUT.mkdir(parents=True, exist_ok=True)
        page.locator(TIMELINE).screenshot(path=str(_conftest.OUTPUT / "workers_timeline.png"))

        # the notice's x hides it in this view; the log, the column and the timeline keep the loss
        notice = page.locator('[data-testid="rf-worker-lost"]')
        notice.wait_for(state="visible")
        button = page.locator('[data-testid="rf-worker-lost"] button.rf-notice-close')
        # get_runs_info has a worker column, not the loss: the log and %rapidfire status keep it
        title = button.get_attribute("title") or ""
        assert "get_runs_info" not in title and "%rapidfire status" in title, title
        button.click()
        page.locator('[data-testid="rf-worker-lost"] .rf-notice').wait_for(state="detached")
        # what is hidden can be shown again: "1 worker notice hidden · show"
        hidden = page.locator('[data-testid="rf-worker-lost"] .rf-notice-hidden')
        assert hidden.inner_text() == "1 worker notice hidden · show"
        assert _timeline(page)["lanes"][1]["lost"] != []
        page.screenshot(path=str(_conftest.OUTPUT / "workers_dismissed.png"), full_page=True)
        # a panel view of the same experiment opened later remembers the dismissal
        again = context.new_page()
        again.on("pageerror", lambda err: errors.append(str(err)))
        again.goto(f"{ORIGIN}/index.html")
        again.wait_for_function("document.querySelectorAll('[data-testid=rf-worker]').length === 3")
        _timeline(again)
        assert again.locator('[data-testid="rf-worker-lost"] .rf-notice').count() == 0
        again.locator('[data-testid="rf-worker-lost"] button.rf-notice-show').click()
        again.locator('[data-testid="rf-worker-lost"] .rf-notice').wait_for(state="visible")
        assert again.locator('[data-testid="rf-worker-lost"] .rf-notice-hidden').count() == 0
        # and stays shown in a view opened after that
        third = context.new_page()
        third.on("pageerror", lambda err: errors.append(str(err)))
        third.goto(f"{ORIGIN}/index.html")
        third.locator('[data-testid="rf-worker-lost"] .rf-notice').wait_for(state="visible")
    finally:
        context.close()
    assert errors == []


def test_kernel_engine_timeline_has_one_device_lane(browser):
    events = read_events(FIXTURES / "sft_basic.jsonl")
    done = [e for e in events if e["type"] == "chunk_done"]
    context, page, errors = _open(browser, events)
    try:
        page.wait_for_selector('[data-testid="rf-runs"] tbody tr[data-run-id]')
        summary = page.locator(f"details:has({TIMELINE}) > summary")
        page.wait_for_function(
            f"document.querySelector('{TIMELINE}').closest('details').querySelector('summary').textContent"
            f" === 'chunk timeline: {len(done)} chunks'")
        # folded (no workers): nothing drawn until the user opens it
        assert page.eval_on_selector(TIMELINE, "el => el.rfTimeline.draws") == 0
        summary.click()
        tl = _timeline(page)
        assert [(ln["key"], ln["title"]) for ln in tl["lanes"]] == [("cpu", "device cpu")]
        assert [(b["run"], b["chunk"]) for b in tl["blocks"]] == [(e["run_id"], e["chunk"]) for e in done]
        text = summary.inner_text()
        assert text.startswith(f"chunk timeline: {len(done)} chunks on cpu · ")
        assert not any("worker" in b["title"] or "moved" in b["title"] for b in tl["blocks"]) and "worker" not in text
        _conftest.OUTPUT.mkdir(parents=True, exist_ok=True)
        page.locator(TIMELINE).screenshot(path=str(_conftest.OUTPUT / "kernel_timeline.png"))
    finally:
        context.close()
    assert errors == []


def test_an_ended_experiment_does_not_redraw_its_timeline_without_news(browser):
    # every pull reply reaches the timeline; with no new chunk, loss or width it draws nothing
    context, page, errors = _open(browser, read_events(FIXTURES / "ray_workers.jsonl"))
    try:
        _timeline(page)
        time.sleep(3)
        before = page.eval_on_selector(TIMELINE, "el => el.rfTimeline.draws")
        time.sleep(6)
        after = page.eval_on_selector(TIMELINE, "el => el.rfTimeline.draws")
        assert after == before, f"{after - before} redraws in 6 s without a new event"
        # a new width still redraws
        page.set_viewport_size({"width": 900, "height": 900})
        page.wait_for_function(f"document.querySelector('{TIMELINE}').rfTimeline.draws > {after}")
    finally:
        context.close()
    assert errors == []

