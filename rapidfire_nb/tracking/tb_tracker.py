"""TensorBoard tracker (on by default): ``<experiment>/tensorboard/run <id>/`` per run.

The folder is TensorBoard's run name, so it reads ``run 1`` as the panel and ``%rapidfire status``
do. An experiment written before that naming keeps its ``run_<id>`` folders on resume.

Per run folder: the scalars (``train/*``, ``eval/*`` at step = samples seen), the run's config as
text (tag ``config``), its lifecycle as text (tag ``lifecycle``), and the HParams plugin's
session records: a session-start record holding the run's parameters, and a session-end record
once the run is completed, failed or deleted. No experiment-level HParams record is written, so
the plugin derives the hparam columns from every run's session start (clones that change a knob
the original group did not vary still get their column) and the metric columns from the runs'
scalars, showing each run's last value: its final metrics.

The session start comes from TensorBoard's own ``hparams_pb``
(``tensorboard.plugins.hparams.summary_v2``, which needs no TensorFlow; torch's
``summary.hparams`` would turn booleans into numbers and always end a session successfully). The
session end, which that API does not offer without TensorFlow, is the plugin's small
``SessionEndInfo`` record. Files are written with ``torch.utils.tensorboard.SummaryWriter``.
"""

from __future__ import annotations

import json
from pathlib import Path

from .base import RunState, Tracker, TrackerContext
from .naming import folder_name

# session-end status per terminal lifecycle event (api_pb2.Status has no "aborted"; the
# lifecycle text says "deleted")
_END_STATUS = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE",
               "deleted": "STATUS_UNKNOWN"}


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self) -> None:
        super().__init__()
        self.logdir: Path | None = None
        self._writers: dict[int, object] = {}

    def open(self, ctx: TrackerContext) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401 - fail early if missing

        self.logdir = Path(ctx.experiment_path) / "tensorboard"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.state.setdefault("ended", [])

    def _writer(self, run: RunState):
        writer = self._writers.get(run.run_id)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # On resume this opens a new event file in the same folder: TensorBoard reads
            # every file of a run folder as one run.
            folder = self.logdir / tb_run_name(self.logdir, run.run_id, run.knobs)
            writer = SummaryWriter(log_dir=str(folder), flush_secs=10)
            self._writers[run.run_id] = writer
        return writer

    def run_created(self, run: RunState, wall_time: float) -> None:
        writer = self._writer(run)
        writer.file_writer.add_summary(_session_start(run, wall_time), 0, walltime=wall_time)
        writer.add_text("config", _config_markdown(run), 0, walltime=wall_time)

    def log_metrics(self, run, step, metrics, wall_time) -> None:
        writer = self._writer(run)
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, step, walltime=wall_time)

    def lifecycle(self, run, event, step, detail, wall_time) -> None:
        writer = self._writer(run)
        text = f"**{event}** at {step} samples seen"
        if detail:
            text += "\n\n```\n" + str(detail)[-4000:] + "\n```"
        writer.add_text("lifecycle", text, step, walltime=wall_time)
        # The plugin keeps the first session-end record of a run, so write one only for a state
        # the run never leaves (a stopped run may still be resumed).
        if event in _END_STATUS and run.run_id not in self.state["ended"]:
            writer.file_writer.add_summary(_session_end(_END_STATUS[event], wall_time), step,
                                           walltime=wall_time)
            self.state["ended"].append(run.run_id)
        if event in _END_STATUS:
            # each open writer holds a file and a thread; a finished run rarely logs again (and
            # would get a new event file in the same folder if it did)
            writer = self._writers.pop(run.run_id)
            writer.close()

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def _session_start(run: RunState, wall_time: float):
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    params = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in run.params.items()}
    return hparams_pb(params, trial_id=run.name, start_time_secs=wall_time)


def _session_end(status: str, wall_time: float):
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value(status),
                                          end_time_secs=wall_time)
    data = plugin_data_pb2.HParamsPluginData(session_end_info=info,
                                             version=metadata.PLUGIN_DATA_VERSION)
    smd = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=metadata.PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG, metadata=smd)])


def tb_run_name(logdir: Path, run_id: int, knobs: dict | None = None) -> str:
    """The run's short name as a folder (``3 · lr 1e-3 · r 32``), as the panel names it; an
    older experiment's ``run 3`` or ``run_3`` folder where there is one, so a resumed
    experiment continues the same TensorBoard run."""
    for legacy in (f"run_{run_id}", f"run {run_id}"):
        if (Path(logdir) / legacy).is_dir():
            return legacy
    return folder_name(run_id, knobs)


def _config_markdown(run: RunState) -> str:
    lines = [f"**{run.name}** ({run.trainer_type})"]
    if run.parent_run_id is not None:
        start = "warm start" if run.warm_start else "cold start"
        lines.append(f"clone of run {run.parent_run_id} ({start})")
    if run.knobs:
        lines.append("knobs: " + ", ".join(f"`{k}={v!r}`" for k, v in sorted(run.knobs.items())))
    body = json.dumps(run.config, indent=2, sort_keys=True, default=repr)
    # four-space indentation renders as a code block in TensorBoard's markdown
    lines.append("\n".join("    " + line for line in body.splitlines()))
    return "\n\n".join(lines)
