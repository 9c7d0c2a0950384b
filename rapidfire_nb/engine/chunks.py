"""Deterministic data streams and chunk boundaries.

A run's data stream is fixed by (seed, epoch) alone: the example order of an epoch is a
permutation drawn from a generator seeded with both, so it never depends on which other runs
train beside it or on how many chunks the epoch is cut into. Chunks are contiguous slices of
that stream whose boundaries fall on optimizer-step boundaries.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import lru_cache

from rapidfire_nb.errors import ConfigError


@lru_cache(maxsize=64)
def _epoch_order(n_examples: int, seed: int, epoch: int, shuffle: bool) -> tuple[int, ...]:
    order = list(range(n_examples))
    if shuffle:
        # a string seed goes through sha512: stable across processes and Python versions
        random.Random(f"rapidfire:{seed}:{epoch}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class ChunkPlan:
    """How one run walks its data: micro-batches, optimizer steps and chunks of an epoch."""

    n_examples: int
    micro_batch_size: int            # rows per forward/backward
    grad_accum: int                  # micro-batches per optimizer step
    num_chunks: int
    seed: int
    shuffle: bool = True
    rows_per_example: int = 1        # GRPO repeats each prompt num_generations times

    def __post_init__(self):
        if self.n_examples < 1:
            raise ConfigError("the training dataset is empty")
        if self.micro_batch_size < 1 or self.grad_accum < 1:
            raise ConfigError("per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
        if not isinstance(self.num_chunks, int) or isinstance(self.num_chunks, bool) or self.num_chunks < 1:
            raise ConfigError(f"num_chunks must be an integer >= 1, got {self.num_chunks!r}")
        if self.num_chunks > self.steps_per_epoch:
            raise ConfigError(
                f"num_chunks={self.num_chunks} is larger than the {self.steps_per_epoch} optimizer steps "
                f"of one epoch ({self.n_examples} examples, batch {self.micro_batch_size} x gradient "
                f"accumulation {self.grad_accum}); use num_chunks <= {self.steps_per_epoch}"
            )

    @property
    def examples_per_micro_batch(self) -> int:
        return max(1, self.micro_batch_size // self.rows_per_example)

    @property
    def micro_batches_per_epoch(self) -> int:
        return math.ceil(self.n_examples / self.examples_per_micro_batch)

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.micro_batches_per_epoch / self.grad_accum)

    def chunk_bounds(self) -> list[int]:
        """Optimizer-step indices (within an epoch) where chunks start; last item = steps_per_epoch."""
        s, c = self.steps_per_epoch, self.num_chunks
        return [(k * s) // c for k in range(c + 1)]

    def total_steps(self, max_steps: int | None, num_train_epochs: float) -> int:
        if max_steps is not None and max_steps > 0:
            return int(max_steps)
        return max(1, math.ceil(float(num_train_epochs) * self.steps_per_epoch))

    def position(self, global_step: int) -> tuple[int, int]:
        """(epoch, step within epoch) of a run that has completed ``global_step`` steps."""
        return divmod(global_step, self.steps_per_epoch)

    def chunk_start_step(self, epoch: int, chunk: int) -> int:
        """Global step index of the first optimizer step of (epoch, chunk)."""
        return epoch * self.steps_per_epoch + self.chunk_bounds()[chunk]

    def step_micro_batches(self, epoch: int, step_in_epoch: int) -> list[list[int]]:
        """Example indices of each micro-batch of one optimizer step."""
        order = _epoch_order(self.n_examples, self.seed, epoch, self.shuffle)
        per = self.examples_per_micro_batch
        first_mb = step_in_epoch * self.grad_accum
        last_mb = min(first_mb + self.grad_accum, self.micro_batches_per_epoch)
        return [list(order[i * per:(i + 1) * per]) for i in range(first_mb, last_mb)]
