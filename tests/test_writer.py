"""The checkpoint writer thread on its own: order, pending bookkeeping, flush, idle exit."""

import threading
import time

from rapidfire_nb.engine.writer import CheckpointWriter


def test_jobs_run_in_order_off_the_calling_thread_and_flush_waits_for_them():
    w = CheckpointWriter(name="t-writer")
    gate = threading.Event()
    done: list[tuple[int, str]] = []

    def job(i):
        def run():
            if i == 0:
                gate.wait(5)
            done.append((i, threading.current_thread().name))
        return run

    for i in range(5):
        w.submit(i % 2, job(i))
    assert w.busy() and w.pending(0) and w.pending(1)
    assert not w.flush(timeout=0.05), "flush must report the timeout while a job is blocked"
    assert done == []
    gate.set()
    assert w.flush(timeout=5)
    assert [i for i, _ in done] == [0, 1, 2, 3, 4]
    assert {name for _, name in done} == {"t-writer"}
    assert not w.busy() and not w.pending(0) and not w.pending(1)
    assert w.jobs_done == 5


def test_a_raising_job_does_not_kill_the_writer():
    w = CheckpointWriter()
    out = []
    w.submit(1, lambda: 1 / 0)
    w.submit(1, lambda: out.append("after"))
    assert w.flush(timeout=5)
    assert out == ["after"]
    assert len(w.errors) == 1 and "ZeroDivisionError" in w.errors[0]


def test_the_worker_leaves_when_idle_and_a_later_submit_starts_a_new_one(monkeypatch):
    monkeypatch.setattr(CheckpointWriter, "IDLE_EXIT_S", 0.05)
    w = CheckpointWriter(name="t-idle")
    w.submit(1, lambda: None)
    assert w.flush(timeout=5)
    deadline = time.monotonic() + 5
    while any(t.name == "t-idle" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "t-idle" for t in threading.enumerate())
    ran = threading.Event()
    w.submit(2, ran.set)
    assert w.flush(timeout=5) and ran.is_set()


def test_flush_from_inside_a_job_returns_instead_of_waiting_on_itself():
    w = CheckpointWriter()
    out = []
    w.submit(1, lambda: out.append(w.flush(timeout=2)))
    assert w.flush(timeout=5)
    assert out == [True]
