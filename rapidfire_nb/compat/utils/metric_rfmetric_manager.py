"""``rapidfireai.utils.metric_rfmetric_manager.RFMetricLogger``: reading metrics back.

RapidFire's notebooks use it to read a run's metrics and to learn which trackers are on. Here the
engine logs every run itself (TensorBoard, MLflow, Trackio: ``Experiment(tracking=...)`` or the
``RF_*_ENABLED`` switches), so the face reads: ``get_run_metrics(run_id)`` from the current
experiment's results and ``get_default_metric_loggers(name)`` from the tracker switches. Writing
methods (``create_run``, ``log_metric``, ...) raise an error that says so.
"""

from __future__ import annotations

from rapidfire_nb.errors import RapidFireError


class RFMetricLogger:
    def __init__(self, metric_loggers: dict | None = None, logger=None, experiment=None):
        self.metric_loggers = dict(metric_loggers or {})
        self._experiment = experiment

    @classmethod
    def get_default_metric_loggers(cls, experiment_name: str) -> dict:
        """The trackers this package would enable, keyed as RapidFire keys them."""
        from rapidfire_nb.tracking import resolve_trackers

        return {f"rf_{name}": {"type": name, "config": {"experiment_name": experiment_name}}
                for name in resolve_trackers() if isinstance(name, str)}

    def get_run_metrics(self, run_id) -> dict:
        """``{metric: [(step, value), ...]}`` of run ``run_id`` (an int, or ``"run 3"``)."""
        from rapidfire_nb.session import current_experiment

        exp = self._experiment or current_experiment()
        if exp is None:
            raise RapidFireError("RFMetricLogger.get_run_metrics: no experiment is open")
        try:
            rid = int(str(run_id).replace("run", "").strip(" _"))
        except ValueError:
            raise RapidFireError(f"RFMetricLogger.get_run_metrics: run_id must be a run id (3, or "
                                 f"'run 3'), got {run_id!r}") from None
        df = exp.get_results()
        df = df[df.run_id == rid]
        return {m: list(zip(g.step.astype(int), g.value.astype(float))) for m, g in df.groupby("metric")}

    def __getattr__(self, name: str):
        raise AttributeError(f"RFMetricLogger.{name}: rapidfire_nb logs every run's metrics itself "
                             "(Experiment(tracking=[...]) picks TensorBoard, MLflow, Trackio); read "
                             "them with Experiment.get_results() or get_run_metrics(run_id)")
