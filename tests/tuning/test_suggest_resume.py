"""Suggest mode and pruning across resume, late answers and ended runs.

Real SFTTrainer on the tiny in-process model, on the pruning grid of tests/helpers.py.
"""

import json

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import make_demo_datasets, tiny_create_model
from rapidfire_nb.errors import ConfigError

from helpers import pruning_grid, suggestion_answers, wait_for_marks

pytestmark = pytest.mark.slow   # slow tier: pruned trainings, resumed


@pytest.fixture(scope="module")
def data():
    return make_demo_datasets(32, 8)


def test_resume_with_other_pruner_settings_is_refused_and_changes_nothing(data, tmp_path):
    """A resume with another pruner, mode or reduction factor is refused (it would judge the
    stored rungs by new rules); an older folder without saved settings still resumes."""
    train, evald = data
    exp = Experiment("prune-resume", experiment_path=tmp_path)
    exp.run_fit(pruning_grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=4, block=False)
    wait_for_marks(exp, 2)
    exp.end(wait=False)
    root = tmp_path / "prune-resume"
    meta = json.loads((root / "experiment.json").read_text())
    assert meta["pruning"]["pruner"] == "sha" and meta["pruning"]["pruner_mode"] == "suggest"
    files = {name: (root / name).read_bytes() for name in ("experiment.json", "automl.json")}
    for kw, knob, old, new in (
            (dict(pruner="median", pruner_mode="suggest"), "pruner", "'sha'", "'median'"),
            (dict(pruner="sha", pruner_mode="stop"), "pruner_mode", "'suggest'", "'stop'"),
            (dict(pruner="sha", pruner_mode="suggest", reduction_factor=3), "reduction_factor", "2", "3"),
            (dict(pruner="sha", pruner_mode="suggest", min_chunks=2), "min_chunks", "1", "2"),
            (dict(pruner="sha", pruner_mode="suggest", objective="maximize:eval_mean_token_accuracy"),
             "objective", "'minimize:loss'", "'maximize:mean_token_accuracy'"),
            (dict(), "pruner", "'sha'", "None")):
        e2 = Experiment("prune-resume", experiment_path=tmp_path, resume=True)
        with pytest.raises(ConfigError, match=f"resume=True needs the original {knob}={old} \\(got {new}\\)"):
            e2.run_fit(pruning_grid(epochs=2, **kw), tiny_create_model, train, evald, num_chunks=4, block=False)
        assert e2.engine is None and e2.automl is None
        e2.end()
        assert {name: (root / name).read_bytes() for name in files} == files
    # the same settings resume, and the open marks are still answerable
    e3 = Experiment("prune-resume", experiment_path=tmp_path, resume=True)
    e3.run_fit(pruning_grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
               num_chunks=4, block=False)
    assert e3.automl.suggestions
    e3.end(wait=False)
    # a folder written before the settings were saved: resumed as before, without a check
    meta = json.loads((root / "experiment.json").read_text())
    del meta["pruning"]
    (root / "experiment.json").write_text(json.dumps(meta))
    e4 = Experiment("prune-resume", experiment_path=tmp_path, resume=True)
    e4.run_fit(pruning_grid(epochs=2, pruner="sha", pruner_mode="suggest", reduction_factor=3), tiny_create_model,
               train, evald, num_chunks=4, block=False)
    e4.end(wait=False)


def _confirm_in_last_chunk(exp, last):
    """Hold the engine right after a suggested run trained its last chunk (chunks_done == last
    before it), before the engine counts that chunk: the test confirms then. Returns the run id
    and the function that lets the engine go on."""
    import threading

    executor = exp.engine.executor
    real = executor.train_chunk
    in_last_chunk, confirmed = threading.Event(), threading.Event()
    target = []

    def train_chunk(rec):
        # the real chunk is trained; the confirm comes after it, before the engine counts it
        result = real(rec)
        if not target and rec.run_id in exp.automl.suggestions and rec.chunks_done == last:
            target.append(rec.run_id)
            in_last_chunk.set()
            confirmed.wait(120)
        return result

    executor.train_chunk = train_chunk
    assert in_last_chunk.wait(300), "no suggested run reached its last chunk"
    return target[0], confirmed.set


