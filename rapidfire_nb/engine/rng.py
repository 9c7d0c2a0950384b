"""Per-run random number streams: every run owns one; swapping a run in restores it, swapping out
captures it (torch CPU and CUDA, numpy, python). Evaluation and generation run inside
``rng_fork`` so they never disturb the training stream."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def capture_rng() -> dict:
    state = {"torch": torch.random.get_rng_state(), "numpy": np.random.get_state(),
             "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    torch.random.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seeded_rng(seed: int) -> dict:
    """The RNG state a fresh run starts from: a function of its seed only."""
    saved = capture_rng()
    try:
        seed = seed % (2**32)
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        return capture_rng()
    finally:
        restore_rng(saved)


@contextlib.contextmanager
def rng_fork():
    """Run a block (evaluation, generation) without disturbing the caller's RNG streams."""
    saved = capture_rng()
    try:
        yield
    finally:
        restore_rng(saved)


def derive_seed(seed: int, fingerprint: str) -> int:
    return (int(seed) * 1_000_003 + int(fingerprint[:12], 16)) % (2**31 - 1)
