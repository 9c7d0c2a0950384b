"""Real-browser fixtures: a JupyterLab server on 127.0.0.1 and Debian's Chromium driven by Playwright.

Chromium is the system one (``apt-get install chromium``); Playwright never downloads a browser
here. The server runs from a temporary root folder with a random token and a free port, with
the flags that worked on this project's machine (DESIGN §7).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output" / "browser"
CHROMIUM = os.environ.get("RF_CHROMIUM", "/usr/bin/chromium")
BUNDLE = ROOT / "rapidfire_nb" / "static" / "panel.js"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bundle_is_current() -> bool:
    if not BUNDLE.exists():
        return False
    sources = [p for p in (ROOT / "js" / "src").rglob("*.ts")] + [ROOT / "js" / "package.json", ROOT / "js" / "build.mjs"]
    return all(p.stat().st_mtime <= BUNDLE.stat().st_mtime for p in sources if p.exists())


def ensure_bundle() -> None:
    """The browser must see the view of this checkout: (re)build it from js/ if missing or stale."""
    if _bundle_is_current():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"{BUNDLE} is missing and npm is not installed to build it (cd js && npm install && npm run build)")
    js = ROOT / "js"
    if not (js / "node_modules").is_dir():
        subprocess.run([npm, "install", "--no-audit", "--no-fund"], cwd=js, check=True)
    subprocess.run([npm, "run", "build"], cwd=js, check=True)


class Lab:
    def __init__(self, url: str, token: str, root: Path, proc: subprocess.Popen, log_path: Path):
        self.url, self.token, self.root, self.proc, self.log_path = url, token, root, proc, log_path

    def api(self, path: str, method: str = "GET", body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    ensure_bundle()
    root = tmp_path_factory.mktemp("lab-root")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    port = _free_port()
    log_path = OUTPUT / "jupyterlab.log"
    env = dict(os.environ)
    # The kernel must import this checkout's rapidfire_nb, installed or not.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("RF_TENSORBOARD_ENABLED", "0")
    config_dir = root / ".jupyter-config"  # no user settings leak in
    env["JUPYTER_CONFIG_DIR"] = str(config_dir)
    # JupyterLab asks about news in a toast that can cover the panel's buttons.
    settings = config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # CI containers run as root
    log_file = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    lab = Lab(f"http://127.0.0.1:{port}", token, root, proc, log_path)
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("/api/status")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if time.monotonic() > deadline:
                proc.terminate()
                pytest.fail(f"jupyter lab did not answer within 90 s:\n{lab.log_tail()}")
            time.sleep(0.5)
    yield lab
    try:
        lab.api("/api/shutdown", method="POST")  # also shuts the kernels down
        proc.wait(timeout=30)
    except Exception:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    log_file.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (or set RF_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    console: list[str] = []
    pg.on("console", lambda msg: console.append(f"{msg.type}: {msg.text}"))
    pg.on("pageerror", lambda err: console.append(f"pageerror: {err}"))
    pg.console_log = console  # type: ignore[attr-defined]
    yield pg
    try:
        pg.screenshot(path=str(OUTPUT / "last.png"), full_page=True)  # whatever the outcome, the final state
    except Exception:
        pass
    (OUTPUT / "console.log").write_text("\n".join(console), encoding="utf-8")
    context.close()
