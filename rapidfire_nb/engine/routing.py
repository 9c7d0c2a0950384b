"""Where the engine's own warnings and library log records go: the experiment's log file.

The engine thread and the checkpoint writer must never print into a notebook cell. A thread does
its engine work inside ``routed_to(log_file)``: a warning raised there goes to the log file, and
the console handlers of the root logger and of the libraries the engine drives (transformers, TRL,
PEFT, accelerate, datasets) skip records that thread logs. Other threads keep the normal behaviour.

Nothing is installed at import. The ``warnings.showwarning`` hook and the handler filters are put
in place when the first thread enters ``routed_to`` and taken out when the last one leaves, so a
kernel whose experiments are idle or ended carries nothing of ours.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import warnings
from typing import Any

LIBRARY_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets")

# Warnings that are routine in the engine's own work, not worth a line in its log: deleting a
# run's adapter while it is the active one (every release of a LoRA run).
_ROUTINE = (re.compile(r"Adapter \S+ was active which is now deleted"),)

# the stdlib's own, for a call that reaches ours after we uninstalled (a restored copy of it)
_default_showwarning = getattr(warnings, "_showwarning_orig", warnings.showwarning)
_lock = threading.Lock()
_sinks: dict[int, Any] = {}          # thread id -> the text file its warnings go to (None: dropped)
_NOT_ROUTED = object()
_previous_showwarning = None         # what was there when we installed ours
_filtered: list[tuple[logging.Handler, logging.Filter]] = []


def _showwarning(message, category, filename, lineno, file=None, line=None):
    sink = _sinks.get(threading.get_ident(), _NOT_ROUTED)
    if sink is _NOT_ROUTED:
        previous = _previous_showwarning or _default_showwarning
        return previous(message, category, filename, lineno, file, line)
    if any(p.search(str(message)) for p in _ROUTINE):
        return
    if sink is None:
        return
    try:
        sink.write(warnings.formatwarning(message, category, filename, lineno, line))
        sink.flush()
    except Exception:
        pass


class _EngineThreadFilter(logging.Filter):
    """Keeps log records emitted by routed threads off the console handlers."""

    def filter(self, record):
        return threading.get_ident() not in _sinks


def _install() -> None:
    global _previous_showwarning
    if warnings.showwarning is not _showwarning:
        _previous_showwarning = warnings.showwarning
        warnings.showwarning = _showwarning
    for name in ("",) + LIBRARY_LOGGERS:
        for handler in logging.getLogger(name).handlers:
            flt = _EngineThreadFilter()
            handler.addFilter(flt)
            _filtered.append((handler, flt))


def _uninstall() -> None:
    global _previous_showwarning
    if warnings.showwarning is _showwarning:
        warnings.showwarning = _previous_showwarning
    # else someone replaced it since (e.g. warnings.catch_warnings restoring its own): leave it;
    # ours, if restored later, passes every other thread's warning on to what was there before
    _previous_showwarning = None
    for handler, flt in _filtered:
        handler.removeFilter(flt)
    _filtered.clear()


@contextlib.contextmanager
def routed_to(sink):
    """The calling thread's warnings go to ``sink`` (a text file; None drops them), and its library log records stay
    off the console, while inside. Re-entrant per thread (the inner sink wins until it leaves)."""
    me = threading.get_ident()
    with _lock:
        if not _sinks:
            _install()
        outer = _sinks.get(me, _NOT_ROUTED)
        _sinks[me] = sink
    try:
        yield
    finally:
        with _lock:
            if outer is _NOT_ROUTED:
                _sinks.pop(me, None)
            else:
                _sinks[me] = outer
            if not _sinks:
                _uninstall()


def is_installed() -> bool:
    """True while some thread is routed (the hook and the filters are in place)."""
    with _lock:
        return bool(_sinks)
