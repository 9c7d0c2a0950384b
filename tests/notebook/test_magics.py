"""The ``%rapidfire`` magic in a real IPython ``InteractiveShell`` against a real experiment.

Every sub-command is run as a user types it (``shell.run_cell("%rapidfire ...")``); malformed
input must print one clear line on stderr, never a traceback, and change nothing: no op queued,
no run created, no event logged, no code run.
"""

from __future__ import annotations

import copy
import json
import shutil
import time
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from rapidfire_nb import Experiment
from rapidfire_nb.automl import List, RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine.events import read_events
from rapidfire_nb.engine.state import fold
from rapidfire_nb.notebook import magic_args as A
from rapidfire_nb.notebook import magics as M
from rapidfire_nb.notebook import status_text as S

LR1, LR2 = 1e-3, 2e-2


@pytest.fixture(scope="module")
def shell():
    InteractiveShell.clear_instance()
    cfg = Config()
    cfg.HistoryManager.enabled = False  # no sqlite history file from tests
    ip = InteractiveShell.instance(config=cfg)
    # every test may run alone (-k): the magic is loaded here, not by an earlier test
    ip.run_line_magic("load_ext", "rapidfire")
    yield ip
    InteractiveShell.clear_instance()


def run(shell, capsys, line: str):
    """Run ``%rapidfire line`` as a cell; returns (stdout, stderr, the cell's result)."""
    capsys.readouterr()
    result = shell.run_cell(f"%rapidfire {line}", store_history=False)
    out, err = capsys.readouterr()
    return out, err, result


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    assert lines[0].startswith("%rapidfire: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


def group():
    cfg = RFModelConfig(
        model_name="tiny", model_kwargs={"hidden_size": 32},
        peft_config=RFLoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        training_args=RFSFTConfig(learning_rate=List([LR1, LR2]), per_device_train_batch_size=8,
                                  num_train_epochs=1, max_length=64, bf16=False,
                                  lr_scheduler_type="linear"))
    return RFGridSearch(cfg, trainer_type="SFT")


@pytest.fixture(scope="module")
def exp(tmp_path_factory, tiny_data, shell):
    train, evald = tiny_data
    e = Experiment("magics", experiment_path=tmp_path_factory.mktemp("m"))
    e.run_fit(group(), tiny_create_model, train.select(range(32)), evald, num_chunks=2, seed=3,
              block=False)
    yield e
    e.end()


# -- loading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rapidfire", "rapidfire_nb"])
def test_load_ext_registers_the_magic(shell, name):
    M.unload_ipython_extension(shell)
    shell.extension_manager.loaded.discard("rapidfire")
    shell.extension_manager.loaded.discard("rapidfire_nb")
    assert "rapidfire" not in shell.magics_manager.magics["line"]
    result = shell.run_line_magic("load_ext", name)
    assert result is None
    assert "rapidfire" in shell.magics_manager.magics["line"]


def test_no_experiment_gives_a_clear_message(shell, capsys, tmp_path):
    # an ended experiment is no longer current (whatever other tests left behind)
    Experiment("gone", experiment_path=tmp_path).end()
    from rapidfire_nb.session import current_experiment

    assert current_experiment() is None
    for line in ("status", "stop 1", "clone 1 lr=1e-3", "results", "panel", "tensorboard"):
        out, err, result = run(shell, capsys, line)
        assert_one_line_error(err, "no experiment in this kernel")
        assert result.success  # a message, not an exception in the cell


def test_an_experiment_without_runs_says_so(shell, capsys, tmp_path):
    e = Experiment("empty", experiment_path=tmp_path)
    try:
        out, err, _ = run(shell, capsys, "status")
        assert err == "" and "has no runs yet" in out
        out, err, _ = run(shell, capsys, "stop 1")
        assert_one_line_error(err, "no runs yet", "run_fit")
    finally:
        e.end()   # no longer current: the module's experiment below becomes the current one


def test_help_lists_every_command(shell, capsys):
    for line in ("help", ""):
        out, err, _ = run(shell, capsys, line)
        assert err == ""
        for cmd in M.COMMANDS:
            assert cmd in out


# -- Ray workers in status (a real recorded log: tests/fixtures/events/ray_workers.jsonl) -----------

RAY_LOG = Path(__file__).parent.parent / "fixtures" / "events" / "ray_workers.jsonl"
W1_LOST = ("LOST: ActorDiedError: The actor is dead because it was killed by `ray.kill`; runs 1, 2 continue "
           "on the other workers; run 1's chunk 2 (epoch 1) is trained again")


def test_status_lists_the_ray_workers_of_the_experiment(shell, capsys, tmp_path):
    # the recorded experiment's folder as the engine left it: its event log and experiment.json
    folder = tmp_path / "ray_workers"
    folder.mkdir()
    shutil.copyfile(RAY_LOG, folder / "events.jsonl")
    (folder / "experiment.json").write_text(json.dumps({"name": "ray_workers", "version": "0"}))
    e = Experiment("ray_workers", experiment_path=tmp_path, resume=True)
    try:
        out, err, _ = run(shell, capsys, "status")
        assert err == ""
        lines = out.splitlines()
        assert lines[:3] == [
            # resumed, run_fit not called: no engine runs these workers now
            "workers of the last session (not running now): 2 (1 lost)",
            "  w0  node 192.0.2.2  w0:cpu  last trained run 3 (epoch 1 · chunk 3/3)",
            # the lost worker kept its log (the `workers` event's path); w0's was removed at end()
            f"  w1  node 192.0.2.2  w1:cpu  {W1_LOST}; last trained run 2 (epoch 1 · chunk 2/3)"
            "  log /tmp/rapidfire-w1-1bkw2vf8/worker.log",
        ]
        # resumed, run_fit not called yet: the log has the runs, all completed (the log ends with
        # experiment_end): nothing to continue, and the table of them follows
        assert lines[3] == ("experiment 'ray_workers' has 3 run(s) in its log, none left to train "
                            "(3 completed); exp.get_results() and exp.get_runs_info() read them")
        assert lines[4].startswith("Out[") and "status" in lines[5]
        assert sum(" completed " in f"{line} " for line in lines[5:]) == 3
    finally:
        e.end()   # no longer current: the module's experiment below becomes the current one


def test_worker_lines_before_the_loss_and_with_chunks_in_flight():
    events = read_events(RAY_LOG)
    lost_at = next(ev["seq"] for ev in events if ev["type"] == "worker_lost")
    before = fold([ev for ev in events if ev["seq"] < lost_at])
    assert S.worker_lines(before, {"w0": 1, "w1": 3}) == [
        "workers: 2",
        "  w0  node 192.0.2.2  w0:cpu  training run 1; last trained run 1 (epoch 1 · chunk 1/3)",
        "  w1  node 192.0.2.2  w1:cpu  training run 3; last trained run 2 (epoch 1 · chunk 2/3)",
    ]
    # the workers event alone: known workers, nothing trained yet
    first = next(ev["seq"] for ev in events if ev["type"] == "workers")
    assert S.worker_lines(fold([ev for ev in events if ev["seq"] <= first]), {"w1": 2}) == [
        "workers: 2",
        "  w0  node 192.0.2.2  w0:cpu  no chunk trained yet",
        "  w1  node 192.0.2.2  w1:cpu  training run 2",
    ]
    # a lost worker trains nothing, whatever a stale in-flight map says
    after = S.worker_lines(fold(events), {"w1": 1})
    assert after[2] == f"  w1  node 192.0.2.2  w1:cpu  {W1_LOST}; last trained run 2 (epoch 1 · chunk 2/3)"


def test_worker_lines_when_no_worker_is_left():
    table = fold(read_events(RAY_LOG))
    table["lost_workers"][0]["workers_left"] = 0
    assert "runs 1, 2 stopped (no worker left)" in S.worker_lines(table)[2]
    assert "trained again" not in S.worker_lines(table)[2]


def test_status_names_each_live_workers_log_file():
    events = read_events(RAY_LOG)
    logs = S.worker_logs(events)
    assert logs == {"w0": "/tmp/rapidfire-w0-ilfm4xpt/worker.log", "w1": "/tmp/rapidfire-w1-1bkw2vf8/worker.log"}
    lines = S.worker_lines(fold(events), {}, live=True, logs=logs)
    assert lines[1].endswith("last trained run 3 (epoch 1 · chunk 3/3)  log /tmp/rapidfire-w0-ilfm4xpt/worker.log")
    assert lines[2].endswith("  log /tmp/rapidfire-w1-1bkw2vf8/worker.log")
    # a later session's pool reuses the name w1: its listing (and log) wins
    later = copy.deepcopy(events[-1])
    later.update(seq=later["seq"] + 1, type="workers",
                 workers=[{"worker": "w1", "node": "192.0.2.2", "device": "w1:cpu", "log": "/tmp/new/worker.log"}])
    assert S.worker_logs(events + [later])["w1"] == "/tmp/new/worker.log"


def test_the_kernel_engine_has_no_worker_lines():
    assert S.worker_lines(fold(read_events(RAY_LOG.with_name("sft_basic.jsonl")))) == []


def test_status_says_workers_are_starting_before_the_log_names_them():
    # a live worker engine whose workers are not up yet: no `workers` event in the log so far
    table = fold([e for e in read_events(RAY_LOG) if e["type"] not in ("workers", "chunk_done", "worker_lost")])
    assert not table.get("workers")
    (line,) = S.worker_lines(table, {}, live=True, starting=2)
    assert line.startswith("workers: 2 starting") and "pending" in line
    assert S.worker_lines(table, {}, live=False, starting=2) == []   # no engine runs them now


# -- the commands on a live experiment -----------------------------------------------------------

def test_stop_resume_status_on_a_training_experiment(exp, shell, capsys):
    # run_fit(block=False) returned at once: run 2 has not trained yet when it is stopped
    out, err, _ = run(shell, capsys, "stop 2")
    assert err == "" and "run 2: stop requested" in out
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    assert info.status.to_dict() == {1: "completed", 2: "stopped"}
    stopped_at = int(info.loc[2, "chunks_done"])
    assert stopped_at < 2

    table = shell.run_line_magic("rapidfire", "status")
    res = exp.get_results()
    best = {rid: min(res[(res.run_id == rid) & (res.metric == "eval_loss")].value, default=None)
            for rid in (1, 2)}
    # the panel's default order: best eval loss first once both runs have one, run order until then
    want = [1, 2] if best[2] is None else sorted(best, key=lambda rid: best[rid])
    assert list(table.index) == want
    assert table.loc[2, "status"] == "stopped"
    assert table.loc[1, "steps"] == f"{int(info.loc[1, 'total_steps'])}/{int(info.loc[1, 'total_steps'])}"
    assert [table.loc[1, "learning_rate"], table.loc[2, "learning_rate"]] == [LR1, LR2]
    # the panel's wording for the last chunk trained ("chunk 2/2"), not a running total of chunks
    assert table.loc[1, "progress"].endswith("chunk 2/2") and table.loc[1, "progress"].startswith("epoch ")
    assert "chunks" not in table.columns
    assert table.loc[1, "eval_loss"] == pytest.approx(float(info.loc[1, "eval_loss"]), abs=1e-4)
    out, err, result = run(shell, capsys, "status")
    assert err == "" and "stopped" in out and "completed" in out
    assert "workers" not in out   # the in-kernel engine: no worker lines

    out, err, _ = run(shell, capsys, "resume 2")
    assert err == "" and "run 2: resumed" in out
    assert exp.wait(timeout=300)
    assert exp.get_runs_info().set_index("run_id").loc[2, "status"] == "completed"


def test_clone_cold_and_warm(exp, shell, capsys):
    assert exp.wait(timeout=300)
    out, err, _ = run(shell, capsys, "clone 1 lr=5e-3 training_args.num_train_epochs=2 dropout=0.1")
    assert err == "", err
    assert "run 3: clone of run 1" in out and "cold start" in out
    # run 2 has finished its stream: a warm clone continues it for a second epoch
    out, err, _ = run(shell, capsys,
                      "clone 2 learning_rate=1e-4 lr_scheduler_type=constant epochs=2 --warm-start")
    assert err == "", err
    assert "run 4: clone of run 2" in out and "warm start" in out
    assert exp.wait(timeout=300)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[3, "parent_run_id"] == 1 and not info.loc[3, "warm_start"]
    assert info.loc[4, "parent_run_id"] == 2 and info.loc[4, "warm_start"]
    spec3, spec4 = exp.engine.snapshot()[3].spec, exp.engine.snapshot()[4].spec
    assert spec3.training_args["learning_rate"] == 5e-3
    assert spec3.training_args["num_train_epochs"] == 2
    assert spec3.peft_config["lora_dropout"] == 0.1
    assert spec4.training_args["learning_rate"] == 1e-4
    assert spec4.training_args["lr_scheduler_type"] == "constant"
    assert spec4.training_args["num_train_epochs"] == 2
    assert exp.engine.snapshot()[4].completed_steps == 2 * exp.engine.snapshot()[2].completed_steps
    table = shell.run_line_magic("rapidfire", "status")
    # run 2 finished its stream: the warm clone's data starts over at chunk 1, told beside its parent
    assert table.loc[3, "from"] == "1 (cold)" and table.loc[4, "from"] == "2 (warm, data from chunk 1/2)"
    # progress is the panel's (js/src/format.ts chunkText, stepText): the run's own steps from 0 and
    # its own epoch of its schedule, with the chunk of data it trained last; a warm clone's engine
    # counters start at its parent's position, which is not progress of its own
    last = {}
    for ev in exp.events.since(0):
        if ev["type"] == "chunk_done":
            last[ev["run_id"]] = ev
    created = {ev["run_id"]: ev for ev in exp.events.since(0) if ev["type"] == "run_created"}
    for rid, epochs in ((1, 1), (2, 1), (3, 2), (4, 2)):
        own_total = created[rid]["total_steps"] - created[rid]["base_step"]
        assert table.loc[rid, "steps"] == f"{own_total}/{own_total}", rid
        assert table.loc[rid, "progress"] == f"epoch {epochs}/{epochs} · chunk {last[rid]['chunk'] + 1}/2", rid
    assert int(table.loc[4, "steps"].split("/")[0]) == 2 * exp.engine.snapshot()[2].completed_steps


def test_knobs_lists_the_editable_knobs(exp, shell, capsys):
    out, err, _ = run(shell, capsys, "knobs 1")
    assert err == ""
    assert "training_args.learning_rate" in out and "peft_config.r" in out
    assert "0.001" in out


def test_results_returns_the_metrics(exp, shell, capsys):
    assert exp.wait(timeout=300)
    df = shell.run_line_magic("rapidfire", "results")
    assert set(df.run_id) >= {1, 2}
    assert {"loss", "eval_loss"} <= set(df.metric)
    assert len(df) == len(exp.get_results())


def test_delete_marks_metrics_deleted(exp, shell, capsys):
    assert exp.wait(timeout=300)
    out, err, _ = run(shell, capsys, "delete 3")
    assert err == "" and "run 3: deleted" in out
    deadline = time.monotonic() + 60
    while exp.engine.snapshot()[3].status != "deleted" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert exp.engine.snapshot()[3].status == "deleted"
    df = shell.run_line_magic("rapidfire", "results")
    assert df[df.run_id == 3].deleted.all() and len(df[df.run_id == 3]) > 0
    assert not df[df.run_id == 1].deleted.any()
    # a deleted run cannot be deleted again: a refusal, one line
    out, err, _ = run(shell, capsys, "delete 3")
    assert_one_line_error(err, "already deleted")


def test_panel_displays_the_experiment_panel(exp, shell, capsys):
    out, err, result = run(shell, capsys, "panel")
    assert err == "" and result.success
    assert exp._panel is not None
    from rapidfire_nb.notebook.panel import Panel

    assert isinstance(exp._panel, Panel)


def test_tensorboard_starts_on_the_experiment_logs(exp, shell, capsys):
    from rapidfire_nb.notebook.tensorboard import stop_tensorboard

    logdir = exp.path / "tensorboard"
    try:
        out, err, _ = run(shell, capsys, "tensorboard")
        assert err == "", err
        # a plain shell is no notebook front-end: TensorBoard's address is printed
        assert "http://127.0.0.1:" in out and str(logdir) in out
    finally:
        stop_tensorboard(logdir)


# -- malformed input: a clear line, nothing changes ----------------------------------------------

BAD = [
    ("stop 99", ["unknown run 99"]),
    ("resume 99", ["unknown run 99"]),
    ("delete 99", ["unknown run 99"]),
    ("clone 99 lr=1e-3", ["unknown run 99"]),
    ("stop", ["needs a run id"]),
    ("stop 1 2", ["takes one run id"]),
    ("stop one", ["run id must be a positive integer", "'one'"]),
    ("stop -1", ["run id must be a positive integer"]),
    ("stop __import__('os')", ["run id must be a positive integer"]),
    ("resume 1", ["run 1 is completed", "only stopped runs"]),
    ("stop 1", ["run 1 is completed"]),
    ("clone 1 lr=abc", ["lr=abc", "not a JSON or Python literal"]),
    ("clone 1 lr=__import__('os').system('touch PWNED')", ["not a JSON or Python literal"]),
    ("clone 1 lr_scheduler_type=__import__('os')", ["not a JSON or Python literal"]),
    ("clone 1 lr={1,2}", ["only JSON values"]),
    # IPython expands {expr} and $name in magic lines unless the magic opts out: it must
    ("clone 1 lr={__import__('os').system('touch PWNED')}", ["not a JSON or Python literal"]),
    ("clone 1 lr=$HOME", ["not a JSON or Python literal"]),
    ("clone 1 lr=1e-3 --cold", ["unknown option '--cold'"]),
    ("clone 1 lr=1e-3 --warm-start=yes", ["unknown option"]),
    ("clone 1 lr", ["expected key=value"]),
    ("clone 1 lr=", ["has no value"]),
    ("clone 1", ["needs at least one change"]),
    ("clone", ["needs a run id"]),
    ("clone 1 no_such_knob=1", ["unknown knob 'no_such_knob'"]),
    ("clone 1 learnin_rate=1e-3", ["unknown knob", "did you mean learning_rate"]),
    ("clone 1 training_args.no_such_knob=1", ["no_such_knob"]),
    ("clone 1 os.system=1", ["unknown knob 'os.system'"]),
    ("clone 1 peft_config=null", ["LoRA and full fine-tuning"]),
    ("clone 1 lr=-5", ["learning_rate"]),
    ("clone 1 lr=\"fast\"", ["learning_rate"]),
    ("clone 1 r=8 lora_r=9", ["unknown knob 'lora_r'"]),
    ("clone 1 lr=1e-3 learning_rate=2e-3", ["set twice"]),
    ("clone 1 r=16 --warm-start", ["4 -> 16"]),
    ("clone 1 lr=[1e-3", ["unclosed bracket"]),
    ("clone 1 lr_scheduler_type=\"cosine", ["unclosed"]),
    ("status now", ["takes no arguments"]),
    ("results 1", ["takes no arguments"]),
    ("help me", ["takes no arguments"]),
    ("stpo 1", ["unknown command 'stpo'", "did you mean stop"]),
    ("__import__('os').system('touch PWNED')", ["unknown command"]),
]


def _snapshot(exp):
    runs = {rid: (r.status, r.completed_steps) for rid, r in exp.engine.snapshot().items()}
    return runs, exp.events.last_seq, not exp.engine.ops_pending(), set(exp.engine.reserved_ids)


@pytest.mark.parametrize("line,needles", BAD, ids=[b[0] for b in BAD])
def test_malformed_input_changes_nothing(exp, shell, capsys, tmp_path, monkeypatch, line, needles):
    assert exp.wait(timeout=300)
    monkeypatch.chdir(tmp_path)  # where an executed 'touch PWNED' would land
    before = _snapshot(exp)
    out, err, result = run(shell, capsys, line)
    assert result.success
    assert_one_line_error(err, *needles)
    assert _snapshot(exp) == before
    assert not (tmp_path / "PWNED").exists()


def test_ambiguous_short_name_is_an_error():
    knobs = {"training_args.beta": 0.1, "generation_config.beta": 0.5, "peft_config.r": 8}
    with pytest.raises(A.MagicError, match="ambiguous.*generation_config.beta or training_args.beta"):
        A.resolve_key("beta", knobs, 1)
    assert A.resolve_key("training_args.beta", knobs, 1) == "training_args.beta"
    assert A.resolve_key("rank", knobs, 1) == "peft_config.r"


# -- the parser on its own -----------------------------------------------------------------------

def test_split_args_keeps_quotes_and_brackets():
    assert A.split_args('clone 1 target_modules=["q_proj", "v_proj"] name="a b" --warm-start') == [
        "clone", "1", 'target_modules=["q_proj", "v_proj"]', 'name="a b"', "--warm-start"]
    assert A.split_args("  status  ") == ["status"]


@pytest.mark.parametrize("text,value", [
    ("5e-4", 5e-4), ("16", 16), ("true", True), ("True", True), ("null", None), ("None", None),
    ('"cosine"', "cosine"), ("'cosine'", "cosine"), ('["q_proj","v_proj"]', ["q_proj", "v_proj"]),
    ("('q_proj', 'v_proj')", ["q_proj", "v_proj"]), ('{"a": 1}', {"a": 1}), ("-3", -3),
])
def test_parse_value_reads_literals(text, value):
    assert A.parse_value(text, "k") == value


@pytest.mark.parametrize("text", ["abc", "__import__('os')", "1+", "open('x')", "[x for x in ()]",
                                  "b'x'", "1j", "{1, 2}", "{1: 2}", "NaN", "1e999", "lambda: 0"])
def test_parse_value_refuses_non_literals(text):
    with pytest.raises(A.MagicError):
        A.parse_value(text, "k")


def test_bare_words_only_for_string_knobs():
    assert A.parse_value("cosine", "lr_scheduler_type", bare_word_ok=True) == "cosine"
    with pytest.raises(A.MagicError):
        A.parse_value("os.system('x')", "lr_scheduler_type", bare_word_ok=True)


def test_engine_state_after_all_commands(exp):
    # the commands above leave a consistent engine: every run terminal, deleted one released
    assert exp.wait(timeout=300)
    statuses = {rid: r.status for rid, r in exp.engine.snapshot().items()}
    assert statuses == {1: "completed", 2: "completed", 3: "deleted", 4: "completed"}
    assert 3 not in exp.engine.executor.trainers


@pytest.mark.slow
def test_load_ext_keeps_library_import_chatter_out_of_the_cell():
    """bitsandbytes (imported by peft) logs a 'Failed to load CPU gemm_4bit_forward' warning at
    import on machines without the `kernels` package; after %load_ext nothing of it is printed."""
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "sh.run_line_magic('load_ext', 'rapidfire')\n"
        "from rapidfire_nb.automl import RFLoraConfig\n"
        "RFLoraConfig(r=8, lora_alpha=16, target_modules=['q_proj'])\n"
    )
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "gemm_4bit_forward" not in proc.stderr + proc.stdout


