"""What the notebook layer may read of an experiment, and the ops it may ask for.

The panel, the ``%rapidfire`` magics, the status text and RapidFire AI's notebook controls sit
above the facade (``experiment.py``). They see an experiment through ``ExperimentView`` only:
named, typed, read-only facts (its identity, its folded run table, what its engine is doing) and
the interactive ops, each one a call of the facade's public method of the same name. The facade
hands one out (``Experiment.view()``); ``view_of`` makes one of whatever the notebook layer is
given (an Experiment, its view, a stand-in).

This module is the facade's companion in its layer: besides ``experiment.py`` it is the one place
that knows the facade's private parts (its folded table, its claimed folder) and reads its engine,
so that the notebook layer never does, and a change inside the facade is met here alone.

Stand-ins: the panel and the status text are also given objects that are not an ``Experiment``,
only shaped like one: an object with ``name``, ``path``, an event log ``events`` and the op methods
(the panel's own tests, synthetic logs in the browser tests, an Experiment pickled by an older
version). Whatever such an object lacks reads as nothing here (no engine, no folded table, not
read-only, not ended), and only here: ``_get`` is the one place attributes are looked up that way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from rapidfire_nb.engine import EventLog, Op

T = TypeVar("T")

_MISSING = object()


class ExperimentView:
    """A read-only view of one experiment for the notebook layer.

    Every property is read when asked, never cached: the facade starts its engine in ``run_fit``,
    gives its folder back after a refused first ``run_fit`` and closes in ``end()``, and a view
    made before any of that sees it. The view holds nothing but the experiment.
    """

    __slots__ = ("_exp",)

    def __init__(self, experiment: Any):
        self._exp = experiment

    def _get(self, name: str, default: Any = None) -> Any:
        # the one lookup that tolerates a stand-in (see the module's docstring)
        return getattr(self._exp, name, default)

    @property
    def key(self) -> Any:
        """The experiment itself, as a key for what is kept per experiment (its one live panel);
        the notebook layer reads nothing through it."""
        return self._exp

    # -- identity ----------------------------------------------------------------------------
    @property
    def name(self) -> str | None:
        """The experiment's name; None for a stand-in without one."""
        return self._get("name")

    @property
    def path(self) -> Path | None:
        """The experiment's folder; None for a stand-in without one."""
        return self._get("path")

    @property
    def read_only(self) -> bool:
        """Opened for its results only (``Experiment.open``, ``mode="read"``): no ops."""
        return bool(self._get("read_only", False))

    @property
    def ended(self) -> bool:
        """``end()`` has closed the experiment."""
        return bool(self._get("ended", False))

    @property
    def folder_given_back(self) -> bool:
        """A new experiment whose first ``run_fit`` was refused: it gave its folder back and has
        no runs, no log of its own until the next ``run_fit`` claims one."""
        if self._get("engine", _MISSING) is not None or self._get("_folder", _MISSING) is not None:
            return False
        return not self._get("read_only", True)

    # -- the event log and the folded run table ------------------------------------------------
    @property
    def events(self) -> EventLog | None:
        """The experiment's event log (what the panel shows and pulls from), or None when the
        object has none, or has something that cannot be read as one (no ``since``)."""
        events = self._get("events")
        return events if events is not None and callable(getattr(events, "since", None)) else None

    @property
    def events_path(self) -> Path | None:
        """Where the event log is on disk (``events.jsonl``); None for a log kept in memory."""
        path = getattr(self._get("store"), "events_path", None)
        return path if isinstance(path, Path) else None

    @property
    def has_table(self) -> bool:
        """The experiment keeps its log folded into a run table (engine/state.py) that
        ``read_table`` reads; a stand-in does not."""
        return self._get("events") is not None and self._get("_state") is not None

    def read_table(self, read: Callable[[dict], T]) -> T | None:
        """``read(table)`` on the folded run table, up to date and under its lock (so ``read``
        must be quick and must not wait for the engine); None without a table (``has_table``)."""
        if not self.has_table:
            return None
        return self._exp._state().read(read)

    def get_runs_info(self):
        """``Experiment.get_runs_info()``: one row per run (a pandas DataFrame)."""
        return self._exp.get_runs_info()

    # -- the engine (started by run_fit) ---------------------------------------------------------
    def _engine(self) -> Any:
        return self._get("engine")

    @property
    def fit_started(self) -> bool:
        """``run_fit`` started training in this session (its runs may all be done by now, and
        the experiment may have ended); False before it, when resumed or opened read-only."""
        return self._engine() is not None

    @property
    def num_chunks(self) -> int | None:
        """Chunks per epoch of this session's ``run_fit``; None before it."""
        return getattr(self._engine(), "num_chunks", None)

    @property
    def on_device(self) -> int | None:
        """The run whose adapter is on the device now, as the engine records it; None when
        unknown or idle."""
        rid = getattr(self._engine(), "on_device", None)
        return rid if isinstance(rid, int) and not isinstance(rid, bool) else None

    def busy(self, timeout: float) -> bool:
        """Runs train: a run is pending or running, an op is queued or a chunk is in flight
        (also True when the engine holds its lock past ``timeout`` seconds). False before
        ``run_fit``."""
        engine = self._engine()
        return engine is not None and bool(engine.busy(timeout=timeout))

    def queued_ops(self, timeout: float) -> list[Op] | None:
        """The ops accepted and not applied yet (they apply at the run's next chunk boundary), in
        queue order; ``[]`` before ``run_fit``; None when the engine holds its lock past
        ``timeout`` seconds (a reader in the kernel's thread never waits for a chunk boundary)."""
        engine = self._engine()
        return [] if engine is None else engine.queued_ops(timeout=timeout)

    def training_now(self, timeout: float = 1.0) -> dict[str, int]:
        """Ray worker -> the run whose chunk is in flight there; ``{}`` in the kernel's own
        engine, before ``run_fit``, or when the engine holds its lock past ``timeout``."""
        engine = self._engine()
        return {} if engine is None else engine.training_now(timeout=timeout)

    @property
    def workers_starting(self) -> int:
        """The number of Ray workers this session's engine starts (they are still starting while
        the log names none); 0 in the kernel's own engine and before ``run_fit``."""
        engine = self._engine()
        return 0 if engine is None else engine.executor.worker_count

    def interrupted_line(self) -> str:
        """The line printed when a wait for the runs is interrupted (they go on training)."""
        return self._exp._interrupted_line()

    # -- ops: each is the facade's public method of the same name -------------------------------
    def stop(self, run_id: int) -> None:
        self._exp.stop(run_id)

    def resume(self, run_id: int) -> None:
        self._exp.resume(run_id)

    def delete(self, run_id: int) -> None:
        self._exp.delete(run_id)

    def status_op(self, op: str, run_id: int) -> None:
        """``stop``, ``resume`` or ``delete`` by name (the panel's buttons)."""
        ops = {"stop": self.stop, "resume": self.resume, "delete": self.delete}
        if op not in ops:
            raise ValueError(f"unknown op {op!r} (expected one of {', '.join(ops)})")
        ops[op](run_id)

    def note(self, run_id: int, text: str) -> None:
        self._exp.note(run_id, text)

    def editable_knobs(self, run_id: int) -> dict:
        return self._exp.editable_knobs(run_id)

    def validate_clone(self, run_id: int, changes: dict | None = None, warm_start: bool = False):
        return self._exp.validate_clone(run_id, changes, warm_start=warm_start)

    def clone_modify(self, run_id: int, changes: dict | None = None, warm_start: bool = False) -> int:
        return self._exp.clone_modify(run_id, changes, warm_start=warm_start)

    def apply_suggestions(self, run_ids=None) -> list[int]:
        return self._exp.apply_suggestions(run_ids)

    def dismiss_suggestions(self, run_ids=None) -> list[int]:
        return self._exp.dismiss_suggestions(run_ids)

    def __repr__(self) -> str:
        return f"<ExperimentView of {self._exp!r}>"


def view_of(experiment: Any) -> ExperimentView:
    """The view of ``experiment``, for the functions of the notebook layer that take an Experiment
    or its view: a view as it is; for an Experiment the view ``Experiment.view()`` hands out; for
    a stand-in one over it (see the module's docstring)."""
    return experiment if isinstance(experiment, ExperimentView) else ExperimentView(experiment)
