"""The supported library ranges: checked at import, and the same in pyproject.toml."""

import re
import subprocess
import sys
from pathlib import Path

from rapidfire_nb import _compat


def test_installed_versions_are_supported():
    assert _compat.unsupported(_compat.installed_versions()) == []


def test_a_version_outside_the_range_is_named_with_the_range():
    have = _compat.installed_versions()
    problems = _compat.unsupported({**have, "trl": "1.10.0", "peft": None})
    assert len(problems) == 2
    assert "trl 1.10.0 is installed; rapidfire_nb supports trl>=1.16,<2" in problems
    assert any(p.startswith("peft is not installed") for p in problems)
    assert _compat.unsupported({**have, "transformers": "6.0.0.dev0"}) == [
        "transformers 6.0.0.dev0 is installed; rapidfire_nb supports transformers>=5.3,<6"]


def test_pyproject_states_the_same_ranges():
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    for dist, (low, high) in _compat.SUPPORTED.items():
        assert re.search(rf'"{dist}>={re.escape(low)},<{re.escape(high)}"', text), dist


def test_import_fails_with_the_range_when_unsupported(tmp_path):
    # a real import in a fresh interpreter, with a fake old trl distribution first on the path
    dist = tmp_path / "trl-1.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 1.10.0\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import rapidfire_nb"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "trl 1.10.0 is installed; rapidfire_nb supports trl>=1.16,<2" in proc.stderr
