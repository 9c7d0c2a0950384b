"""Checkpoint files that cannot run code when read: safetensors plus a JSON skeleton.

A run's checkpoint is a nest of dicts, lists and tuples holding tensors (weights, optimizer
moments, the torch RNG state), numpy arrays (numpy's RNG state) and plain numbers. Experiment
folders get shared and downloaded, so they are never unpickled: every tensor and array goes into
one safetensors file, and the structure around them is JSON stored in the same file's header
metadata (key ``rapidfire_state``). Reading it is ``safetensors`` parsing plus ``json.loads``.

The JSON skeleton marks what JSON cannot say on its own:
``{"$t": name}`` a tensor, ``{"$np": name, "dtype": ...}`` a numpy array, ``{"$tuple": [...]}``,
``{"$map": [[key, value], ...]}`` a dict whose keys are not all strings (optimizer state is keyed
by parameter index), ``{"$float": "nan"|"inf"|"-inf"}``, and (version 2) ``{"$tensors": [i, [key,
...]]}`` a dict of tensors stored as consecutive tensors ``t<i>``, ``t<i+1>``, .... A plain dict
whose keys start with "$" is written as ``$map`` too, so a marker is never mistaken for data.

Two layouts share that skeleton. Version 1 stores each tensor as its own safetensors entry.
Version 2 (chunk-boundary checkpoints, ``flat_snapshot``) stores one flat buffer per dtype and a
JSON index (tensor name -> buffer, offset, shape) beside the skeleton: a run's checkpoint holds
hundreds of small tensors (adapter weights, two Adam moments and a step each), and writing them
one by one is milliseconds of Python work per file on the writer thread, which holds the
interpreter the training thread needs to launch its ops. Both are read.
"""

from __future__ import annotations

import json
import math
from typing import Any

FORMAT_KEY = "rapidfire_state"
FORMAT_VERSION = 1
FLAT_VERSION = 2
# whose file this is: {"run_id": int, "fingerprint": str | None}. A checkpoint copied or swapped
# into another run's folder is refused instead of silently giving that run foreign weights.
OWNER_KEY = "rapidfire_owner"


class UnsafeFormatError(ValueError):
    """The file is not a rapidfire safetensors checkpoint (or its skeleton is damaged)."""


def encode(obj: Any, owner: dict | None = None) -> bytes:
    """Serialise ``obj`` to the bytes of one safetensors file (``owner`` goes in its metadata)."""
    if isinstance(obj, FlatState):
        return bytes(encode_view(obj, owner))
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


class FlatState(dict):
    """A checkpoint's nest whose tensors are views of the run's snapshot buffer, and what
    ``encode`` needs to write it without visiting a tensor: the skeleton (already JSON) and the
    buffer, laid out as the safetensors file itself (``SnapshotBuffers``).

    Made by ``flat_snapshot`` on the training thread; the buffer is the run's own and is reused at
    its next chunk boundary, so the state must be written (or copied) before that run trains
    again. The nest itself is built from the skeleton when first read (the engine's writer never
    reads it); on CUDA, reading it first waits for the copies into the buffer."""

    skeleton: Any
    skeleton_json: str
    cache: Any
    ready: Any = None       # a CUDA event the copies signal, or None when they are done
    _built = False

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None

    def _build(self) -> None:
        if not self._built:
            self.wait()
            views = self.cache.views
            super().update(_build(self.skeleton, lambda name: views[int(name[1:])], "snapshot"))
            self._built = True

    @property
    def buffers(self) -> dict:
        """dtype name -> this snapshot's flat buffer of that dtype."""
        return self.cache.buffers

    def __getitem__(self, key):
        self._build()
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._build()
        return super().get(key, default)

    def items(self):
        self._build()
        return super().items()

    def values(self):
        self._build()
        return super().values()

    def keys(self):
        self._build()
        return super().keys()

    def __iter__(self):
        self._build()
        return super().__iter__()

    def __len__(self):
        self._build()
        return super().__len__()

    def __contains__(self, key):
        self._build()
        return super().__contains__(key)


