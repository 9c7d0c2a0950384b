"""User-visible config policy: what ``rapidfire_nb.automl`` changes in a config, and how it says so.

- ``RapidFireConfigWarning``: the category of every warning about an accepted-but-changed config
  (filter it with ``warnings.filterwarnings("ignore", category=RapidFireConfigWarning)``);
- ``REMOVED_KNOBS``: knobs older TRL/transformers accepted, mapped to today's equivalent or dropped
  with one such warning;
- the device policy: ``detect_machine`` and ``normalize_for_machine`` (what the engine really runs
  on this machine: fp32 on CPU, no bf16 on a GPU without it, no bitsandbytes optimizers on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import functools
from typing import Any

# defined below both layers (the engine warns with it too), re-exported here and by automl
from rapidfire_nb.errors import RapidFireConfigWarning

__all__ = ["RapidFireConfigWarning", "Removed", "REMOVED_KNOBS", "Machine", "detect_machine",
           "normalize_for_machine"]


# --------------------------------------------------------------------------------------------
# Knobs that TRL / transformers have removed

@dataclass(frozen=True)
class Removed:
    """A knob older TRL/transformers accepted. ``mapping`` turns (value, other knobs) into
    today's equivalent kwargs; None means there is none and the knob is dropped."""

    library: str                     # whose removal it is: "trl" or "transformers"
    note: str
    mapping: Callable[[Any, dict], dict] | None = None
    replaces: str | None = None      # the knob the mapping sets (a user-set one wins)
    merges: bool = False             # the mapping adds to a user-set ``replaces`` instead


def _warmup_ratio(value, knobs):
    # transformers 5 reads warmup_steps < 1 as a fraction of the total steps; exactly 1.0 would
    # mean "one step", so keep it just below 1 (ceil(N * (1 - 1e-9)) == N for any real N).
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
        value = 1 - 1e-9
    return {"warmup_steps": value}


def _fsdp_wrap(value, knobs):
    # transformers 4 appended this class name to fsdp_config["transformer_layer_cls_to_wrap"];
    # transformers 5 reads only the dict entry, so the name joins whatever the user put there.
    from rapidfire_nb.errors import ConfigError

    if value is None:
        return {}   # transformers 4's default: nothing to wrap, as there
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"fsdp_transformer_layer_cls_to_wrap={value!r}: give a layer class name, such as "
            "'LlamaDecoderLayer', or a list of them")
    given = knobs.get("fsdp_config")
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ConfigError(
            f"fsdp_transformer_layer_cls_to_wrap={value!r} goes into fsdp_config, which is "
            f"{type(given).__name__} {given!r} here: give one dict, with "
            "fsdp_config={'transformer_layer_cls_to_wrap': [...]} instead of both knobs")
    wrap = given.get("transformer_layer_cls_to_wrap") or []
    wrap = [wrap] if isinstance(wrap, str) else wrap
    if not isinstance(wrap, (list, tuple)):
        raise ConfigError(
            f"fsdp_config['transformer_layer_cls_to_wrap'] is {wrap!r}: give a layer class name or "
            f"a list of them, which fsdp_transformer_layer_cls_to_wrap={value!r} is added to")
    wrap = list(wrap)
    return {"fsdp_config": {**given, "transformer_layer_cls_to_wrap":
                            wrap + [n for n in names if n not in wrap]}}


def _include_inputs(value, knobs):
    return {"include_for_metrics": ["inputs"]} if value else {}


_TA_REMOVED = {
    "warmup_ratio": Removed("transformers", "warmup_steps below 1 is now a fraction of total steps",
                            _warmup_ratio, "warmup_steps"),
    "evaluation_strategy": Removed("transformers", "renamed eval_strategy",
                                   lambda v, k: {"eval_strategy": v}, "eval_strategy"),
    "no_cuda": Removed("transformers", "renamed use_cpu", lambda v, k: {"use_cpu": v}, "use_cpu"),
    "per_gpu_train_batch_size": Removed("transformers", "renamed per_device_train_batch_size",
                                        lambda v, k: {"per_device_train_batch_size": v},
                                        "per_device_train_batch_size"),
    "per_gpu_eval_batch_size": Removed("transformers", "renamed per_device_eval_batch_size",
                                       lambda v, k: {"per_device_eval_batch_size": v},
                                       "per_device_eval_batch_size"),
    "include_inputs_for_metrics": Removed("transformers", "now include_for_metrics=['inputs']",
                                          _include_inputs, "include_for_metrics"),
    "fsdp_transformer_layer_cls_to_wrap": Removed(
        "transformers", "now fsdp_config['transformer_layer_cls_to_wrap']", _fsdp_wrap, "fsdp_config",
        merges=True),
    "logging_dir": Removed("transformers", "rapidfire_nb writes TensorBoard logs to the experiment folder"),
    "overwrite_output_dir": Removed("transformers", "output folders are managed by rapidfire_nb"),
    "save_safetensors": Removed("transformers", "checkpoints are always safetensors now"),
    "use_mps_device": Removed("transformers", "the device is chosen by rapidfire_nb"),
    "fp16_backend": Removed("transformers", "no longer configurable"),
    "half_precision_backend": Removed("transformers", "no longer configurable"),
    "group_by_length": Removed("transformers", "no longer supported"),
}

