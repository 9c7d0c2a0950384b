"""The package's layering, read from the code: no import circles, no module importing a layer above
its own (DESIGN §2). Every import counts, at module level or inside a function: an import moved
into a function to dodge a circle is still that circle.

The rest of the package uses the engine through its face (``rapidfire_nb/engine/__init__.py``)
only: the names of its ``__all__``, never a submodule. Tests may reach inside (they are white-box).

Run alone: ``python -m pytest -q tests/package/test_layering.py`` (no torch, no TRL in this process: it
parses files; the test that every name of the face resolves imports them in a child process).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


PACKAGE = Path(__file__).resolve().parent.parent.parent / "rapidfire_nb"
ENGINE = "rapidfire_nb.engine"
FACE = PACKAGE / "engine" / "__init__.py"

# Bottom up. A module may import its own layer and those below; the longest prefix decides.
LAYERS: list[tuple[str, int]] = [
    ("rapidfire_nb._version", 0), ("rapidfire_nb.errors", 0), ("rapidfire_nb._compat", 0),
    ("rapidfire_nb._quiet", 0), ("rapidfire_nb._environment", 0),
    ("rapidfire_nb.engine", 1),        # no notebook, no widget, no tracker, no AutoML in here
    ("rapidfire_nb.demo_data", 1),
    ("rapidfire_nb.automl", 2),        # config classes only
    ("rapidfire_nb.tuning", 3),        # the AutoML driver, its study and pruners
    ("rapidfire_nb.tracking", 3),      # subscribers of the event log
    ("rapidfire_nb.report", 3),        # figures and reports: readers of the event log
    ("rapidfire_nb.launch", 4),        # run_fit's pipeline: plain values in, plans out
    ("rapidfire_nb.results", 4),       # result frames of the folded run table
    ("rapidfire_nb.layout", 4),        # RapidFire AI's folder layout (final checkpoints)
    ("rapidfire_nb.folder", 4),        # the experiment folder a facade claims
    ("rapidfire_nb.experiment", FACADE := 5),    # the user's facade ...
    ("rapidfire_nb.session", 5),       # ... the kernel's experiments ...
    ("rapidfire_nb.experiment_view", 5),   # ... the notebook layer's read-only view of one ...
    ("rapidfire_nb._views", 5),        # ... and the registry that hands one to a notebook view
    ("rapidfire_nb.notebook", 6), ("rapidfire_nb.compat", 6),
    ("rapidfire_nb", 7),               # the package's public face (re-exports)
    ("rapidfire_nb.bench", 7),
    ("rapidfire_nb.cli", 8), ("rapidfire_nb.__main__", 8),
]

def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def imports_of(module: str, source: str, mods, is_package: bool = False) -> list[tuple[int, str, str]]:
    """(line, module, name) for each use of the package's modules in ``module``'s source; name is
    "" where the module itself is taken. ``from pkg import x`` gives (pkg.x, "") when that is a
    module, else (pkg, "x"); ``alias.x``, where an import bound ``alias`` to a module, is read
    the same way (the face's names used as ``engine.x`` count as much as imported ones)."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    found: list[tuple[int, str, str]] = []
    bound: dict[str, str] = {}    # local name -> the module an import bound it to

    def take(line: int, base: str, name: str) -> str:
        if f"{base}.{name}" in mods:
            found.append((line, f"{base}.{name}", ""))
            return f"{base}.{name}"
        found.append((line, base, name))
        return ""

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.append((node.lineno, a.name, ""))
                if a.asname:
                    bound[a.asname] = a.name
                else:
                    bound[a.name.partition(".")[0]] = a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:
                if take(node.lineno, base, a.name):
                    bound[a.asname or a.name] = f"{base}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            head, *rest = (_dotted(node.value) or "").split(".")
            target = bound.get(head)
            for part in rest:
                target = f"{target}.{part}" if target and f"{target}.{part}" in mods else None
            if target in mods:
                take(node.lineno, target, node.attr)
    return found


def _face_assignments() -> dict[str, ast.expr]:
    tree = ast.parse(FACE.read_text(encoding="utf-8"))
    return {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}


def face_names() -> list[str]:
    """``rapidfire_nb.engine.__all__``, read from the file: a literal, or ``sorted(<literal>)``."""
    assigned = _face_assignments()
    value = assigned["__all__"]
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "sorted"
            and len(value.args) == 1 and isinstance(value.args[0], ast.Name)):
        value = assigned[value.args[0].id]
    return sorted(ast.literal_eval(value))