# safetensors' names of the dtypes a flat buffer may hold
_ST_DTYPES = {"float64": "F64", "int64": "I64", "float32": "F32", "int32": "I32",
              "float16": "F16", "bfloat16": "BF16", "int16": "I16", "int8": "I8", "uint8": "U8",
              "bool": "BOOL"}


class SnapshotBuffers:
    """A run's reusable host memory for ``flat_snapshot``: one byte buffer laid out as the
    checkpoint file (8-byte header length, a header area of fixed capacity padded with spaces,
    then one flat segment per dtype, widest first so each is aligned). The engine copies the
    tensors into the segments; the writer fills in the header and writes the buffer as it is.
    Remade only when the layout (the tensors' dtypes and shapes) changes or the header outgrows
    its area, which after a run's first chunk boundary does not happen."""

    def __init__(self):
        self.index: list | None = None     # the layout the buffer and views were made for
        self.index_json = ""
        self.file = None                   # the uint8 buffer, file-shaped
        self.header_cap = 0                # bytes of header area (a multiple of 8)
        self.tensor_entries = ""           # the header's JSON entries of the segments
        self.buffers: dict = {}            # dtype name -> its segment, typed
        self.views: list = []              # per tensor slot: its view of its segment
        self.groups: list = []             # (positions, device type) of one copy call each
        self.stream = None                 # CUDA side stream for the copies
        self.allocations = 0               # how many times the buffer was (re)made

    def allocate(self, index: list, index_json: str, sizes: dict, header_need: int, pin: bool) -> None:
        import torch

        order = sorted(sizes, key=lambda dt: -torch.empty(0, dtype=getattr(torch, dt)).element_size())
        cap = header_need * 2 + 4096
        cap += -cap % 8
        entries, nbytes = [], {}
        offset = 0
        for dt in order:
            nbytes[dt] = sizes[dt] * torch.empty(0, dtype=getattr(torch, dt)).element_size()
            entries.append(f'"flat.{dt}":{{"dtype":"{_ST_DTYPES[dt]}","shape":[{sizes[dt]}],'
                           f'"data_offsets":[{offset},{offset + nbytes[dt]}]}}')
            offset += nbytes[dt]
        self.file = torch.empty(8 + cap + offset, dtype=torch.uint8, pin_memory=pin)
        self.header_cap, self.tensor_entries = cap, ",".join(entries)
        start = 8 + cap
        self.buffers = {}
        for dt in order:
            self.buffers[dt] = self.file[start:start + nbytes[dt]].view(getattr(torch, dt))
            start += nbytes[dt]
        self.views = [self.buffers[dt][off:off + math.prod(shape)].view(shape)
                      for dt, off, shape in index]
        self.index, self.index_json = index, index_json
        self.allocations += 1


_DTYPE_NAMES: dict | None = None


