"""The repository's notebooks open on GitHub and nbviewer: valid nbformat, and no widget metadata
without its `state` (GitHub shows "Invalid Notebook" for that)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def widget_problems(nb: dict) -> list[str]:
    """What in a notebook's widget metadata GitHub's renderer refuses."""
    problems = []
    widgets = nb.get("metadata", {}).get("widgets")
    if widgets is None:
        return problems
    if not isinstance(widgets, dict):
        return ["metadata.widgets is not an object"]
    for mime, value in widgets.items():
        if mime == WIDGET_STATE and (not isinstance(value, dict) or "state" not in value):
            problems.append(f"metadata.widgets[{mime!r}] has no 'state'")
    for i, cell in enumerate(nb.get("cells", [])):
        if "widgets" in cell.get("metadata", {}):
            problems.append(f"cell {i} carries widget metadata")
    return problems


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 4


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_valid_and_its_widget_metadata_has_state(path):
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    assert nb.nbformat == 4
    nbformat.validate(nb)
    assert widget_problems(nb) == []


def test_the_check_catches_what_github_refuses():
    bad = nbformat.v4.new_notebook()
    bad.metadata["widgets"] = {WIDGET_STATE: {"version_major": 2, "version_minor": 0}}
    assert widget_problems(bad) == [f"metadata.widgets[{WIDGET_STATE!r}] has no 'state'"]
    bad.metadata["widgets"][WIDGET_STATE]["state"] = {}
    assert widget_problems(bad) == []
