"""The notebook layer sees an experiment through ``ExperimentView`` only.

The panel, the magics, the status text, the TensorBoard frame and RapidFire AI's notebook controls
(``rapidfire_nb/notebook/``, ``rapidfire_nb/compat/``) read no private attribute of the facade,
never reach its engine and never probe it with ``getattr``/``hasattr``: what they need is a named,
read-only fact or op of the view (``rapidfire_nb/experiment_view.py``), which is the one place that
knows the facade's inside and tolerates stand-ins. The first tests parse the files (as
tests/package/test_layering.py does); the others pin what the view answers.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

import rapidfire_nb
from rapidfire_nb.engine import EventLog
from rapidfire_nb.experiment_view import ExperimentView, view_of

PACKAGE = Path(rapidfire_nb.__file__).resolve().parent
NOTEBOOK_LAYER = sorted([*(PACKAGE / "notebook").rglob("*.py"), *(PACKAGE / "compat").rglob("*.py")])

# names that receive the Experiment in the notebook layer (parameters, attributes holding it);
# tensorboard.logdir_of's ``exp_or_path`` is not one: it takes anything with a ``path`` or a folder
_HOLDERS = {"exp", "experiment", "_exp"}


def _display_hook(name: str) -> bool:
    # IPython's display protocol (_repr_mimebundle_, _ipython_display_): public by its convention
    return (name.startswith("_repr_") or name.startswith("_ipython_")) and name.endswith("_")


def _holder(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id in _HOLDERS)
            or (isinstance(node, ast.Attribute) and node.attr in _HOLDERS))


def reaches_past_the_view(source: str, privates: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each read of the facade's private names or of an ``engine`` attribute
    (as ``x.name`` or ``getattr(x, "name")``) on anything but the module's own ``self``/``cls``,
    and each ``getattr``/``hasattr`` that probes an object holding the Experiment."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if node.attr == "engine":
                found.append((node.lineno, "reads .engine"))
            elif node.attr in privates and not own and not _display_hook(node.attr):
                found.append((node.lineno, f"reads the facade's private .{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr") and node.args):
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and name.value == "engine":
                found.append((node.lineno, f"{node.func.id}(..., 'engine')"))
            elif isinstance(name, ast.Constant) and name.value in privates:
                found.append((node.lineno, f"{node.func.id}(..., {name.value!r})"))
            elif _holder(node.args[0]):
                found.append((node.lineno, f"{node.func.id} on the Experiment ({ast.unparse(node.args[0])})"))
    return sorted(set(found))


def _privates() -> set[str]:
    """The Experiment's private names: the ``self._x`` it assigns and its ``_methods``."""
    tree = ast.parse((PACKAGE / "experiment.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Experiment")
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
             and f.name.startswith("_") and not f.name.startswith("__")}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            names.add(node.attr)
    return names


def test_the_check_finds_each_way_past_the_view():
    privates = _privates()
    assert {"_state", "_folder", "_interrupted_line"} <= privates
    source = ("def status(exp):\n"
              "    return exp._state().read(len)\n"                       # 2
              "def busy(exp):\n"
              "    return getattr(exp, 'engine', None)\n"                 # 4
              "class P:\n"
              "    def q(self, panel):\n"
              "        return panel._exp.engine.busy()\n"                 # 7
              "    def r(self):\n"
              "        return hasattr(self._exp, 'events')\n"             # 9
              "    def s(self, x):\n"
              "        return getattr(x, '_folder', 0), self._panel\n"    # 11 (self's own: fine)
              "    def t(self, x):\n"
              "        return x._repr_mimebundle_(), getattr(x, 'name')\n")   # display hook, any x: fine
    assert [line for line, _ in reaches_past_the_view(source, privates)] == [2, 4, 7, 9, 11], \
        reaches_past_the_view(source, privates)


def test_the_notebook_layer_reads_the_experiment_through_its_view_only():
    assert NOTEBOOK_LAYER and any(p.name == "panel.py" for p in NOTEBOOK_LAYER)
    privates = _privates()
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for path in NOTEBOOK_LAYER
             for line, what in reaches_past_the_view(path.read_text(encoding="utf-8"), privates)]
    assert found == [], "\n".join(found)


# -- what the view answers ------------------------------------------------------------------------

def test_a_stand_in_reads_as_an_experiment_with_nothing_started():
    log = EventLog(None)
    stand_in = SimpleNamespace(name="synthetic", path="/synthetic", events=log)
    view = view_of(stand_in)
    assert view.key is stand_in and view_of(view) is view
    assert (view.name, view.path, view.events) == ("synthetic", "/synthetic", log)
    assert not (view.read_only or view.ended or view.folder_given_back or view.fit_started)
    assert not view.has_table and view.read_table(len) is None and view.events_path is None
    assert view.queued_ops(timeout=0.1) == [] and view.busy(timeout=0.1) is False
    assert view.on_device is None and view.num_chunks is None
    assert view.training_now() == {} and view.workers_starting == 0
    # an object without a log has no events to show (the panel refuses it)
    assert view_of(object()).events is None
    assert view_of(SimpleNamespace(events="not a log")).events is None


def test_the_engines_facts_come_through_checked():
    asked = []
    engine = SimpleNamespace(num_chunks=4, on_device=True, busy=lambda timeout: timeout == 0.5,
                             queued_ops=lambda timeout: None,
                             training_now=lambda timeout: asked.append(timeout) or {"w1": 3},
                             executor=SimpleNamespace(worker_count=2))
    view = view_of(SimpleNamespace(name="x", events=EventLog(None), engine=engine))
    assert view.fit_started and view.num_chunks == 4
    assert view.on_device is None                     # a bool is not a run id
    assert view.busy(timeout=0.5) is True and view.busy(timeout=0.1) is False
    assert view.queued_ops(timeout=0.1) is None       # the engine kept its lock: unknown
    assert view.training_now() == {"w1": 3} and view.workers_starting == 2
    view.training_now(timeout=0.01)                   # the caller's patience reaches the engine
    assert asked == [1.0, 0.01]


def test_the_view_is_read_only():
    view = ExperimentView(SimpleNamespace(name="x"))
    for name in ("name", "path", "read_only", "ended", "events", "fit_started", "key"):
        with pytest.raises(AttributeError):
            setattr(view, name, None)
    with pytest.raises(AttributeError):
        view.anything = 1                             # no attribute of its own beyond the object
    with pytest.raises(ValueError, match="unknown op"):
        view.status_op("clone", 1)                    # the panel's buttons: stop, resume, delete


def test_the_facade_hands_out_its_view(tmp_path: Path):
    from rapidfire_nb import Experiment

    exp = Experiment("viewed", experiment_path=tmp_path)
    try:
        view = exp.view()
        assert isinstance(view, ExperimentView) and view.key is exp
        assert view_of(exp).key is exp
        assert (view.name, view.path) == (exp.name, exp.path)
        assert view.events is exp.events and view.events_path == exp.path / "events.jsonl"
        assert view.has_table and view.read_table(lambda t: len(t["runs"])) == 0
        assert not (view.fit_started or view.read_only or view.ended or view.folder_given_back)
        assert view.queued_ops(timeout=0.1) == [] and view.busy(timeout=0.1) is False
        assert exp.name in view.interrupted_line()
    finally:
        exp.end()
    assert view.ended
