"""What a run will look like once the ops already queued for it are applied.

Ops are validated in the caller's thread and applied by the engine at the next chunk boundary.
Validating against the engine's current state alone refuses sequences that are
valid in order: ``nid = clone_modify(...); stop(nid)`` (run ``nid`` does not exist yet),
``stop(3); resume(3)`` (run 3 is not stopped yet), and lets through a warm clone of a run whose
delete is already queued. So each op is validated against the projected run: its current record,
then every queued op replayed on it, in queue order. The engine still re-checks each op when it
applies it (a run may finish before a queued stop reaches it), so projection only has to be right
about what the queued ops *ask* for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rapidfire_nb.engine import ops as rules
from rapidfire_nb.engine import runs as R


@dataclass
class ProjectedRun:
    run_id: int
    status: str
    spec: Any
    record: Any = None        # the engine's RunRecord, None while the run is a queued clone
    queued_clone: Any = None  # the clone op that will create it

    @property
    def exists(self) -> bool:
        return self.record is not None


def project(engine, run_id: int) -> ProjectedRun | None:
    """The run as the queued ops will leave it; None if neither it nor a queued clone exists."""
    with engine.lock:
        rec = engine.runs.get(run_id)
        view = ProjectedRun(run_id, rec.status, rec.spec, record=rec) if rec is not None else None
        for op in list(engine.queued_ops):
            if op.kind == "clone" and op.new_run_id == run_id and view is None:
                view = ProjectedRun(run_id, R.PENDING, op.spec, queued_clone=op)
            elif view is not None and op.run_id == run_id and op.kind in rules.OPS:
                view.status = rules.leaves(op.kind, view.status)
        return view


def known_ids(engine) -> list[int]:
    with engine.lock:
        ids = set(engine.runs)
        ids.update(op.new_run_id for op in engine.queued_ops if op.kind == "clone")
        return sorted(ids)