def test_status_sorts_best_eval_loss_first_like_the_panel():
    # every live run has a best eval loss: lowest first, ties by id; deleted/pruned ones after, by id
    ranks = {1: (0.9, False), 2: (0.5, False), 3: (0.7, True), 4: (0.5, False), 5: (None, True)}
    assert S.best_first([1, 2, 3, 4, 5], ranks) == [2, 4, 1, 3, 5]
    # one live run without an eval yet (or a NaN one): a ranking with gaps, so run order is kept
    assert S.best_first([1, 2, 3], {1: (0.9, False), 2: (None, False), 3: (0.1, False)}) == [1, 2, 3]
    assert S.best_first([1, 2], {1: (0.9, False), 2: (float("nan"), False)}) == [1, 2]
    assert S.best_first([], {}) == []


def test_status_shows_a_dash_for_a_run_no_worker_trained_yet(exp):
    import pandas as pd

    assert exp.wait(timeout=300)
    info = exp.get_runs_info()
    # get_runs_info on Ray workers: a `worker` column, None for a run that trained no chunk yet
    info["worker"] = pd.Series(["w0"] + [None] * (len(info) - 1), index=info.index, dtype=object)
    table = S.status_table(exp, info)
    first = int(info.run_id.iloc[0])
    assert table.loc[first, "worker"] == "w0"
    assert set(table.drop(index=first)["worker"]) == {"-"}
    assert "NaN" not in table["worker"].to_string()
    # no note on a run: an empty cell, not "None"
    assert "None" not in table["note"].to_string()


