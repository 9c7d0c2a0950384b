"""RapidFire AI's run_fit blocks until every run is done, so the cells its notebooks put after it
read final results and files. Ours returns at once in a kernel (panel clicks reach the kernel only
between cells). What a notebook run top to bottom sees, in a real kernel (nbclient, ipykernel):

- an experiment written as RapidFire code writes it (``mode="fit"``): the cell queued behind the
  run_fit cell starts once the runs are done, and says so;
- the same experiment, with that cell run by hand after a pause: it starts at once and reads the
  runs as they train (the panel and the code can steer them);
- the queued cell's wait interrupted (Kernel > Interrupt): it runs at once, the runs go on;
- an experiment created without ``mode`` (our own notebooks, which steer between cells): the
  queued cell starts at once, as before.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: starts kernels and trains in them

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TESTS = Path(__file__).resolve().parent
QUEUED_LINE = "this cell was queued behind run_fit"

SETUP = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from helpers import LR_A, LR_B, ops_group
from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
train, evald = make_demo_datasets(256, 16)
"""
FIT = """
exp = Experiment("cells"{mode})
exp.run_fit(ops_group(LR_A, LR_B), tiny_create_model, train, evald, num_chunks=4, seed=5)
None
"""
READ = """
info = exp.get_runs_info()
print("STATUSES", sorted(set(info.status)))
print("TRAINING", exp.engine.busy(timeout=1))
"""
END = "exp.end(wait=False)"


def run_cells(tmp_path, mode: str, pause_before_read: float = 0.0,
              interrupt_read_after: float | None = None) -> list[str]:
    """Run SETUP, FIT, READ, END in a fresh kernel; the text each cell printed.
    ``interrupt_read_after``: Kernel > Interrupt that many seconds into the READ cell."""
    import threading

    from jupyter_client.manager import KernelManager

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (SETUP, FIT.format(mode=mode), READ, END)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               RF_TENSORBOARD_ENABLED="0", PYTHONUNBUFFERED="1")
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    try:
        client = nbclient.NotebookClient(nb, km=km, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if index == 2 and pause_before_read:
                    time.sleep(pause_before_read)    # a person reading the panel first
                timer = None
                if index == 2 and interrupt_read_after is not None:
                    timer = threading.Timer(interrupt_read_after, km.interrupt_kernel)
                    timer.start()
                client.execute_cell(cell, index)
                if timer is not None:
                    timer.join()
    finally:
        km.shutdown_kernel(now=True)
        km.cleanup_resources()
    return ["".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
            for cell in nb.cells]


def test_rapidfire_code_run_top_to_bottom_reads_final_results_after_run_fit(tmp_path):
    out = run_cells(tmp_path, mode=', mode="fit"')
    assert QUEUED_LINE in out[2]
    assert "STATUSES ['completed']" in out[2] and "TRAINING False" in out[2], out[2]


def test_a_cell_run_by_hand_after_run_fit_reads_the_runs_as_they_train(tmp_path):
    out = run_cells(tmp_path, mode=', mode="fit"', pause_before_read=2.0)
    assert QUEUED_LINE not in out[2]
    assert "TRAINING True" in out[2], out[2]


def test_our_own_notebooks_steer_between_queued_cells_as_before(tmp_path):
    out = run_cells(tmp_path, mode="")
    assert QUEUED_LINE not in out[2]
    assert "TRAINING True" in out[2], out[2]


def test_interrupting_the_queued_cells_wait_runs_it_on_the_runs_as_they_are(tmp_path):
    out = run_cells(tmp_path, mode=', mode="fit"', interrupt_read_after=3.0)
    assert QUEUED_LINE in out[2]
    assert "interrupted the wait only" in out[2], out[2]
    assert "TRAINING True" in out[2], out[2]     # the runs went on; the cell read them as they were
