"""Local stand-ins for the hub, for the drop-in tests: a tiny Llama saved under a model name, so
that ``AutoModelForCausalLM.from_pretrained(name, **model_kwargs)`` runs as RapidFire code runs
it (``device_map="auto"``, ``dtype="auto"``, quantization configs), and small in-code datasets
shaped like the ones RapidFire's tutorials and the TRL docs load."""

from __future__ import annotations

import random

from rapidfire_nb.demo_data import ANIMALS, WORDS, make_tiny_model_and_tokenizer

_SAVED: dict[str, str] = {}


def local_model_dir(root, name: str, seed: int = 0, hidden_size: int = 64) -> str:
    """A tiny model and tokenizer saved on disk, standing in for the hub model ``name``
    (hidden size 64: bitsandbytes quantizes in blocks of 64 values)."""
    if name in _SAVED:
        return _SAVED[name]
    model, tok = make_tiny_model_and_tokenizer(hidden_size=hidden_size, seed=seed)
    path = root / name.replace("/", "__")
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    _SAVED[name] = str(path)
    return str(path)


def hub(root, *names: str) -> dict[str, str]:
    """{hub name: local folder}; each name gets its own weights (a different seed)."""
    return {n: local_model_dir(root, n, seed=i) for i, n in enumerate(names)}


def customer_support_rows(n: int, seed: int = 0):
    """Rows shaped like bitext/Bitext-customer-support-llm-chatbot-training-dataset."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        w = rng.choice(WORDS + ANIMALS)
        rows.append({"flags": "B", "instruction": f"I want to cancel order {w} {i}",
                     "category": "ORDER", "intent": "cancel_order",
                     "response": f"Order {w} is cancelled."})
    return Dataset.from_list(rows)


def ultrafeedback_rows(n: int, seed: int = 0):
    """Rows shaped like trl-lib/ultrafeedback_binarized: implicit prompt, conversational."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        w = rng.choice(WORDS + ANIMALS)
        user = {"role": "user", "content": f"Reverse the word: {w}"}
        rows.append({"chosen": [user, {"role": "assistant", "content": w[::-1]}],
                     "rejected": [user, {"role": "assistant", "content": w}],
                     "score_chosen": 8.0, "score_rejected": 3.0})
    return Dataset.from_list(rows)


def gsm8k_rows(n: int, seed: int = 0):
    """Rows shaped like openai/gsm8k 'main': a question and a worked answer ending in '#### N'."""
    from datasets import Dataset

    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randrange(10), rng.randrange(10)
        rows.append({"question": f"What is {a} plus {b}?",
                     "answer": f"{a} plus {b} makes {a + b}.\n#### {a + b}"})
    return Dataset.from_list(rows)
