"""Search spaces behind ``RFGridSearch`` / ``RFRandomSearch``.

A user's nested config (a ``List`` of ``RFModelConfig``s holding RF*Configs, dicts, ``List``s and
``Range``s) becomes a small tree of nodes:

- ``Const``: one value (a plain Python list is one value, never an axis);
- ``Choice``: a ``List`` -- its options are subtrees, so a ``List`` of LoRA configs whose knobs are
  ``List``s nests;
- ``Span``: a ``Range`` (random search only);
- ``Record``: a dict of named subtrees (an RF*Config's knobs, ``model_kwargs``, an RFModelConfig),
  the product of its fields with the first-declared field varying slowest.

The tree enumerates (grid), samples (random), counts grid points and bounds the number of distinct
points -- all deterministic for a seed.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any
from collections.abc import Iterator

from rapidfire_nb.errors import ConfigError


class Node:
    path: str

    def grid(self) -> Iterator[Any]:
        raise NotImplementedError

    def grid_size(self) -> int:
        raise NotImplementedError

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError

    def max_distinct(self) -> float:
        """Upper bound of distinct points (math.inf for a continuous Range)."""
        raise NotImplementedError

    def points(self) -> Iterator[Any]:
        """Every point, Ranges included (int Ranges fully, float ones need start == end)."""
        raise NotImplementedError

    def corners(self) -> Iterator[Any]:
        """A finite stand-in for the space: grid points with Ranges at their two ends."""
        raise NotImplementedError


@dataclass
class Const(Node):
    value: Any
    path: str = ""

    def grid(self):
        yield self.value

    def grid_size(self):
        return 1

    def sample(self, rng):
        return self.value

    def max_distinct(self):
        return 1

    def points(self):
        yield self.value

    def corners(self):
        yield self.value


@dataclass
class Choice(Node):
    options: list
    path: str = ""

    def grid(self):
        for option in self.options:
            yield from option.grid()

    def grid_size(self):
        return sum(o.grid_size() for o in self.options)

    def sample(self, rng):
        return self.options[rng.randrange(len(self.options))].sample(rng)

    def max_distinct(self):
        return sum(o.max_distinct() for o in self.options)

    def points(self):
        for option in self.options:
            yield from option.points()

    def corners(self):
        for option in self.options:
            yield from option.corners()


@dataclass
class Span(Node):
    range: Any      # automl.Range
    path: str = ""

    def grid(self):
        raise ConfigError(
            f"'{self.path}' is a {self.range!r}, which only a random search can sample: use "
            f"List([...]) for a grid axis, or RFRandomSearch.")

    def grid_size(self):
        self.grid()

    def sample(self, rng):
        return self.range.sample(rng)

    def max_distinct(self):
        return self.range.num_values()

    def points(self):
        if math.isinf(self.range.num_values()):
            raise ValueError("continuous range")
        yield from self.range.values()

    def corners(self):
        yield from dict.fromkeys([self.range.start, self.range.top])


@dataclass
class Record(Node):
    fields: list        # [(name, Node)]
    path: str = ""
    factory: Any = dict  # builds the leaf from a {name: value} dict

    def _product(self, method):
        names = [n for n, _ in self.fields]
        for values in itertools.product(*[list(getattr(node, method)()) for _, node in self.fields]):
            yield self.factory(dict(zip(names, values)))

    def grid(self):
        return self._product("grid")

    def points(self):
        return self._product("points")

    def corners(self):
        return self._product("corners")

    def grid_size(self):
        return math.prod(node.grid_size() for _, node in self.fields)

    def sample(self, rng):
        return self.factory({name: node.sample(rng) for name, node in self.fields})

    def max_distinct(self):
        return math.prod(node.max_distinct() for _, node in self.fields)


def canonical(value: Any) -> Any:
    """A hashable key of a leaf: equal keys mean the same configuration (functions by identity)."""
    if isinstance(value, dict):
        return ("d", tuple((str(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("l", tuple(canonical(v) for v in value))
    if isinstance(value, float):
        return ("f", repr(value))
    if isinstance(value, (bool, int, str)) or value is None:
        return (type(value).__name__, value)
    if callable(value):
        return ("c", id(value))
    return ("r", repr(value))