def test_a_confirm_during_the_last_chunk_is_not_reported_as_a_stop_and_ended_marks_close(data, tmp_path, capsys):
    """A confirm while the run trains its last chunk is not reported as a pruning followed by
    'then resumed by hand (completed)'; marks on runs that completed are closed (a bare
    apply_suggestions() does not answer them, nor erase the mark from the table); and
    dismiss_suggestions refuses a mark on an ended run as apply does."""
    train, evald = data
    exp = Experiment("suggest-late", experiment_path=tmp_path)
    exp.run_fit(pruning_grid(epochs=1, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=2, block=False)
    late, release = _confirm_in_last_chunk(exp, last=1)
    other = next(r for r in exp.automl.suggestions if r != late)
    try:
        assert exp.apply_suggestions([late]) == [late]      # still running: the stop is asked for
    finally:
        release()
    exp.wait()
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[late, "status"] == "completed"
    reason = info.loc[late, "pruning"]
    assert reason.startswith("suggested: pruned at chunk 1") and "resumed by hand" not in reason
    assert reason.endswith("; confirmed, but the run had completed")
    # the other mark was never answered; its run completed: shown as closed, not open
    assert info.loc[other, "status"] == "completed"
    assert info.loc[other, "pruning"].endswith("; run completed")
    before = len(exp.events.since(0))
    assert exp.apply_suggestions() == [] and exp.dismiss_suggestions() == []
    assert exp.events.since(before) == []       # "all" means the open marks: none
    # named, an ended run is skipped the same way by both answers, and logged as refused
    assert exp.dismiss_suggestions([other]) == []
    assert exp.apply_suggestions([other]) == []
    # and the magic does not claim it ignored it
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from rapidfire_nb.notebook.magics import load_ipython_extension

    InteractiveShell.clear_instance()
    cfg = Config()
    cfg.HistoryManager.enabled = False
    shell = InteractiveShell.instance(config=cfg)
    try:
        load_ipython_extension(shell)
        capsys.readouterr()
        shell.run_cell(f"%rapidfire ignore {other}", store_history=False)
        out, _ = capsys.readouterr()
    finally:
        InteractiveShell.clear_instance()
    assert f"run {other}: it ended before the answer; nothing to ignore" in out
    assert suggestion_answers(exp)[-3:] == [("ignore_suggestion", other, False), ("confirm_suggestion", other, False),
                                  ("ignore_suggestion", other, False)]
    assert [ev["reason"] for ev in exp.events.since(before)] == [f"run {other} is completed"] * 3
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[other, "pruning"].endswith("; run completed")     # the judgement stays shown
    exp.end()
    # the log tells the same story after a restart
    exp = Experiment("suggest-late", experiment_path=tmp_path, resume=True)
    exp.run_fit(pruning_grid(epochs=1, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=2, block=True)
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[late, "pruning"].endswith("; confirmed, but the run had completed")
    exp.end()


def test_a_pruned_run_deleted_later_is_not_said_to_be_resumed(data, tmp_path):
    """In stop mode a pruned run the user deletes does not read 'then resumed by hand (deleted)'."""
    train, evald = data
    exp = Experiment("prune-delete", experiment_path=tmp_path)
    exp.run_fit(pruning_grid(epochs=1, pruner="sha"), tiny_create_model, train, evald, num_chunks=2, block=True)
    info = exp.get_runs_info().set_index("run_id")
    pruned = [int(r) for r in info.index if info.loc[r, "status"] == "stopped"]
    assert pruned
    # one missing-value marker for text columns: None, as in `error`, not NaN for unjudged runs
    kept = [int(r) for r in info.index if info.loc[r, "status"] == "completed"]
    assert kept and all(info.loc[r, "pruning"] is None for r in kept)
    assert all(info.loc[r, "error"] is None for r in info.index)
    exp.delete(pruned[0])
    exp.wait()
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[pruned[0], "pruning"].startswith("pruned at chunk 1")
    assert info.loc[pruned[0], "pruning"].endswith("; then deleted")
    exp.end()


def test_an_ignored_mark_is_not_asked_again_when_automl_json_is_lost(data, tmp_path):
    """The log holds the answer, so a lost automl.json must not bring the mark back."""
    train, evald = data
    exp = Experiment("suggest-lost", experiment_path=tmp_path)
    exp.run_fit(pruning_grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=4, block=False)
    marked = wait_for_marks(exp, 2)
    b = int(marked.run_id.iloc[1])
    assert exp.dismiss_suggestions([b]) == [b]
    exp.end(wait=False)
    (tmp_path / "suggest-lost" / "automl.json").unlink()
    exp = Experiment("suggest-lost", experiment_path=tmp_path, resume=True)
    exp.run_fit(pruning_grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=4, block=True)
    marks = [ev["run_id"] for ev in exp.events.since(0) if ev["type"] == "pruning_suggested"]
    assert marks.count(b) == 1
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[b, "pruning"].endswith("; ignored by user")
    assert b not in exp.automl.suggestions
    exp.end()


def test_rfoptuna_confirm_prunes_the_trial_once_stopped_and_refills(data, tmp_path):
    """The trial of a confirmed run is told PRUNED when its stop took effect (no longer at the
    confirm, which may come too late), and its slot is refilled; an ignored trial completes."""
    pytest.importorskip("optuna")
    from rapidfire_nb.automl import Range, RFLoraConfig, RFModelConfig, RFOptuna, RFSFTConfig

    train, evald = data
    group = RFOptuna(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                                   training_args=RFSFTConfig(learning_rate=Range(1e-5, 5e-2, log=True),
                                                             per_device_train_batch_size=8, max_length=64)),
                     "SFT", n_initial=4, budget=6, pruner="sha", pruner_mode="suggest", seed=1)
    exp = Experiment("optuna-suggest", experiment_path=tmp_path)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=4, block=False)
    a, b = sorted(int(r) for r in wait_for_marks(exp, 2).run_id)[:2]
    assert exp.apply_suggestions([a]) == [a]
    assert exp.dismiss_suggestions([b]) == [b]
    exp.wait()
    tuner = exp.automl.tuner
    states = {t.user_attrs.get("run_id"): t.state.name for t in tuner.study.get_trials()}
    assert states[a] == "PRUNED" and states[b] == "COMPLETE"
    assert len(states) == 6 and max(states) == 6
    info = exp.get_runs_info().set_index("run_id")
    assert info.loc[a, "status"] == "stopped" and info.loc[a, "pruning"].startswith("pruned at chunk")
    exp.end()


