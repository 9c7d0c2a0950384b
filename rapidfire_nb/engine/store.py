"""On-disk layout of an experiment and atomic writes.

    <experiment_path>/<experiment_name>/
        experiment.json          name, seed, num_chunks, data fingerprints, version
        runs.json                every run record (config, status, counters)
        events.jsonl             the append-only event log
        checkpoints/run_<id>/state.pt        latest chunk-boundary checkpoint of a run
        checkpoints/run_<id>/warm_start.pt   a warm-start clone's initial weights (until its
                                             first checkpoint exists)
        logs/run_<id>.log        transformers/TRL output of a run
        outputs/run_<id>/        TRL's output_dir (nothing is saved there by the engine)

Every file is written aside, fsynced and renamed over the old one, so a crash at any instant
leaves the previous consistent version. A write that fails (disk full, permission) removes its
temporary file and leaves the previous version in place; checkpoint writes then raise
``CheckpointWriteError``, which says so.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import RapidFireError

# Temporary files are ".<name>.tmp-<pid>-<thread id>"; a crash can leave one behind.
_TMP_MARK = ".tmp-"


class CheckpointWriteError(RapidFireError):
    """A checkpoint could not be written; the run's previous checkpoint is intact."""


class CheckpointReadError(RapidFireError):
    """A checkpoint file exists but cannot be loaded."""


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
    return path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}-{threading.get_ident()}")


def atomic_write_bytes(path: Path, data: bytes, writer=None) -> None:
    """Write ``data`` to ``path`` atomically. ``writer(f, data)`` may replace the plain write.

    On any error the temporary file is removed, ``path`` keeps its previous content, and the
    error propagates.
    """
    path = Path(path)
    _make_dirs(path.parent)
    tmp = tmp_path_for(path)
    try:
        with open(tmp, "wb") as f:
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


def _plain_write(f, data: bytes) -> None:
    f.write(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True, default=repr).encode())


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default


class ExperimentStore:
    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def events_path(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.root / "experiment.json"

    @property
    def runs_path(self) -> Path:
        return self.root / "runs.json"

    def checkpoint_path(self, run_id: int) -> Path:
        return self.root / "checkpoints" / f"run_{run_id}" / "state.pt"

    def warm_start_path(self, run_id: int) -> Path:
        return self.root / "checkpoints" / f"run_{run_id}" / "warm_start.pt"

    def log_path(self, run_id: int) -> Path:
        return self.root / "logs" / f"run_{run_id}.log"

    def output_dir(self, run_id: int) -> Path:
        return self.root / "outputs" / f"run_{run_id}"

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, run_id: int, state: dict) -> int:
        """Replace run ``run_id``'s checkpoint atomically; returns its size in bytes.

        Raises ``CheckpointWriteError`` (caused by the OSError) when the file cannot be written;
        the previous checkpoint is then untouched.
        """
        return self._save_torch(run_id, self.checkpoint_path(run_id), state, "checkpoint")

    def load_checkpoint(self, run_id: int) -> dict | None:
        return self._load_torch(self.checkpoint_path(run_id))

    def save_warm_start(self, run_id: int, weights: dict) -> int:
        """Persist a warm-start clone's initial weights, so a crash before its first chunk
        boundary does not lose them (its parent moves on)."""
        return self._save_torch(run_id, self.warm_start_path(run_id), weights, "warm-start weights")

    def load_warm_start(self, run_id: int) -> dict | None:
        return self._load_torch(self.warm_start_path(run_id))

    def delete_checkpoints(self, run_id: int) -> None:
        shutil.rmtree(self.checkpoint_path(run_id).parent, ignore_errors=True)

    def remove_stale_tmp(self) -> list[Path]:
        """Delete temporary files left by a process that died mid-write; returns them."""
        removed = []
        mine = f"{_TMP_MARK}{os.getpid()}-"
        for p in self.root.rglob(f".*{_TMP_MARK}*"):
            if p.is_file() and mine not in p.name:
                try:
                    p.unlink()
                    removed.append(p)
                except OSError:
                    pass
        return removed

    def _save_torch(self, run_id: int, path: Path, obj: Any, what: str) -> int:
        import torch

        buf = io.BytesIO()
        torch.save(obj, buf)
        data = buf.getvalue()
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            raise CheckpointWriteError(
                f"could not write the {what} of run {run_id} to {path} ({len(data)} bytes): "
                f"{exc.strerror or exc}. The previous checkpoint is intact; free disk space or fix "
                f"permissions, then continue with Experiment(..., resume=True)") from exc
        return len(data)

    @staticmethod
    def _load_torch(path: Path) -> Any:
        import torch

        if not path.exists():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:
            raise CheckpointReadError(f"cannot load {path}: {type(exc).__name__}: {exc}") from exc