def face_table() -> dict[str, str]:
    """The face's name -> the submodule it loads it from (its ``_WHERE``), read from the file."""
    return ast.literal_eval(_face_assignments()["_WHERE"])


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from pkg import name`` counts as ``pkg.name``
    when that is a module, else as ``pkg``; a name of the engine's face counts as the submodule
    the face loads it from)."""
    mods = modules()
    table = face_table()
    graph = {}
    for name, path in mods.items():
        targets = set()
        for _, target, attr in imports_of(name, path.read_text(encoding="utf-8"), mods,
                                          path.name == "__init__.py"):
            targets.add(f"{ENGINE}.{table[attr]}" if target == ENGINE and attr in table else target)
        graph[name] = {t for t in targets if t in mods and t != name}
    return graph


def face_breaches(module: str, source: str, mods, names: set[str], is_package: bool = False) -> list[tuple[int, str]]:
    """(line, what) for each use of the engine past its face in ``module``'s source."""
    out = []
    for line, target, attr in imports_of(module, source, mods, is_package):
        if target.startswith(ENGINE + "."):
            out.append((line, f"uses the engine's submodule {target}"))
        elif target == ENGINE and attr and attr not in names:
            out.append((line, f"uses rapidfire_nb.engine.{attr}, which is not in engine.__all__"))
    return sorted(out)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def layer(module: str) -> int | None:
    best = None
    for prefix, rank in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), rank)
    return None if best is None else best[1]


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, targets in graph.items() for t in targets
                  if layer(t) is not None and layer(m) is not None and layer(t) > layer(m))


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer(m) is None] == []


def test_the_checker_finds_a_circle_and_an_upward_import():
    graph = {"rapidfire_nb.engine.a": {"rapidfire_nb.experiment"},
             "rapidfire_nb.experiment": {"rapidfire_nb.engine.a"}}
    assert circles(graph) == [["rapidfire_nb.engine.a", "rapidfire_nb.experiment"]]
    assert upward(graph) == [("rapidfire_nb.engine.a", "rapidfire_nb.experiment")]
    # and reads real imports: the package face imports the facade
    assert "rapidfire_nb.experiment" in import_graph()["rapidfire_nb"]


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_no_upward_imports():
    assert upward(import_graph()) == []


def test_the_face_check_finds_a_submodule_and_a_name_off_the_face():
    source = ("from rapidfire_nb.engine.state import fold\n"
              "from rapidfire_nb.engine import runs as R, get_run, _private\n"
              "from ..engine import not_there\n"
              "import rapidfire_nb.engine.store\n"
              "from rapidfire_nb import engine as E\n"
              "E.get_run, E.nope, E.state\n"
              "def f():\n    from rapidfire_nb.engine.workers import pool\n")
    found = face_breaches("rapidfire_nb.tracking.x", source, modules(), set(face_names()))
    assert [line for line, _ in found] == [1, 2, 2, 3, 4, 6, 6, 8], found
    # what the face offers passes, as a name or through the module
    ok = "from rapidfire_nb.engine import get_run, runs_by_id\nfrom .. import engine\nengine.fold\n"
    assert face_breaches("rapidfire_nb.tracking.x", ok, modules(), set(face_names())) == []


def test_the_package_uses_the_engine_through_its_face_only():
    mods = modules()
    names = set(face_names())
    found = [f"{m}:{line}: {what}" for m, path in sorted(mods.items())
             if m != ENGINE and not m.startswith(ENGINE + ".")
             for line, what in face_breaches(m, path.read_text(encoding="utf-8"), mods, names,
                                             path.name == "__init__.py")]
    assert found == [], "\n".join(found)


