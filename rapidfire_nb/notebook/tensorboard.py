"""TensorBoard for an experiment, shown in whichever front-end the kernel runs in.

- :func:`start_tensorboard` starts (or reuses) one TensorBoard per log folder, bound to 127.0.0.1,
  through TensorBoard's own ``tensorboard.manager.start``: it reuses a running TensorBoard started
  with the same arguments from the same working folder (by this process or another, e.g. an
  earlier kernel) and otherwise launches one and waits until it has registered. Its typed results
  (launched, reused, failed, timed out) map onto a server or a clear error.
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
import datetime
import html
import json
import os
import re
import shutil
import signal
import sys
import sysconfig
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import RapidFireError

HOST = "127.0.0.1"
_LOCK = threading.Lock()
_SERVERS: dict[str, TensorBoardServer] = {}


@dataclass
class TensorBoardServer:
    """A running TensorBoard; ``launched`` when this process started it (and stops it)."""

    logdir: str
    port: int
    pid: int
    launched: bool = False

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/"

    def running(self) -> bool:
        """Its process has not exited."""
        return _pid_running(self.pid, own_child=self.launched)

    def alive(self) -> bool:
        return self.running() and _serves(self.port, self.logdir)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it if this process started it."""
        with _LOCK:
            if _SERVERS.get(self.logdir) is self:
                del _SERVERS[self.logdir]
        if not self.launched or not self.running():
            return
        # SIGTERM: TensorBoard runs its atexit hooks, which remove its entry from the registry
        os.kill(self.pid, signal.SIGTERM)
        if not _wait_exit(self.pid, timeout):
            os.kill(self.pid, signal.SIGKILL)
            _wait_exit(self.pid, timeout)


def tensorboard_arguments(logdir: str) -> list[str]:
    # --port 0: the OS picks a free port (no race with another starter); TensorBoard records the
    # port it got in its registry, which is what manager.start waits for
    return ["--logdir", logdir, "--host", HOST, "--port", "0", "--reload_interval", "5"]


def start_tensorboard(logdir: str | os.PathLike, timeout: float = 90.0
                      ) -> tuple[int, TensorBoardServer]:
    """Start TensorBoard on ``logdir`` (once per folder) and return ``(port, server)``."""
    from tensorboard import manager

    logdir = str(Path(logdir).resolve())
    Path(logdir).mkdir(parents=True, exist_ok=True)
    with _LOCK:
        server = _SERVERS.get(logdir)
        if server is not None and server.alive():
            return server.port, server
        for _attempt in range(2):
            result = _manager_start(tensorboard_arguments(logdir), timeout)
            if isinstance(result, manager.StartLaunched):
                server = TensorBoardServer(logdir, result.info.port, result.info.pid, launched=True)
                if not _wait_serving(server, deadline=time.monotonic() + timeout):
                    server.stop(timeout=5)
                    raise RapidFireError(f"TensorBoard (pid {server.pid}) registered port "
                                         f"{server.port} but does not serve {logdir}")
            elif isinstance(result, manager.StartReused):
                server = TensorBoardServer(logdir, result.info.port, result.info.pid)
                if not server.alive():
                    # its registry entry outlived it (killed without its atexit hooks):
                    # TensorBoard's registry keeps one file per pid; drop this stale one, retry
                    _forget_stale(result.info.pid)
                    continue
            elif isinstance(result, manager.StartTimedOut):
                _kill(result.pid)   # manager.start leaves a stuck TensorBoard running
                raise RapidFireError(f"TensorBoard did not start within {timeout:.0f}s on {logdir}")
            elif isinstance(result, manager.StartFailed):
                raise RapidFireError(
                    f"TensorBoard exited with code {result.exit_code} while starting on {logdir}:\n"
                    + ((result.stderr or "") + (result.stdout or ""))[-3000:])
            else:   # StartExecFailed: the binary could not run
                binary = result.explicit_binary or "'tensorboard' on PATH"
                raise RapidFireError(f"cannot run TensorBoard ({binary}): {result.os_error}; "
                                     "set TENSORBOARD_BINARY to its path")
            _SERVERS[logdir] = server
            return server.port, server
        raise RapidFireError(f"TensorBoard's registry keeps pointing at a dead server for {logdir}")


def stop_tensorboard(logdir: str | os.PathLike) -> bool:
    """Stop the TensorBoard this process started on ``logdir``; False if there was none."""
    server = _SERVERS.get(str(Path(logdir).resolve()))
    if server is None:
        return False
    server.stop()
    return True


def _manager_start(arguments: list[str], timeout: float):
    """``tensorboard.manager.start``, with the ``tensorboard`` of this interpreter.

    manager.start runs ``$TENSORBOARD_BINARY`` or else ``tensorboard`` from ``PATH``, and a kernel
    started from a virtualenv often has the venv's scripts folder off its ``PATH`` (another
    TensorBoard, or none, would run). It reads the binary only from the environment, so while it
    starts the process, under ``_LOCK``, ``TENSORBOARD_BINARY`` names this interpreter's
    script when ``PATH`` would find another one and the user did not set it; it is removed right
    after (the only environment variable this package sets, for the length of one call)."""
    from tensorboard import manager

    ours = Path(sysconfig.get_path("scripts")) / ("tensorboard.exe" if os.name == "nt" else "tensorboard")
    found = shutil.which("tensorboard")
    if (os.environ.get("TENSORBOARD_BINARY") or not ours.exists()
            or (found is not None and os.path.realpath(found) == os.path.realpath(ours))):
        return manager.start(arguments, timeout=datetime.timedelta(seconds=timeout))
    os.environ["TENSORBOARD_BINARY"] = str(ours)
    try:
        return manager.start(arguments, timeout=datetime.timedelta(seconds=timeout))
    finally:
        os.environ.pop("TENSORBOARD_BINARY", None)


def _forget_stale(pid: int) -> None:
    from tensorboard import manager

    if not _pid_running(pid, own_child=False):
        try:   # the registry's file for that pid (manager.remove_info_file only removes our own)
            os.unlink(os.path.join(manager._get_info_dir(), f"pid-{pid}.info"))
        except OSError:
            pass


def _pid_running(pid: int, own_child: bool) -> bool:
    if own_child:
        # our child: reap it if it exited (os.kill would still find the zombie)
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return False
        except ChildProcessError:   # already reaped (by subprocess's own cleanup)
            pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_running(pid, own_child=True):
            return True
        time.sleep(0.05)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_exit(pid, 5)


def _wait_serving(server: TensorBoardServer, deadline: float) -> bool:
    """TensorBoard registers its port just before it answers: wait for the first answer."""
    while time.monotonic() < deadline:
        if _serves(server.port, server.logdir):
            return True
        if not server.running():
            return False
        time.sleep(0.1)
    return False


def _serves(port: int, logdir: str) -> bool:
    """True if a TensorBoard on ``port`` answers and reads ``logdir``."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/data/environment", timeout=2) as r:
            env = json.loads(r.read())
    except Exception:
        return False
    return os.path.realpath(str(env.get("data_location", ""))) == os.path.realpath(logdir)


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