def test_status_lists_the_ops_queued_for_the_next_chunk_boundary(shell, capsys, tmp_path, tiny_data):
    train, evald = tiny_data
    e = Experiment("queued", experiment_path=tmp_path)
    try:
        e.run_fit(group(), tiny_create_model, train.select(range(16)), evald, num_chunks=2, seed=3, block=False)
        ids = list(e.get_runs_info().run_id)
        # holding the engine's op lock: nothing is applied until the block ends (ops apply at the
        # next chunk boundary, so a live kernel sees this for a while)
        with e.engine.atomically():
            e.stop(ids[-1])
            new_id = e.clone_modify(ids[0], {"training_args.learning_rate": 5e-3})
            e.delete(new_id)
            out, err, _ = run(shell, capsys, "status")
        assert err == ""
        assert (f"queued (applied at the next chunk boundary): stop {ids[-1]}, clone of {ids[0]} -> "
                f"run {new_id}, delete {new_id}") in out.splitlines()
        assert e.wait(timeout=300)
        out, err, _ = run(shell, capsys, "status")
        assert err == "" and "queued" not in out
        assert e.get_runs_info().set_index("run_id").loc[new_id, "status"] == "deleted"
    finally:
        e.end()


def test_progress_before_any_chunk_uses_the_panels_words():
    # js/src/format.ts chunkText: the same three texts before a run's first chunk_done
    assert S._chunk_text(None, None, 4, "pending") == "first chunk next"
    assert S._chunk_text(None, None, 4, "running", True, 3) == "warm start from run 3 · first chunk next"
    assert S._chunk_text(None, None, 4, "stopped") == "no chunk trained"
    assert S._chunk_text(1, 0, 4, "completed") == "epoch 2 · chunk 1/4"


