"""TensorBoard on a shared host and in Colab: a planted registry entry is never reused, Colab's
kernel port proxy is what shows it there, and a TensorBoard that cannot start is one message.

Every test runs real TensorBoard processes; TensorBoard's registry is moved to a private temp
folder (``TMPDIR``) so that nothing here touches the machine's shared one.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: real TensorBoard processes

pytest.importorskip("tensorboard")
from tensorboard import manager  # noqa: E402

from rapidfire_nb.notebook import tensorboard as tbmod  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

# A server that answers /data/environment as a TensorBoard on `logdir` would: what an attacker
# runs behind a planted entry.
FAKE_SERVER = textwrap.dedent("""
    import http.server, json, sys
    logdir = sys.argv[1]
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data_location": logdir, "window_title": "planted"}).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.end_headers(); self.wfile.write(body)
        def log_message(self, *a):
            pass
    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    print(srv.server_address[1], flush=True)
    srv.serve_forever()
""")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """TensorBoard's registry (``<tmp>/.tensorboard-info``) in a folder of this test only."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert manager._get_info_dir().startswith(str(tmp))
    yield Path(manager._get_info_dir())
    for logdir in list(tbmod._SERVERS):
        tbmod.stop_tensorboard(logdir)
    tempfile.tempdir = None


def _environment(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/environment", timeout=5) as r:
        return json.loads(r.read())


def _plant(registry: Path, logdir: Path, pid: int, port: int, uid: int | None = None) -> Path:
    """The entry another user would write: the matching cache key (our cwd and arguments)."""
    key = manager.cache_key(working_directory=os.getcwd(),
                            arguments=tbmod.tensorboard_arguments(str(logdir.resolve())),
                            configure_kwargs={})
    from tensorboard import version as tb_version

    info = manager.TensorBoardInfo(version=tb_version.VERSION, start_time=int(time.time()), pid=pid,
                                   port=port, path_prefix="", logdir=str(logdir), db="",
                                   cache_key=key)
    registry.mkdir(parents=True, exist_ok=True)
    os.chmod(registry, 0o777)
    path = registry / f"pid-{pid}.info"
    path.write_text(manager._info_to_string(info))
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def _start_fake(logdir: Path, as_uid: int | None = None):
    kwargs, python = {}, sys.executable
    if as_uid is not None:
        # another user cannot run root's interpreters or read its temp folders: the system's
        # Python, with the script inline
        python = shutil.which("python3", path="/usr/bin:/bin") or pytest.skip("no /usr/bin/python3")
        kwargs["preexec_fn"] = lambda: (os.setgid(as_uid), os.setuid(as_uid))
        kwargs["cwd"] = "/"
    proc = subprocess.Popen([python, "-c", FAKE_SERVER, str(logdir.resolve())],
                            stdout=subprocess.PIPE, text=True, **kwargs)
    port = int(proc.stdout.readline())
    return proc, port


def _assert_launched_our_own(logdir: Path, planted_pid: int):
    port, server = tbmod.start_tensorboard(logdir)
    assert server.launched, "a planted entry was reused"
    assert server.pid != planted_pid
    env = _environment(port)
    assert env.get("window_title") != "planted"
    assert os.path.realpath(env["data_location"]) == os.path.realpath(logdir)
    return server


def test_a_planted_entry_of_a_process_that_is_not_tensorboard_is_not_reused(registry, tmp_path):
    logdir = tmp_path / "exp" / "tensorboard"
    logdir.mkdir(parents=True)
    fake, port = _start_fake(logdir)
    try:
        _plant(registry, logdir, fake.pid, port)
        # what TensorBoard's own manager.start would do with that entry: hand it back
        found = manager._find_matching_instance(manager.cache_key(
            working_directory=os.getcwd(), arguments=tbmod.tensorboard_arguments(str(logdir.resolve())),
            configure_kwargs={}))
        assert found is not None and found.pid == fake.pid
        assert _environment(port)["window_title"] == "planted"
        _assert_launched_our_own(logdir, fake.pid)
        assert fake.poll() is None, "the other process must be left alone"
    finally:
        fake.kill()
        fake.wait()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                    reason="planting another user's process and file needs root")
