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
    """Everything the engine tracks about one run in memory. Its JSON part is written to runs.json
    (a cache); what survives a restart is what the event log says (engine/state.py)."""

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
    last_metrics: dict = field(default_factory=dict)
    # run_fit's sample_prompts as (prompt, None) pairs; None: the eval set's first prompts when the
    # run has a generation_config; []: none. Not in runs.json: run_fit gives them again on resume
    samples: list | None = None

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


_RECORD_TYPES: dict[str, tuple] = {
    "parent_run_id": (int, type(None)), "warm_start": (bool,), "changes": (dict, type(None)),
    "total_steps": (int,), "steps_per_epoch": (int,), "completed_steps": (int,),
    "step_offset": (int,), "samples_seen": (int,), "epoch": (int,), "chunk": (int,),
    "chunks_done": (int,), "error": (str, type(None)), "fingerprint": (str, type(None)),
}


def check_runs_json(data: Any, path) -> dict[int, dict]:
    """runs.json as ``{run_id: record}``, or a ``MetadataError`` naming the file, the run and
    what is wrong (an unknown status would leave a run that silently never trains)."""
    from rapidfire_nb.errors import MetadataError

    if not isinstance(data, dict):
        kind = "array" if isinstance(data, list) else type(data).__name__
        raise MetadataError(f"{path} holds a JSON {kind} where an object of run_id -> run record "
                            "was expected; it was left as it is")
    out: dict[int, dict] = {}
    for key, rec in data.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) >= 1):
            raise MetadataError(f"{path}: key {key!r} is not a run id (a positive integer)")
        rid = int(key)
        if not isinstance(rec, dict):
            raise MetadataError(f"{path}: run {rid} is not an object")
        status = rec.get("status", PENDING)
        if status not in STATUSES:
            raise MetadataError(f"{path}: run {rid} has unknown status {status!r}; a status is one "
                                f"of {', '.join(STATUSES)}")
        for field_name, types in _RECORD_TYPES.items():
            if field_name not in rec:
                continue
            v = rec[field_name]
            bad = not isinstance(v, types) or (isinstance(v, bool) and bool not in types)
            if not bad and isinstance(v, int) and not isinstance(v, bool) and v < 0:
                bad = True
            if bad:
                raise MetadataError(f"{path}: run {rid} has {field_name}={v!r:.60}, which is not a "
                                    f"valid {'/'.join(t.__name__ for t in types)}")
        out[rid] = rec
    return out
