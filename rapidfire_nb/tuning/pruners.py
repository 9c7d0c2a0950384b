"""Pruning policy at chunk boundaries: which runs to stop, and why. Pure Python, no torch.

Like ``engine/scheduling/`` this module only decides; the AutoML driver (``tuning/driver.py``)
feeds it each run's objective after every chunk and acts on its decisions (stop a run, or only
suggest it). Rules shared by every policy here:

- A *rung* is a number of chunks of the run's own data stream, counted across epochs. Runs are
  compared at equal rungs, i.e. at equal samples seen, never at equal optimizer steps (runs with
  other batch sizes have other step counts).
- Decisions are *synchronous*: a bracket (a group of runs compared together) decides at rung k
  only once every live member has reached rung k. With the fair lockstep scheduler this costs
  nothing: the slowest member is always the next to train.
- Exception: a bracket too small to rank within itself (RFOptuna asks a refill alone when one
  slot frees): fewer runs than ``reduction_factor`` for ``sha``/``hyperband``, one run for
  ``median``. Such a run is judged at rung k against every value any run recorded at rung k so far
  (asynchronous successive halving, as Optuna's SuccessiveHalvingPruner): it goes on only within
  the best ``ceil(n / reduction_factor)`` of those ``n`` values, itself included (``median``:
  only if not worse than their median, once there are three).
- Only live runs are judged. A run the user stopped leaves its bracket's waiting set (it is not
  counted as pruned) and rejoins it if resumed; a run that passed a rung while outside (resumed
  late, or a warm clone that inherited its parent's progress) is simply not ranked at that rung.
- Ties are broken by run id, NaN/missing values rank last, so decisions are deterministic.

Policies: ``SuccessiveHalving`` (keep the best ``ceil(n / reduction_factor)`` at rungs
``min_chunks * reduction_factor**i``), ``MedianRule`` (at every rung from ``min_chunks``, stop the
runs worse than the median of every value seen at that rung), ``Hyperband`` (successive halving
in several brackets whose first rung differs; runs are spread over the brackets round robin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rapidfire_nb.automl.pruning import PRUNERS  # the names a config group accepts


@dataclass(frozen=True)
class Decision:
    run_id: int
    rung: int          # chunks of the run's data stream done when it was judged
    rank: int          # 1 = best
    of: int            # runs ranked at that rung in its bracket
    reason: str


@dataclass
class _Member:
    run_id: int
    bracket: Any
    values: dict = field(default_factory=dict)    # rung (chunks done) -> objective value
    chunks: int = 0
    live: bool = True          # pending or running
    finished: bool = False     # completed: ranked, never pruned
    pruned: Decision | None = None


class RungPolicy:
    """Base: bracket bookkeeping; subclasses say which rungs exist and who loses at one."""

    name = ""

    def __init__(self, direction: str = "minimize", min_chunks: int = 1, reduction_factor: int = 2):
        if direction not in ("minimize", "maximize"):
            raise ValueError(f"direction must be 'minimize' or 'maximize', got {direction!r}")
        if isinstance(min_chunks, bool) or not isinstance(min_chunks, int) or min_chunks < 1:
            raise ValueError(f"min_chunks must be an integer >= 1, got {min_chunks!r}")
        if (isinstance(reduction_factor, bool) or not isinstance(reduction_factor, int)
                or reduction_factor < 2):
            raise ValueError(f"reduction_factor must be an integer >= 2, got {reduction_factor!r}")
        self.direction = direction
        self.min_chunks = min_chunks
        self.reduction_factor = reduction_factor
        self.members: dict[int, _Member] = {}
        self.decided: dict[Any, set] = {}      # bracket -> rungs already decided
        self.added = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def add_run(self, run_id: int, bracket: Any = None, parent: int | None = None,
                chunks: int = 0) -> Any:
        """Register a run; a clone (``parent``) enters its parent's bracket. Returns the bracket."""
        if run_id in self.members:
            return self.members[run_id].bracket
        if parent is not None and parent in self.members:
            bracket = self.members[parent].bracket
        elif bracket is None:
            bracket = self._default_bracket()
        self.added += 1
        self.members[run_id] = _Member(run_id, bracket, chunks=chunks)
        self.decided.setdefault(bracket, set())
        return bracket

    def _default_bracket(self) -> Any:
        return 0

    def new_bracket(self, tag: str) -> Any:
        """A fresh bracket named after ``tag``, for runs asked together later (RFOptuna refills)."""
        return tag

    def report(self, run_id: int, chunks: int, value: float | None) -> None:
        """The objective of ``run_id`` after ``chunks`` chunks of its data stream."""
        m = self.members[run_id]
        m.chunks = max(m.chunks, chunks)
        if value is not None:
            m.values[chunks] = float(value)

    def set_state(self, run_id: int, live: bool, finished: bool = False) -> None:
        m = self.members[run_id]
        m.live, m.finished = live and not finished, finished

    def is_pruned(self, run_id: int) -> bool:
        m = self.members.get(run_id)
        return m is not None and m.pruned is not None

    # -- deciding -------------------------------------------------------------------------------
    def rungs(self, bracket: Any) -> list[int]:
        """Rungs of a bracket, ascending, up to the largest chunk count any member has reached."""
        raise NotImplementedError

    def losers(self, bracket: Any, rung: int, ranked: list[_Member]) -> list[tuple[_Member, int]]:
        """(member, rank) of the ranked live members that lose at ``rung``."""
        raise NotImplementedError

    def _sort_key(self, rung: int):
        sign = 1.0 if self.direction == "minimize" else -1.0

        def key(m: _Member):
            v = m.values.get(rung)
            bad = v is None or math.isnan(v)
            return (bad, 0.0 if bad else sign * v, m.run_id)

        return key

    def decide(self) -> list[Decision]:
        """New decisions, for every bracket whose live members all reached an undecided rung."""
        out: list[Decision] = []
        brackets: dict[Any, list[_Member]] = {}
        for m in self.members.values():
            brackets.setdefault(m.bracket, []).append(m)
        for bracket, members in brackets.items():
            alone = self._too_small(members)
            for rung in self.rungs(bracket):
                if rung in self.decided[bracket]:
                    continue
                judged = [m for m in members if m.pruned is None and (m.live or m.finished)]
                if any(m.live and m.chunks < rung for m in judged):
                    break          # wait: the bracket moves in lockstep
                ranked = sorted((m for m in judged if rung in m.values), key=self._sort_key(rung))
                self.decided[bracket].add(rung)
                if alone:
                    out += self._judge_against_history(rung, ranked)
                    continue
                if len(ranked) < 2:
                    continue
                for m, rank in self.losers(bracket, rung, ranked):
                    if not m.live:
                        continue   # finished runs compete for places but are never stopped
                    out.append(self._prune(m, rung, rank, len(ranked)))
        return out

    def _prune(self, m: _Member, rung: int, rank: int, of: int) -> Decision:
        d = Decision(m.run_id, rung, rank, of, f"pruned at chunk {rung} (rank {rank} of {of})")
        m.pruned = d
        m.live = False
        return d

    # -- brackets too small to rank: asynchronous judgement ---------------------------------------
    def _too_small(self, members: list[_Member]) -> bool:
        """A bracket that cannot be ranked within itself (e.g. one trial RFOptuna asked alone to
        fill a freed slot): its runs are judged against the study's rung history instead."""
        return False

    def _judge_against_history(self, rung: int, ranked: list[_Member]) -> list[Decision]:
        """Judge each live run of ``ranked`` at ``rung`` against every value recorded there by any
        run of the study (pruned, stopped and finished ones included, itself too), as Optuna's
        asynchronous SuccessiveHalvingPruner does. The history is the members' saved values, so
        a resumed study judges the same way; a rung is judged once, when the run reaches it."""
        history = sorted((m for m in self.members.values() if rung in m.values),
                         key=self._sort_key(rung))
        out = []
        for m in ranked:
            if not m.live:
                continue
            rank = history.index(m) + 1
            if self._loses_in_history(rung, m, rank, history):
                out.append(self._prune(m, rung, rank, len(history)))
        return out

    def _loses_in_history(self, rung: int, m: _Member, rank: int, history: list[_Member]) -> bool:
        raise NotImplementedError

    # -- persistence (JSON) ---------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "name": self.name, "direction": self.direction, "min_chunks": self.min_chunks,
            "reduction_factor": self.reduction_factor, "added": self.added,
            "members": [{"run_id": m.run_id, "bracket": m.bracket, "chunks": m.chunks,
                         "values": {str(k): v for k, v in m.values.items()}, "live": m.live,
                         "finished": m.finished,
                         "pruned": None if m.pruned is None else vars(m.pruned).copy()}
                        for m in self.members.values()],
            "decided": [[b, sorted(r)] for b, r in self.decided.items()],
        }

    def load_json(self, data: dict) -> None:
        self.added = data["added"]
        self.members = {}
        for d in data["members"]:
            m = _Member(d["run_id"], d["bracket"], {int(k): v for k, v in d["values"].items()},
                        d["chunks"], d["live"], d["finished"],
                        None if d["pruned"] is None else Decision(**d["pruned"]))
            self.members[m.run_id] = m
        self.decided = {b: set(r) for b, r in data["decided"]}

    def _max_chunks(self, bracket: Any) -> int:
        return max((m.chunks for m in self.members.values() if m.bracket == bracket), default=0)


