"""TensorBoard for an experiment, shown in whichever front-end the kernel runs in.

- :func:`start_tensorboard` starts (or reuses) one TensorBoard per log folder, bound to 127.0.0.1,
  through TensorBoard's own registry (``tensorboard.manager``): it reuses a running TensorBoard
  started with the same arguments from the same working folder (by this process or another, e.g.
  an earlier kernel) *if it is this user's own*, and otherwise launches one and waits until that
  process has registered. manager's typed results (launched, reused, failed, timed out) map onto
  a server or a clear error.
- :func:`show_tensorboard` picks the display, as ``tensorboard/notebook.py`` does: in Colab the
  kernel port proxy (``google.colab.output.serve_kernel_port_as_iframe``); in JupyterLab /
  Notebook 7 an iframe through jupyter-server-proxy at ``{base_url}proxy/{port}/`` once the
  kernel has checked that its own Jupyter server serves TensorBoard there (``RF_TENSORBOARD_PROXY_URL``
  with a ``%PORT%`` placeholder overrides it); where that check fails (Notebook 6.5's server
  answered with its login page) and in VS Code (which forwards the port) an iframe on localhost;
  elsewhere a link printed on stdout. A TensorBoard that cannot start is one message, not a traceback.
- :func:`server_proxy_entry` is the ``jupyter_serverproxy_servers`` entry point: a "TensorBoard
  (RapidFire)" launcher serving every experiment under ``./rapidfire_experiments`` (or
  ``RF_EXPERIMENTS_DIR``) at ``{base_url}tensorboard-rapidfire/``.
"""

from __future__ import annotations

import atexit
import html
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from .._environment import frontend
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
            result = _start(tensorboard_arguments(logdir), timeout)
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


def _binary() -> str:
    """The ``tensorboard`` to run: ``$TENSORBOARD_BINARY``, else this interpreter's script (a
    kernel started from a virtualenv often has the venv's scripts folder off its ``PATH``, where
    another TensorBoard, or none, would run), else ``tensorboard`` from ``PATH``."""
    ours = Path(sysconfig.get_path("scripts")) / ("tensorboard.exe" if os.name == "nt" else "tensorboard")
    return os.environ.get("TENSORBOARD_BINARY") or (str(ours) if ours.exists() else "tensorboard")


def _start(arguments: list[str], timeout: float):
    """``tensorboard.manager.start``'s typed results, with one difference: only a TensorBoard
    that is provably this user's own is reused or taken as launched.

    TensorBoard's registry (``.tensorboard-info`` in the system temp folder) is world-writable and
    ``manager.start`` returns the first entry whose cache key matches, so another user of a
    shared host can plant one and get their server embedded on Jupyter's origin. Here an entry
    counts only if :func:`_trusted` holds; a launch waits for the entry of the process it
    started (by pid), never for any matching one."""
    from tensorboard import manager

    key = manager.cache_key(working_directory=os.getcwd(), arguments=arguments,
                            configure_kwargs={})
    for info in sorted(manager.get_all(), key=lambda i: i.port):
        if info.cache_key != key:
            continue
        if _trusted(info):
            return manager.StartReused(info=info)
        # an entry that outlived its TensorBoard (killed without its atexit hooks)
        _forget_stale(info.pid)

    out_fd, out_path = tempfile.mkstemp(prefix=".tensorboard-stdout-")
    err_fd, err_path = tempfile.mkstemp(prefix=".tensorboard-stderr-")
    binary = _binary()
    try:
        # manager's own environment for it where it has one (TensorBoard >= 2.21 drops Bazel's
        # test variables); older releases pass the environment on as it is
        env = (manager._subprocess_environ() if hasattr(manager, "_subprocess_environ")
               else dict(os.environ))
        proc = subprocess.Popen([binary, *arguments], env=env,
                                stdout=out_fd, stderr=err_fd)
    except OSError as exc:
        return manager.StartExecFailed(os_error=exc, explicit_binary=binary)
    finally:
        os.close(out_fd)
        os.close(err_fd)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.2)
            code = proc.poll()
            if code is not None:
                return manager.StartFailed(exit_code=code, stdout=_read(out_path),
                                           stderr=_read(err_path))
            for info in manager.get_all():
                if info.pid == proc.pid and info.cache_key == key and _trusted(info):
                    return manager.StartLaunched(info=info)
        return manager.StartTimedOut(pid=proc.pid)
    finally:
        for path in (out_path, err_path):
            try:
                os.unlink(path)
            except OSError:
                pass


