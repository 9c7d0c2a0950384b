"""One lock around the process-wide state of accelerate.

Building a transformers ``TrainingArguments`` (every TRL config) resolves its device, and that
*resets* accelerate's process-wide ``AcceleratorState``/``PartialState`` singletons. Trainers that
are training at that moment in the engine thread read that state and fail. So: the engine holds
``HF_STATE_LOCK`` while it trains a step, evaluates or builds a trainer, and any other thread that
builds a TRL config (validating a clone, the panel's clone editor) does it inside
``preserved_accelerate_state()``, which takes the same lock and puts the state back afterwards.
"""

from __future__ import annotations

import contextlib
import threading

HF_STATE_LOCK = threading.RLock()


def _state_classes():
    try:
        from accelerate.state import AcceleratorState, GradientState, PartialState
    except ImportError:  # pragma: no cover
        return ()
    return (AcceleratorState, PartialState, GradientState)


@contextlib.contextmanager
def preserved_accelerate_state():
    with HF_STATE_LOCK:
        saved = [(cls, dict(cls._shared_state)) for cls in _state_classes()]
        try:
            yield
        finally:
            for cls, state in saved:
                if state:  # put back exactly what live trainers were using
                    cls._shared_state.clear()
                    cls._shared_state.update(state)
