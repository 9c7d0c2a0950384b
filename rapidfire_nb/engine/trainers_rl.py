"""DPO and GRPO run trainers: TRL's ``DPOTrainer`` and ``GRPOTrainer`` driven chunk by chunk.

Both build on ``RunTrainer`` (one trainer per run, one optimizer step at a time over the run's own
data stream) and only add what differs:

- **DPO.** A chunk is counted in preference pairs. With LoRA the reference model is the shared base
  with every adapter disabled (TRL's own ``use_adapter(model, None)``), so no second copy exists;
  without LoRA the reference is one frozen copy of the base, shared by the full fine-tuning runs of
  that base. ``precompute_ref_log_probs`` is honoured against that reference.
- **GRPO.** A chunk is counted in prompts. TRL generates once per *generation batch*
  (``per_device_train_batch_size * steps_per_generation`` rows = prompts x ``num_generations``) and
  reuses the buffered completions for ``steps_per_generation * num_iterations`` micro-steps. The run's
  stream walks whole generation batches of its (seed, epoch) permutation, and chunk boundaries fall
  only where the buffer is used up, so a swap or a checkpoint never has to carry buffered
  completions; the generation RNG is the run's own torch RNG, saved and restored at every swap.

TRL's constructors change the model they are given: they wrap its ``forward`` with a fused LM head
(whose temperature and outputs depend on the run's config) and set dropout probabilities. With one
base shared by several runs, the last constructed run would win for all of them, so each run keeps
its own patched ``forward`` and dropout settings and installs them when it becomes active.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from rapidfire_nb.engine.chunks import ChunkPlan
from rapidfire_nb.engine.trainers import RunTrainer, register_trainer, rng_fork
from rapidfire_nb.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Per-run model patches on a shared base


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def _lm(model):
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


class _Placeholder(torch.nn.Module):
    """Stands in for ``ref_model`` while DPOTrainer is built around a shared PeftModel.

    Without a ``ref_model``, TRL treats a PeftModel as "re-training a pretrained adapter" and copies
    its ``default`` adapter into a ``ref`` one; a shared model holds only ``run_N`` adapters. The
    placeholder is dropped right after construction so that TRL's PEFT path (adapters disabled)
    provides the reference.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, *args, **kwargs):  # pragma: no cover - never called
        raise RuntimeError("placeholder reference model called")


def _unsupported(spec, knobs: dict[str, Any]) -> None:
    args = spec.training_args or {}
    for knob, bad in knobs.items():
        if knob in args and args[knob] == bad:
            raise ConfigError(f"training_args.{knob}={bad!r} is not supported for {spec.trainer_type} runs "
                              f"in rapidfire_nb (runs share one frozen reference); remove it")


def _check_implicit_prompt(row: dict, name: str) -> None:
    """TRL's implicit-prompt preference form: no 'prompt' column; the prompt is what 'chosen' and
    'rejected' share at their start (conversations: their first turns), as DPOTrainer extracts it."""
    from trl.data_utils import extract_prompt

    chosen, rejected = row["chosen"], row["rejected"]
    if isinstance(chosen, str) != isinstance(rejected, str):
        raise ConfigError(f"{name}: 'chosen' and 'rejected' must both be strings or both be chat "
                          "conversations")
    parts = extract_prompt({"chosen": chosen, "rejected": rejected})
    if not parts["prompt"]:
        raise ConfigError(
            f"{name} has no 'prompt' column and the first row's 'chosen' and 'rejected' share no "
            "first turn to take the prompt from; add a 'prompt' column or start both conversations "
            "with the same prompt turns")
    if not parts["chosen"] or not parts["rejected"]:
        raise ConfigError(f"{name}: in the first row 'chosen' and 'rejected' are the same after their "
                          "shared prompt turns; each needs its own answer")


def _text_or_conv(value) -> bool:
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(m, dict) for m in value))


# ---------------------------------------------------------------------------------------------
# DPO


