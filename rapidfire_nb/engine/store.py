"""On-disk layout of an experiment and atomic writes.

    <experiment_path>/<experiment_name>/
        experiment.json          name, seed, num_chunks, data fingerprints, version
        runs.json                every run record (config, status, counters)
        events.jsonl             the append-only event log
        checkpoints/run_<id>/state.pt   latest chunk-boundary checkpoint of a run
        logs/run_<id>.log        transformers/TRL output of a run
        outputs/run_<id>/        TRL's output_dir (nothing is saved there by the engine)

Every file is written aside, fsynced and renamed over the old one, so a crash at any instant
leaves the previous consistent version.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
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


def atomic_write_bytes(path: Path, data: bytes, writer=None) -> None:
    """Write ``data`` to ``path`` atomically. ``writer(f, data)`` may replace the plain write."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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

    def log_path(self, run_id: int) -> Path:
        return self.root / "logs" / f"run_{run_id}.log"

    def output_dir(self, run_id: int) -> Path:
        return self.root / "outputs" / f"run_{run_id}"

    def save_checkpoint(self, run_id: int, state: dict) -> int:
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        atomic_write_bytes(self.checkpoint_path(run_id), data)
        return len(data)

    def load_checkpoint(self, run_id: int) -> dict | None:
        import torch

        path = self.checkpoint_path(run_id)
        if not path.exists():
            return None
        return torch.load(path, map_location="cpu", weights_only=False)

    def delete_checkpoints(self, run_id: int) -> None:
        shutil.rmtree(self.checkpoint_path(run_id).parent, ignore_errors=True)