def flat_snapshot(obj: Any, cache: SnapshotBuffers) -> FlatState:
    """``obj`` (as ``encode`` takes it) with every tensor and numpy array copied into ``cache``'s
    host buffer. One ``_foreach_copy_`` per dtype and source device does the copying; from a CUDA
    device the buffer is pinned and the copies run on a side stream after the work already
    queued, without blocking this thread (``FlatState.ready``)."""
    import torch

    global _DTYPE_NAMES
    if _DTYPE_NAMES is None:
        _DTYPE_NAMES = {getattr(torch, n): n for n in _ST_DTYPES if hasattr(torch, n)}
    sources: list = []
    index: list = []
    sizes: dict[str, int] = {}
    tensor_type = torch.Tensor

    def walk(x):
        # the skeleton; every tensor goes to ``sources``. The checks go most frequent first: this
        # visits every tensor of the run's state at every chunk boundary
        if isinstance(x, dict):
            if all(type(k) is str and not k.startswith("$") for k in x):
                vals = list(x.values())
                if len(vals) > 1 and all(isinstance(v, tensor_type) for v in vals):
                    # adapter weights, one parameter's Adam state: the tensors in one go
                    base = len(sources)
                    tensor_slots(vals)
                    return {"$tensors": [base, list(x)]}
                return {k: walk(v) for k, v in x.items()}
            return {"$map": [[walk(k), walk(v)] for k, v in x.items()]}
        if isinstance(x, tensor_type):
            tensor_slots([x])
            return {"$t": f"t{len(sources) - 1}"}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, (tuple, list)):
            if all(type(v) is int for v in x):   # the Python RNG state: 625 ints
                return {"$tuple": list(x)} if isinstance(x, tuple) else list(x)
            skel = [walk(v) for v in x]
            return {"$tuple": skel} if isinstance(x, tuple) else skel
        if type(x).__module__ == "numpy":
            import numpy as np

            if isinstance(x, np.ndarray):
                tensor_slots([torch.from_numpy(np.ascontiguousarray(x).astype(np.int64)
                                               if x.dtype.kind in "iub" else np.ascontiguousarray(x))])
                return {"$np": f"t{len(sources) - 1}", "dtype": x.dtype.str}
            if isinstance(x, np.generic):
                return walk(x.item())
        raise TypeError(f"cannot store a {type(x).__module__}.{type(x).__qualname__} in a "
                        "checkpoint (tensors, numpy arrays, numbers, strings, lists, tuples, "
                        "dicts only)")

    def tensor_slots(ts):
        for t in ts:
            dtype = _DTYPE_NAMES.get(t.dtype)
            if dtype is None:
                raise TypeError(f"cannot store a {t.dtype} tensor in a checkpoint")
            off = sizes.get(dtype, 0)
            sizes[dtype] = off + t.numel()
            index.append((dtype, off, t.shape))
        sources.extend(ts)

    skeleton = walk(obj)
    skeleton_json = json.dumps(skeleton, allow_nan=False, separators=(",", ":"))
    cuda = any(t.device.type == "cuda" for t in sources)
    same = index == cache.index
    index_json = cache.index_json if same else json.dumps(
        {f"t{i}": [dt, off, list(shape)] for i, (dt, off, shape) in enumerate(index)},
        separators=(",", ":"))
    # the header: the skeleton and index, escaped once more as metadata strings, and the owner
    need = 2 * (len(skeleton_json) + len(index_json)) + 1024
    if not same or need > cache.header_cap:
        cache.allocate(index, index_json, sizes, need, cuda)
        groups: dict = {}
        for i, ((dt, _, _), t) in enumerate(zip(index, sources)):
            groups.setdefault((dt, t.device.type), []).append(i)
        cache.groups = [(pos, dev) for (_, dev), pos in groups.items()]
    views = cache.views
    ready = None
    with torch.no_grad():   # sources that require grad (live parameters) copied as data
        for pos, dev in cache.groups:
            dst, src = [views[i] for i in pos], [sources[i] for i in pos]
            if dev == "cuda":
                if cache.stream is None:
                    cache.stream = torch.cuda.Stream(src[0].device)
                cache.stream.wait_stream(torch.cuda.current_stream(src[0].device))
                with torch.cuda.stream(cache.stream):
                    torch._foreach_copy_(dst, src, non_blocking=True)
                ready = torch.cuda.Event()
                ready.record(cache.stream)
            else:
                torch._foreach_copy_(dst, src)
    out = FlatState()
    out.skeleton, out.skeleton_json, out.cache, out.ready = skeleton, skeleton_json, cache, ready
    return out


