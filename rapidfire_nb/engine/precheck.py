"""Checks that need the loaded base model or the data, run before the first run trains.

Configs are validated when they are built (automl); these are the errors that otherwise surfaced
only once a run's trainer was built in the engine thread, as a failed run:

- LoRA ``target_modules`` that match no module of the base (or ``[]``);
- a dataset row that cannot be tokenized (checked on the first rows of each dataset, after the
  run's ``formatting_func``: a full pass would cost as much as the training's own preprocessing);
- a ``generation_config`` that transformers refuses;
- a base model returned by ``create_model`` without its weights (on the ``meta`` device);
- SFT prompt-completion rows whose prompt alone fills ``max_length``: TRL's preparation drops
  them (truncation leaves no completion token to learn from), and a dataset of only such rows
  used to fail as "the training dataset is empty".
"""

from __future__ import annotations

import copy
import re

from rapidfire_nb.errors import ConfigError

ROWS_CHECKED = 8
_TEXT_COLUMNS = ("text", "prompt", "completion", "chosen", "rejected", "messages")


def check_target_modules(spec, base_model) -> None:
    """Refuse LoRA target modules that adapt nothing in ``base_model``."""
    peft = spec.peft_config
    if peft is None:
        return
    tm = peft.get("target_modules")
    if tm is None:
        return   # PEFT picks the model type's defaults
    if isinstance(tm, (list, tuple, set)) and len(tm) == 0:
        raise ConfigError("peft_config.target_modules=[] adapts no module: name the layers to adapt "
                          "(e.g. ['q_proj', 'v_proj']) or use 'all-linear'")
    names = [n for n, _ in base_model.named_modules() if n]
    if isinstance(tm, (list, tuple, set)):
        missing = [t for t in tm if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            raise ConfigError(
                f"peft_config.target_modules {missing} match no module of base model "
                f"{spec.model_name!r}; its layers include {_leaf_names(base_model)}")
        return
    if isinstance(tm, str) and tm != "all-linear":
        try:
            pattern = re.compile(tm)
        except re.error as exc:
            raise ConfigError(f"peft_config.target_modules={tm!r} is not a valid regex: {exc}") from None
        if not any(pattern.fullmatch(n) for n in names):
            raise ConfigError(
                f"peft_config.target_modules={tm!r} (a regex, matched against full module names) "
                f"matches no module of base model {spec.model_name!r}; its layers include "
                f"{_leaf_names(base_model)}")


def _leaf_names(model, limit: int = 12) -> list[str]:
    import torch

    seen: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or type(module).__name__ == "Conv1D":
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in seen and not leaf.isdigit():
                seen.append(leaf)
    return seen[:limit]


def check_rows(spec, dataset, name: str, tokenizer, cache: dict | None = None) -> None:
    """Tokenize the text columns of the first rows as the run reads them: after a row-mapper
    ``formatting_func``, or the texts of TRL's string form (both taken from ``cache``, where
    run_fit keeps what the function returned, so it is never called again: a function that keeps
    state must see the calls TRL makes, no others)."""
    if dataset is None:
        return
    mapper = spec.formatting_func
    if mapper is not None and cache is not None:
        from rapidfire_nb.engine.formatting import formatted, texts_of

        texts = texts_of(spec, dataset, cache, name)
        if texts is not None:
            dataset = texts.select_columns(["text"])
        else:
            dataset = formatted(spec, dataset, cache, name)
        mapper = None
    n = min(len(dataset), ROWS_CHECKED)
    rows: list[dict] = []
    for i in range(n):
        row = dict(dataset[i])
        if mapper is not None:
            try:
                out = spec.formatting_func(copy.deepcopy(row))
            except Exception as exc:  # noqa: BLE001 - the user's function: say where it broke
                raise ConfigError(f"formatting_func raised on {name} row {i}: "
                                  f"{type(exc).__name__}: {exc}") from exc
            if isinstance(out, str):
                row = {"text": out}
            elif isinstance(out, dict):
                row.update(out)
            elif isinstance(out, (list, tuple)) and out and all(isinstance(x, str) for x in out):
                row = {"text": out[0]}   # TRL's batched form returns a list of strings
            else:
                raise ConfigError(f"formatting_func returned {type(out).__name__} for {name} row {i}; "
                                  "expected a dict of columns or a string")
        for col in _TEXT_COLUMNS:
            if col in row:
                _check_text(row[col], f"{name} row {i}, column {col!r}", tokenizer)
        rows.append(row)
    _check_truncation(spec, rows, len(dataset), name, tokenizer)


def _sft_drop_limit(spec) -> int | None:
    """The prompt length (tokens) from which TRL's SFT preparation drops a prompt-completion row,
    or None when it drops none: it truncates each row to ``max_length`` (keep_start) and then
    drops the rows left without a completion token, unless packing or a full-sequence loss."""
    if spec.trainer_type != "SFT":
        return None
    import dataclasses

    from trl import SFTConfig

    defaults = {f.name: f.default for f in dataclasses.fields(SFTConfig)}
    args = {k: spec.training_args.get(k, defaults.get(k)) for k in
            ("max_length", "truncation_mode", "packing", "completion_only_loss")}
    if (args["max_length"] is None or args["packing"] or args["completion_only_loss"] is False
            or args["truncation_mode"] != "keep_start"):
        return None
    return int(args["max_length"])


def _check_truncation(spec, rows: list[dict], n_rows: int, name: str, tokenizer) -> None:
    limit = _sft_drop_limit(spec)
    if limit is None:
        return
    long = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, str) and "completion" in row:
            n = len(tokenizer(prompt)["input_ids"])
            if n >= limit:
                long.append((i, n))
    if not long:
        return
    i, n = max(long, key=lambda x: x[1])
    why = (f"its prompt alone has at least max_length={limit} tokens (row {i}: {n:,}), so truncating "
           "to max_length (truncation_mode='keep_start') leaves no completion token to learn from, "
           "and TRL drops the row. Raise max_length, shorten the prompts, or use "
           "truncation_mode='keep_end'")
    if len(long) == len(rows) == n_rows:
        raise ConfigError(f"{name}: TRL would drop every row ({n_rows}): {why}")
    import warnings

    from rapidfire_nb.errors import RapidFireConfigWarning

    warnings.warn(f"{name}: TRL will drop {len(long)} of the first {len(rows)} rows checked "
                  f"(of {n_rows}): {why}", RapidFireConfigWarning, stacklevel=3)


