"""Subprocess side of the crash tests (tests/launch/test_crash_resume.py).

It trains (or resumes) a small 3-run SFT experiment and can pause inside a chosen file write, so
the test can SIGKILL it at exactly that point. The experiment itself is defined here too
(``make_group``, ``make_data``, ``RUN_FIT_KW``) so the test resumes it with the same arguments.

Run as ``python crash_worker.py serve``: the server imports torch/transformers/TRL once and then
forks one child per request. Forking is safe because the server never runs a torch op (no
intra-op thread pool exists yet), and it saves ~6 s of imports per trial on 2 cores.

Protocol: one JSON request per stdin line, one JSON reply per stdout line.
  {"cmd": "start", "root": dir, "name": str, "resume": bool, "pause": null | "FILE:N:PHASE",
   "clone": bool (add a warm-start clone of run 1 after its first chunk)}
        -> {"pid": pid of the child running the experiment}
  {"cmd": "reap", "pid": pid} -> {"pid": pid, "exit": exit code, or -signal number}
  {"cmd": "quit"}
``pause``: FILE is ``state`` (a run checkpoint) or ``runs`` (runs.json); N counts that file's
writes from 1 within the child; PHASE ``mid`` stops with half of the new bytes in the temporary
file, ``renamed`` stops right after a checkpoint has replaced the old one, before the engine
appends the chunk's events to the log. The child then creates ``<root>/PAUSED`` and sleeps.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

NAME = "crash"
RUN_FIT_KW = dict(num_chunks=3, seed=11)
N_TRAIN, N_EVAL = 12, 4          # batch 4: 3 steps per epoch, 1 per chunk; 2 epochs: 18 chunks in all
LEARNING_RATES = (1e-3, 3e-3, 1e-2)


def make_group():
    from rapidfire_nb.automl import (
        List,
        RFGridSearch,
        RFLoraConfig,
        RFModelConfig,
        RFSFTConfig,
    )

    # lora_dropout > 0: the result depends on the restored RNG, not only on weights and optimizer
    lora = RFLoraConfig(r=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1)
    configs = List([
        RFModelConfig(model_name="tiny", peft_config=lora,
                      training_args=RFSFTConfig(learning_rate=lr, per_device_train_batch_size=4,
                                                num_train_epochs=2, bf16=False, max_length=64,
                                                lr_scheduler_type="linear", warmup_steps=2))
        for lr in LEARNING_RATES])
    return RFGridSearch(configs, trainer_type="SFT")


def make_data():
    from rapidfire_nb.demo_data import make_demo_datasets

    return make_demo_datasets(N_TRAIN, N_EVAL, seed=5)


CLONE_CHANGES = {"training_args.learning_rate": 5e-3}


def run_experiment(root, name: str = NAME, resume: bool = False, clone: bool = False):
    """``clone``: once run 1 has logged its first chunk, add a warm-start clone of it (run 4)."""
    from rapidfire_nb import Experiment
    from rapidfire_nb.demo_data import tiny_create_model

    train, evald = make_data()
    exp = Experiment(name, experiment_path=root, resume=resume, tracking=[])
    if clone and not resume:
        cloned: list[int] = []

        def on_event(ev):
            if ev["type"] == "chunk_done" and ev["run_id"] == 1 and not cloned:
                cloned.append(exp.clone_modify(1, CLONE_CHANGES, warm_start=True))

        exp.events.subscribe(on_event)
    exp.run_fit(make_group(), tiny_create_model, train, evald, block=True, **RUN_FIT_KW)
    return exp


# -- pausing inside writes ----------------------------------------------------------------------

def _pause_here(root: Path, what: str) -> None:
    # written beside, then renamed: the parent sees the marker only with its text in it (it
    # kills as soon as the file exists, which could be between the create and the write)
    (root / "PAUSED.tmp").write_text(what)
    os.replace(root / "PAUSED.tmp", root / "PAUSED")
    time.sleep(600)  # the test kills us here
    os._exit(3)


def install_pause(root: Path, spec: str) -> None:
    from rapidfire_nb.engine import store

    file, n, phase = spec.split(":")
    n = int(n)
    suffix = {"state": ".state.safetensors.tmp-", "runs": ".runs.json.tmp-"}[file]
    count = {"writes": 0}
    if phase == "mid":
        from rapidfire_nb.engine import fsio

        plain = fsio._plain_write

        def write(f, data):
            if suffix in os.path.basename(f.name):
                count["writes"] += 1
                if count["writes"] == n:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.fsync(f.fileno())
                    _pause_here(root, f"{spec} {f.name}")
            plain(f, data)

        fsio._plain_write = write
    elif phase == "renamed":
        assert file == "state", "the 'renamed' phase is for checkpoints"
        save = store.ExperimentStore.save_checkpoint

        def save_checkpoint(self, run_id, state):
            out = save(self, run_id, state)
            count["writes"] += 1
            if count["writes"] == n:
                _pause_here(root, f"{spec} run {run_id}")
            return out

        store.ExperimentStore.save_checkpoint = save_checkpoint
    else:
        raise ValueError(f"unknown pause phase {phase!r}")


def child_main(req: dict) -> None:
    root = Path(req["root"])
    root.mkdir(parents=True, exist_ok=True)
    log = os.open(root / f"worker-{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    code = 0
    try:
        if req.get("pause"):
            install_pause(root, req["pause"])
        exp = run_experiment(root, req.get("name", NAME), bool(req.get("resume")), bool(req.get("clone")))
        exp.end()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    # import everything the children need, but run nothing that starts threads
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401
    from trl import SFTTrainer  # noqa: F401

    import rapidfire_nb.automl
    import rapidfire_nb.demo_data
    import rapidfire_nb.engine.controller
    import rapidfire_nb.experiment  # noqa: F401

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req["cmd"] == "start":
            pid = os.fork()
            if pid == 0:
                child_main(req)
            reply = {"pid": pid}
        elif req["cmd"] == "reap":
            _, status = os.waitpid(req["pid"], 0)
            reply = {"pid": req["pid"], "exit": os.waitstatus_to_exitcode(status)}
        elif req["cmd"] == "quit":
            return
        else:
            reply = {"error": f"unknown cmd {req['cmd']!r}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit("usage: python crash_worker.py serve")
