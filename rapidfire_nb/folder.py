"""The experiment folder an Experiment trains in: claimed (its name chosen, its lock taken, its
log opened) and, when a new experiment's first run_fit is refused, given back as it was.

Plain values in (the parent folder, the name asked for, whether to resume), a ``Claim`` out;
nothing here sees the Experiment. ``open_read_only`` opens one for reading alone.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rapidfire_nb._version import __version__
from rapidfire_nb.engine import (EventLog, ExperimentStore, FolderLock, atomic_write_json,
                                 check_experiment_meta, read_json)
from rapidfire_nb.errors import ConfigError


@dataclass
class Claim:
    name: str             # the folder's name: the one asked for, or <name>_N for a new experiment
    path: Path            # the folder, resolved
    store: Any            # its ExperimentStore
    lock: Any             # its FolderLock, held
    events: Any           # its EventLog, open
    meta: dict            # experiment.json as read (a resumed folder), else {}
    made: bool            # this claim made the folder
    resumed: bool
    made_files: tuple = ()   # the files this claim created (give_back removes these only)


def claim(parent: Path, name: str, resume: bool) -> Claim:
    """Take ``<parent>/<name>``: a new experiment whose folder holds one already moves to
    ``<name>_2``, ``_3``... (one printed line); its lock; its log. A new experiment's folder gets
    ``experiment.json``, the empty log and the lock, and nothing else until its run_fit has
    checked everything (``give_back`` if it refuses). A resumed folder is not written until then
    (its ``.lock`` aside, which notes who holds it): a refused resume leaves every other byte as
    it was. ``ExperimentLocked`` when another
    Experiment holds the folder (nothing is left behind)."""
    from rapidfire_nb.engine import refuse_links, refuse_special_files
    from rapidfire_nb.launch.resume import refuse_lost_history

    root = parent / name
    if resume and not (root / "experiment.json").exists():
        raise ConfigError(f"resume=True but there is no experiment at {root}")
    if not resume and _holds_experiment(root):
        # a re-executed cell must not mix two experiments in one folder
        n = 2
        while _holds_experiment(parent / _numbered(name, n)):
            n += 1
        # one short line in the cell (a re-run cell is normal), not a warning with a temp path
        print(f"rapidfire: experiment {name!r} exists; this one is "
              f"{_numbered(name, n)!r} (resume=True continues {name!r})")
        name = _numbered(name, n)
        root = parent / name
    # a link anywhere in the folder could make a read or a write land outside it
    refuse_links(root)
    # and a pipe or a device node, which a resumed run's checkpoint read or the engine's log
    # open would wait on for ever or die on after run_fit returned
    refuse_special_files(root)
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    path = root.resolve()
    store = ExperimentStore(path)
    lock_was_there = (path / ".lock").exists()
    # the folder's owner from here to end(): nothing below may write before this
    try:
        lock = FolderLock(path).acquire()
    except BaseException:
        if made:
            _remove_dir_if_empty(path)
        raise
    log_was_there = store.events_path.exists()
    try:
        meta = check_experiment_meta(read_json(store.meta_path, {}), store.meta_path) if resume else {}
        if resume:
            refuse_lost_history(store)
        events = EventLog(store.events_path)
    except BaseException:
        lock.release()
        if not lock_was_there:   # refused: no lock file left behind either
            with contextlib.suppress(OSError):
                lock.path.unlink()
        if made:
            _remove_dir_if_empty(path)
        raise
    if not resume:
        atomic_write_json(store.meta_path, {"name": name, "version": __version__})
    made_files = () if resume else tuple(
        f for f, was in ((store.meta_path, False), (store.events_path, log_was_there)) if not was)
    return Claim(name, path, store, lock, events, meta, made, resume, made_files)


def _holds_experiment(root: Path) -> bool:
    """What makes a folder an experiment's, for a new one to move aside: either of the two files
    an experiment writes first (a folder holding only a log is one too: ``Experiment.open``
    reads it)."""
    return (root / "experiment.json").exists() or (root / "events.jsonl").exists()


def _numbered(name: str, n: int) -> str:
    """``<name>_<n>``, the name cut so that the result is still a valid experiment name (one the
    library made must open and resume)."""
    from rapidfire_nb.engine import MAX_NAME

    suffix = f"_{n}"
    return name[:MAX_NAME - len(suffix)] + suffix


def open_read_only(root: Path) -> tuple[Path, Any, dict, Any]:
    """(path, store, meta, log) of an experiment folder opened without writing anything: no
    lock, a ``ReadOnlyLog``; a folder holding a symbolic link is refused."""
    from rapidfire_nb.engine import ReadOnlyLog, refuse_links

    if not (root / "experiment.json").exists() and not (root / "events.jsonl").exists():
        raise ConfigError(f"mode='read' but there is no experiment at {root}")
    refuse_links(root, writing=False)
    path = root.resolve()
    store = ExperimentStore(path)
    meta = check_experiment_meta(read_json(store.meta_path, {}), store.meta_path)
    return path, store, meta, ReadOnlyLog(store.events_path)


def give_back(c: Claim) -> None:
    """A new experiment's run_fit was refused before anything was logged: give back what
    ``claim`` took (the lock, ``experiment.json``, the empty log, the folder if it made it)."""
    c.events.close()
    for path in c.made_files:
        with contextlib.suppress(OSError):
            path.unlink()
    c.lock.release()
    with contextlib.suppress(OSError):
        c.lock.path.unlink()
    if c.made:
        _remove_dir_if_empty(c.path)


def _remove_dir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()