@pytest.mark.slow
@pytest.mark.slow
def test_status_names_the_run_each_live_worker_trains(shell, capsys, tmp_path, tiny_data):
    """A real local Ray (two CPU "GPUs", ~45 s here): while chunks are in flight, status names the
    run each worker trains now (the live engine's word, not in the log yet); at the end, the run
    each one trained last."""
    import os

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")   # loopback only, as rapidfire's own start
    e = None
    try:
        train, evald = tiny_data
        e = Experiment("magics_ray", experiment_path=tmp_path, num_workers=2)
        # 32 samples: two optimizer steps a chunk, so a chunk stays in flight long enough to be seen
        e.run_fit(group(), tiny_create_model, train.select(range(32)), evald, num_chunks=2, seed=3,
                  block=False)
        # the seconds before the first chunk are not silent
        assert "rapidfire: starting 2 Ray workers" in capsys.readouterr().out
        seen_training = set()
        deadline = time.monotonic() + 300
        while e.engine.busy() and time.monotonic() < deadline:
            out, err, _ = run(shell, capsys, "status")
            assert err == ""
            seen_training |= {ln.split()[0] for ln in out.splitlines() if "training run" in ln}
            time.sleep(0.05)
        assert e.wait(timeout=300)
        assert seen_training, "no status call saw a chunk in flight"
        out, err, _ = run(shell, capsys, "status")
        lines = out.splitlines()
        assert lines[0] == "workers: 2"
        last = {ev["worker"]: ev for ev in e.events.since(0) if ev["type"] == "chunk_done"}
        assert sorted(last) == ["w0", "w1"]
        for ln in lines[1:3]:
            ev = last[ln.split()[0]]
            assert (f"last trained run {ev['run_id']} (epoch {ev['epoch'] + 1} · chunk {ev['chunk'] + 1}/2)"
                    in ln) and "training" not in ln
    finally:
        if e is not None:
            e.end()
        ray.shutdown()


