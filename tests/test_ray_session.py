"""The local Ray session rapidfire starts for its workers does not outlive the kernel (issue 19).

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