def _is_tensorboard_command(cmd: list[str]) -> bool:
    """The program a command line runs is TensorBoard: the ``tensorboard`` script itself, an
    interpreter running that script, or ``python -m tensorboard[.main]``. Only the program and
    the script count, never a later argument (a log folder may well be called tensorboard)."""
    names = ("tensorboard", "tensorboard.exe", "tensorboard-script.py")
    if not cmd:
        return False
    if os.path.basename(cmd[0]).lower() in names:
        return True
    if len(cmd) >= 3 and cmd[1] == "-m":
        return cmd[2] in ("tensorboard", "tensorboard.main")
    return len(cmd) >= 2 and os.path.basename(cmd[1]).lower() in names


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _trusted(info) -> bool:
    """The registry entry ``info`` is this user's own TensorBoard: the entry's file belongs to
    this user, and so does its process, which is a TensorBoard (by its command line) listening
    on the entry's port. Anything unreadable counts as foreign."""
    import psutil
    from tensorboard import manager

    uid = os.getuid() if hasattr(os, "getuid") else None
    try:
        entry = os.lstat(os.path.join(manager._get_info_dir(), f"pid-{info.pid}.info"))
        proc = psutil.Process(info.pid)
        if uid is not None and (entry.st_uid != uid or proc.uids().real != uid):
            return False
        # `tensorboard ...`, `python .../bin/tensorboard ...` or `python -m tensorboard.main`
        if not _is_tensorboard_command(proc.cmdline()):
            return False
        conns = proc.net_connections(kind="tcp") if hasattr(proc, "net_connections") \
            else proc.connections(kind="tcp")
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == info.port
                   for c in conns)
    except (OSError, psutil.Error):
        return False


def _forget_stale(pid: int) -> None:
    """Remove the registry's file for ``pid`` if its process is gone and the file is ours
    (manager.remove_info_file only removes the calling process's own)."""
    from tensorboard import manager

    if _pid_running(pid, own_child=False):
        return
    path = os.path.join(manager._get_info_dir(), f"pid-{pid}.info")
    try:
        if not hasattr(os, "getuid") or os.lstat(path).st_uid == os.getuid():
            os.unlink(path)
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

def logdir_of(exp_or_path) -> Path:
    """The TensorBoard folder of an Experiment (anything with a ``path``), an experiment folder,
    or a log folder."""
    if exp_or_path is None:
        raise RapidFireError("no experiment given: pass an Experiment or a folder")
    path = getattr(exp_or_path, "path", None)
    if path is not None and not isinstance(exp_or_path, (str, os.PathLike)):
        return Path(path) / "tensorboard"
    path = Path(exp_or_path)
    if (path / "tensorboard").is_dir() or (path / "events.jsonl").exists():
        return path / "tensorboard"
    return path


def proxy_url(port: int, base_url: str | None = None) -> str:
    """Where the browser reaches TensorBoard through jupyter-server-proxy (root-relative)."""
    template = os.environ.get("RF_TENSORBOARD_PROXY_URL")
    if template:
        return template.replace("%PORT%", str(port))
    base = base_url or os.environ.get("JUPYTERHUB_SERVICE_PREFIX") or "/"
    if not base.endswith("/"):
        base += "/"
    if not base.startswith("/"):
        base = "/" + base
    return f"{base}proxy/{port}/"


