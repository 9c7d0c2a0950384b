"""Experiment tracking: TensorBoard (default), MLflow and Trackio, fed from the event log.

The engine never imports this package. The Experiment builds a :class:`TrackerHub` over its
:class:`~rapidfire_nb.engine.events.EventLog`; the hub's threads replay the log into every
enabled tracker. Which trackers: ``Experiment(..., tracking=[...])`` when given, else the
environment switches ``RF_TENSORBOARD_ENABLED`` (default on), ``RF_MLFLOW_ENABLED`` and
``RF_TRACKIO_ENABLED`` (default off). Conventions shared by all backends (metric names, the
samples-seen step axis, parameters, lifecycle) are in :mod:`rapidfire_nb.tracking.base`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..errors import ConfigError
from .base import LIFECYCLE_EVENTS, RunState, Tracker, TrackerContext, metric_tag
from .hub import TrackerHub, TrackerWarning

TRACKER_NAMES = ("tensorboard", "mlflow", "trackio")

# env switch -> (tracker, default)
ENV_SWITCHES = {
    "RF_TENSORBOARD_ENABLED": ("tensorboard", True),
    "RF_MLFLOW_ENABLED": ("mlflow", False),
    "RF_TRACKIO_ENABLED": ("trackio", False),
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env_flag(var: str, default: bool) -> bool:
    raw = os.environ.get(var)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{var}={raw!r} is not a switch; use 1/0, true/false, yes/no or on/off")


def resolve_trackers(tracking: str | Iterable[str | Tracker] | bool | None = None
                     ) -> list[str | Tracker]:
    """The trackers to enable, in order, without duplicates.

    ``tracking`` (the Experiment's argument) wins when given: a list of names such as
    ``["tensorboard", "mlflow"]`` (case-insensitive; a single name is fine too), ``[]`` or
    ``False`` for none; a :class:`Tracker` instance is passed through as a custom backend.
    With ``tracking=None`` the ``RF_*_ENABLED`` environment switches decide.
    Unknown names raise :class:`~rapidfire_nb.errors.ConfigError` naming them.
    """
    if tracking is None:
        return [name for var, (name, default) in ENV_SWITCHES.items() if _env_flag(var, default)]
    if tracking is False:
        return []
    if tracking is True:
        raise ConfigError("tracking=True is ambiguous; pass a list such as "
                          f"{list(TRACKER_NAMES)!r}, [] for none, or None for the RF_*_ENABLED "
                          "environment switches")
    if isinstance(tracking, (str, Tracker)):
        tracking = [tracking]
    try:
        items = list(tracking)
    except TypeError:
        raise ConfigError(f"tracking must be a list of tracker names, got {tracking!r}") from None
    out: list[str | Tracker] = []
    unknown: list[str] = []
    for item in items:
        if isinstance(item, Tracker):
            if item not in out:
                out.append(item)
            continue
        name = item.strip().lower() if isinstance(item, str) else None
        if name not in TRACKER_NAMES:
            unknown.append(repr(item))
        elif name not in out:
            out.append(name)
    if unknown:
        raise ConfigError(f"unknown tracker(s) in tracking=: {', '.join(unknown)}; "
                          f"choose from {', '.join(TRACKER_NAMES)}")
    return out


def start_trackers(events, path, name: str, tracking=None) -> tuple[TrackerHub | None, str | None]:
    """The tracker hub of an experiment's log (started), or None when no tracker is enabled; and
    Trackio's dashboard command when Trackio is one of them (printed once, in the caller's cell)."""
    names = resolve_trackers(tracking)
    command = None
    if "trackio" in names:
        try:
            from .trackio_tracker import show_command

            command = show_command(path, name)
        except ImportError:
            pass
        if command:
            # decided before the tracker thread imports trackio; one line, in this cell
            print(f"rapidfire: Trackio dashboard of this experiment: {command}")
    if not names:
        return None, command
    hub = TrackerHub(events, path, name, names)
    hub.start()
    return hub, command


__all__ = [
    "start_trackers",
    "ENV_SWITCHES", "LIFECYCLE_EVENTS", "RunState", "TRACKER_NAMES", "Tracker", "TrackerContext",
    "TrackerHub", "TrackerWarning", "metric_tag", "resolve_trackers",
]
