"""The panel's buttons on an experiment trained by Ray workers: the same messages the browser sends
(``Panel.handle_message``, as a click does) reach runs that train on another process, and are
applied at their chunk boundaries, as in the kernel engine: ops from the panel and from Python
work alike. A real local Ray with two declared GPUs, used as CPU devices."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import pytest  # noqa: E402

import ray  # noqa: E402  (the test extra installs it: no skip)

from rapidfire_nb import Experiment  # noqa: E402
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig  # noqa: E402
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model  # noqa: E402
from rapidfire_nb.notebook.panel import Panel  # noqa: E402

pytestmark = pytest.mark.slow   # slow tier: a real local Ray


@pytest.fixture(scope="module")
def ray_session():
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")   # loopback only, as rapidfire's own start
    yield ray
    ray.shutdown()


def grid():
    return RFGridSearch(RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-2, 3e-3]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False)), trainer_type="SFT")


def test_panel_buttons_steer_runs_on_workers(ray_session, tmp_path):
    train, evald = make_demo_datasets(64, 16)
    exp = Experiment("panel-workers", experiment_path=tmp_path, num_workers=2)
    panel = Panel(exp, push=False)
    answers: list = []

    def click(msg):
        answers.append((msg["op"], panel.handle_message({"type": "op", **msg})))

    def listener(ev):   # the user clicks as run 1's first chunk shows up in the panel
        if ev["type"] == "chunk_done" and ev["run_id"] == 1 and ev["chunk"] == 0 and not answers:
            click({"op": "stop", "run_id": 1})
            click({"op": "clone", "run_id": 2, "changes": {"training_args.learning_rate": 1e-3},
                   "warm_start": False})
            click({"op": "delete", "run_id": 99})          # no such run: refused, nothing changes

    exp.events.subscribe(listener)
    exp.run_fit(grid(), tiny_create_model, train, evald, num_chunks=4, seed=3)
    assert exp.wait(timeout=600)

    ops = dict((op, reply) for op, reply in answers)
    assert ops["stop"]["ok"] and ops["clone"]["ok"], answers
    new_id = ops["clone"]["new_run_id"]
    assert new_id == 3
    assert not ops["delete"]["ok"] and "99" in ops["delete"]["error"]
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "stopped" and 1 <= int(info.loc[1, "chunks_done"]) < 4
    assert info.loc[2, "status"] == "completed" and info.loc[3, "status"] == "completed"
    assert int(info.loc[3, "parent_run_id"]) == 2

    # Resume from the panel: run 1 trains its remaining chunks on a worker, from its checkpoint
    reply = panel.handle_message({"type": "op", "op": "resume", "run_id": 1})
    assert reply["ok"], reply
    assert exp.wait(timeout=600)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[1, "status"] == "completed" and int(info.loc[1, "chunks_done"]) == 4
    chunks = [(e["run_id"], e["chunk"], e.get("worker")) for e in exp.events.since(0)
              if e["type"] == "chunk_done"]
    assert [c for r, c, _ in chunks if r == 1] == [0, 1, 2, 3]       # each chunk once, in order
    assert {w for _, _, w in chunks} <= {"w0", "w1"} and all(w for _, _, w in chunks)
    logged = [(e["op"], e["run_id"], e["accepted"]) for e in exp.events.since(0) if e["type"] == "op"]
    assert ("stop", 1, True) in logged and ("clone", 2, True) in logged and ("resume", 1, True) in logged
    # the panel's own view of the log agrees with the engine's records
    snap = panel.handle_message({"type": "pull", "since": 0})
    assert snap["ok"], snap
    pulled = [e for e in snap["events"] if e["type"] == "chunk_done"]
    assert pulled and all(e.get("worker") in ("w0", "w1") for e in pulled), pulled[:2]
    panel.close()
    exp.end()
