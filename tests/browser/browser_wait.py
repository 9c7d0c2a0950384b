"""One polling helper for the browser tests: wait for a condition, screenshot the page on timeout."""

from __future__ import annotations

import functools
import time
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "browser"


def wait_until(predicate, timeout: float, what: str, page=None, interval: float = 0.5, *,
               screenshot: str = "timeout.png", full_page: bool = False):
    """``predicate()``'s first truthy value, polled every ``interval`` s for ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    if page is not None:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / screenshot), full_page=full_page)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def waiter(screenshot: str, interval: float = 0.5, full_page: bool = False):
    """A ``wait_until`` with this test file's screenshot name and polling interval."""
    return functools.partial(wait_until, screenshot=screenshot, full_page=full_page,
                             interval=interval)
