"""The trainer-type independent part of the TRL adapters: one ``RunTrainer`` per run, built once
and kept across chunks.

A run's TRL trainer (SFTTrainer, DPOTrainer, GRPOTrainer) is created once, with the shared base
model (LoRA runs: one PeftModel holding every run's adapter; a swap is ``set_adapter``) and the
run's own TRL config. The engine then drives the trainer's own pieces (``training_step``: forward,
loss, backward exactly as TRL computes them; its optimizer and LR scheduler; its gradient clipping;
its ``_metrics``) one optimizer step at a time over the run's deterministic data stream. This
avoids ``Trainer.train()``'s fixed set-up cost per chunk and lets a chunk end on any optimizer
step. Each trainer type subclasses ``RunTrainer`` in its own module (sft.py, dpo.py, grpo.py).

Public hooks used where one exists: ``Trainer.get_batch_samples`` (the token count that scales
the loss), ``Accelerator.clip_grad_norm_`` (Trainer's clipping on every setup the engine runs),
``Trainer.create_optimizer``/``create_scheduler``/``training_step``/``compute_loss``/
``compute_loss_context_manager``/``data_collator``, ``Accelerator.optimizer_step_was_skipped``,
``Accelerator.scaler``, ``Accelerator.prepare_optimizer``; PEFT's ``set_adapter`` and
``prepare_model_for_kbit_training``.

Private names that remain, each because no public one does the same here:
- ``Trainer._prepare_inputs`` (eval): ``prediction_step`` is the public road, but TRL's trainers
  override it with their own metric bookkeeping (DPO stores eval rewards in ``_metrics`` there),
  so the eval loop would count metrics twice or differently from TRL's own evaluation.
- ``Trainer._metrics`` (TRL's per-mode metric store, drained after every step and evaluation):
  TRL empties it only inside its ``log()``, which would also run every ``report_to`` callback;
  the engine logs the step itself.
- ``Trainer.current_gradient_accumulation_steps``, ``Trainer.state.global_step`` (set per step):
  the attributes ``training_step`` reads; Trainer sets them inside ``_inner_training_loop`` only.
- ``Trainer.autocast_smart_context_manager`` replaced per instance: the run owns its autocast
  (several runs with different precisions share one process); a subclass method would need one
  class per precision.
- ``Accelerator.gradient_state._set_sync_gradients``: accelerate's public ``accumulate()``
  context decides syncing from its own step counter, which does not follow a run's stream across
  chunks.
- ``Accelerator._schedulers/_optimizers/_models/_dataloaders`` emptied on close: what
  ``free_memory`` does, minus its ``gc.collect`` (a full collection per closed run is seconds
  with 48 runs).
- ``Trainer.callback_handler.{model,optimizer,lr_scheduler,...}`` cleared on close, for the
  same memory reason; there is no public reset.
- ``accelerate.utils.imports._is_package_available`` memoized (``cache_package_probes``): the
  probes run at every trainer build and are not cached by accelerate.
- ``torch.nn.Module._parameters`` / ``_buffers`` slots swapped in place to park a run's tensors:
  ``load_state_dict`` copies, and a copy is what parking avoids.
- accelerate's ``AcceleratorState._shared_state`` reset before a build (engine/hfstate.py): the
  process-wide state would carry one run's precision into the next; accelerate has no public reset.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch

from rapidfire_nb.engine.chunks import ChunkPlan
from rapidfire_nb.engine.hfstate import fresh_accelerator_state
from rapidfire_nb.engine.resources import batch_tokens
from rapidfire_nb.engine.rng import (
    capture_rng,
    derive_seed,
    restore_rng,
    rng_fork,
    seeded_rng,
)
from rapidfire_nb.errors import ConfigError


def run_autocast(args):
    device_type = args.device.type
    if getattr(args, "bf16", False):
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if getattr(args, "fp16", False):
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def is_quantized(model) -> bool:
    """A base loaded in 4 or 8 bits (bitsandbytes through ``quantization_config``)."""
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


class _Modules:
    """A stand-in whose ``modules()`` lists the given modules only (for PEFT's wrapper walk)."""

    def __init__(self, modules: list):
        self._modules_list = modules

    def modules(self):
        return iter(self._modules_list)


def activate_peft_adapter(model, name: str) -> None:
    """What ``PeftModel.set_adapter(name)`` does for a LoRA-style model, without walking every
    module of the model twice per swap: the adapter layers and PEFT's auxiliary wrappers
    (``modules_to_save``) are found once per set of adapters and kept on the model. Anything
    else (prompt learning, a model PEFT did not wrap) goes through ``set_adapter`` itself."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import other as peft_other

    wrapper_cls = getattr(peft_other, "AuxiliaryTrainingWrapper", None)
    set_wrappers = getattr(peft_other, "_set_adapter", None)
    config = getattr(model, "peft_config", None)
    base = getattr(model, "base_model", None)
    if not isinstance(config, dict) or name not in config or config[name].is_prompt_learning \
            or not hasattr(base, "active_adapter") or wrapper_cls is None or set_wrappers is None:
        model.set_adapter(name)
        return
    key = tuple(config)   # adding or deleting an adapter may add or drop layers: walk again
    cached = getattr(model, "_rf_adapter_layers", None)
    if cached is None or cached[0] != key:
        layers, wrappers = [], []
        for module in model.modules():
            if isinstance(module, BaseTunerLayer):
                layers.append(module)
            if isinstance(module, wrapper_cls):
                wrappers.append(module)
        cached = (key, layers, wrappers)
        model._rf_adapter_layers = cached
    _, layers, wrappers = cached
    model.active_adapter = name
    if wrappers:
        # PEFT's own step for its wrappers (what it does there differs between releases: some
        # also switch the wrapper on or off), given only the wrappers instead of every module
        set_wrappers(_Modules(wrappers), name)
    for layer in layers:
        if layer.merged:      # never merged here; PEFT's own path says why if it ever is
            model.set_adapter(name)
            return
        layer.set_adapter(name)
    base.active_adapter = name


def prepare_quantized_base(model, name: str, full_finetuning: bool):
    """A quantized base as LoRA training needs it (PEFT's ``prepare_model_for_kbit_training``:
    frozen quantized weights, norms in fp32, input gradients on); full fine-tuning is refused."""
    if not is_quantized(model):
        return model
    if full_finetuning:
        raise ConfigError(f"model {name!r} is loaded quantized (quantization_config in model_kwargs); "
                          "its weights cannot be trained directly: give the runs on it a peft_config "
                          "(QLoRA), or load it unquantized for full fine-tuning")
    from peft import prepare_model_for_kbit_training

    # bitsandbytes (0.50) repacks a 4-bit weight for fast CPU inference the first time it runs in
    # eval mode without gradients, and never unpacks it for training: after the first
    # chunk-end evaluation every gradient through it would be zero. Runs alternate training and
    # evaluation on the same modules, so that packing is turned off.
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    # gradient checkpointing stays the run's own choice (training_args.gradient_checkpointing)
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


_PROBES_CACHED = False


def cache_package_probes() -> None:
    """Memoize accelerate's "is this package installed" probe.

    accelerate answers ``is_peft_available()`` by reading package metadata from disk on every call
    and calls it many times per trainer build (``is_peft_model``), a visible part of each run's
    set-up. Which packages are installed does not change under a running kernel, and every
    probe of a package that is missing stays uncached (installing it mid-session still works).
    """
    global _PROBES_CACHED
    if _PROBES_CACHED:
        return
    _PROBES_CACHED = True
    try:
        from accelerate.utils import imports
    except ImportError:
        return
    probe = getattr(imports, "_is_package_available", None)
    if probe is None or getattr(probe, "_rf_cached", False):
        return
    found: set = set()

    def cached(pkg_name, metadata_name=None):
        key = (pkg_name, metadata_name)
        if key in found:
            return True
        out = probe(pkg_name, metadata_name)
        if out:
            found.add(key)
        return out

    cached._rf_cached = True
    cached.__wrapped__ = probe
    imports._is_package_available = cached


_WARNED: set = set()
_OUR_TRACKERS = ("tensorboard", "mlflow", "trackio")


def warn_engine_owned_knobs(spec) -> None:
    """``report_to`` and ``run_name`` are the engine's (it logs every run itself): say once what
    becomes of a user's value instead of replacing it without a word."""
    import warnings

    from rapidfire_nb.errors import RapidFireConfigWarning

    args = spec.training_args or {}
    report = args.get("report_to")
    names = [report] if isinstance(report, str) else list(report or [])
    names = [str(n).lower() for n in names if str(n).lower() not in ("none", "")]
    if names:
        ours = [n for n in names if n in _OUR_TRACKERS or n == "all"]
        other = [n for n in names if n not in ours]
        key = ("report_to", tuple(names))
        if key not in _WARNED:
            _WARNED.add(key)
            parts = []
            if ours:
                parts.append(f"{', '.join(ours)}: the engine logs every run to the experiment's trackers "
                             "(Experiment(tracking=[...]) or the RF_*_ENABLED switches choose them)")
            if other:
                parts.append(f"{', '.join(other)}: not a tracker here, nothing is sent there")
            warnings.warn(RapidFireConfigWarning(
                f"training_args report_to={report!r}: TRL's own reporting is off ({'; '.join(parts)})"),
                stacklevel=4)
    name = args.get("run_name")
    if name is not None and ("run_name", str(name)) not in _WARNED:
        _WARNED.add(("run_name", str(name)))
        warnings.warn(RapidFireConfigWarning(
            f"training_args run_name={name!r} is not used: runs are named 'run <id>' in the panel "
            "and the trackers (the id is in get_runs_info())"), stacklevel=4)


class RunTrainer:
    """One run's trainer, optimizer, scheduler, data stream position and RNG."""

    trainer_type: str = ""
    # knobs we set for every run: the engine owns logging, saving and evaluation
    ENGINE_ARGS = dict(report_to="none", save_strategy="no", eval_strategy="no", logging_strategy="no",
                       disable_tqdm=True, push_to_hub=False)

    def __init__(self, record, model, tokenizer, train_dataset, eval_dataset, num_chunks: int,
                 seed: int, output_dir: str, adapter_name: str | None, build_args,
                 prep_cache: dict | None = None, ref_model=None):
        self.record = record
        self.ref_model = ref_model   # DPO/GRPO: a reference other than the base (ref_model_name)
        self.spec = record.spec
        self.model = model
        self.tokenizer = tokenizer
        self.adapter_name = adapter_name
        self.seed = seed
        self.prep_cache = prep_cache if prep_cache is not None else {}
        cache_package_probes()
        args = build_args(self.spec, output_dir=output_dir, seed=seed, **self.ENGINE_ARGS)
        self.args = args
        self.activate_adapter()
        from rapidfire_nb.engine.formatting import formatted, uses_text_form

        # RapidFire's row-mapper formatting_func: the trainer sees the mapped columns
        self.text_formatting = uses_text_form(self.spec, self.prep_cache, train_dataset)
        train_dataset = formatted(self.spec, train_dataset, self.prep_cache, "train_dataset")
        eval_dataset = formatted(self.spec, eval_dataset, self.prep_cache, "eval_dataset")
        # whatever trainer ran before (the user's too) left accelerate's state: see hfstate.py
        with fresh_accelerator_state(use_cpu=getattr(args, "use_cpu", False)):
            self.trainer = self.make_trainer(args, train_dataset, eval_dataset)
        # the engine owns autocast, from this run's own precision: accelerate's autocast reads a
        # process-wide setting left by whichever trainer was built last, and patching the shared
        # model's forward (accelerator.prepare) would impose one run's precision on all
        self.trainer.autocast_smart_context_manager = lambda cache_enabled=True: run_autocast(args)
        self.train_data = self.trainer.train_dataset
        self.eval_data = self.trainer.eval_dataset
        if len(self.train_data) == 0 and len(train_dataset) > 0:
            # the pre-run check samples rows; past it, say what the trainer did, not "empty"
            raise ConfigError(f"{type(self.trainer).__name__}'s preparation dropped all "
                              f"{len(train_dataset)} training rows (rows left without a token to "
                              "learn from after truncation to max_length are dropped): raise "
                              "max_length or shorten the rows")
        self.raw_eval_dataset = eval_dataset  # prompts/references for generation-based metrics
        from rapidfire_nb.engine.sharding import devices_of

        devices = devices_of(self.spec)
        self.plan = self.plan_for(args, len(self.train_data), num_chunks, seed,
                                  **({"devices": devices} if devices > 1 else {}))
        self.optimizer = None
        self.scheduler = None
        self._eval_batches = None
        self.rng = seeded_rng(derive_seed(seed, self.spec.seed_fingerprint()) + 1)
        self._parked: list | None = None   # (container, key, device, host view) while parked
        self._park_buffer = _ParkBuffer()
        self._parked_bytes = 0
        self._host = torch.device("cpu")
        self._weight_slots: list | None = None

    # -- hooks for trainer types ----------------------------------------------------------------
    def make_trainer(self, args, train_dataset, eval_dataset):
        """The TRL trainer of this run's type around ``self.model`` (each adapter module's own)."""
        raise NotImplementedError

    @classmethod
    def rows_per_example(cls, args) -> int:
        return 1

    @classmethod
    def plan_for(cls, args, n_examples: int, num_chunks: int, seed: int, devices: int = 1) -> ChunkPlan:
        """``devices``: a run sharded over k devices steps on k times its per-device batch."""
        return ChunkPlan(n_examples=n_examples,
                         micro_batch_size=args.per_device_train_batch_size * devices,
                         grad_accum=args.gradient_accumulation_steps, num_chunks=num_chunks,
                         seed=seed, rows_per_example=cls.rows_per_example(args))

    @classmethod
    def check_dataset(cls, spec, dataset, name: str) -> None:
        """Refuse, before training, a dataset this trainer type cannot read."""
        raise NotImplementedError

    def collate(self, indices: list[int]) -> Any:
        # __getitems__ is what torch's DataLoader fetches with: one Arrow read for the batch,
        # ~4x cheaper than select() + row iteration (which builds an indices table per call)
        getitems = getattr(self.train_data, "__getitems__", None)
        rows = getitems(indices) if getitems is not None else [self.train_data[i] for i in indices]
        return self.trainer.data_collator(list(rows))

    # -- logging and evaluation inside chunks -----------------------------------------------------
    def intervals(self, own_total: int) -> tuple[int | None, int | None]:
        """(log every N steps, evaluate every N steps) as the user's ``logging_steps`` and
        ``eval_strategy="steps"``/``eval_steps`` say (a float below 1 is a fraction of the run's
        steps, as in transformers). None: train metrics of every step / no evaluation inside a
        chunk. The engine also evaluates, and logs what is left of a window, at every chunk end."""
        user = self.spec.training_args or {}

        def steps(value) -> int | None:
            if value is None or isinstance(value, bool):
                return None
            if isinstance(value, float) and value < 1:
                return max(1, math.ceil(value * own_total))
            return max(1, int(value))

        strategy = str(getattr(user.get("logging_strategy", "steps"), "value", user.get("logging_strategy", "steps")))
        log_every = steps(user.get("logging_steps")) if strategy == "steps" else None
        eval_strategy = str(getattr(user.get("eval_strategy", "no"), "value", user.get("eval_strategy", "no")))
        eval_every = None
        if eval_strategy == "steps":
            # transformers: eval_steps defaults to logging_steps (itself 500 by default)
            eval_every = steps(user.get("eval_steps")) or steps(user.get("logging_steps")) or 500
        return log_every, eval_every

    # -- schedule ----------------------------------------------------------------------------------
    def total_steps(self) -> int:
        a = self.args
        return self.plan.total_steps(a.max_steps, a.num_train_epochs)

    def build_optimizer(self, num_training_steps: int) -> None:
        """Fresh optimizer and LR schedule over this run's own trainable parameters."""
        self.activate_adapter()
        t = self.trainer
        t.optimizer, t.lr_scheduler = None, None
        t.create_optimizer()
        if t.accelerator.scaler is not None:  # fp16 needs accelerate's scaler-aware optimizer
            t.optimizer = t.accelerator.prepare_optimizer(t.optimizer)
        t.create_scheduler(num_training_steps=max(1, num_training_steps), optimizer=t.optimizer)
        self.optimizer, self.scheduler = t.optimizer, t.lr_scheduler

    # -- swaps -----------------------------------------------------------------------------------
    def activate_adapter(self) -> None:
        # always, even when it is the active one already: set_adapter is also what makes exactly
        # this adapter trainable (another run's activation froze it)
        if self.adapter_name is not None:
            activate_peft_adapter(self.model, self.adapter_name)

    def swap_in(self) -> None:
        self.activate_adapter()
        restore_rng(self.rng)

    def swap_out(self) -> None:
        self.rng = capture_rng()

    # -- residency: a run's own state in host memory while other runs train ---------------------
    @property
    def parked(self) -> bool:
        return self._parked is not None

    def _own_tensor_slots(self) -> list[tuple[Any, str]]:
        """(container, key) of every tensor that belongs to this run alone: its trainable weights
        (the adapter, or the whole model copy with its buffers for full fine-tuning) and its
        optimizer state. The shared base model is never moved."""
        if self._weight_slots is None:   # a run's own modules never change: walk them once
            full = self.adapter_name is None   # full fine-tuning: the whole model copy is its own
            own = {id(p) for _, p in self.trainable_named_parameters()}
            slots: list[tuple[Any, str]] = []
            seen: set[int] = set()   # tied weights: one Parameter in two modules, moved once
            for module in self.model.modules():
                for k, v in module._parameters.items():
                    if v is not None and id(v) in own and id(v) not in seen:
                        seen.add(id(v))
                        slots.append((module._parameters, k))
                if full:
                    slots += [(module._buffers, k) for k, v in module._buffers.items() if v is not None]
            self._weight_slots = slots
        slots = list(self._weight_slots)
        opt = getattr(self.optimizer, "optimizer", self.optimizer)   # accelerate's wrapper
        for state in (opt.state.values() if opt is not None else ()):
            slots += [(state, k) for k, v in state.items() if torch.is_tensor(v)]
        return slots

    def park(self, host: torch.device) -> int:
        """Move this run's own weights and optimizer state to ``host`` memory, exact copies into
        the run's flat host buffer (one per dtype, pinned when they come from a GPU, made at its
        first park and reused: allocating pinned memory costs far more than the copy); returns
        the bytes moved. All copies are made before any tensor is replaced: if one fails, the run
        stays resident and whole."""
        if self._parked is not None:
            return 0
        host = torch.device(host)
        slots = self._own_tensor_slots()
        datas = [_slot_data(container, key) for container, key in slots]
        views = self._park_buffer.views_for(datas, host)
        with torch.no_grad():
            # from a GPU: queued without waiting, then one wait for them all (what is read from a
            # parked run on the host, an export or a warm clone, is there once park returns)
            devices = set()
            for dst, src in _by_dtype_and_device(views, datas):
                torch._foreach_copy_(dst, src, non_blocking=src[0].device.type == "cuda")
                if src[0].device.type == "cuda":
                    devices.add(src[0].device)
            for device in devices:
                torch.cuda.current_stream(device).synchronize()
            for (container, key), view in zip(slots, views):
                _set_slot(container, key, view)
        self._parked = [(container, key, data.device, view)
                        for (container, key), data, view in zip(slots, datas, views)]
        self._parked_bytes, self._host = sum(_nbytes(v) for v in views), host
        return self._parked_bytes

    def keep_parked(self) -> int:
        """Move back to the host whatever of a parked run something else put on the device (a new
        trainer's ``model.to(device)`` moves every adapter of the shared model); bytes moved."""
        if self._parked is None:
            return 0
        moved = 0
        with torch.no_grad():
            for container, key, _, view in self._parked:
                data = _slot_data(container, key)
                if data.data_ptr() != view.data_ptr() or data.device != view.device:
                    view.copy_(data)
                    _set_slot(container, key, view)
                    moved += _nbytes(view)
        return moved

    def unpark(self) -> int:
        """Bring back what ``park`` moved, each tensor to the device it came from; bytes moved.
        From pinned memory the copies do not block this thread; the buffer is written again only
        by the next park, whose copies the device orders after these."""
        if self._parked is None:
            return 0
        moved = 0
        with torch.no_grad():
            for container, key, device, _ in self._parked:
                data = _slot_data(container, key)
                if device.type == "cpu":
                    new = data.to(device, copy=True)
                else:
                    new = data.to(device, copy=True, non_blocking=data.is_pinned())
                _set_slot(container, key, new)
                moved += _nbytes(new)
        self._parked = None
        return moved

    def parked_bytes(self) -> int:
        """What ``unpark`` will bring back to the device (0 when resident)."""
        return self._parked_bytes if self._parked is not None else 0

    # -- weights ---------------------------------------------------------------------------------
    def trainable_named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        if self.adapter_name is None:
            return [(n, p) for n, p in self.model.named_parameters()]
        # a path component equal to the adapter name: "...lora_A.run_3.weight" (Linear adapters)
        # and "...lora_embedding_A.run_3" (embedding adapters, held in a ParameterDict)
        name = self.adapter_name
        return [(n, p) for n, p in self.model.named_parameters() if name in n.split(".")]

    def weights(self) -> dict[str, torch.Tensor]:
        """This run's own weights (its adapter, or the whole model for full fine-tuning)."""
        return {n: p.detach().clone().cpu() for n, p in self.trainable_named_parameters()}

    def load_weights(self, weights: dict[str, torch.Tensor], strict: bool = True) -> None:
        own = dict(self.trainable_named_parameters())
        if self.adapter_name is not None and weights:
            # weights may come from another run's adapter (warm start): match by position in name
            weights = {_rename_adapter(k, self.adapter_name): v for k, v in weights.items()}
        missing = set(own) - set(weights)
        if strict and missing:
            raise ConfigError(f"checkpoint does not match the model: missing {sorted(missing)[:3]}")
        with torch.no_grad():
            for n, v in weights.items():
                if n in own:
                    if own[n].shape != v.shape:
                        raise ConfigError(f"weight {n} has shape {tuple(v.shape)}, the run needs "
                                          f"{tuple(own[n].shape)}")
                    own[n].copy_(v.to(own[n].device, own[n].dtype))

    # -- training --------------------------------------------------------------------------------
    def train_step(self, epoch: int, step_in_epoch: int, global_step: int) -> dict:
        """One optimizer step exactly as Trainer does it; returns the step's train metrics."""
        t, model = self.trainer, self.model
        # no model.train() here: Trainer.training_step calls it (one call walks every module of
        # the shared PeftModel, every step)
        micro = self.plan.step_micro_batches(epoch, step_in_epoch)
        batches = [self.collate(idx) for idx in micro]
        # the public face of Trainer's token count for loss scaling (it pulls from an iterator)
        _, n_items = t.get_batch_samples(iter(batches), len(batches), t.args.device)
        n_items = self.global_items(n_items)
        t.current_gradient_accumulation_steps = len(batches)
        t.state.global_step = global_step
        t.accelerator.gradient_state._set_sync_gradients(True)
        loss = 0.0
        for inputs in batches:
            loss += float(t.training_step(model, inputs, n_items))
        loss = self.reduce_gradients(loss, n_items)
        if not math.isfinite(loss):
            raise FloatingPointError(f"training loss is {loss} at step {global_step + 1}")
        grad_norm = None
        if t.args.max_grad_norm and t.args.max_grad_norm > 0:
            # what Trainer's clipping does on every setup the engine runs (no SageMaker MP, no
            # mixed device meshes)
            grad_norm = t.accelerator.clip_grad_norm_(model.parameters(), t.args.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        if not t.accelerator.optimizer_step_was_skipped:
            self.scheduler.step()
        model.zero_grad(set_to_none=True)
        metrics = {"loss": loss, "learning_rate": float(lr)}
        if grad_norm is not None:
            # left as a tensor: the chunk reads every step's norm at its end in one go
            # (``read_step_metrics``), so the step does not wait for the device a second time
            metrics["grad_norm"] = grad_norm if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
        metrics.update(self.pop_trainer_metrics("train"))
        n_examples = sum(len(i) for i in micro)
        return {"metrics": metrics, "examples": n_examples, "tokens": _tokens(batches)}

    def global_items(self, n_items):
        """The loss normaliser of one optimizer step (a sharded run: over the global batch)."""
        return n_items

    def reduce_gradients(self, loss: float, n_items) -> float:
        """After the step's backward passes: a sharded run combines its ranks' gradients and
        losses here (adapters/sharded.py); one device has nothing to combine."""
        return loss

    def pop_trainer_metrics(self, mode: str) -> dict:
        """Drain what the TRL trainer accumulated in ``_metrics`` (token accuracy, rewards...)."""
        store = getattr(self.trainer, "_metrics", None)
        if not store or mode not in store:
            return {}
        out = {}
        for key, vals in store[mode].items():
            if key == "num_tokens":
                continue
            vals = [float(v) for v in vals if v is not None]
            if vals:
                out[key if mode == "train" else f"eval_{key}"] = sum(vals) / len(vals)
        store[mode].clear()
        return out

    # -- evaluation ------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Eval loss (and TRL's eval metrics) over the whole eval set; RNG untouched."""
        if self.eval_data is None:
            return {}
        t, model = self.trainer, self.model
        bs = t.args.per_device_eval_batch_size
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        if self._eval_batches is None:
            # the eval set and collator never change: collate once, reuse after every chunk
            n = len(self.eval_data)
            getitems = getattr(self.eval_data, "__getitems__", None)
            self._eval_batches = []
            for start in range(0, n, bs):
                idx = list(range(start, min(start + bs, n)))
                rows = getitems(idx) if getitems is not None else [self.eval_data[i] for i in idx]
                self._eval_batches.append((len(idx), t.data_collator(list(rows))))
        from rapidfire_nb.engine.generation import on_logits

        # compute_metrics without generation_config is the transformers Trainer's: it gets the
        # eval logits and labels (as RapidFire hands it to the Trainer)
        keep = on_logits(self.spec)
        logits, labels = None, None
        with rng_fork(), torch.no_grad():
            for size, batch in self._eval_batches:
                inputs = t._prepare_inputs(batch)
                with t.compute_loss_context_manager():
                    loss = t.compute_loss(model, inputs)
                    if keep:
                        # the logits of the eval forward, made here: TRL 1.16 deprecates asking
                        # compute_loss for them (return_outputs=True, gone in TRL 2), whose fused
                        # LM head never builds them; this is the forward TRL makes then (the
                        # inputs compute_loss prepared, without the labels), so the same logits
                        logits, labels = _gather(logits, labels, _eval_logits(model, inputs), inputs)
                total += float(loss) * size
                count += size
        if was_training:
            model.train()
        out = {"eval_loss": total / max(count, 1)}
        out.update(self.pop_trainer_metrics("eval"))
        if keep:
            out.update(self.trainer_metrics(logits, labels))
        out.update(self.generation_eval())
        return out

    def trainer_metrics(self, logits, labels) -> dict:
        """The user's compute_metrics on ``EvalPrediction(logits, labels)`` of the whole eval set."""
        from transformers import EvalPrediction

        from rapidfire_nb.engine.generation import checked_metrics

        if logits is None:
            return {}
        pred = EvalPrediction(predictions=logits.float().numpy(),
                              label_ids=None if labels is None else labels.numpy())
        return checked_metrics(self.spec.compute_metrics(pred))

    def generation_eval(self) -> dict:
        """The user's compute_metrics on generations for the eval prompts ({} when not configured)."""
        from rapidfire_nb.engine.generation import generation_metrics

        return generation_metrics(self)

    # -- checkpoint state ------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The run's whole state, its weights copied (optimizer state by reference)."""
        return {**self.boundary_state(), "weights": self.weights()}

    def boundary_state(self) -> dict:
        """The run's whole state by reference, for ``safeformat.flat_snapshot`` to copy into a
        reusable host buffer at a chunk boundary."""
        scaler = self.trainer.accelerator.scaler
        return {
            "weights": {n: p.detach() for n, p in self.trainable_named_parameters()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "rng": self.rng,
        }

    def load_state_dict(self, state: dict) -> None:
        self.load_weights(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        scaler = self.trainer.accelerator.scaler
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        self.rng = state["rng"]

    def close(self) -> None:
        """Drop references so memory is freed (the adapter is removed by the controller)."""
        t = self.trainer
        # the optimizer's moments are the big part; the trainer sits in reference cycles (callback
        # handler, accelerator), so empty the optimizer in place: freed now, by refcount, no gc
        for opt in {id(o): o for o in (self.optimizer, getattr(t, "optimizer", None)) if o is not None}.values():
            inner = getattr(opt, "optimizer", None)  # accelerate's wrapper
            for o in (opt, inner):
                if o is not None and hasattr(o, "state"):
                    o.state.clear()
                    o.param_groups.clear()
        handler = getattr(t, "callback_handler", None)
        for attr in ("model", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"):
            if handler is not None and hasattr(handler, attr):
                setattr(handler, attr, None)
        for attr in ("model", "model_wrapped", "optimizer", "lr_scheduler", "train_dataset", "eval_dataset"):
            try:
                setattr(t, attr, None)
            except Exception:
                pass
        # what accelerator.free_memory() does, minus its gc.collect(): the controller collects
        # once per batch of released runs
        acc = getattr(t, "accelerator", None)
        if acc is not None:
            acc._schedulers, acc._optimizers, acc._models, acc._dataloaders = [], [], [], []
        self.trainer = self.optimizer = self.scheduler = self.model = None
        self.train_data = self.eval_data = None
        self._park_buffer = None


def _eval_logits(model, inputs):
    """The model's logits for one eval batch: a forward without the labels (no loss computed)."""
    return model(**{k: v for k, v in inputs.items() if k != "labels"})


def _gather(logits, labels, outputs, inputs):
    """Append one eval batch's logits and labels (on the host), padding the sequence axis as the
    Trainer does (labels with -100)."""
    from transformers.trainer_pt_utils import nested_concat

    new_logits = (outputs["logits"] if isinstance(outputs, dict) else outputs.logits).detach().cpu()
    new_labels = inputs.get("labels")
    new_labels = None if new_labels is None else new_labels.detach().cpu()
    logits = new_logits if logits is None else nested_concat(logits, new_logits, padding_index=-100)
    if new_labels is not None:
        labels = new_labels if labels is None else nested_concat(labels, new_labels, padding_index=-100)
    return logits, labels


def read_step_metrics(metrics: list[dict]) -> None:
    """Replace, in place, the tensors that ``train_step`` left in its metrics by their values, read
    from the device together (one read per dtype and device)."""
    found = [(m, k, v) for m in metrics for k, v in m.items() if isinstance(v, torch.Tensor)]
    groups: dict = {}
    for item in found:
        groups.setdefault((item[2].dtype, item[2].device), []).append(item)
    for items in groups.values():
        values = torch.stack([v.detach().reshape(()) for _, _, v in items]).tolist()
        for (m, k, _), value in zip(items, values):
            m[k] = float(value)


def _tokens(batches: list) -> Any:
    """The non-padding tokens of a step's collated batches, as ``resources.batch_tokens`` counts
    them, left as a tensor where they come from attention masks: the chunk reads the sum once, at
    its end, instead of once per step."""
    masks = []
    for b in batches:
        found = [v for k, v in b.items() if k.endswith("attention_mask")] if isinstance(b, dict) else []
        if not found or not all(isinstance(v, torch.Tensor) for v in found):
            return sum(batch_tokens(b) for b in batches)
        masks += found
    return torch.stack([m.sum() for m in masks]).sum()


def merge_window(window: list[dict]) -> dict:
    """The train metrics of several steps logged as one point: means (what transformers logs
    every ``logging_steps``), the learning rate as it is at the window's last step."""
    out: dict = {}
    for key in dict.fromkeys(k for m in window for k in m):
        vals = [m[key] for m in window if key in m and m[key] is not None]
        if vals:
            out[key] = vals[-1] if key == "learning_rate" else sum(vals) / len(vals)
    return out


def _slot_data(container, key) -> torch.Tensor:
    t = container[key]
    return t.data if isinstance(t, torch.nn.Parameter) else t


def _set_slot(container, key, new: torch.Tensor) -> None:
    t = container[key]
    if isinstance(t, torch.nn.Parameter):
        t.data = new          # the Parameter object stays: the optimizer keys on it
    else:
        container[key] = new


class _ParkBuffer:
    """A run's host memory for parking: one flat buffer per dtype, pinned when the run's tensors
    come from a GPU, cut into one view per tensor; made at the run's first park and remade only
    when its tensors' dtypes or sizes change."""

    def __init__(self):
        self.key: list | None = None
        self.views: list = []
        self.allocations = 0

    def views_for(self, datas: list, host: torch.device) -> list:
        key = [(d.dtype, d.shape, d.device.type) for d in datas] + [host]
        if key != self.key:
            pin = host.type == "cpu" and torch.cuda.is_available() and any(
                d.device.type == "cuda" for d in datas)
            sizes: dict = {}
            for d in datas:
                sizes[d.dtype] = sizes.get(d.dtype, 0) + d.numel()
            flat = {dt: torch.empty(n, dtype=dt, device=host, pin_memory=pin) for dt, n in sizes.items()}
            offsets: dict = dict.fromkeys(sizes, 0)
            views = []
            for d in datas:
                off = offsets[d.dtype]
                views.append(flat[d.dtype][off:off + d.numel()].view(d.shape))
                offsets[d.dtype] = off + d.numel()
            self.key, self.views = key, views
            self.allocations += 1
        return self.views


def _by_dtype_and_device(dsts: list, srcs: list):
    """(destinations, sources) lists of one ``_foreach_copy_`` each: one per dtype and device."""
    groups: dict = {}
    for dst, src in zip(dsts, srcs):
        pair = groups.setdefault((src.dtype, src.device), ([], []))
        pair[0].append(dst)
        pair[1].append(src)
    return groups.values()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _rename_adapter(name: str, adapter: str) -> str:
    parts = name.split(".")
    for i in range(len(parts)):
        if i > 0 and parts[i - 1] in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B",
                                      "lora_magnitude_vector"):
            parts[i] = adapter
    return ".".join(parts)


def check_generation_columns(spec, dataset, name: str) -> None:
    """The eval set of a run with generation-based ``compute_metrics`` needs prompts and references."""
    if name != "eval_dataset" or spec.compute_metrics is None:
        return
    from rapidfire_nb.engine.generation import check_eval_dataset

    check_eval_dataset(spec, dataset)
