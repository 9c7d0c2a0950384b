"""Atomic file writes: the one writer every JSON/metadata/checkpoint file of the package goes
through (experiment.json, runs.json, automl.json, tracker state, checkpoints).

A file is written aside (``.<name>.tmp-<pid>-<thread id>``), fsynced, renamed over the old one,
and its directory fsynced, so a crash at any instant leaves the previous version or the new one.
A failed write removes its temporary file and leaves the previous version in place; a crash can
leave a temporary file behind (``ExperimentStore`` removes its own at open).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

TMP_MARK = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """mkdir -p, fsyncing each new directory's parent so the new entry survives a power cut."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    if not missing:
        return
    path.mkdir(parents=True, exist_ok=True)
    for d in reversed(missing):
        fsync_dir(d.parent)


def tmp_path_for(path: Path) -> Path:
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{threading.get_ident()}")


def atomic_write_bytes(path: Path, data: bytes, writer=None) -> None:
    """Write ``data`` to ``path`` atomically. ``writer(f, data)`` may replace the plain write.

    On any error the temporary file is removed, ``path`` keeps its previous content, and the
    error propagates.
    """
    path = Path(path)
    _make_dirs(path.parent)
    tmp = tmp_path_for(path)
    try:
        # a leftover of this very process and thread (or a planted link) goes first; the file is
        # then created afresh, never opened through a link (rename replaces a link at ``path``
        # itself, not what it points at)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        with open(tmp, "wb", opener=_create_new) as f:
            (writer or _plain_write)(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def _create_new(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)


def _plain_write(f, data: bytes) -> None:
    f.write(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True, default=repr).encode())
