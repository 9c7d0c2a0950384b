"""A full disk fails runs with a clear reason, never the engine, and loses no history.

The disk is a real one: a small tmpfs mounted for the test (the test runs as root in CI and here),
filled to the last byte while the experiment trains. Where mounting is not allowed, the same
ENOSPC is raised at the lowest write calls instead (``os.write`` of the log, the plain write of
every atomic file), only for files inside the experiment folder.
"""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

import crash_worker as W
from rapidfire_nb import Experiment
from rapidfire_nb.demo_data import tiny_create_model
from rapidfire_nb.engine import fsio as fsio_mod
from rapidfire_nb.engine.events import EventLog, read_events

pytestmark = pytest.mark.slow   # slow tier: trains onto a full tmpfs


class TmpfsDisk:
    """A 32 MiB tmpfs; ``fill()`` takes every free byte, ``free()`` gives them back."""

    kind = "tmpfs"

    def __init__(self, where: Path):
        self.root = where
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(where)], check=True,
                       capture_output=True)
        self.filler = where / f"filler-{uuid.uuid4().hex}"

    def fill(self) -> None:
        chunk = b"\0" * (1 << 16)
        with open(self.filler, "ab", buffering=0) as f:
            while True:
                try:
                    f.write(chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
            # the last bytes of the last page: byte by byte until not one more fits
            while True:
                try:
                    f.write(b"\0")
                except OSError:
                    break

    def free(self) -> None:
        self.filler.unlink()

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)


class InjectedDisk:
    """No mount allowed: ENOSPC from the write calls, for files under ``where`` only."""

    kind = "injected ENOSPC"

    def __init__(self, where: Path, monkeypatch):
        self.root = where
        where.mkdir()
        self.full = False
        real_os_write, real_plain = os.write, fsio_mod._plain_write

        def os_write(fd, data):
            if self.full and os.readlink(f"/proc/self/fd/{fd}").startswith(str(where)):
                n = real_os_write(fd, bytes(data)[: len(data) // 2])   # part of it lands first
                if n:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_os_write(fd, data)

        def plain_write(f, data):
            if self.full and str(f.name).startswith(str(where)):
                f.write(data[: len(data) // 2])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_plain(f, data)

        monkeypatch.setattr(os, "write", os_write)
        monkeypatch.setattr(fsio_mod, "_plain_write", plain_write)

    def fill(self) -> None:
        self.full = True

    def free(self) -> None:
        self.full = False

    def close(self) -> None:
        pass


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    where = tmp_path / "disk"
    try:
        if os.environ.get("RF_TEST_NO_MOUNT"):   # to exercise the fallback where mounting works
            raise PermissionError("mount disabled")
        disk = TmpfsDisk(where)
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError):
        if where.exists():
            where.rmdir()
        disk = InjectedDisk(where, monkeypatch)
    try:
        yield disk
    finally:
        disk.close()


def test_a_failed_append_leaves_no_bytes_and_reuses_no_sequence_number(small_disk):
    path = small_disk.root / "events.jsonl"
    log = EventLog(path)
    for i in range(5):
        log.append("probe", i=i)
    small_disk.fill()
    size = path.stat().st_size
    log.append("probe", i=5, pad="x" * 20000)     # more than any page left over
    log.append("probe", i=6)
    assert log.write_error is not None and "disk full" in str(log.write_error)
    assert path.stat().st_size == size, "no part of a failed append may stay in the file"
    assert log.durable_seq == 5 and log.last_seq == 7
    small_disk.free()
    log.append("probe", i=7)
    assert log.write_error is None and log.durable_seq == 8
    log.close()
    events = read_events(path)
    assert [e["seq"] for e in events] == list(range(1, 9))
    assert [e["i"] for e in events] == list(range(8)), "every event once, in order"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same experiment with a disk that never fills."""
    root = tmp_path_factory.mktemp("ref")
    train, evald = W.make_data()
    exp = Experiment(W.NAME, experiment_path=root, tracking=[])
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    weights = {rid: exp.engine.run_weights(rid) for rid in (1, 2, 3)}
    points = sorted((e["run_id"], e["split"], e["step"]) for e in exp.events.since(0)
                    if e["type"] == "metric")
    exp.end()
    return weights, points


def test_full_disk_fails_runs_not_the_engine_and_resume_finishes_them_exactly(small_disk, reference):
    ref_weights, ref_points = reference
    train, evald = W.make_data()
    exp = Experiment(W.NAME, experiment_path=small_disk.root, tracking=[])
    filled = []

    def fill_after_fourth_chunk(ev):
        # in the checkpoint writer, right after run 1's second chunk is in the log: the runs.json
        # write that follows fails, and so does every later write
        if ev["type"] == "chunk_done" and ev["chunks_done"] == 2 and ev["run_id"] == 1 and not filled:
            small_disk.fill()
            filled.append(ev["seq"])

    exp.events.subscribe(fill_after_fourth_chunk)
    exp.run_fit(W.make_group(), tiny_create_model, train, evald, block=False, **W.RUN_FIT_KW)
    assert exp.wait(timeout=300), "wait() must return: the engine thread lives on"
    info = exp.get_runs_info().set_index("run_id")
    assert filled and list(info.status) == ["failed"] * 3, info[["status", "error"]]
    for rid in (1, 2, 3):
        assert "disk full" in info.loc[rid, "error"], info.loc[rid, "error"]
    # run 1's checkpoint was written, then its runs.json write failed: that alone fails it
    assert "DurableWriteError" in info.loc[1, "error"] and "runs.json" in info.loc[1, "error"]
    reasons = [e["reason"] for e in exp.events.since(0)
               if e["type"] == "run_status" and e["status"] == "failed"]
    assert len(reasons) == 3 and all("disk full" in r for r in reasons), reasons
    assert not exp.engine.thread_alive()
    exp.end()                                            # must not raise
    on_disk = read_events(small_disk.root / W.NAME / "events.jsonl")
    assert [e["seq"] for e in on_disk] == list(range(1, len(on_disk) + 1))

    small_disk.free()
    again = Experiment(W.NAME, experiment_path=small_disk.root, resume=True, tracking=[])
    again.run_fit(W.make_group(), tiny_create_model, train, evald, **W.RUN_FIT_KW)
    info = again.get_runs_info().set_index("run_id")
    assert list(info.status) == ["completed"] * 3, info[["status", "error"]]
    for rid in (1, 2, 3):
        w = again.engine.run_weights(rid)
        for k, v in ref_weights[rid].items():
            assert torch.equal(w[k], v), (rid, k)
    again.end()
    events = read_events(small_disk.root / W.NAME / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "no duplicate or reused seq"
    points = sorted((e["run_id"], e["split"], e["step"]) for e in events if e["type"] == "metric")
    assert points == ref_points, "every loss point once, none lost"