def test_rfoptuna_a_confirm_that_came_too_late_leaves_the_trial_complete(data, tmp_path):
    """RFOptuna: a trial whose run trains to the end after a late confirm is not told PRUNED."""
    pytest.importorskip("optuna")
    from rapidfire_nb.automl import Range, RFLoraConfig, RFModelConfig, RFOptuna, RFSFTConfig

    train, evald = data
    group = RFOptuna(RFModelConfig(model_name="tiny", peft_config=RFLoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
                                   training_args=RFSFTConfig(learning_rate=Range(1e-5, 5e-2, log=True),
                                                             per_device_train_batch_size=8, max_length=64,
                                                             num_train_epochs=1)),
                     "SFT", n_initial=4, budget=4, pruner="sha", pruner_mode="suggest", seed=1)
    exp = Experiment("optuna-late", experiment_path=tmp_path)
    exp.run_fit(group, tiny_create_model, train, evald, num_chunks=2, block=False)
    late, release = _confirm_in_last_chunk(exp, last=1)
    try:
        assert exp.apply_suggestions([late]) == [late]
    finally:
        release()
    exp.wait()
    states = {t.user_attrs.get("run_id"): t.state.name for t in exp.automl.tuner.study.get_trials()}
    assert exp.get_runs_info().set_index("run_id").loc[late, "status"] == "completed"
    assert states[late] == "COMPLETE"
    exp.end()