# -- resumed, damaged and deleted versions of the recorded Ray experiment (a review, session 5) ------

def _experiment_from(log: Path, root: Path, name: str = "ray_workers") -> Experiment:
    folder = root / name
    folder.mkdir()
    shutil.copyfile(log, folder / "events.jsonl")
    (folder / "experiment.json").write_text(json.dumps({"name": name, "version": "0"}))
    return Experiment(name, experiment_path=root, resume=True)


def _resumed_events() -> list[dict]:
    """The log, then a second session (resume=True in a new kernel): its new pool names the workers
    w0, w1 again (pool.py _add_worker), and the new w1 trains run 3."""
    events = read_events(RAY_LOG)
    last = events[-1]
    workers = copy.deepcopy(next(e for e in events if e["type"] == "workers"))
    chunk = copy.deepcopy([e for e in events if e["type"] == "chunk_done"][-1])
    seq, t = last["seq"], last["time"]
    workers.update(seq=seq + 2, time=t + 55)
    chunk.update(seq=seq + 3, worker="w1", device="w1:cpu", start=t + 56, end=t + 57, time=t + 57)
    return events + [{"seq": seq + 1, "time": t + 50, "type": "experiment", "name": "ray_workers",
                      "path": events[0]["path"], "resumed": True}, workers, chunk]