class DPORunTrainer(RunTrainer):
    """A DPO run: preference pairs, reference = base with adapters disabled (LoRA) or a frozen copy."""

    trainer_type = "DPO"

    @classmethod
    def check_dataset(cls, spec, dataset, name: str) -> None:
        cols = set(dataset.column_names)
        missing = [c for c in ("chosen", "rejected") if c not in cols]
        if missing:
            raise ConfigError(
                f"{name} has columns {sorted(cols)}; DPO needs 'chosen' and 'rejected' (and 'prompt', "
                f"unless chosen and rejected share their first turns) (missing: {', '.join(missing)})")
        present = [c for c in ("prompt", "chosen", "rejected") if c in cols]
        if len(dataset):
            row = dataset[0]
            for c in present:
                if not _text_or_conv(row[c]):
                    raise ConfigError(f"{name}: column {c!r} must hold strings or lists of chat messages, "
                                      f"got {type(row[c]).__name__}")
            if "prompt" not in cols:
                _check_implicit_prompt(row, name)
        _unsupported(spec, {"sync_ref_model": True})
        _check_generation_columns(spec, dataset, name)

    def make_trainer(self, args, train_dataset, eval_dataset):
        from trl import DPOTrainer

        _unsupported(self.spec, {"sync_ref_model": True})
        self.raw_eval_dataset = eval_dataset
        self.patches = RunPatches()
        # the base with its adapters disabled (LoRA) is the reference, unless ref_model_name
        # named another model (loaded by the engine, frozen, shared like a base)
        shared = self.adapter_name is not None and self.ref_model is None
        precompute = bool(args.precompute_ref_log_probs)
        # TRL would precompute inside the constructor, before the placeholder below is dropped
        args.precompute_ref_log_probs = False
        if shared:
            ref = _Placeholder(self.model.config)
            patched = [_lm(self.model)]
        else:
            ref = self.ref_model if self.ref_model is not None else frozen_reference(
                self.model, self.tokenizer, self.spec.base_key())
            patched = [_lm(self.model), ref]
        with self.patches.capture(patched, [self.model] + ([] if shared else [ref])):
            trainer = DPOTrainer(model=self.model, ref_model=ref, args=args, train_dataset=train_dataset,
                                 eval_dataset=eval_dataset, processing_class=self.tokenizer)
        if shared:
            trainer.ref_model = None
        dropped = len(train_dataset) - len(trainer.train_dataset)
        if dropped:
            # the run's data stream (and its step count) was planned over every training pair
            raise ConfigError(
                f"DPOTrainer drops {dropped} of {len(train_dataset)} training pairs whose prompt alone has "
                f"max_length={args.max_length} tokens or more; raise max_length, shorten the prompts, or "
                f"use truncation_mode='keep_end'")
        args.precompute_ref_log_probs = precompute
        trainer.precompute_ref_logps = precompute
        if precompute:
            self._precompute(trainer, args)
        return trainer

    def _precompute(self, trainer, args) -> None:
        from trl.trainer.utils import hash_module

        self.patches.install()
        self.activate_adapter()
        trainer._precompute_model_hash = hash_module(trainer.ref_model or self.model)
        with rng_fork():
            bs = args.precompute_ref_batch_size or args.per_device_train_batch_size
            trainer.train_dataset = trainer._precompute_ref_logps(trainer.train_dataset, "train", bs)
            if trainer.eval_dataset is not None:
                bs = args.precompute_ref_batch_size or args.per_device_eval_batch_size
                trainer.eval_dataset = trainer._precompute_ref_logps(trainer.eval_dataset, "eval", bs)

    def activate_adapter(self) -> None:
        super().activate_adapter()
        patches = getattr(self, "patches", None)
        if patches is not None:
            patches.install()

    if not hasattr(RunTrainer, "generation_eval"):
        # until RunTrainer.evaluate runs the generation-based metrics itself
        def evaluate(self) -> dict:
            out = super().evaluate()
            out.update(generation_eval(self))
            return out

    def close(self) -> None:
        if getattr(self, "patches", None) is not None:
            self.patches.clear()
        super().close()


# ---------------------------------------------------------------------------------------------
# GRPO


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
        if len(dataset) and not _text_or_conv(dataset[0]["prompt"]):
            raise ConfigError(f"{name}: column 'prompt' must hold strings or lists of chat messages, "
                              f"got {type(dataset[0]['prompt']).__name__}")
        _unsupported(spec, {"sync_ref_model": True, "use_vllm": True})
        _check_generation_columns(spec, dataset, name)

    def make_trainer(self, args, train_dataset, eval_dataset):
        from trl import GRPOTrainer
        from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

        _unsupported(self.spec, {"sync_ref_model": True, "use_vllm": True})
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
        with self.patches.capture([_lm(self.model)], [self.model]):
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
        out.update(generation_eval(self))
        return out

    def close(self) -> None:
        if getattr(self, "patches", None) is not None:
            self.patches.clear()
        self._generation_rows = None
        super().close()


def generation_eval(rt) -> dict:
    from rapidfire_nb.engine.generation import generation_metrics

    return generation_metrics(rt)


def _check_generation_columns(spec, dataset, name: str) -> None:
    if name != "eval_dataset" or spec.compute_metrics is None:
        return
    from rapidfire_nb.engine.generation import check_eval_dataset

    check_eval_dataset(spec, dataset)


register_trainer("DPO", DPORunTrainer)
register_trainer("GRPO", GRPORunTrainer)
