"""One lock around the process-wide state of accelerate.

Building a transformers ``TrainingArguments`` (every TRL config) resolves its device, and that
*resets* accelerate's process-wide ``AcceleratorState``/``PartialState`` singletons. Trainers that
are training at that moment in the engine thread read that state and fail. So: the engine holds
``HF_STATE_LOCK`` while it trains a step, evaluates or builds a trainer, and any other thread that
builds a TRL config (validating a clone, the panel's clone editor) does it inside
``preserved_accelerate_state()``, which takes the same lock and puts the state back afterwards.

That restore also brings back what code outside rapidfire left there: a plain
``SFTTrainer(...).train()`` earlier in the kernel (TRL's default ``bf16=True``) leaves the state
initialised with ``mixed_precision="bf16"``, and accelerate then refuses every later
``Accelerator(mixed_precision="no")`` ("AcceleratorState has already been initialized and cannot
be changed"). So the engine calls ``fresh_accelerator_state()`` right before it builds a run's
trainer: each run's Accelerator is created from that run's own settings, whatever ran before it
(which is also what building a ``TrainingArguments`` does itself, outside our lock's restore).
Runs of mixed precision coexist because the engine, not accelerate, owns autocast per run.
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


@contextlib.contextmanager
def fresh_accelerator_state(use_cpu: bool = False):
    """Build a trainer inside this: accelerate's process-wide state is forgotten first, so the
    trainer's ``Accelerator`` takes its own run's settings. If the build fails, the state the other
    runs' trainers were using is put back (they go on training)."""
    with HF_STATE_LOCK:
        saved = [(cls, dict(cls._shared_state)) for cls in _state_classes()]
        try:
            from accelerate.state import AcceleratorState
        except ImportError:  # pragma: no cover
            yield
            return
        AcceleratorState._reset_state(reset_partial_state=True)
        try:
            # the trainer's own Accelerator re-creates the state, but TRL trainers log through
            # accelerate's logger before that (DPOTrainer's loss-config warnings), which raises on
            # an empty PartialState: give it the device state the run's config resolves to
            from accelerate.state import PartialState

            PartialState(cpu=bool(use_cpu))
            yield
        except BaseException:
            for cls, state in saved:
                cls._shared_state.clear()
                cls._shared_state.update(state)
            raise
