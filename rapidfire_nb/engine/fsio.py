"""The one writer of the package: every file rapidfire writes, in an experiment folder or outside
it (experiment.json, runs.json, automl.json, tracker state, checkpoints, reports, exports, bench
JSON), goes through ``atomic_write_bytes``/``atomic_write_text``; the files that are appended to
(the event log, the lock note, the engine's and workers' logs) are opened by ``open_in_place``.

Neither follows a symbolic link, and neither writes into an existing file it did not create: an
atomic write creates its temporary file afresh (``O_EXCL | O_NOFOLLOW``) and renames it over the
target, which replaces a link or a hard link at the target instead of writing through it; an
in-place open refuses a link and a file with more than one hard link (a hard link made by a
planted folder or a tar extracted without a filter would make the append land in a file outside
the folder).

A file is written aside (``.<name>.tmp-<pid>-<thread id>``), fsynced, renamed over the old one,
and its directory fsynced, so a crash at any instant leaves the previous version or the new one.
A failed write removes its temporary file and leaves the previous version in place; a crash can
leave a temporary file behind (``ExperimentStore`` removes its own at open).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

from rapidfire_nb.errors import RapidFireError

TMP_MARK = ".tmp-"


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """mkdir -p, fsyncing each new directory's parent so the new entry survives a power cut."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    if not missing:
        return
    path.mkdir(parents=True, exist_ok=True)
    for d in reversed(missing):
        fsync_dir(d.parent)


def tmp_path_for(path: Path) -> Path:
    # the name is cut so that a legal long name (up to 255 bytes) still has a legal temporary
    return path.with_name(f".{path.name[:120]}{TMP_MARK}{os.getpid()}-{threading.get_ident()}")


def atomic_write_bytes(path: Path, data: bytes, writer=None) -> None:
    """Write ``data`` to ``path`` atomically. ``writer(f, data)`` may replace the plain write.

    On any error the temporary file is removed, ``path`` keeps its previous content, and the
    error propagates.
    """
    path = Path(path)
    _make_dirs(path.parent)
    tmp = tmp_path_for(path)
    try:
        # a leftover of this very process and thread (or a planted link) goes first; the file is
        # then created afresh, never opened through a link (rename replaces a link at ``path``
        # itself, not what it points at)
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        with open(tmp, "wb", opener=_create_new) as f:
            (writer or _plain_write)(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def _create_new(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)


def _plain_write(f, data: bytes) -> None:
    f.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


class LinkedFileError(OSError):
    """A file that would be written in place is a symbolic link or has other hard links."""


class NotRegularFileError(RapidFireError, OSError):
    """A file of an experiment folder that is not a regular file (a named pipe, a device node,
    a socket, a directory), or one larger than its reader takes. ``str(exc)`` names it and says
    what to do; nothing was changed."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


# The most bytes read of each kind of file in an experiment folder. Each is far above what the
# engine writes (a long experiment's log is tens of MB; its metadata files a few hundred KB; the
# lock's note a hundred bytes), and far below what would exhaust a notebook's memory: a sparse
# file of terabytes, or a crafted one, is refused before it is read.
MAX_LOG_BYTES = 1 << 30
MAX_JSON_BYTES = 64 << 20
MAX_NOTE_BYTES = 64 << 10

_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _not_regular(path: Path, mode: int) -> NotRegularFileError:
    import errno

    return NotRegularFileError(
        errno.EINVAL, f"{path} is {_kind(mode)}, not a regular file: rapidfire reads and writes "
        "only regular files in an experiment folder (reading a pipe waits for a writer that may "
        "never come, and a device may never end). Remove it, or put the file itself there; "
        "nothing was changed")


def open_regular(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """``os.open`` of a regular file, never through a symbolic link: anything else at ``path``
    (a FIFO, a device node, a socket) raises ``NotRegularFileError`` naming it, before it is
    read or written. The open itself does not block (``O_NONBLOCK``: a FIFO with no writer
    would hold ``open`` for ever) and a device is not opened at all where ``lstat`` sees it."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise _not_regular(path, st.st_mode)
    import errno

    try:
        fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), mode)
    except OSError as exc:
        # a FIFO put there since the lstat above (opened for writing with no reader)
        if exc.errno == errno.ENXIO:
            try:
                now = os.lstat(path).st_mode
            except OSError:
                raise exc from None
            if not stat.S_ISREG(now):
                raise _not_regular(path, now) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, st.st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_special_files(root: Path) -> None:
    """Refuse an experiment folder holding anything but directories and regular files (a named
    pipe, a device node, a socket): ``NotRegularFileError`` naming the first found. Checked
    before a folder is trained in, because the engine later reads or appends to files that are
    opened nowhere else first (a run's checkpoint, the engine's log): a pipe there would hold a
    resume for ever, or end the engine's thread after run_fit had returned. Symbolic links are
    ``refuse_links``'s to name; nothing is read or changed."""
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                raise _not_regular(p, mode)


