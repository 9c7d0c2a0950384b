"""The kernel's experiments: the current one (what ``%rapidfire`` and the RapidFire compat calls
mean), every training engine of this process, and the one-engine guard of ``run_fit``.

The engine, not the Experiment, is what keeps training: a re-run cell rebinds ``exp``, and the
old Experiment object may be collected while its engine trains. So engines are kept here (weakly)
with their experiment's name.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
import weakref
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import RapidFireError
from rapidfire_nb.experiment_view import view_of

_current: weakref.ref | None = None
# every open (not ended) Experiment that holds a folder, by its folder: what a "locked" message
# names, and what `%rapidfire end NAME` closes when nothing trains
_OPEN: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


def current_experiment():
    """The most recently created (or trained), not yet ended Experiment of this process."""
    exp = _current() if _current is not None else None
    return exp if exp is not None and not exp.ended else None


def make_current(exp) -> None:
    global _current
    _current = weakref.ref(exp)


def forget(exp) -> None:
    """``exp`` ended: it is no longer the current experiment."""
    global _current
    if _current is not None and _current() is exp:
        _current = None


def opened(exp) -> None:
    """``exp`` holds its folder (``exp.path``) from now until ``closed(exp)``."""
    _OPEN[str(exp.path)] = exp


def closed(exp) -> None:
    if _OPEN.get(str(exp.path)) is exp:
        del _OPEN[str(exp.path)]


def holder_of(path) -> object | None:
    """The open Experiment of this kernel that holds folder ``path``, or None."""
    exp = _OPEN.get(str(path))
    return exp if exp is not None and not exp.ended else None


def open_experiment(name: str):
    """The newest open Experiment of this kernel called ``name``, or None."""
    found = [exp for exp in list(_OPEN.values()) if exp.name == name and not exp.ended]
    return found[-1] if found else None


def training_as(parent, name: str):
    """The Experiment of this kernel that was asked for as ``Experiment(name, parent)`` and still
    trains (a re-run cell's), or None."""
    for _n, _engine, exp in training_engines():
        if exp is not None and getattr(exp, "asked_as", None) == (str(parent), name):
            return exp
    return None


def still_training(parent, name: str):
    """A re-run cell (``exp = Experiment("x"); exp.run_fit(...)``) while "x" still trains in this
    kernel: that Experiment, with one printed line, so that ``exp`` stays the one that trains
    instead of an empty "x_2" whose run_fit the one-engine guard would refuse; else None."""
    training = training_as(parent.resolve(), name)
    if training is not None:
        print(f"rapidfire: experiment {name!r} is still training in this kernel, so "
              "Experiment(...) returned it (its panel, results and ops work as before). To start "
              f"a new one, end it first: {how_to_free(training.name)}")
    return training


def claim(parent, name: str, resume: bool):
    """Take the folder (``rapidfire_nb.folder.claim``); a lock held by another Experiment of this
    kernel is refused with the call that frees it."""
    from rapidfire_nb.engine import ExperimentLocked
    from rapidfire_nb.folder import claim as claim_folder

    try:
        c = claim_folder(parent, name, resume)
    except ExperimentLocked as exc:
        holder = holder_of((parent / name).resolve())
        if holder is None:
            raise
        raise ExperimentLocked(f"{exc}. It is experiment {holder.name!r} of this kernel: free it with "
                               f"{how_to_free(holder.name)}") from None
    tensorboard_link(c.path)
    return c


def tensorboard_link(exp_path) -> Path:
    """``<experiments path>/tensorboard_logs/<name>``, RapidFire AI's TensorBoard folder of an
    experiment, as a link to ours (``<experiments path>/<name>/tensorboard``, where the
    TensorBoard tracker writes ``run <id>/``), made if missing; so code written for RapidFire finds
    the event files where it looks for them, from the moment the experiment exists."""
    exp_path = Path(exp_path)
    target = exp_path / "tensorboard"
    link = exp_path.parent / "tensorboard_logs" / exp_path.name
    try:
        # a file in the way (a folder shared with one there) is the TensorBoard tracker's to
        # refuse when it is asked to write; opening the experiment does not need the folder
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        warnings.warn(f"could not make {target} ({exc}); it was left as it is, and "
                      f"{link} is not linked to it", stacklevel=3)
        return link
    # relative, so the link still holds when the experiments folder is moved or copied
    relative = Path(os.pardir, exp_path.name, "tensorboard")
    if link.is_symlink() and Path(os.readlink(link)) in (relative, target):
        return link
    if link.exists() or link.is_symlink():
        if link.resolve() != target.resolve():
            warnings.warn(f"{link} exists and is not this experiment's TensorBoard folder ({target}); "
                          "it was left as it is", stacklevel=3)
        return link
    if link.parent.is_symlink():
        # a tensorboard_logs planted as a link would put our link in whatever folder it names
        warnings.warn(f"{link.parent} is a symbolic link (to {os.readlink(link.parent)!r}); nothing "
                      f"was made through it: point TensorBoard at {target}", stacklevel=3)
        return link
    try:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(relative, target_is_directory=True)
    except OSError as exc:   # Windows without the symlink privilege, a file in the way, ...
        warnings.warn(f"could not link {link} to {target} ({exc}); point TensorBoard at {target}",
                      stacklevel=3)
    return link


def tensorboard_unlink(exp_path) -> None:
    """Undo ``tensorboard_link`` for a folder given back before anything was logged: the link, and
    the TensorBoard folder while it is empty (the claim removes the experiment folder it made
    only when nothing is left in it)."""
    exp_path = Path(exp_path)
    target = exp_path / "tensorboard"
    link = exp_path.parent / "tensorboard_logs" / exp_path.name
    with contextlib.suppress(OSError):
        if link.is_symlink() and Path(os.readlink(link)) in (Path(os.pardir, exp_path.name, "tensorboard"), target):
            link.unlink()
    for folder in (target, link.parent):
        with contextlib.suppress(OSError):
            folder.rmdir()   # only when empty


def how_to_free(name: str) -> str:
    """The calls that end experiment ``name`` of this kernel, as the messages name them."""
    # end() alone would wait for every run to train to its last step: the call that frees the
    # device now is end(wait=False)
    return (f"`%rapidfire end {name}` (or .end(wait=False) on that Experiment: its runs stop at "
            "their next chunk boundary, checkpoints kept)")


def register_engine(engine, name: str, exp) -> None:
    """``engine`` trains experiment ``name`` (whose Experiment object is ``exp``)."""
    with _ENGINES_LOCK:
        _ENGINES[engine] = (name, weakref.ref(exp))


def training_engines() -> list[tuple[str, Any, Any]]:
    """(name, engine, its Experiment or None if that was collected) for each engine of this
    process that still has runs pending or running (or ops queued), oldest first."""
    with _ENGINES_LOCK:
        engines = list(_ENGINES.items())
    out = []
    for engine, (name, ref) in engines:
        try:
            if not engine.closed and engine.busy():
                out.append((name, engine, ref()))
        except Exception:   # an engine half torn down trains nothing
            continue
    return out


def training_experiments() -> list[str]:
    """Names of this process's experiments that still train, oldest first."""
    return [name for name, _engine, _exp in training_engines()]


def end_training(name: str | None = None) -> list[str]:
    """End (as ``end(wait=False)``: unfinished runs stop at their next chunk boundary, resumable)
    the experiment called ``name`` that trains in this process, or every one when ``name`` is
    None; returns the names ended. An engine whose Experiment object is gone is stopped the same
    way."""
    from rapidfire_nb.engine import ENDED_REASON

    ended = []
    for n, engine, exp in training_engines():
        if name is not None and n != name:
            continue
        if exp is not None:
            exp.end(wait=False)
        else:
            engine.drain()
            engine.end_unfinished(ENDED_REASON)
            engine.close()
        ended.append(n)
    return ended


def refuse_while_another_trains(me) -> None:
    """run_fit's guard: one engine per device unless asked (``allow_concurrent=True``). Any other
    Experiment counts, one of the same name in another folder too."""
    training = [(n, exp) for n, _engine, exp in training_engines() if exp is not me]
    busy = [n for n, _exp in training]
    if not busy:
        return
    # The refused Experiment (the re-run cell's) trains nothing: `%rapidfire status`, `panel` and
    # a bare `%rapidfire end` keep meaning the one that trains, not this empty one.
    newest = next((exp for _n, exp in reversed(training) if exp is not None), None)
    if newest is not None:
        make_current(newest)
    listed = ", ".join(repr(n) for n in busy)
    ends = " and ".join(f"%rapidfire end {n}" for n in busy)
    raise RapidFireError(
        f"experiment {listed} is still training in this kernel; a second engine would share the "
        f"device with it (or its Ray workers' GPUs). End it first with `{ends}` (or .end(wait=False) "
        "on it: runs stop at their next chunk boundary, resumable), then run this cell again; or "
        "pass run_fit(..., allow_concurrent=True) to train both at once. Until then %rapidfire "
        f"status and %rapidfire panel show {busy[-1]!r}.")


# -- cells queued behind a RapidFire-style run_fit ---------------------------------------------
# RapidFire AI's run_fit blocks until every run is done, so the cells its notebooks put after it
# read final results and files. Ours returns at once in a kernel (the panel's clicks reach the
# kernel only between cells), so for an experiment written as RapidFire code writes it
# (``mode="fit"`` given: RapidFire's default mode is "evals"), a cell that was already queued
# behind the run_fit cell -- Run All, or a cell started while run_fit's still ran -- starts once the
# runs are done, as it would there. A cell run by hand after run_fit returned starts at once.

# Queued cells follow one another with no wait (the kernel takes the next request at once; a
# client that sends one cell at a time, as nbclient and Colab do, needs a round trip), where a
# person runs the next cell after reading the output: at least a second.
QUEUED_GAP_S = 1.0


class _Cells:
    installed: weakref.ref | None = None   # the shell whose events are watched
    fit_cell: weakref.ref | None = None    # the experiment whose run_fit ran in this cell
    chain: weakref.ref | None = None       # the experiment the queued cells follow
    last_end: float | None = None          # when the last cell ended (time.monotonic)


def follow_fit(exp) -> None:
    """``exp.run_fit`` returned in the cell running now: cells queued behind this cell wait for
    its runs (see above). Only in an IPython kernel; elsewhere nothing is queued."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or getattr(shell, "events", None) is None:
        return
    if _Cells.installed is None or _Cells.installed() is not shell:
        shell.events.register("pre_run_cell", _pre_run_cell)
        shell.events.register("post_run_cell", _post_run_cell)
        _Cells.installed = weakref.ref(shell)
    _Cells.fit_cell = weakref.ref(exp)


def _post_run_cell(result=None) -> None:
    import time

    if not getattr(getattr(result, "info", None), "store_history", True):
        return   # a front end's own request (variable viewers, completions): not a cell
    if _Cells.fit_cell is not None:
        _Cells.chain, _Cells.fit_cell = _Cells.fit_cell, None
    _Cells.last_end = time.monotonic()


def _pre_run_cell(info=None) -> None:
    import time

    if not getattr(info, "store_history", True):
        return   # a front end's own request, never held: it neither waits nor ends the chain
    chain, _Cells.chain = _Cells.chain, None   # a cell that was not queued ends the chain
    if chain is None or _Cells.last_end is None or time.monotonic() - _Cells.last_end > QUEUED_GAP_S:
        return
    exp = chain()
    if exp is None:
        return
    view = view_of(exp)
    if view.ended or not view.fit_started:
        return
    _Cells.chain = chain   # this cell was queued: so is the next one, if it follows at once
    try:
        if not view.busy(timeout=1.0):
            return
        print(f"rapidfire: this cell was queued behind run_fit (Run All), so it starts once the runs "
              f"of {view.name!r} are done, as after RapidFire's run_fit. Kernel > Interrupt starts it "
              "now: the runs go on training and the panel steers them.", flush=True)
        if not exp.wait():
            _Cells.chain = None   # interrupted: this cell and those queued after it run now
    except KeyboardInterrupt:
        # an interrupt outside the wait itself (while busy() takes the engine's lock) means the
        # same; IPython would print it as a failed callback and keep the later cells waiting
        _Cells.chain = None
        print(view.interrupted_line(), flush=True)