def _check_text(value, where: str, tokenizer) -> None:
    if isinstance(value, str):
        _tokenize(value, where, tokenizer)
        return
    if isinstance(value, (list, tuple)):   # a conversation
        for j, msg in enumerate(value):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise ConfigError(f"{where}: message {j} is {type(msg).__name__} {msg!r:.80}; a "
                                  "conversation is a list of {'role': ..., 'content': ...} dicts")
            content = msg.get("content")
            if isinstance(content, str):
                _tokenize(content, f"{where}, message {j}", tokenizer)
            elif content is not None and not isinstance(content, list):
                raise ConfigError(f"{where}: message {j} has content of type "
                                  f"{type(content).__name__}; expected text")
        return
    raise ConfigError(f"{where} is {type(value).__name__} {value!r:.80}; expected text or a "
                      "conversation (list of messages), so it cannot be tokenized")


def _tokenize(text: str, where: str, tokenizer) -> None:
    try:
        tokenizer(text)
    except Exception as exc:  # noqa: BLE001 - any tokenizer failure is the row's problem here
        raise ConfigError(f"{where} cannot be tokenized: {type(exc).__name__}: {exc}") from exc


def check_model_has_weights(spec, model) -> None:
    """Refuse a base model whose weights are on the ``meta`` device (made under
    ``init_empty_weights`` or ``torch.device("meta")``, never loaded): it has shapes but no
    values, and training it failed deep in the engine with torch's "Cannot copy out of meta
    tensor"."""
    params = getattr(model, "named_parameters", None)
    if params is None:
        return
    empty = [name for name, p in params() if getattr(p, "is_meta", False)]
    if empty:
        raise ConfigError(
            f"create_model returned base model {spec.model_name!r} with {len(empty)} parameters on "
            f"the meta device (e.g. {empty[0]!r}): they have shapes but no values. Load the weights "
            "in create_model (from_pretrained, or load_state_dict after init_empty_weights) before "
            "returning the model")