def test_status_does_not_call_a_later_sessions_worker_of_the_same_name_lost():
    lines = S.worker_lines(fold(_resumed_events()), {"w1": 3})
    (w1,) = [ln for ln in lines if ln.strip().startswith("w1 ")]
    assert "LOST" not in w1, w1
    assert "training run 3" in w1, w1
    assert lines[0] == "workers: 2", lines[0]
    # not running: the header says these are the last session's workers, and nothing trains
    idle = S.worker_lines(fold(_resumed_events()), {"w1": 3}, live=False)
    assert idle[0] == "workers of the last session (not running now): 2"
    assert not any("training run" in ln for ln in idle)


def test_status_survives_a_chunk_done_with_a_malformed_epoch():
    events = read_events(RAY_LOG)
    for e in events:
        if e["type"] == "chunk_done" and e["worker"] == "w0":
            e["epoch"] = "x"
    # the reducer skips malformed fields ("never raised"); status must not raise on them either
    lines = S.worker_lines(fold(events))
    assert lines[0] == "workers: 2 (1 lost)"
    assert lines[1] == "  w0  node 192.0.2.2  w0:cpu  last trained run 3"


def test_status_without_epoch_and_chunk_says_only_the_run_last_trained():
    events = read_events(RAY_LOG)
    for e in events:
        if e["type"] == "chunk_done":
            e.pop("epoch")
            e.pop("chunk")
    lines = S.worker_lines(fold(events))
    assert not any("(no chunk trained)" in ln for ln in lines), lines
    assert lines[2].endswith("; last trained run 2"), lines


