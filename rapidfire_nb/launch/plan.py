"""The FitPlan: what run_fit will train, as plain values (the runs' specs, ``num_chunks``, the
seed, the data's fingerprints, the pruning settings), and what ``experiment.json`` records of it,
so that a resume can be checked against it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from rapidfire_nb._version import __version__
from rapidfire_nb.engine import RunSpec


@dataclass(frozen=True)
class FitPlan:
    specs: list[RunSpec]
    num_chunks: int
    seed: int
    data: dict            # {"train": fingerprint, "eval": fingerprint}
    pruning: dict         # tuning.pruning_settings of the config group

    def fingerprints(self) -> list[str]:
        return [s.fingerprint() for s in self.specs]

    def settings(self) -> dict:
        """What experiment.json keeps of this plan (a resume must give the same)."""
        return {"num_chunks": self.num_chunks, "seed": self.seed, "data": self.data,
                "runs": self.fingerprints(), "pruning": self.pruning}

    def meta(self, name: str) -> dict:
        """experiment.json once run_fit has created the runs."""
        return {"name": name, "version": __version__, **self.settings()}


def make_plan(args, pruning: dict) -> FitPlan:
    """The plan of checked run_fit arguments (``arguments.FitArguments``)."""
    return FitPlan(args.specs, args.num_chunks, args.seed,
                   {"train": dataset_fingerprint(args.train_dataset),
                    "eval": dataset_fingerprint(args.eval_dataset)},
                   pruning)


def dataset_fingerprint(ds) -> str:
    """A content hash (datasets' own fingerprint is random after a map with an unhashable fn)."""
    if ds is None:
        return "none"
    h = hashlib.sha256(json.dumps([len(ds), sorted(ds.column_names)]).encode())
    step = max(1, len(ds) // 1024)
    for row in _sampled_rows(ds, step):
        h.update(json.dumps(row, sort_keys=True, default=repr).encode())
    return f"{len(ds)}:{h.hexdigest()[:16]}"


def _sampled_rows(ds, step: int):
    """Every ``step``-th row, as ``ds[i]`` gives it: read as one batch when the dataset has no
    format (the same Python values as row by row, without a table lookup per row)."""
    format_type = getattr(ds, "format", {}).get("type", "?") if hasattr(ds, "format") else "?"
    if format_type is None and hasattr(ds, "column_names"):
        batch = ds[list(range(0, len(ds), step))]
        names = list(batch)
        for values in zip(*(batch[n] for n in names)):
            yield dict(zip(names, values))
        return
    for i in range(0, len(ds), step):
        yield ds[i]
