"""The wheel/sdist build hook's build function (pyproject.toml, [tool.hatch.build.hooks.jupyter-builder]).

The panel bundle ``rapidfire_nb/static/panel.js`` is committed and equals a fresh build of this
folder (``npm run check-bundle``), so an install, editable or not, uses it as it is: no npm, no
``node_modules``, no rewritten ``package-lock.json``, even with Node.js on the PATH.
(hatch-jupyter-builder's own ``npm_builder`` honours ``skip-if-exists`` only for standard builds
and runs ``npm install`` for every editable one.) Only a checkout without the bundle builds it,
with ``npm ci``, which installs exactly the lock file and never writes it.

Imported by the hook as ``js.hatch_build_panel`` from the project root (a namespace package:
this folder has no ``__init__.py``), inside the build's own environment: the standard library only.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

BUNDLE = Path("rapidfire_nb") / "static" / "panel.js"


def build_panel(target_name: str, version: str, path: str = "js", **_ignored) -> None:
    """Build the bundle only when it is missing."""
    root = Path.cwd()
    if (root / BUNDLE).is_file():
        print(f"rapidfire_nb: using the committed {BUNDLE} ({target_name}, {version}); npm not run")
        return
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"{BUNDLE} is missing and npm is not on the PATH to build it: install from a complete "
            "clone (the bundle is committed), or install Node.js 20+ and run "
            "`cd js && npm ci && npm run build`")
    js = root / path
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=js, check=True)
    subprocess.run([npm, "run", "build"], cwd=js, check=True)
    if not (root / BUNDLE).is_file():
        raise RuntimeError(f"`npm run build` in {js} did not write {BUNDLE}")
