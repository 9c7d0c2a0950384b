"""``TrainingInputs``: what every run of one ``run_fit`` trains with, as one value.

``launch/`` builds it once, after run_fit's checks, and every part that trains or plans a chunk
takes it whole: the ``Engine``, its ``TrainerFactory``, the Ray ``RayWorkerPool`` and each
``ChunkWorker``. One value means one place to add an input, and no positional list of seven to
keep in the same order across five constructors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TrainingInputs:
    """run_fit's inputs that the engine trains with (frozen: they do not change during a fit).

    ``create_model(model_config) -> (model, tokenizer)`` builds a base; ``build_args(spec, **kw)``
    and ``build_lora(spec)`` turn a run's config into TRL's training arguments and PEFT's config
    (``rapidfire_nb.automl``'s builders: the engine does not import the layer above it).
    ``prep_cache`` is the one mutable part, on purpose: the datasets as ``formatting_func`` and
    TRL's preparation left them, filled once by run_fit's checks and shared by every run's trainer
    so that the same mapping is not paid per run. ``sample_prompts`` are run_fit's, checked
    (``generation.check_sample_prompts``): None for the eval set's first prompts."""

    create_model: Callable | None
    train_dataset: Any
    eval_dataset: Any
    num_chunks: int
    seed: int
    build_args: Callable
    build_lora: Callable
    offload: str = "auto"
    prep_cache: dict = field(default_factory=dict, compare=False, repr=False)
    sample_prompts: list | None = None

    def without_data(self) -> TrainingInputs:
        """These inputs less the model builder and the datasets: what a Ray worker is sent beside
        them, since those travel on their own (the builder pickled by value, so that a worker
        that cannot load it starts and says why; the datasets through the object store, once for
        every worker). The cache stays behind: a worker prepares its own data."""
        return dataclasses.replace(self, create_model=None, train_dataset=None, eval_dataset=None,
                                   prep_cache={})

    def with_data(self, create_model: Callable | None, train_dataset, eval_dataset) -> TrainingInputs:
        """The inputs a worker trains with, its builder and datasets put back."""
        return dataclasses.replace(self, create_model=create_model, train_dataset=train_dataset,
                                   eval_dataset=eval_dataset)
