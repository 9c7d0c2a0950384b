"""The HTML report in real headless Chromium: its charts render from the one file, with no
console error and no request beyond the file itself (Playwright's request log)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "events"


def _report(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(FIXTURES / f"{name}.jsonl", folder / "events.jsonl")
    out = tmp_path / f"{name}.html"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", str(folder), "-o", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("name", ["pruned", "clone_delete"])
def test_report_renders_offline_without_errors(browser, tmp_path, name):
    report = _report(tmp_path, name)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1,
                                  offline=True)
    page = context.new_page()
    requests: list[str] = []
    console: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(report.as_uri())
        expected = report.read_text().count("Plotly.newPlot")
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {expected}",
                               timeout=60_000)
        plots = page.evaluate("""() => [...document.querySelectorAll('.js-plotly-plot')].map(d => ({
            id: d.id, traces: (d.data || []).length,
            drawn: d.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length}))""")
        assert len(plots) == expected >= 4
        curves = [p for p in plots if p["id"].startswith("curve-")]
        assert curves and all(p["drawn"] == p["traces"] > 0 for p in curves), plots
        timeline = next(p for p in plots if p["id"] == "timeline")
        assert timeline["drawn"] == timeline["traces"] > 0
        # the leaderboard is a table with one row per run
        rows = page.locator("table tbody tr").count()
        assert rows >= 3
        # nothing in the report, the leaderboard included, is wider than a 1280 px window
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 1280, f"the report is {width} px wide in a 1280 px window"
        shots = os.environ.get("RF_REPORT_SHOTS")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(shots) / f"report_{name}.png"), full_page=False)
            page.locator("#curve-eval-0").scroll_into_view_if_needed()
            page.locator("#curve-eval-0").hover(position={"x": 400, "y": 200})
            page.screenshot(path=str(Path(shots) / f"report_{name}_curves.png"), full_page=False)
    finally:
        context.close()
    assert requests == [report.as_uri()], requests
    assert console == [] and dialogs == []
