"""Run short names (``3 · lr 1e-3 · r 32``): one rule in Python (tracking/naming.py) and in the
panel (js/src/names.ts), both checked against tests/fixtures/run_names.json (js/test/names.test.ts
reads the same file), and the names where users meet them: get_runs_info, the report's curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapidfire_nb.tracking.naming import folder_name, full_name, knob_value_text, short_name

CASES = json.loads((Path(__file__).parent.parent / "fixtures" / "run_names.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_short_names_follow_the_shared_table(case):
    assert short_name(case["run_id"], case["knobs"]) == case["name"]


def test_the_shared_table_reads_as_intended():
    names = [c["name"] for c in CASES]
    assert "3 · lr 1e-3 · r 32" in names and "run 1" in names
    # the id and at most two knobs, values compact: a legend entry stays a glance
    assert all(n.count(" · ") <= 2 and "knobs" not in n for n in names)
    assert "9 · sched cosine_with… · modules q_proj…(4)" in names and "8 · r 16 · model SmolLM2-135…" in names


def test_full_names_keep_every_knob_whole():
    knobs = {"training_args.lr_scheduler_type": "cosine_with_restarts", "peft_config.r": 8,
             "peft_config.target_modules": ["q_proj", "k_proj", "v_proj"]}
    assert short_name(4, knobs) == "4 · r 8 · sched cosine_with…"
    assert full_name(4, knobs) == "4 · sched cosine_with_restarts · r 8 · modules q_proj+k_proj+v_proj"


def test_values_read_short():
    assert knob_value_text(1e-3) == "1e-3" and knob_value_text(2e-4) == "2e-4"
    assert knob_value_text(32) == "32" and knob_value_text(32.0) == "32"
    assert knob_value_text(True) == "true" and knob_value_text(["q", "v"]) == "q+v"
    assert knob_value_text(float("nan")) == "NaN"


def test_folder_names_are_one_path_part():
    name = folder_name(2, {"model_name": "org/model", "note": 'a:b*c?"<>|\\'})
    assert "/" not in name and "\\" not in name and ":" not in name
    assert name.startswith("2 · model model · note a_b")   # a path keeps its last part
    assert folder_name(9, None) == "run 9"


def test_the_panel_note_message_is_checked_before_anything_is_logged():
    from rapidfire_nb.notebook import _panel_protocol as proto

    req = proto.parse_message({"type": "note", "run_id": 3, "text": "lr too high", "request_id": "v1-1"})
    assert (req.type, req.run_id, req.text) == ("note", 3, "lr too high")
    for bad, match in [({"type": "note", "run_id": 3, "text": "x" * (1 << 20)}, "at most 2000 characters; this one has 1048576"),
                       ({"type": "note", "run_id": 3, "text": 5}, "'text' must be a string"),
                       ({"type": "note", "run_id": 3}, "'text' must be a string"),
                       ({"type": "note", "run_id": 0, "text": "a"}, "run"),
                       ({"type": "note", "run_id": 3, "text": "a", "op": "stop"}, "unexpected key 'op'")]:
        with pytest.raises(proto.MessageError, match=match):
            proto.parse_message(bad)
