"""Offline building blocks: a tiny Llama-architecture model, a byte-level BPE tokenizer trained
in-process, and small synthetic datasets with a learnable task.

Used by ``rapidfire demo``, the smoke mode of the notebooks, the benchmark and the tests, so that
nothing ever needs a model or dataset hub.
"""

from __future__ import annotations

import random
from functools import lru_cache

COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple"]
ANIMALS = ["cat", "dog", "fox", "owl", "bee", "cow", "pig", "bat", "eel", "yak", "emu", "ant"]
WORDS = ["apple", "river", "stone", "cloud", "light", "sugar", "tiger", "piano", "lemon", "grass",
         "honey", "metal", "ocean", "paper", "robot", "salt", "table", "water", "zebra", "wind"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def _corpus() -> list[str]:
    lines = []
    for w in WORDS + ANIMALS + COLORS:
        lines += [f"Reverse the word: {w}\nAnswer: {w[::-1]}", f"Spell {w} in capitals: {w.upper()}"]
    for a in range(20):
        for b in range(20):
            lines.append(f"What is {a} plus {b}? {a + b}")
    lines += ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    return lines


@lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus() * 3, trainer=trainer)
    return tok.to_str()


def make_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer (any text encodes), with pad/bos/eos and a chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        pad_token="<pad>", bos_token="<s>", eos_token="</s>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 512
    return tok


def make_tiny_model(tokenizer=None, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                    intermediate_size: int | None = None, seed: int = 0, dtype=None,
                    output_scale: float = 1.0):
    """A randomly initialised Llama-architecture causal LM; same seed, same weights.

    ``output_scale`` multiplies the output layer's random weights. At 1 (transformers' init, std
    0.02) the logits of this 64-wide model cannot grow past about +-1.3 whatever an adapter does to
    the hidden states (the final norm fixes their length and LoRA does not touch the output layer),
    so the eval loss of every run bottoms out near ln(vocabulary) - 1.2 even when its answers are
    right; the demo uses a larger scale so that the loss follows what a run has learned."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer or make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlamaForCausalLM(config)
        if output_scale != 1.0:
            with torch.no_grad():
                model.lm_head.weight.mul_(output_scale)
    finally:
        torch.random.set_rng_state(state)
    if dtype is not None:
        model = model.to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# The model the demo and the quickstart train (``RFModelConfig(model_kwargs=DEMO_MODEL_KWARGS)``):
# an output layer six times transformers' init, so that a run that learns the colours also
# becomes confident of them and its eval loss falls well below ln(vocabulary), while a run that
# learns slowly stays high: the eval curves tell the configs apart. (Measured: 1 epoch of 256
# rows, the demo's 4 configs: eval_loss 3.02, 3.26, 3.58, 2.39 at scale 6; 5.64 to 5.48 at 1.)
DEMO_MODEL_KWARGS = {"output_scale": 6.0}


def make_tiny_model_and_tokenizer(**model_kwargs):
    tokenizer = make_tokenizer()
    return make_tiny_model(tokenizer, **model_kwargs), tokenizer


# ``from_pretrained`` arguments that only say how to load or place a checkpoint. The tiny model is
# built in memory and the engine puts it on its device, so they have nothing to act on here; they
# are accepted so that a config written for a hub model runs unchanged on this stand-in.
_LOADING_ONLY = frozenset({
    "device_map", "max_memory", "offload_folder", "offload_state_dict", "low_cpu_mem_usage",
    "trust_remote_code", "revision", "cache_dir", "token", "use_auth_token", "local_files_only",
    "force_download", "attn_implementation", "quantization_config", "load_in_4bit", "load_in_8bit",
    "use_safetensors", "variant", "subfolder",
})


def _dtype(value):
    """A ``torch_dtype`` / ``dtype`` as ``from_pretrained`` reads it: ``"auto"`` keeps the
    checkpoint's own dtype, which for this in-memory model is float32."""
    import torch

    if value is None or value == "auto":
        return None
    if isinstance(value, str):
        found = getattr(torch, value.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise TypeError(f"tiny_create_model: torch_dtype={value!r} is not a torch dtype")
        return found
    return value


def tiny_create_model(model_config: dict):
    """A ``create_model`` for ``run_fit``: builds the tiny model offline from ``model_kwargs``.

    Besides ``make_tiny_model``'s own arguments (``hidden_size``, ``num_layers``, ``output_scale``,
    ...) it takes what a hub model's ``model_kwargs`` usually say, as ``from_pretrained`` would:
    ``torch_dtype`` / ``dtype`` (``"auto"`` is float32 here), ``use_cache``; and it accepts the
    loading-only ones (``device_map``, ``attn_implementation``, ``quantization_config``, ...),
    which have nothing to act on for a model built in memory (the engine places it)."""
    kwargs = dict(model_config.get("model_kwargs") or {})
    for key in _LOADING_ONLY:
        kwargs.pop(key, None)
    if "torch_dtype" in kwargs or "dtype" in kwargs:
        kwargs["dtype"] = _dtype(kwargs.pop("dtype", kwargs.pop("torch_dtype", None)))
    use_cache = kwargs.pop("use_cache", None)
    model, tokenizer = make_tiny_model_and_tokenizer(**kwargs)
    if use_cache is not None:
        model.config.use_cache = bool(use_cache)
    return model, tokenizer


# The "colors" task: one fixed colour per animal, a dozen facts a tiny model learns in a few
# dozen steps, so configs that learn faster or slower show it within the first chunk.
ANIMAL_COLORS = {a: COLORS[i % len(COLORS)] for i, a in enumerate(ANIMALS)}


def colors_prompt(animal: str) -> str:
    return f"What color is the {animal}?"


def make_sft_dataset(n: int, seed: int = 0, task: str = "reverse"):
    """Prompt/completion pairs of a small learnable task: word reversal ("reverse"), addition
    ("add") or each animal's colour ("colors", see ``ANIMAL_COLORS``)."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        if task == "colors":
            a = rng.choice(ANIMALS)
            rows.append({"prompt": colors_prompt(a), "completion": f" {ANIMAL_COLORS[a]}"})
        elif task == "add":
            a, b = rng.randrange(20), rng.randrange(20)
            rows.append({"prompt": f"What is {a} plus {b}?", "completion": f" {a + b}"})
        else:
            w = rng.choice(WORDS + ANIMALS)
            rows.append({"prompt": f"Reverse the word: {w}\nAnswer:", "completion": f" {w[::-1]}"})
    return Dataset.from_list(rows)


def make_demo_datasets(n_train: int = 256, n_eval: int = 32, seed: int = 0, task: str = "reverse"):
    return make_sft_dataset(n_train, seed=seed, task=task), make_sft_dataset(n_eval, seed=seed + 1, task=task)


def uniform_guess_loss(tokenizer) -> float:
    """The loss of a model that spreads its guess evenly over the vocabulary: ln(vocabulary size).
    An eval_loss below it means the run has learned something about the data."""
    import math

    return math.log(len(tokenizer))


def make_dpo_dataset(n: int, seed: int = 0):
    """Preference pairs: the reversed word is chosen, the unreversed one rejected."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        w = rng.choice(WORDS + ANIMALS)
        rows.append({"prompt": f"Reverse the word: {w}\nAnswer:", "chosen": f" {w[::-1]}", "rejected": f" {w}"})
    return Dataset.from_list(rows)


def make_grpo_dataset(n: int, seed: int = 0):
    """Prompts with their answers (extra column passed to reward functions)."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"prompt": f"What is {a} plus {b}?", "answer": str(a + b)})
    return Dataset.from_list(rows)
