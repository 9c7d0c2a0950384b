"""How an experiment ends: wait for its runs with visible progress, or stop them cleanly.

Called by ``Experiment.end`` in the user's thread, never in the engine's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from rapidfire_nb.engine import runs as R

# the run_status reason that tells a resumed experiment these runs are to continue
ENDED_REASON = "experiment ended before the run finished"


def _progress(engine) -> tuple[int, int, int]:
    live = [r for r in engine.snapshot().values() if r.status != R.DELETED]
    active = sum(r.status in R.ACTIVE for r in live)
    done = sum(r.completed_steps - r.step_offset for r in live)
    total = sum(r.total_steps - r.step_offset for r in live)
    return active, done, total


def wait_with_progress(engine, stream=None, every_s: float = 5.0) -> bool:
    """Block until no run is pending or running, printing one progress line when it changes (at
    most every ``every_s`` seconds). False if the engine thread died with runs still active."""
    stream = stream if stream is not None else sys.stdout
    last_line, last_t = None, 0.0
    if not engine.busy():
        return True
    while True:
        active, done, total = _progress(engine)
        line = (f"end(): waiting for {active} run(s) to finish: {done}/{total} steps done" if active
                else "end(): applying the queued ops")
        now = time.monotonic()
        if last_line is None or (line != last_line and now - last_t >= every_s):
            # a run with a huge max_steps can keep end() here for a very long time: say how out
            hint = " (interrupt and call end(wait=False) to stop the runs at their next chunk boundary)"
            print(line + (hint if last_line is None and active else ""), file=stream, flush=True)
            last_line, last_t = line, now
        if engine.wait(timeout=1.0):
            break
        if not engine.thread_alive() and not engine.ops_pending():
            return False    # nothing will move these runs; end() stops them
    active, done, total = _progress(engine)
    what = "every run finished" if done >= total else "no run left training (the others were stopped)"
    print(f"end(): {what} ({done}/{total} steps)", file=stream, flush=True)
    return True


def interruptible(wait: Callable[[], Any]) -> Any:
    """``wait()`` run in a helper thread while this one waits on an Event. An interrupt (Ctrl-C,
    Kernel > Interrupt) then lands in ``Event.wait``, which it leaves intact; landing inside
    ``Thread.join`` instead, CPython 3.11 can mark the engine's thread stopped while it still runs
    (its tstate lock is released by the interrupted join), and every later wait believes the
    engine dead. The helper finishes on its own once the engine is idle."""
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = wait()
        except BaseException as exc:   # handed to the caller's thread
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="rapidfire-wait", daemon=True).start()
    while not finished.wait(0.2):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
