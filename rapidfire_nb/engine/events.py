"""Append-only event log with sequence numbers: the single source of truth.

Recovery, ``get_runs_info``/``get_results``, the trackers, the panel and the CLI all read this log
through one reducer (``engine/state.py``); the engine only appends.
Each event is a JSON-able dict ``{"seq": int, "time": float, "type": str, **payload}``;
``seq`` starts at 1 and increases by one per event, so readers ask for
"everything after seq N" and pushes/pulls are idempotent.

Each event type and its fields are described in one place, ``events_schema.json`` beside this
module; ``engine/state.py`` folds the log into the run table every reader uses, and the panel's
``js/src/state.ts`` mirrors that fold (both checked against ``tests/fixtures/events/``).

The log lives in memory and, when a path is given, in ``events.jsonl`` (one JSON per line,
written and fsynced per event batch) so a dead kernel loses nothing already logged.

Opening a log never deletes valid history. The only thing dropped is a torn final line (no
newline: what a crash mid-write leaves); its bytes are kept beside the log in
``events.jsonl.torn-<time>``. Any other damage (a line that is not JSON, not UTF-8, not an event,
or out of sequence) refuses the open with ``EventLogError`` naming the file and the line, and the
file is left exactly as it was.

A failed write (disk full) removes whatever part of it reached the file; the events stay in memory,
in order, and are written before anything newer by the next append that succeeds (or by
``close``). So the file is always a gap-free prefix of the log: no sequence number is ever reused
or written twice. ``write_error`` holds the last failure until a write succeeds again, and
``durable_seq`` says how far the file goes; the engine uses them to fail the affected run.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterable

from rapidfire_nb.engine.fsio import StrictJSONError, loads_strict
from rapidfire_nb.errors import RapidFireError


class EventLogError(RapidFireError):
    """The event log file is damaged in a way that cannot be repaired without losing history."""


class EventLogWriteError(RapidFireError, OSError):
    """Events could not be written (disk full, I/O error); nothing of them stays in the file."""


class MetricNamesError(RapidFireError, ValueError):
    """A metric event names more metrics than one event, or one experiment, may hold."""


class EventTextsError(RapidFireError, ValueError):
    """A note or a generation event carries more, or longer, texts than the log takes."""


# Bounds on metric names. A real trainer logs tens of names per event (GRPO's per-reward-function
# means and deviations are the most), and an experiment a few hundred at most; the folding,
# the trackers and the report draw one series per name, so a crafted log of 100,000 names in one
# line stalled them for minutes. Both bounds are checked where an event is written and where a
# log is read.
MAX_METRICS_PER_EVENT = 1_000
MAX_METRIC_NAMES = 10_000

# Bounds on the texts an event carries, as the engine writes them: a note (Experiment.note and
# the panel take at most 2,000 characters), and a generation's sample prompts (run_fit takes at
# most 8, each at most 2,000 characters, and longer ones from the eval set are logged cut to
# that: engine/generation.py) and answers (at most 256 new tokens each: 100,000 characters is
# hundreds a token, which no vocabulary has). A crafted event of 200,000 prompts held the report
# for minutes and the panel drew every one; each bound is checked where an event is written and
# where a log is read.
MAX_NOTE_CHARS = 2_000
MAX_ANSWER_CHARS = 100_000

# Bounds on the Ray workers a log names: one entry per live worker in a ``workers`` event, and
# distinct worker names in the whole log (a lost worker's replacement gets a new one). A kernel
# drives tens of workers, a big cluster hundreds; the reducer (and the panel's) finds a worker's
# row by its name, so a crafted event of 20,000 names took 8 s to fold and 200,000 would take
# many minutes.
MAX_WORKERS = 4_096


def _workers_problem(event: dict, seen: set) -> tuple[str | None, set]:
    """(what is wrong, the new worker names) of a ``workers`` or ``worker_lost`` event given the
    names seen before it; the new names are not added to ``seen``."""
    if event.get("type") == "workers":
        listed = event.get("workers")
        if not isinstance(listed, list):
            return None, set()
        if len(listed) > MAX_WORKERS:
            return (f"workers.workers: {len(listed):,} workers in one event, more than the "
                    f"{MAX_WORKERS:,} a log may name"), set()
        names = {w.get("worker") for w in listed if isinstance(w, dict) and isinstance(w.get("worker"), str)}
    elif event.get("type") == "worker_lost" and isinstance(event.get("worker"), str):
        names = {event["worker"]}
    else:
        return None, set()
    new = names - seen
    if len(seen) + len(new) > MAX_WORKERS:
        return (f"{event['type']}: this event brings the log to {len(seen) + len(new):,} distinct "
                f"worker names, more than the {MAX_WORKERS:,} it may name"), set()
    return None, new


def _sample_bounds() -> tuple[int, int]:
    from rapidfire_nb.engine.generation import MAX_SAMPLE_PROMPT_CHARS, MAX_SAMPLE_PROMPTS

    return MAX_SAMPLE_PROMPTS, MAX_SAMPLE_PROMPT_CHARS


def _texts_problem(event: dict) -> str | None:
    """What makes a note's or a generation's texts larger than the engine writes them (None when
    nothing does); the types are the schema's to check."""
    kind = event.get("type")
    if kind == "note":
        text = event.get("text")
        if isinstance(text, str) and len(text) > MAX_NOTE_CHARS:
            return f"note.text: {len(text):,} characters, more than the {MAX_NOTE_CHARS:,} a note holds"
        return None
    if kind != "generation":
        return None
    most, chars = _sample_bounds()
    for field, limit in (("prompts", chars), ("references", chars), ("texts", MAX_ANSWER_CHARS)):
        items = event.get(field)
        if not isinstance(items, list):
            continue
        if len(items) > most:
            return (f"generation.{field}: {len(items):,} entries, more than the {most} sample "
                    "prompts a run answers")
        for i, item in enumerate(items):
            if isinstance(item, str) and len(item) > limit:
                return (f"generation.{field}[{i}]: {len(item):,} characters, more than the "
                        f"{limit:,} logged of one")
    return None


