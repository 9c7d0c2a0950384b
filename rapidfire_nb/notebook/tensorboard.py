"""TensorBoard for an experiment, shown in whichever front-end the kernel runs in.

- :func:`start_tensorboard` starts (or reuses) one TensorBoard per log folder, bound to 127.0.0.1,
  as a subprocess (``python -m tensorboard.main``), and waits until it answers. A TensorBoard on
  the same folder started by another process (e.g. an earlier kernel) is reused too, found through
  TensorBoard's own registry of running instances (``tensorboard.manager``).
- :func:`show_tensorboard` picks the display, as ``tensorboard/notebook.py`` does: in Colab the
  kernel port proxy (``google.colab.output.serve_kernel_port_as_iframe``); in JupyterLab /
  Notebook an iframe through jupyter-server-proxy at ``{base_url}proxy/{port}/`` (the base URL is
  ``JUPYTERHUB_SERVICE_PREFIX`` under JupyterHub, else ``/``; ``RF_TENSORBOARD_PROXY_URL`` with a
  ``%PORT%`` placeholder overrides it); in VS Code an iframe on localhost (VS Code forwards the
  port); elsewhere a link printed on stdout.
- :func:`server_proxy_entry` is the ``jupyter_serverproxy_servers`` entry point: a "TensorBoard
  (RapidFire)" launcher serving every experiment under ``./rapidfire_experiments`` (or
  ``RF_EXPERIMENTS_DIR``) at ``{base_url}tensorboard-rapidfire/``.
"""

from __future__ import annotations

import atexit
import base64
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RapidFireError

HOST = "127.0.0.1"
_LOCK = threading.Lock()
_SERVERS: dict[str, TensorBoardServer] = {}


@dataclass
class TensorBoardServer:
    """A running TensorBoard. ``process`` is None when it was started by another process."""

    logdir: str
    port: int
    pid: int
    process: subprocess.Popen | None = None
    log_path: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def alive(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            return False
        return _serves(self.port, self.logdir)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it if this process started it."""
        with _LOCK:
            if _SERVERS.get(self.logdir) is self:
                del _SERVERS[self.logdir]
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)


def start_tensorboard(logdir: str | os.PathLike, timeout: float = 90.0
                      ) -> tuple[int, TensorBoardServer]:
    """Start TensorBoard on ``logdir`` (once per folder) and return ``(port, server)``."""
    logdir = str(Path(logdir).resolve())
    Path(logdir).mkdir(parents=True, exist_ok=True)
    with _LOCK:
        server = _SERVERS.get(logdir)
        if server is not None and server.alive():
            return server.port, server
        server = _find_running(logdir)
        if server is None:
            server = _launch(logdir, timeout)
        _SERVERS[logdir] = server
        return server.port, server


def stop_tensorboard(logdir: str | os.PathLike) -> bool:
    """Stop the TensorBoard this process started on ``logdir``; False if there was none."""
    server = _SERVERS.get(str(Path(logdir).resolve()))
    if server is None:
        return False
    server.stop()
    return True


def _launch(logdir: str, timeout: float) -> TensorBoardServer:
    log_path = os.path.join(tempfile.gettempdir(),
                            f"rapidfire-tensorboard-{os.getpid()}-{abs(hash(logdir))}.log")
    log = open(log_path, "wb")
    # --port 0: the OS picks a free port (no race with another starter); TensorBoard records the
    # port it got in its registry, read below.
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", HOST,
           "--port", "0", "--reload_interval", "5"]
    try:
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    deadline = time.monotonic() + timeout
    port = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RapidFireError(f"TensorBoard exited with code {process.returncode} while "
                                 f"starting on {logdir}:\n{_tail(log_path)}")
        if port is None:
            port = _registered_port(process.pid)
        if port is not None and _serves(port, logdir):
            return TensorBoardServer(logdir=logdir, port=port, pid=process.pid, process=process,
                                     log_path=log_path)
        time.sleep(0.2)
    process.terminate()
    raise RapidFireError(f"TensorBoard did not answer within {timeout:.0f}s on {logdir}:\n"
                         f"{_tail(log_path)}")


def _registered_port(pid: int) -> int | None:
    from tensorboard import manager

    for info in manager.get_all():
        if info.pid == pid:
            return info.port
    return None


def _find_running(logdir: str) -> TensorBoardServer | None:
    """A live TensorBoard on ``logdir``, bound to 127.0.0.1 and without path prefix."""
    try:
        from tensorboard import manager

        infos = manager.get_all()
    except Exception:  # the registry is a convenience; a broken one means "start our own"
        return None
    for info in infos:
        if info.logdir != logdir or info.path_prefix:
            continue
        try:
            args = json.loads(base64.b64decode(info.cache_key))["arguments"]
        except Exception:
            continue
        if "--host" not in args or args[args.index("--host") + 1] != HOST:
            continue
        if _pid_alive(info.pid) and _serves(info.port, logdir):
            return TensorBoardServer(logdir=logdir, port=info.port, pid=info.pid)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _serves(port: int, logdir: str) -> bool:
    """True if a TensorBoard on ``port`` answers and reads ``logdir``."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/data/environment", timeout=2) as r:
            env = json.loads(r.read())
    except Exception:
        return False
    return os.path.realpath(str(env.get("data_location", ""))) == os.path.realpath(logdir)


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")
    except OSError:
        return "(no TensorBoard log)"


