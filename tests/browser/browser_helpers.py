"""Helpers shared by the browser tests: a polling wait that screenshots the page on timeout, a
one-cell notebook, an experiment's event log read from disk, and readers of what the panel shows."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import nbformat

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"


def wait_until(predicate, timeout: float, what: str, page=None, interval: float = 0.5, *,
               screenshot: str = "timeout.png", full_page: bool = False, lab=None):
    """``predicate()``'s first truthy value, polled every ``interval`` s for ``timeout`` s. On a
    timeout the error carries what the page shows (``page_state``), so a CI failure explains itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    if page is not None:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / screenshot), full_page=full_page)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{page_state(page, lab)}")
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def page_state(page, lab=None) -> str:
    """What a timed-out wait saw: open dialogs, the kernel's status, each cell's prompt and output,
    the browser console's last lines and (given the ``lab`` fixture) the server log's tail."""
    parts = []
    try:
        for text in page.locator(".jp-Dialog").all_inner_texts():
            parts.append(f"dialog: {text[:300]!r}")
        indicator = page.locator(".jp-Notebook-ExecutionIndicator")
        if indicator.count():
            parts.append(f"kernel: {indicator.first.get_attribute('data-status')}")
        cells = page.locator(".jp-Cell")
        for i in range(cells.count()):
            prompt = cells.nth(i).locator(".jp-InputPrompt").inner_text()
            output = cells.nth(i).locator(".jp-OutputArea").inner_text()
            parts.append(f"cell {i} {prompt.strip()} output: {output[-1500:]!r}")
    except Exception as exc:  # the page itself may be what broke
        parts.append(f"(page unreadable: {exc})")
    console = getattr(page, "console_log", [])
    if console:
        parts.append("console:\n  " + "\n  ".join(console[-15:]))
    if lab is not None:
        parts.append("server log:\n" + lab.log_tail(2000))
    return "\n".join(parts)


def waiter(screenshot: str, interval: float = 0.5, full_page: bool = False):
    """A ``wait_until`` with this test file's screenshot name and polling interval."""
    return functools.partial(wait_until, screenshot=screenshot, full_page=full_page,
                             interval=interval)


def dismiss_dialogs(page, seen: list | None = None) -> None:
    """A loaded machine sometimes gets a JupyterLab dialog over a freshly opened notebook (the
    kernel picker while the kernel specs are still loading, "file changed on disk" after a slow
    first save); it takes the clicks meant for the notebook. Accept it (keeping its text in
    ``seen``) so the test goes on as a user would."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.first.is_visible():
        if seen is not None:
            seen.append((dialog.first.text_content() or "")[:200])
        dialog.first.locator(".jp-mod-accept").first.click()
        dialog.first.wait_for(state="hidden", timeout=10_000)


def write_notebook(root: Path, name: str, filename: str, code: str) -> Path:
    """A one-cell notebook ``root/filename`` running ``code`` with ``{name}`` as the experiment."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code.replace("{name}", name))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = root / filename
    nbformat.write(nb, path)
    return path


def experiment_events(root: Path, name: str) -> list[dict]:
    """The event log of experiment ``name`` under ``root/experiments``, up to a line being written."""
    path = root / "experiments" / name / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return out


def trace_points(page, chart: str) -> dict[str, int]:
    """Points per curve (keyed "run <id>") that one of the panel's charts drew last (its canvas's
    inspection hook, js/src/canvaschart.ts)."""
    return page.evaluate(
        """(chart) => {
            const div = document.querySelector(`[data-testid=rf-chart-${chart}]`);
            const out = {};
            for (const t of (div && div.rfInspect ? div.rfInspect().series : [])) out[`run ${t.runId}`] = t.x.length;
            return out;
        }""",
        chart,
    )


def row_status(page, run_id: int) -> str | None:
    """The status the panel's runs table shows for ``run_id`` (None while the row is absent)."""
    loc = page.locator(f'[data-testid=rf-runs] tr[data-run-id="{run_id}"]')
    return loc.get_attribute("data-status") if loc.count() else None


