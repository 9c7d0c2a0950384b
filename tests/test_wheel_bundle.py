"""A wheel built from a clean source tree carries the panel's JavaScript bundle.

The bundle (rapidfire_nb/static/panel.js) is git-ignored and produced from js/ by the
hatch-jupyter-builder hook during the build, so this test copies the source files git knows
about (no static/) into a temporary folder, builds a wheel there with ``python -m build --wheel``,
and looks inside. js/node_modules is copied along when present so the hook's ``npm install``
needs no network.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _source_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode()
    return [p for p in out.split("\0") if p and (ROOT / p).is_file()]


def test_wheel_contains_the_panel_bundle(tmp_path):
    if shutil.which("npm") is None:
        pytest.fail("npm is required to build the panel bundle (install Node.js 18+)")
    src = tmp_path / "src"
    for rel in _source_files():
        dest = src / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    assert not (src / "rapidfire_nb" / "static" / "panel.js").exists()
    if (ROOT / "js" / "node_modules").is_dir():
        shutil.copytree(ROOT / "js" / "node_modules", src / "js" / "node_modules", symlinks=True)

    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist")]
    # Without isolation when the build backend is installed: faster, and no PyPI needed.
    if importlib.util.find_spec("hatchling") and importlib.util.find_spec("hatch_jupyter_builder"):
        cmd.append("--no-isolation")
    env = dict(os.environ, npm_config_audit="false", npm_config_fund="false",
               npm_config_prefer_offline="true", npm_config_update_notifier="false")
    proc = subprocess.run(cmd + [str(src)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"wheel build failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

    wheels = list((tmp_path / "dist").glob("rapidfire_nb-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        assert "rapidfire_nb/static/panel.js" in names, sorted(n for n in names if "static" in n)
        bundle = wheel.read("rapidfire_nb/static/panel.js").decode("utf-8")
        assert "rapidfire_nb/notebook/panel.py" in names
    assert not any("node_modules" in n for n in names)
    # The real bundle: plotly inside, an ES module exporting the anywidget view.
    assert len(bundle) > 500_000
    assert "extendTraces" in bundle and "rf-panel" in bundle
    assert "export{" in bundle.replace(" ", "") or "export default" in bundle

    # The wheel installs and both extension names load from it in a real InteractiveShell.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = venv / "bin" / "python"
    proc = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheels[0])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    probe = (
        "import rapidfire_nb, rapidfire\n"
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "for name in ('rapidfire', 'rapidfire_nb'):\n"
        "    assert sh.run_line_magic('load_ext', name) in (None, 'already loaded'), name\n"
        "assert 'rapidfire' in sh.magics_manager.magics['line']\n"
        "print(rapidfire_nb.__file__)\n"
    )
    proc = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert str(venv) in proc.stdout, f"rapidfire_nb imported from {proc.stdout!r}, not from the wheel"
