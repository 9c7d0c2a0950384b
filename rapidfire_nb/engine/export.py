"""Export a run's weights in the format its consumers load, checked against the model.

A LoRA run's weights live under the adapter name ``run_<id>`` inside the engine's shared
PeftModel. Renaming keys by hand misses PEFT's own conventions (``modules_to_save`` copies are
saved under the wrapped module's name, DoRA magnitudes without ``.weight``), and wrote files whose
tensors did not fit the model. So the export builds the run's model as PEFT would, as a skeleton
on the ``meta`` device (no memory, no copy of the base), puts the run's tensors into it (which
checks every shape), refuses weights that are missing or left over, and lets PEFT's
``get_peft_model_state_dict`` name what is saved.

A warm start copies one run's adapter into another's the same way: the parent's weights in PEFT's
saved form (``adapter_state_dict``, or ``get_peft_model_state_dict`` of its live adapter), loaded
under the clone's adapter name by ``set_peft_model_state_dict`` (``load_adapter_state``), instead
of renaming keys by hand.
"""

from __future__ import annotations

import copy
import os
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


def adapter_state_dict(base_model, lora_config, weights: dict, adapter: str) -> dict:
    """``weights`` of adapter ``adapter`` (named as in the engine's shared PeftModel, e.g.
    ``...lora_A.run_3.weight``) in PEFT's saved form, as ``get_peft_model_state_dict`` names it:
    what ``adapter_model.safetensors`` holds and ``set_peft_model_state_dict`` loads under any
    adapter name. Raises ``ExportError`` when they do not fit a fresh model with ``lora_config``."""
    from peft import get_peft_model, get_peft_model_state_dict

    skeleton_config = copy.deepcopy(lora_config)
    skeleton_config.base_model_name_or_path = None   # the skeleton's name; the file keeps the real one
    skeleton = get_peft_model(_meta_skeleton(base_model), skeleton_config, adapter_name=adapter)
    # PEFT marks exactly the adapter's own tensors trainable (LoRA factors, DoRA magnitudes,
    # modules_to_save copies)
    wanted = {name for name, p in skeleton.named_parameters() if p.requires_grad}
    unexpected = sorted(set(weights) - wanted)
    missing = sorted(wanted - set(weights))
    if unexpected or missing:
        raise ExportError(
            f"the weights of {adapter} do not fit a fresh model with its LoRA config: "
            + (f"{len(missing)} missing (e.g. {missing[:2]}) " if missing else "")
            + (f"{len(unexpected)} left over (e.g. {unexpected[:2]})" if unexpected else ""))
    try:
        skeleton.load_state_dict(weights, strict=False, assign=True)   # raises on a shape mismatch
    except RuntimeError as exc:
        raise ExportError(f"the weights of {adapter} do not fit the model: {exc}") from None
    state = get_peft_model_state_dict(skeleton, adapter_name=adapter, save_embedding_layers=False)
    meta = [k for k, v in state.items() if v.device.type == "meta"]
    if meta:
        raise ExportError(f"the export of {adapter} lacks the tensors {meta[:3]}")
    return state


