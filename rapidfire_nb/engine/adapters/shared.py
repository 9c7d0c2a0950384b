"""What DPO and GRPO runs share: per-run patches on a shared base model, and frozen references.

TRL's constructors change the model they are given: they wrap its ``forward`` with a fused LM head
(whose temperature and outputs depend on the run's config) and set dropout probabilities. With one
base shared by several runs, the last constructed run would win for all of them, so each run keeps
its own patched ``forward`` and dropout settings and installs them when it becomes active.

Private contacts made here: a module's per-instance ``forward`` in ``module.__dict__`` (TRL's
``add_fused_lm_head`` installs one; we save, swap and restore it), and ``torch.nn.Dropout.p`` of
every dropout module (TRL's ``disable_dropout_in_model`` sets it).
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from typing import Any

import torch

from rapidfire_nb.errors import ConfigError


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def lm_module(model):
    """The module whose ``forward`` TRL wraps with its fused LM head."""
    return model.get_base_model() if _is_peft(model) else model


def _plain_forward(module):
    # The forward before any trainer touched this module: None means the class's own forward.
    if "_rf_plain_forward" not in module.__dict__:
        module.__dict__["_rf_plain_forward"] = module.__dict__.get("forward")
    return module.__dict__["_rf_plain_forward"]


def _install_forward(module, forward) -> None:
    if forward is None:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = forward


def _dropouts(*models) -> list[torch.nn.Dropout]:
    seen, out = set(), []
    for m in models:
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout) and id(mod) not in seen:
                seen.add(id(mod))
                out.append(mod)
    return out


class RunPatches:
    """The forwards and dropout probabilities one run's TRL trainer set on (possibly shared) models."""

    def __init__(self):
        self.forwards: list[tuple[torch.nn.Module, Any]] = []
        self.dropout_p: list[tuple[torch.nn.Dropout, float]] = []

    @contextlib.contextmanager
    def capture(self, patched: list, dropout_roots: list):
        """Let a TRL constructor patch ``patched`` modules; keep its patches, then undo them."""
        plain = [(m, _plain_forward(m)) for m in patched]
        for m, fwd in plain:
            _install_forward(m, fwd)  # TRL must wrap the plain forward, not another run's fused one
        before = [(d, d.p) for d in _dropouts(*dropout_roots)]
        try:
            yield
        finally:
            self.forwards += [(m, m.__dict__.get("forward")) for m, _ in plain]
            for m, fwd in plain:
                _install_forward(m, fwd)
            self.dropout_p += [(d, d.p) for d in _dropouts(*dropout_roots)]
            for d, p in before:
                d.p = p

    def install(self) -> None:
        for m, fwd in self.forwards:
            _install_forward(m, fwd)
        for d, p in self.dropout_p:
            d.p = p

    def clear(self) -> None:
        self.forwards, self.dropout_p = [], []


# One frozen reference copy per (tokenizer, base): full fine-tuning runs of a base share it.
_REFERENCES: dict[tuple[int, str], torch.nn.Module] = {}


def frozen_reference(model, tokenizer, base_key: str) -> torch.nn.Module:
    """A frozen copy of ``model``, which must still hold the base's pristine weights."""
    key = (id(tokenizer), base_key)
    ref = _REFERENCES.get(key)
    if ref is None:
        ref = copy.deepcopy(model)
        ref.requires_grad_(False)
        ref.eval()
        _REFERENCES[key] = ref
        weakref.finalize(tokenizer, _REFERENCES.pop, key, None)
    return ref


def refuse_unsupported(spec, knobs: dict[str, Any]) -> None:
    args = spec.training_args or {}
    for knob, bad in knobs.items():
        if knob in args and args[knob] == bad:
            raise ConfigError(f"training_args.{knob}={bad!r} is not supported for {spec.trainer_type} runs "
                              f"in rapidfire_nb (runs share one frozen reference); remove it")


def text_or_conversation(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(m, dict) for m in value))
