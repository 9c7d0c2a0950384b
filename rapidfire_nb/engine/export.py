"""Export a run's weights in the format its consumers load, checked against the model.

A LoRA run's weights live under the adapter name ``run_<id>`` inside the engine's shared
PeftModel. Renaming keys by hand misses PEFT's own conventions (``modules_to_save`` copies are
saved under the wrapped module's name, DoRA magnitudes without ``.weight``), and wrote files whose
tensors did not fit the model. So the export builds the run's model as PEFT would, as a skeleton
on the ``meta`` device (no memory, no copy of the base), puts the run's tensors into it (which
checks every shape), refuses weights that are missing or left over, and lets PEFT's
``get_peft_model_state_dict`` name what is saved.
"""

from __future__ import annotations

import copy
from pathlib import Path

from rapidfire_nb.errors import RapidFireError


class ExportError(RapidFireError):
    """A run's weights do not fit the model they are exported for."""


def _meta_skeleton(model):
    """An empty copy of ``model``'s architecture on the meta device."""
    import torch

    config = getattr(model, "config", None)
    from_config = getattr(type(model), "_from_config", None)
    if config is not None and from_config is not None:
        try:
            with torch.device("meta"):
                return from_config(copy.deepcopy(config))
        except Exception:
            pass
    return copy.deepcopy(model).to("meta")   # a custom module: copy it once, then drop the data


def _as_default(key: str, adapter: str) -> str:
    return ".".join("default" if part == adapter else part for part in key.split("."))


def export_adapter(base_model, lora_config, weights: dict, adapter: str, path: Path) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` that
    ``PeftModel.from_pretrained`` loads onto ``base_model``'s architecture."""
    from peft import get_peft_model, get_peft_model_state_dict
    from safetensors.torch import save_file

    skeleton_config = copy.deepcopy(lora_config)
    skeleton_config.base_model_name_or_path = None   # the skeleton's name; the file keeps the real one
    skeleton = get_peft_model(_meta_skeleton(base_model), skeleton_config, adapter_name="default")
    wanted = {k for k in skeleton.state_dict() if ".default." in f"{k}." or k.endswith(".default")}
    tensors = {_as_default(k, adapter): v for k, v in weights.items()}
    unexpected = sorted(set(tensors) - wanted)
    missing = sorted(wanted - set(tensors))
    if unexpected or missing:
        raise ExportError(
            f"the weights of {adapter} do not fit a fresh model with its LoRA config: "
            + (f"{len(missing)} missing (e.g. {missing[:2]}) " if missing else "")
            + (f"{len(unexpected)} left over (e.g. {unexpected[:2]})" if unexpected else ""))
    try:
        skeleton.load_state_dict(tensors, strict=False, assign=True)   # raises on a shape mismatch
    except RuntimeError as exc:
        raise ExportError(f"the weights of {adapter} do not fit the model: {exc}") from None
    state = get_peft_model_state_dict(skeleton, adapter_name="default", save_embedding_layers=False)
    meta = [k for k, v in state.items() if v.device.type == "meta"]
    if meta:
        raise ExportError(f"the export of {adapter} lacks the tensors {meta[:3]}")
    lora_config.save_pretrained(str(path))
    save_file({k: v.detach().contiguous() for k, v in state.items()},
              str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path