def load_adapter_state(peft_model, adapter: str, state: dict) -> None:
    """Copy ``state`` (PEFT's saved form: ``adapter_state_dict``, or ``get_peft_model_state_dict``
    of another adapter of the same config) into adapter ``adapter`` of ``peft_model`` through
    ``set_peft_model_state_dict``: a warm start into another run's adapter, values exact. Checked
    first against the adapter's own saved form; on a misfit nothing is changed."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    own = get_peft_model_state_dict(peft_model, adapter_name=adapter, save_embedding_layers=False)
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        raise ExportError(
            f"these weights do not fit adapter {adapter}: "
            + (f"{len(missing)} missing (e.g. {missing[:2]}) " if missing else "")
            + (f"{len(unexpected)} left over (e.g. {unexpected[:2]}) " if unexpected else "")
            + (f"{len(wrong)} of another shape (e.g. {wrong[0]}: {tuple(state[wrong[0]].shape)}, "
               f"needs {tuple(own[wrong[0]].shape)})" if wrong else ""))
    # a copy: peft 0.18 renames the keys of the dict it is given in place
    set_peft_model_state_dict(peft_model, dict(state), adapter_name=adapter)


def export_adapter(base_model, lora_config, weights: dict, adapter: str, path: Path) -> Path:
    """Write ``adapter_config.json`` and ``adapter_model.safetensors`` that
    ``PeftModel.from_pretrained`` loads onto ``base_model``'s architecture."""
    from safetensors.torch import save_file

    state = adapter_state_dict(base_model, lora_config, weights, adapter)
    lora_config.save_pretrained(str(path))
    save_file({k: v.detach().contiguous() for k, v in state.items()},
              str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
    return path


# what an experiment folder holds besides exports (engine/store.py, tracking/, tuning/)
_FOLDER_OWN = frozenset({"checkpoints", "events.jsonl", "experiment.json", "runs.json", "automl.json",
                         "optuna", "logs", "outputs", "engine.log", "worker.log", "tensorboard", "runs",
                         "mlflow", "trackio", "tracking"})


def check_export_path(path, experiment_folder: Path, overwrite: bool = False) -> Path:
    """Where ``Experiment.export`` may write, or ``ExportError`` saying why not (nothing is
    written): never silently over another export, a file, the current directory by accident
    (``""``) or the experiment folder itself (its checkpoints and log)."""
    import os

    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ExportError(f"export path must be a directory name, got {path!r}")
    if "\x00" in os.fspath(path):
        raise ExportError(f"export path {os.fspath(path)!r} holds a NUL byte, which no file name "
                          "may hold; nothing was written")
    if not isinstance(overwrite, bool):
        raise ExportError(f"overwrite must be True or False, got {overwrite!r}")
    target = Path(path).expanduser().absolute()
    resolved = target.resolve()
    folder = Path(experiment_folder).resolve()
    if resolved == folder:
        raise ExportError(f"export path {target} is the experiment folder itself; export into a "
                          "directory of its own (the folder holds the checkpoints and the event log)")
    if folder in resolved.parents:
        # a directory of its own inside the folder (the tutorials' exp.path / "best-adapter") is
        # fine; the engine's and the trackers' own entries are not
        first = resolved.relative_to(folder).parts[0]
        if first in _FOLDER_OWN or first.startswith((".", "events.jsonl")):
            raise ExportError(f"export path {target} is inside {folder / first}, which the "
                              "experiment itself writes; export into a new directory of the "
                              f"folder (say {folder / 'export'}) or somewhere else")
    if resolved in folder.parents:
        raise ExportError(f"export path {target} contains the experiment folder {folder}; export "
                          "into a directory of its own")
    # the nearest folder that exists must take a new entry: a read-only place fails here, with
    # its name, not as a bare OSError halfway through the export
    existing = target
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not os.access(existing if existing.is_dir() else existing.parent, os.W_OK):
        raise ExportError(f"cannot export to {target}: {existing} is not writable here (read-only "
                          "or another user's); choose a folder you can write to. Nothing was written")
    if target.exists() and not target.is_dir():
        raise ExportError(f"export path {target} exists and is not a directory; choose a new name")
    if target.is_dir() and any(target.iterdir()) and overwrite \
            and not any((target / name).is_file() for name in ("adapter_config.json", "config.json")):
        # overwrite=True replaces an earlier export, not a directory of other files (the home
        # folder, a project's root) where an export's file names could replace the user's own
        raise ExportError(f"export path {target} holds files but no earlier export (no "
                          "adapter_config.json or config.json); overwrite=True only writes over an "
                          "export: choose a new directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ExportError(f"export path {target} is not empty ({len(list(target.iterdir()))} "
                          "entries: another export?); choose a new directory, or pass "
                          "overwrite=True to write over its files")
    return target


def export_run(engine, spec, run_id: int, weights: dict, lora_config, path: Path) -> Path:
    """A run's ``weights`` into ``path`` (checked by the caller): a PEFT adapter when
    ``lora_config`` is given (the run's ``peft.LoraConfig``), else the full model; plus the
    tokenizer.

    The files are written into a new folder beside ``path`` and that folder is renamed into
    place: ``save_pretrained`` opens its files by name and would write through a link planted in
    an earlier export (to a file outside it); here nothing that was in ``path`` is ever opened,
    and an earlier export is moved aside and removed (its links removed, never followed)."""
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name[:40]}.export-"))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)    # mkdtemp's 0700 would make the export private
    try:
        _write_export(engine, spec, run_id, weights, lora_config, staging)
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            path.rmdir()
        if os.path.lexists(path):
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name[:40]}.old-"))
            os.rename(path, old / "export")    # a link is moved as a link
            os.rename(staging, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def _write_export(engine, spec, run_id: int, weights: dict, lora_config, path: Path) -> None:
    import warnings

    model, tokenizer = engine.model_and_tokenizer(spec)
    if lora_config is not None:
        lora_config.base_model_name_or_path = spec.model_name
        with warnings.catch_warnings():
            # transformers 5 deprecates a name PEFT still calls while it saves; the user can do
            # nothing about it, and it was the one line an export printed
            warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            export_adapter(model, lora_config, weights, f"run_{run_id}", path)
    else:
        model = copy.deepcopy(engine.untouched_model(spec))
        try:
            result = model.load_state_dict(weights, strict=False)   # raises on a shape mismatch
        except RuntimeError as exc:
            raise ExportError(f"the weights of run {run_id} do not fit its model: {exc}") from None
        if result.unexpected_keys:
            raise ExportError(f"the weights of run {run_id} hold tensors its model lacks: "
                              f"{result.unexpected_keys[:3]}")
        model.save_pretrained(str(path))
        del model
    tokenizer.save_pretrained(str(path))