def test_status_with_a_blank_ray_reason_has_no_empty_lost_text():
    events = read_events(RAY_LOG)
    for e in events:
        if e["type"] == "worker_lost":
            e["reason"] = "\n  \n"
    lines = S.worker_lines(fold(events))
    assert not any("LOST: ;" in ln or ln.rstrip().endswith("LOST:") for ln in lines), lines
    assert "LOST; runs 1, 2 continue" in lines[2]


def test_status_does_not_repeat_the_error_type_of_a_ray_task_error():
    assert S._reason_text("RayTaskError(ValueError): ray::ChunkWorker.train_chunk()\n"
                          "  File \"x.py\", line 1\nValueError: boom") == "RayTaskError(ValueError): boom"
    assert S._reason_text("ActorDiedError: The actor died\nmore\nit was killed.") == "ActorDiedError: it was killed"


def test_status_says_the_experiment_folder_is_gone(shell, capsys, tmp_path):
    e = _experiment_from(RAY_LOG, tmp_path)
    try:
        shutil.rmtree(tmp_path / "ray_workers")
        out, err, _ = run(shell, capsys, "status")
        text = out + err
        assert "run_fit" not in text, text        # nothing to continue: the checkpoints are gone
        assert "'ray_workers'" in err and "no longer exists (deleted?)" in err, text
    finally:
        e.end()


