"""Generation-based evaluation: the user's ``compute_metrics`` on texts the run generates.

For any trainer type, when ``RFModelConfig(compute_metrics=fn, generation_config={...})`` is given,
after every chunk the run generates a completion for each eval prompt (left padding, the chat
template when the data is conversational, greedy with ``max_new_tokens=32`` unless
``generation_config`` says otherwise) and logs ``fn((predictions, references))`` with an ``eval_``
prefix. Prompts and references come from the eval dataset's columns:

- ``messages``: the prompt is the conversation before the last assistant message, the reference
  that message's content;
- ``prompt`` with one of ``completion``, ``chosen``, ``answer``, ``solution``, ``reference``,
  ``label``, ``target`` (first present wins; a list of messages gives its last message's content).

Predictions and references are passed as they are (no stripping), in eval-dataset order. The
training RNG is not touched: generation runs in ``rng_fork`` from a fixed seed, so sampled
generations are reproducible and every run samples from the same stream.
"""

from __future__ import annotations

import difflib
import math
import numbers
from typing import Any

import torch

from rapidfire_nb.engine.rng import rng_fork
from rapidfire_nb.errors import ConfigError

REFERENCE_COLUMNS = ("completion", "chosen", "answer", "solution", "reference", "label", "target")
DEFAULT_GENERATION = {"max_new_tokens": 32, "do_sample": False}
SAMPLING_ONLY = ("temperature", "top_p", "top_k", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


def _is_messages(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def _content(value) -> Any:
    """A reference from a column value: the text, or the content of the last chat message."""
    if _is_messages(value):
        return value[-1].get("content")
    return value


def split_example(row: dict) -> tuple[Any, Any]:
    """(prompt, reference) of one eval row; prompt is a string or a list of chat messages."""
    if "messages" in row and _is_messages(row["messages"]):
        msgs = row["messages"]
        last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=None)
        if last is None or last == 0:
            raise ConfigError("eval_dataset: a 'messages' conversation has no assistant message after a "
                              "prompt; compute_metrics needs one as the reference")
        return msgs[:last], msgs[last].get("content")
    if "prompt" not in row and "chosen" in row and "rejected" in row:
        # TRL's implicit-prompt preference form: the prompt is the turns both answers share
        from trl.data_utils import extract_prompt

        row = {**row, **extract_prompt({"chosen": row["chosen"], "rejected": row["rejected"]})}
    if "prompt" in row:
        for col in REFERENCE_COLUMNS:
            if col in row:
                return row["prompt"], _content(row[col])
    raise ConfigError(
        f"eval_dataset has columns {sorted(row)}; compute_metrics needs prompts and references: a "
        f"'messages' column, or 'prompt' with one of {', '.join(REFERENCE_COLUMNS)}")


def generation_kwargs(spec) -> dict:
    """The keyword arguments passed to ``generate`` (user's ``generation_config`` over defaults)."""
    user = dict(spec.generation_config or {})
    kwargs = dict(DEFAULT_GENERATION)
    if "max_length" in user:
        kwargs.pop("max_new_tokens")
    kwargs.update(user)
    return kwargs


def check_generation_config(spec) -> None:
    """Refuse unknown or inconsistent generation settings before training starts."""
    from transformers import GenerationConfig

    user = spec.generation_config or {}
    known = set(GenerationConfig().to_dict()) | {"max_new_tokens", "min_new_tokens", "max_length"}
    for key in user:
        if key not in known:
            near = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"generation_config: unknown generation setting {key!r}{hint}")
    kwargs = generation_kwargs(spec)
    try:
        GenerationConfig(**kwargs).validate(strict=False)
    except ValueError as exc:
        lines = [ln.strip(" -") for ln in str(exc).splitlines()
                 if ln.strip() and "GenerationConfig is invalid" not in ln and "pretrained model" not in ln]
        raise ConfigError(f"generation_config is invalid: {' '.join(lines)}") from None
    ignored = [k for k in SAMPLING_ONLY if k in user]
    if ignored and not kwargs.get("do_sample"):
        # what transformers does (and RapidFire's tutorials rely on): greedy, the flags unused
        import warnings

        from rapidfire_nb.automl.policy import RapidFireConfigWarning

        warnings.warn(RapidFireConfigWarning(
            f"generation_config: {', '.join(ignored)} only apply to sampling; without do_sample=True "
            "evaluation generates greedily and ignores them"), stacklevel=3)


def check_eval_dataset(spec, dataset) -> None:
    """Before training: ``compute_metrics`` is callable and the eval rows give prompts and references."""
    if spec.compute_metrics is None:
        return
    if not callable(spec.compute_metrics):
        raise ConfigError(f"compute_metrics must be callable, got {type(spec.compute_metrics).__name__}")
    if dataset is None or len(dataset) == 0:
        raise ConfigError("compute_metrics needs an eval_dataset to generate on")
    split_example(dataset[0])
    check_generation_config(spec)


def _encode(tokenizer, prompt) -> list[int]:
    if _is_messages(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, str):
        raise ConfigError(f"eval prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    return tokenizer(prompt)["input_ids"]


def generate(model, tokenizer, prompts: list, kwargs: dict, batch_size: int, seed: int) -> list[str]:
    """Decoded completions (new tokens only) of ``prompts``; the caller's RNG is left untouched."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = {"pad_token_id": pad_id, **kwargs}
    if "eos_token_id" not in kwargs and tokenizer.eos_token_id is not None:
        kwargs["eos_token_id"] = tokenizer.eos_token_id
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        with rng_fork(), torch.no_grad():
            torch.manual_seed(int(seed) % (2**32))
            for start in range(0, len(prompts), max(1, batch_size)):
                ids = [_encode(tokenizer, p) for p in prompts[start:start + batch_size]]
                width = max(len(x) for x in ids)
                input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids], device=device)
                mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)
                gen = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
                out += tokenizer.batch_decode(gen[:, width:], skip_special_tokens=True)
    finally:
        if was_training:
            model.train()
    return out


def _as_float(key: str, value) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if hasattr(value, "item") and not isinstance(value, (bool, numbers.Number)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            pass
    if isinstance(value, (bool, numbers.Number)) and not isinstance(value, complex):
        return float(value)
    raise TypeError(f"compute_metrics returned {type(value).__name__} for {key!r}; metric values must be numbers")


def run_compute_metrics(fn, predictions: list[str], references: list) -> dict[str, float]:
    """Call the user's ``compute_metrics((predictions, references))`` and check what it returns."""
    result = fn((predictions, references))
    if not isinstance(result, dict):
        raise TypeError(f"compute_metrics must return a dict of metric name -> number, got {type(result).__name__}")
    out = {}
    for key, value in result.items():
        name = str(key)
        v = _as_float(name, value)
        out[name if name.startswith("eval_") else f"eval_{name}"] = v if math.isfinite(v) else float("nan")
    return out


def generation_metrics(rt) -> dict[str, float]:
    """Generation-based metrics of one run (a ``RunTrainer``) on its raw eval dataset; {} if not asked."""
    spec = rt.spec
    dataset = getattr(rt, "raw_eval_dataset", None)
    if spec.compute_metrics is None or dataset is None:
        return {}
    pairs = [split_example(dataset[i]) for i in range(len(dataset))]
    prompts = [p for p, _ in pairs]
    references = [r for _, r in pairs]
    batch_size = int(getattr(rt.args, "per_device_eval_batch_size", 8) or 8)
    predictions = generate(rt.model, rt.tokenizer, prompts, generation_kwargs(spec), batch_size, rt.seed)
    return run_compute_metrics(spec.compute_metrics, predictions, references)
