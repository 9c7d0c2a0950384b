"""A hostile folder, part 3: a report written through a planted link, hard links in a folder,
crafted metric names, unbounded run ids, RfDb names that are paths, path-valued knobs chosen by a
folder, and bad input that used to fail late. Each attack leaves the outside file (or the folder)
byte-identical and is refused with a reason that names the file, the field or the knob.
(Parts 1 and 2: tests/test_folder_safety.py, tests/test_hostile_folder.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapidfire_nb import Experiment
from rapidfire_nb.errors import RapidFireError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "events"
ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def digest(folder: Path) -> dict:
    """Every entry of a folder: its kind and, for a file, its bytes' hash."""
    out = {}
    for p in sorted([folder, *folder.rglob("*")]):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
        else:
            out[rel] = ("dir",)
    return out


def fixture_folder(parent: Path, name: str = "x", fixture: str = "sft_basic") -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / f"{fixture}.jsonl", folder / "events.jsonl")
    return folder


def a_key_file(tmp_path: Path) -> tuple[Path, bytes]:
    victim = tmp_path / "home" / ".ssh" / "authorized_keys"
    victim.parent.mkdir(parents=True)
    content = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOwner owner@laptop\n" * 200
    victim.write_bytes(content)
    return victim, content


# -- 1. a report (and every other file we write) never goes through a planted link ------------

@pytest.mark.parametrize("plant", ["symlink", "hardlink"])
def test_rapidfire_report_never_writes_through_a_planted_temporary_file(tmp_path, plant):
    """The shared archive holds ``x/`` and ``.x-report.html.tmp`` (a link to the user's
    authorized_keys); the documented ``rapidfire report x`` must leave that file as it was."""
    victim, content = a_key_file(tmp_path)
    work = tmp_path / "archive"
    folder = fixture_folder(work)
    planted = work / ".x-report.html.tmp"
    (os.symlink if plant == "symlink" else os.link)(victim, planted)
    before = digest(folder)
    proc = subprocess.run([sys.executable, "-m", "rapidfire_nb", "report", "x"], cwd=work, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_bytes() == content
    assert digest(folder) == before
    assert "<!DOCTYPE html>" in (work / "x-report.html").read_text(encoding="utf-8")


def test_exp_report_replaces_a_link_at_its_own_name_and_a_planted_temporary(tmp_path):
    from rapidfire_nb.engine.fsio import tmp_path_for
    from rapidfire_nb.report import read_folder, write_report

    victim, content = a_key_file(tmp_path)
    folder = fixture_folder(tmp_path / "exps")
    out = tmp_path / "out" / "report.html"
    out.parent.mkdir()
    os.link(victim, out)                          # the report's own name is a hard link
    os.symlink(victim, tmp_path_for(out))          # and its temporary files planted links
    os.symlink(victim, out.with_name(".report.html.tmp"))
    table, meta = read_folder(folder)
    write_report(table, out, meta=meta)
    assert victim.read_bytes() == content
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.stat(out).st_nlink == 1


def test_bench_json_goes_through_the_one_writer(tmp_path):
    """Every file the package writes outside a folder goes through engine/fsio: no module opens
    a file for writing by itself (the one exception, the fsio writer itself, is listed)."""
    import re

    allowed = {ROOT / "rapidfire_nb" / "engine" / "fsio.py"}
    pattern = re.compile(r"""open\([^)]*["'](?:w|a|wb|ab|w\+|a\+|r\+)["']|\.write_(?:text|bytes)\(""")
    offenders = []
    for p in sorted((ROOT / "rapidfire_nb").rglob("*.py")):
        if p in allowed:
            continue
        for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{p.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "files written around engine/fsio:\n" + "\n".join(offenders)


# -- 2. hard links: refused with the file named, never written in place ------------------------

def test_a_hard_linked_lock_is_refused_and_its_other_name_untouched(tmp_path):
    victim, content = a_key_file(tmp_path)
    folder = tmp_path / "exps" / "x"
    folder.mkdir(parents=True)
    os.link(victim, folder / ".lock")
    with pytest.raises(RapidFireError, match=r"\.lock has 2 hard links"):
        Experiment("x", experiment_path=tmp_path / "exps", tracking=[])
    assert victim.read_bytes() == content
    assert sorted(p.name for p in folder.iterdir()) == [".lock"]


@pytest.mark.parametrize("torn", [False, True])
def test_a_hard_linked_event_log_is_refused_and_never_appended_or_cut(tmp_path, torn):
    outside = tmp_path / "outside.jsonl"
    folder = fixture_folder(tmp_path / "exps")
    (folder / "experiment.json").write_text(json.dumps({"name": "x"}))
    os.replace(folder / "events.jsonl", outside)
    if torn:
        with open(outside, "ab") as f:
            f.write(b'{"seq": 99, "ty')
    os.link(outside, folder / "events.jsonl")
    content = outside.read_bytes()
    before = digest(folder)
    with pytest.raises(RapidFireError, match=r"events\.jsonl has 2 hard links"):
        Experiment("x", experiment_path=tmp_path / "exps", resume=True, tracking=[])
    assert outside.read_bytes() == content
    assert digest(folder) == before
    # the EventLog itself refuses too (a caller that skipped the folder check)
    from rapidfire_nb.engine.events import EventLog

    with pytest.raises(RapidFireError, match="hard links"):
        EventLog(folder / "events.jsonl")
    assert outside.read_bytes() == content and digest(folder) == before


def test_a_hard_linked_folder_still_opens_read_only(tmp_path):
    """Reading writes nothing: a backup made with hard links (rsync --link-dest) opens for its
    results; only training in it is refused."""
    folder = fixture_folder(tmp_path / "exps")
    os.link(folder / "events.jsonl", tmp_path / "backup.jsonl")
    before = digest(folder)
    exp = Experiment.open(folder)
    assert len(exp.get_runs_info()) >= 1
    assert digest(folder) == before
