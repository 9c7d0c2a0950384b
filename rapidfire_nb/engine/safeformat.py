"""Checkpoint files that cannot run code when read: safetensors plus a JSON skeleton.

A run's checkpoint is a nest of dicts, lists and tuples holding tensors (weights, optimizer
moments, the torch RNG state), numpy arrays (numpy's RNG state) and plain numbers. Experiment
folders get shared and downloaded, so they are never unpickled: every tensor and array goes into
one safetensors file, and the structure around them is JSON stored in the same file's header
metadata (key ``rapidfire_state``). Reading it is ``safetensors`` parsing plus ``json.loads``.

The JSON skeleton marks what JSON cannot say on its own:
``{"$t": name}`` a tensor, ``{"$np": name, "dtype": ...}`` a numpy array, ``{"$tuple": [...]}``,
``{"$map": [[key, value], ...]}`` a dict whose keys are not all strings (optimizer state is keyed
by parameter index), ``{"$float": "nan"|"inf"|"-inf"}``. A plain dict whose keys start with "$"
is written as ``$map`` too, so a marker is never mistaken for data.
"""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT_KEY = "rapidfire_state"
FORMAT_VERSION = 1
# whose file this is: {"run_id": int, "fingerprint": str | None}. A checkpoint copied or swapped
# into another run's folder is refused instead of silently giving that run foreign weights.
OWNER_KEY = "rapidfire_owner"


class UnsafeFormatError(ValueError):
    """The file is not a rapidfire safetensors checkpoint (or its skeleton is damaged)."""


def encode(obj: Any, owner: dict | None = None) -> bytes:
    """Serialise ``obj`` to the bytes of one safetensors file (``owner`` goes in its metadata)."""
    import torch
    from safetensors.torch import save

    tensors: dict[str, Any] = {}
    seen_storage: set[tuple] = set()

    def tensor_slot(t) -> str:
        name = f"t{len(tensors)}"
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        # safetensors refuses tensors that share memory: give every one its own copy
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel()) if t.numel() else None
        if key is not None and (key in seen_storage or t.untyped_storage().nbytes()
                                != t.numel() * t.element_size()):
            t = t.clone()
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key is not None:
            seen_storage.add(key)
        tensors[name] = t
        return name

    def walk(x):
        if isinstance(x, torch.Tensor):
            return {"$t": tensor_slot(x)}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            if math.isfinite(x):
                return x
            return {"$float": repr(x)}
        if type(x).__module__ == "numpy":
            import numpy as np

            if isinstance(x, np.ndarray):
                name = tensor_slot(torch.from_numpy(np.ascontiguousarray(x).astype(np.int64))
                                   if x.dtype.kind in "iub" else torch.from_numpy(np.ascontiguousarray(x)))
                return {"$np": name, "dtype": x.dtype.str}
            if isinstance(x, np.generic):
                return walk(x.item())
        if isinstance(x, tuple):
            return {"$tuple": [walk(v) for v in x]}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: walk(v) for k, v in x.items()}
            return {"$map": [[walk(k), walk(v)] for k, v in x.items()]}
        raise TypeError(f"cannot store a {type(x).__module__}.{type(x).__qualname__} in a "
                        "checkpoint (tensors, numpy arrays, numbers, strings, lists, tuples, "
                        "dicts only)")

    skeleton = walk(obj)
    meta = {FORMAT_KEY: json.dumps({"version": FORMAT_VERSION, "state": skeleton},
                                   allow_nan=False, separators=(",", ":"))}
    if owner is not None:
        meta[OWNER_KEY] = json.dumps(owner, separators=(",", ":"))
    return save(tensors, metadata=meta)


def read_owner(data: bytes) -> dict | None:
    """The ``owner`` that ``encode`` stored, None for files written before it was recorded."""
    try:
        raw = _header_metadata(data).get(OWNER_KEY)
        owner = json.loads(raw) if raw is not None else None
    except (ValueError, TypeError, RecursionError):
        raise UnsafeFormatError(f"its {OWNER_KEY!r} metadata is damaged") from None
    if owner is not None and not (isinstance(owner, dict) and isinstance(owner.get("run_id"), int)):
        raise UnsafeFormatError(f"its {OWNER_KEY!r} metadata is damaged: {raw!r}")
    return owner


def decode(data: bytes, what: str = "checkpoint") -> Any:
    """The object ``encode`` stored; raises ``UnsafeFormatError`` for anything else."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        meta = _header_metadata(data)
        tensors = load(data)
    except (SafetensorError, ValueError, KeyError, TypeError, OverflowError) as exc:
        if data[:1] == b"\x80" or data[:4] == b"PK\x03\x04":
            raise UnsafeFormatError(
                f"{what} is a pickle/torch.save file; rapidfire never unpickles files from an "
                "experiment folder (unpickling can run code)") from None
        raise UnsafeFormatError(f"{what} is not a safetensors file ({exc})") from None
    if FORMAT_KEY not in meta:
        raise UnsafeFormatError(f"{what} has no {FORMAT_KEY!r} metadata: not a rapidfire checkpoint")
    try:
        doc = json.loads(meta[FORMAT_KEY])
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UnsafeFormatError(f"{what}: its {FORMAT_KEY!r} metadata is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION:
        raise UnsafeFormatError(f"{what}: unknown checkpoint format version "
                                f"{doc.get('version') if isinstance(doc, dict) else doc!r}")

    def tensor(name):
        if not isinstance(name, str) or name not in tensors:
            raise UnsafeFormatError(f"{what}: the skeleton names a tensor {name!r} that is not stored")
        return tensors[name]

    def walk(x):
        if isinstance(x, list):
            return [walk(v) for v in x]
        if not isinstance(x, dict):
            return x
        if len(x) == 1 and "$t" in x:
            return tensor(x["$t"])
        if set(x) == {"$np", "dtype"}:
            import numpy as np

            try:
                dtype = np.dtype(x["dtype"])
            except TypeError:
                raise UnsafeFormatError(f"{what}: bad numpy dtype {x['dtype']!r}") from None
            if dtype.kind not in "iubf":   # plain numbers only: object arrays would need pickle
                raise UnsafeFormatError(f"{what}: numpy dtype {x['dtype']!r} is not allowed")
            return tensor(x["$np"]).numpy().astype(dtype)
        if len(x) == 1 and "$tuple" in x:
            return tuple(walk(v) for v in x["$tuple"])
        if len(x) == 1 and "$map" in x:
            out = {}
            for pair in x["$map"]:
                k, v = walk(pair[0]), walk(pair[1])
                out[k] = v
            return out
        if len(x) == 1 and "$float" in x:
            return float(x["$float"])
        return {k: walk(v) for k, v in x.items()}

    try:
        return walk(doc.get("state"))
    except (TypeError, IndexError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        if isinstance(exc, UnsafeFormatError):
            raise
        raise UnsafeFormatError(f"{what}: damaged skeleton ({type(exc).__name__}: {exc})") from None


def _header_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors header (8-byte little-endian length, then JSON)."""
    if len(data) < 8:
        raise ValueError("file too short")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("header length beyond the end of the file")
    header = json.loads(data[8:8 + n])
    meta = header.get("__metadata__") or {}
    if not isinstance(meta, dict):
        raise ValueError("__metadata__ is not an object")
    return meta