@atexit.register
def _stop_all() -> None:
    # TensorBoards this kernel started go with it; one started by another process stays.
    for server in list(_SERVERS.values()):
        try:
            server.stop(timeout=3)
        except Exception:
            pass


# -- showing it ------------------------------------------------------------------------------

def logdir_of(exp_or_path=None) -> Path:
    """The TensorBoard folder of an Experiment, an experiment folder, or a log folder."""
    if exp_or_path is None:
        from ..experiment import current_experiment

        exp_or_path = current_experiment()
        if exp_or_path is None:
            raise RapidFireError("no experiment in this kernel; pass an Experiment or a folder")
    path = getattr(exp_or_path, "path", None)
    if path is not None and not isinstance(exp_or_path, (str, os.PathLike)):
        return Path(path) / "tensorboard"
    path = Path(exp_or_path)
    if (path / "tensorboard").is_dir() or (path / "events.jsonl").exists():
        return path / "tensorboard"
    return path


def frontend() -> str:
    """``colab``, ``vscode``, ``jupyter`` (a kernel, served by Jupyter) or ``terminal``."""
    if "google.colab" in sys.modules:
        return "colab"
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is None or not hasattr(shell, "kernel"):
        return "terminal"
    if "VSCODE_PID" in os.environ or os.environ.get("VSCODE_CWD"):
        return "vscode"
    return "jupyter"


def proxy_url(port: int) -> str:
    """Where the browser reaches TensorBoard through jupyter-server-proxy (root-relative)."""
    template = os.environ.get("RF_TENSORBOARD_PROXY_URL")
    if template:
        return template.replace("%PORT%", str(port))
    base = os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or "/"
    if not base.endswith("/"):
        base += "/"
    if not base.startswith("/"):
        base = "/" + base
    return f"{base}proxy/{port}/"


def show_tensorboard(exp_or_path=None, height: int = 800) -> None:
    """Start (or reuse) the experiment's TensorBoard and show it here.

    ``exp_or_path``: an Experiment, an experiment folder, or a TensorBoard log folder; default the
    current experiment. Shows an iframe in notebooks, prints a link elsewhere.
    """
    logdir = logdir_of(exp_or_path)
    port, _server = start_tensorboard(logdir)
    where = frontend()
    if where == "colab":
        from google.colab import output  # type: ignore[import-not-found]

        output.serve_kernel_port_as_iframe(port, height=str(height))
        return
    if where == "terminal":
        print(f"TensorBoard for {logdir}: http://{HOST}:{port}/")
        return
    from IPython.display import HTML, display

    url = proxy_url(port) if where == "jupyter" else f"http://localhost:{port}/"
    display(HTML(tensorboard_html(url, logdir, height)))


def tensorboard_html(url: str, logdir, height: int = 800) -> str:
    """The iframe and link shown in a notebook. The folder name and the proxy URL come from the
    user's disk and environment: both are escaped, and a URL that is not http(s) or a path is
    refused (a ``javascript:`` URL in ``href`` would run on click)."""
    scheme = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):", url)
    if scheme and scheme.group(1).lower() not in ("http", "https"):
        raise RapidFireError(f"TensorBoard URL {url!r} (from RF_TENSORBOARD_PROXY_URL?) must be "
                             "http(s) or a path such as /proxy/%PORT%/")
    u = html.escape(url, quote=True)
    return (f'<iframe src="{u}" width="100%" height="{int(height)}" frameborder="0" '
            f'title="TensorBoard"></iframe>'
            f'<div><a href="{u}" target="_blank" rel="noopener">Open TensorBoard in a new tab'
            f'</a> &middot; <code>{html.escape(str(logdir), quote=True)}</code></div>')


def server_proxy_entry() -> dict:
    """jupyter-server-proxy launcher: TensorBoard over every experiment of the server's folder."""
    root = os.environ.get("RF_EXPERIMENTS_DIR") or os.path.abspath("rapidfire_experiments")
    return {
        "command": [sys.executable, "-m", "tensorboard.main", "--logdir", root,
                    "--host", HOST, "--port", "{port}", "--reload_interval", "5"],
        "timeout": 90,
        "absolute_url": False,
        "new_browser_tab": True,
        "launcher_entry": {"enabled": True, "title": "TensorBoard (RapidFire)"},
    }
