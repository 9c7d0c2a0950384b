"""The panel's JavaScript bundle ships with the package, and installing needs no Node.js.

``rapidfire_nb/static/panel.js`` is committed: ``js/build.mjs`` writes it deterministically, and
``npm run check-bundle`` (``node build.mjs --check``) rebuilds it in memory and fails when the
committed file differs, so the bundle that ships is always a fresh build of ``js/``.

The install test copies the files git knows about (a clone) into a temporary folder and
``pip install``s that folder into a plain ``python -m venv`` with a PATH on which neither
``node`` nor ``npm`` exists, then imports the package from that venv and finds the bundle. The
venv sees this interpreter's packages (torch, IPython, hatchling...) through a ``.pth`` file
rather than ``--system-site-packages``, which would only reach the *base* interpreter's
site-packages and miss everything installed in a virtualenv running this test.
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
BUNDLE = ROOT / "rapidfire_nb" / "static" / "panel.js"

pytestmark = pytest.mark.slow


def test_bundle_is_committed_and_equals_a_fresh_build():
    assert "rapidfire_nb/static/panel.js" in source_files(), "the panel bundle must be committed"
    node = shutil.which("node")
    if node is None or not (ROOT / "js" / "node_modules").is_dir():
        pytest.fail("checking the committed bundle needs Node.js >= 20 and js/node_modules "
                    "(cd js && npm install); the README's test command installs them first")
    proc = subprocess.run([node, "build.mjs", "--check"], cwd=ROOT / "js", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "equals a fresh build" in proc.stdout


def test_clone_installs_without_node(tmp_path):
    src = tmp_path / "clone"
    for rel in source_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    assert (src / "rapidfire_nb" / "static" / "panel.js").is_file()
    assert not (src / "js" / "node_modules").exists()

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # Only paths: .pth files inside those folders are not run, so this checkout's editable
    # install (if any) stays out and the installed copy is the one imported.
    (Path(purelib) / "_parent_site.pth").write_text("\n".join(site_dirs()) + "\n")

    # A PATH with the venv's bin and nothing else: no node, no npm.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = str(venv / "bin")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    assert shutil.which("node", path=env["PATH"]) is None and shutil.which("npm", path=env["PATH"]) is None
    cmd = [str(py), "-m", "pip", "install", "--no-deps", str(src)]
    # With the build backend at hand (the [test] extra has it): offline and faster. Otherwise pip
    # fetches hatchling into an isolated build env, as a user's install does.
    if importlib.util.find_spec("hatchling") and importlib.util.find_spec("hatch_jupyter_builder"):
        cmd[4:4] = ["--no-build-isolation", "--no-index"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip install without node failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    probe = (
        "import hashlib, rapidfire_nb, rapidfire\n"
        "from rapidfire_nb.notebook.panel import bundle_path, _load_esm\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "for name in ('rapidfire', 'rapidfire_nb'):\n"
        "    assert sh.run_line_magic('load_ext', name) in (None, 'already loaded'), name\n"
        "assert 'rapidfire' in sh.magics_manager.magics['line']\n"
        "assert 'bundle is missing' not in _load_esm()\n"
        "print(rapidfire_nb.__file__)\n"
        "print(bundle_path())\n"
        "print(hashlib.sha256(bundle_path().read_bytes()).hexdigest())\n"
    )
    proc = subprocess.run([str(py), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    module_file, bundle, digest = proc.stdout.split()[-3:]
    assert module_file.startswith(str(venv)), f"rapidfire_nb imported from {module_file}, not from the install"
    assert bundle.startswith(str(venv)) and Path(bundle).is_file()
    import hashlib

    assert digest == hashlib.sha256(BUNDLE.read_bytes()).hexdigest(), "the installed bundle is not the committed one"
    installed = Path(bundle).read_text(encoding="utf-8")
    assert "rfInspect" in installed and "rf-panel" in installed  # the real view, its canvas charts inside
    record = next(Path(purelib).glob("rapidfire_nb-*.dist-info/RECORD")).read_text()
    assert "rapidfire_nb/static/panel.js" in record and "node_modules" not in record
