"""RapidFire AI 0.16.2's two Colab fine-tuning tutorials, as its wheel ships them
(tests/fixtures/rapidfireai_0162/), run top to bottom in a real kernel after changing only their
``rapidfireai`` imports, offline.

What the test changes, and nothing else:
- the imports: ``rapidfireai`` -> ``rapidfire_nb``, and RapidFire's module paths
  (``rapidfireai.fit...``, ``rapidfireai.utils...``) -> ``rapidfire_nb.compat...``;
- the cell that starts RapidFire's services (``rapidfireai start``): there is nothing to start;
- the hub, as the docs test does it: a first cell maps ``from_pretrained`` of a hub name to a tiny
  model saved under that name and ``load_dataset`` of the Bitext dataset to look-alike rows
  (tests/helpers.py);
- sizes, for CPU time: ``max_steps=64`` -> 8, ``max_new_tokens=128`` -> 16.

``evaluate`` is not installed here, so the notebooks' own ``except`` returns no ROUGE-L; the end
button returns at once (the cell before it waited for the runs: the notebook was run top to
bottom, and its experiment says ``mode="fit"``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: trains two RapidFire notebooks in kernels

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures" / "rapidfireai_0162"
TENSORBOARD = FIXTURES / "rf-colab-tensorboard-tutorial.ipynb"
TRACKIO = FIXTURES / "rf-colab-tutorial-sft-trackio.ipynb"

STANDINS = f"""
# offline stand-ins for the hub (the test's, not the notebook's)
import os, sys
sys.path.insert(0, {str(TESTS)!r})
import datasets, transformers
from helpers import customer_support_rows, local_model_dir

_root = os.path.abspath("hub")
def _local(name):
    return name if os.path.isdir(str(name)) else local_model_dir(__import__("pathlib").Path(_root), str(name))
for _cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
    _cls.from_pretrained = (lambda _orig: classmethod(
        lambda cls, name, *a, **k: _orig.__func__(cls, _local(name), *a, **k)))(_cls.from_pretrained)
def _load_dataset(name, *args, split=None, **kwargs):
    assert name == "bitext/Bitext-customer-support-llm-chatbot-training-dataset", name
    rows = customer_support_rows(64)
    return rows if split is not None else datasets.DatasetDict({{"train": rows}})
datasets.load_dataset = _load_dataset
"""

_IMPORT = re.compile(r"^(\s*)(from|import)\s+rapidfireai\b", re.M)
_SIZES = [(re.compile(r"max_steps=64\b"), "max_steps=8"),
          (re.compile(r'"max_new_tokens": 128\b'), '"max_new_tokens": 16')]


def change_imports(source: str) -> str:
    def one(m: re.Match) -> str:
        return f"{m.group(1)}{m.group(2)} rapidfire_nb"
    source = re.sub(r"^(\s*from\s+)rapidfireai\.(fit|utils)\b", r"\1rapidfire_nb.compat.\2", source, flags=re.M)
    return _IMPORT.sub(one, source)


def prepared(path: Path):
    nb = nbformat.read(str(path), as_version=4)
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        if '"rapidfireai", "start"' in cell.source:   # RapidFire's services: nothing to start
            continue
        source = change_imports(cell.source)
        for pattern, small in _SIZES:
            source = pattern.sub(small, source)
        cell.source = source
        cells.append(cell)
    first = nbformat.v4.new_code_cell(STANDINS)
    first.pop("id", None)   # the notebook's format (4.4) has no cell ids
    nb.cells = [first] + cells
    return nb


def test_only_imports_sizes_and_the_services_cell_change():
    nb = prepared(TENSORBOARD)
    original = [c.source for c in nbformat.read(str(TENSORBOARD), as_version=4).cells if c.cell_type == "code"]
    changed = [c.source for c in nb.cells[1:] if c.cell_type == "code"]
    assert len(changed) == len(original) - 1
    kept = [s for s in original if '"rapidfireai", "start"' not in s]
    for before, after in zip(kept, changed):
        lines = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
        for a, b in lines:
            assert re.match(r"\s*(from|import) rapidfireai", a) or "max_steps=64" in a \
                or "max_new_tokens" in a, (a, b)
    joined = "\n".join(changed)
    assert "from rapidfire_nb.compat.utils.notebook_ui import NotebookUI" in joined
    assert "from rapidfire_nb.compat.fit.db.rf_db import RfDb" in joined
    assert "from rapidfire_nb import Experiment" in joined


def execute(nb, tmp_path: Path) -> None:
    from jupyter_client.manager import KernelManager

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", GRADIO_ANALYTICS_ENABLED="False", TRACKIO_DIR=str(tmp_path / "trackio-home"),
               RF_TENSORBOARD_ENABLED="true")   # RapidFire's default (the test suite turns it off)
    env.pop("RF_TRACKIO_ENABLED", None)
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    try:
        client = nbclient.NotebookClient(nb, km=km, timeout=900, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        try:
            client.execute()
        finally:
            nbformat.write(nb, str(tmp_path / "executed.ipynb"))
    finally:
        km.shutdown_kernel(now=True)
        km.cleanup_resources()
        _stop_tensorboards(tmp_path)


def _stop_tensorboards(tmp_path: Path) -> None:
    """The notebook's ``%tensorboard`` started a TensorBoard on its logs: stop that one, by pid."""
    import signal

    try:
        from tensorboard import manager
    except ImportError:
        return
    for info in manager.get_all():
        if str(tmp_path) in (info.logdir or ""):
            try:
                os.kill(info.pid, signal.SIGTERM)
            except OSError:
                pass


def text_of(nb) -> str:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", "") or json.dumps(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def runs_of(folder: Path):
    from rapidfire_nb import Experiment

    return Experiment.open(folder).get_runs_info()


def test_tensorboard_tutorial_runs_end_to_end(tmp_path):
    nb = prepared(TENSORBOARD)
    execute(nb, tmp_path)
    experiments = tmp_path / "rapidfire_experiments"
    info = runs_of(experiments / "tensorboard-demo-1")
    assert len(info) == 4 and set(info.status) == {"completed"}, info.error.tolist()
    assert (info.completed_steps == info.total_steps).all()
    # the TensorBoard folder the notebook pointed %tensorboard at holds every run's event files
    logs = experiments / "tensorboard_logs" / "tensorboard-demo-1"
    assert len({p.parent for p in logs.rglob("events.out.tfevents.*")}) >= 4
    text = text_of(nb)
    assert "this cell was queued behind run_fit" in text        # the end button's cell waited
    assert "Last 30 lines of events.jsonl" in text and "Last 30 lines of engine.log" in text
    assert text.count("End experiment") == 1


def test_trackio_tutorial_runs_end_to_end(tmp_path):
    pytest.importorskip("trackio")
    nb = prepared(TRACKIO)
    execute(nb, tmp_path)
    info = runs_of(tmp_path / "rapidfire_experiments" / "trackio-demo-1")
    assert len(info) == 4 and set(info.status) == {"completed"}, info.error.tolist()
    assert (info.completed_steps == info.total_steps).all()
    assert (tmp_path / "trackio-home" / "trackio-demo-1.db").is_file()   # the TRACKIO_DIR given
    text = text_of(nb)
    assert "Last 30 lines of events.jsonl" in text
    assert text.count("End experiment") == 1   # shown once, though the cell's last line
