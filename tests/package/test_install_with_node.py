"""Installing a clone with Node.js on the PATH writes nothing tracked and runs no npm.

A git clone of this checkout (its files as git knows them, committed in a fresh repository) is
installed with ``pip install -e .`` and with ``pip install .`` into a plain venv whose PATH has
the real ``node`` and ``npm`` on it, behind an ``npm`` that first notes each call in a file. After
both installs ``git status`` must be clean, ``js/node_modules`` must not exist and npm must not
have been called; the editable install must import the clone's package and find the bundle.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import site_dirs, source_files

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.slow


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def test_install_with_node_on_the_path_runs_no_npm_and_leaves_the_clone_clean(tmp_path):
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("this test needs Node.js and npm on the PATH (the case it checks)")
    if not (importlib.util.find_spec("hatchling") and importlib.util.find_spec("hatch_jupyter_builder")):
        pytest.fail("needs hatchling and hatch-jupyter-builder (the [test] extra) to build offline")

    src = tmp_path / "clone"
    for rel in source_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    _git(src, "init", "-q")
    _git(src, "add", "-A")
    _git(src, "commit", "-q", "-m", "clone")
    # the bundle's mtime older than every js source: a build hook judging by mtimes would rebuild
    for p in (src / "js").rglob("*"):
        if p.is_file():
            os.utime(p, None)
    bundle = src / "rapidfire_nb" / "static" / "panel.js"
    os.utime(bundle, (1_000_000_000, 1_000_000_000))
    assert _git(src, "status", "--porcelain") == ""

    # npm as found on the PATH, behind a shim that notes every call and then runs the real one
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "npm-calls.txt"
    (shims / "npm").write_text(f'#!/bin/sh\necho "$PWD: $*" >> {calls}\nexec {npm} "$@"\n')
    (shims / "npm").chmod(0o755)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "_parent_site.pth").write_text("\n".join(site_dirs()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), str(shims), str(Path(node).parent), "/usr/bin", "/bin"])
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    assert shutil.which("npm", path=env["PATH"]) == str(shims / "npm")
    assert shutil.which("node", path=env["PATH"]) is not None

    for how in (["-e", str(src)], [str(src)]):
        cmd = [str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", *how]
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, f"{' '.join(how)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert not calls.exists(), f"pip install {' '.join(how)} ran npm: {calls.read_text()}"
        assert not (src / "js" / "node_modules").exists(), f"pip install {' '.join(how)} created js/node_modules"
        status = _git(src, "status", "--porcelain", "--ignored", "--", "js", "rapidfire_nb/static")
        assert status == "", f"pip install {' '.join(how)} changed the clone:\n{status}"
        if how[0] == "-e":
            probe = ("import rapidfire_nb\nfrom rapidfire_nb.notebook.panel import bundle_path, _load_esm\n"
                     "assert 'bundle is missing' not in _load_esm()\nprint(rapidfire_nb.__file__)\n")
            out = subprocess.run([str(py), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=300)
            assert out.returncode == 0, out.stderr[-3000:]
            assert out.stdout.split()[-1].startswith(str(src)), out.stdout
    # the whole clone, not only js/: nothing tracked changed
    assert _git(src, "status", "--porcelain", "--untracked-files=no") == ""


def test_build_function_builds_only_a_missing_bundle(tmp_path, monkeypatch):
    """Without the bundle and without npm, the hook says what to do instead of failing obscurely."""
    sys.path.insert(0, str(ROOT))
    try:
        from js.hatch_build_panel import build_panel
    finally:
        sys.path.remove(str(ROOT))
    (tmp_path / "js").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(RuntimeError, match="panel.js is missing and npm is not on the PATH"):
        build_panel("wheel", "editable", path="js")
    bundle = tmp_path / "rapidfire_nb" / "static" / "panel.js"
    bundle.parent.mkdir(parents=True)
    bundle.write_text("export default {}")
    build_panel("wheel", "editable", path="js")   # present: nothing to do, npm not needed
    assert bundle.read_text() == "export default {}"