def check_before_training(specs, bases_for, train_dataset, eval_dataset, cache: dict | None = None) -> None:
    """Every check above, for every run; ``bases_for(spec)`` gives the loaded base (model,
    tokenizer). Raises the first ``ConfigError``, naming the run."""
    from rapidfire_nb.engine.export import remember_base
    from rapidfire_nb.engine.genconfig import check_generation_settings

    done_rows: set = set()
    for i, spec in enumerate(specs, start=1):
        model, tokenizer = bases_for(spec)
        # what a run's final checkpoint is built from when it completes (export.py)
        remember_base(spec, model, tokenizer)
        try:
            check_model_has_weights(spec, model)
            check_target_modules(spec, model)
            if spec.generation_config:
                check_generation_settings(dict(spec.generation_config))
            key = (spec.base_key(), id(spec.formatting_func))
            if key not in done_rows:
                done_rows.add(key)
                check_rows(spec, train_dataset, "train_dataset", tokenizer, cache)
                check_rows(spec, eval_dataset, "eval_dataset", tokenizer, cache)
        except ConfigError as exc:
            raise ConfigError(f"run {i}: {exc}") from exc


def check_sample_generation(specs, bases_for, explicit: list | None, eval_dataset, cache: dict,
                            run_ids: list | None = None) -> None:
    """Before training: for each distinct generation setting of the runs that will answer sample
    prompts, every prompt generates one token on the run's base model, so settings or prompts
    that cannot run (a zero beam count, a malformed chat message, text the tokenizer refuses)
    are refused here, naming the run and the prompt, instead of failing the run after its first
    chunk. The default prompts (the first eval rows of a run with a ``generation_config``) are
    not the user's choice: a row that cannot be asked is skipped, and a warning says which and
    why, as it does for a prompt or reference cut to what the log shows; only settings that
    cannot generate at all are refused. ``run_ids``: the runs' ids when they are not 1..n (a
    clone)."""
    import json

    from rapidfire_nb.engine.formatting import formatted
    from rapidfire_nb.engine.generation import (default_pairs, generate, prompt_settings, prompt_text,
                                                sample_kwargs, shown_pairs, with_references)
    from rapidfire_nb.engine.sharding import is_sharded

    tried: set = set()
    said: set = set()
    for i, spec in zip(run_ids or range(1, len(specs) + 1), specs):
        if is_sharded(spec):
            continue
        if explicit is None and (spec.generation_config is None or eval_dataset is None):
            continue
        loaded = bases_for(spec)
        tokenizer = loaded[1] if loaded is not None else None
        notes: list = []
        # the rows as the run reads them (formatting_func's output beside the columns)
        rows = formatted(spec, eval_dataset, cache, "eval_dataset") if eval_dataset is not None else None
        if explicit is not None:
            pairs, where = with_references(explicit, rows), "sample_prompts"
        else:
            pairs, where = default_pairs(spec, rows, tokenizer=tokenizer, notes=notes), "eval prompt"
        notes += shown_pairs(pairs)[2]
        if explicit is None and not pairs:
            notes.append("no eval row can be asked: this run answers no sample prompt")
        key = (spec.base_key(), json.dumps([sample_kwargs(spec), prompt_settings(spec)], sort_keys=True,
                                           default=repr), id(spec.formatting_func))
        if notes and key not in said:
            said.add(key)
            import warnings

            from rapidfire_nb.errors import RapidFireConfigWarning

            warnings.warn(RapidFireConfigWarning(
                f"run {i}: sample prompts: " + "; ".join(notes[:6])
                + (f"; and {len(notes) - 6} more" if len(notes) > 6 else "")), stacklevel=3)
        if not pairs:
            continue
        kwargs = {**sample_kwargs(spec), "max_new_tokens": 1}
        settings = prompt_settings(spec)
        if key in tried:
            continue
        tried.add(key)
        if loaded is None:
            # a base not loaded in this process: nothing to try the settings on; one that cannot
            # generate then fails its run at the run's first chunk, as without this check
            continue
        model, tokenizer = loaded
        what = "its generation_config" if spec.generation_config else "the default generation settings"
        for j, (prompt, _) in enumerate(pairs):
            try:
                generate(model, tokenizer, [prompt], kwargs, 1, 0, settings)
            except Exception as exc:  # noqa: BLE001 - whatever generate raises, said before training
                shown = prompt_text(prompt)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                name = f"{where}[{j}]" if where == "sample_prompts" else f"{where} {j + 1}"
                raise ConfigError(
                    f"run {i}: cannot generate for {name} ({shown!r}) with {what}: "
                    f"{type(exc).__name__}: {exc}. Fix it, or pass sample_prompts=[] to run_fit to "
                    "ask no sample prompts") from None
