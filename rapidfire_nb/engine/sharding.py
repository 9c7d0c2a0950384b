"""Which runs are sharded (FSDP over a gang of devices), and what their settings mean here.

RapidFire AI's spelling is kept: a run asks for ``num_gpus=k`` (``RFModelConfig(num_gpus=k)``, or
``run_fit(..., num_gpus=k)`` for every run) and turns FSDP on with transformers' ``fsdp`` /
``fsdp_config`` training arguments. Such a run trains on a gang of k Ray workers holding one
sharded copy of its base (engine/fsdp.py); transformers' own FSDP path is never used (on CPU
accelerate silently turns it into plain DDP).

Pure functions only (no torch, no Ray): ``refusals`` is what ``run_fit`` checks before anything
trains; ``fsdp2_settings`` maps the HF/FSDP1 knob names users write onto what FSDP2's
``fully_shard`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

from rapidfire_nb.errors import ConfigError

# fsdp_config knobs that FSDP2 (fully_shard) has no counterpart for, or that mean nothing here
NO_EFFECT = ("use_orig_params", "limit_all_gathers", "sync_module_states", "forward_prefetch",
             "backward_prefetch", "cpu_ram_efficient_loading", "state_dict_type", "xla",
             "xla_fsdp_v2", "xla_fsdp_grad_ckpt", "xla_fsdp_settings", "min_num_params",
             "version")
# fsdp_config knobs that do something here
USED = ("transformer_layer_cls_to_wrap", "auto_wrap_policy", "reshard_after_forward",
        "offload_params", "activation_checkpointing", "mixed_precision_policy", "cpu_offload")
# fsdp_config values transformers fills in itself when the user gave none (never warned about)
_DEFAULTS = {"xla": False, "xla_fsdp_v2": False, "xla_fsdp_grad_ckpt": False, "min_num_params": 0}

SHARDING_OPTIONS = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard",
                    "offload", "auto_wrap")


def fsdp_options(training_args: dict) -> list[str]:
    """The ``fsdp`` training argument as a list of options ([] when FSDP is off)."""
    value = (training_args or {}).get("fsdp")
    if value in (None, False, "", []):
        return []
    if value is True:
        return ["full_shard", "auto_wrap"]
    if isinstance(value, str):
        return [v for v in value.replace(",", " ").split() if v]
    return [str(getattr(v, "value", v)) for v in value]


def wants_fsdp(spec) -> bool:
    return bool(fsdp_options(spec.training_args))


def devices_of(spec, default: int = 1) -> int:
    """How many devices a run trains on: its ``RFModelConfig(num_gpus=...)``, else run_fit's."""
    k = (spec.extra or {}).get("num_gpus")
    return int(default if k is None else k)


def is_sharded(spec) -> bool:
    return devices_of(spec) > 1


def _torch_without_fsdp2() -> str | None:
    """The installed torch's version when it predates the FSDP2 API the gangs use (public in
    torch.distributed.fsdp from 2.6; the package itself allows torch>=2.3), else None."""
    import torch
    from packaging.version import Version

    version = Version(torch.__version__.split("+")[0])
    return None if version >= Version("2.6") else str(version)


def refusals(specs: Sequence, *, num_gpus: int = 1, workers: int = 0, label: str | None = None) -> list[str]:
    """Why each config cannot train sharded as asked ([] when every one can).

    ``num_gpus``: run_fit's (the default of configs without their own); ``workers``: the Ray
    workers the experiment will have (0: the in-kernel engine, one device). The cluster's GPUs
    need no check here: the pool refuses more workers than GPUs (each worker owns one), and
    ``k <= workers`` is checked below. ``label`` names a lone config otherwise than "the config
    (run 1)" (a clone)."""
    out = []
    for i, spec in enumerate(specs, start=1):
        where = f"config {i} (run {i})" if len(specs) > 1 else (label or "the config (run 1)")
        k = (spec.extra or {}).get("num_gpus", num_gpus)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            out.append(f"{where}: num_gpus must be an integer >= 1, got {k!r}")
            continue
        opts = fsdp_options(spec.training_args)
        unknown = [o for o in opts if o not in SHARDING_OPTIONS]
        if unknown:
            out.append(f"{where}: fsdp={spec.training_args.get('fsdp')!r}: unknown option(s) "
                       f"{', '.join(unknown)} (known: {', '.join(SHARDING_OPTIONS)})")
            continue
        if opts and k == 1:
            out.append(f"{where}: fsdp={spec.training_args.get('fsdp')!r} shards a run over several "
                       "devices, but it asks for num_gpus=1: give it num_gpus=k (k > 1), in "
                       "RFModelConfig(num_gpus=k) or run_fit(..., num_gpus=k), or drop fsdp")
            continue
        if k > 1 and not opts:
            out.append(f"{where}: num_gpus={k} without FSDP settings: a run on several devices is "
                       "sharded with FSDP (as in RapidFire AI 0.16.2); add fsdp='full_shard auto_wrap' "
                       "(and fsdp_config) to its training args, or use num_gpus=1")
            continue
        if k == 1:
            continue
        if "no_shard" in opts or "hybrid_shard" in opts or "hybrid_shard_zero2" in opts:
            out.append(f"{where}: fsdp={spec.training_args.get('fsdp')!r}: only full_shard and "
                       "shard_grad_op are supported (one gang of workers, one shard each)")
            continue
        old_torch = _torch_without_fsdp2()
        if old_torch:
            out.append(f"{where}: sharding uses PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard "
                       f"and CPUOffloadPolicy), which torch {old_torch} lacks: install torch>=2.6, "
                       "or use num_gpus=1")
            continue
        if not workers:
            out.append(f"{where}: num_gpus={k} with FSDP needs a gang of {k} Ray workers, and this "
                       "experiment trains in the kernel on one device: use "
                       f"Experiment(..., num_workers={k}) (one worker per GPU)")
            continue
        if k > workers:
            out.append(f"{where}: num_gpus={k} but the experiment has {workers} Ray worker"
                       f"{'s' if workers != 1 else ''}: use num_workers>={k} or num_gpus<={workers}")
            continue
        if spec.trainer_type == "GRPO":
            out.append(f"{where}: GRPO runs are not sharded here (generation inside a sharded "
                       "step is not supported): use num_gpus=1 for GRPO")
            continue
        if spec.peft_config is None:
            out.append(f"{where}: full fine-tuning (no peft_config) is not sharded yet: shard a "
                       "LoRA run (peft_config=RFLoraConfig(...)), or use num_gpus=1")
            continue
    return out