class SuccessiveHalving(RungPolicy):
    """Synchronous successive halving: at rungs ``min_chunks * reduction_factor**i`` each bracket
    keeps its best ``ceil(n / reduction_factor)`` of the ``n`` runs ranked there."""

    name = "sha"

    def _first_rung(self, bracket: Any) -> int:
        return self.min_chunks

    def rungs(self, bracket):
        out, r, top = [], self._first_rung(bracket), self._max_chunks(bracket)
        while r <= top:
            out.append(r)
            r *= self.reduction_factor
        return out

    def losers(self, bracket, rung, ranked):
        keep = math.ceil(len(ranked) / self.reduction_factor)
        return [(m, i + 1) for i, m in enumerate(ranked) if i >= keep]

    def _too_small(self, members):
        # fewer runs than reduction_factor keep all of themselves (ceil(n / eta) = n for n = 1)
        return len(members) < self.reduction_factor

    def _loses_in_history(self, rung, m, rank, history):
        return rank > math.ceil(len(history) / self.reduction_factor)


class Hyperband(SuccessiveHalving):
    """Successive halving in ``n_brackets`` brackets; bracket ``s`` starts judging at
    ``min_chunks * reduction_factor**s`` chunks, so some runs get a longer grace period.
    Runs are dealt to brackets round robin, in the order they are added."""

    name = "hyperband"

    def __init__(self, direction="minimize", min_chunks=1, reduction_factor=2, max_chunks: int = 4):
        super().__init__(direction, min_chunks, reduction_factor)
        if max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks!r}")
        ratio = max(1, max_chunks // min_chunks)
        self.n_brackets = max(1, math.floor(math.log(ratio, reduction_factor) + 1e-9))

    def _default_bracket(self):
        return f"hb{self.added % self.n_brackets}"

    def new_bracket(self, tag):
        return f"{self._default_bracket()}:{tag}"

    def _first_rung(self, bracket):
        s = int(str(bracket)[2:].split(":")[0]) if str(bracket).startswith("hb") else 0
        return self.min_chunks * self.reduction_factor ** s


class MedianRule(RungPolicy):
    """At every rung from ``min_chunks``: stop each live run whose value is worse than the median
    of all values recorded at that rung (every bracket, stopped and finished runs included), once
    at least three values exist. Optuna's MedianPruner compares only with *completed* trials, so
    it rarely fires while all trials train side by side; here the others' rung values suffice."""

    name = "median"

    def rungs(self, bracket):
        return list(range(self.min_chunks, self._max_chunks(bracket) + 1))

    def _too_small(self, members):
        # alone, a run is the best of its bracket and the rule below never stops the best
        return len(members) < 2

    def _loses_in_history(self, rung, m, rank, history):
        v = m.values[rung]
        values = sorted(x.values[rung] for x in history if not math.isnan(x.values[rung]))
        if len(values) < 3:
            return False
        n = len(values)
        median = values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])
        return math.isnan(v) or (v > median if self.direction == "minimize" else v < median)

    def losers(self, bracket, rung, ranked):
        values = sorted(m.values[rung] for m in self.members.values()
                        if rung in m.values and not math.isnan(m.values[rung]))
        if len(values) < 3:
            return []
        n = len(values)
        median = values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])
        worse = (lambda v: v > median) if self.direction == "minimize" else (lambda v: v < median)
        out = []
        for i, m in enumerate(ranked):
            v = m.values.get(rung)
            if i > 0 and (v is None or math.isnan(v) or worse(v)):
                out.append((m, i + 1))
        return out


def make_policy(name: str, direction: str = "minimize", min_chunks: int = 1,
                reduction_factor: int = 2, max_chunks: int = 4) -> RungPolicy:
    if name == "sha":
        return SuccessiveHalving(direction, min_chunks, reduction_factor)
    if name == "median":
        return MedianRule(direction, min_chunks, reduction_factor)
    if name == "hyperband":
        return Hyperband(direction, min_chunks, reduction_factor, max_chunks)
    raise ValueError(f"pruner must be one of {', '.join(PRUNERS)} or None, got {name!r}")
