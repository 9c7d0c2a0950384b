"""The tracker interface and the conventions every tracking backend shares.

A tracker never reads the engine: :class:`~rapidfire_nb.tracking.hub.TrackerHub` replays the
event log (``rapidfire_nb/engine/events.py``) and calls the same small set of hooks on every
backend, with values already normalized here, so TensorBoard, MLflow and Trackio show the same
metrics at the same steps.

Conventions (the one place they are decided):

- **Step.** Every metric of a run, train or eval, is logged at ``step = samples_seen``: the number
  of training samples the run had consumed when the value was measured (cumulative over epochs).
  That is the axis on which runs with different batch sizes, or clones continuing their parent's
  data stream, are comparable; it is decided once, in ``engine/state.py`` (``metric_x``), and the
  panel's train and eval charts use it too. The optimizer step is kept as
  the metric ``train/global_step``. One axis per run also keeps the steps of a run non-decreasing,
  which TensorBoard's reader relies on (it purges points that come "out of order").
- **Metric names.** Train metrics (``loss``, ``learning_rate``, ``grad_norm``, rewards, ...) become
  ``train/<name>``; eval metrics become ``eval/<name>`` with TRL's ``eval_`` prefix dropped
  (``eval_loss`` -> ``eval/loss``, a user's ``eval_accuracy`` -> ``eval/accuracy``). Non-numeric
  values are not logged.
- **Parameters.** A run's parameters are its ``config`` (``run_created``) flattened to dotted keys
  (``training_args.learning_rate``), lists and dicts as JSON text, ``None`` left out, plus
  ``rapidfire.run_id``, ``rapidfire.parent_run_id`` (clones) and ``rapidfire.warm_start``.
- **Lifecycle.** ``running`` (first time on the device, once per run), ``stopped``, ``resumed``
  (a stopped run made pending again), ``completed``, ``failed`` (with the error), ``deleted``;
  each at the run's current ``samples_seen``.
- **Names.** A run is called by its short name in every backend, as in the panel: its id and the
  knobs that set it apart (``3 · lr 1e-3 · r 32``, see ``naming.py``; ``run 3`` without knobs).
  Experiments written before this naming keep their ``run 3`` or ``run_3`` (TensorBoard folders,
  Trackio runs), so a resumed experiment continues the same runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .naming import short_name

LIFECYCLE_EVENTS = ("running", "stopped", "resumed", "completed", "failed", "deleted")
TERMINAL_LIFECYCLE = ("completed", "failed", "deleted")


@dataclass
class RunState:
    """What trackers know about one run: its row of the run table (engine/state.py, which the
    hub folds) plus the trackers' own bookkeeping (lifecycle, counts of handled events)."""

    run_id: int
    trainer_type: str = ""
    config: dict = field(default_factory=dict)
    knobs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    parent_run_id: int | None = None
    warm_start: bool = False
    status: str = "pending"
    lifecycle: str | None = None          # the last lifecycle event emitted for this run
    started: bool = False                 # has been on the device ("running" was emitted)
    samples_seen: int = 0
    global_step: int = 0
    error: str | None = None
    last_metrics: dict = field(default_factory=dict)   # tag -> latest value (the "final" metrics)
    # How many metric / lifecycle events of this run came before, counting the current one.
    # The hub replays the whole log on resume, so these are stable ids for idempotent writes.
    metric_events: int = 0
    lifecycle_events: int = 0

    @property
    def name(self) -> str:
        return short_name(self.run_id, self.knobs)


def run_name(run_id: int, knobs: dict | None = None) -> str:
    """The run's short name (``3 · lr 1e-3 · r 32``), as the panel and the report call it."""
    return short_name(run_id, knobs)


def legacy_run_name(run_id: int) -> str:
    """The name versions before the panel's naming gave a run (``run_3``)."""
    return f"run_{int(run_id)}"


@dataclass
class TrackerContext:
    """What a tracker gets when it opens."""

    experiment_path: Path
    experiment_name: str
    # what this tracker stored last time (see Tracker.state); {} on a fresh experiment
    state: dict
    # True when this tracker already handled events of this experiment in an earlier session
    resumed: bool


class Tracker:
    """Base class of tracking backends. Subclasses override the hooks they need.

    All hooks run in the tracker's own background thread, never in the training thread. A hook
    that raises disables the tracker (the hub warns once); it never reaches training.
    ``state`` is a JSON-able dict persisted (atomically, with the last handled event seq) after
    every flush and handed back in ``TrackerContext.state`` when the experiment is resumed.
    """

    name: str = "tracker"

    def __init__(self) -> None:
        self.state: dict = {}

    def open(self, ctx: TrackerContext) -> None:
        """Prepare the backend (create folders, clients). Import optional packages here."""

    def run_created(self, run: RunState, wall_time: float) -> None:
        """A new run: ``run.params`` are its parameters, ``run.config`` its full config."""

    def log_metrics(self, run: RunState, step: int, metrics: dict[str, float],
                    wall_time: float) -> None:
        """Scalars already named (``train/loss``, ``eval/loss``) at ``step`` (samples seen)."""

    def lifecycle(self, run: RunState, event: str, step: int, detail: str | None,
                  wall_time: float) -> None:
        """``event`` is one of LIFECYCLE_EVENTS; ``detail`` the error or the reason, if any."""

    def flush(self) -> None:
        """Make everything handled so far durable (called before the seq is persisted)."""

    def close(self) -> None:
        """Release files and clients. Called once; the tracker is not used afterwards."""


def metric_tag(split: str, name: str) -> str:
    """``train/loss``, ``eval/loss`` (from ``eval_loss``), ``eval/accuracy``."""
    name = str(name)
    if split == "eval":
        if name.startswith("eval_"):
            name = name[len("eval_"):]
        return f"eval/{name}"
    return f"{split}/{name}"


def numeric(value: Any) -> float | None:
    """The float to log, or None for values that are not real numbers (strings, bools, lists)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out


def is_finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"training_args": {"learning_rate": 1e-3}}`` -> ``{"training_args.learning_rate": 1e-3}``.

    Leaves keep str/int/float/bool; lists (and empty dicts) become JSON text; None is left out,
    because no backend has a "null" parameter and "None" would read as a string value.
    """
    out: dict[str, Any] = {}
    if isinstance(config, dict) and config:
        for key, value in config.items():
            out.update(flatten_config(value, f"{prefix}{key}."))
        return out
    key = prefix[:-1]
    if not key or config is None:
        return out
    if isinstance(config, (bool, int, float, str)):
        out[key] = config
    else:
        out[key] = json.dumps(config, sort_keys=True, default=repr)
    return out


def run_params(run_created: dict) -> dict[str, Any]:
    """The parameters every backend records for a run (see the module docstring)."""
    params = flatten_config(run_created.get("config") or {})
    for key, value in (run_created.get("knobs") or {}).items():
        if value is not None:
            params[str(key)] = value if isinstance(value, (bool, int, float, str)) else json.dumps(
                value, sort_keys=True, default=repr)
    params["rapidfire.run_id"] = int(run_created["run_id"])
    if run_created.get("parent_run_id") is not None:
        params["rapidfire.parent_run_id"] = int(run_created["parent_run_id"])
    params["rapidfire.warm_start"] = bool(run_created.get("warm_start", False))
    return params