def warn_unused_fsdp_config(specs: Sequence) -> None:
    """transformers takes ``fsdp_config`` without ``fsdp`` and ignores it: the run trains on one
    device, unsharded, which is not what whoever wrote the settings meant. A warning, not a
    refusal: RapidFire AI's code with such a config trains, and keeps training here."""
    import warnings

    from rapidfire_nb.errors import RapidFireConfigWarning

    for i, spec in enumerate(specs, start=1):
        if spec.training_args.get("fsdp_config") and not fsdp_options(spec.training_args):
            where = f"config {i} (run {i})" if len(specs) > 1 else "the config (run 1)"
            warnings.warn(f"{where}: fsdp_config is set but fsdp is not, so the run trains on one "
                          "device, unsharded, and fsdp_config is ignored; to shard it add "
                          "fsdp='full_shard auto_wrap' and num_gpus=k (k > 1), or drop fsdp_config",
                          RapidFireConfigWarning, stacklevel=4)


def check_sharding(specs: Sequence, *, num_gpus: int = 1, workers: int = 0, label: str | None = None) -> None:
    """``refusals`` as one ConfigError (nothing has been written or started yet)."""
    reasons = refusals(specs, num_gpus=num_gpus, workers=workers, label=label)
    if reasons:
        raise ConfigError("cannot shard as asked:\n  " + "\n  ".join(reasons))


def apply_num_gpus(specs: Sequence, num_gpus: int) -> None:
    """Give every config without its own ``num_gpus`` run_fit's (it travels with the run's spec:
    clones, warm ones included, inherit their parent's device count)."""
    if num_gpus == 1:
        return
    for spec in specs:
        spec.extra = {**(spec.extra or {})}
        spec.extra.setdefault("num_gpus", num_gpus)


def fsdp2_settings(training_args: dict) -> tuple[dict, list[str]]:
    """What ``fully_shard`` does for a run, from its HF/FSDP1 knobs; and the knobs that have no
    effect here (to be warned about once, by name).

    Returns ``({"reshard_after_forward": bool, "wrap": [class names] | None,
    "activation_checkpointing": bool}, ignored)``: ``full_shard`` reshards parameters after
    forward (ZeRO-3), ``shard_grad_op`` keeps them gathered until backward (ZeRO-2); ``auto_wrap``
    with ``transformer_layer_cls_to_wrap`` (or the model's own ``_no_split_modules``) shards each
    such layer as its own unit, the rest as the root's unit; mixed precision follows the run's
    ``bf16``/``fp16`` (the engine's autocast), so ``mixed_precision_policy`` is not needed."""
    opts = fsdp_options(training_args)
    cfg = dict((training_args or {}).get("fsdp_config") or {})
    cfg = {k[5:] if k.startswith("fsdp_") else k: v for k, v in cfg.items()}
    reshard = "shard_grad_op" not in opts
    if "reshard_after_forward" in cfg and isinstance(cfg["reshard_after_forward"], bool):
        reshard = reshard and cfg["reshard_after_forward"]
    wrap = cfg.get("transformer_layer_cls_to_wrap")
    if isinstance(wrap, str):
        wrap = [w.strip() for w in wrap.split(",") if w.strip()]
    ignored = sorted(k for k, v in cfg.items()
                     if k in NO_EFFECT and not (k in _DEFAULTS and v == _DEFAULTS[k]))
    ignored += sorted(k for k in cfg if k not in NO_EFFECT and k not in USED)
    if cfg.get("auto_wrap_policy") not in (None, "TRANSFORMER_BASED_WRAP"):
        ignored.append(f"auto_wrap_policy={cfg['auto_wrap_policy']}")
    if cfg.get("mixed_precision_policy"):
        ignored.append("mixed_precision_policy (the run's bf16/fp16 decide)")
    return {"reshard_after_forward": reshard,
            "wrap": list(wrap) if wrap else None,
            "auto_wrap": "auto_wrap" in opts or bool(wrap) or cfg.get("auto_wrap_policy") is not None,
            "activation_checkpointing": bool(cfg.get("activation_checkpointing", False)),
            "offload": "offload" in opts or bool(cfg.get("offload_params") or cfg.get("cpu_offload"))}, ignored
