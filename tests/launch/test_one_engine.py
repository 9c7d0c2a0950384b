"""One engine per device, and an interrupted wait that says what it did.

- A second ``run_fit`` while another experiment of this process still trains is refused, naming
  the training experiment and the one line that ends it, and changes nothing; ``%rapidfire end
  NAME`` ends it; ``allow_concurrent=True`` is the explicit way to train both.
- Kernel > Interrupt during ``exp.wait()`` in a real kernel prints one line (the runs go on, how to
  stop them) and no traceback, and the runs do go on to the end.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine.events import read_events
from rapidfire_nb.errors import RapidFireError
from rapidfire_nb.session import training_experiments

pytestmark = pytest.mark.slow   # slow tier: several experiments training in one process

ROOT = Path(__file__).resolve().parents[2]


def group(epochs: int = 3):
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([1e-3, 2e-2]), per_device_train_batch_size=8,
                                  num_train_epochs=epochs, max_length=64, bf16=False))
    return RFGridSearch(cfg, trainer_type="SFT")


@pytest.fixture
def shell():
    InteractiveShell.clear_instance()
    cfg = Config()
    cfg.HistoryManager.enabled = False
    ip = InteractiveShell.instance(config=cfg)
    ip.run_line_magic("load_ext", "rapidfire")
    yield ip
    InteractiveShell.clear_instance()


def test_the_hand_back_belongs_to_a_notebook_cell_and_ends_with_its_experiment(tmp_path, tiny_data, capsys):
    train, evald = tiny_data
    # a script has no cells: Experiment(...) still returns the one that trains, but its run_fit
    # is refused like any second call
    InteractiveShell.clear_instance()
    first = Experiment("s", experiment_path=tmp_path)
    try:
        first.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, block=False)
        with first.engine.atomically():
            assert Experiment("s", experiment_path=tmp_path) is first
            with pytest.raises(RapidFireError, match=r"already called .*%rapidfire end s"):
                first.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        # in a cell: ended in the handing-back cell, its run_fit is refused as ended, not "left
        # training"
        shell = InteractiveShell.instance()
        with first.engine.atomically():
            assert Experiment("s", experiment_path=tmp_path) is first
        first.end(wait=False)
        capsys.readouterr()
        with pytest.raises(RapidFireError, match="has ended"):
            first.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        assert "training as it was" not in capsys.readouterr().out
        assert shell.execution_count is not None
    finally:
        first.end(wait=False)
        InteractiveShell.clear_instance()


def test_a_second_run_fit_while_another_trains_is_refused_until_it_ends(tmp_path, tiny_data, shell, capsys):
    train, evald = tiny_data
    first = Experiment("x", experiment_path=tmp_path)
    second = None
    try:
        first.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, block=False)
        listing = sorted(os.listdir(tmp_path))
        # the re-run cell: `exp` stays the experiment that trains, and that cell's run_fit leaves
        # it as it is (one line; the cell's last line then shows its panel): no "x_2" folder, no
        # lock, no run added
        runs = len(first.get_runs_info())
        capsys.readouterr()
        with first.engine.atomically():   # keeps the first one training while we look
            again = Experiment("x", experiment_path=tmp_path)
            assert again is first
            assert again.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2,
                                 block=False) is first
            said = capsys.readouterr().out
            assert "is still training in this kernel, so Experiment(...) returned it" in said
            assert "run_fit left experiment 'x' training as it was" in said
            # a run_fit called again on it, not from a re-run cell, is refused as before
            with pytest.raises(RapidFireError, match=r"already called .*%rapidfire end x"):
                first.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
            # the hand-back lasts as long as its cell: a cell with no run_fit, then a later
            # cell's run_fit is refused like any other
            assert Experiment("x", experiment_path=tmp_path) is first
            count = shell.execution_count
            shell.run_cell("1", store_history=True)
            assert shell.execution_count == count + 1   # the premise: another cell ran
            with pytest.raises(RapidFireError, match=r"already called .*%rapidfire end x"):
                first.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        assert sorted(os.listdir(tmp_path)) == listing and len(first.get_runs_info()) == runs
        # another experiment's run_fit must not start a second engine on the same device unseen
        second = Experiment("y", experiment_path=tmp_path)
        with first.engine.atomically():   # keeps the first one training while we look
            assert training_experiments() == ["x"]
            with pytest.raises(RapidFireError) as refused:
                second.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        text = str(refused.value)
        assert "'x' is still training" in text
        assert "%rapidfire end x" in text and ".end(wait=False)" in text
        assert "allow_concurrent=True" in text
        # refused: nothing started, and the new experiment's folder given back
        assert second.engine is None
        assert sorted(os.listdir(tmp_path)) == listing and second.name == "y"
        # the refused, empty experiment does not hide the training one from the magics
        import rapidfire_nb.experiment as E

        assert E.current_experiment() is first
        capsys.readouterr()
        status = shell.run_line_magic("rapidfire", "status")
        assert capsys.readouterr().err == ""
        assert len(status) == 2 and "no runs yet" not in str(status)
        with pytest.raises(RapidFireError, match="allow_concurrent must be True or False"):
            second.run_fit(group(1), tiny_create_model, train, evald, allow_concurrent="yes")

        # the one line that ends it
        capsys.readouterr()
        shell.run_cell("%rapidfire end x", store_history=False)
        out, err = capsys.readouterr()
        assert err == "", err
        assert "experiment 'x': ended" in out
        assert first._ended and training_experiments() == []
        statuses = {r: s for r, s in first.get_runs_info()[["run_id", "status"]].itertuples(index=False)}
        assert set(statuses.values()) <= {"stopped", "completed"}, statuses
        # now the second one may train, and is the one the magics mean
        second.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=True)
        assert E.current_experiment() is second
        assert set(second.get_runs_info().status) == {"completed"}
    finally:
        first.end(wait=False)
        if second is not None:
            second.end(wait=False)


def test_allow_concurrent_trains_two_experiments_at_once(tmp_path, tiny_data):
    train, evald = tiny_data
    a = Experiment("a", experiment_path=tmp_path)
    b = Experiment("b", experiment_path=tmp_path)
    try:
        a.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        with a.engine.atomically():
            assert "a" in training_experiments()
            b.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False,
                      allow_concurrent=True)
        assert a.wait(timeout=600) and b.wait(timeout=600)
        for exp in (a, b):
            assert set(exp.get_runs_info().status) == {"completed"}
    finally:
        a.end(wait=False)
        b.end(wait=False)


def test_end_magic_without_a_training_experiment_says_so(shell, capsys):
    import rapidfire_nb.experiment as E

    if E.current_experiment() is not None:
        E.current_experiment().end(wait=False)
    capsys.readouterr()
    shell.run_cell("%rapidfire end", store_history=False)
    shell.run_cell("%rapidfire end nosuch", store_history=False)
    shell.run_cell("%rapidfire end a b", store_history=False)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 3 and "Traceback" not in err, err
    assert "nothing to end" in lines[0]
    assert "no experiment 'nosuch' trains in this kernel" in lines[1]
    assert "at most one experiment name" in lines[2]


def test_end_magic_on_an_open_experiment_that_trains_nothing_says_it_only_closed(tmp_path, shell, capsys):
    exp = Experiment("idle", experiment_path=tmp_path)
    capsys.readouterr()
    shell.run_cell("%rapidfire end", store_history=False)
    out, err = capsys.readouterr()
    assert err == "", err
    # no runs were stopped: the line must not say so, nor offer to continue them
    assert out.strip() == "experiment 'idle': closed (nothing was training)"
    assert exp._ended


def test_panel_magic_after_a_kernel_restart_names_the_resume_call(tmp_path, shell, capsys, monkeypatch):
    import rapidfire_nb.experiment as E

    if E.current_experiment() is not None:
        E.current_experiment().end(wait=False)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    shell.run_cell("%rapidfire panel", store_history=False)
    assert capsys.readouterr().err.strip() == ("%rapidfire: no experiment in this kernel: create one with "
                                               "exp = Experiment('name') and call exp.run_fit(...)")
    # a fresh kernel in a folder where an experiment trained before the restart
    for name in ("older", "quickstart"):
        folder = tmp_path / "rapidfire_experiments" / name
        folder.mkdir(parents=True)
        (folder / "events.jsonl").write_text("")
        time.sleep(0.05)
    os.utime(tmp_path / "rapidfire_experiments" / "older" / "events.jsonl", (1, 1))
    shell.run_cell("%rapidfire panel", store_history=False)
    err = capsys.readouterr().err
    assert "after a kernel restart, Experiment('quickstart', resume=True) and the same run_fit(...)" in err, err
    assert "Traceback" not in err


def test_a_second_stop_or_resume_before_the_boundary_says_the_op_is_queued(tmp_path, tiny_data):
    from rapidfire_nb.errors import OpRefused

    train, evald = tiny_data
    exp = Experiment("twice", experiment_path=tmp_path)
    try:
        exp.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        with exp.engine.atomically():   # nothing applies while we look: both ops stay queued
            exp.stop(2)
            with pytest.raises(OpRefused) as again:
                exp.stop(2)
            assert "run 2 is stopping (still " in str(again.value)
            assert "is stopped" not in str(again.value)
            exp.resume(2)       # stop then resume before the boundary: pending, as it is now
            with pytest.raises(OpRefused) as again:
                exp.resume(2)
            assert str(again.value).startswith("run 2 is pending; only stopped runs")
    finally:
        exp.end(wait=False)


KERNEL_SETUP = """
from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
train, evals = make_demo_datasets(96, 16)
cfg = RFModelConfig(model_name="tiny", model_kwargs={"hidden_size": 32},
    peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    # long enough that the wait below is still blocking when the interrupt comes, on a fast machine too
    training_args=RFSFTConfig(learning_rate=List([1e-3, 2e-2]), per_device_train_batch_size=8,
                              num_train_epochs=1000, max_length=64, bf16=False))