def read_regular(path: Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them: a symbolic link
    (``OSError`` ELOOP), anything not a regular file, or a file larger than ``limit`` (``what``
    names it in the error: "event log") raises, and nothing was read past the limit."""
    import errno

    path = Path(path)
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise _too_large(path, size, limit, what, errno.EFBIG)
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:   # it grew while it was read
            raise _too_large(path, got, limit, what, errno.EFBIG)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(path: Path, size: int, limit: int, what: str, code: int) -> NotRegularFileError:
    return NotRegularFileError(
        code, f"{path} is {size:,} bytes or more, larger than the {limit:,} bytes rapidfire reads "
        f"of {'an' if what[:1] in 'aeiou' else 'a'} {what}; it was not read, and nothing was changed")


def open_in_place(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for a file written in place (appended, truncated, rewritten): never through a
    symbolic link, never a file with more than one hard link, whose other names may lie
    outside the folder, and never anything but a regular file. Raises ``LinkedFileError`` or
    ``NotRegularFileError`` naming the file; nothing is written."""
    import errno

    path = Path(path)
    try:
        fd = open_regular(path, flags, mode)   # a FIFO or a device is refused, never opened
    except NotRegularFileError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP or os.path.islink(path):
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            raise LinkedFileError(
                errno.ELOOP, f"{path} is a symbolic link (to {target!r}); rapidfire does not write "
                "through links, since they could overwrite a file elsewhere. Replace the link with "
                "the file itself; nothing was changed") from None
        raise
    try:
        links = os.fstat(fd).st_nlink
    except OSError:
        os.close(fd)
        raise
    if links > 1:
        os.close(fd)
        raise LinkedFileError(
            errno.EMLINK, f"{path} has {links} hard links: another name of the same file may lie "
            "outside this folder (a tar extracted without a filter makes such links), and writing "
            "it in place would change that file too. Replace it with a copy of its own "
            "(cp --remove-destination, or copy and rename); nothing was changed")
    return fd


def open_append_text(path: Path):
    """A text file opened for appending through ``open_in_place`` (logs)."""
    fd = open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    return os.fdopen(fd, "a", encoding="utf-8")


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True, default=repr).encode())


class StrictJSONError(ValueError):
    """Bytes that are not UTF-8 JSON; ``str(exc)`` says how, in words ("not valid JSON: ...")."""


def loads_strict(raw: bytes, *, lines: bool = True) -> Any:
    """The JSON value in ``raw`` (UTF-8), for files read from an experiment folder: the event
    log's lines and the metadata files. Anything else raises ``StrictJSONError`` whose text the
    caller puts after the file's name: not UTF-8 (the byte), not valid JSON (where: ``line L
    column C``, or just ``column C`` with ``lines=False`` for one line of a log), or not readable
    (an integer of thousands of digits, arrays nested thousands deep, which would exhaust every
    reader)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"not UTF-8 text (byte {exc.start} is "
                              f"{raw[exc.start:exc.start + 1]!r})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno} column {exc.colno}" if lines else f"column {exc.colno}"
        raise StrictJSONError(f"not valid JSON: {exc.msg} at {at}") from None
    except (ValueError, RecursionError) as exc:
        what = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise StrictJSONError(f"not readable JSON ({what})") from None
    # a \uD800-style escape decodes to a lone surrogate, which no later writer (report, table,
    # panel message) can encode: refuse it here, where the file and line are known; only text
    # holding escapes pays for the check
    if "\\u" in text:
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise StrictJSONError("not valid Unicode text (a \\u escape of a lone surrogate)") from None
    return value