def test_the_table_docstrings_name_every_column(exp):
    # a newcomer reads help(exp.get_runs_info) / help(exp.get_timeline) to learn the columns
    from rapidfire_nb.engine.state import TIMELINE_COLUMNS

    assert exp.wait(timeout=300)
    runs_doc = Experiment.get_runs_info.__doc__
    cols = list(exp.get_runs_info().columns)
    fixed = cols[:2] + cols[cols.index("completed_steps"):]   # the knob columns sit in between
    assert all(f"``{c}``" in runs_doc for c in fixed + ["worker", "pruning"]), runs_doc
    timeline_doc = Experiment.get_timeline.__doc__
    assert all(f"``{c}``" in timeline_doc for c in TIMELINE_COLUMNS), timeline_doc
    assert "0-based" in timeline_doc and "Unix time" in timeline_doc
    for op in (Experiment.stop, Experiment.resume, Experiment.delete, Experiment.clone_modify):
        assert "next chunk boundary" in op.__doc__, op.__name__
    fit_doc = Experiment.run_fit.__doc__
    assert all(f"{arg}:" in fit_doc for arg in ("num_chunks", "seed", "block")), fit_doc
    assert Experiment.editable_knobs.__doc__


@pytest.mark.slow
def test_a_plain_script_gets_no_bitsandbytes_kernels_line(tmp_path):
    """Without %load_ext or the CLI (a script, or a notebook that only imports rapidfire_nb): the
    configs' and run_fit's peft/trl imports keep bitsandbytes' 'pip install kernels' warning out."""
    import subprocess
    import sys

    code = (
        "from rapidfire_nb import Experiment\n"
        "from rapidfire_nb.automl import RFGridSearch, RFLoraConfig, RFModelConfig, RFSFTConfig\n"
        "from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model\n"
        "train, ev = make_demo_datasets(16, 8)\n"
        "cfg = RFModelConfig(model_name='tiny', model_kwargs={'hidden_size': 32},"
        " peft_config=RFLoraConfig(r=4, target_modules=['q_proj']),"
        " training_args=RFSFTConfig(per_device_train_batch_size=8, max_length=32, bf16=False))\n"
        f"exp = Experiment('plain', experiment_path={str(tmp_path)!r}, num_workers=0)\n"
        "exp.run_fit(RFGridSearch(cfg, trainer_type='SFT'), tiny_create_model, train, ev, num_chunks=1)\n"
        "print(sorted(set(exp.get_runs_info().status)))\n"
        "exp.end()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "['completed']"
    assert "gemm_4bit_forward" not in proc.stderr + proc.stdout
    assert "pip install kernels" not in proc.stderr + proc.stdout


def test_a_refusal_shows_as_one_line_in_ipython_and_keeps_its_traceback_elsewhere(shell, capsys):
    import traceback

    from rapidfire_nb.errors import ConfigError, RapidFireError

    capsys.readouterr()
    result = shell.run_cell("from rapidfire_nb.errors import ConfigError\n"
                            "def configure():\n    raise ConfigError('learnin_rate: did you mean learning_rate?')\n"
                            "configure()", store_history=False)
    assert isinstance(result.error_in_exec, ConfigError)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "ConfigError\x1b[0m: learnin_rate: did you mean learning_rate?" in text
    assert "Traceback" not in text and "configure()" not in text
    # outside IPython (scripts, logs) the frames stay
    try:
        raise ConfigError("x")
    except ConfigError:
        assert "Traceback" in traceback.format_exc()
    # an internal failure keeps IPython's whole traceback
    capsys.readouterr()
    shell.run_cell("from rapidfire_nb.errors import RapidFireError\nraise RapidFireError('internal')",
                   store_history=False)
    internal = capsys.readouterr()
    assert "Traceback" in internal.out + internal.err and not hasattr(RapidFireError, "_render_traceback_")
