"""CI's lowest-version job pins each dependency to the lower bound pyproject.toml states."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / ".ci"))
from lowest_constraints import floors  # noqa: E402


def test_every_dependency_but_torch_is_pinned_to_its_floor():
    out = subprocess.run([sys.executable, str(ROOT / ".ci" / "lowest_constraints.py")],
                         capture_output=True, text=True, check=True).stdout.split()
    pins = dict(line.split("==") for line in out)
    assert "torch" not in pins   # CI installs the torch build itself
    from rapidfire_nb._compat import SUPPORTED

    for dist, (low, _high) in SUPPORTED.items():
        assert pins[dist] == low, dist


def test_floors_read_extras_and_markers_and_refuse_a_missing_lower_bound():
    assert floors(["peft>=0.21,<1", "foo[bar] >= 1.2 ; python_version < '4'", "torch>=2"]) == [
        "peft==0.21", "foo==1.2"]
    with pytest.raises(SystemExit, match="no lower bound"):
        floors(["requests<3"])
