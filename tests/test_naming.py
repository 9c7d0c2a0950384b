"""Run short names (``3 · lr 1e-3 · r 32``): one rule in Python (tracking/naming.py) and in the
panel (js/src/names.ts), both checked against tests/fixtures/run_names.json (js/test/names.test.ts
reads the same file), and the names where users meet them: get_runs_info, the report's curves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapidfire_nb.tracking.naming import folder_name, knob_value_text, short_name

CASES = json.loads((Path(__file__).parent / "fixtures" / "run_names.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_short_names_follow_the_shared_table(case):
    assert short_name(case["run_id"], case["knobs"]) == case["name"]


def test_the_shared_table_reads_as_intended():
    names = [c["name"] for c in CASES]
    assert "3 · lr 1e-3 · r 32" in names and "run 1" in names
    assert any(n.endswith("· +1 knobs") for n in names)   # at most four knobs in a name


def test_values_read_short():
    assert knob_value_text(1e-3) == "1e-3" and knob_value_text(2e-4) == "2e-4"
    assert knob_value_text(32) == "32" and knob_value_text(32.0) == "32"
    assert knob_value_text(True) == "true" and knob_value_text(["q", "v"]) == "q+v"
    assert knob_value_text(float("nan")) == "NaN"


def test_folder_names_are_one_path_part():
    name = folder_name(2, {"model_name": "org/model", "note": 'a:b*c?"<>|\\'})
    assert "/" not in name and "\\" not in name and ":" not in name
    assert name.startswith("2 · model org_model")
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
