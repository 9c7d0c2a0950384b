"""Colab: the install cell holds Colab's kernel stack, the floors sit at or below Colab's versions,
and a T4 (compute capability 7.5) trains in fp16, never bf16.

CI's Colab job (.ci/colab-stack) runs this file again inside its venv of Colab's exact versions
(``RF_COLAB_STACK=1``), where the last test checks that venv really is Colab's stack.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _colab_stack():
    spec = importlib.util.spec_from_file_location("colab_stack", ROOT / ".ci" / "colab_stack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cs = _colab_stack()


def _cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def _dependencies() -> list[Requirement]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_colab_freeze_is_kept_with_its_provenance():
    freeze = cs.read_freeze()
    assert freeze["ipykernel"][1] == "6.17.1" and freeze["ipython"][1] == "7.34.0"
    assert freeze["torch"][1] == "2.11.0"   # local version (+cu128) stripped
    readme = (ROOT / ".ci" / "colab" / "README.md").read_text()
    assert "googlecolab/backend-info" in readme


def test_every_kernel_stack_package_of_colab_satisfies_the_floors():
    """The project's own requirements accept Colab's installed version of every kernel-stack
    package, so pip has no reason to touch them (the job's dry-run checks the whole closure)."""
    freeze = cs.read_freeze()
    checked = 0
    for req in _dependencies():
        name = cs.canonical(req.name)
        if name in cs.KERNEL_STACK:
            have = Version(freeze[name][1])
            assert req.specifier.contains(have, prereleases=True), \
                f"pyproject.toml requires {req}, Colab ships {req.name} {have}"
            checked += 1
    assert checked >= 5   # ipykernel, ipython, ipywidgets, anywidget, numpy, torch


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_install_cell_holds_what_the_ci_job_checks(path):
    install = [s for s in _cells(path) if "%pip install" in s]
    assert len(install) == 1
    cell = install[0]
    held = re.search(r"held = \[(.*?)\]", cell, re.S)
    assert held, f"{path.name}: the install cell has no held list"
    names = tuple(re.findall(r'"([^"]+)"', held.group(1)))
    assert names == cs.HELD, f"{path.name}: held {names}, .ci/colab_stack.py checks {cs.HELD}"
    assert re.search(r'%pip install -q -c (\S+) "rapidfire-nb @ git\+\{REPO\}@\{REF\}"', cell)


def test_install_cell_writes_the_constraints_the_ci_job_uses(tmp_path, monkeypatch):
    """The held list, run as the cell runs it (its Python, up to the %pip line), writes the
    same pins as ``colab_stack.py held`` in the same environment."""
    cell = next(s for s in _cells(NOTEBOOKS[0]) if "%pip install" in s)
    body = cell.split('if "google.colab" in sys.modules:\n', 1)[1].split("    %pip", 1)[0]
    code = "\n".join(line[4:] for line in body.splitlines())
    target = tmp_path / "held.txt"
    code = code.replace('"/tmp/rapidfire-colab-held.txt"', repr(str(target)))
    exec(compile(code, "install-cell", "exec"), {"REPO": "https://github.com/owner/rapidfire-nb", "REF": "main"})
    assert target.read_text().split() == cs.held()
    assert any(line.startswith("ipykernel==") for line in cs.held())


def test_changes_reads_pips_report_against_the_freeze():
    freeze = {"datasets": ("datasets", "4.0.0"), "ipython": ("ipython", "7.34.0")}
    report = {"install": [
        {"metadata": {"name": "rapidfire-nb", "version": "0.1.0", "requires_dist": ["trl>=1.16"]},
         "download_info": {"url": "file:///src", "dir_info": {}}},
        {"metadata": {"name": "datasets", "version": "5.0.1"}, "download_info": {"url": "https://x/d.whl"}},
        {"metadata": {"name": "trl", "version": "1.16.0", "requires_dist": ["datasets>=4.7.0"]},
         "download_info": {"url": "https://x/t.whl"}},
    ]}
    got = cs.changes(report, freeze)
    assert [(c["name"], c["from"], c["to"]) for c in got] == [("datasets", "4.0.0", "5.0.1"),
                                                              ("trl", None, "1.16.0")]
    assert got[0]["required_by"] == ["trl (>=4.7.0)"]
    assert got[1]["required_by"] == ["rapidfire-nb (>=1.16)"]


def _fake_gpu(monkeypatch, capability, name):
    import torch

    from rapidfire_nb.automl import policy

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    # what torch says on a T4: True, because it counts (slow) bf16 emulation
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    import transformers.utils as tu

    monkeypatch.setattr(tu, "is_torch_bf16_gpu_available", lambda: True)
    policy.detect_machine.cache_clear()
    return policy


def test_a_t4_trains_in_fp16_never_bf16(monkeypatch):
    policy = _fake_gpu(monkeypatch, (7, 5), "Tesla T4")
    try:
        machine = policy.detect_machine()
        assert machine.accelerator == "cuda" and machine.bf16 is False
        kw, notes = policy.normalize_for_machine({"learning_rate": 1e-4}, machine, "RFSFTConfig")
        assert kw["fp16"] is True and kw["bf16"] is False and not notes
        kw, notes = policy.normalize_for_machine({"bf16": True}, machine, "RFSFTConfig")
        assert kw["bf16"] is False and "fp16=True" in notes[0] and "Tesla T4" in notes[0]
    finally:
        policy.detect_machine.cache_clear()


def test_an_ampere_gpu_keeps_bf16(monkeypatch):
    policy = _fake_gpu(monkeypatch, (8, 0), "A100")
    try:
        machine = policy.detect_machine()
        assert machine.bf16 is True
        assert policy.normalize_for_machine({}, machine, "X") == ({}, [])
    finally:
        policy.detect_machine.cache_clear()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
@pytest.mark.parametrize("capability,expect", [((7, 5), "fp16"), ((8, 6), "bf16")])
def test_the_notebooks_precision_cell_picks_fp16_on_a_t4(path, capability, expect, monkeypatch,
                                                         capsys):
    cell = next(s for s in _cells(path) if "get_device_capability" in s)
    _fake_gpu(monkeypatch, capability, "Tesla T4" if expect == "fp16" else "RTX")
    scope: dict = {}
    exec(compile(cell, f"{path.name}:precision", "exec"), scope)
    assert (scope["BF16"], scope["FP16"]) == ((False, True) if expect == "fp16" else (True, False))
    assert f"training in {expect}" in capsys.readouterr().out


@pytest.mark.skipif(os.environ.get("RF_COLAB_STACK") != "1", reason="CI's Colab job only")
def test_this_venv_is_colabs_kernel_stack():
    from importlib import metadata

    freeze = cs.read_freeze()
    for name in cs.KERNEL_STACK:
        if name != "torch":   # the CPU build here
            assert metadata.version(name) == freeze[name][1], name
