"""Viewing TensorBoard: a real TensorBoard started by the project's code, queried over HTTP on
localhost, then the same pages through a real Jupyter server with jupyter-server-proxy (under a
JupyterHub-style base URL), including the URL a real kernel's ``show_tensorboard`` displays and the
``tensorboard-rapidfire`` launcher entry."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from rapidfire_nb.engine.events import EventLog
from rapidfire_nb.notebook.tensorboard import (logdir_of, proxy_url, server_proxy_entry,
                                               start_tensorboard, stop_tensorboard)
from rapidfire_nb.tracking import TrackerHub

from helpers import Recorder, logged_run_name

pytestmark = pytest.mark.slow   # slow tier: real TensorBoard and Jupyter servers


@pytest.fixture(scope="module")
def experiments_root(tmp_path_factory):
    """``<root>/exp``: an experiment folder with TensorBoard logs of five runs."""
    root = tmp_path_factory.mktemp("experiments")
    exp_path = root / "exp"
    events = EventLog(exp_path / "events.jsonl")
    hub = TrackerHub(events, exp_path, "exp", ["tensorboard"]).start()
    Recorder(events).record_all()
    assert hub.flush(60) and hub.failures == {}
    hub.close()
    events.close()
    return root


@pytest.fixture(scope="module")
def tensorboard(experiments_root):
    port, server = start_tensorboard(experiments_root / "exp" / "tensorboard")
    yield port, server
    stop_tensorboard(experiments_root / "exp" / "tensorboard")


def get(url: str, headers: dict | None = None, data: dict | None = None, timeout: float = 20):
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, headers={
        **({"Content-Type": "application/json"} if body else {}), **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        raw = response.read()
        kind = response.headers.get("Content-Type", "")
    return json.loads(raw) if "json" in kind else raw.decode(errors="replace")


def wait_for(fn, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as exc:
            last = exc
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def scalar_runs(base: str, headers=None) -> dict:
    """TensorBoard reloads the log folder in the background: wait until all runs are read."""
    return wait_for(lambda: (lambda tags: tags if len(tags) >= 4 else None)(
        get(base + "data/plugin/scalars/tags", headers)), what="scalar tags of 4 runs")


def test_tensorboard_serves_runs_scalars_and_hparams_on_localhost(tensorboard, experiments_root):
    port, server = tensorboard
    assert server.url == f"http://127.0.0.1:{port}/" and server.launched and server.running()
    base = server.url
    tags = scalar_runs(base)
    # each run under its short name, the id and the knob that sets it apart
    name = {i: logged_run_name(experiments_root / "exp", i) for i in range(1, 6)}
    assert name[3] == "3 · lr 5e-4"
    assert sorted(tags) == [name[i] for i in range(1, 5)]  # run 5 was deleted untrained
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "eval/loss",
            "eval/accuracy"} <= set(tags[name[3]])
    points = get(base + f"data/plugin/scalars/scalars?run={urllib.parse.quote(name[1])}&tag=eval%2Floss")
    assert [p[1] for p in points] == [16, 32, 48]
    assert wait_for(lambda: name[5] in get(base + "data/runs"), what="run 5 in the run list")

    # the HParams dashboard: every run's knobs, lineage and final metrics
    experiment = get(base + "data/plugin/hparams/experiment", data={"experimentName": ""})
    names = {h["name"] for h in experiment["hparamInfos"]}
    assert {"training_args.learning_rate", "rapidfire.parent_run_id",
            "rapidfire.warm_start"} <= names
    assert {m["name"]["tag"] for m in experiment["metricInfos"]} >= {"eval/loss", "train/loss"}
    groups = get(base + "data/plugin/hparams/session_groups", data={
        "experimentName": "", "startIndex": 0, "sliceSize": 100, "includeMetrics": True,
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
                            "STATUS_RUNNING"], "colParams": []})
    by_name = {g["name"]: g for g in groups["sessionGroups"]}
    assert by_name[name[3]]["hparams"]["training_args.learning_rate"] == pytest.approx(5e-4)
    assert by_name[name[1]]["sessions"][0]["status"] == "STATUS_SUCCESS"
    assert by_name[name[4]]["sessions"][0]["status"] == "STATUS_FAILURE"
    final = {m["name"]["tag"]: m for m in by_name[name[1]]["metricValues"]}
    assert final["eval/loss"]["trainingStep"] == 48
    assert final["eval/loss"]["value"] == pytest.approx(2.5 / 12 + 1 / 50, rel=1e-6)


def test_one_tensorboard_per_folder_even_across_processes(tensorboard, experiments_root):
    port, server = tensorboard
    again_port, again = start_tensorboard(experiments_root / "exp" / "tensorboard")
    assert again is server and again_port == port
    # an experiment folder (or the Experiment itself) maps to its tensorboard folder
    assert logdir_of(experiments_root / "exp") == experiments_root / "exp" / "tensorboard"
    code = ("from rapidfire_nb.notebook.tensorboard import start_tensorboard; "
            f"port, s = start_tensorboard({str(experiments_root / 'exp')!r} + '/tensorboard'); "
            "print(port, s.launched)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(port), "False"]   # reused, not launched


def test_a_stopped_tensorboard_is_replaced(tmp_path):
    port, server = start_tensorboard(tmp_path / "tb")
    stop_tensorboard(tmp_path / "tb")
    assert not server.running()
    new_port, new = start_tensorboard(tmp_path / "tb")
    try:
        assert new is not server and new.launched and new.running()
        assert get(new.url + "data/environment")["data_location"] == str((tmp_path / "tb").resolve())
    finally:
        stop_tensorboard(tmp_path / "tb")


def test_a_killed_tensorboard_left_in_the_registry_is_replaced(tmp_path):
    """SIGKILL skips TensorBoard's atexit hooks, so its registry entry stays; manager.start would
    hand back that dead server ("reused"): the stale entry is dropped and a new one launched."""
    import signal

    from tensorboard import manager

    env_before = os.environ.get("TENSORBOARD_BINARY")
    _, server = start_tensorboard(tmp_path / "tb")
    os.kill(server.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while server.running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.running()
    assert any(info.pid == server.pid for info in manager.get_all())   # the stale entry
    _, new = start_tensorboard(tmp_path / "tb")
    try:
        assert new.pid != server.pid and new.launched and new.alive()
        assert not any(info.pid == server.pid for info in manager.get_all())
        assert os.environ.get("TENSORBOARD_BINARY") == env_before
    finally:
        stop_tensorboard(tmp_path / "tb")


def test_proxy_url_honours_jupyterhub_prefix_and_override(monkeypatch):
    monkeypatch.delenv("RF_TENSORBOARD_PROXY_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_SERVICE_PREFIX", raising=False)
    assert proxy_url(6010) == "/proxy/6010/"
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/user/alice")
    assert proxy_url(6010) == "/user/alice/proxy/6010/"
    monkeypatch.setenv("RF_TENSORBOARD_PROXY_URL", "https://example.org/tb/%PORT%/")
    assert proxy_url(6010) == "https://example.org/tb/6010/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def jupyter_server(experiments_root, tmp_path_factory):
    """A real ``jupyter server`` on 127.0.0.1 under a JupyterHub-like base URL."""
    from importlib.metadata import entry_points

    token = secrets.token_hex(16)
    port = _free_port()
    base_url = "/user/tester/"
    work = tmp_path_factory.mktemp("jupyter")
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", f"--port={port}",
           "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
           "--ServerApp.allow_root=True",
           # enabled explicitly: its config file lands in the prefix pip installed it into,
           # which a server started from a virtualenv does not read
           '--ServerApp.jpserver_extensions={"jupyter_server_proxy": True}',
           f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={work}"]
    if not any(ep.name == "tensorboard-rapidfire"
               for ep in entry_points(group="jupyter_serverproxy_servers")):
        # the package is not installed: declare the same entry through the server's config
        config = work / "jupyter_server_config.py"
        config.write_text("from rapidfire_nb.notebook.tensorboard import server_proxy_entry\n"
                          "c.ServerProxy.servers = {'tensorboard-rapidfire': server_proxy_entry()}\n")
        cmd.append(f"--config={config}")
    env = {**os.environ, "RF_EXPERIMENTS_DIR": str(experiments_root)}
    log = open(work / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                            start_new_session=True)
    root = f"http://127.0.0.1:{port}{base_url}"
    headers = {"Authorization": f"token {token}"}
    try:
        wait_for(lambda: get(root + "api/status", headers), timeout=90, what="jupyter server")
        yield root, headers, base_url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_same_pages_through_jupyter_server_proxy(jupyter_server, tensorboard, experiments_root):
    root, headers, base_url = jupyter_server
    port, server = tensorboard
    proxied = f"{root}proxy/{port}/"
    direct = scalar_runs(server.url)
    assert scalar_runs(proxied, headers) == direct
    page = get(proxied, headers)
    assert "<tf-tensorboard" in page or "TensorBoard" in page
    run2 = urllib.parse.quote(logged_run_name(experiments_root / "exp", 2))
    points = get(proxied + f"data/plugin/scalars/scalars?run={run2}&tag=train%2Floss", headers)
    assert [p[1] for p in points] == [4 * i for i in range(1, 9)]
    # without the token the proxy refuses (redirect to login): it does not expose TensorBoard
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(proxied + "data/runs")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    conn.request("GET", parts.path)
    assert conn.getresponse().status in (302, 401, 403)
    conn.close()


def test_launcher_entry_serves_every_experiment(jupyter_server, experiments_root):
    root, headers, _ = jupyter_server
    entry = server_proxy_entry()
    assert "{port}" in entry["command"] and "127.0.0.1" in entry["command"]
    launched = f"{root}tensorboard-rapidfire/"
    runs = wait_for(lambda: (lambda r: r if len(r) >= 5 else None)(
        get(launched + "data/runs", headers, timeout=60)), timeout=120, what="launcher runs")
    assert sorted(runs) == sorted(f"exp/tensorboard/{logged_run_name(experiments_root / 'exp', i)}" for i in range(1, 6))


def test_kernel_shows_an_iframe_that_works_through_the_proxy(jupyter_server, tensorboard,
                                                             experiments_root):
    import nbformat
    from nbclient import NotebookClient

    root, headers, base_url = jupyter_server
    port, _server = tensorboard
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import os\n"
        f"os.environ['JUPYTERHUB_SERVICE_PREFIX'] = {base_url!r}\n"
        "from rapidfire_nb.notebook.tensorboard import show_tensorboard, frontend\n"
        f"show_tensorboard({str(experiments_root / 'exp')!r})\n"
        "print(frontend())")])
    env_backup = {k: os.environ.pop(k) for k in ("VSCODE_PID", "VSCODE_CWD") if k in os.environ}
    try:
        NotebookClient(nb, timeout=180, kernel_name="python3").execute()
    finally:
        os.environ.update(env_backup)
    outputs = nb.cells[0].outputs
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    text = "".join(o.get("text", "") for o in outputs)
    assert text.strip() == "jupyter"
    src = re.search(r'<iframe[^>]*\bsrc="([^"]+)"', html).group(1)
    # the kernel reused this test's TensorBoard (same folder), and the URL is proxy-relative
    assert src == f"{base_url}proxy/{port}/"
    origin = root[: root.index(base_url)]
    assert scalar_runs(origin + src, headers)[logged_run_name(experiments_root / "exp", 1)]