def jupyter_server_info(pid: int | None = None) -> dict | None:
    """The runtime file of the Jupyter server that started this kernel (its parent process):
    ``jpserver-<pid>.json`` (jupyter_server: JupyterLab, Notebook 7, nbclassic) or
    ``nbserver-<pid>.json`` (the classic Notebook 6 server), plus ``"kind"``; None if not found."""
    pid = os.getppid() if pid is None else pid
    try:
        from jupyter_core.paths import jupyter_runtime_dir

        runtime = Path(jupyter_runtime_dir())
    except Exception:
        return None
    for kind in ("jpserver", "nbserver"):
        try:
            info = json.loads((runtime / f"{kind}-{pid}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict):
            return dict(info, kind=kind)
    return None


def _proxy_serves(server: dict, port: int, logdir) -> bool:
    """The server's ``proxy/<port>/`` answers with TensorBoard reading ``logdir``, asked the
    way the browser will ask (through the server, with its token): a proxy that is missing, or
    one that answers with a login page, does not count."""
    url = str(server.get("url") or "")
    if not url.startswith(("http://", "https://")):
        return False
    base = str(server.get("base_url") or "/")
    root = url.split("://", 1)[0] + "://" + url.split("://", 1)[1].split("/", 1)[0]
    probe = root + proxy_url(port, base) + "data/environment"
    headers = {"Authorization": f"token {server['token']}"} if server.get("token") else {}
    try:
        req = urllib.request.Request(probe, headers=headers)
        with urllib.request.urlopen(req, timeout=5) as r:
            env = json.loads(r.read())
    except Exception:
        return False
    return (isinstance(env, dict) and os.path.realpath(str(env.get("data_location", "")))
            == os.path.realpath(str(logdir)))


def view_url(port: int, logdir, where: str | None = None) -> str:
    """The URL the notebook's iframe loads.

    Through jupyter-server-proxy when the Jupyter server that runs this kernel serves TensorBoard
    there (checked, see :func:`_proxy_serves`); ``RF_TENSORBOARD_PROXY_URL`` is taken as given.
    Otherwise TensorBoard's own address on localhost: under Notebook 6.5 (nbclassic on
    jupyter_server, as in Colab's runtime) the proxy's route answered the browser with Jupyter's
    login page, and the notebook's autosave then failed with 403; the old ``nbserver`` server
    has no jupyter-server-proxy at all."""
    where = where or frontend()
    if where == "jupyter":
        if os.environ.get("RF_TENSORBOARD_PROXY_URL"):
            return proxy_url(port)
        server = jupyter_server_info()
        if server is None:   # not found (another runtime folder, a remote kernel): as before
            return proxy_url(port)
        if server["kind"] == "jpserver" and _proxy_serves(server, port, logdir):
            return proxy_url(port, str(server.get("base_url") or "/"))
    return f"http://localhost:{port}/"


def show_tensorboard(exp_or_path, height: int = 800) -> None:
    """Start (or reuse) the experiment's TensorBoard and show it here.

    ``exp_or_path``: an Experiment, an experiment folder, or a TensorBoard log folder. Shows an
    iframe in notebooks (in Colab through its kernel port proxy), prints a link elsewhere; if
    TensorBoard cannot start, says why in one message instead of raising.
    """
    logdir = logdir_of(exp_or_path)
    try:
        port, _server = start_tensorboard(logdir)
    except RapidFireError as exc:
        print(f"TensorBoard could not start: {_hint(str(exc))}", file=sys.stderr)
        return None
    where = frontend()
    if where == "colab":
        from google.colab import output  # type: ignore[import-not-found]

        output.serve_kernel_port_as_iframe(port, height=str(height))
        return None
    if where == "terminal":
        print(f"TensorBoard for {logdir}: http://{HOST}:{port}/")
        return None
    from IPython.display import HTML, display

    display(HTML(tensorboard_html(view_url(port, logdir, where), logdir, height)))
    return None


def _hint(message: str) -> str:
    if "No module named 'pkg_resources'" in message:
        return (message + "\nThis TensorBoard needs pkg_resources, which setuptools 81 and later "
                "no longer ship: pip install 'setuptools<81' (or a newer tensorboard), then retry.")
    return message


def tensorboard_html(url: str, logdir, height: int = 800) -> str:
    """The iframe and link shown in a notebook. The folder name and the proxy URL come from the
    user's disk and environment: both are escaped, and a URL that is not http(s) or a path is
    refused (a ``javascript:`` URL in ``href`` would run on click)."""
    scheme = re.match(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):", url)
    if scheme and scheme.group(1).lower() not in ("http", "https"):
        raise RapidFireError(f"TensorBoard URL {url!r} (from RF_TENSORBOARD_PROXY_URL?) must be "
                             "http(s) or a path such as /proxy/%PORT%/")
    u = html.escape(url, quote=True)
    ident = f"rf-tb-{uuid.uuid4().hex[:12]}"
    out = (f'<iframe id="{ident}" src="{u}" width="100%" height="{int(height)}" frameborder="0" '
           f'title="TensorBoard"></iframe>'
           f'<div><a id="{ident}-link" href="{u}" target="_blank" rel="noopener">Open TensorBoard '
           f'in a new tab</a> &middot; <code>{html.escape(str(logdir), quote=True)}</code></div>')
    direct = re.match(r"^http://(localhost|127\.0\.0\.1):(\d+)/$", url)
    if direct:
        out += _SAME_SITE_SCRIPT.replace("PORT", str(int(direct.group(2)))).replace("IDENT", ident)
    return out


# TensorBoard's page reads localStorage and shows "Data could not be loaded" when that throws,
# which it does in a frame of another site where the browser blocks third-party storage
# (Chromium's incognito and automated profiles, Safari, Firefox's strict mode). localhost and
# 127.0.0.1 are two sites: the frame takes the loopback name the notebook page itself was opened
# with (TensorBoard listens on 127.0.0.1, which both names reach).
_SAME_SITE_SCRIPT = """<script>(function () {
  var host = window.location.hostname;
  if (host !== "localhost" && host !== "127.0.0.1") return;
  var url = "http://" + host + ":PORT/";
  function apply() {
    var frame = document.getElementById("IDENT"), link = document.getElementById("IDENT-link");
    if (!frame) return false;
    if (frame.getAttribute("src") !== url) frame.setAttribute("src", url);
    if (link) link.setAttribute("href", url);
    return true;
  }
  if (!apply()) setTimeout(apply, 0);
})();</script>"""


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
