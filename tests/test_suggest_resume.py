"""Suggest mode and pruning across resume, late answers and ended runs (review_suggest.md).

Real SFTTrainer on the tiny in-process model, as in tests/test_tuning.py (its helpers are reused).
"""

import json

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.errors import ConfigError
from tests.test_tuning import _answers, _wait_for_marks, data, grid  # noqa: F401  (data: fixture)


def test_resume_with_other_pruner_settings_is_refused_and_changes_nothing(data, tmp_path):  # noqa: F811
    """Finding 1: a resume with another pruner/mode/factor was accepted and judged the stored
    rungs by the new rules; an older folder without saved settings still resumes."""
    train, evald = data
    exp = Experiment("prune-resume", experiment_path=tmp_path)
    exp.run_fit(grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
                num_chunks=4, block=False)
    _wait_for_marks(exp, 2)
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
            e2.run_fit(grid(epochs=2, **kw), tiny_create_model, train, evald, num_chunks=4, block=False)
        assert e2.engine is None and e2.automl is None
        e2.end()
        assert {name: (root / name).read_bytes() for name in files} == files
    # the same settings resume, and the open marks are still answerable
    e3 = Experiment("prune-resume", experiment_path=tmp_path, resume=True)
    e3.run_fit(grid(epochs=2, pruner="sha", pruner_mode="suggest"), tiny_create_model, train, evald,
               num_chunks=4, block=False)
    assert e3.automl.suggestions
    e3.end(wait=False)
    # a folder written before the settings were saved: resumed as before, without a check
    meta = json.loads((root / "experiment.json").read_text())
    del meta["pruning"]
    (root / "experiment.json").write_text(json.dumps(meta))
    e4 = Experiment("prune-resume", experiment_path=tmp_path, resume=True)
    e4.run_fit(grid(epochs=2, pruner="sha", pruner_mode="suggest", reduction_factor=3), tiny_create_model,
               train, evald, num_chunks=4, block=False)
    e4.end(wait=False)
