"""IC ops: the one table of their rules, the runs as queued ops will leave them, and the
read-only view of the engine that policies and readers get.

The rules live in ``ops_rules.json`` beside this file, so that the panel's buttons are checked
against the same data (js/test/ops_rules.test.ts), as the event schema is. Three places use them:
an op is validated against the run as the queued ops will leave it (``checked_run``,
``check_status_op``), that state is projected by replaying queued ops with ``leaves``
(``project``), and the controller re-checks each op when it applies it (a run may have finished
meanwhile). Checks that need more
than a status (a warm start's weights, a clone's changes) stay with the code that has the facts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rapidfire_nb.engine import runs as R
from rapidfire_nb.errors import OpRefused

RULES_PATH = Path(__file__).with_name("ops_rules.json")
RULES: dict = json.loads(RULES_PATH.read_text(encoding="utf-8"))
OPS: tuple[str, ...] = tuple(RULES["ops"])
STATUSES: tuple[str, ...] = tuple(RULES["statuses"])


def _rule(op: str) -> dict:
    try:
        return RULES["ops"][op]
    except KeyError:
        raise ValueError(f"unknown op {op!r}; ops are {', '.join(OPS)}") from None


def allowed(op: str, status: str) -> bool:
    """True when ``op`` may be applied to a run whose (projected) status is ``status``."""
    return status in _rule(op)["allowed"]


def refusal(op: str, status: str, run_id: int, is_now: str | None = None) -> str | None:
    """None when allowed, else the reason the op is refused, as the user reads it. ``is_now``
    says where the run stands ("is stopped", or "is stopping (...)" while a queued op makes the
    difference); default "is <status>"."""
    if allowed(op, status):
        return None
    return _rule(op)["refusal"].format(run_id=run_id, status=status,
                                       is_now=is_now or f"is {status}")


def leaves(op: str, status: str) -> str:
    """The status a run is left in once ``op`` is applied to it (unchanged when refused)."""
    rule = _rule(op)
    if status not in rule["allowed"] or rule["leaves"] is None:
        return status
    return rule["leaves"]


# -- ops checked against the run as the queued ops will leave it ----------------------------------
#
# Ops are validated in the caller's thread and applied by the engine at the next chunk boundary.
# Validating against the engine's current state alone refuses sequences that are valid in order:
# ``nid = clone_modify(...); stop(nid)`` (run ``nid`` does not exist yet), ``stop(3); resume(3)``
# (run 3 is not stopped yet), and lets through a warm clone of a run whose delete is already
# queued. So each op is validated against the projected run: its current record, then every
# queued op replayed on it, in queue order. The engine still re-checks each op when it applies it
# (a run may finish before a queued stop reaches it), so projection only has to be right about
# what the queued ops *ask* for.

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
    with engine.atomically():
        rec = engine.runs.get(run_id)
        view = ProjectedRun(run_id, rec.status, rec.spec, record=rec) if rec is not None else None
        for op in engine.queued_ops():
            if op.kind == "clone" and op.new_run_id == run_id and view is None:
                view = ProjectedRun(run_id, R.PENDING, op.spec, queued_clone=op)
            elif view is not None and op.run_id == run_id and op.kind in OPS:
                view.status = leaves(op.kind, view.status)
        return view


def known_ids(engine) -> list[int]:
    with engine.atomically():
        ids = set(engine.runs)
        ids.update(op.new_run_id for op in engine.queued_ops() if op.kind == "clone")
        return sorted(ids)


_QUEUED_WORDS = {"stopped": "stopping", "pending": "resuming", "deleted": "deleting"}


def is_now(view: ProjectedRun) -> str:
    """"is stopped", or, when a queued op makes the difference, "is stopping (a queued op ...)":
    a second Stop before the boundary must not read as if the run had stopped already."""
    now = view.record.status if view.record is not None else None
    if now is None or now == view.status:
        return f"is {view.status}"
    going = _QUEUED_WORDS.get(view.status, f"becoming {view.status}")
    return f"is {going} (still {now} until the queued op applies at its next chunk boundary)"


def checked_run(engine, run_id) -> ProjectedRun:
    """The run ``run_id`` names, as the queued ops will leave it; ``OpRefused`` for an id that
    is no integer or names no run (a queued clone's id works at once)."""
    if isinstance(run_id, bool) or not isinstance(run_id, int):
        raise OpRefused(f"run_id must be an integer, got {run_id!r}")
    view = project(engine, run_id)
    if view is None:
        raise OpRefused(f"unknown run {run_id}; runs are {known_ids(engine)}")
    return view


def check_status_op(op: str, view: ProjectedRun) -> None:
    """``OpRefused`` with the table's reason when ``op`` (stop, resume, delete) may not be
    applied to the run as the queued ops leave it."""
    refused = refusal(op, view.status, view.run_id,
                      is_now=is_now(view) if op in ("stop", "resume") else None)
    if refused:
        raise OpRefused(refused)


class EngineView:
    """The engine as a policy (the AutoML driver) sees it: read-only. At a chunk boundary
    ``runs`` is the live run table, read under the engine's lock; elsewhere hold
    ``atomically()`` while reading it, or use ``snapshot()``."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def runs(self) -> Mapping:
        return MappingProxyType(self._engine.runs)

    def atomically(self):
        return self._engine.atomically()

    def snapshot(self) -> dict:
        return self._engine.snapshot()

    def project(self, run_id: int) -> ProjectedRun | None:
        return project(self._engine, run_id)

    def run_ids(self) -> list[int]:
        return self._engine.run_ids()

    def taken_ids(self) -> set[int]:
        """Every run id in use: the runs', and those handed out for runs not created yet."""
        return self._engine.taken_ids()

    def plan_run(self, spec):
        """The run's plan and total optimizer steps (raises when ``spec`` cannot be planned)."""
        return self._engine.plan_run(spec)
