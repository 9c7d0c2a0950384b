"""On-disk layout of an experiment and atomic writes.

    <experiment_path>/<experiment_name>/
        experiment.json          name, seed, num_chunks, data fingerprints, version
        runs.json                every run record (config, status, counters): a cache for people
                                 and tools; the event log is the authority (recovery folds it
                                 with engine/state.py and reads runs.json only for what logs of
                                 older versions lack)
        events.jsonl             the append-only event log
        checkpoints/run_<id>/state.safetensors       latest chunk-boundary checkpoint of a run
        checkpoints/run_<id>/warm_start.safetensors  a warm-start clone's initial weights (until
                                                     its first checkpoint exists)
        logs/run_<id>.log        transformers/TRL output of a run
        outputs/run_<id>/        TRL's output_dir (nothing is saved there by the engine)

Every file is written aside, fsynced and renamed over the old one, so a crash at any instant
leaves the previous consistent version. A write that fails (disk full, permission) removes its
temporary file and leaves the previous version in place; checkpoint writes then raise
``CheckpointWriteError``, which says so.

Nothing read from the folder can run code: checkpoints are safetensors with a JSON skeleton
(engine/safeformat.py), metadata is JSON checked for shape, and a pickle file (``state.pt`` of
older versions, or one planted by someone) is refused, never loaded.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any
from collections.abc import Callable

from rapidfire_nb.engine.fsio import TMP_MARK as _TMP_MARK
from rapidfire_nb.engine.fsio import StrictJSONError, atomic_write_bytes, loads_strict
from rapidfire_nb.errors import MetadataError, RapidFireError  # noqa: F401 -- read from here too

# Atomic writes live in engine/fsio.py (the one writer of the package); the store cleans up the
# temporary files (".<name>.tmp-<pid>-<thread id>") a crash can leave behind.


class CheckpointWriteError(RapidFireError):
    """A checkpoint could not be written; the run's previous checkpoint is intact."""


class CheckpointReadError(RapidFireError):
    """A checkpoint file exists but cannot be loaded."""


class DurableWriteError(RapidFireError):
    """A chunk's checkpoint is on disk but its log lines or runs.json could not be written."""


# error names that mark a run as failed by the disk, not by its training: resume retries those
RETRYABLE_WRITE_ERRORS = ("CheckpointWriteError", "DurableWriteError")


def failed_by_the_disk(error: str | None) -> bool:
    return bool(error) and any(name in error for name in RETRYABLE_WRITE_ERRORS)


def durable_write_failure(events, last_seq: int, runs_saved: bool, runs_error: OSError | None,
                          run_id: int, store: ExperimentStore) -> DurableWriteError | None:
    """After a chunk was logged: the error that fails its run if the log or runs.json did not
    reach the disk (the checkpoint did, so a resume continues from it), else None."""
    problems = []
    if events.durable_seq < last_seq:
        err = events.write_error
        problems.append(f"{store.events_path}: {err.strerror if err and err.strerror else err}")
    if not runs_saved:
        problems.append(f"{store.runs_path}: {_describe_os_error(runs_error) if runs_error else 'not written'}")
    if not problems:
        return None
    return DurableWriteError(
        f"run {run_id}: its chunk checkpoint was written but "
        + "; ".join(problems)
        + ". The checkpoint is intact; free disk space, then continue with Experiment(..., resume=True)")


def read_json(path: Path, default: Any = None, expect: type | None = None) -> Any:
    """A JSON file's content (``default`` when it does not exist). A file that is not UTF-8, not
    JSON, or (with ``expect``) not of that JSON type raises ``MetadataError`` naming it."""
    path = Path(path)
    try:
        from rapidfire_nb.engine.events import read_nofollow
        from rapidfire_nb.engine.fsio import MAX_JSON_BYTES

        # a regular file only (a FIFO would wait for ever), and a bounded read
        raw = read_nofollow(path, MAX_JSON_BYTES, "metadata file")
    except FileNotFoundError:
        return default
    try:
        obj = loads_strict(raw)
    except StrictJSONError as exc:
        raise MetadataError(f"{path} is {exc}; it was left as it is") from None
    if expect is not None and not isinstance(obj, expect):
        names = {dict: "an object", list: "an array"}
        raise MetadataError(f"{path} holds a JSON {_json_kind(obj)} where {names.get(expect, expect.__name__)} "
                            "was expected; it was left as it is")
    return obj