def _settled(page, quiet: float = 3.0, timeout: float = 120.0) -> None:
    """Wait until no dialog is open and the kernel has been idle for ``quiet`` s on end. Accepting
    JupyterLab's kernel picker changes the kernel: a cell run before the new one is up is sent to
    the old one, shut down moments later, and its prompt goes back to blank with nothing run."""
    deadline = time.monotonic() + timeout
    idle_since = None
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog")
        indicator = page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        if (dialog.count() and dialog.first.is_visible()) or not indicator.count():
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= quiet:
            return
        time.sleep(0.2)
    raise AssertionError(f"the notebook did not settle (no dialog, kernel idle) within {timeout:.0f} s\n{page_state(page)}")


def run_cell(page, index: int = 0, key: str = "Control+Enter", seen: list | None = None,
             click: bool = False) -> None:
    """Run cell ``index`` from the keyboard, its editor focused without scrolling the notebook.

    A keypress that lands before the editor has focus, or while a dialog is up, is lost; and a
    dialog that appears late (the kernel picker while the kernel specs load) changes the kernel
    once accepted. So: accept any dialog, wait for the kernel to settle after one, press, and
    check that execution started and was not dropped (the prompt back to blank) a moment later.
    ``click``: click the editor (which scrolls the cell into view) instead of focusing it in place."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    before = prompt.inner_text()

    def started() -> bool:
        now = prompt.inner_text()
        return now != before and ("[*]" in now or any(ch.isdigit() for ch in now))

    for _ in range(4):
        dialog = page.locator(".jp-Dialog")
        if dialog.count() and dialog.first.is_visible():
            dismiss_dialogs(page, seen)
            _settled(page)
        if click:
            cell.locator(".jp-InputArea-editor").click()
        else:
            cell.locator(".cm-content").evaluate("(el) => el.focus({ preventScroll: true })")
        page.keyboard.press(key)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not started():
            time.sleep(0.2)
        if not started():
            continue
        # a late dialog or a kernel change in the next moments drops the request: look once more
        time.sleep(2.0)
        if started() and not (dialog.count() and dialog.first.is_visible()):
            return
        before = prompt.inner_text()
    raise AssertionError(f"cell {index} did not start executing\n{page_state(page)}")


def run_first_cell(page) -> None:
    """Shift+Enter in the first cell (run and select the next), checked as ``run_cell`` does."""
    run_cell(page, 0, key="Shift+Enter")


# The picture of the panel in the README and on the docs site is this test's own screenshot, so it
# cannot drift from what the panel shows: RF_UPDATE_SCREENSHOT=1 writes it, and otherwise a
# committed picture whose size is no longer the panel's (other rows, header lines, columns) fails.
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "pages" / "img"
DOCS_SCREENSHOTS = (Path(__file__).resolve().parents[2] / ".github" / "panel.png", DOCS_IMG / "panel.png")
SCREENSHOT_TOLERANCE_PX = 24   # a curve's tick label or a number's width, not a layout change


def png_size(path: Path) -> tuple[int, int]:
    import struct

    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def check_docs_screenshot(taken: Path, targets: tuple[Path, ...] = DOCS_SCREENSHOTS) -> None:
    """Write (RF_UPDATE_SCREENSHOT=1) or check the committed docs screenshots ``targets`` against
    ``taken``."""
    import os
    import shutil

    if os.environ.get("RF_UPDATE_SCREENSHOT") == "1":
        for path in targets:
            shutil.copyfile(taken, path)
        return
    pictures = {p.read_bytes() for p in targets}
    assert len(pictures) == 1, f"{', '.join(map(str, targets))} differ: all are this test's screenshot"
    now, committed = png_size(taken), png_size(targets[0])
    assert all(abs(a - b) <= SCREENSHOT_TOLERANCE_PX for a, b in zip(now, committed)), (
        f"the panel now screenshots at {now[0]}x{now[1]} px, the README's picture is {committed[0]}x{committed[1]}: "
        f"run this test with RF_UPDATE_SCREENSHOT=1 to write the new one ({taken})")