def test_another_users_planted_tensorboard_entry_is_not_reused(registry, tmp_path):
    """The attack as described: the entry file and the server behind it belong to another user
    (uid 65534, nobody); its command line even ends in a folder named tensorboard."""
    logdir = tmp_path / "exp" / "tensorboard"
    logdir.mkdir(parents=True)
    fake, port = _start_fake(logdir, as_uid=65534)
    try:
        entry = _plant(registry, logdir, fake.pid, port, uid=65534)
        assert entry.stat().st_uid == 65534
        _assert_launched_our_own(logdir, fake.pid)
        assert entry.exists(), "another user's file is not ours to delete"
    finally:
        fake.kill()
        fake.wait()


def test_our_own_running_tensorboard_is_still_reused(registry, tmp_path):
    logdir = tmp_path / "exp" / "tensorboard"
    _, first = tbmod.start_tensorboard(logdir)
    tbmod._SERVERS.clear()   # as a new kernel would find it: only through the registry
    try:
        port, again = tbmod.start_tensorboard(logdir)
        assert not again.launched and again.pid == first.pid and port == first.port
    finally:
        first.stop()


def test_colab_shows_tensorboard_through_the_kernel_port_proxy(registry, tmp_path):
    """A stand-in ``google.colab`` package records the call; the port it is given serves our
    experiment's TensorBoard."""
    stand_in = tmp_path / "standin"
    (stand_in / "google" / "colab").mkdir(parents=True)
    # no google/__init__.py: `google` stays a namespace package, as in Colab, so that
    # google.protobuf (which TensorBoard imports) is still found beside the stand-in
    (stand_in / "google" / "colab" / "__init__.py").write_text("")
    calls = tmp_path / "calls.jsonl"
    (stand_in / "google" / "colab" / "output.py").write_text(textwrap.dedent(f"""
        import json
        def serve_kernel_port_as_iframe(port, path="/", height="500", cache_in_notebook=False):
            with open({str(calls)!r}, "a") as f:
                f.write(json.dumps({{"port": port, "height": height}}) + "\\n")
    """))
    exp = tmp_path / "exp"
    (exp / "tensorboard").mkdir(parents=True)
    (exp / "events.jsonl").write_text("")
    code = textwrap.dedent(f"""
        import json, sys, time, urllib.request
        import google.colab
        from rapidfire_nb.notebook.tensorboard import frontend, show_tensorboard
        assert frontend() == "colab", frontend()
        show_tensorboard({str(exp)!r}, height=600)
        call = json.loads(open({str(calls)!r}).readline())
        env = json.loads(urllib.request.urlopen(
            "http://127.0.0.1:%d/data/environment" % call["port"], timeout=5).read())
        print("SERVES", env["data_location"])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stand_in), str(ROOT),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["height"] == "600"
    assert f"SERVES {(exp / 'tensorboard').resolve()}" in out.stdout


def test_a_tensorboard_that_cannot_start_is_one_clear_message(registry, tmp_path, monkeypatch,
                                                              capsys):
    """A TensorBoard that dies at start-up (here the way TensorBoard 2.20 dies where setuptools
    no longer ships pkg_resources) is a message that says why and what to do, not a traceback."""
    broken = tmp_path / "tensorboard"
    broken.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                      "echo \"ModuleNotFoundError: No module named 'pkg_resources'\" >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("TENSORBOARD_BINARY", str(broken))
    assert tbmod.show_tensorboard(tmp_path / "logs") is None
    err = capsys.readouterr().err
    assert err.startswith("TensorBoard could not start: TensorBoard exited with code 1")
    assert "setuptools<81" in err and "pkg_resources" in err
    assert not tbmod._SERVERS


def test_the_tensorboard_view_does_not_import_the_experiment():
    tree = ast.parse((ROOT / "rapidfire_nb" / "notebook" / "tensorboard.py").read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if "experiment" in n], names
    out = subprocess.run([sys.executable, "-c", "import sys, rapidfire_nb.notebook.tensorboard; "
                          "print('rapidfire_nb.experiment' in sys.modules)"],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.stdout.strip() == "False", out.stderr[-2000:]
    with pytest.raises(tbmod.RapidFireError, match="pass an Experiment or a folder"):
        tbmod.logdir_of(None)
