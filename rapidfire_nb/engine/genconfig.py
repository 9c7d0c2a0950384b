"""``generation_config`` checked as transformers reads it, without importing torch at import time.

Used by the config layer (``RFModelConfig``, ``clone_modify``) and by the engine's checks before
training, so it lives here, below both.
"""

from __future__ import annotations

import difflib
import warnings

from rapidfire_nb.errors import ConfigError


def _did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.75)
    return (" Did you mean " + " or ".join(repr(c) for c in close) + "?") if close else ""


# RapidFire AI reads these from generation_config to shape the prompts its evaluation generates
# from; they are not arguments of generate(), so they are split off before transformers sees them.
PROMPT_KEYS = ("max_input_length", "add_generation_prompt", "truncation_side")
PROMPT_DEFAULTS = {"max_input_length": None, "add_generation_prompt": True, "truncation_side": "left"}


def split_prompt_settings(gc: dict) -> tuple[dict, dict]:
    """(what goes to ``generate``, the prompt settings with RapidFire's defaults filled in)."""
    gen = {k: v for k, v in gc.items() if k not in PROMPT_KEYS}
    return gen, {**PROMPT_DEFAULTS, **{k: gc[k] for k in PROMPT_KEYS if k in gc}}


def check_prompt_settings(gc: dict) -> None:
    """The prompt settings' values (concrete ones: a grid's List is checked per run)."""
    if "max_input_length" in gc:
        v = gc["max_input_length"]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"generation_config.max_input_length must be a positive int (the prompt "
                              f"tokens kept) or None, got {v!r}")
    if "add_generation_prompt" in gc and not isinstance(gc["add_generation_prompt"], bool):
        raise ConfigError(f"generation_config.add_generation_prompt must be True or False, got "
                          f"{gc['add_generation_prompt']!r}")
    if "truncation_side" in gc and gc["truncation_side"] not in ("left", "right"):
        raise ConfigError(f"generation_config.truncation_side must be 'left' or 'right', got "
                          f"{gc['truncation_side']!r}")


def check_generation_keys(gc: dict) -> None:
    """Every key is a ``transformers.GenerationConfig`` setting or one of RapidFire's prompt
    settings; the message names the first that is not."""
    from transformers import GenerationConfig

    known = set(GenerationConfig().to_dict())
    for k in gc:
        if k not in known and k not in PROMPT_KEYS:
            raise ConfigError(f"'generation_config.{k}' is not a generation setting."
                              + _did_you_mean(k, known | set(PROMPT_KEYS)))


def check_generation_settings(gc: dict) -> None:
    """Keys and values as ``transformers.GenerationConfig`` accepts them at run time."""
    from transformers import GenerationConfig

    check_generation_keys(gc)
    check_prompt_settings(gc)
    gen, _ = split_prompt_settings(gc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GenerationConfig(**gen).validate(strict=False)   # as run time: sampling-only flags warn, not fail
    except TypeError:
        pass  # older transformers: validate() has no strict flag; construction was the check
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"generation_config rejected by transformers.GenerationConfig: {exc}") from exc
