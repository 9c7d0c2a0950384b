"""GRPO runs: TRL's ``GRPOTrainer`` driven chunk by chunk.

A chunk is counted in prompts. TRL generates once per *generation batch*
(``per_device_train_batch_size * steps_per_generation`` rows = prompts x ``num_generations``) and
reuses the buffered completions for ``steps_per_generation * num_iterations`` micro-steps. The run's
stream walks whole generation batches of its (seed, epoch) permutation, and chunk boundaries fall
only where the buffer is used up, so a swap or a checkpoint never has to carry buffered
completions; the generation RNG is the run's own torch RNG, saved and restored at every swap.

Private contacts with TRL made here (beyond those of adapters/base.py and adapters/shared.py),
because TRL keeps its generation schedule (micro-step counter, completion buffer) and its
reference model in trainer attributes set up by ``__init__`` and ``train()``, with no public way to
resume them mid-stream or share one reference:
- ``GRPOTrainer._step`` (its micro-step counter, aligned with the run's stream before each step)
- ``GRPOTrainer._buffered_inputs`` (dropped at chunk boundaries, where nothing buffered is needed)
- ``GRPOTrainer.num_generations_eval``, ``GRPOTrainer.temperature``, ``GRPOTrainer.beta``,
  ``GRPOTrainer.ref_model`` (set after construction: our shared reference)
- ``args.beta`` set to 0 while the constructor runs (TRL would load or copy a reference itself)
- ``trl.trainer.utils.add_fused_lm_head`` and ``disable_dropout_in_model`` applied to the reference
- the batch layout of TRL's ``RepeatSampler`` (each prompt repeated ``num_generations`` times)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rapidfire_nb.engine.adapters.base import RunTrainer, check_generation_columns
from rapidfire_nb.engine.adapters.shared import (
    RunPatches,
    frozen_reference,
    lm_module,
    refuse_unsupported,
    text_or_conversation,
)
from rapidfire_nb.engine.chunks import ChunkPlan
from rapidfire_nb.engine.rng import rng_fork
from rapidfire_nb.errors import ConfigError


@dataclass(frozen=True)
class GenerationPlan(ChunkPlan):
    """A GRPO run's stream: whole generation batches of prompts from the (seed, epoch) order.

    ``micro_batch_size`` counts completions (rows); a generation batch holds
    ``micro_batch_size * steps_per_generation`` rows = ``prompts_per_generation * num_generations``.
    It feeds ``steps_per_generation * num_iterations`` micro-steps; chunk boundaries are placed on
    the first micro-step of a generation, so no buffered completions cross a chunk boundary.
    """

    num_generations: int = 1
    steps_per_generation: int = 1
    num_iterations: int = 1

    def __post_init__(self):
        g, spg, ga = self.num_generations, self.steps_per_generation, self.grad_accum
        if g < 1 or spg < 1 or self.num_iterations < 1:
            raise ConfigError("num_generations, steps_per_generation and num_iterations must be >= 1")
        rows = self.micro_batch_size * spg
        if rows % g:
            raise ConfigError(f"the generation batch ({rows} completions = per_device_train_batch_size x "
                              f"steps_per_generation) must be divisible by num_generations ({g})")
        if self.generations_per_epoch < 1:
            raise ConfigError(
                f"the training dataset has {self.n_examples} prompts, fewer than one generation batch "
                f"({self.prompts_per_generation} prompts x {g} generations); add prompts or lower "
                f"per_device_train_batch_size / steps_per_generation")
        cycle = self.micro_steps_per_generation
        if cycle % ga and ga % cycle:
            raise ConfigError(
                f"steps_per_generation x num_iterations ({cycle}) and gradient_accumulation_steps ({ga}) "
                f"must divide one another, so that optimizer steps and generation batches line up")
        if cycle % ga == 0 and self.num_chunks > self.generations_per_epoch:
            raise ConfigError(
                f"num_chunks={self.num_chunks} is larger than the {self.generations_per_epoch} generation "
                f"batches of one epoch ({self.n_examples} prompts, {self.prompts_per_generation} per "
                f"generation); use num_chunks <= {self.generations_per_epoch}")
        super().__post_init__()

    @property
    def prompts_per_generation(self) -> int:
        return self.micro_batch_size * self.steps_per_generation // self.num_generations

    @property
    def micro_steps_per_generation(self) -> int:
        return self.steps_per_generation * self.num_iterations

    @property
    def generations_per_epoch(self) -> int:
        # like TRL's RepeatSampler, an incomplete last generation batch is dropped
        return self.n_examples // max(1, self.prompts_per_generation)

    @property
    def examples_per_micro_batch(self) -> int:
        return max(1, self.micro_batch_size // self.num_generations)

    @property
    def micro_batches_per_epoch(self) -> int:
        return self.generations_per_epoch * self.micro_steps_per_generation

    def chunk_bounds(self) -> list[int]:
        cycle, ga = self.micro_steps_per_generation, self.grad_accum
        if cycle % ga:
            return super().chunk_bounds()  # every optimizer step ends on a generation boundary
        unit, n = cycle // ga, self.generations_per_epoch
        return [((k * n) // self.num_chunks) * unit for k in range(self.num_chunks + 1)]

    def epoch_order(self, epoch: int) -> list[int]:
        """The epoch's prompt order: the same (seed, epoch) permutation every trainer type walks."""
        whole = ChunkPlan(n_examples=self.n_examples, micro_batch_size=self.n_examples, grad_accum=1,
                          num_chunks=1, seed=self.seed, shuffle=self.shuffle)
        return whole.step_micro_batches(epoch, 0)[0]

    def first_micro_step(self, step_in_epoch: int) -> int:
        return step_in_epoch * self.grad_accum

    def step_micro_batches(self, epoch: int, step_in_epoch: int) -> list[list[int]]:
        """Per micro-step: the generation batch's prompt indices where it starts, else []."""
        order = self.epoch_order(epoch)
        cycle, per = self.micro_steps_per_generation, self.prompts_per_generation
        first = self.first_micro_step(step_in_epoch)
        last = min(first + self.grad_accum, self.micro_batches_per_epoch)
        out = []
        for m in range(first, last):
            g, pos = divmod(m, cycle)
            out.append(list(order[g * per:(g + 1) * per]) if pos == 0 else [])
        return out


