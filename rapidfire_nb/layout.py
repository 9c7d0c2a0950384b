"""RapidFire AI's folder layout, for the notebooks written against it.

- ``<experiment>/runs/<id>/checkpoints/final_checkpoint/``: each completed run's
  ``trainer_state.json`` (its logged metrics as transformers' ``log_history``), written when the
  run completes (again if it completes again after a resume) by ``FinalCheckpoints``, a
  subscriber of the event log with its own thread; and, for a LoRA run, its adapter and
  tokenizer, written from its checkpoint by the checkpoint writer before the run is logged
  completed (``engine/export.py``'s ``write_final_checkpoint``: made aside and renamed into place,
  drawing no random number), and again by ``end()`` (where the writer could not: a base loaded
  only in a Ray worker).
- ``<experiments path>/tensorboard_logs/<name>/`` (RapidFire's ``RF_TENSORBOARD_LOG_DIR``) is made
  by the ``RfDb`` compat call (``compat/fit/db/rf_db.py``), as RapidFire's notebooks make it.

Plain values in: the experiment folder, its event log and folded run table, and the export
function that writes a run's adapter (``export_weights``, which ``Experiment.export`` uses too).
``log_file_path`` names the log files RapidFire's notebooks read.
"""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

from rapidfire_nb.engine import COMPLETED, atomic_write_json


def log_file_path(store, log_type: str | None) -> Path:
    """``Experiment.get_log_file_path``: the event log (``None``, "main", "experiment") or the
    training thread's log ("training")."""
    from rapidfire_nb.errors import ConfigError

    kind = "main" if log_type is None else str(log_type).lower()
    if kind in ("main", "experiment"):
        return store.events_path
    if kind != "training":
        raise ConfigError(f"get_log_file_path: log_type must be None, 'main', 'experiment' or "
                          f"'training', got {log_type!r}")
    return store.root / "logs" / "engine.log"


def export_weights(engine, store, run, run_id: int, path: Path) -> Path:
    """Write ``run``'s (a ``ProjectedRun``'s) weights at its last chunk boundary into the checked
    folder ``path``: what ``Experiment.export`` and the final checkpoints both write."""
    from rapidfire_nb import automl
    from rapidfire_nb.engine import DELETED, export_run
    from rapidfire_nb.errors import OpRefused

    if run.status == DELETED:
        raise OpRefused(f"run {run_id} is deleted; its weights are gone")
    weights = engine.boundary_weights(run_id)
    if weights is None:
        if run.exists and run.record.chunks_done > 0:
            raise OpRefused(f"run {run_id} ({run.status}) has trained but its checkpoint "
                            f"{store.checkpoint_path(run_id)} is missing; nothing to export")
        raise OpRefused(f"run {run_id} has not finished a chunk yet; nothing to export")
    lora = automl.build_lora_config(run.spec) if run.spec.peft_config is not None else None
    return export_run(engine, run.spec, run_id, weights, lora, path)


def final_checkpoint_path(root: Path, run_id: int) -> Path:
    return Path(root) / "runs" / str(int(run_id)) / "checkpoints" / "final_checkpoint"


def trainer_state(table: dict, run_id: int) -> dict | None:
    """transformers' ``trainer_state.json`` of a completed run (None when it is not completed):
    its step counters and every logged metric as ``log_history``, one entry per step."""
    from rapidfire_nb.results import results_frame, runs_frame

    info = runs_frame(table)
    row = info[info.run_id == run_id]
    if row.empty or row.iloc[0]["status"] != COMPLETED:
        return None
    row = row.iloc[0]
    results = results_frame(table)
    mine = results[results.run_id == run_id]
    history = [{"step": int(step), **{m: float(v) for m, v in zip(g.metric, g.value)}}
               for step, g in mine.groupby("step", sort=True)]
    return {"global_step": int(row["completed_steps"]), "max_steps": int(row["total_steps"]),
            "epoch": float(row["epoch"]) if row.get("epoch") is not None else None,
            "log_history": history}


class FinalCheckpoints:
    """Writes a run's ``trainer_state.json`` once the log says it completed. The event listener
    only enqueues (it runs in the thread that logs, under the engine's lock); a thread of its own
    writes (JSON only: nothing here touches torch). ``write_adapters`` (at ``end()``, when nothing
    trains) adds each completed LoRA run's adapter through ``export_adapter(run_id, path)``; a
    full model is not copied there (it can be many GB: ``export`` saves it)."""

    def __init__(self, root: Path, events, table, export_adapter: Callable[[int, Path], object],
                 is_lora: Callable[[int], bool]):
        self.root, self.table = Path(root), table
        self._export, self._is_lora = export_adapter, is_lora
        self._todo: queue.SimpleQueue = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._unsubscribe = events.subscribe(self._on_event)
        self._thread = threading.Thread(target=self._work, name="rapidfire-final-checkpoints",
                                        daemon=True)
        self._thread.start()

    def _on_event(self, ev: dict) -> None:
        if ev.get("type") == "run_status" and ev.get("status") == COMPLETED:
            with self._idle:
                self._pending += 1
            self._todo.put(ev.get("run_id"))

    def _work(self) -> None:
        while True:
            rid = self._todo.get()
            if rid is None:
                return
            try:
                self.write(rid)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def write(self, run_id: int) -> None:
        path = final_checkpoint_path(self.root, run_id)
        try:
            state = self.table.read(lambda t: trainer_state(t, run_id))
            if state is None:
                return
            path.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path / "trainer_state.json", state)
        except Exception as exc:  # noqa: BLE001 - a convenience copy never fails training
            warnings.warn(f"final checkpoint of run {run_id} not written to {path}: {exc}", stacklevel=2)

    def write_adapters(self) -> None:
        """Each completed LoRA run's adapter beside its trainer_state.json (nothing trains now)."""
        from rapidfire_nb.engine import runs_by_id

        done = self.table.read(lambda t: [r["run_id"] for r in runs_by_id(t) if r["status"] == COMPLETED])
        for run_id in done:
            path = final_checkpoint_path(self.root, run_id)
            try:
                if self._is_lora(run_id):
                    # an export replaces its whole folder (never writing into what was there):
                    # trainer_state.json goes back in beside the adapter
                    self._export(run_id, path)
                    self.write(run_id)
            except Exception as exc:  # noqa: BLE001 - a convenience copy never fails end()
                warnings.warn(f"final checkpoint of run {run_id} not written to {path}: {exc}",
                              stacklevel=3)

    def flush(self, timeout: float | None = 60) -> bool:
        """Wait until every completed run's checkpoint is written; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def close(self) -> None:
        self._unsubscribe()
        self.flush()
        self._todo.put(None)
        self.write_adapters()

