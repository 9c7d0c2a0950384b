"""The local Ray session rapidfire starts for its workers does not outlive the kernel.

Each test runs a small experiment on 2 workers in a fresh interpreter (a kernel stand-in) that
started no Ray itself, records the process ids of the Ray session rapidfire started (its raylet,
GCS and other daemons, and each worker actor), exits in one way or another, and checks that none
of those processes is still running. A separate interpreter: this module never starts Ray itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow   # slow tier: real Ray sessions in fresh interpreters

SCRIPT = r"""
import json, os, signal, sys
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

path, how = sys.argv[1], sys.argv[2]
train, evald = make_demo_datasets(16, 4)
group = RFGridSearch(List([RFModelConfig(
    model_name="tiny", model_kwargs={"hidden_size": 32},
    peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                              max_length=64, bf16=False)) for lr in (1e-3, 1e-2)]), trainer_type="SFT")
exp = Experiment("session", experiment_path=path, num_workers=2)
exp.run_fit(group, tiny_create_model, train, evald, num_chunks=1, seed=1)
import ray
node = ray._private.worker._global_node
pids = [w["pid"] for e in exp.events.since(0) if e["type"] == "workers" for w in e["workers"]]
pids += [p.process.pid for procs in node.all_processes.values() for p in procs if p.process]
# and what those daemons started (the raylet's agents, the idle worker processes)
for proc in os.listdir("/proc"):
    try:
        with open(f"/proc/{proc}/stat") as f:
            ppid = int(f.read().split(")")[-1].split()[1])
    except (OSError, ValueError):
        continue
    if ppid in pids and int(proc) != os.getpid():
        pids.append(int(proc))
for pid in pids:
    os.kill(pid, 0)      # each one runs now (raises if not)
print("PIDS " + json.dumps(sorted(set(pids))), flush=True)
assert list(exp.get_runs_info().status) == ["completed", "completed"]
if how == "end":
    exp.end()
elif how == "sigkill":        # a kernel killed (a restart past its grace period): no atexit
    os.kill(os.getpid(), signal.SIGKILL)
# "exit": the kernel leaves without end()
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"   # a zombie has exited
    except OSError:
        return False


@pytest.mark.parametrize("how", ["end", "exit", "sigkill"])
def test_nothing_of_the_local_ray_session_survives_the_kernel(tmp_path, how):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.getcwd()}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "exp"), how],
                          capture_output=True, text=True, timeout=600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PIDS ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    if how != "sigkill":
        assert proc.returncode == 0, proc.stderr[-4000:]
    pids = json.loads(lines[0][5:])
    assert len(pids) >= 6, pids    # 2 workers, a raylet, a GCS and the raylet's agents at least
    # after a kill -9 of the kernel the raylet's agents notice it is gone within about a minute
    deadline = time.monotonic() + (180 if how == "sigkill" else 30)
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p for p in pids if alive(p)] == []


LOCAL_RAY_SCRIPT = r"""
import json, os, signal, sys, time
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import psutil
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model

train, evald = make_demo_datasets(64, 8)
group = RFGridSearch(List([RFModelConfig(
    model_name="tiny", model_kwargs={"hidden_size": 32},
    peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
    training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=8, num_train_epochs=1,
                              max_length=64, bf16=False)) for lr in (1e-3, 1e-2)]), trainer_type="SFT")
exp = Experiment("local-ray", experiment_path=sys.argv[1], num_workers=2)
exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, seed=1, block=False)
eng = exp.engine
deadline = time.monotonic() + 300
killed = False
while time.monotonic() < deadline and not killed:   # a worker process killed mid-chunk
    with eng.lock:
        for rid, f in eng.executor.inflight.items():
            if rid not in eng.executor.arrived and eng.runs[rid].chunks_done >= 1:
                os.kill(f.slot.info["pid"], signal.SIGKILL)   # as the OOM killer would
                killed = True
                break
    time.sleep(0.002)
assert killed, "no chunk in flight after the first"
assert exp.wait(timeout=300)
assert list(exp.get_runs_info().status) == ["completed", "completed"], exp.get_runs_info()
me = psutil.Process()
listening = []
for p in [me] + me.children(recursive=True):   # the driver, GCS, raylet, agents, workers
    try:
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                listening.append([p.name(), c.laddr.ip, c.laddr.port])
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
time.sleep(3)   # Ray's notice of the dead worker reaches the driver asynchronously
print("LISTEN " + json.dumps(listening), flush=True)
print("WORKERS_LOST " + str(sum(e["type"] == "worker_lost" for e in exp.events.since(0))), flush=True)
exp.end()
"""


def test_a_local_ray_listens_on_loopback_only_and_keeps_its_notices_out_of_the_cell(tmp_path):
    """The Ray rapidfire starts itself (no ray.init, no RAY_ADDRESS): every listening socket of
    its processes is on 127.0.0.1 (with auth disabled, a port open to the network runs anyone's
    code); and a worker killed mid-chunk is told by a worker_lost event, not by Ray's
    "(raylet) A worker died..." line in the kernel's output."""
    import ipaddress

    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": os.getcwd()}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", LOCAL_RAY_SCRIPT, str(tmp_path / "exp")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("LISTEN ")]
    listening = json.loads(line[len("LISTEN "):])
    names = {name for name, _, _ in listening}
    assert "gcs_server" in names and "raylet" in names, listening
    exposed = []
    for name, ip, port in listening:
        addr = ipaddress.ip_address(ip)
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if not addr.is_loopback:
            exposed.append((name, ip, port))
    assert exposed == [], exposed
    assert "WORKERS_LOST 1" in proc.stdout
    out = proc.stdout + proc.stderr
    assert "(raylet)" not in out and "A worker died" not in out, \
        [ln for ln in out.splitlines() if "raylet" in ln or "worker died" in ln.lower()]