def _metric_names_problem(metrics: Any, seen: set, where: str = "metric.metrics") -> tuple[str | None, set]:
    """(what is wrong, the new names) for one metric event's ``metrics`` given the names seen
    before it; the new names are not added to ``seen``."""
    if not isinstance(metrics, dict):
        return None, set()
    if len(metrics) > MAX_METRICS_PER_EVENT:
        return (f"{where}: {len(metrics)} metric names in one event, more than the "
                f"{MAX_METRICS_PER_EVENT} one event may hold"), set()
    new = {name for name in metrics if name not in seen}
    if len(seen) + len(new) > MAX_METRIC_NAMES:
        return (f"{where}: this event brings the experiment to {len(seen) + len(new)} distinct "
                f"metric names, more than the {MAX_METRIC_NAMES} an experiment may hold"), set()
    return None, new


class EventLog:
    """Thread-safe append-only log. ``append`` from any thread; readers poll ``since``.

    With a ``path``, the file is opened for appending: only the experiment's owner (the process
    holding the folder lock) should do that. ``read_events(path)`` reads a log without writing.
    """

    def __init__(self, path: str | os.PathLike | None = None):
        self._lock = threading.Condition()
        self._events: list[dict] = []
        self._path = Path(path) if path is not None else None
        self._fd: int | None = None
        self._size = 0          # bytes of whole, durable lines in the file
        self._durable = 0       # how many events (a prefix of _events) are in the file
        self._broken: str | None = None
        self.write_error: EventLogWriteError | None = None
        self._listeners: list[Callable[[dict], None]] = []
        self.recreated = 0      # times the file was written again after it vanished
        self._metric_names: set = set()
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(self._path):
                # a link or a hard link is refused before anything is written (the torn tail's
                # repair below writes in place)
                os.close(_open_nofollow(self._path, os.O_WRONLY | os.O_APPEND))
                self._events, good, torn = _parse_log(self._path)
                last = _complete_tail(torn, len(self._events) + 1) if torn.strip() else None
                if last is not None:
                    fd = _open_nofollow(self._path, os.O_WRONLY | os.O_APPEND)
                    try:
                        os.write(fd, b"\n")
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    self._events.append(last)
                elif torn:
                    _set_aside_torn_tail(self._path, good, torn)
            self._fd = _open_nofollow(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            self._size = os.fstat(self._fd).st_size
            self._durable = len(self._events)
            for event in self._events:
                if event["type"] == "metric":
                    self._metric_names.update(event["metrics"])

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._events[-1]["seq"] if self._events else 0

    @property
    def durable_seq(self) -> int:
        """The last seq that is in the file (``last_seq`` when there is no file)."""
        with self._lock:
            if self._fd is None and self._path is None:
                return self.last_seq_unlocked()
            return self._events[self._durable - 1]["seq"] if self._durable else 0

    def append(self, type: str, **payload: Any) -> dict:
        return self.extend([(type, payload)])[-1]

    def extend(self, items: Iterable[tuple[str, dict]]) -> list[dict]:
        """Append several events atomically (one write + fsync).

        A write error does not raise: the events are logged in memory and written, in order,
        with the next successful write (see ``write_error`` and ``durable_seq``)."""
        items = list(items)
        with self._lock:
            # metric names are bounded here as where the log is read: a run that logs more is
            # failed with this error (nothing of the batch is logged), never written and then
            # refused at the next open
            added: set = set()
            for type_, payload in items:
                if type_ == "metric":
                    problem, names = _metric_names_problem(payload.get("metrics"),
                                                           self._metric_names | added)
                    if problem is not None:
                        run = payload.get("run_id")
                        raise MetricNamesError(f"run {run}: {problem}; nothing of it was logged. "
                                               "Log fewer distinct metric names (aggregate them)")
                    added |= names
            for type_, payload in items:
                problem = _texts_problem({"type": type_, **payload})
                if problem is not None:
                    raise EventTextsError(f"run {payload.get('run_id')}: {problem}; nothing of it "
                                          "was logged")
            self._metric_names |= added
            seq = self._events[-1]["seq"] if self._events else 0
            now = time.time()
            new = []
            for type_, payload in items:
                seq += 1
                new.append({"seq": seq, "time": now, "type": type_, **payload})
            self._events.extend(new)
            self._write_pending()
            self._lock.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            for event in new:
                try:
                    listener(event)
                except Exception:  # a listener never breaks the writer
                    pass
        return new

    def _write_pending(self) -> bool:
        """Write every event not yet in the file; on failure cut the file back to whole lines."""
        if self._fd is None or self._durable == len(self._events):
            return self._durable == len(self._events)
        if self._broken:
            self.write_error = EventLogWriteError(self.write_error.errno if self.write_error else None,
                                                  self._broken)
            return False
        if not self._still_linked():
            return self._write_whole_log()
        pending = self._events[self._durable:]
        data = "".join(json.dumps(e, default=_json_default) + "\n" for e in pending).encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        except OSError as exc:
            reason = _os_reason(exc)
            try:
                os.ftruncate(self._fd, self._size)   # no part of these events may stay behind
                os.fsync(self._fd)
            except OSError as exc2:
                # the file may now end in part of them: writing them again after it would
                # duplicate sequence numbers, so this session stops writing to the file
                self._broken = (f"{self._path} could not be cut back after a failed write "
                                f"({_os_reason(exc2)}); events after seq {self._durable} are in "
                                "memory only. Reopen the experiment with resume=True")
            self.write_error = EventLogWriteError(
                exc.errno, f"could not write {len(pending)} event(s) to {self._path}: {reason}")
            return False
        self._size += len(data)
        self._durable = len(self._events)
        self.write_error = None
        return True

    def _still_linked(self) -> bool:
        """False when ``events.jsonl`` was deleted (or renamed away) while the log was open:
        appending to the open file would then write history nobody can ever read."""
        try:
            st = os.fstat(self._fd)
            here = os.lstat(self._path)
        except OSError:
            return False
        return st.st_nlink > 0 and (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)

    def _write_whole_log(self) -> bool:
        """The file was deleted or replaced under us: write the whole history (it is all in
        memory) to a new ``events.jsonl`` atomically and append there from now on. A file that
        someone put in its place is kept beside it, never overwritten."""
        from rapidfire_nb.engine.fsio import atomic_write_bytes

        data = "".join(json.dumps(e, default=_json_default) + "\n" for e in self._events).encode("utf-8")
        try:
            if os.path.lexists(self._path):
                os.replace(self._path, self._path.with_name(
                    f"{self._path.name}.replaced-{int(time.time() * 1000)}"))
            atomic_write_bytes(self._path, data)
            fd = _open_nofollow(self._path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            self.write_error = EventLogWriteError(
                exc.errno, f"{self._path} was deleted while the experiment was open and could not "
                           f"be written again: {_os_reason(exc)}")
            return False
        os.close(self._fd)
        self._fd = fd
        self._size = len(data)
        self._durable = len(self._events)
        self.recreated += 1
        self.write_error = None
        return True

    def since(self, seq: int = 0, limit: int | None = None) -> list[dict]:
        """Events with ``seq`` greater than the given one, oldest first."""
        with self._lock:
            # seqs are dense and start at 1 (index = seq - 1)
            start = max(0, min(int(seq), len(self._events)))
            out = self._events[start:]
            return list(out if limit is None else out[:limit])

    def wait_for(self, seq: int, timeout: float | None = None) -> bool:
        """Block until an event with a seq greater than ``seq`` exists."""
        with self._lock:
            return self._lock.wait_for(lambda: self.last_seq_unlocked() > seq, timeout)

    def last_seq_unlocked(self) -> int:
        return self._events[-1]["seq"] if self._events else 0

    def subscribe(self, listener: Callable[[dict], None]) -> Callable[[], None]:
        """Call ``listener(event)`` for each new event, in the appending thread.

        Keep listeners tiny (enqueue and return); exceptions are swallowed.
        Returns a function that unsubscribes.
        """
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def close(self) -> None:
        """Write what is still pending (if the disk allows) and close the file."""
        with self._lock:
            if self._fd is not None:
                self._write_pending()
                os.close(self._fd)
                self._fd = None


def _os_reason(exc: OSError) -> str:
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full ({exc.strerror or exc})"
    return exc.strerror or str(exc)


def _json_default(obj: Any) -> Any:
    try:
        import numpy as np

        if isinstance(obj, np.generic):
            return obj.item()
    except ImportError:  # pragma: no cover
        pass
    return repr(obj)


def read_events(path: str | os.PathLike) -> list[dict]:
    """Every event of a log file, without changing it (a torn final line is skipped).

    Raises ``EventLogError`` naming the file, the line and the field when the file is damaged
    elsewhere (see ``_check_line``), or when it is a symbolic link."""
    return _parse_log(Path(path))[0]


class FolderLinkError(EventLogError):
    """A file of an experiment folder is a symbolic link: following it could read or overwrite
    a file outside the folder, so the folder is refused."""


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_nofollow(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` of a regular file that refuses to follow a symbolic link at ``path``
    (``FolderLinkError``) and anything but a regular file (``NotRegularFileError``: a FIFO would
    hold the open for ever); opened for writing, it also refuses a file with other hard links
    (``fsio.open_in_place``)."""
    import errno

    from rapidfire_nb.engine.fsio import LinkedFileError, NotRegularFileError, open_in_place, open_regular

    if flags & (os.O_WRONLY | os.O_RDWR):
        try:
            return open_in_place(path, flags, mode)
        except LinkedFileError as exc:
            raise FolderLinkError(exc.strerror) from None
    try:
        return open_regular(path, flags, mode)
    except NotRegularFileError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP or (os.path.islink(path)):
            raise _link_error(path) from None
        raise


def _link_error(path: Path) -> FolderLinkError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return FolderLinkError(
        f"{path} is a symbolic link (to {target!r}); rapidfire does not follow links in an "
        "experiment folder, since they could read or overwrite files outside it. Replace the "
        "link with the file itself; nothing was changed")


def read_nofollow(path: Path, limit: int | None = None, what: str = "event log") -> bytes:
    """A regular file's bytes, at most ``limit`` (the event log's bound by default): a symbolic
    link raises ``FolderLinkError``; a FIFO, a device node or a larger file
    ``NotRegularFileError`` naming it, before anything past the bound is read."""
    import errno

    from rapidfire_nb.engine.fsio import MAX_LOG_BYTES, NotRegularFileError, read_regular

    try:
        return read_regular(path, MAX_LOG_BYTES if limit is None else limit, what)
    except NotRegularFileError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            raise _link_error(Path(path)) from None
        raise


# The largest run id, everywhere (the log, the ops, the panel's messages): ids count up from 1,
# one per run and clone, so a larger one only comes from a crafted log (one of 2**63 + 5 was
# restored and trained, then the panel could not name it).
MAX_RUN_ID = 10**9

# How deep the JSON of one event may nest: the engine writes a few levels (a config's sections,
# a list of target modules); hundreds of levels only come from a crafted file and would exhaust
# the stack of every reader (the reducer's copies, the panel).
MAX_DEPTH = 32
_SCHEMA: dict | None = None


def _schema() -> dict:
    global _SCHEMA
    if _SCHEMA is None:
        from rapidfire_nb.engine.state import load_schema

        _SCHEMA = load_schema()
    return _SCHEMA


def _depth_exceeded(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def check_logged_event(event: dict) -> str | None:
    """What makes one parsed event unfit to fold (None when nothing does): too deep, a known
    event type whose fields break ``events_schema.json`` (missing, wrong type, not in its enum),
    a run id below 1 or a negative count. Unknown types and fields pass (newer engines)."""
    if _depth_exceeded(event, MAX_DEPTH):
        return f"nested more than {MAX_DEPTH} levels deep"
    from rapidfire_nb.engine.state import check_event

    schema = _schema()
    if event["type"] not in schema["events"]:
        return None
    problems = check_event(event, schema)
    if problems:
        return problems[0]
    spec = {**schema["common"], **schema["events"][event["type"]]["fields"]}
    for name in spec:
        value = event.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        if event["type"] == "op" and name in ("run_id", "new_run_id"):
            continue     # an op the engine refused may name any id; it creates no run
        low = 1 if name in ("seq", "run_id", "parent_run_id", "num_chunks") else 0
        if value < low:
            return f"{event['type']}.{name}: {value} is below {low}"
        if name in ("run_id", "parent_run_id", "new_run_id") and value > MAX_RUN_ID:
            return (f"{event['type']}.{name}: {value} is above {MAX_RUN_ID}, the largest run id "
                    "(run ids count up from 1)")
    texts = _texts_problem(event)
    if texts is not None:
        return texts
    if event["type"] == "workers":
        workers = _workers_problem(event, set())[0]
        if workers is not None:
            return workers
    if event["type"] == "metric":
        if len(event["metrics"]) > MAX_METRICS_PER_EVENT:
            return _metric_names_problem(event["metrics"], set())[0]
        for name, value in event["metrics"].items():
            if isinstance(value, (dict, list)):
                return f"metric.metrics.{name}: a JSON {type(value).__name__} is not a metric value"
    return None


def _parse_log(path: Path) -> tuple[list[dict], int, bytes]:
    """(events, bytes of whole lines, torn tail). Refuses any damage other than a torn tail."""
    data = read_nofollow(path)
    lines = data.split(b"\n")
    tail = lines.pop()          # b"" when the file ends with a newline
    events: list[dict] = []
    metric_names: set = set()
    worker_names: set = set()
    expected = 1
    left = "the log was left as it is. Repair or remove that line, then open the experiment again"
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue             # an empty line holds no history
        where = f"{path}, line {number}"
        try:
            event = loads_strict(raw, lines=False)
        except StrictJSONError as exc:
            raise EventLogError(f"{where}: {exc}; {left}") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str) \
                or isinstance(event.get("seq"), bool) or not isinstance(event.get("seq"), int):
            raise EventLogError(f"{where}: not an event (a JSON object with an integer 'seq' and "
                                "a string 'type'); the log was left as it is")
        if event["seq"] != expected:
            raise EventLogError(
                f"{where}: sequence number {event['seq']} where {expected} was expected (were two "
                "processes writing to this experiment?); the log was left as it is")
        problem = check_logged_event(event)
        if problem is None and event["type"] == "metric":
            problem, names = _metric_names_problem(event["metrics"], metric_names)
            metric_names |= names
        elif problem is None and event["type"] in ("workers", "worker_lost"):
            problem, names = _workers_problem(event, worker_names)
            worker_names |= names
        if problem is not None:
            raise EventLogError(f"{where} (seq {event['seq']}): {problem}; {left}")
        expected += 1
        events.append(_read_legacy(event))
    return events, len(data) - len(tail), tail


# how those engines' pruners began the text, and nothing else did: "pruned" elsewhere in a text
# ("not pruned; stopped by user") is a user's word, not a pruner's stop
_LEGACY_PRUNED = re.compile(r"pruned at (chunk|epoch) \d", re.IGNORECASE | re.ASCII)


def _read_legacy(event: dict) -> dict:
    """An event as this version writes it. Engines before the run_status ``pruned`` field said a
    pruner's stop only in its text ("pruned at chunk 2 ..."); their stops lack the field, which
    every stop carries now, so the text is read here, once, as the log is loaded, and nowhere else."""
    if event["type"] == "run_status" and event.get("status") == "stopped" and "pruned" not in event:
        event["pruned"] = any(isinstance(t, str) and _LEGACY_PRUNED.match(t) is not None
                              for t in (event.get("reason"), event.get("error")))
    return event


def _complete_tail(tail: bytes, expected: int) -> dict | None:
    """A final line that lacks only its newline (the crash came between the two) is a whole
    event: kept, not dropped."""
    try:
        event = loads_strict(tail)
    except StrictJSONError:
        return None
    if isinstance(event, dict) and isinstance(event.get("type"), str) and event.get("seq") == expected \
            and not isinstance(event.get("seq"), bool) and check_logged_event(event) is None:
        return _read_legacy(event)
    return None


def _set_aside_torn_tail(path: Path, good: int, torn: bytes) -> None:
    """Keep the torn bytes in a file of their own, then cut them off the log so appends stay
    line-aligned."""
    aside = path.with_name(f"{path.name}.torn-{int(time.time() * 1000)}")
    try:
        fd = _open_nofollow(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, torn)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass     # a full disk must not keep the experiment from opening: the bytes were a torn write
    fd = _open_nofollow(path, os.O_RDWR)
    try:
        os.ftruncate(fd, good)
        os.fsync(fd)
    finally:
        os.close(fd)


class ReadOnlyLog:
    """A log file read without writing anything (``Experiment.open``): ``since`` like
    ``EventLog``'s; ``append`` refuses. ``reload`` reads what a live writer appended since (a
    torn last line, a write in progress, is skipped until it is whole)."""

    def __init__(self, path: str | os.PathLike):
        self._path = Path(path)
        self._events: list[dict] = []
        self.reload()

    @property
    def path(self) -> Path:
        return self._path

    @property
    def last_seq(self) -> int:
        return self._events[-1]["seq"] if self._events else 0

    durable_seq = last_seq

    def reload(self) -> int:
        if not os.path.lexists(self._path):
            return 0
        events = _parse_log(self._path)[0]
        if len(events) < len(self._events):
            raise EventLogError(f"{self._path} is shorter than when it was read ({len(events)} "
                                f"events, {len(self._events)} before): it was replaced; open it again")
        new = len(events) - len(self._events)
        self._events = events
        return new

    def since(self, seq: int = 0, limit: int | None = None) -> list[dict]:
        start = max(0, min(int(seq), len(self._events)))
        out = self._events[start:]
        return list(out if limit is None else out[:limit])

    def last_seq_unlocked(self) -> int:
        return self.last_seq

    def subscribe(self, listener):
        return lambda: None

    def append(self, *args, **kwargs):
        raise RapidFireError(f"{self._path} was opened read-only (Experiment.open); nothing is "
                             "written to it")

    extend = append

    def close(self) -> None:
        pass