REMOVED_KNOBS: dict[str, dict[str, Removed]] = {
    "SFT": {
        **_TA_REMOVED,
        "max_seq_length": Removed("trl", "renamed max_length", lambda v, k: {"max_length": v}, "max_length"),
        "use_liger": Removed("trl", "renamed use_liger_kernel",
                             lambda v, k: {"use_liger_kernel": v}, "use_liger_kernel"),
        "dataset_batch_size": Removed("trl", "no longer used"),
        "num_of_sequences": Removed("trl", "no longer used"),
        "chars_per_token": Removed("trl", "no longer used"),
    },
    "DPO": {
        **_TA_REMOVED,
        "max_prompt_length": Removed("trl", "TRL truncates only with max_length now; filter over-long "
                                            "prompts from the dataset instead"),
        "max_completion_length": Removed("trl", "use max_length to bound prompt + completion"),
        "model_adapter_name": Removed("trl", "DPOTrainer trains the model's active adapter"),
        "ref_adapter_name": Removed("trl", "with a LoRA model, the reference is the base model with "
                                           "the adapter disabled"),
        "force_use_ref_model": Removed("trl", "a ref_model given to the trainer is always used"),
        "max_target_length": Removed("trl", "use max_length"),
        "rpo_alpha": Removed("trl", "no longer supported"),
        "reference_free": Removed("trl", "no longer supported"),
        "generate_during_eval": Removed("trl", "no longer supported"),
        "use_liger_loss": Removed("trl", "no longer supported"),
    },
    "GRPO": {
        **_TA_REMOVED,
        "max_prompt_length": Removed("trl", "GRPO no longer truncates prompts; filter over-long "
                                            "prompts from the dataset instead"),
        "vllm_max_model_len": Removed("trl", "renamed vllm_max_model_length",
                                      lambda v, k: {"vllm_max_model_length": v}, "vllm_max_model_length"),
        "vllm_guided_decoding_regex": Removed("trl", "renamed vllm_structured_outputs_regex",
                                              lambda v, k: {"vllm_structured_outputs_regex": v},
                                              "vllm_structured_outputs_regex"),
        "vllm_device": Removed("trl", "no longer supported"),
        "vllm_dtype": Removed("trl", "no longer supported"),
        "use_liger_loss": Removed("trl", "no longer supported"),
        "wandb_log_unique_prompts": Removed("trl", "renamed log_unique_prompts",
                                            lambda v, k: {"log_unique_prompts": v}, "log_unique_prompts"),
    },
}




# --------------------------------------------------------------------------------------------
# The machine, and what the engine will really run on it

@dataclass(frozen=True)
class Machine:
    accelerator: str | None   # "cuda" | "mps" | "xpu" | None (CPU only)
    bf16: bool                # can the accelerator run bf16?
    name: str


@functools.cache
def detect_machine() -> Machine:
    import torch
    if torch.cuda.is_available():
        from transformers.utils import is_torch_bf16_gpu_available
        # bf16 needs compute capability 8.0 (Ampere); torch.cuda.is_bf16_supported() also says
        # True on a T4 (7.5), counting slow emulation, so the capability decides first
        bf16 = torch.cuda.get_device_capability(0) >= (8, 0) and bool(is_torch_bf16_gpu_available())
        return Machine("cuda", bf16, torch.cuda.get_device_name(0))
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        from transformers.utils import is_torch_bf16_gpu_available
        return Machine("mps", bool(is_torch_bf16_gpu_available()), "Apple MPS")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return Machine("xpu", bool(torch.xpu.is_bf16_supported()), "Intel XPU")
    return Machine(None, False, "CPU")


# What the device policy changes (fp16 on a CPU, an 8-bit optimizer without CUDA) is the same
# fact for every config of a grid and every clone: said once per process, not once per config.
_NOTES_SHOWN: set[str] = set()