exp = Experiment("interrupt", experiment_path="experiments")
exp.run_fit(RFGridSearch(cfg, trainer_type="SFT"), tiny_create_model, train, evals, num_chunks=4)
print("returned")
"""


def _execute(kc, code: str, timeout: float, interrupt_after: float | None = None, km=None):
    """Run ``code``; returns (stdout text, error messages), interrupting the kernel once if asked."""
    msg_id = kc.execute(code)
    out: list[str] = []
    errors: list[dict] = []
    start = time.monotonic()
    interrupted = False
    while True:
        if interrupt_after is not None and not interrupted and time.monotonic() - start > interrupt_after:
            km.interrupt_kernel()
            interrupted = True
        if time.monotonic() - start > timeout:
            raise AssertionError(f"cell did not finish within {timeout} s; output so far: {''.join(out)!r}")
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            errors.append(content)
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out), errors


@pytest.mark.slow
def test_kernel_interrupt_during_wait_says_the_runs_go_on(tmp_path):
    from jupyter_client.manager import KernelManager

    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", RF_TENSORBOARD_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=str(tmp_path), env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        out, errors = _execute(kc, KERNEL_SETUP, timeout=300)
        assert not errors and "returned" in out, (out, errors)
        # Kernel > Interrupt while wait() blocks the cell
        out, errors = _execute(kc, "print('waiting'); exp.wait(); print('after wait')", timeout=120,
                               interrupt_after=1.5, km=km)
        assert errors == [], f"a traceback reached the cell: {errors}"
        lines = [ln for ln in out.splitlines() if ln.strip()]
        notes = [ln for ln in lines if "interrupted the wait only" in ln]
        assert len(notes) == 1, out
        assert "go on training in the background" in notes[0]
        assert "%rapidfire end interrupt" in notes[0] and "exp.end(wait=False)" in notes[0]
        assert "after wait" in out   # wait() returned False in the kernel; the cell went on
        # ... and the runs did go on: more chunks trained after the interrupt (a condition, not a
        # duration: the runs are far longer than the test lets them train), none stopped
        log = tmp_path / "experiments" / "interrupt" / "events.jsonl"
        def chunks():
            return sum(e["type"] == "chunk_done" for e in read_events(log))
        at_interrupt = chunks()
        deadline = time.monotonic() + 600
        while chunks() < at_interrupt + 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert chunks() >= at_interrupt + 2, f"no chunk trained after the interrupt ({at_interrupt} before)"
        out, errors = _execute(kc, "print(sorted(set(exp.get_runs_info().status)))", timeout=120)
        assert not errors and out.strip() in ("['running']", "['completed']", "['completed', 'running']",
                                              "['pending', 'running']"), (out, errors)
        assert not any(e["type"] == "run_status" and e["status"] == "stopped" for e in read_events(log))
        _execute(kc, "exp.end(wait=False)", timeout=300)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_an_experiment_of_the_same_name_in_another_folder_is_refused_too(tmp_path, tiny_data):
    train, evald = tiny_data
    first = Experiment("x", experiment_path=tmp_path / "d1", tracking=[])
    try:
        first.run_fit(group(), tiny_create_model, train, evald, num_chunks=4, block=False)
        other = Experiment("x", experiment_path=tmp_path / "d2", tracking=[])
        assert other is not first
        with first.engine.atomically():   # keeps the first one training while we look
            with pytest.raises(RapidFireError, match=r"'x' is still training in this kernel"):
                other.run_fit(group(1), tiny_create_model, train, evald, num_chunks=2, block=False)
        assert other.engine is None and not (tmp_path / "d2" / "x").exists()
    finally:
        first.end(wait=False)