def encode_view(obj: Any, owner: dict | None = None) -> memoryview | bytes:
    """``encode(obj, owner)``; for a ``FlatState``, its snapshot buffer itself with the header
    filled in: writing it is one write of memory the engine already copied, during which the
    interpreter is released."""
    import sys

    if not isinstance(obj, FlatState) or sys.byteorder != "little":
        return encode(dict(obj) if isinstance(obj, FlatState) else obj, owner)
    obj.wait()
    cache = obj.cache
    doc = f'{{"version":{FLAT_VERSION},"index":{cache.index_json},"state":{obj.skeleton_json}}}'
    meta = {FORMAT_KEY: doc}
    if owner is not None:
        meta[OWNER_KEY] = json.dumps(owner, separators=(",", ":"))
    head = ('{"__metadata__":' + json.dumps(meta, separators=(",", ":")) + ","
            + cache.tensor_entries + "}").encode("utf-8")
    import numpy as np

    raw = cache.file.numpy()
    cap = cache.header_cap
    if len(head) > cap:   # not expected (flat_snapshot sizes the area); a copy, then
        head += b" " * (-len(head) % 8)
        return b"".join([len(head).to_bytes(8, "little"), head, memoryview(raw[8 + cap:])])
    raw[:8] = np.frombuffer(cap.to_bytes(8, "little"), dtype=np.uint8)
    raw[8:8 + len(head)] = np.frombuffer(head, dtype=np.uint8)
    raw[8 + len(head):8 + cap] = 0x20   # safetensors pads its header with spaces
    return memoryview(raw)


def _unflatten(stored: dict, index: Any, what: str) -> dict:
    """Version 2: each indexed tensor cut out of its flat buffer (an owned copy)."""
    if not isinstance(index, dict):
        raise UnsafeFormatError(f"{what}: its flat-buffer index is missing or damaged")
    out = {}
    for name, entry in index.items():
        ok = (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
              and isinstance(entry[1], int) and not isinstance(entry[1], bool) and entry[1] >= 0
              and isinstance(entry[2], list)
              and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry[2]))
        buf = stored.get(f"flat.{entry[0]}") if ok else None
        n = math.prod(entry[2]) if ok else 0
        if buf is None or buf.dim() != 1 or entry[1] + n > buf.numel():
            raise UnsafeFormatError(f"{what}: the index entry of {name!r} ({entry!r:.80}) does "
                                    "not fit a stored buffer")
        out[name] = buf[entry[1]:entry[1] + n].view(entry[2]).clone()
    return out


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
    if not isinstance(doc, dict) or doc.get("version") not in (FORMAT_VERSION, FLAT_VERSION):
        raise UnsafeFormatError(f"{what}: unknown checkpoint format version "
                                f"{doc.get('version') if isinstance(doc, dict) else doc!r}")
    if doc["version"] == FLAT_VERSION:
        tensors = _unflatten(tensors, doc.get("index"), what)

    def tensor(name):
        if not isinstance(name, str) or name not in tensors:
            raise UnsafeFormatError(f"{what}: the skeleton names a tensor {name!r} that is not stored")
        return tensors[name]

    try:
        return _build(doc.get("state"), tensor, what)
    except (TypeError, IndexError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        if isinstance(exc, UnsafeFormatError):
            raise
        raise UnsafeFormatError(f"{what}: damaged skeleton ({type(exc).__name__}: {exc})") from None


def _build(skeleton: Any, tensor, what: str) -> Any:
    """The object a skeleton describes, its tensors given by ``tensor(name)``."""

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
        if len(x) == 1 and "$tensors" in x:
            base, keys = x["$tensors"]
            if not (isinstance(base, int) and isinstance(keys, list)
                    and all(isinstance(k, str) for k in keys)):
                raise UnsafeFormatError(f"{what}: damaged skeleton ($tensors {x['$tensors']!r:.80})")
            return {k: tensor(f"t{base + i}") for i, k in enumerate(keys)}
        return {k: walk(v) for k, v in x.items()}

    return walk(skeleton)


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