def _json_kind(obj: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number")


def check_experiment_meta(meta: Any, path: Path) -> dict:
    """experiment.json: an object whose known fields have the types the engine relies on."""
    if not isinstance(meta, dict):
        raise MetadataError(f"{path} holds a JSON {_json_kind(meta)} where an object was expected")
    types = {"name": str, "version": str, "num_chunks": int, "seed": int, "data": dict, "runs": list}
    for key, typ in types.items():
        if key in meta and meta[key] is not None and (
                not isinstance(meta[key], typ) or isinstance(meta[key], bool)):
            raise MetadataError(f"{path}: {key!r} is a JSON {_json_kind(meta[key])} "
                                f"({meta[key]!r:.60}); expected {typ.__name__}")
    if isinstance(meta.get("runs"), list) and not all(isinstance(r, str) for r in meta["runs"]):
        raise MetadataError(f"{path}: 'runs' must be a list of run fingerprints (strings)")
    return meta


# An experiment's name is one folder name, never a path: no separator, no "..", no leading dot
# (hidden, or "." itself), no control character. Every place that takes a name checks it here
# (fullmatch, not match: "$" would let a trailing newline through into the folder name).
MAX_NAME = 128
EXPERIMENT_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}")


def check_experiment_name(name: Any, where: str = "experiment_name") -> str:
    """``name`` when it is an experiment's name, else ``ConfigError`` naming ``where``."""
    from rapidfire_nb.errors import ConfigError

    if not isinstance(name, str) or not EXPERIMENT_NAME_RE.fullmatch(name):
        raise ConfigError(f"{where} must be 1-{MAX_NAME} ASCII letters, digits, '.', '_' or '-', "
                          f"starting with a letter or digit: a name, not a path (got {name!r:.200})")
    return name


def refuse_links(root: Path, writing: bool = True) -> None:
    """Refuse an experiment folder that is, or holds, a symbolic link (``FolderLinkError`` naming
    it): a link in a shared or downloaded folder would let the engine read, or write over, a file
    outside the folder. Checked before anything of the folder is read or written.

    ``writing``: the folder is about to be trained in, so a file with more than one hard link is
    refused too (a tar extracted without a filter makes them): the log, the lock and the logs are
    written in place, and another name of such a file may lie outside the folder. A folder opened
    read-only may hold hard links (a backup made with ``rsync --link-dest`` does)."""
    from rapidfire_nb.engine.events import FolderLinkError

    root = Path(root)
    found = None
    hard = None
    if root.is_symlink():
        found = root
    elif root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if os.path.stat.S_ISLNK(st.st_mode):
                    found = p
                    break
                if writing and hard is None and os.path.stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    hard = (p, st.st_nlink)
            if found is not None:
                break
    if found is not None:
        try:
            target = os.readlink(found)
        except OSError:
            target = "?"
        raise FolderLinkError(
            f"{found} is a symbolic link (to {target!r}); an experiment folder may not hold links, "
            "since following one could read or overwrite a file outside the folder. Replace it "
            "with the file itself (or remove it); nothing was changed")
    if hard is not None:
        raise FolderLinkError(
            f"{hard[0]} has {hard[1]} hard links: another name of the same file may lie outside "
            "the experiment folder (a tar extracted without a filter makes such links), and "
            "training here writes files in place. Replace it with a copy of its own (cp "
            "--remove-destination), or open the folder read-only with Experiment.open; nothing "
            "was changed")


class ExperimentStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._fingerprint_of: Callable[[int], str | None] = lambda run_id: None
        # time spent encoding checkpoints (Python work that holds the interpreter, unlike the
        # write and fsync after it); ``rapidfire bench`` reports it
        self.encode_s = 0.0

    def name_runs_by(self, fingerprint_of: Callable[[int], str | None]) -> None:
        """Where a run's config fingerprint comes from (run id -> fingerprint, None if unknown):
        the engine's runs. Every checkpoint then names its run and config, and one of another
        run or config is refused when loaded."""
        self._fingerprint_of = fingerprint_of

    def fingerprint_of(self, run_id: int) -> str | None:
        return self._fingerprint_of(run_id)

    @property
    def events_path(self) -> Path:
        return self.root / "events.jsonl"

    @property
    def meta_path(self) -> Path:
        return self.root / "experiment.json"

    @property
    def runs_path(self) -> Path:
        return self.root / "runs.json"

    def checkpoint_path(self, run_id: int) -> Path:
        return self.root / "checkpoints" / f"run_{run_id}" / "state.safetensors"

    def warm_start_path(self, run_id: int) -> Path:
        return self.root / "checkpoints" / f"run_{run_id}" / "warm_start.safetensors"

    def log_path(self, run_id: int) -> Path:
        return self.root / "logs" / f"run_{run_id}.log"

    def output_dir(self, run_id: int) -> Path:
        return self.root / "outputs" / f"run_{run_id}"

    # -- checkpoints -----------------------------------------------------------------------------
    def save_checkpoint(self, run_id: int, state: dict) -> int:
        """Replace run ``run_id``'s checkpoint atomically; returns its size in bytes.

        Raises ``CheckpointWriteError`` (caused by the OSError) when the file cannot be written;
        the previous checkpoint is then untouched.
        """
        return self._save_torch(run_id, self.checkpoint_path(run_id), state, "checkpoint")

    def load_checkpoint(self, run_id: int) -> dict | None:
        return self._load_torch(self.checkpoint_path(run_id), run_id, self.fingerprint_of(run_id))

    def save_warm_start(self, run_id: int, weights: dict, fingerprint: str | None = None) -> int:
        """Persist a warm-start clone's initial weights, so a crash before its first chunk
        boundary does not lose them (its parent moves on). ``fingerprint``: the clone's config
        (it is saved before the run record exists)."""
        return self._save_torch(run_id, self.warm_start_path(run_id), weights, "warm-start weights",
                                fingerprint)

    def load_warm_start(self, run_id: int) -> dict | None:
        return self._load_torch(self.warm_start_path(run_id), run_id, self.fingerprint_of(run_id))

    def delete_checkpoints(self, run_id: int) -> None:
        shutil.rmtree(self.checkpoint_path(run_id).parent, ignore_errors=True)

    def remove_stale_tmp(self) -> list[Path]:
        """Delete temporary files left by a process that died mid-write; returns them."""
        removed = []
        mine = f"{_TMP_MARK}{os.getpid()}-"
        for p in self.root.rglob(f".*{_TMP_MARK}*"):
            if p.is_file() and mine not in p.name:
                try:
                    p.unlink()
                    removed.append(p)
                except OSError:
                    pass
        return removed

    def _save_torch(self, run_id: int, path: Path, obj: Any, what: str,
                    fingerprint: str | None = None) -> int:
        from rapidfire_nb.engine.safeformat import encode_view

        fingerprint = fingerprint if fingerprint is not None else self.fingerprint_of(run_id)
        t0 = time.perf_counter()
        # a chunk's snapshot is written straight from its host buffer (engine/safeformat.py)
        data = encode_view(obj, owner={"run_id": run_id, "fingerprint": fingerprint})
        self.encode_s += time.perf_counter() - t0
        size = len(data)
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            raise CheckpointWriteError(
                f"could not write the {what} of run {run_id} to {path} ({size} bytes): "
                f"{_describe_os_error(exc)}. The previous checkpoint is intact; free disk space or "
                f"fix permissions, then continue with Experiment(..., resume=True)") from exc
        return size

    @staticmethod
    def _load_torch(path: Path, run_id: int | None = None, fingerprint: str | None = None) -> Any:
        from rapidfire_nb.engine.safeformat import UnsafeFormatError, decode, read_owner

        if not path.exists():
            legacy = path.with_suffix(".pt")
            if legacy.exists():
                # never unpickled: a pickle can run code, and folders get shared and downloaded
                raise CheckpointReadError(
                    f"{legacy} is a pickle (torch.save) checkpoint; rapidfire does not load pickle "
                    "files from an experiment folder because unpickling can run code. Checkpoints "
                    f"are now {path.name}; this run cannot continue from that file")
            return None
        try:
            data = _read_checkpoint_bytes(path)
            obj = decode(data, what=str(path))   # a damaged file reports that first
            owner = read_owner(data) if run_id is not None else None
            if owner is not None and owner["run_id"] != run_id:
                raise CheckpointReadError(
                    f"{path} belongs to run {owner['run_id']}, not run {run_id} (copied or swapped "
                    f"between run folders?); it is not loaded into run {run_id}")
            if (owner is not None and fingerprint is not None and owner.get("fingerprint") is not None
                    and owner["fingerprint"] != fingerprint):
                raise CheckpointReadError(
                    f"{path} was written for another config of run {run_id} (config fingerprint "
                    f"{str(owner['fingerprint'])[:12]}..., this run's is {fingerprint[:12]}...: copied "
                    f"from another experiment?); it is not loaded")
            return obj
        except UnsafeFormatError as exc:
            raise CheckpointReadError(f"cannot load {path}: {exc}") from None
        except OSError as exc:
            raise CheckpointReadError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _read_checkpoint_bytes(path: Path) -> bytes:
    """A checkpoint's bytes: a regular file only (a named pipe would hold a resume for ever) and
    no larger than this machine's memory (a crafted sparse file of terabytes is refused by name
    instead of failing with a bare MemoryError)."""
    import errno

    from rapidfire_nb.engine.fsio import NotRegularFileError, open_regular

    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        limit = _memory_bytes()
        if limit is not None and size > limit:
            raise NotRegularFileError(
                errno.EFBIG, f"{path} is {size:,} bytes, more than this machine's memory "
                f"({limit:,} bytes): it is not a checkpoint rapidfire wrote here, and it was not read")
        return f.read()


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _describe_os_error(exc: OSError) -> str:
    import errno

    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full ({exc.strerror or exc})"
    return str(exc.strerror or exc)
