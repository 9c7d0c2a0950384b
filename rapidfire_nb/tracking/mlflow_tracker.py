"""MLflow tracker (extra ``mlflow``): one MLflow run per rapidfire run.

Where: ``MLFLOW_TRACKING_URI`` when set, else a SQLite store inside the experiment folder,
``sqlite:///<experiment>/mlflow/mlflow.db`` with artifacts in ``<experiment>/mlflow/artifacts``
(MLflow 3 refuses its old ``./mlruns`` file store unless ``MLFLOW_ALLOW_FILE_STORE`` is set, and
defaults to SQLite itself). View it with
``mlflow ui --backend-store-uri sqlite:///<experiment>/mlflow/mlflow.db``.

The MLflow experiment is named like the rapidfire experiment; runs are named ``run <id>`` (as in
the panel; runs are found again by their tags, never by name) and
tagged ``rapidfire.run_id``, ``rapidfire.experiment_path``, ``rapidfire.parent_run_id``,
``rapidfire.warm_start`` and ``rapidfire.status``. Statuses: created -> SCHEDULED,
running/resumed -> RUNNING, stopped -> KILLED, failed -> FAILED (error in the
``rapidfire.error`` tag), completed -> FINISHED; deleted keeps the data, adds the tag
``rapidfire.deleted=true`` and ends a run that had not ended as KILLED.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from pathlib import Path

from .base import RunState, Tracker, TrackerContext

_STATUS = {"running": "RUNNING", "resumed": "RUNNING", "stopped": "KILLED",
           "failed": "FAILED", "completed": "FINISHED"}
_KEY_BAD_CHARS = re.compile(r"[^\w\-. :/]")


@contextlib.contextmanager
def _quiet_migrations():
    """MLflow announces its table migrations at INFO while a store opens, which a notebook would
    print into whatever cell runs; they say nothing to the user. Dropped for this thread and this
    call only: the loggers' levels, and other threads' records, are left alone."""
    me = threading.get_ident()

    def not_mine(record: logging.LogRecord) -> bool:
        return record.thread != me or record.levelno >= logging.WARNING

    loggers = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic.runtime.migration")]
    for logger in loggers:
        logger.addFilter(not_mine)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(not_mine)


def default_tracking_uri(experiment_path: str | os.PathLike) -> str:
    return "sqlite:///" + str((Path(experiment_path) / "mlflow" / "mlflow.db").resolve())


class MlflowTracker(Tracker):
    name = "mlflow"

    def __init__(self) -> None:
        super().__init__()
        self.client = None
        self.experiment_id: str | None = None
        self.experiment_path: Path | None = None
        self._pending: dict[str, list] = {}

    def open(self, ctx: TrackerContext) -> None:
        import mlflow  # noqa: F401 - a missing extra fails here, disabling only this tracker
        from mlflow.tracking import MlflowClient

        with _quiet_migrations():
            self._open(ctx, MlflowClient)

    def _open(self, ctx: TrackerContext, MlflowClient) -> None:
        self.experiment_path = Path(ctx.experiment_path).resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(self.experiment_path)
        artifact_location = None
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            (self.experiment_path / "mlflow").mkdir(parents=True, exist_ok=True)
            artifact_location = (self.experiment_path / "mlflow" / "artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        self.state["tracking_uri"] = uri
        self.state.setdefault("runs", {})
        experiment = self.client.get_experiment_by_name(ctx.experiment_name)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(
                ctx.experiment_name, artifact_location=artifact_location,
                tags={"rapidfire.experiment_path": str(self.experiment_path)})
        else:
            self.experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                self.client.restore_experiment(self.experiment_id)
        self.state["experiment_id"] = self.experiment_id

    def _mlflow_run_id(self, run: RunState) -> str:
        run_uuid = self.state["runs"].get(str(run.run_id))
        if run_uuid is None:
            run_uuid = self._find_existing(run)
            if run_uuid is None:
                raise LookupError(f"no MLflow run for {run.name} in experiment "
                                  f"{self.experiment_id} (was its state file edited?)")
            self.state["runs"][str(run.run_id)] = run_uuid
        return run_uuid

    def run_created(self, run: RunState, wall_time: float) -> None:
        from mlflow.entities import Param

        run_uuid = self.state["runs"].get(str(run.run_id)) or self._find_existing(run)
        if run_uuid is None:
            tags = {
                "rapidfire.run_id": str(run.run_id),
                "rapidfire.experiment_path": str(self.experiment_path),
                "rapidfire.trainer_type": run.trainer_type,
                "rapidfire.warm_start": str(run.warm_start).lower(),
                "rapidfire.status": "pending",
            }
            if run.parent_run_id is not None:
                tags["rapidfire.parent_run_id"] = str(run.parent_run_id)
                parent_uuid = self.state["runs"].get(str(run.parent_run_id))
                if parent_uuid:
                    tags["rapidfire.parent_mlflow_run_id"] = parent_uuid
            created = self.client.create_run(self.experiment_id, start_time=int(wall_time * 1000),
                                             tags=tags, run_name=run.name)
            run_uuid = created.info.run_id
            self.client.update_run(run_uuid, status="SCHEDULED")
        self.state["runs"][str(run.run_id)] = run_uuid
        params = [Param(_key(k), _value(v, 6000)) for k, v in run.params.items()]
        for start in range(0, len(params), 100):  # MLflow's per-request limit
            self.client.log_batch(run_uuid, params=params[start:start + 100])

    def _find_existing(self, run: RunState) -> str | None:
        # A crash between creating the run and persisting the state: adopt that run.
        query = (f"tags.`rapidfire.run_id` = '{run.run_id}' and "
                 f"tags.`rapidfire.experiment_path` = '{self.experiment_path}'")
        found = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return found[0].info.run_id if found else None

    def log_metrics(self, run, step, metrics, wall_time) -> None:
        from mlflow.entities import Metric

        run_uuid = self._mlflow_run_id(run)
        stamp = int(wall_time * 1000)
        self._pending.setdefault(run_uuid, []).extend(
            Metric(_key(tag), value, stamp, int(step)) for tag, value in metrics.items())

    def lifecycle(self, run, event, step, detail, wall_time) -> None:
        run_uuid = self._mlflow_run_id(run)
        self._send(run_uuid)
        self.client.set_tag(run_uuid, "rapidfire.status", event)
        if event == "failed" and detail:
            self.client.set_tag(run_uuid, "rapidfire.error", str(detail)[-7900:])
        if event == "deleted":
            self.client.set_tag(run_uuid, "rapidfire.deleted", "true")
            current = self.client.get_run(run_uuid).info.status
            if current in ("RUNNING", "SCHEDULED"):
                self.client.set_terminated(run_uuid, "KILLED", end_time=int(wall_time * 1000))
            return
        status = _STATUS[event]
        if status == "RUNNING":
            self.client.update_run(run_uuid, status="RUNNING")
        else:
            self.client.set_terminated(run_uuid, status, end_time=int(wall_time * 1000))

    def _send(self, run_uuid: str | None) -> None:
        metrics = self._pending.pop(run_uuid, None)
        while metrics:
            batch, metrics = metrics[:1000], metrics[1000:]
            self.client.log_batch(run_uuid, metrics=batch)

    def flush(self) -> None:
        for run_uuid in list(self._pending):
            self._send(run_uuid)

    def close(self) -> None:
        if self.client is not None:
            try:
                self.flush()
            finally:
                self.client = None


def _key(key: str) -> str:
    return _KEY_BAD_CHARS.sub("_", str(key))[:250]


def _value(value, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

