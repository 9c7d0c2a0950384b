"""Search axes: ``List`` (grid and random search) and ``Range`` (random search only)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

from rapidfire_nb.errors import ConfigError

class List:
    """A grid axis: every value is tried (``RFGridSearch``) or one is drawn (``RFRandomSearch``).

    A plain Python list is one value (e.g. ``target_modules=["q_proj", "v_proj"]``); wrap values in
    ``List`` to make them an axis. Values may be anything a knob takes, including RF configs.

    Example::

        RFSFTConfig(learning_rate=List([1e-3, 1e-4]))        # 2 runs
        RFLoraConfig(target_modules=List([["q_proj"], ["q_proj", "v_proj"]]))  # 2 runs
    """

    def __init__(self, values: Iterable):
        if isinstance(values, (str, bytes, dict, List, Range)) or not hasattr(values, "__iter__"):
            raise ConfigError(f"List expects a list of values, got {type(values).__name__} {values!r}.")
        values = list(values)
        if not values:
            raise ConfigError("List needs at least one value.")
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self):
        return iter(self.values)

    def __getitem__(self, i):
        return self.values[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, List) and self.values == other.values

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"List({self.values!r})"

    def sample(self, rng: random.Random | None = None):
        """One value, drawn with ``rng`` (RapidFire's ``List.sample()`` without one)."""
        return (rng or random).choice(self.values)


class Range:
    """A random-search axis: ``RFRandomSearch`` draws a value in ``[start, end]`` (both included).

    Args:
        start, end: the bounds.
        dtype: ``"int"``/``"float"`` (or ``int``/``float``); inferred from the bounds when omitted
            (two ints give an int range).
        log: draw uniformly in log space (both bounds must be > 0) -- the usual choice for
            learning rates.

    Example::

        RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True), per_device_train_batch_size=Range(2, 8))

    A ``Range`` in an ``RFGridSearch`` is an error: a grid cannot enumerate a continuum.
    """

    def __init__(self, start, end, dtype=None, log: bool = False):
        for name, value in (("start", start), ("end", end)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"Range {name} must be a finite number, got {value!r}.")
        if dtype is None:
            dtype = "int" if isinstance(start, int) and isinstance(end, int) else "float"
        dtype = {int: "int", float: "float"}.get(dtype, dtype)
        if dtype not in ("int", "float"):
            raise ConfigError(f"Range dtype must be 'int' or 'float', got {dtype!r}.")
        if dtype == "int":
            if float(start) != int(start) or float(end) != int(end):
                raise ConfigError(f"Range({start!r}, {end!r}, dtype='int') needs integer bounds.")
            start, end = int(start), int(end)
        else:
            start, end = float(start), float(end)
        if start > end:
            raise ConfigError(f"Range start {start!r} is greater than end {end!r}.")
        if not isinstance(log, bool):
            raise ConfigError(f"Range log must be True or False, got {log!r}.")
        if log and start <= 0:
            raise ConfigError(f"Range({start!r}, {end!r}, log=True) needs bounds > 0.")
        self.start, self.end, self.dtype, self.log = start, end, dtype, log

    def sample(self, rng: random.Random):
        """One value drawn with ``rng``."""
        lo, hi = self.start, self.end
        if self.dtype == "int":
            if self.log:
                # uniform in log over [lo, hi + 1) then floor: every integer reachable, log-weighted
                value = int(math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))
            else:
                value = rng.randint(lo, hi)
            return min(max(value, lo), hi)
        if self.log:
            value = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            value = rng.uniform(lo, hi)
        return min(max(value, lo), hi)

    def num_values(self) -> float:
        """How many distinct values a draw can give (``math.inf`` for a float interval)."""
        if self.dtype == "int":
            return self.end - self.start + 1
        return 1 if self.start == self.end else math.inf

    def values(self) -> list:
        if self.dtype == "int":
            return list(range(self.start, self.end + 1))
        if self.start == self.end:
            return [self.start]
        raise ValueError("a float Range has infinitely many values")

    def __eq__(self, other) -> bool:
        return isinstance(other, Range) and (self.start, self.end, self.dtype, self.log) == (
            other.start, other.end, other.dtype, other.log)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Range({self.start!r}, {self.end!r}, dtype={self.dtype!r}{', log=True' if self.log else ''})"