def first_time(note: str) -> bool:
    """True the first time this process is to say ``note`` (and remembers it as said)."""
    if note in _NOTES_SHOWN:
        return False
    _NOTES_SHOWN.add(note)
    return True


# save_strategy values that mean "a checkpoint at every chunk boundary" (RapidFire 0.16.1, 0.16.2)
CHUNK_SAVE_STRATEGIES = ("chunk", "shard")


def normalize_for_machine(kwargs: dict, machine: Machine, label: str) -> tuple[dict, list[str]]:
    """TRL config kwargs as the engine will run them here, plus notes on what changed.

    - ``save_strategy="chunk"`` (or ``"shard"``): the engine's own chunk-boundary checkpoints,
      so TRL is given ``"no"``.
    - No accelerator: add ``use_cpu=True`` unless the user set ``use_cpu`` (TRL's default
      ``bf16=True`` raises at construction otherwise).
    - On CPU, fp32 unless the user chose a precision: TRL's default ``bf16=True`` becomes CPU
      autocast, which measured 1.9x slower than fp32 for the tiny demo Llama (765 vs 413 ms/step)
      and 3.5x for a 4-layer hidden-256 one on this project's 2-core CPU. An explicit
      ``bf16=True`` is kept.
    - ``fp16=True`` on CPU: replaced by ``fp16=False`` (fp32). It does run (torch autocast to
      float16 on CPU) but measured ~60x slower than fp32 (7 s vs 0.11 s per step), so a config
      written for a T4 falls back. On a GPU the config keeps fp16.
    - bitsandbytes optimizers (``adamw_8bit``, ``paged_adamw_8bit``...) on CPU: ``adamw_torch``.
    - A GPU without bf16 (a T4, compute capability 7.5): TRL's default ``bf16=True`` cannot run;
      on CUDA it becomes ``fp16=True`` when the user chose no precision (elsewhere fp32), and an
      explicit ``bf16=True`` falls back to fp32 with a note suggesting ``fp16=True``.
    """
    kw = dict(kwargs)
    notes: list[str] = []
    if kw.get("save_strategy") in CHUNK_SAVE_STRATEGIES:
        # RapidFire's checkpoint at every chunk ("chunk" in 0.16.1, "shard" in 0.16.2): the engine
        # writes one at every chunk boundary anyway, so the trainer itself saves nothing
        kw["save_strategy"] = "no"
    if machine.accelerator is None and "use_cpu" not in kw:
        kw["use_cpu"] = True
    on_cpu = machine.accelerator is None or kw.get("use_cpu") is True
    if on_cpu:
        if "bf16" not in kw and "fp16" not in kw:
            kw["bf16"] = False
        for knob in ("fp16", "fp16_full_eval"):
            if kw.get(knob) is True:
                kw[knob] = False
                if knob == "fp16" and "bf16" not in kw:
                    kw["bf16"] = False
                notes.append(
                    f"{label}: {knob}=True needs a CUDA GPU; on this CPU-only machine float16 autocast "
                    f"is ~60x slower than fp32, so the engine runs every config with {knob}=True in fp32 "
                    f"({knob}=False; said once). On a GPU the configs keep {knob}=True.")
        optim = kw.get("optim")
        if isinstance(optim, str) and _is_bnb_optim(optim):
            kw["optim"] = "adamw_torch"
            notes.append(
                f"{label}: optim={optim!r} is a bitsandbytes GPU optimizer; on this CPU-only machine "
                f"the engine runs every config with it on optim='adamw_torch' (said once). On a GPU they "
                f"keep {optim!r}.")
    elif not machine.bf16:
        if "bf16" not in kw and "fp16" not in kw and machine.accelerator == "cuda":
            kw["bf16"], kw["fp16"] = False, True   # a T4: fp16 mixed precision, as on Colab
        elif "bf16" not in kw and not kw.get("fp16"):
            kw["bf16"] = False
        for knob in ("bf16", "bf16_full_eval"):
            if kw.get(knob) is True:
                kw[knob] = False
                notes.append(
                    f"{label}: {knob}=True cannot run on this GPU ({machine.name} has no bf16); the "
                    f"engine runs every config with it in fp32 (said once). Set fp16=True for mixed "
                    f"precision here.")
    return kw, notes


def _is_bnb_optim(name: str) -> bool:
    # bitsandbytes' 8-bit/paged optimizers (RapidFire's tutorials use adamw_8bit) need CUDA.
    return "8bit" in name or "bnb" in name or name.startswith("paged_") or name == "lion_32bit"

