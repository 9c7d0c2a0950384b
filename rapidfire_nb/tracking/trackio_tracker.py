"""Trackio tracker (extra ``trackio``): one Trackio run per rapidfire run, stored locally.

Where: Trackio keeps one SQLite file per project in its directory, which it takes from the
environment variable ``TRACKIO_DIR`` once, when ``trackio`` is first imported (it has no argument
for it). So: a ``TRACKIO_DIR`` you set wins; otherwise, if this process has not imported trackio
yet, ``TRACKIO_DIR`` names ``<experiment>/trackio`` for the length of that import only (the
variable is removed right after, so the user's environment and subprocesses never see it);
otherwise trackio's own directory is used (the tracker's ``state["trackio_dir"]`` says which). View it with
``TRACKIO_DIR=<that dir> trackio show --project <experiment name>``: the Experiment prints that
command once when Trackio is on (RapidFire's tutorial runs ``trackio show --project <name>``,
which without ``TRACKIO_DIR`` looks in Trackio's default directory and shows nothing), and keeps it
as ``Experiment.trackio_command``. In the same Python process ``trackio.show(project=...)`` needs
nothing more: trackio was imported with the directory already set.

The project is the experiment's name, runs are ``run <id>`` as in the panel (``run_<id>`` in a
Trackio project written before that naming: Trackio knows a run by its name, so a resumed
experiment keeps the name its runs already have). Parameters go to the run's config;
lifecycle events (stopped, resumed, failed with its error, ...) are Trackio alerts of the run.

This writes through ``trackio.sqlite_storage.SQLiteStorage`` (what ``trackio.Run`` itself calls
from its sender thread) rather than the public ``trackio.init``/``log``/``finish``, which cannot
keep three promises of the hub: ``Run.log`` gives every row a random id (a replay after a crash
would duplicate points; here every row has a deterministic id, and Trackio ignores a row whose id
it already has), stamps rows with the time of the call (a replay would move them), and buffers in
a sender thread of its own (the hub needs a synchronous flush); ``init``/``alert`` also print
from that thread into whichever notebook cell runs.
"""

from __future__ import annotations

import hashlib
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from .base import RunState, Tracker, TrackerContext, legacy_run_name, run_name

_LEVEL = {"failed": "error", "stopped": "warn", "deleted": "warn"}


def trackio_dir_for(experiment_path) -> str:
    """The directory the tracker will write to (the rule in this module's docstring)."""
    if os.environ.get("TRACKIO_DIR"):
        return os.environ["TRACKIO_DIR"]
    if "trackio" in sys.modules:
        from trackio import utils

        return str(utils.TRACKIO_DIR)
    return str(Path(experiment_path).resolve() / "trackio")


def show_command(experiment_path, project: str) -> str | None:
    """The shell command that shows this experiment in Trackio's dashboard, or None when the
    plain ``trackio show --project <name>`` (RapidFire's tutorial) already finds it."""
    import shlex

    where = trackio_dir_for(experiment_path)
    if os.environ.get("TRACKIO_DIR") == where:
        return None    # the user's own TRACKIO_DIR: their shell has it too
    return f"TRACKIO_DIR={shlex.quote(where)} trackio show --project {shlex.quote(project)}"


class TrackioTracker(Tracker):
    name = "trackio"

    def __init__(self) -> None:
        super().__init__()
        self.storage = None
        self.project = ""
        self._prefix = ""
        self._pending: dict[int, tuple[RunState, list]] = {}

    def open(self, ctx: TrackerContext) -> None:
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str(Path(ctx.experiment_path).resolve() / "trackio")
            try:
                import trackio  # noqa: F401 - a missing extra fails here, disabling only this tracker
            finally:
                del os.environ["TRACKIO_DIR"]   # read at import only; leave no trace
        import trackio  # noqa: F401
        from trackio import utils
        from trackio.sqlite_storage import SQLiteStorage

        SQLiteStorage.validate_project_name(ctx.experiment_name)
        self.storage = SQLiteStorage
        self.project = ctx.experiment_name
        # state from an older version has no "run_names": its runs were all named run_<id>
        self._legacy_names = bool(self.state) and "run_names" not in self.state
        self.state.setdefault("run_names", {})
        self.state["trackio_dir"] = str(utils.TRACKIO_DIR)
        self.state["project"] = self.project
        # runs of two experiments with the same name in one Trackio directory stay apart
        digest = hashlib.sha1(str(Path(ctx.experiment_path).resolve()).encode()).hexdigest()
        self._prefix = f"rf-{digest[:10]}"

    def run_label(self, run: RunState) -> str:
        names = self.state["run_names"]
        key = str(run.run_id)
        if key not in names:
            names[key] = legacy_run_name(run.run_id) if self._legacy_names else run_name(run.run_id, run.knobs)
        return names[key]

    def run_uid(self, run: RunState) -> str:
        return f"{self._prefix}-{self.run_label(run)}"

    def run_created(self, run: RunState, wall_time: float) -> None:
        # Trackio finds a run's config through its metric rows, so the run starts with an empty
        # row carrying the config.
        self.storage.bulk_log(
            project=self.project, run=self.run_label(run), run_id=self.run_uid(run),
            metrics_list=[{}], steps=[run.samples_seen], timestamps=[_iso(wall_time)],
            config=dict(run.params), log_ids=[f"{self.run_uid(run)}-created"],
        )

    def log_metrics(self, run, step, metrics, wall_time) -> None:
        row = (dict(metrics), int(step), _iso(wall_time),
               f"{self.run_uid(run)}-m{run.metric_events}")
        self._pending.setdefault(run.run_id, (run, []))[1].append(row)

    def lifecycle(self, run, event, step, detail, wall_time) -> None:
        self._send(run.run_id)
        self.storage.bulk_alert(
            project=self.project, run=self.run_label(run), run_id=self.run_uid(run),
            titles=[f"{self.run_label(run)} {event}"], texts=[str(detail)[-4000:] if detail else None],
            levels=[_LEVEL.get(event, "info")], steps=[int(step)], timestamps=[_iso(wall_time)],
            alert_ids=[f"{self.run_uid(run)}-l{run.lifecycle_events}"],
        )

    def _send(self, run_id: int) -> None:
        pending = self._pending.pop(run_id, None)
        if not pending:
            return
        run, rows = pending
        self.storage.bulk_log(
            project=self.project, run=self.run_label(run), run_id=self.run_uid(run),
            metrics_list=[r[0] for r in rows], steps=[r[1] for r in rows],
            timestamps=[r[2] for r in rows], log_ids=[r[3] for r in rows],
        )

    def flush(self) -> None:
        for run_id in list(self._pending):
            self._send(run_id)

    def close(self) -> None:
        if self.storage is not None:
            try:
                self.flush()
            finally:
                self.storage = None


def _iso(wall_time: float) -> str:
    return datetime.fromtimestamp(wall_time, tz=timezone.utc).isoformat()
