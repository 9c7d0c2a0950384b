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
- a string (SFT only): TRL's form. The function is called exactly as ``SFTTrainer`` calls it:
  once per training row in order, then once per eval row, and never more. The probe's output is
  the first row's text; the other rows are mapped as TRL maps them (``{"text": fn(row)}`` added
  beside the columns) before training, where every output is checked to be a string, and
  ``SFTTrainer`` prepares those texts (``adapters/sft.py``) instead of calling the function again.
  A function that keeps state (numbering rows, drawing a template) so trains on the same text as
  in plain TRL.

The row mapper is likewise called once per row: the probe's output is row 0's. Anything else is
refused before training, naming the function and what it returned.
"""

from __future__ import annotations

import hashlib

from rapidfire_nb.engine.runspec import callable_name
from rapidfire_nb.errors import ConfigError

ROWS, TEXT = "rows", "text"


def _name(fn) -> str:
    return callable_name(fn) or repr(fn)


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


_NO_FIRST = object()   # no probe output for this dataset: its row 0 is called like the others


def _text_map(fn, dataset, first, name: str):
    """``dataset`` with ``{"text": fn(row)}`` added, as ``SFTTrainer``'s own formatting ``map``
    adds it (row 0's text is ``first``, the probe's output, when given), each output checked to
    be a string: one bad row is named here, not a raw traceback from inside TRL's preparation."""
    import datasets

    def text_of(row, i):
        if i == 0 and first is not _NO_FIRST:
            out = first
        else:
            try:
                out = fn(row)
            except Exception as exc:
                raise ConfigError(f"formatting_func {_name(fn)!r} raised on {name} row {i}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(out, str):
            raise ConfigError(
                f"formatting_func {_name(fn)!r} returned a string for the first row of {name} "
                f"(TRL's form: the training text) but {_what(out)} for row {i}; it must return a "
                f"string for every row")
        return {"text": out}

    fp = hashlib.sha256(f"{_name(fn)}|{dataset._fingerprint}|text".encode()).hexdigest()[:32]
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        return dataset.map(text_of, with_indices=True, batched=False, new_fingerprint=fp,
                           load_from_cache_file=False, desc=None)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"formatting_func {_name(fn)!r} raised while formatting {name}: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        if was:
            datasets.utils.logging.enable_progress_bar()


def _map(fn, dataset, first, keep_unreturned: bool, name: str):
    import datasets

    drop = [] if keep_unreturned or first is _NO_FIRST else [c for c in dataset.column_names if c not in first]
    # a content-derived fingerprint: datasets would otherwise hash the function with dill (and
    # warn, with a random hash, for most notebook-defined functions)
    fp = hashlib.sha256(f"{_name(fn)}|{dataset._fingerprint}|{keep_unreturned}".encode()).hexdigest()[:32]
    was = datasets.utils.logging.is_progress_bar_enabled()
    datasets.utils.logging.disable_progress_bar()
    try:
        return dataset.map(lambda row, i: first if i == 0 and first is not _NO_FIRST else _row_dict(fn, row, i, name),
                           with_indices=True,
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
    (once per function and dataset, shared through ``cache``), else unchanged. For TRL's string
    form the texts are made here too (``texts_of``), for ``SFTTrainer`` to prepare."""
    fn = spec.formatting_func
    if fn is None or dataset is None:
        return dataset
    return _entry(spec, dataset, cache, name)[2]


def _entry(spec, dataset, cache: dict, name: str) -> tuple:
    """(fn, dataset, what the trainer reads, kind, texts or None), made once per function and
    dataset. The function's kind is probed once, on the first dataset it meets (the training
    data): later datasets (the eval data) are called row by row as TRL or RapidFire call them."""
    fn = spec.formatting_func
    # as RapidFire's dataset.map(formatting_func): the source columns stay beside the new ones
    # (references for metrics, reward functions and the user's own code read them)
    keep = True
    key = ("formatted", id(fn), id(dataset), keep)
    hit = cache.get(key)
    # the entry holds the function and the source: their ids cannot be reused while cached
    if hit is not None and hit[0] is fn and hit[1] is dataset:
        return hit
    if len(dataset) == 0:      # nothing to call the function on, nothing learnt of its kind
        entry = cache[key] = (fn, dataset, dataset, None, None)
        return entry
    kind, first = _known_kind(fn, cache), _NO_FIRST
    if kind is None:
        kind, first = _probe(spec, dataset, name)
    texts = None
    if kind == TEXT:
        out = dataset
        if "input_ids" not in dataset.column_names:   # TRL ignores the function on tokenized data
            texts = _text_map(fn, dataset, first, name)
    else:
        out = _map(fn, dataset, first, keep, name)
    entry = (fn, dataset, out, kind, texts)
    cache[key] = entry
    return entry


def _known_kind(fn, cache: dict) -> str | None:
    for key, hit in cache.items():
        if isinstance(key, tuple) and key[:1] == ("formatted",) and hit[0] is fn and hit[3] is not None:
            return hit[3]
    return None


def texts_of(spec, dataset, cache: dict, name: str = "train_dataset"):
    """TRL's string form: ``dataset`` with the ``text`` column ``SFTTrainer`` would have added by
    calling the function, made once (None when the function is not of that form)."""
    if spec.formatting_func is None or dataset is None:
        return None
    entry = _entry(spec, dataset, cache, name)
    return entry[4] if entry[3] == TEXT else None


def cached_texts(fn, dataset, cache: dict):
    """The texts ``texts_of`` made for ``fn`` and ``dataset``, or None: never calls ``fn``."""
    hit = cache.get(("formatted", id(fn), id(dataset), True))
    if hit is not None and hit[0] is fn and hit[1] is dataset and hit[3] == TEXT:
        return hit[4]
    return None


def uses_text_form(spec, cache: dict, dataset) -> bool:
    """True when ``spec``'s formatting_func is TRL's string form (to be handed to SFTTrainer)."""
    if spec.formatting_func is None:
        return False
    if dataset is None:
        return _known_kind(spec.formatting_func, cache) == TEXT
    return _entry(spec, dataset, cache, "train_dataset")[3] == TEXT


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
