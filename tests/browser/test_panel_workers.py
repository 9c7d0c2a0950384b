"""The panel's worker column and lost-worker notice in a real Chromium, fed the recorded Ray log
(tests/fixtures/events/ray_workers.jsonl: 3 runs on workers w0, w1; w1 killed while it trained
run 1's second chunk) in the wire form Python sends (``batch_events``), through a stand-in for the
anywidget model: no JupyterLab is needed to check what the bundle renders."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from rapidfire_nb.engine.events import read_events
from rapidfire_nb.notebook._panel_protocol import PROTOCOL_VERSION, batch_events

# this folder's conftest (its bundle check), by path: tests/conftest.py is also a "conftest"
_spec = importlib.util.spec_from_file_location("rf_browser_conftest", Path(__file__).with_name("conftest.py"))
_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_conftest)
BUNDLE, ensure_bundle = _conftest.BUNDLE, _conftest.ensure_bundle

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
    page.route(f"{ORIGIN}/index.html", lambda r: r.fulfill(body=html, content_type="text/html"))
    page.route(f"{ORIGIN}/panel.js", lambda r: r.fulfill(path=str(BUNDLE), content_type="text/javascript"))
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
        assert notice.inner_text() == ("worker w1 lost (node 192.0.2.2): runs 1, 2 continue from their last "
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
