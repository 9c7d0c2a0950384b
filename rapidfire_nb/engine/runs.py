"""Run records and the status state machine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.engine.runspec import RunSpec

PENDING, RUNNING, STOPPED, COMPLETED, FAILED, DELETED = (
    "pending", "running", "stopped", "completed", "failed", "deleted")
STATUSES = (PENDING, RUNNING, STOPPED, COMPLETED, FAILED, DELETED)
TERMINAL = (COMPLETED, FAILED, DELETED)
ACTIVE = (PENDING, RUNNING)

# status -> statuses it may move to
TRANSITIONS: dict[str, tuple[str, ...]] = {
    PENDING: (RUNNING, STOPPED, FAILED, DELETED, COMPLETED),
    RUNNING: (PENDING, STOPPED, COMPLETED, FAILED, DELETED),
    STOPPED: (PENDING, DELETED),
    COMPLETED: (DELETED,),
    FAILED: (DELETED,),
    DELETED: (),
}


class IllegalTransition(RuntimeError):
    pass


@dataclass
class RunRecord:
    """Everything the engine tracks about one run (the JSON part is persisted in runs.json)."""

    run_id: int
    spec: RunSpec
    status: str = PENDING
    parent_run_id: int | None = None
    warm_start: bool = False
    changes: dict = field(default_factory=dict)     # clone changes (dotted), to rebuild on resume
    total_steps: int = 0
    steps_per_epoch: int = 0
    completed_steps: int = 0
    step_offset: int = 0          # steps inherited from a warm-start parent (shown, not trained)
    samples_seen: int = 0
    epoch: int = 0                # epoch of the next chunk
    chunk: int = 0                # chunk index (within the epoch) of the next chunk
    chunks_done: int = 0
    error: str | None = None
    stop_requested: bool = False
    last_metrics: dict = field(default_factory=dict)

    @property
    def progress(self) -> int:
        return self.epoch * 10_000 + self.chunk

    def set_status(self, status: str) -> None:
        if status == self.status:
            return
        if status not in TRANSITIONS[self.status]:
            raise IllegalTransition(f"run {self.run_id}: {self.status} -> {status} is not allowed")
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "status": self.status, "parent_run_id": self.parent_run_id,
            "warm_start": self.warm_start, "changes": self.changes,
            "total_steps": self.total_steps, "steps_per_epoch": self.steps_per_epoch,
            "completed_steps": self.completed_steps, "step_offset": self.step_offset,
            "samples_seen": self.samples_seen, "epoch": self.epoch, "chunk": self.chunk,
            "chunks_done": self.chunks_done, "error": self.error,
            "config": self.spec.config_dict(), "knobs": self.spec.knobs,
            "fingerprint": self.spec.fingerprint(),
        }
