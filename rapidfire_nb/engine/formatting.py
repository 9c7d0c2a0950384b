"""``formatting_func`` as RapidFire AI defines it: a row mapper applied to the data before training.

RapidFire's (and the TRL docs' RapidFire example's) ``formatting_func`` takes one dataset row and
returns a dict of new columns (``prompt``/``completion`` for SFT, ``prompt`` plus extra columns
for GRPO, ``prompt``/``chosen``/``rejected`` for DPO). TRL's own ``SFTTrainer(formatting_func=)``
takes a row and returns the training *text*. The two are told apart by what the function returns
for the first row of the training data:

- a dict: the function is applied with ``datasets.map`` to the train and the eval data (the
  original columns stay beside the returned ones, as RapidFire's ``map`` keeps them), before any
  validation and before generation-based metrics read the eval prompts; the mapped data is shared
  by every run with the same function and the same data (it is mapped once);
- a string (SFT only): the function is handed to TRL's ``SFTTrainer`` as it is.

Anything else is refused before training, naming the function and what it returned.
"""

from __future__ import annotations

import hashlib

from rapidfire_nb.engine.runspec import callable_name
from rapidfire_nb.errors import ConfigError

ROWS, TEXT = "rows", "text"


def _name(fn) -> str:
    return callable_name(fn) or repr(fn)


def formatting_kind(spec, dataset, name: str = "train_dataset") -> str | None:
    """``"rows"`` (RapidFire row mapper), ``"text"`` (TRL string form) or None (no function)."""
    return _probe(spec, dataset, name)[0]


def _probe(spec, dataset, name: str):
    """(kind, what the function returned for the first row)."""
    fn = spec.formatting_func
    if fn is None:
        return None, None
    if dataset is None or len(dataset) == 0:
        return ROWS, None
    try:
        out = fn(dict(dataset[0]))
    except Exception as exc:
        raise ConfigError(f"formatting_func {_name(fn)!r} raised on the first row of {name}: "
                          f"{type(exc).__name__}: {exc}") from exc
    if isinstance(out, str):
        if spec.trainer_type != "SFT":
            raise ConfigError(
                f"formatting_func {_name(fn)!r} returned a string for the first row of {name}; "
                f"{spec.trainer_type} needs a dict of columns (e.g. {{'prompt': ..., "
                + ("'chosen': ..., 'rejected': ...}})" if spec.trainer_type == "DPO" else "'answer': ...})"))
        return TEXT, out
    if isinstance(out, dict) and out and all(isinstance(k, str) for k in out):
        return ROWS, out
    got = "an empty dict" if out == {} else type(out).__name__
    raise ConfigError(
        f"formatting_func {_name(fn)!r} returned {got} for the first row of {name}; it must return "
        "a dict of columns (RapidFire AI's form, e.g. {'prompt': [...], 'completion': [...]}) or, "
        "for SFT, the training text as a string (TRL's form)")


def _what(out) -> str:
    text = repr(out)
    return f"{type(out).__name__} {text[:80] + '...' if len(text) > 80 else text}"


def _check_text_rows(fn, dataset, name: str) -> None:
    """TRL's string form is called by SFTTrainer row by row while it tokenizes: one bad row would
    fail the run there with a raw traceback. One pass here names the row instead."""
    for i, row in enumerate(dataset):
        try:
            out = fn(dict(row))
        except Exception as exc:
            raise ConfigError(f"formatting_func {_name(fn)!r} raised on {name} row {i}: "
                              f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(out, str):
            raise ConfigError(
                f"formatting_func {_name(fn)!r} returned a string for the first row of {name} "
                f"(TRL's form: the training text) but {_what(out)} for row {i}; it must return a "
                f"string for every row")


def _map(fn, dataset, first: dict, keep_unreturned: bool, name: str):
    import datasets

    drop = [] if keep_unreturned else [c for c in dataset.column_names if c not in first]
    # a content-derived fingerprint: datasets would otherwise hash the function with dill (and
    # warn, with a random hash, for most notebook-defined functions)
    fp = hashlib.sha256(f"{_name(fn)}|{dataset._fingerprint}|{keep_unreturned}".encode()).hexdigest()[:32]
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        return dataset.map(lambda row, i: _row_dict(fn, row, i, name), with_indices=True,
                           remove_columns=drop, new_fingerprint=fp, load_from_cache_file=False,
                           desc=None)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"formatting_func {_name(fn)!r} failed while mapping {name}: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        if was:
            datasets.utils.logging.enable_progress_bar()


def _row_dict(fn, row, i: int, name: str) -> dict:
    out = fn(dict(row))
    if not (isinstance(out, dict) and out):
        # else datasets keeps the row as it was and the error reads as a missing-columns one
        raise ConfigError(f"formatting_func {_name(fn)!r} returned {_what(out)} for {name} row {i}; "
                          "it must return a dict of columns for every row (as it did for row 0)")
    return out


def formatted(spec, dataset, cache: dict, name: str):
    """``dataset`` as ``spec``'s trainer reads it: mapped through a row-mapper ``formatting_func``
    (once per function and dataset, shared through ``cache``), else unchanged."""
    fn = spec.formatting_func
    if fn is None or dataset is None:
        return dataset
    # as RapidFire's dataset.map(formatting_func): the source columns stay beside the new ones
    # (references for metrics, reward functions and the user's own code read them)
    keep = True
    key = ("formatted", id(fn), id(dataset), keep)
    hit = cache.get(key)
    # the entry holds the function and the source: their ids cannot be reused while cached
    if hit is not None and hit[0] is fn and hit[1] is dataset:
        return hit[2]
    kind, first = _probe(spec, dataset, name)
    if kind == TEXT:
        _check_text_rows(fn, dataset, name)
    out = dataset if kind == TEXT or first is None else _map(fn, dataset, first, keep, name)
    cache[key] = (fn, dataset, out, kind)
    return out


def uses_text_form(spec, cache: dict, dataset) -> bool:
    """True when ``spec``'s formatting_func is TRL's string form (to be handed to SFTTrainer)."""
    fn = spec.formatting_func
    if fn is None:
        return False
    for key, hit in cache.items():
        if isinstance(key, tuple) and key[:1] == ("formatted",) and hit[0] is fn and hit[1] is dataset:
            return hit[3] == TEXT
    return formatting_kind(spec, dataset) == TEXT


def check_run_data(spec, cls, train_dataset, eval_dataset, cache: dict) -> None:
    """Before training: map the data as the run will read it, then let the trainer type check it."""
    train = formatted(spec, train_dataset, cache, "train_dataset")
    if uses_text_form(spec, cache, train_dataset):
        # TRL's form: the text is built inside SFTTrainer; only the generation metrics read columns
        if eval_dataset is not None:
            formatted(spec, eval_dataset, cache, "eval_dataset")   # every eval row gives a string
        if eval_dataset is not None and spec.compute_metrics is not None:   # a no-op without generation
            from rapidfire_nb.engine.generation import check_eval_dataset

            check_eval_dataset(spec, eval_dataset)
        return
    _check_mapped(spec, cls, train, "train_dataset")
    if eval_dataset is not None:
        _check_mapped(spec, cls, formatted(spec, eval_dataset, cache, "eval_dataset"), "eval_dataset")


def _check_mapped(spec, cls, dataset, name: str) -> None:
    try:
        cls.check_dataset(spec, dataset, name)
    except ConfigError as exc:
        if spec.formatting_func is None:
            raise
        raise ConfigError(f"{exc} (after formatting_func {_name(spec.formatting_func)!r} was "
                          f"applied to each row)") from None