class GRPORunTrainer(RunTrainer):
    """A GRPO run: prompts, sampled completions scored by the run's reward functions."""

    trainer_type = "GRPO"

    @classmethod
    def rows_per_example(cls, args) -> int:
        return int(args.num_generations)

    @classmethod
    def plan_for(cls, args, n_examples: int, num_chunks: int, seed: int) -> ChunkPlan:
        return GenerationPlan(
            n_examples=n_examples, micro_batch_size=args.per_device_train_batch_size,
            grad_accum=args.gradient_accumulation_steps, num_chunks=num_chunks, seed=seed,
            shuffle=bool(getattr(args, "shuffle_dataset", True)),
            rows_per_example=int(args.num_generations), num_generations=int(args.num_generations),
            steps_per_generation=int(args.steps_per_generation), num_iterations=int(args.num_iterations))

    @classmethod
    def check_dataset(cls, spec, dataset, name: str) -> None:
        if not spec.reward_funcs:
            raise ConfigError("GRPO needs reward functions: RFModelConfig(reward_funcs=[f, ...]) with "
                              "f(prompts, completions, **columns) -> list of floats")
        for f in spec.reward_funcs:
            if not callable(f):
                raise ConfigError(f"reward function {f!r} is not callable (reward models given by name "
                                  f"would be downloaded; pass a loaded model or a function)")
        cols = set(dataset.column_names)
        if "prompt" not in cols:
            raise ConfigError(f"{name} has columns {sorted(cols)}; GRPO needs a 'prompt' column "
                              f"(other columns are passed to the reward functions)")
        if len(dataset) and not text_or_conversation(dataset[0]["prompt"]):
            raise ConfigError(f"{name}: column 'prompt' must hold strings or lists of chat messages, "
                              f"got {type(dataset[0]['prompt']).__name__}")
        refuse_unsupported(spec, {"sync_ref_model": True, "use_vllm": True})
        check_generation_columns(spec, dataset, name)

    def make_trainer(self, args, train_dataset, eval_dataset):
        from trl import GRPOTrainer
        from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

        refuse_unsupported(self.spec, {"sync_ref_model": True, "use_vllm": True})
        if not self.spec.reward_funcs:
            raise ConfigError("GRPO needs reward functions: RFModelConfig(reward_funcs=[...])")
        self.raw_eval_dataset = eval_dataset
        self.patches = RunPatches()
        self._generation_rows: list[dict] | None = None
        shared = self.adapter_name is not None
        beta = float(args.beta)
        # With beta != 0 TRL would load a reference model by name (full fine-tuning) or copy a
        # 'default' adapter (PeftModel); the reference is provided below instead.
        args.beta = 0.0
        with self.patches.capture([lm_module(self.model)], [self.model]):
            trainer = GRPOTrainer(model=self.model, reward_funcs=list(self.spec.reward_funcs), args=args,
                                  train_dataset=train_dataset, eval_dataset=eval_dataset,
                                  processing_class=self.tokenizer)
        args.beta = beta
        trainer.beta = beta
        if beta != 0.0 and (not shared or self.ref_model is not None):
            if args.cast_lm_head_to_fp32:
                raise ConfigError("cast_lm_head_to_fp32=True with beta != 0 needs LoRA and no "
                                  "ref_model_name in rapidfire_nb (the frozen reference is shared); "
                                  "use peft_config or beta=0")
            ref = self.ref_model if self.ref_model is not None else frozen_reference(
                self.model, self.tokenizer, self.spec.base_key())
            with self.patches.capture([ref], [ref]):
                if args.disable_dropout:
                    disable_dropout_in_model(ref)
                add_fused_lm_head(ref, temperature=trainer.temperature)
            trainer.ref_model = ref.to(trainer.accelerator.device)
        return trainer

    def activate_adapter(self) -> None:
        super().activate_adapter()
        patches = getattr(self, "patches", None)
        if patches is not None:
            patches.install()

    # -- data -------------------------------------------------------------------------------------
    def collate(self, indices: list[int]) -> Any:
        # a generation batch: each prompt repeated num_generations times (TRL's RepeatSampler order);
        # the other micro-steps of a generation read TRL's buffer and ignore their input
        if indices:
            g = int(self.args.num_generations)
            rows = [self.train_data[i] for i in indices]
            self._generation_rows = [dict(r) for r in rows for _ in range(g)]
        return self._generation_rows or []

    def train_step(self, epoch: int, step_in_epoch: int, global_step: int) -> dict:
        # TRL regenerates when its micro-step counter hits a generation boundary and otherwise reads
        # slice ``_step % steps_per_generation`` of its buffer: align the counter with the stream
        self.trainer._step = self.plan.first_micro_step(step_in_epoch)
        return super().train_step(epoch, step_in_epoch, global_step)

    def swap_out(self) -> None:
        super().swap_out()
        t = self.trainer
        if t is not None and t._step % self.plan.micro_steps_per_generation == 0:
            # chunk boundaries are generation boundaries: nothing buffered is needed any more
            t._buffered_inputs = None
            self._generation_rows = None

    # -- evaluation -------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Mean reward (per function and total) and loss of fresh completions on the eval prompts."""
        if self.eval_data is None:
            return {}
        t, model = self.trainer, self.model
        g = int(t.num_generations_eval)
        per_batch = max(1, int(self.args.per_device_eval_batch_size) // g)
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        n = len(self.eval_data)
        with rng_fork(), torch.no_grad():
            # every run samples its eval completions from the same stream: comparable curves
            torch.manual_seed(int(self.seed) % (2**32))
            for start in range(0, n, per_batch):
                rows = [self.eval_data[i] for i in range(start, min(start + per_batch, n))]
                batch = [dict(r) for r in rows for _ in range(g)]
                inputs = t._prepare_inputs(batch)
                with t.compute_loss_context_manager():
                    loss = t.compute_loss(model, inputs)
                total += float(loss) * len(rows)
                count += len(rows)
        if was_training:
            model.train()
        out = {"eval_loss": total / max(count, 1)}
        out.update(self.pop_trainer_metrics("eval"))
        out.update(self.generation_eval())
        return out

    def close(self) -> None:
        if getattr(self, "patches", None) is not None:
            self.patches.clear()
        self._generation_rows = None
        super().close()