def test_every_name_of_the_face_resolves_and_importing_it_loads_none():
    """Read from the file, ``__all__`` is the module's; importing the face imports no submodule
    (the reducer's readers stay torch-free); each name then loads from its submodule."""
    code = ("import sys\nimport rapidfire_nb.engine as face\n"
            "print(sorted(m for m in sys.modules if m.startswith('rapidfire_nb.engine.') or m == 'torch'))\n"
            "print(sorted(face.__all__))\n"
            "print([n for n in face.__all__ if n not in dir(face)])\n"
            "print([n for n in face.__all__ if getattr(face, n, None) is None])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, names, undir, missing = out.stdout.strip().splitlines()[-4:]
    assert loaded == "[]"
    assert names == str(face_names())
    assert undir == "[]" and missing == "[]"


# -- the facade hands plain values down ----------------------------------------------------------
#
# Modules below the facade (launch/, tuning/, results, the engine, ...) are given plain values:
# a store, an event log, a run table, a plan. None of them receives the Experiment (no parameter
# named for it, no call of the facade's that passes it ``self``) or reaches into its private
# attributes, which would be a hidden channel across the layers.

FACADE_MODULE = "rapidfire_nb.experiment"
_EXPERIMENT_NAMES = {"exp", "experiment"}


def facade_privates(source: str) -> set[str]:
    """The Experiment's private names: ``self._x`` it assigns, and its ``_methods``."""
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Experiment")
    names = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)
             and f.name.startswith("_") and not f.name.startswith("__")}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            names.add(node.attr)
    return names


def reaches_into_the_facade(source: str, privates: set[str]) -> list[tuple[int, str]]:
    """(line, what) where a module takes an Experiment as a parameter or reads one of its
    private attributes from an object other than its own ``self``/``cls``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.arg in _EXPERIMENT_NAMES:
                    found.append((node.lineno, f"takes an Experiment as {arg.arg!r}"))
        elif (isinstance(node, ast.Attribute) and node.attr in privates
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append((node.lineno, f"reads the facade's private .{node.attr}"))
    return sorted(found)


def passes_self_down(source: str, module: str, mods) -> list[tuple[int, str]]:
    """(line, callee) for each call in the facade that hands ``self`` to a module below it."""
    bound: dict[str, str] = {}
    for _line, target, attr in imports_of(module, source, mods):
        if not attr and target in mods:
            bound[target.rpartition(".")[2]] = target
        elif attr:
            bound[attr] = target
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        given = [*node.args, *(k.value for k in node.keywords)]
        if not any(isinstance(a, ast.Name) and a.id == "self" for a in given):
            continue
        head = (_dotted(node.func) or "").split(".")[0]
        target = bound.get(head)
        if target is None:
            continue     # a method of its own, a builtin, a local helper
        if layer(target) is not None and layer(target) < layer(module):
            found.append((node.lineno, f"{_dotted(node.func)} ({target})"))
    return sorted(found)


def test_the_facade_check_finds_each_kind_of_reach():
    privates = facade_privates((PACKAGE / "experiment.py").read_text(encoding="utf-8"))
    assert {"_state", "_ended", "_log_open"} <= privates
    below = ("def restore(exp, specs):\n    exp._ended = True\n"
             "def ok(self, store):\n    return self._state, store.root\n"
             "def peek(x):\n    return x._log_open()\n")
    assert [line for line, _ in reaches_into_the_facade(below, privates)] == [1, 2, 6]
    facade = ("from rapidfire_nb.launch import resume\nfrom rapidfire_nb import session\n"
              "class E:\n    def f(self):\n        resume.restore(self)\n"
              "        session.make_current(self)\n        self.g(self)\n")
    found = passes_self_down(facade, FACADE_MODULE, modules())
    assert found == [(5, "resume.restore (rapidfire_nb.launch.resume)")], found


def test_no_module_below_the_facade_receives_the_experiment():
    mods = modules()
    facade = mods[FACADE_MODULE].read_text(encoding="utf-8")
    privates = facade_privates(facade)
    found = [f"{FACADE_MODULE}:{line}: hands self to {callee}"
             for line, callee in passes_self_down(facade, FACADE_MODULE, mods)]
    for m, path in sorted(mods.items()):
        if layer(m) is None or layer(m) >= layer(FACADE_MODULE):
            continue
        found += [f"{m}:{line}: {what}"
                  for line, what in reaches_into_the_facade(path.read_text(encoding="utf-8"), privates)]
    assert found == [], "\n".join(found)
