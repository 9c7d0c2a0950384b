"""Search axes: ``List`` (grid and random search) and ``Range`` (random search only)."""

from __future__ import annotations

import math
import numbers
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

    The signature is RapidFire AI 0.16.2's, with its meanings:

    Args:
        start, end: the bounds.
        dtype: ``"int"``/``"float"`` (or ``int``/``float``); inferred from the bounds when omitted
            (two ints give an int range).
        log: draw uniformly in log space (both bounds must be > 0) -- the usual choice for
            learning rates. Not together with ``step``.
        step: draw only ``start + k * step`` (k = 0, 1, ...) up to ``end``: ``Range(8, 64, step=8)``
            gives 8, 16, ..., 64; ``Range(0.0, 0.3, step=0.1)`` gives 0.0, 0.1, 0.2, 0.3. RFOptuna
            passes it to Optuna's ``suggest_int``/``suggest_float(step=)``.
        sample_n: how many distinct values ``sample()`` draws when a range must be enumerated up
            front (RapidFire does so for RAG indexes, ``RFOptuna(build_all_indexes=True)``); it does
            not change how many runs a search group makes (``num_runs`` does).
        seed: the seed of this range's own generator, used by ``sample(n)`` on its own. Inside a
            search group the group's ``seed`` decides every draw (RapidFire stamps the group's seed
            on every ``Range``; the effect is the same), so a run's values follow from that seed.

    Example::

        RFSFTConfig(learning_rate=Range(1e-5, 1e-3, log=True), per_device_train_batch_size=Range(2, 8))
        Range(1e-4, 1e-3, log=True, seed=3).sample(4)     # 4 distinct values, sorted

    A ``Range`` in an ``RFGridSearch`` is an error: a grid cannot enumerate a continuum.
    """

    def __init__(self, start, end, dtype=None, log: bool = False, step=None, sample_n: int = 3,
                 seed: int | None = None):
        bounds = []
        for name, value in (("start", start), ("end", end)):
            # numpy scalars too (np.int64 is no int): bounds computed with numpy are common
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ConfigError(f"Range {name} must be a finite number, got {value!r}.")
            bounds.append(int(value) if isinstance(value, numbers.Integral) else float(value))
        start, end = bounds
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
        if step is not None:
            if log:
                raise ConfigError("Range: log=True and step are mutually exclusive (Optuna does not "
                                  "support the combination either).")
            if isinstance(step, bool) or not isinstance(step, numbers.Real) or not math.isfinite(step) \
                    or step <= 0:
                raise ConfigError(f"Range step must be a number > 0, got {step!r}.")
            if dtype == "int":
                if float(step) != int(step):
                    raise ConfigError(f"Range(..., dtype='int') needs an integer step, got {step!r}.")
                step = int(step)
            else:
                step = float(step)
        if isinstance(sample_n, bool) or not isinstance(sample_n, int) or sample_n < 1:
            raise ConfigError(f"Range sample_n must be a positive integer, got {sample_n!r}.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"Range seed must be an integer or None, got {seed!r}.")
        self.start, self.end, self.dtype, self.log = start, end, dtype, log
        self.step, self.sample_n, self.seed = step, sample_n, seed
        self._rng = random.Random(seed)

    @property
    def n_steps(self) -> int | None:
        """With ``step``: the largest k with ``start + k * step <= end`` (None without ``step``)."""
        if self.step is None:
            return None
        if self.dtype == "int":
            return (self.end - self.start) // self.step
        return int(math.floor((self.end - self.start) / self.step + 1e-9))

    def _at(self, k: int):
        value = self.start + k * self.step
        return value if self.dtype == "int" else min(round(value, 12), self.end)

    @property
    def top(self):
        """The largest value a draw can give (``end``, or the last step below it)."""
        return self.end if self.step is None else self._at(self.n_steps)

    def set_seed(self, seed: int) -> None:
        """Reseed this range's own generator (what RapidFire's search groups call with their seed)."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"Range seed must be an integer, got {seed!r}.")
        self.seed = seed
        self._rng = random.Random(seed)

    def _draw(self, rng: random.Random):
        lo, hi = self.start, self.end
        if self.step is not None:
            return self._at(rng.randint(0, self.n_steps))
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

    def sample(self, rng=None):
        """``sample(rng)`` with a ``random.Random``: one value drawn with it (what search groups do).
        ``sample(n)`` with an int, or ``sample()`` for ``n = sample_n``: RapidFire's form, up to
        ``n`` distinct values from this range's own generator, sorted (fewer only when the range
        has fewer distinct values)."""
        if isinstance(rng, random.Random):
            return self._draw(rng)
        n = self.sample_n if rng is None else rng
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"Range.sample: n must be a positive integer, got {n!r}.")
        target = min(n, self.num_values())
        values: list = []
        seen: set = set()
        for _ in range(int(target) * 20):    # a narrow range cannot spin forever
            if len(values) >= target:
                break
            value = self._draw(self._rng)
            if value not in seen:
                seen.add(value)
                values.append(value)
        return sorted(values)

    def num_values(self) -> float:
        """How many distinct values a draw can give (``math.inf`` for a float interval)."""
        if self.step is not None:
            return self.n_steps + 1
        if self.dtype == "int":
            return self.end - self.start + 1
        return 1 if self.start == self.end else math.inf

    def values(self) -> list:
        if self.step is not None:
            return [self._at(k) for k in range(self.n_steps + 1)]
        if self.dtype == "int":
            return list(range(self.start, self.end + 1))
        if self.start == self.end:
            return [self.start]
        raise ValueError("a float Range has infinitely many values")

    def _key(self) -> tuple:
        return (self.start, self.end, self.dtype, self.log, self.step)

    def __eq__(self, other) -> bool:
        return isinstance(other, Range) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = (", log=True" if self.log else "") + (f", step={self.step!r}" if self.step is not None else "")
        return f"Range({self.start!r}, {self.end!r}, dtype={self.dtype!r}{extra})"
