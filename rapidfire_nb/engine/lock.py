"""One live engine per experiment folder, enforced by the operating system.

The owner of an experiment folder (the ``Experiment`` object that appends to its log and writes
its checkpoints) holds an exclusive ``flock`` on ``<folder>/.lock`` from the moment it opens the
folder until ``end()``. ``flock`` belongs to the open file: when the process dies, however it
dies (SIGKILL included), the kernel releases it, so a crash never leaves a folder stuck. The lock
file itself is never deleted (deleting it would let two processes lock two different files);
its content (the holder's pid, host and start time) is only for the error message.

Where ``fcntl`` does not exist (Windows) the lock is taken with ``msvcrt.locking`` on the same
file, which the OS also drops with the process.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import weakref
from pathlib import Path

from rapidfire_nb.errors import RapidFireError

LOCK_NAME = ".lock"

# this process's held locks, by resolved folder: a second Experiment in the same process gets the
# same clear refusal as one in another process (flock would refuse it too, with less to say)
_HELD: weakref.WeakValueDictionary[str, FolderLock] = weakref.WeakValueDictionary()
_HELD_LOCK = threading.RLock()   # reentrant: __del__ may run inside it (gc)


class ExperimentLocked(RapidFireError):
    """Another live Experiment (in this or another process) owns the folder."""


class FolderNotWritable(RapidFireError):
    """The folder (or its ``.lock``) cannot be written: it cannot be trained in, only read."""


class FolderLock:
    def __init__(self, folder: Path):
        self.folder = Path(folder).resolve()
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        key = str(self.folder)
        if key in _HELD:
            import gc

            gc.collect()   # an Experiment dropped without end() and no longer reachable lets go
        with _HELD_LOCK:
            if _HELD.get(key) is not None:
                raise ExperimentLocked(
                    f"experiment folder {self.folder} is already open in this process by another "
                    "Experiment; call .end() on that one first (one live engine per folder)")
            fd = _open_lock_file(self.path)
            try:
                _lock_fd(fd)
            except BlockingIOError:
                holder = _describe_holder(self.path)
                os.close(fd)
                raise ExperimentLocked(
                    f"experiment folder {self.folder} is in use by another live process{holder}; "
                    "only one Experiment may train in a folder at a time. End that one (or wait for "
                    "it to finish), then open this folder again") from None
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            _HELD[key] = self
        try:
            info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                               "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError:
            pass   # the note is a courtesy; the lock is what matters (a full disk may refuse it)
        return self

    def release(self) -> None:
        with _HELD_LOCK:
            if self._fd is None:
                return
            try:
                os.close(self._fd)   # closing the file drops the flock
            finally:
                self._fd = None
                if _HELD.get(str(self.folder)) is self:
                    del _HELD[str(self.folder)]

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self):   # an Experiment dropped without end() gives the folder back
        try:
            self.release()
        except Exception:
            pass


def _open_lock_file(path: Path) -> int:
    """The lock file, never through a symbolic link: a planted ``.lock`` link would make the
    open below empty and overwrite whatever file it points at."""
    import errno

    from rapidfire_nb.engine.events import _open_nofollow

    try:
        return _open_nofollow(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise FolderNotWritable(
                f"cannot open {path} for writing ({exc.strerror}): the experiment folder is "
                "read-only here, so it cannot be trained in or resumed. To read its results, plots "
                f"and reports, open it read-only: Experiment.open({str(path.parent)!r})") from None
        raise


def _lock_fd(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(str(exc)) from exc
        return
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _describe_holder(path: Path) -> str:
    try:
        from rapidfire_nb.engine.fsio import MAX_NOTE_BYTES, read_regular

        info = json.loads(read_regular(path, MAX_NOTE_BYTES, "lock note").decode("utf-8") or "{}")
        return f" (pid {int(info['pid'])} on {str(info.get('host'))[:64]}, since {str(info.get('since'))[:32]})"
    except Exception:
        return ""
