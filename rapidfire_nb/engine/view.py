"""The read-only view of the engine that policies (the AutoML driver) and readers get: the run
table, its snapshot and the runs as the queued ops will leave them, never a way to change them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from rapidfire_nb.engine.ops import ProjectedRun, project


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
