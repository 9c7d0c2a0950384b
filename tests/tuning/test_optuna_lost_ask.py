"""RFOptuna killed between ``study.ask()`` of a refill and anything logged about its trial: the
resumed experiment asks nothing new for it, finishes that ask as the lost session drew it, and
reaches the uninterrupted session's trials, runs and pruning reasons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # slow tier: SIGKILLed RFOptuna subprocesses

WORKER = Path(__file__).with_name("tuning_worker.py")


def worker(root, mode, kill_after=0):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, str(WORKER), str(root), mode, str(kill_after)],
                          capture_output=True, text=True, env=env, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


def test_a_kill_right_after_a_refill_ask_resumes_to_the_same_trials(tmp_path):
    code, reference, err = worker(tmp_path / "ref", "fresh")
    assert code == 0, err[-3000:]
    assert len(reference["trials"]) == 6
    code, partial, err = worker(tmp_path / "killed", "fresh", kill_after=-2)
    assert code == -9 and partial is None, err[-3000:]
    code, resumed, err = worker(tmp_path / "killed", "resume")
    assert code == 0, err[-3000:]
    assert resumed["trials"] == reference["trials"]
    assert resumed["runs"] == reference["runs"]
