"""Where the engine's own warnings and library log records go: the experiment's log file.

The engine thread and the checkpoint writer must never print into a notebook cell. Their threads
are registered here while they run; a warning raised in one goes to its log file, and a record of
the libraries the engine drives (transformers, TRL, PEFT, accelerate, datasets) logged in one goes
to that file instead of the console. Other threads keep the normal behaviour.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from typing import Any

LIBRARY_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets")

_ENGINE_THREADS: dict[int, Any] = {}
_original_showwarning = warnings.showwarning


def _thread_aware_showwarning(message, category, filename, lineno, file=None, line=None):
    sink = _ENGINE_THREADS.get(threading.get_ident())
    if sink is not None:
        try:
            sink.write(warnings.formatwarning(message, category, filename, lineno, line))
            sink.flush()
        except Exception:
            pass
        return
    _original_showwarning(message, category, filename, lineno, file, line)


class _EngineThreadFilter(logging.Filter):
    """Keeps library log records emitted by engine threads off the console handlers."""

    def filter(self, record):
        return threading.get_ident() not in _ENGINE_THREADS


def install_output_routing():
    if warnings.showwarning is not _thread_aware_showwarning:
        warnings.showwarning = _thread_aware_showwarning
    for name in LIBRARY_LOGGERS + ("",):
        lg = logging.getLogger(name)
        for h in lg.handlers:
            if not any(isinstance(f, _EngineThreadFilter) for f in h.filters):
                h.addFilter(_EngineThreadFilter())


@contextlib.contextmanager
def routed_to(sink):
    """The calling thread's warnings go to ``sink`` (a text file) while inside."""
    me = threading.get_ident()
    _ENGINE_THREADS[me] = sink
    try:
        yield
    finally:
        _ENGINE_THREADS.pop(me, None)


# Deleting a run's adapter while it is the active one is routine here, not a user mistake.
warnings.filterwarnings("ignore", message=r"Adapter \S+ was active which is now deleted")
