"""Generation-based evaluation: the user's ``compute_metrics`` on texts the run generates.

As in RapidFire AI, ``compute_metrics`` means one of two things:

- with ``generation_config`` (any trainer type), after every chunk the run generates a completion
  for each eval prompt (left padding, the chat template when the data is conversational, greedy
  with ``max_new_tokens=32`` unless ``generation_config`` says otherwise) and logs
  ``fn((predictions, references))`` with an ``eval_`` prefix (this module). RapidFire's prompt
  settings in ``generation_config`` are honoured as it defines them: ``max_input_length`` (prompt
  tokens kept; by default the tokenizer's ``model_max_length``, or 4096 when unset, less
  ``max_new_tokens``, never under 64), ``truncation_side`` (which end a long prompt loses,
  default ``"left"``) and ``add_generation_prompt`` (for the chat template, default True);
- without it, for SFT, ``fn`` is the transformers Trainer's ``compute_metrics``: it gets an
  ``EvalPrediction`` (the eval logits and labels) after every chunk (``adapters/base.py``). DPO and
  GRPO runs without ``generation_config`` generate with the defaults, as before.

Prompts and references come from the eval dataset's columns (after ``formatting_func``, whose
output is added beside the original columns), the first form that fits:

- ``messages``: the prompt is the conversation before the last assistant message, the reference
  that message's content;
- ``input``/``output`` (RapidFire's first form);
- ``prompt`` with one of ``completion``, ``chosen``, ``answer``, ``solution``, ``reference``,
  ``label``, ``target`` (first present wins; a list of messages gives its last message's content);
- ``text``: the text is the prompt, the reference ``response`` (else ``instruction``, else the
  text), as RapidFire takes it;
- ``instruction``/``response``.

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

from rapidfire_nb.engine.genconfig import PROMPT_KEYS, check_prompt_settings, split_prompt_settings
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
    if "input" in row and "output" in row:
        return row["input"], row["output"]
    if "prompt" in row:
        for col in REFERENCE_COLUMNS:
            if col in row:
                return row["prompt"], _content(row[col])
    if "text" in row:
        return row["text"], row.get("response", row.get("instruction", row["text"]))
    if "instruction" in row and "response" in row:
        return row["instruction"], row["response"]
    raise ConfigError(
        f"eval_dataset has columns {sorted(row)}; compute_metrics with generation_config needs "
        f"prompts and references: a 'messages' column, 'input'/'output', 'prompt' with one of "
        f"{', '.join(REFERENCE_COLUMNS)}, 'text', or 'instruction'/'response' (a formatting_func "
        f"may add them)")


def generates(spec) -> bool:
    """True when ``compute_metrics`` is evaluated on generations (not on the Trainer's logits)."""
    if spec.compute_metrics is None:
        return False
    return spec.generation_config is not None or spec.trainer_type != "SFT"


def on_logits(spec) -> bool:
    """True when ``compute_metrics`` is the transformers Trainer's (SFT without generation_config)."""
    return spec.compute_metrics is not None and not generates(spec)


def generation_kwargs(spec) -> dict:
    """The keyword arguments passed to ``generate`` (user's ``generation_config`` over defaults)."""
    user, _ = split_prompt_settings(dict(spec.generation_config or {}))
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
        if key not in known and key not in PROMPT_KEYS:
            near = difflib.get_close_matches(key, sorted(known | set(PROMPT_KEYS)), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(f"generation_config: unknown generation setting {key!r}{hint}")
    check_prompt_settings(user)
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

        from rapidfire_nb.errors import RapidFireConfigWarning

        warnings.warn(RapidFireConfigWarning(
            f"generation_config: {', '.join(ignored)} only apply to sampling; without do_sample=True "
            "evaluation generates greedily and ignores them"), stacklevel=3)


def check_eval_dataset(spec, dataset) -> None:
    """Before training: ``compute_metrics`` is callable and the eval rows give prompts and references."""
    if spec.compute_metrics is None:
        return
    if not callable(spec.compute_metrics):
        raise ConfigError(f"compute_metrics must be callable, got {type(spec.compute_metrics).__name__}")
    if not generates(spec):
        return    # the Trainer's compute_metrics: any data SFT trains on gives logits and labels
    if dataset is None or len(dataset) == 0:
        raise ConfigError("compute_metrics needs an eval_dataset to generate on")
    split_example(dataset[0])
    check_generation_config(spec)


def prompt_settings(spec) -> dict:
    """RapidFire's prompt settings of a run's ``generation_config``, defaults filled in."""
    return split_prompt_settings(dict(spec.generation_config or {}))[1]


def prompt_limit(tokenizer, settings: dict, kwargs: dict) -> int:
    """Prompt tokens kept, as RapidFire resolves it: ``max_input_length`` when given, else the
    tokenizer's context (4096 when the tokenizer leaves it unset) less the tokens to generate."""
    if settings.get("max_input_length"):
        return int(settings["max_input_length"])
    context = getattr(tokenizer, "model_max_length", None)
    if not isinstance(context, int) or context <= 0 or context >= 10**9:
        context = 4096
    return max(64, context - int(kwargs.get("max_new_tokens", 0) or 0))


def _encode(tokenizer, prompt, add_generation_prompt: bool = True, limit: int | None = None,
            side: str = "left") -> list[int]:
    if _is_messages(prompt):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=add_generation_prompt,
                                             tokenize=False)
        special = False   # the template already holds the special tokens
    elif isinstance(prompt, str):
        text, special = prompt, True
    else:
        raise ConfigError(f"eval prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    if limit is None:
        return tokenizer(text, add_special_tokens=special)["input_ids"]
    # the tokenizer's own truncation, as RapidFire's: it cuts the text and keeps the special tokens
    # it adds (a BOS stays first), where cutting the ids afterwards would drop them
    before = getattr(tokenizer, "truncation_side", "right")
    tokenizer.truncation_side = side
    try:
        return tokenizer(text, add_special_tokens=special, truncation=True, max_length=limit)["input_ids"]
    finally:
        tokenizer.truncation_side = before


def generate(model, tokenizer, prompts: list, kwargs: dict, batch_size: int, seed: int,
             settings: dict | None = None) -> list[str]:
    """Decoded completions (new tokens only) of ``prompts``; the caller's RNG is left untouched.
    ``settings``: RapidFire's prompt settings (``prompt_settings``); RapidFire's defaults if None."""
    settings = split_prompt_settings(settings or {})[1]
    limit = prompt_limit(tokenizer, settings, kwargs)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    kwargs = {"pad_token_id": pad_id, **kwargs}
    if "eos_token_id" not in kwargs and tokenizer.eos_token_id is not None:
        kwargs["eos_token_id"] = tokenizer.eos_token_id
    if kwargs.get("stop_strings"):
        kwargs["tokenizer"] = tokenizer   # transformers matches stop strings through it
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        with rng_fork(), torch.no_grad():
            torch.manual_seed(int(seed) % (2**32))
            for start in range(0, len(prompts), max(1, batch_size)):
                ids = [_encode(tokenizer, p, settings["add_generation_prompt"], limit, settings["truncation_side"])
                       for p in prompts[start:start + batch_size]]
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


def run_compute_metrics(fn, predictions, references) -> dict[str, float]:
    """Call the user's ``compute_metrics((predictions, references))`` and check what it returns."""
    return checked_metrics(fn((predictions, references)))


def checked_metrics(result) -> dict[str, float]:
    """What ``compute_metrics`` returned, as ``eval_``-prefixed floats (NaN for non-finite)."""
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
    if not generates(spec) or dataset is None:
        return {}
    pairs = [split_example(dataset[i]) for i in range(len(dataset))]
    prompts = [p for p, _ in pairs]
    references = [r for _, r in pairs]
    batch_size = int(getattr(rt.args, "per_device_eval_batch_size", 8) or 8)
    predictions = generate(rt.model, rt.tokenizer, prompts, generation_kwargs(spec), batch_size, rt.seed,
                           prompt_settings(spec))
    return run_compute_metrics(spec.compute_metrics, predictions, references)


# -- sample generations: the same few prompts, every run, after every chunk ----------------------

MAX_SAMPLE_PROMPTS = 8          # bounds the work: prompts x max_new_tokens per run per chunk
DEFAULT_SAMPLE_PROMPTS = 4      # taken from the eval set when a run has a generation_config
MAX_SAMPLE_PROMPT_CHARS = 2000  # what the panel carries of one text
MAX_SAMPLE_NEW_TOKENS = 256     # per answer, whatever the run's generation_config allows


def check_sample_prompts(value) -> list | None:
    """run_fit's ``sample_prompts``: None (the default: runs with a ``generation_config`` sample
    the first eval prompts), ``[]`` (no sample generations), or up to 8 prompts, each a non-empty
    string or a list of chat messages. Returns ``[(prompt, None), ...]`` or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"sample_prompts must be a list of prompts (strings or chat message lists), "
                          f"got {type(value).__name__}")
    if len(value) > MAX_SAMPLE_PROMPTS:
        raise ConfigError(f"sample_prompts has {len(value)} prompts; at most {MAX_SAMPLE_PROMPTS} (every "
                          "run generates for each of them after every chunk)")
    for i, prompt in enumerate(value):
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ConfigError(f"sample_prompts[{i}] is blank")
            if len(prompt) > MAX_SAMPLE_PROMPT_CHARS:
                raise ConfigError(f"sample_prompts[{i}] has {len(prompt)} characters; at most "
                                  f"{MAX_SAMPLE_PROMPT_CHARS}")
        elif _is_messages(prompt):
            bad = [m for m in prompt if not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str)]
            if bad:
                raise ConfigError(f"sample_prompts[{i}]: every chat message needs a string 'role' and "
                                  "a string 'content'")
            if not any(m["content"].strip() for m in prompt):
                raise ConfigError(f"sample_prompts[{i}] is blank (no message has any content)")
            size = len(prompt_text(prompt))
            if size > MAX_SAMPLE_PROMPT_CHARS:
                raise ConfigError(f"sample_prompts[{i}] has {size} characters in its messages; at most "
                                  f"{MAX_SAMPLE_PROMPT_CHARS}")
        else:
            raise ConfigError(f"sample_prompts[{i}] must be a string or a list of chat messages "
                              f"({{'role': ..., 'content': ...}}), got {type(prompt).__name__}")
    return [(p, None) for p in value]


def prompt_text(prompt) -> str:
    """A prompt as the panel and the report show it (a conversation as ``role: content`` lines)."""
    if _is_messages(prompt):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt)
    return str(prompt)


DEFAULT_SCAN_ROWS = 32          # eval rows looked at for the default prompts (a row may be skipped)
_CUT = "\u2026 [{n:,} more characters not shown]"


def shown(text: str | None, limit: int = MAX_SAMPLE_PROMPT_CHARS) -> str | None:
    """``text`` as logged beside the answers: whole up to ``limit`` characters, else cut to
    ``limit`` with the cut said in the text itself (what the log reader and the panel accept)."""
    if text is None or len(text) <= limit:
        return text
    for width in range(limit, 0, -1):
        tail = _CUT.format(n=len(text) - width)
        if width + len(tail) <= limit:
            return text[:width] + tail
    return text[:limit]


def _message_key(prompt):
    if _is_messages(prompt):
        return ("messages", tuple((str(m.get("role")), str(m.get("content"))) for m in prompt))
    return ("text", prompt) if isinstance(prompt, str) else None


def sample_pairs(rt, explicit: list | None) -> list:
    """The (prompt, reference) pairs run ``rt`` generates for after each chunk ([]: none). A
    prompt of run_fit's ``sample_prompts`` that equals an eval prompt gets that row's reference
    (looked up once per run, not at every chunk)."""
    dataset = getattr(rt, "raw_eval_dataset", None)
    if explicit is None:
        return default_pairs(rt.spec, dataset, tokenizer=getattr(rt, "tokenizer", None))
    return with_references(explicit, dataset)


_REFERENCES: list = []   # [(sample prompts, eval dataset, pairs)]: the last few looked up


def with_references(explicit: list, dataset) -> list:
    """``explicit`` (run_fit's ``[(prompt, None), ...]``) with the reference of the first eval
    row whose prompt is the same (a string equal to the string, or the same chat messages).
    The eval set is read once per prompts and dataset (every run, every chunk asks again)."""
    if dataset is None or len(dataset) == 0 or not explicit:
        return list(explicit)
    for prompts, data, pairs in _REFERENCES:
        if prompts is explicit and data is dataset:
            return pairs
    wanted = {_message_key(p) for p, _ in explicit} - {None}
    refs: dict = {}

    def rows():
        if not hasattr(dataset, "iter"):   # not a datasets.Dataset: row by row
            yield from (dataset[i] for i in range(len(dataset)))
            return
        for batch in dataset.iter(batch_size=1000):   # a column read per batch, not per row
            for j in range(len(next(iter(batch.values()), []))):
                yield {k: v[j] for k, v in batch.items()}

    try:
        for row in rows() if wanted else ():
            prompt, ref = split_example(row)
            key = _message_key(prompt)
            if key in wanted and key not in refs:
                refs[key] = ref
                if len(refs) == len(wanted):
                    break
    except ConfigError:
        refs = {}   # rows of another form: no prompt to match
    pairs = [(p, refs.get(_message_key(p), r) if r is None else r) for p, r in explicit]
    _REFERENCES[:] = [*_REFERENCES[-3:], (explicit, dataset, pairs)]
    return pairs


def _unaskable(prompt, tokenizer, settings: dict | None) -> str | None:
    """Why an eval prompt cannot be asked (None when it can): a blank prompt, a malformed
    conversation, or one that encodes to no token (generate needs at least one)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            return "its prompt is empty" if not prompt else "its prompt is blank"
    elif _is_messages(prompt):
        if any(not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str) for m in prompt):
            return "a chat message lacks a string 'role' or 'content'"
        if not any(m["content"].strip() for m in prompt):
            return "no message of its prompt has any content"
    else:
        return f"its prompt is {type(prompt).__name__}, not text or chat messages"
    if tokenizer is None:
        return None
    settings = split_prompt_settings(settings or {})[1]
    try:
        ids = _encode(tokenizer, prompt, settings["add_generation_prompt"])
    except Exception as exc:  # noqa: BLE001 - whatever the tokenizer refuses, the row is skipped
        return f"its prompt cannot be tokenized ({type(exc).__name__}: {str(exc)[:80]})"
    if not ids:
        return "its prompt encodes to no token"
    return None


def default_pairs(spec, dataset, n: int = DEFAULT_SAMPLE_PROMPTS, tokenizer=None,
                  notes: list | None = None) -> list:
    """A run with a ``generation_config`` answers the first ``n`` eval rows that can be asked
    (of the first ``DEFAULT_SCAN_ROWS``); none when it has no ``generation_config`` or no eval
    set. A row that cannot be asked (no prompt in it, an empty prompt, one that encodes to no
    token with ``tokenizer``) is skipped, and ``notes`` gets a line saying which and why: a
    default must never stop a ``run_fit`` that did not ask for it."""
    if spec.generation_config is None or dataset is None or len(dataset) == 0:
        return []
    settings = prompt_settings(spec)
    pairs: list = []
    for i in range(min(len(dataset), DEFAULT_SCAN_ROWS)):
        if len(pairs) >= n:
            break
        try:
            prompt, ref = split_example(dataset[i])
        except ConfigError as exc:
            if notes is not None:
                notes.append(f"eval row {i + 1} skipped: {exc}")
            continue
        why = _unaskable(prompt, tokenizer, settings)
        if why is not None:
            if notes is not None:
                notes.append(f"eval row {i + 1} skipped: {why}")
            continue
        pairs.append((prompt, ref))
    return pairs


def shown_pairs(pairs: list) -> tuple[list, list, list]:
    """(prompts, references, notes) as logged: text, each at most ``MAX_SAMPLE_PROMPT_CHARS``
    characters (run_fit's limit on a sample prompt), and a note for each one cut."""
    prompts, refs, notes = [], [], []
    for j, (p, r) in enumerate(pairs):
        text = prompt_text(p)
        ref = r if r is None or isinstance(r, str) else prompt_text(r) if _is_messages(r) else str(r)
        prompts.append(shown(text))
        refs.append(shown(ref))
        for what, full in (("prompt", text), ("reference", ref)):
            if full is not None and len(full) > MAX_SAMPLE_PROMPT_CHARS:
                notes.append(f"sample {j + 1}'s {what} has {len(full):,} characters; the log, the panel "
                             f"and the report show its first {MAX_SAMPLE_PROMPT_CHARS:,} (the model is "
                             "asked the whole prompt)")
    return prompts, refs, notes


def sample_kwargs(spec) -> dict:
    """``generate``'s arguments for the sample prompts: the run's, one answer per prompt."""
    kwargs = generation_kwargs(spec)
    kwargs["num_return_sequences"] = 1
    # bounded: a generation_config made for long evaluation answers (or a max_length far past
    # the model's context) must not make every chunk of every run wait on its samples
    wanted = kwargs.pop("max_length", None) if "max_new_tokens" not in kwargs else kwargs["max_new_tokens"]
    try:
        wanted = int(wanted) if wanted is not None else DEFAULT_GENERATION["max_new_tokens"]
    except (TypeError, ValueError):
        wanted = DEFAULT_GENERATION["max_new_tokens"]
    kwargs.pop("max_length", None)
    kwargs["max_new_tokens"] = max(1, min(wanted, MAX_SAMPLE_NEW_TOKENS))
    return kwargs


def sample_generations(rt, explicit: list | None) -> dict | None:
    """The run's completions for its sample prompts (None when it has none), greedy unless its
    ``generation_config`` samples, in ``rng_fork``: the run's training never sees them."""
    from rapidfire_nb.engine.sharding import is_sharded

    pairs = sample_pairs(rt, explicit)
    if not pairs or is_sharded(rt.spec):
        # a sharded model generates only with every rank in step; its samples are not drawn
        return None
    kwargs = sample_kwargs(rt.spec)
    prompts = [p for p, _ in pairs]
    texts = generate(rt.model, rt.tokenizer, prompts, kwargs, len(prompts), rt.seed, prompt_settings(rt.spec))
    shown_prompts, refs, _ = shown_pairs(pairs)
    return {"prompts": shown_prompts, "references": refs, "texts": texts,
            "max_new_tokens": int(kwargs["max_new_tokens"])}
